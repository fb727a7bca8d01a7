"""Running candidates on the device: the search's buffers (random inputs, allocated once per search through the
device's allocator) and the timing of one program on them (warm-up, several runs, the median, and an early stop
once it is clearly slower than the best so far).

Every candidate of a search runs on the same buffers, so their times differ only by their code. Inputs are random
(seeded) rather than zeros: a kernel whose speed or result depends on its data (a max, a masked load) is timed and
checked on values that exercise it. Outputs start as a sentinel (all bits set, NaN for floats) before each checked
run, so that a candidate that leaves an element unwritten cannot pass the correctness check on its predecessor's
result."""
from __future__ import annotations
import statistics
from dataclasses import dataclass
from typing import Any, Optional
import numpy as np
from kc.errors import KcError
from kc.ir.dtype import DType, dtypes
from kc.ir.uop import Ops, UOp
from kc.codegen.verify import st_arg
from kc.renderer import Program
from kc.shape import ShapeTracker


@dataclass
class BufferInfo:
  """One buffer of the kernel: its index, element dtype and count, and whether the kernel writes / reads it."""
  index: int
  dtype: DType
  size: int
  written: bool
  read: bool


def variable_values(ast: UOp) -> dict[str, int]:
  """The value each Variable of the kernel takes in the search: its largest, so that buffers and launches cover
  every smaller value too."""
  return {v.arg[0]: int(v.arg[2]) for v in ast.variables()}


def buffer_layout(ast: UOp) -> list[BufferInfo]:
  """Every global buffer of the AST by index, sized for the most any of its views reaches."""
  vals = variable_values(ast)
  found: dict[int, BufferInfo] = {}
  for u in ast.toposort:
    if u.op not in (Ops.LOAD, Ops.STORE) or u.src[0].op is not Ops.DEFINE_GLOBAL: continue
    g = u.src[0]
    st = st_arg(u).unbind()[0]
    if st.vars():
      subst = {v: UOp.const(v.dtype, vals[v.arg[0]]) for v in st.vars()}
      st = ShapeTracker(tuple(view.substitute(subst) for view in st.views))
    reach = int(st.real_size())
    if g.dtype.size != -1: reach = max(reach, int(g.dtype.size))
    info = found.setdefault(g.arg, BufferInfo(g.arg, g.dtype.base.scalar(), 0, False, False))
    info.size = max(info.size, reach, 1)
    if u.op is Ops.STORE: info.written = True
    else: info.read = True
  return [found[i] for i in sorted(found)]


def random_values(info: BufferInfo, rng: np.random.Generator) -> np.ndarray:
  """Random contents for a buffer, as the bytes the device holds: normal floats, small ints (so products and sums
  stay far from overflow), random bools; bfloat16 and fp8 as the bits of values near 1."""
  dt, n = info.dtype, info.size
  if dt == dtypes.bool: return rng.integers(0, 2, n).astype(np.bool_)
  if dtypes.is_float(dt):
    if dt.np is not None: return rng.standard_normal(n).astype(dt.np)
    if dt == dtypes.bfloat16: return (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    # fp8: exponent bits around the bias (values between 1/4 and 4) with any mantissa and sign
    exp_bits, man_bits = dtypes.finfo(dt)
    bias = 2 ** (exp_bits - 1) - 1
    exps = rng.integers(bias - 2, bias + 2, n).astype(np.uint8)
    return ((rng.integers(0, 2, n).astype(np.uint8) << 7) | (exps << man_bits) | rng.integers(0, 2 ** man_bits, n).astype(np.uint8)).astype(np.uint8)
  if dtypes.is_unsigned(dt): return rng.integers(0, 16, n).astype(dt.np)
  return rng.integers(-8, 8, n).astype(dt.np)


def _sentinel(info: BufferInfo) -> np.ndarray:
  return np.full(info.size * info.dtype.itemsize, 0xFF, dtype=np.uint8)


class SearchBuffers:
  """The buffers every candidate of one search runs on, allocated once on `device` (its allocator), with inputs
  drawn from `seed`. reset() writes the initial contents again (inputs, and the sentinel in pure outputs)."""

  def __init__(self, ast: UOp, device: Any, seed: int):
    self.layout = buffer_layout(ast)
    self.var_vals = variable_values(ast)
    self.allocator = device.allocator
    rng = np.random.default_rng(seed)
    # a buffer that is read is random even when the kernel also writes it (an update in place)
    self.initial = [np.ascontiguousarray(random_values(b, rng)).view(np.uint8).reshape(-1) if b.read else _sentinel(b) for b in self.layout]
    self.handles = [self.allocator.alloc(b.size * b.dtype.itemsize) for b in self.layout]
    self.reset()

  def reset(self) -> None:
    for h, data in zip(self.handles, self.initial): self.allocator.copyin(h, memoryview(data))

  def outputs(self) -> dict[int, np.ndarray]:
    """A copy of every buffer the kernel writes, as raw bytes."""
    out = {}
    for b, h in zip(self.layout, self.handles):
      if b.written:
        raw = np.empty(b.size * b.dtype.itemsize, dtype=np.uint8)
        self.allocator.copyout(memoryview(raw), h)
        out[b.index] = raw
    return out

  def free(self) -> None:
    for b, h in zip(self.layout, self.handles): self.allocator.free(h, b.size * b.dtype.itemsize)
    self.handles = []


class Launcher:
  """A loaded candidate: its ProgramHandle and everything a launch on the search's buffers needs, worked out once."""

  def __init__(self, program: Program, handle: Any, bufs: SearchBuffers):
    self.program, self.handle = program, handle
    by_index = {b.index: h for b, h in zip(bufs.layout, bufs.handles)}
    try: self.args = [by_index[g] for g in program.globals]
    except KeyError as e: raise KcError(f"{program.name} takes buffer {e.args[0]}, which its AST does not have") from None
    self.global_size, self.local_size = program.launch_dims(bufs.var_vals)
    self.vals = [bufs.var_vals[v.arg[0]] for v in program.vars]

  def __call__(self) -> float:
    """One launch, waited for; its run time in seconds as the device reports it."""
    t = self.handle(*self.args, global_size=self.global_size, local_size=self.local_size, vals=self.vals, wait=True)
    if not isinstance(t, (int, float)) or t != t or t < 0: raise KcError(f"{self.program.name}: the device reported a run time of {t!r}")
    return float(t)


@dataclass(frozen=True)
class TimingPlan:
  """How a candidate is timed: `warmup` untimed runs, then up to `runs` timed ones (the median counts). Once a
  run takes more than `give_up` times the best median so far, the candidate is clearly slower: timing stops there
  and that run is its time (it cannot win, and a slow candidate's runs are the expensive ones). The beam uses the
  same factor: a kernel more than `give_up` times slower than the best is not expanded in the next round."""
  warmup: int = 1
  runs: int = 3
  give_up: float = 3.0


def time_launcher(launch: Launcher, plan: TimingPlan, best: Optional[float]) -> tuple[float, int]:
  """(median seconds, timed runs) of a candidate under `plan`, stopping early against `best`."""
  for _ in range(plan.warmup):
    first = launch()
    if best is not None and first > plan.give_up * 2 * best: return first, 0  # far slower even allowing for a cold start
  times: list[float] = []
  for _ in range(plan.runs):
    times.append(launch())
    if best is not None and times[-1] > plan.give_up * best: break
  return statistics.median(times), len(times)
