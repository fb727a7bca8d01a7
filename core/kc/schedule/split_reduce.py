"""Splitting a large reduce with few outputs into two kernels, so that it runs on every core or compute unit.

A kernel parallelizes over its outputs. A full sum of 16M elements has one output: as one kernel it runs on one core
(CLANG) or in one work-group (OPENCL). Here its reduce axis R is split into (P, R/P): a *partial* kernel reduces each
of the P chunks into a temporary buffer (outputs x P elements, P times the parallelism), and a *combine* kernel
reduces the P partials. The combine kernel is the original AST with its reduce's input replaced by a load of the
partials, so whatever followed the reduce (a mean's division, a cast back to half, other inputs) is computed exactly
as before.

Only ADD, MAX and MUL reduces are split, and only an AST with one reduce and no Variables: the combine of a
reassociated ADD or MUL is exact for ints (they wrap the same in any order) and within rounding for floats, and MAX
is exact. The decision depends on the AST and the device's renderer alone, so compile caches and kernel names stay deterministic."""
from __future__ import annotations
from dataclasses import dataclass
from math import prod
from typing import Optional
from kc.schedule.movement import Move, move, shape_of
from kc.errors import KcError
from kc.helpers import round_up
from kc.ir.dtype import DType, ImageDType, dtypes
from kc.ir.uop import Ops, UOp
from kc.renderer import Renderer
from kc.shape import ShapeTracker

# a reduce is split when each output reduces at least this many elements (below, the second launch costs more than
# the parallelism gains)...
MIN_REDUCE = 1 << 17
# ...or this many on a device without work-groups (its parallel loop hands parts to threads, which costs more to start)
MIN_REDUCE_THREADS = 1 << 20
# ...and the kernel has at most this many outputs: more already keep the cores busy
MAX_OUTPUTS = 64
# the partial kernel aims at about this many outputs in all (outputs x parts): enough for the cores or work-groups
# of a CPU or GPU, few enough that the combine kernel's reduce stays small
TARGET_PARTIALS = 256
# fewer parts than this do not pay for the second launch: pad the reduce axis to TARGET parts instead
MIN_PARTS = 16
# in the buffer lists of SplitReduce: the temporary buffer of partials, not one of the caller's buffers
TEMP = -1

_SPLITTABLE = (Ops.ADD, Ops.MAX, Ops.MUL)


@dataclass(frozen=True)
class KernelPair:
  """The two kernels, launched in this order, that a rule makes of one AST, and the intermediate the first writes and
  the second reads (`temp_dtype`, `temp_size` elements). `first_buffers` and `second_buffers` say, for each buffer
  index of the two ASTs, which buffer index of the original AST it is (TEMP: the intermediate)."""
  first: UOp
  second: UOp
  first_buffers: tuple[int, ...]
  second_buffers: tuple[int, ...]
  temp_dtype: DType
  temp_size: int


@dataclass(frozen=True)
class SplitReduce(KernelPair):
  """A reduce split in `parts`: the partial kernel (first) reduces chunks of it into the partials, the combine
  kernel (second) reduces those."""
  parts: int

  @property
  def partial(self) -> UOp: return self.first
  @property
  def combine(self) -> UOp: return self.second
  @property
  def partial_buffers(self) -> tuple[int, ...]: return self.first_buffers
  @property
  def combine_buffers(self) -> tuple[int, ...]: return self.second_buffers


def min_reduce(renderer: Optional[Renderer]) -> int:
  """The fewest elements per output that `renderer`'s device reduces faster in two kernels than in one."""
  return MIN_REDUCE_THREADS if renderer is not None and not renderer.has_local else MIN_REDUCE


