"""CUDA C to cubin through NVRTC (NVIDIA's runtime compiler, from the nvidia-cuda-nvrtc wheel through cuda-bindings),
with the CUDA headers of the nvidia-cuda-runtime wheel: no CUDA toolkit, no GPU. The output is cubin for one exact
arch, not PTX: PTX from an NVRTC newer than the driver fails to load, cubin does not.

CUDA 12 and CUDA 13 both work. cuda-bindings N loads NVRTC N, and the headers are CUDA N's too (NVRTC has no built-in
cuda_fp16.h, and NVIDIA ships each CUDA's headers for its own compiler): find_headers looks where NVIDIA's
cuda.pathfinder does, then in both majors' wheel layouts, then under CUDA_HOME and CUDA_PATH, and takes the first
directory whose headers are NVRTC's major.

What compile() returns is a kc CUDA library: the cubin behind a small header holding what the runtime needs to know
that the cubin does not say (the dynamic shared memory the kernel declares, the CUDA major that built it, and for a
kernel built in a batch the name of its entry in the cubin).

compile_batch_uncached builds several kernels as one NVRTC program: NVRTC's start and the parse of cuda_fp16.h and
cuda_bf16.h are most of a small kernel's compile, so a batch pays them once. Each source keeps its own meaning: its
#include lines go once at the top, the rest of it into a namespace of its own (its structs, helpers and vector types
never meet another member's), and its extern "C" kernel, which a namespace does not make unique, is renamed by a
#define before it and an #undef after. Every member's library is the whole batch's cubin, whose meta names that
member's entry."""
from __future__ import annotations
import functools, json, os, re, struct, sys
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence
from kc.backend import CompileError, Compiler
from kc_cuda.arch import capability, parse_arch
from kc_cuda.renderer import DYNAMIC_SHARED_MARKER

LIBRARY_MAGIC = b"KCCUDA1\0"
_ERROR_LINE = re.compile(r"\((\d+)\): (?:catastrophic )?error")
# the kernel kc's CUDA renderer writes: `extern "C" __global__ __launch_bounds__(32) void name(`, at the start of a line
_KERNEL = re.compile(r'^extern "C" __global__\b[^(]*(?:\([^)]*\)[^(]*)?\bvoid\s+(?P<name>[A-Za-z_]\w*)\s*\(', re.MULTILINE)
_DYNAMIC_SHARED = re.compile(re.escape(DYNAMIC_SHARED_MARKER) + r" (\d+)")
CONTEXT_LINES = 3


def pack_library(meta: dict, cubin: bytes) -> bytes:
  header = json.dumps(meta, sort_keys=True).encode()
  return LIBRARY_MAGIC + struct.pack("<I", len(header)) + header + cubin


def unpack_library(lib: bytes) -> tuple[dict, bytes]:
  """(meta, cubin) of a library pack_library made; a KcError-typed CompileError for anything else."""
  if not lib.startswith(LIBRARY_MAGIC) or len(lib) < len(LIBRARY_MAGIC) + 4:
    raise CompileError("not a kc CUDA library (no KCCUDA1 header): a stale compile cache entry can cause this; clear KC_CACHE_DIR")
  (n,) = struct.unpack_from("<I", lib, len(LIBRARY_MAGIC))
  start = len(LIBRARY_MAGIC) + 4
  try: meta = json.loads(lib[start:start + n])
  except ValueError: raise CompileError("a kc CUDA library with an unreadable header: clear KC_CACHE_DIR") from None
  return meta, lib[start + n:]


# ---------------------------------------------------------------------------------------------------------- headers

# where each CUDA major's nvidia-cuda-runtime wheel puts its headers, relative to site-packages
WHEEL_INCLUDE_DIRS = {12: "nvidia/cuda_runtime/include", 13: "nvidia/cu13/include"}
TOOLKIT_ROOT_VARS = ("CUDA_HOME", "CUDA_PATH")
NEEDED_HEADER = "cuda_fp16.h"  # with cuda_bf16.h: what kc's kernels include
VERSION_HEADER = "cuda_runtime_api.h"  # defines CUDART_VERSION, e.g. 12090 for 12.9
_CUDART_VERSION = re.compile(r"^#define\s+CUDART_VERSION\s+(\d+)", re.MULTILINE)


def install_hint(cuda_major: int) -> str:
  return f"pip install 'kc-cuda[cu{cuda_major}]'"


@dataclass(frozen=True)
class HeaderDir:
  """A directory of CUDA headers: where it is, its CUDA version (major, minor) from CUDART_VERSION, and how it was
  found."""
  path: str
  version: tuple[int, int]
  found_via: str

  @property
  def version_text(self) -> str: return f"{self.version[0]}.{self.version[1]}"


