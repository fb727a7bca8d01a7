"""MSL source to what kc caches: the source itself, once Metal's compiler has accepted it.

Why not a metallib: building one ahead of time needs Xcode's `metal` tool (not on a Mac with only the command-line
tools), and Metal's own API gives no metallib of a library built from source. Metal keeps its own cache of what it
compiles from source, so loading accepted source again is cheap. The compile step still runs Metal's compiler, so a
kernel Metal rejects fails at compile time with Metal's log, and kc's disk cache remembers which sources passed.
Importing this module imports pyobjc's Metal: the device imports it when it opens, on macOS only."""
from __future__ import annotations
import platform, threading
from collections import OrderedDict
import Metal
from kc.backend import CompileError, Compiler

LIBRARIES_KEPT = 64  # libraries built by compile kept for the load that follows it


def compile_options():
  """IEEE floats (no fast math), so kernels give numpy's numbers; the newest MSL the OS has (the default), which
  bfloat needs (MSL 3.1, macOS 14)."""
  options = Metal.MTLCompileOptions.alloc().init()
  if hasattr(options, "setMathMode_"): options.setMathMode_(0)  # MTLMathModeSafe (macOS 15)
  else: options.setFastMathEnabled_(False)
  return options


def first_error(log: str) -> str:
  lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
  return next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "(Metal gave no compiler log)")


def describe(error) -> str:
  """An NSError's text (Metal puts the compiler log in localizedDescription)."""
  if error is None: return ""
  return str(error.localizedDescription())


class MetalCompiler(Compiler):
  """Checks source with the device's Metal compiler and returns the source as bytes (see the module doc)."""

  def __init__(self, device, plugin_version: str = ""):
    super().__init__(plugin_version)
    self.device = device
    self._built: OrderedDict[str, object] = OrderedDict()
    self._lock = threading.Lock()

  def identity(self) -> str:
    # the OS's Metal compiler decides what is accepted: a new OS (or another GPU) checks the source again
    return " | ".join([type(self).__qualname__, str(self.device.name()), platform.mac_ver()[0]])

  def build(self, src: str):
    """The MTLLibrary of `src`, built now or kept from a recent compile; CompileError with Metal's log if rejected."""
    with self._lock:
      if (hit := self._built.pop(src, None)) is not None: return hit
    library, error = self.device.newLibraryWithSource_options_error_(src, compile_options(), None)
    if library is None:
      log = describe(error)
      raise CompileError(f"Metal's compiler rejected the kernel: {first_error(log)}", src=src, log=log)
    return library

  def compile_uncached(self, src: str) -> bytes:
    library = self.build(src)
    with self._lock:
      self._built[src] = library
      while len(self._built) > LIBRARIES_KEPT: self._built.popitem(last=False)
    return src.encode()
