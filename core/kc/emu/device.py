"""The EMU device: its compiler (which checks the serialized program), the program handle that launches a kernel,
EmuDevice, and the BackendSpec and `kc_backends` hook it is registered with, like any backend."""
from __future__ import annotations
import base64, time
from typing import Optional, Sequence
import numpy as np
from kc.runtime.device import CompiledDevice, Compiler, HostAllocator, raw_buffers
from kc.runtime.plugins import PLUGIN_API_VERSION, BackendSpec, hookimpl
from kc.ir.codec import storage_np
from kc.ir.dtype import DType
from kc.errors import CompileError, KcError, UnknownDeviceError
from kc.config import read
from kc.helpers import distribution_version, prod
from kc.ir.symbolic import sym_infer
from kc.ir.uop import Ops, UOp
from kc.emu.errors import LaunchError
from kc.emu.interpreter import Limits, _Batch, _dims, _loop_variable, _Plan, _Run
from kc.emu.program_format import FORMAT, load_program
from kc.emu.renderer import DEVICE, EmuRenderer, impersonating


PRIORITY = -1000  # below every real device: EMU is never the default while anything else can run
LANES_PER_BATCH = 1 << 14  # whole work-groups are batched up to this many threads, to bound memory


# ---------------------------------------------------------------------------------------------------------- compiler

class EmuCompiler(Compiler):
  """Checks the serialized program and returns its payload. Nothing is cached on disk: decoding the payload is
  cheaper than reading a cache entry, and an entry would only store the source a second time."""

  def compile(self, src: str) -> bytes:
    if not isinstance(src, str): raise CompileError(f"source must be a str, got {type(src).__name__}", src=str(src))
    return self.compile_uncached(src)

  def compile_uncached(self, src: str) -> bytes:
    line = next((ln for ln in reversed(src.splitlines()) if ln.startswith(FORMAT + " ")), None)
    if line is None: raise CompileError(f"not an EMU program: no '{FORMAT} ...' line (render it with EMU's renderer)", src=src)
    try:
      data = base64.b64decode(line[len(FORMAT) + 1:], validate=True)
      name, uops = load_program(data)
    except Exception as e:
      raise CompileError(f"the EMU program is damaged: {type(e).__name__}: {e}", src=src) from e
    _Plan(name, uops)  # unknown ops fail here, at compile time, like a compiler rejecting source
    return data


# ---------------------------------------------------------------------------------------------------------- program handle

def _grid(gdims) -> np.ndarray:
  """Every work-group's coordinates, x fastest."""
  return np.stack(np.meshgrid(*[np.arange(d) for d in gdims], indexing="ij"), axis=-1).transpose(2, 1, 0, 3).reshape(-1, 3)