class CUDAHeadersNotFound(CompileError):
  """No directory holds the CUDA headers of NVRTC's major. `searched` is every (place, why it was passed over)."""

  def __init__(self, cuda_major: int, searched: Sequence[tuple[str, str]]):
    places = "\n".join(f"  {place}: {why}" for place, why in searched)
    super().__init__(f"the CUDA {cuda_major} headers ({NEEDED_HEADER}) that NVRTC {cuda_major} needs are not "
                     f"installed: {install_hint(cuda_major)}, or set CUDA_HOME to a CUDA {cuda_major} toolkit. "
                     f"Searched:\n{places}")
    self.cuda_major, self.searched = cuda_major, list(searched)


def header_version(path: str) -> Optional[tuple[int, int]]:
  """The CUDA version (major, minor) of the headers in `path`, from CUDART_VERSION; None where it cannot be read."""
  try:
    with open(os.path.join(path, VERSION_HEADER), encoding="utf-8", errors="replace") as f:
      m = _CUDART_VERSION.search(f.read())
  except OSError: return None
  return (int(m.group(1)) // 1000, int(m.group(1)) % 1000 // 10) if m else None


def pathfinder_cudart() -> tuple[Optional[str], str]:
  """NVIDIA's own answer (cuda.pathfinder.find_nvidia_header_directory("cudart"): wheels, conda, CUDA_PATH/CUDA_HOME,
  system installs): (the directory or None, how the question was put or why it could not be)."""
  asked = "cuda.pathfinder.find_nvidia_header_directory('cudart')"
  try: from cuda.pathfinder import find_nvidia_header_directory
  except ImportError as e: return None, f"cuda.pathfinder ({e})"
  try: return find_nvidia_header_directory("cudart"), asked
  except Exception as e:  # an older cuda-pathfinder that does not know cudart (RuntimeError), or a failed probe
    return None, f"{asked} ({type(e).__name__}: {e})"


def header_places(cuda_major: int, site_dirs: Sequence[str], environ: Mapping[str, str],
                  pathfinder: Callable[[], tuple[Optional[str], str]]) -> list[tuple[str, Optional[str]]]:
  """(how, directory) for every place find_headers looks, in order; directory None where a place gave none."""
  found, asked = pathfinder()
  places: list[tuple[str, Optional[str]]] = [(asked, found)]
  majors = sorted(WHEEL_INCLUDE_DIRS, key=lambda m: m != cuda_major)  # NVRTC's own major's wheel first
  places += [(f"the CUDA {m} wheel layout", os.path.join(d, *WHEEL_INCLUDE_DIRS[m].split("/")))
             for d in site_dirs for m in majors]
  places += [(f"${var}", os.path.join(environ[var], "include") if environ.get(var) else None)
             for var in TOOLKIT_ROOT_VARS]
  return places


def find_headers(cuda_major: int, site_dirs: Optional[Sequence[str]] = None,
                 environ: Optional[Mapping[str, str]] = None,
                 pathfinder: Callable[[], tuple[Optional[str], str]] = pathfinder_cudart) -> HeaderDir:
  """The first directory holding cuda_fp16.h of CUDA `cuda_major` (NVRTC's): cuda.pathfinder's answer, then the wheel
  layouts of both majors in each of `site_dirs` (default: sys.path), then $CUDA_HOME/include and $CUDA_PATH/include.
  CUDAHeadersNotFound names every place and why it did not do."""
  site_dirs = [d for d in dict.fromkeys(sys.path if site_dirs is None else site_dirs) if d and os.path.isdir(d)]
  searched: list[tuple[str, str]] = []
  for how, path in header_places(cuda_major, site_dirs, os.environ if environ is None else environ, pathfinder):
    if path is None: why = "not set" if how.startswith("$") else "found nothing"
    elif not os.path.isfile(os.path.join(path, NEEDED_HEADER)): why = f"no {NEEDED_HEADER}"
    elif (version := header_version(path)) is None: why = f"{NEEDED_HEADER}, but no CUDART_VERSION in {VERSION_HEADER}"
    elif version[0] != cuda_major: why = f"CUDA {version[0]}.{version[1]} headers, not CUDA {cuda_major}'s"
    else: return HeaderDir(os.path.abspath(path), version, how)
    searched.append((how if path is None else f"{how} {path}", why))
  raise CUDAHeadersNotFound(cuda_major, searched)


@functools.cache
def cuda_headers() -> HeaderDir:
  """The headers NVRTC compiles with: CUDA's of NVRTC's own major, found once per process."""
  return find_headers(nvrtc_major())


# ---------------------------------------------------------------------------------------------------------- NVRTC

def _nvrtc():
  try: from cuda.bindings import nvrtc
  except ImportError as e: raise CompileError(f"NVRTC is not importable ({e}): pip install kc-cuda, which installs cuda-bindings") from None
  return nvrtc


def _check(nvrtc, result, what: str):
  err, *rest = result if isinstance(result, tuple) else (result,)
  if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
    raise CompileError(f"NVRTC {what} failed: {err.name if hasattr(err, 'name') else err}")
  return rest[0] if len(rest) == 1 else rest


def bindings_major() -> Optional[int]:
  """The CUDA major of the installed cuda-bindings (the NVRTC it loads), None where it does not say."""
  try: from cuda.bindings import __version__ as v
  except ImportError: return None
  return int(m.group(1)) if (m := re.match(r"(\d+)\.", v)) else None


@functools.cache
def nvrtc_version() -> str:
  nvrtc = _nvrtc()
  try: major, minor = _check(nvrtc, nvrtc.nvrtcVersion(), "nvrtcVersion")
  except Exception as e:  # the wheel's libnvrtc not found
    hint = install_hint(m) if (m := bindings_major()) else "pip install kc-cuda"
    raise CompileError(f"NVRTC cannot load ({type(e).__name__}: {e}): cuda-bindings loads the NVRTC of its own CUDA "
                       f"major: {hint}") from None
  return f"{major}.{minor}"


def nvrtc_major() -> int:
  """The CUDA major of NVRTC: the headers and the driver that loads the cubins must be of it (or, the driver, newer)."""
  return int(nvrtc_version().split(".")[0])


@functools.cache
def supported_archs() -> tuple[str, ...]:
  nvrtc = _nvrtc()
  return tuple(f"sm_{a}" for a in _check(nvrtc, nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs"))


def unsupported_arch_message(arch: str) -> str:
  """Why this NVRTC cannot compile for `arch`, and, for a GPU its CUDA major dropped, which major still can."""
  archs = supported_archs()
  msg = f"NVRTC {nvrtc_version()} (CUDA {nvrtc_major()}) cannot compile for {arch}; it supports {', '.join(archs)}"
  if archs and capability(arch) < capability(archs[0]) and nvrtc_major() > min(WHEEL_INCLUDE_DIRS):
    oldest = min(WHEEL_INCLUDE_DIRS)
    msg += (f". CUDA {nvrtc_major()} has dropped GPUs older than {archs[0]}: CUDA {oldest} compiles for them "
            f"({install_hint(oldest)})")
  return msg


def error_context(src: str, log: str) -> str:
  """The source lines around each line NVRTC reports an error on, numbered, the error line marked."""
  lines, out = src.splitlines(), []
  for n in dict.fromkeys(int(m.group(1)) for m in _ERROR_LINE.finditer(log)):
    for i in range(max(1, n - CONTEXT_LINES), min(len(lines), n + CONTEXT_LINES) + 1):
      out.append(f"{'>' if i == n else ' '}{i:5d} | {lines[i - 1]}")
    out.append("")
  return "\n".join(out)


class NVRTCCompiler(Compiler):
  """Compiles for one arch. identity() holds the CUDA major, NVRTC's and the headers' versions, the arch and the
  options: the disk cache never hands a cubin for another GPU or compiler to the runtime."""

  def __init__(self, arch: str, plugin_version: str = ""):
    super().__init__(plugin_version)
    self.arch = parse_arch(arch, "arch")
    if self.arch not in supported_archs(): raise CompileError(unsupported_arch_message(self.arch))
    self.headers = cuda_headers()
    # FMA contraction on (the default of nvcc and NVRTC; kc's tolerances allow a fused multiply-add)
    # -default-device: helper functions the C-style base writes without __device__ (fp8 conversions) are device code
    self.options = [f"--gpu-architecture={self.arch}", "--std=c++17", "--fmad=true", "-default-device",
                    f"-I{self.headers.path}"]

  def identity(self) -> str:
    # the headers' directory is left out (the same headers anywhere give the same cubin); their version is in
    return " | ".join([type(self).__qualname__, f"CUDA {nvrtc_major()}", f"nvrtc {nvrtc_version()}",
                       f"headers {self.headers.version_text}", *self.options[:-1]])

  max_batch = 8
  """Every member of a batch stores the whole batch's cubin in the compile cache (a cubin cannot be split by kernel
  without NVIDIA's linker), so a larger batch saves little time more and grows the cache. 32 conformance kernels for
  sm_90, one by one: 59 ms each, 4.9 KB a library; in batches of 4: 17 ms, 14 KB; of 8: 11.5 ms, 26 KB; of 16:
  11.1 ms, 50 KB; of 32: 9.2 ms, 99 KB. 8 takes most of the saving at a quarter of 32's cache, and a batch with a
  bad source costs 8 compiles more, not 32."""

  def compile_uncached(self, src: str) -> bytes: return self.compile_with_log(src)[0]

  def compile_with_log(self, src: str) -> tuple[bytes, str]:
    """(the library, NVRTC's log): the log of a kernel that compiles holds NVRTC's warnings."""
    cubin, log = self._cubin(src)
    return pack_library(self._meta(src), cubin), log

  def compile_batch_uncached(self, srcs: Sequence[str]) -> list[bytes]:
    """The libraries of several kernels from one NVRTC program (see the module's doc): each member's is the batch's
    cubin with that member's entry and dynamic shared memory. Raises CompileError when the batch does not build (a
    member NVRTC rejects, or one batch_member cannot take): Compiler.compile_many then builds them one by one."""
    members = [batch_member(i, src) for i, src in enumerate(srcs)]
    includes = dict.fromkeys(line for m in members for line in m.includes)
    cubin, _ = self._cubin("\n".join([*includes, *(m.text for m in members)]))
    return [pack_library({**self._meta(src), "entry": m.entry}, cubin) for m, src in zip(members, srcs)]

  def _meta(self, src: str) -> dict:
    m = _DYNAMIC_SHARED.search(src)
    # the CUDA major that built the cubin: a driver of an older major cannot load it
    return {"arch": self.arch, "cuda": nvrtc_major(), "dynamic_shared": int(m.group(1)) if m else 0}

  def _cubin(self, src: str) -> tuple[bytes, str]:
    """(the cubin of `src`, NVRTC's log); CompileError with the log and the source lines around each error."""
    nvrtc = _nvrtc()
    prog = _check(nvrtc, nvrtc.nvrtcCreateProgram(src.encode(), b"kernel.cu", 0, [], []), "nvrtcCreateProgram")
    try:
      opts = [o.encode() for o in self.options]
      result = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
      err = result[0] if isinstance(result, tuple) else result
      log = self._log(nvrtc, prog)
      if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        first = next((ln.strip() for ln in log.splitlines() if "error" in ln), log.strip().splitlines()[0] if log.strip() else err.name)
        raise CompileError(f"NVRTC {nvrtc_version()} failed to compile for {self.arch}: {first}", src=src,
                           log=log + ("\n" + error_context(src, log) if _ERROR_LINE.search(log) else ""))
      cubin = bytearray(_check(nvrtc, nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize"))
      _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
    finally: nvrtc.nvrtcDestroyProgram(prog)
    return bytes(cubin), log

  @staticmethod
  def _log(nvrtc, prog) -> str:
    # NVRTC writes into the buffer: it must be a bytearray. A bytes object would be written in place, and an empty
    # log's one-byte b" " is the interpreter's shared b" ", which every later b" " (print's separator) would then be NUL
    buf = bytearray(_check(nvrtc, nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize"))
    _check(nvrtc, nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
    return bytes(buf).rstrip(b"\0").decode(errors="replace")


# ---------------------------------------------------------------------------------------------------------- batches

@dataclass(frozen=True)
class BatchMember:
  """One source of a batch: its #include lines (the batch writes each once, first), the rest of its text in its own
  namespace with its kernel renamed, and the kernel's name in the batch's cubin."""
  includes: tuple[str, ...]
  text: str
  entry: str


def batch_member(index: int, src: str) -> BatchMember:
  """Source `index` of a batch: its kernel named kcb<index>_<name>, the rest in namespace kcb<index>. Raises
  CompileError for a source with a preprocessor line other than #include (its macros could reach the members after
  it) or without exactly one extern "C" __global__ kernel."""
  includes, body = [], []
  for line in src.splitlines():
    if line.lstrip().startswith("#"):
      if not line.startswith("#include"): raise CompileError(f"a batched kernel cannot have its own preprocessor line {line!r}", src=src)
      includes.append(line.strip())
    else: body.append(line)
  names = [m["name"] for m in _KERNEL.finditer(src)]
  if len(names) != 1: raise CompileError(f"a batched source must define one extern \"C\" __global__ kernel, not {len(names)}", src=src)
  name, entry = names[0], f"kcb{index}_{names[0]}"
  text = "\n".join([f"#define {name} {entry}", f"namespace kcb{index} {{", *body, "}", f"#undef {name}"])
  return BatchMember(tuple(includes), text, entry)