def split_reduce(ast: UOp, renderer: Optional[Renderer] = None, max_outputs: int = MAX_OUTPUTS) -> Optional[SplitReduce]:
  """The partial and combine kernels for `ast` on `renderer`'s device (None: one with work-groups), or None where it
  is better (or only correct) as one kernel: not exactly one ADD/MAX/MUL reduce, Variables, a broadcast of the reduce
  result, fewer than min_reduce(renderer) elements reduced per output, or more than `max_outputs` outputs."""
  red = _the_reduce(ast)
  if red is None: return None
  src = red.src[0]
  full, out = shape_of(src), shape_of(red)
  if full is None or out is None or not all(isinstance(d, int) for d in full): return None
  outputs, reduced = prod(out), prod(full) // max(prod(out), 1)
  if outputs == 0 or outputs > max_outputs or reduced < min_reduce(renderer): return None
  if any(st_shape(s) != out for s in ast.src): return None  # every store writes the reduce's outputs, nothing broadcast
  parts_wanted = max(MIN_PARTS, min(TARGET_PARTIALS, TARGET_PARTIALS // outputs))
  try: partial_src, axis, parts = _split_input(src, full, red.arg, parts_wanted)
  except KcError: return None  # a view the reshape cannot express: one kernel it stays
  return _build(ast, red, partial_src, axis, parts, out)


def st_shape(store: UOp) -> tuple:
  """The kernel shape a STORE writes."""
  return store.src[1].arg.shape


def _the_reduce(ast: UOp) -> Optional[UOp]:
  """The one splittable reduce of `ast`, or None."""
  if ast.op is not Ops.SINK or not ast.src or any(s.op is not Ops.STORE for s in ast.src): return None
  reduces = []
  for u in ast.toposort:
    if u.op is Ops.REDUCE_AXIS: reduces.append(u)
    # Variables make the split's shapes symbolic; a broadcast VIEW feeds the reduce result back to the input's shape
    elif u.op in (Ops.DEFINE_VAR, Ops.BIND, Ops.DEFINE_LOCAL, Ops.WMMA) or (u.op is Ops.VIEW and u.src): return None
    elif u.op is Ops.DEFINE_GLOBAL and isinstance(u.dtype, ImageDType): return None
  if len(reduces) != 1 or reduces[0].arg[0] not in _SPLITTABLE: return None
  return reduces[0]


def identity(op: Ops, dt: DType):
  """The value that leaves a reduce unchanged: what padding elements of the split axis must read."""
  if op is Ops.ADD: return 0
  if op is Ops.MUL: return 1
  if dtypes.is_float(dt): return float("-inf")
  return dtypes.min(dt)


def _choose_split(full: tuple[int, ...], axes: tuple[int, ...], parts_wanted: int) -> tuple[int, int, int]:
  """(axis, parts, padded size): the reduce axis to split and into how many parts. A divisor close to `parts_wanted`
  of some reduce axis needs no padding; else the longest reduce axis is padded to a multiple of `parts_wanted`."""
  by_size = sorted(axes, key=lambda a: (-full[a], a))
  for a in by_size:
    for parts in range(parts_wanted, MIN_PARTS - 1, -1):
      if full[a] % parts == 0 and full[a] // parts >= MIN_PARTS: return a, parts, full[a]
  a = by_size[0]
  return a, parts_wanted, round_up(full[a], parts_wanted)


def _split_input(src: UOp, full: tuple[int, ...], reduce_arg, parts_wanted: int) -> tuple[UOp, int, int]:
  """The reduce's input reshaped so that the split axis becomes (parts, size / parts); padded with the reduce's
  identity where parts does not divide it."""
  op, axes = reduce_arg
  a, parts, padded = _choose_split(full, axes, parts_wanted)
  if padded != full[a]:
    pad = tuple((0, padded - d) if i == a else (0, 0) for i, d in enumerate(full))
    moved = move(src, Move("pad", pad), full)
    if (fill := identity(op, src.dtype)) != 0:  # the pad reads 0 outside: make it the identity
      valid = UOp(Ops.VALID, dtypes.bool, (ShapeTracker.from_shape(full).pad(pad).to_uop(),))
      moved = valid.where(moved, UOp.const(src.dtype, fill))
    src, full = moved, tuple(padded if i == a else d for i, d in enumerate(full))
  split = full[:a] + (parts, full[a] // parts) + full[a + 1:]
  return move(src, Move("reshape", split), full), a, parts


def _build(ast: UOp, red: UOp, partial_src: UOp, axis: int, parts: int, out: tuple[int, ...]) -> SplitReduce:
  op, axes = red.arg
  # partial: the reduce over the inner half of the split axis and the other reduce axes; the parts axis stays
  inner_axes = tuple(sorted(x + 1 if x >= axis else x for x in axes))
  partial_shape = out[:axis] + (parts, 1) + out[axis + 1:]
  temp_size = prod(partial_shape)
  temp = UOp(Ops.DEFINE_GLOBAL, red.dtype.ptr(size=temp_size), (), TEMP)
  partial_red = UOp(Ops.REDUCE_AXIS, red.dtype, (partial_src,), (op, inner_axes))
  partial = UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (temp, ShapeTracker.from_shape(partial_shape).to_uop(), partial_red)),))
  # combine: the original AST, its reduce now over the parts (laid out where the split axis was)
  parts_shape = out[:axis] + (parts,) + out[axis + 1:]
  load = UOp(Ops.LOAD, red.dtype, (temp, ShapeTracker.from_shape(parts_shape).to_uop()))
  combine = ast.substitute({red: UOp(Ops.REDUCE_AXIS, red.dtype, (load,), (op, (axis,)))})
  partial, partial_buffers = renumber(partial)
  combine, combine_buffers = renumber(combine)
  return SplitReduce(partial, combine, partial_buffers, combine_buffers, red.dtype, temp_size, parts)


def renumber(ast: UOp) -> tuple[UOp, tuple[int, ...]]:
  """`ast` with its buffers numbered 0..n-1 (the caller's in their order, then the partials), and for each new
  index the original one (TEMP for the partials)."""
  found = sorted({u.arg for u in ast.toposort if u.op is Ops.DEFINE_GLOBAL}, key=lambda i: (i == TEMP, i))
  new_index = {old: new for new, old in enumerate(found)}
  mapping = {u: u.replace(arg=new_index[u.arg]) for u in ast.toposort if u.op is Ops.DEFINE_GLOBAL}
  return ast.substitute(mapping), tuple(found)