class EmuProgram:
  """A loaded EMU program; calling it launches the kernel (the kc program-handle protocol)."""

  def __init__(self, name: str, lib: bytes, limits: Optional[Limits] = None):
    try: prog_name, uops = load_program(lib)
    except Exception as e: raise LaunchError(f"kernel {name}: the EMU binary does not load: {type(e).__name__}: {e}") from e
    self.name, self.plan = name, _Plan(prog_name, uops)
    self.limits = limits
    if limits is not None and self.plan.local_bytes > limits.shared_max:
      raise LaunchError(f"kernel {name} declares {self.plan.local_bytes} bytes of local memory, more than the shared_max "
                        f"{limits.shared_max} of the {limits.renderer} renderer")

  def __call__(self, *bufs, global_size: Optional[Sequence[int]] = (1, 1, 1), local_size: Optional[Sequence[int]] = (1, 1, 1),
               vals: Sequence[int] = (), wait: bool = False) -> Optional[float]:
    plan = self.plan
    start = time.perf_counter()
    buffers = self._buffers(bufs)
    var_vals = self._var_values(vals)
    gdims, ldims = _dims(global_size, "global", self.name), _dims(local_size, "local", self.name)
    self._check_launch(gdims, ldims, global_size, local_size, var_vals)
    groups, iterations = _grid(gdims), self._loop_iterations(gdims, ldims, var_vals)
    if iterations is not None: groups = np.zeros((len(iterations), 3), dtype=np.int64)
    per_batch = max(1, LANES_PER_BATCH // prod(ldims))
    with np.errstate(all="ignore"):  # wrap-around, inf and nan are the semantics here, not accidents
      for first in range(0, len(groups), per_batch):
        its = iterations[first:first + per_batch] if iterations is not None else None
        _Run(plan, _Batch(groups[first:first + per_batch], ldims, its), buffers, var_vals, self.limits).run()
    return time.perf_counter() - start if wait else None

  def _loop_iterations(self, gdims, ldims, var_vals: list[int]) -> Optional[np.ndarray]:
    """Every index tuple of the parallel loops, in loop order (the innermost fastest), or None to run them as
    loops: when there are none, when the launch has more than one thread, or when one has no iteration at all."""
    plan = self.plan
    if not plan.parallel_loops or prod(gdims) * prod(ldims) != 1: return None
    by_var = {plan.uops[pc]: v for pc, v in zip(plan.vars, var_vals)}
    sizes = []
    for pc in plan.parallel_loops:
      end = plan.uops[plan.srcs[pc][1]]
      sizes.append(end.arg if end.op is Ops.CONST else by_var[_loop_variable(end)])
    if any(s <= 0 for s in sizes): return None
    return np.stack(np.meshgrid(*[np.arange(s) for s in sizes], indexing="ij"), axis=-1).reshape(-1, len(sizes))

  def _buffers(self, bufs) -> list[tuple[np.ndarray, DType]]:
    plan = self.plan
    if len(bufs) != len(plan.globals):
      raise LaunchError(f"kernel {self.name} takes {len(plan.globals)} buffers, got {len(bufs)}")
    out = []
    for i, (pc, raw) in enumerate(zip(plan.globals, raw_buffers(bufs))):
      dt = plan.uops[pc].dtype.base
      arr = getattr(raw, "array", None)
      if not isinstance(arr, np.ndarray): raise LaunchError(f"kernel {self.name}: buffer {i} is not EMU (host) memory: {type(raw).__name__}")
      itemsize = storage_np(dt).itemsize
      usable = arr[:len(arr) - len(arr) % itemsize]
      out.append((usable.view(storage_np(dt)), dt))
    return out

  def _var_values(self, vals: Sequence[int]) -> list[int]:
    plan = self.plan
    if len(vals) != len(plan.vars):
      raise LaunchError(f"kernel {self.name} takes {len(plan.vars)} variable values "
                        f"({', '.join(plan.uops[pc].arg[0] for pc in plan.vars)}), got {len(vals)}")
    for pc, v in zip(plan.vars, vals):
      name, lo, hi = plan.uops[pc].arg
      if not lo <= int(v) <= hi: raise LaunchError(f"kernel {self.name}: variable {name}={v} is outside its range {lo}..{hi}")
    return [int(v) for v in vals]

  def _check_launch(self, gdims, ldims, global_size, local_size, var_vals: list[int]):
    """The launch matches the sizes the kernel's SPECIALs declare and the limits its renderer promised."""
    plan = self.plan
    by_name = {plan.uops[pc].arg[0]: v for pc, v in zip(plan.vars, var_vals)}
    for pc in plan.specials:
      name, size = plan.uops[pc].arg
      if isinstance(size, UOp) and any(v.arg[0] not in by_name for v in size.variables()):
        continue  # a launch dim set by a Variable the kernel does not take: only the launch knows its value
      want, axis = int(sym_infer(size, by_name)), int(name[-1])
      got = gdims[axis] if name.startswith("gidx") else ldims[axis] if name.startswith("lidx") else gdims[axis] * ldims[axis]
      if got != want:
        raise LaunchError(plan.where(pc, f"{name} counts {want}, but the launch (global {list(gdims)}, local {list(ldims)}) gives {got}"))
    if self.limits is None: return
    for dims, given, limit, what in ((gdims, global_size, self.limits.global_max, "global"), (ldims, local_size, self.limits.local_max, "local")):
      if given is None or limit is None: continue
      if any(d > m for d, m in zip(dims, limit)):
        raise LaunchError(f"kernel {self.name}: {what} size {list(dims)} exceeds the {what}_max {tuple(limit)} "
                          f"of the {self.limits.renderer} renderer")


# ---------------------------------------------------------------------------------------------------------- the device

class EmuDevice(CompiledDevice):
  """The EMU device. `impersonate(name)` swaps in the lowering of another registered device's renderer."""

  def __init__(self, impersonate: Optional[str] = None):
    super().__init__(DEVICE, HostAllocator(), EmuRenderer(), EmuCompiler(f"kc {distribution_version('kc-core')}"), self._load)
    self.impersonate(impersonate)

  @property
  def impersonating(self) -> Optional[str]:
    """The device whose renderer EMU lowers with, None for its generic renderer."""
    return getattr(self.renderer, "impersonates", None)

  def impersonate(self, name: Optional[str]) -> "EmuDevice":
    """Lower kernels with the Renderer of registered device `name` (limits, locals, float4, tensor cores, dialect
    rewrites); None (or "") goes back to EMU's generic renderer."""
    if not name:
      self.renderer = EmuRenderer()
      return self
    from kc.runtime.device import Device
    if Device.canonical(name) == DEVICE: raise KcError("EMU cannot impersonate itself: impersonate(None) gives its generic renderer")
    if name not in Device:
      raise UnknownDeviceError(f"EMU cannot impersonate {name!r}: no such device is registered (registered: {', '.join(Device.names())})")
    self.renderer = impersonating(Device.renderer(name))
    return self

  def _load(self, name: str, lib: bytes) -> EmuProgram:
    r = self.renderer
    limits = Limits(self.impersonating or DEVICE, r.global_max, r.local_max if r.has_local else None, r.shared_max, tuple(r.tensor_cores),
                    r.aligned_vectors)
    return EmuProgram(name, lib, limits)

  def __repr__(self): return f"<EmuDevice impersonating {self.impersonating or 'nothing (generic renderer)'}>"


def open_device() -> EmuDevice: return EmuDevice(read("KC_EMULATE") or None)


def backend_spec() -> BackendSpec:
  """The BackendSpec kc registers EMU with: always available, the lowest priority."""
  from kc.runtime.device import Device
  return BackendSpec(name=DEVICE, api_version=PLUGIN_API_VERSION, priority=PRIORITY, available=lambda: None, open=open_device,
                     renderer=lambda: Device[DEVICE].renderer, distribution="kc-core", version=distribution_version("kc-core"))


# EMU is registered like any backend: the kc distribution's own `kc.backends` entry point (pyproject.toml) names
# this module, so every installed kc has it whatever plugins are installed
@hookimpl
def kc_backends() -> list[BackendSpec]: return [backend_spec()]
