"""MSL source to what kc caches: the source itself, once Metal's compiler has accepted it.

Why not a metallib: building one ahead of time needs Xcode's `metal` tool (not on a Mac with only the command-line
tools), and Metal's own API gives no metallib of a library built from source. Metal keeps its own cache of what it
compiles from source, so loading accepted source again is cheap. The compile step still runs Metal's compiler, so a
kernel Metal rejects fails at compile time with Metal's log, and kc's disk cache remembers which sources passed.
Importing this module imports pyobjc's Metal: the device imports it when it opens, on macOS only."""
from __future__ import annotations
import platform, threading
from collections import OrderedDict
import Metal, objc
from kc.backend import CompileError, Compiler
from kc_metal.launch import describe
from kc_metal.msl import CompileSettings, apply_settings, compile_settings, has_math_mode, msl_for, parse_macos

LIBRARIES_KEPT = 64  # libraries built by compile kept for the load that follows it


def settings_here(metal3: bool) -> CompileSettings:
  """The compile settings of this Mac: the newest MSL its macOS and GPU (`metal3`: MTLGPUFamilyMetal3) compile, IEEE
  math (kc_metal.msl says why both math properties are set)."""
  language = msl_for(parse_macos(platform.mac_ver()[0]), metal3)
  return compile_settings(language, has_math_mode(Metal.MTLCompileOptions.alloc().init()))


def compile_options(settings: CompileSettings):
  """A fresh MTLCompileOptions with `settings` set."""
  return apply_settings(settings, Metal.MTLCompileOptions.alloc().init())


def first_error(log: str) -> str:
  lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
  return next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "(Metal gave no compiler log)")


class MetalCompiler(Compiler):
  """Checks source with the device's Metal compiler and returns the source as bytes (see the module doc)."""

  def __init__(self, device, settings: CompileSettings, plugin_version: str = ""):
    super().__init__(plugin_version)
    self.device, self.settings = device, settings
    self._built: OrderedDict[str, object] = OrderedDict()
    self._lock = threading.Lock()

  def identity(self) -> str:
    # the OS's Metal compiler decides what is accepted: a new OS (or another GPU) checks the source again
    parts = [type(self).__qualname__, str(self.device.name()), platform.mac_ver()[0], self.settings.describe()]
    return " | ".join(parts)

  def build(self, src: str):
    """The MTLLibrary of `src`, built now or kept from a recent compile; CompileError with Metal's log if rejected."""
    with self._lock:
      if (hit := self._built.pop(src, None)) is not None: return hit
    with objc.autorelease_pool():  # the options and Metal's error are autoreleased: drained here, not at exit
      library, error = self.device.newLibraryWithSource_options_error_(src, compile_options(self.settings), None)
      log = describe(error) if library is None else ""
    if library is None:
      raise CompileError(f"Metal's compiler rejected the kernel: {first_error(log)}", src=src, log=log)
    return library

  def compile_uncached(self, src: str) -> bytes:
    library = self.build(src)
    with self._lock:
      self._built[src] = library
      while len(self._built) > LIBRARIES_KEPT: self._built.popitem(last=False)
    return src.encode()
