"""OpenCL C source to the device's program binary, through the OpenCL driver's own compiler."""
from __future__ import annotations
import re, warnings
from typing import Optional, Sequence
import pyopencl as cl
from kc.backend import CompileError, Compiler, batch_member, batch_source
from kc_opencl.platform import DeviceInfo


def build_options(info: DeviceInfo) -> list[str]:
  # IEEE division and sqrt where the device can do them, so kernels give numpy's numbers; never fast-math
  return ["-cl-fp32-correctly-rounded-divide-sqrt"] if info.correctly_rounded_divide_sqrt else []


def _first_error(log: str) -> str:
  lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
  return next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "(the driver gave no build log)")


def build_log(program, device) -> str:
  try: return str(program.get_build_info(device, cl.program_build_info.LOG)).strip()
  except cl.Error: return ""


# what a compile returns in place of a binary where reading the driver's binary costs more than building again
# (keeps_source): this tag, then the source, which the runtime builds when it loads the program
SOURCE_PAYLOAD = b"kc-opencl-source\0"


def keeps_source(info: DeviceInfo) -> bool:
  """Whether a built program is kept as its source: PoCL's CPU device compiles every kernel's work-group function
  when its binary is read (about 0.9 s a kernel on an AMD EPYC, against 0.1 s for the build itself) and again, for
  the launch's work-group size, at the first launch, so the binary saves a later process nothing; PoCL's own kernel
  cache makes a rebuild of the same source cheap (about 30 ms)."""
  return info.is_cpu and info.platform.startswith("Portable Computing Language")


def payload_source(lib: bytes) -> Optional[str]:
  """The source a compile kept in place of a binary (keeps_source), else None (lib is the driver's binary)."""
  return lib[len(SOURCE_PAYLOAD):].decode() if lib.startswith(SOURCE_PAYLOAD) else None


# what a batched compile returns for each of its kernels: this tag, the kernel's name in the batch's program, a NUL,
# then the batch's program (its binary, or its source where keeps_source). Every member of a batch carries the same
# program, which the runtime builds once a process (its program cache is keyed by the program's bytes)
BATCH_PAYLOAD = b"kc-opencl-batch\0"
_KERNEL = re.compile(r"^__kernel\s[^(]*?\b(\w+)\s*\(", re.M)


def payload_entry(lib: bytes) -> tuple[Optional[str], bytes]:
  """(the kernel's name in its batch's program, that program's payload) for a batched compile's payload, else
  (None, lib): lib is the kernel's own program, and the kernel has the Program's name."""
  if not lib.startswith(BATCH_PAYLOAD): return None, lib
  entry, _, program = lib[len(BATCH_PAYLOAD):].partition(b"\0")
  return entry.decode(), program


class OpenCLCompiler(Compiler):
  """Builds source for one device and returns its binary (or, where keeps_source, the source it built, tagged). The
  binary is only good for that device and driver, which is why they (and the build options) are part of the cache
  key through identity()."""

  def __init__(self, context, device, info: DeviceInfo, plugin_version: str = "", source_payload: Optional[bool] = None):
    super().__init__(plugin_version)
    self.context, self.device, self.info = context, device, info
    self.options = build_options(info)
    self.source_payload = keeps_source(info) if source_payload is None else source_payload

  def identity(self) -> str:
    i = self.info
    return " | ".join([type(self).__qualname__, i.platform, i.name, i.version, i.driver_version, *self.options,
                       *(["source payload"] if self.source_payload else [])])

  max_batch = 16
  """Every member of a batch stores the whole batch's program in the compile cache (a program binary cannot be split by
  kernel), so a larger batch grows the cache more than it saves: the fixed cost of a build (the driver's compiler
  starting, its headers parsed) is most of a small kernel's."""

  def compile_uncached(self, src: str) -> bytes:
    program = self.build(src)
    if self.source_payload: return SOURCE_PAYLOAD + src.encode()
    binary = program.get_info(cl.program_info.BINARIES)[0]
    if not binary: raise CompileError(f"the OpenCL driver of {self.info.name} built the program but gave no binary", src=src)
    return bytes(binary)

  def compile_batch_uncached(self, srcs: Sequence[str]) -> list[bytes]:
    """One program (one clBuildProgram) of several kernels, their file-scope names renamed apart
    (kc.backend.batch_member; OpenCL's extension pragmas written once, first). Each member's payload is that program
    and its kernel's name in it (BATCH_PAYLOAD). Raises CompileError when the batch does not build or a source is not
    one kernel the renaming can take: Compiler.compile_many then builds the sources one by one."""
    members, entries = [], []
    for i, src in enumerate(srcs):
      m = batch_member(i, src, hoist=("#pragma OPENCL EXTENSION",))
      if len(kernels := _KERNEL.findall(src)) != 1 or kernels[0] not in m.exported:
        raise CompileError(f"a batched OpenCL source must define exactly one __kernel, this one defines {kernels}", src=src)
      members.append(m)
      entries.append(m.exported[kernels[0]].encode())
    program = self.compile_uncached(batch_source(members))
    return [BATCH_PAYLOAD + entry + b"\0" + program for entry in entries]

  def build(self, src: str):
    """The cl.Program of `src` built for this device; CompileError with the driver's log where it does not build."""
    program = cl.Program(self.context, src)
    # pyopencl warns about any compiler output (a failed build is reported below) and about reading build info
    # of a program it built through its own cache path
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      try:
        # cache_dir=False: kc's compile cache is the one cache, keyed on the device (see identity)
        program.build(options=self.options, devices=[self.device], cache_dir=False)
      except cl.RuntimeError as e:
        # the driver's log when the program object kept it, else pyopencl's message, which quotes it
        log = build_log(program, self.device) or str(e)
        raise CompileError(f"OpenCL build failed on {self.info.name}: {_first_error(log)}", src=src, log=log) from None
    return program


# a kernel every OpenCL C compiler builds: where it does not build, no kernel of kc's will
PROBE_SOURCE = "__kernel void kc_probe(__global int* out) { out[get_global_id(0)] = (int)get_global_id(0); }"


def build_problem(device, info: DeviceInfo) -> Optional[str]:
  """None when the driver's compiler builds PROBE_SOURCE for `device` with kc's build options, else what went wrong:
  the first error line of its build log (a driver whose compiler cannot target its own device, such as a PoCL built
  with an LLVM that does not know this CPU, fails every build this way)."""
  try: OpenCLCompiler(cl.Context([device]), device, info).compile_uncached(PROBE_SOURCE)
  except CompileError as e: return _first_error(e.log) if e.log else str(e)
  except cl.Error as e: return _first_error(f"{type(e).__name__}: {e}")  # no context, or no program object
  return None
