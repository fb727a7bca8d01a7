"""CUDA C to cubin through NVRTC (NVIDIA's runtime compiler, from the nvidia-cuda-nvrtc wheel through cuda-bindings),
with the CUDA headers of the nvidia-cuda-runtime wheel: no CUDA toolkit, no GPU. The output is cubin for one exact
arch, not PTX: PTX from an NVRTC newer than the driver fails to load, cubin does not.

What compile() returns is a kc CUDA library: the cubin behind a small header holding what the runtime needs to know
that the cubin does not say (the dynamic shared memory the kernel declares)."""
from __future__ import annotations
import functools, importlib.util, json, os, re, struct
from kc.backend import CompileError, Compiler
from kc_cuda.arch import parse_arch
from kc_cuda.renderer import DYNAMIC_SHARED_MARKER

LIBRARY_MAGIC = b"KCCUDA1\0"
_ERROR_LINE = re.compile(r"\((\d+)\): (?:catastrophic )?error")
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


@functools.cache
def include_dir() -> str:
  """The CUDA headers (cuda_fp16.h, cuda_bf16.h) of the nvidia-cuda-runtime wheel."""
  spec = importlib.util.find_spec("nvidia.cuda_runtime")
  for root in (spec.submodule_search_locations or []) if spec is not None else []:
    if os.path.isfile(os.path.join(root, "include", "cuda_fp16.h")): return os.path.join(root, "include")
  raise CompileError("the CUDA headers are missing: pip install nvidia-cuda-runtime-cu12 (kc-cuda depends on it)")


def _nvrtc():
  try: from cuda.bindings import nvrtc
  except ImportError as e: raise CompileError(f"NVRTC is not importable ({e}): pip install kc-cuda, which installs cuda-bindings") from None
  return nvrtc


def _check(nvrtc, result, what: str):
  err, *rest = result if isinstance(result, tuple) else (result,)
  if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
    raise CompileError(f"NVRTC {what} failed: {err.name if hasattr(err, 'name') else err}")
  return rest[0] if len(rest) == 1 else rest


@functools.cache
def nvrtc_version() -> str:
  nvrtc = _nvrtc()
  try: major, minor = _check(nvrtc, nvrtc.nvrtcVersion(), "nvrtcVersion")
  except Exception as e:  # the wheel's libnvrtc not found
    raise CompileError(f"NVRTC cannot load ({type(e).__name__}: {e}): pip install nvidia-cuda-nvrtc-cu12") from None
  return f"{major}.{minor}"


@functools.cache
def supported_archs() -> tuple[str, ...]:
  nvrtc = _nvrtc()
  return tuple(f"sm_{a}" for a in _check(nvrtc, nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs"))


def error_context(src: str, log: str) -> str:
  """The source lines around each line NVRTC reports an error on, numbered, the error line marked."""
  lines, out = src.splitlines(), []
  for n in dict.fromkeys(int(m.group(1)) for m in _ERROR_LINE.finditer(log)):
    for i in range(max(1, n - CONTEXT_LINES), min(len(lines), n + CONTEXT_LINES) + 1):
      out.append(f"{'>' if i == n else ' '}{i:5d} | {lines[i - 1]}")
    out.append("")
  return "\n".join(out)


class NVRTCCompiler(Compiler):
  """Compiles for one arch. identity() holds the arch, NVRTC's version and the options: the disk cache never hands a
  cubin for another GPU or compiler to the runtime."""

  def __init__(self, arch: str, plugin_version: str = ""):
    super().__init__(plugin_version)
    self.arch = parse_arch(arch, "arch")
    if self.arch not in supported_archs():
      raise CompileError(f"NVRTC {nvrtc_version()} cannot compile for {self.arch}; it supports {', '.join(supported_archs())}")
    # FMA contraction on (the default of nvcc and NVRTC; kc's tolerances allow a fused multiply-add)
    # -default-device: helper functions the C-style base writes without __device__ (fp8 conversions) are device code
    self.options = [f"--gpu-architecture={self.arch}", "--std=c++17", "--fmad=true", "-default-device", f"-I{include_dir()}"]

  def identity(self) -> str:
    return " | ".join([type(self).__qualname__, f"nvrtc {nvrtc_version()}", *self.options[:-1]])

  def compile_uncached(self, src: str) -> bytes:
    nvrtc = _nvrtc()
    prog = _check(nvrtc, nvrtc.nvrtcCreateProgram(src.encode(), b"kernel.cu", 0, [], []), "nvrtcCreateProgram")
    try:
      opts = [o.encode() for o in self.options]
      result = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
      err = result[0] if isinstance(result, tuple) else result
      if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        log = self._log(nvrtc, prog)
        first = next((ln.strip() for ln in log.splitlines() if "error" in ln), log.strip().splitlines()[0] if log.strip() else err.name)
        raise CompileError(f"NVRTC {nvrtc_version()} failed to compile for {self.arch}: {first}", src=src,
                           log=log + ("\n" + error_context(src, log) if _ERROR_LINE.search(log) else ""))
      size = _check(nvrtc, nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
      cubin = b" " * size
      _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
    finally: nvrtc.nvrtcDestroyProgram(prog)
    m = re.search(re.escape(DYNAMIC_SHARED_MARKER) + r" (\d+)", src)
    return pack_library({"arch": self.arch, "dynamic_shared": int(m.group(1)) if m else 0}, cubin)

  @staticmethod
  def _log(nvrtc, prog) -> str:
    size = _check(nvrtc, nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
    buf = b" " * size
    _check(nvrtc, nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
    return buf.rstrip(b"\0").decode(errors="replace")
