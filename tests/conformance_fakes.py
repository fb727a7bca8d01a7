"""Deliberately broken backends for the conformance suite's own tests, registered in-process when pytest loads this
module as a plugin (`-p conformance_fakes`). Every callable of their BackendSpecs is a module-level function, so the
suite's isolation worker can register them too.

WRONGADD: CLANG, but float32 ADD is spelled as a subtraction (wrong results for one op).
SEGV: CLANG, but every kernel writes through a null pointer after its work (a crash).
HANG: CLANG, but every kernel spins forever after its work (a timeout).
STICKY: CLANG, but a kernel with a float32 multiply faults as a GPU kernel with an illegal address does (a
  kc.DeviceLostError, raised wrapped in another error), after which every launch in that process fails (a sticky error).
BIGLOCAL: EMU's lowering, but a dialect rewrite widens every work-group past the declared local_max.
NOHW: CLANG's renderer on a device that is never available here (render tier only).
TOUCHY: raises as soon as anything asks it whether it is available, opens it or asks for its renderer."""
from __future__ import annotations
from kc import DeviceLostError, KcError, Ops, PatternMatcher, UOp, UPat, dtypes
from kc.runtime.device import CompiledDevice, HostAllocator
from kc.emu import EmuCompiler, EmuProgram, EmuRenderer, Limits
from kc.runtime.plugins import PLUGIN_API_VERSION, BackendSpec, register
from kc_clang.compiler import ClangCompiler
from kc_clang.renderer import ClangRenderer
from kc_clang.runtime import ClangProgram


def _float32_add(a: str, b: str, dt) -> str: return f"({a}-{b})" if dt.scalar() == dtypes.float32 else f"({a}+{b})"


class WrongAddRenderer(ClangRenderer):
  device = "WRONGADD"
  code_for_op = {**ClangRenderer.code_for_op, Ops.ADD: _float32_add}


class _AfterWork(ClangRenderer):
  """Appends `tail` to the end of every kernel function (after its stores)."""
  tail = ""

  def render(self, name, uops) -> str:
    src = super().render(name, uops)
    end = src.rindex("}")
    return src[:end] + f"  {self.tail}\n}}" + src[end + 1:]


class SegvRenderer(_AfterWork):
  device = "SEGV"
  tail = "*(volatile int*)0 = 1;"


class HangRenderer(_AfterWork):
  device = "HANG"
  tail = "while (1) { }"


FAULT_MARK = "// kc-conformance-fakes: this kernel faults"
_LOST: list[str] = []  # the kernel that faulted in this process: the device is lost from then on


class FakeIllegalAddress(DeviceLostError):
  """What a GPU plugin raises for a sticky error (kc_cuda's CUDADeviceLost)."""


class StickyRenderer(ClangRenderer):
  device = "STICKY"

  def render(self, name, uops) -> str:
    faults = any(u.op is Ops.MUL and u.dtype.scalar() == dtypes.float32 for u in uops)
    return (FAULT_MARK + "\n" if faults else "") + super().render(name, uops)


class StickyCompiler(ClangCompiler):
  """CLANG's binary behind one byte: F where the kernel faults."""
  def compile_uncached(self, src: str) -> bytes: return (b"F" if FAULT_MARK in src else b"-") + super().compile_uncached(src)


class StickyProgram:
  def __init__(self, name: str, lib: bytes):
    self.name, self.faults, self.program = name, lib[:1] == b"F", ClangProgram(name, lib[1:])

  def __call__(self, *bufs, **kwargs):
    if _LOST: raise FakeIllegalAddress(f"launching {self.name} failed: the device was lost when {_LOST[0]} faulted")
    if self.faults:
      _LOST.append(self.name)
      fault = FakeIllegalAddress(f"{self.name} failed with CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered")
      raise KcError(f"running {self.name} failed") from fault
    return self.program(*bufs, **kwargs)


WIDENED = 100  # each thread axis of a work-group becomes this many times wider than the Kernel planned


def _widen(x: UOp):
  name, size = x.arg
  if not name.startswith("lidx") or not isinstance(size, int) or size > BigLocalRenderer.local_max[0]: return None
  return x.replace(arg=(name, size * WIDENED))


class BigLocalRenderer(EmuRenderer):
  local_max = (16, 16, 16)
  extra_matcher = PatternMatcher([(UPat(Ops.SPECIAL, name="x"), _widen)])


def _clang_device(name: str, renderer):
  return CompiledDevice(name, HostAllocator(), renderer, ClangCompiler("kc-conformance-fakes"), ClangProgram)


def open_sticky(): return CompiledDevice("STICKY", HostAllocator(), StickyRenderer(), StickyCompiler("kc-conformance-fakes"), StickyProgram)
def sticky_renderer(): return StickyRenderer()
def open_wrongadd(): return _clang_device("WRONGADD", WrongAddRenderer())
def open_segv(): return _clang_device("SEGV", SegvRenderer())
def open_hang(): return _clang_device("HANG", HangRenderer())
def wrongadd_renderer(): return WrongAddRenderer()
def segv_renderer(): return SegvRenderer()
def hang_renderer(): return HangRenderer()
def biglocal_renderer(): return BigLocalRenderer()
def nohw_renderer(): return ClangRenderer()


def _biglocal_program(name: str, lib: bytes):
  r = BigLocalRenderer()
  return EmuProgram(name, lib, Limits("BIGLOCAL", r.global_max, r.local_max, r.shared_max, tuple(r.tensor_cores)))


def open_biglocal(): return CompiledDevice("BIGLOCAL", HostAllocator(), BigLocalRenderer(), EmuCompiler("kc-conformance-fakes"), _biglocal_program)
def always_available(): return None
def never_available(): return "no such hardware on this machine"
def open_nohw(): raise RuntimeError("NOHW has no hardware")
def touched(): raise RuntimeError("TOUCHY was touched")


FAKES = [
  BackendSpec("WRONGADD", PLUGIN_API_VERSION, -50, always_available, open_wrongadd, wrongadd_renderer),
  BackendSpec("SEGV", PLUGIN_API_VERSION, -50, always_available, open_segv, segv_renderer),
  BackendSpec("HANG", PLUGIN_API_VERSION, -50, always_available, open_hang, hang_renderer),
  BackendSpec("STICKY", PLUGIN_API_VERSION, -50, always_available, open_sticky, sticky_renderer),
  BackendSpec("BIGLOCAL", PLUGIN_API_VERSION, -50, always_available, open_biglocal, biglocal_renderer),
  BackendSpec("NOHW", PLUGIN_API_VERSION, -50, never_available, open_nohw, nohw_renderer),
  BackendSpec("TOUCHY", PLUGIN_API_VERSION, -50, touched, touched, touched),
]


def register_fakes():
  for spec in FAKES: register(spec, replace=True)


register_fakes()
