"""Lowering: an optimized kernel AST to index arithmetic over launch indices and loops.

Every axis of the kernel's full shape gets an index:
  global axes   SPECIAL gidx (work-groups) on renderers with locals, else a RANGE loop
  local axes    SPECIAL lidx (threads of a work-group)
  reduce axes   a RANGE loop per reduce; a reduce that reads another reduce's result (a fused chain) gets loops
                of its own, so the first reduce is finished before the second starts
  upcast axes   unrolled here: each value of each upcast axis is a separate copy of the computation (the
                backend's vector loads come back later, from groups of neighbouring scalar loads), except the
                vector axis (choose_vector_axis): on a dialect that computes on vectors, one upcast axis as wide as
                its widest vector whose values are lowered for all of its lanes at once: real vectors where the
                vector passes would rebuild them from the lanes (aligned accesses, arithmetic on a real vector,
                accumulators), the lanes in a VECTORIZE elsewhere, which the passes take as they take any lanes
Each node of the AST is lowered under an environment (one index UOp per axis); a reduce changes the indices of
its own axes for its source. Views become INDEX(buffer, offset, valid): masked loads read 0, masked stores are
skipped. A reduce becomes DEFINE_ACC + ASSIGN over its loops.

Index arithmetic (loop counters, launch indices, offsets, gates) is in one dtype per kernel, index_dtype(ast): int32,
or int64 where some value of it can leave int32's range."""
from __future__ import annotations
import functools, itertools, operator
from dataclasses import dataclass, field
from typing import Callable, Optional
from kc.ir.dtype import DType, dtypes
from kc.errors import KcError, KernelOptError, ShapeError
from kc.helpers import all_int, prod, vector_registers
from kc.codegen.combine import butterfly, declared_butterfly, identity_element, lanes_combined, pairwise, power_of_two
from kc.codegen.vectorize import VECTOR_FLOATS, accumulator_updates
from kc.codegen.verify import st_arg, verify_ast
from kc.shape.shapetracker import ShapeTracker, axis_ranges
from kc.shape.view import View, fmt_shape, sint_to_uop
from kc.ir.symbolic import root_and_offset, split_sum, sum_bounds
from kc.ir.uop import GroupOp, Ops, UOp, sint

Env = tuple[UOp, ...]


@dataclass(frozen=True)
class KernelInfo:
  """The SINK's arg after optimization: how the lowering maps axes to launch dims, loops and vectors."""
  local_dims: int = 0           # axes that become local (work-group) indices
  upcasted: int = 0             # trailing axes that become vector lanes
  dont_use_locals: bool = False  # global axes are plain global indices, no work-group split


_HOLDER = "lane:"  # the name prefix of lane placeholders


@dataclass(frozen=True)
class ReducePlan:
  """How one reduce is lowered under the indices of its other axes (Lowering.reduce_plan)."""
  loops: list[int]      # its axes that become loops
  unrolled: list[int]   # its upcast axes, unrolled
  ways: int             # the accumulators its one chain interleaves (1: none)
  ranges: list[UOp]     # its loops' RANGEs
  per_lane: bool        # each unrolled lane keeps an accumulator of its own


def _as_uop(x: sint, dtype: DType = dtypes.int32) -> UOp: return sint_to_uop(x, dtype)


@functools.lru_cache(maxsize=4096)
def _index_const(v: int, dtype: DType = dtypes.int32) -> UOp:
  """A constant of index arithmetic (lane numbers, zeros): built once."""
  return UOp.const(dtype, v)


def _loop(dtype: DType, end: sint, arg) -> UOp:
  """RANGE(0, end) with counter `dtype`; a symbolic end (an int32 Variable) is converted to it."""
  return UOp.range(dtype, 0, _as_uop(end, dtype), arg)


# ***** the index dtype *****

INT32_MAX = dtypes.max(dtypes.int32)
INT64_MAX = dtypes.max(dtypes.int64)


def index_dtype(ast: UOp) -> DType:
  """The dtype of a kernel's index arithmetic: int32, unless some value of it can leave int32's range, then int64.

  The values are those of every view the kernel reads, writes or masks with (VIEW args of the optimized AST): its
  dims (the loop and launch bounds), offset, strides and mask bounds, the index sum and its partial sums over the
  view's whole shape (padded positions too: their index is computed before the gate drops it), and, for a tracker of
  several views, the flat index each inner view unravels with its divisors. Variables count with their bounds. A
  cheap interval bound decides nearly every kernel; a view it cannot clear is decided by building its index in int64
  (vmin/vmax of every node) and checking that an int32 build is the same graph (no constant wrapped on the way).
  A view whose index arithmetic can leave int64's range too (by the interval bound) is a ShapeError: no kernel can
  index it."""
  views = dict.fromkeys(u.arg for u in ast.toposort if u.op is Ops.VIEW)
  needs = [view_index_dtype(st) for st in views]  # every view: any one past int64 is refused
  return dtypes.int32 if all(dt == dtypes.int32 for dt in needs) else dtypes.int64


@functools.lru_cache(maxsize=4096)
def view_index_dtype(st: ShapeTracker) -> DType:
  """The index dtype one view needs on its own (index_dtype is the widest over a kernel's views)."""
  if _bounded_in(st, INT32_MAX): return dtypes.int32
  # first: past int64 a build in int64 wraps its constants, and could look as if it fitted int32
  if not _bounded_in(st, INT64_MAX):
    raise ShapeError(f"a view of shape {fmt_shape(st.shape)} has index arithmetic that can pass 2^63 (its dims, strides "
                     f"and offsets: {st}): kc indexes in at most int64, so no kernel can read or write it")
  return dtypes.int32 if _built_in_int32(st) else dtypes.int64


def _span(x: sint) -> tuple[int, int]:
  """(least, greatest) value of an sint."""
  return (x, x) if isinstance(x, int) else (int(x.vmin), int(x.vmax))


def _fit(*values: int, limit: int = INT32_MAX) -> bool: return all(-limit <= v <= limit for v in values)


def _bounded_in(st: ShapeTracker, limit: int) -> bool:
  """Every value of the index arithmetic of `st`, by interval bounds, lies in [-limit, limit] (a conservative answer:
  False may still fit). The views are taken as the lowering indexes them: the tracker simplified, inner views
  minified."""
  views = st.simplify().views
  flat: Optional[tuple[int, int]] = None  # the range of the flat index an inner view unravels
  for view in reversed(views):
    if flat is not None: view = view.minify()
    coords = _coordinate_spans(view, flat, limit)
    if coords is None: return False
    offset = _span(view.offset)
    # every partial sum of the offset and the stride terms lies in [low, high]
    low, high = min(0, offset[0]), max(0, offset[1])
    for (c0, c1), stride in zip(coords, view.strides):
      s0, s1 = _span(stride)
      if not _fit(s0, s1, limit=limit): return False
      ends = (c0 * s0, c0 * s1, c1 * s0, c1 * s1)
      low, high = low + min(0, *ends), high + max(0, *ends)
    for b, e in view.mask or ():
      if not _fit(*_span(b), *_span(e), limit=limit): return False
    if not _fit(low, high, limit=limit): return False
    flat = (low, high)
  return True


def _coordinate_spans(view: View, flat: Optional[tuple[int, int]], limit: int) -> Optional[list[tuple[int, int]]]:
  """The range of each coordinate of `view`: its dims for the outermost view, else the unravelled `flat` range (C's
  % keeps the dividend's sign; the outermost coordinate takes no modulo). None where a dim or divisor leaves
  [-limit, limit]."""
  tops = [_span(d)[1] for d in view.shape]
  if not _fit(*tops, limit=limit): return None
  if flat is None: return [(0, max(0, t - 1)) for t in tops]
  lo, hi = flat
  spans, divisor = [], 1
  for i, top in reversed(list(enumerate(tops))):
    if not _fit(divisor, limit=limit): return None
    if i == 0: spans.append((min(0, lo // divisor if lo >= 0 else -(-lo // divisor)), max(0, hi // divisor)))
    else: spans.append((-(top - 1) if lo < 0 else 0, max(0, top - 1)))
    divisor *= max(top, 1)
  return spans[::-1]


def _built_in_int32(st: ShapeTracker) -> bool:
  """The index and validity of `st` built in int64 have every node in int32's range, and the int32 build is the same
  graph: the int32 arithmetic computes exactly the int64 values."""
  loops = _index_ranges(st.shape, dtypes.int64)  # the kernel runs them whether or not the index reads them
  wide = st.to_indexed_uops(loops)
  nodes = [u for e in (*wide, *loops) for u in e.toposort if u.dtype in dtypes.ints]
  if not all(_fit(int(u.vmin), int(u.vmax)) for u in nodes): return False
  narrow = st.to_indexed_uops(_index_ranges(st.shape, dtypes.int32))
  memo: dict = {}
  return all(_same_graph(n, w, memo) for n, w in zip(narrow, wide))


def _same_graph(narrow: UOp, wide: UOp, memo: dict) -> bool:
  """`narrow` (int32 indices) is `wide` (int64 indices) with int32 for int64: the same ops, args and constants."""
  if wide.op is Ops.CAST and wide.dtype == dtypes.int64 and wide.src[0].dtype == dtypes.int32:
    wide = wide.src[0]  # a Variable, converted to int64
  if (key := (narrow, wide)) in memo: return memo[key]
  same = narrow.op is wide.op and narrow.arg == wide.arg and len(narrow.src) == len(wide.src) and \
    (narrow.dtype == wide.dtype or (narrow.dtype == dtypes.int32 and wide.dtype == dtypes.int64)) and \
    all(_same_graph(n, w, memo) for n, w in zip(narrow.src, wide.src))
  memo[key] = same
  return same


@functools.lru_cache(maxsize=4096)
def _index_ranges(shape: tuple[sint, ...], dtype: DType) -> tuple[UOp, ...]:
  """One RANGE per dim, numbered by axis, with counters of `dtype`: the shape layer's axis_ranges for int32."""
  return axis_ranges(shape) if dtype == dtypes.int32 else tuple(_loop(dtype, s, i) for i, s in enumerate(shape))


def _fits(dims: list, max_sizes: tuple[int, ...]) -> bool:
  return len(dims) <= len(max_sizes) and all(_max_of(d) <= m for d, m in zip(dims, max_sizes))


def _max_of(x) -> int: return x if isinstance(x, int) else int(x.vmax)


def get_grouped_dims(prefix: str, dims: tuple[sint, ...], max_sizes: Optional[tuple[int, ...]], reverse: bool = False,
                     dtype: DType = dtypes.int32) -> tuple[list[UOp], list[sint], Optional[UOp]]:
  """Map a kernel's global (or local) dims onto launch axes x, y, z of at most `max_sizes`.

  A dim too large for its axis is split across it and the next axis, by a factor where one fits and else by the
  axis limit and a rounded-up rest (the extra launch indices fall outside the dim: the returned guard is false
  there and must gate every access); dims beyond the number of axes are collapsed onto the left-most axis with
  room. Globals are reversed (the fastest-moving dim goes to x). Returns one index UOp per dim (in the dims'
  order, in the index `dtype`), the launch sizes (x, y, z order, padded with 1s), and the guard (None when every
  index is in range)."""
  order = list(range(len(dims)))[::-1] if reverse else list(range(len(dims)))
  if max_sizes is None: max_sizes = (2**31 - 1,) * max(len(dims), 1)
  guards: list[tuple[int, int]] = []  # (dim, its size): dims launched with more indices than they have
  # each launch axis holds parts of dims: (dim index, part size, the part's stride within its dim)
  axes: list[list[tuple[int, sint, int]]] = [[(d, dims[d], 1)] for d in order]
  i = 0
  while i < min(len(axes), len(max_sizes)):
    if len(axes[i]) == 1 and _max_of(size := axes[i][0][1]) > max_sizes[i]:
      d, _, stride = axes[i][0]
      if not isinstance(size, int): raise KernelOptError(f"{prefix}: the symbolic dim {size.render()} may exceed the launch limit {max_sizes[i]}")
      if i + 1 >= len(max_sizes):
        raise KernelOptError(f"{prefix}: dims {fmt_shape(dims)} do not fit the launch limits {fmt_shape(max_sizes)}: "
                             f"{size} has no axis left to spill into")
      # the largest factor that fits stays on this axis and the rest moves on to the next one (it may split again);
      # with no factor that fits, the axis takes its limit and the next one the rounded-up rest
      low = next((f for f in range(max_sizes[i], 1, -1) if size % f == 0), None) or max_sizes[i]
      if size % low: guards.append((d, dims[d]))
      axes[i:i + 1] = [[(d, low, stride)], [(d, -(-size // low), stride * low)]]
    i += 1
  i = 0
  while len(axes) > len(max_sizes):
    if prod(_max_of(p[1]) for p in axes[i] + axes[i + 1]) <= max_sizes[i]: axes[i:i + 2] = [axes[i] + axes[i + 1]]
    elif i + 2 < len(axes) and i + 1 < len(max_sizes): i += 1
    else: raise KernelOptError(f"{prefix}: dims {fmt_shape(dims)} do not fit in {len(max_sizes)} launch axes of at most {fmt_shape(max_sizes)}")
  sizes: list[sint] = [_sym_prod([p[1] for p in parts]) for parts in axes]
  for s, m in zip(sizes, max_sizes):
    if _max_of(s) > m: raise KernelOptError(f"{prefix}: dims {fmt_shape(dims)} do not fit the launch limits {fmt_shape(max_sizes)}")
  idxs: list[UOp] = [_index_const(0, dtype)] * len(dims)
  whole = [d for d in range(len(dims)) if sum(p[0] == d for parts in axes for p in parts) == 1]  # dims on one axis alone
  for a, parts in enumerate(axes):
    rest = UOp(Ops.SPECIAL, dtype, (), (f"{prefix}{a}", sizes[a]))
    # a dim alone on its axis is the axis's index, as simplify gives it (one of size 1 simplifies to 0)
    if len(parts) == 1 and parts[0][0] in whole and parts[0][2] == 1 and _max_of(sizes[a]) > 1:
      idxs[parts[0][0]] = rest
      continue
    for n, (d, size, stride) in enumerate(parts):
      last = n == len(parts) - 1
      idxs[d] = idxs[d] + (rest if last else rest % _as_uop(size, dtype)) * stride
      if not last: rest = rest // _as_uop(size, dtype)
  idxs = [x if x.op is Ops.SPECIAL else x.simplify() for x in idxs]
  guard = functools.reduce(lambda a, b: a & b, [idxs[d] < n for d, n in guards]).simplify() if guards else None
  return idxs, sizes + [1] * (len(max_sizes) - len(sizes)), guard


def _sym_prod(xs: list) -> sint:
  if all_int(xs): return prod(xs)
  ret = functools.reduce(lambda a, b: _as_uop(a) * _as_uop(b), xs).simplify()
  return ret.arg if ret.op is Ops.CONST else ret


def _shifted(idx: UOp, shift: int) -> UOp:
  """idx + shift for a simplified index, in the canonical form simplify would give (the constant last, folded)."""
  if shift == 0: return idx
  if idx.op is Ops.CONST: return _index_const(idx.arg + shift, idx.dtype)
  if idx.op is Ops.ADD and idx.src[1].op is Ops.CONST:
    c = idx.src[1].arg + shift
    return idx.src[0] if c == 0 else UOp(Ops.ADD, idx.dtype, (idx.src[0], _index_const(c, idx.dtype)))
  return UOp(Ops.ADD, idx.dtype, (idx, _index_const(shift, idx.dtype)))


def _conjunction(a: UOp, b: UOp) -> UOp:
  """a & b simplified; a constant side decides it at once (as the simplifier would)."""
  if a.op is Ops.CONST: return b if a.arg else a
  if b.op is Ops.CONST: return a if b.arg else b
  return a if a is b else (a & b).simplify()


@dataclass
class Lowering:
  ast: UOp
  has_local: bool
  global_max: Optional[tuple[int, ...]]
  local_max: Optional[tuple[int, ...]]
  full_shape: tuple[sint, ...] = ()
  first_reduce: int = 0
  first_upcast: int = 0
  group_for_reduces: int = 0
  base: Env = ()          # the index of each axis outside every reduce (upcast axes hold 0 here)
  late: dict = field(default_factory=dict)  # grouped axis -> the loop over the group's partial results
  depth: dict = field(default_factory=dict)  # REDUCE_AXIS -> how many reduces its value depends on
  loop_kinds: dict = field(default_factory=dict)  # (depth, axes, the indices around) -> the kind of those loops
  memo: dict = field(default_factory=dict)
  ignores: dict = field(default_factory=dict)  # AST node -> the upcast axes its value does not vary along
  acc_ids: dict = field(default_factory=dict)  # (op, partial value, loops) -> accumulator number
  launch_guard: Optional[UOp] = None  # false on launch indices beyond the kernel's dims (see get_grouped_dims)
  idt: DType = dtypes.int32  # the dtype of index arithmetic (index_dtype)
  # the widths of the vectors a dialect computes on (Renderer.vector_widths where vector_alu), else none
  vector_widths: Callable[[DType], tuple[int, ...]] = lambda dt: ()  # noqa: E731
  # the upcast axis lowered as whole vectors (choose_vector_axis), its width, and the marker its index holds in an
  # environment where a value is computed for all of its lanes at once
  vector_functions: frozenset = frozenset()  # Renderer.vector_functions where vector_alu
  vector_axis: Optional[int] = None
  vector_width: int = 0
  vector_marker: Optional[UOp] = None
  loaded_lanes: set = field(default_factory=set)  # the VECTORIZEs of a load's distinct lanes (load_lanes)

  def __post_init__(self):
    info = self.ast.arg if isinstance(self.ast.arg, KernelInfo) else KernelInfo()
    sts = verify_ast(self.ast, optimized=True)
    self.full_shape = tuple(next((d for d in dims if not (isinstance(d, int) and d == 1)), 1) for dims in zip(*[st.shape for st in sts.values()]))
    n = len(self.full_shape)
    self.first_upcast = n - info.upcasted
    out_shape = st_arg(self.ast.src[0]).shape
    reduce_ops = [u for u in self.ast.toposort if u.op in (Ops.REDUCE_AXIS, Ops.WMMA)]
    # the first axis the output does not keep (as the Kernel counts it)
    self.first_reduce = next((i for i in range(self.first_upcast) if out_shape[i] != self.full_shape[i]), self.first_upcast)
    local_loads = [u for u in self.ast.toposort if u.op is Ops.LOAD and u.src[0].op is Ops.DEFINE_LOCAL]
    # a grouped axis is a reduce axis that some local buffer keeps (each thread of the group wrote its part)
    self.group_for_reduces = sum(any(st_arg(l).shape[i] != out_shape[i] for l in local_loads)
                                 for i in range(self.first_reduce, self.first_upcast)) if local_loads else 0
    global_dims = self.first_reduce - info.local_dims
    shape = self.full_shape
    if self.has_local:
      if info.dont_use_locals:
        gidx, _, gguard = get_grouped_dims("idx", shape[:global_dims], self.global_max, reverse=True, dtype=self.idt)
        lidx, lguard = [], None
      else:
        gidx, _, gguard = get_grouped_dims("gidx", shape[:global_dims], self.global_max, reverse=True, dtype=self.idt)
        local_dims = shape[global_dims:self.first_reduce + self.group_for_reduces]
        lidx, _, lguard = get_grouped_dims("lidx", local_dims, self.local_max, dtype=self.idt)
      idxs = gidx + lidx
      # a dim launched with extra indices: every access is gated so the extra threads touch nothing
      guards = [g for g in (gguard, lguard) if g is not None]
      self.launch_guard = functools.reduce(operator.and_, guards) if guards else None
    else:
      idxs = [_loop(self.idt, s, (i, 0)) for i, s in enumerate(shape[:self.first_reduce])]
    # reduce axes get their loops from the reduce that walks them; upcast axes are unrolled
    self.zero = _index_const(0, self.idt)  # lane 0 of an upcast axis (lower() compares environments against it)
    idxs += [self.zero] * (n - len(idxs))
    for i in range(self.first_upcast, n):
      if not isinstance(shape[i], int): raise KcError(f"axis {i} of size {shape[i].render()} is symbolic and cannot be upcast")
    self.base = tuple(idxs)
    for a in range(self.first_reduce, self.first_reduce + self.group_for_reduces):
      self.late[a] = _loop(self.idt, shape[a], (a, 1000))
    for r in reduce_ops:
      self.depth[r] = sum(1 for u in r.toposort if u is not r and u.op is Ops.REDUCE_AXIS)

  # ***** environments *****

  def upcast_axes(self, axes) -> list[int]: return [a for a in axes if a >= self.first_upcast]

  def combos(self, axes: list[int]):
    """Every assignment of values to the given upcast axes, the last axis fastest."""
    for values in itertools.product(*[range(self.full_shape[a]) for a in axes]):
      yield dict(zip(axes, values))

  def store_lanes(self, env: Env, stores) -> list[Env]:
    """The environments of every lane of the given stores: one per value of the upcast axes they write along. An
    unrolled reduce axis (size 1 in the stored view) stays at 0: the stored value reduces over it, so its other
    values would lower the same stores again."""
    upcast = range(self.first_upcast, len(self.full_shape))
    axes = [a for a in upcast if any(st_arg(s).shape[a] != 1 for s in stores)]
    home = self.with_axes(env, {a: 0 for a in upcast if a not in axes})
    if self.vector_axis in axes:  # all of its lanes at once
      axes.remove(self.vector_axis)
      home = self.with_axes(home, {self.vector_axis: self.vector_marker})
    return [self.with_axes(home, c) for c in self.combos(axes)]

  def with_axes(self, env: Env, values: dict) -> Env:
    if not values: return env
    out = list(env)
    for i, v in values.items(): out[i] = v if type(v) is UOp else _index_const(v, self.idt)
    return tuple(out)

  # ***** the lowering *****

  def lower(self, u: UOp, env: Env) -> UOp:
    key = (u, env := self.lowered_env(u, env))
    if (ret := self.memo.get(key)) is None:
      ret = self.memo[key] = self._lower(u, env)
    return ret

  def lowered_env(self, u: UOp, env: Env) -> Env:
    """env as `u` is lowered at: a value is the same for every lane of an upcast axis it does not vary along (a load
    whose view does not walk it, a row's max read by every lane of the row), so the axis is at lane 0: one key for
    all of its lanes, and `u` is lowered once, not per lane."""
    if (ignored := self.ignores.get(u)) is None: ignored = self.ignores[u] = self.ignored_axes(u)
    # (an upcast axis's index is a constant from _index_const: lane 0 is one object)
    if ignored and any(env[a] is not self.zero for a in ignored): env = self.with_axes(env, dict.fromkeys(ignored, self.zero))
    return env

  def ignored_axes(self, u: UOp) -> tuple[int, ...]:
    """The upcast axes `u`'s lowering does not read from its environment: its value is the same at every lane of
    them. A view's accesses vary along the axes it walks or masks; a reduce's value does not vary along the axes it
    reduces, nor a CONTRACT's along those it gathers into a vector, nor a WMMA's along its own; an EXPAND picks a
    lane by its axes."""
    upcast = range(self.first_upcast, len(self.full_shape))
    return tuple(a for a in upcast if a not in self.varies_along(u))

  def varies_along(self, u: UOp) -> frozenset[int]:
    """The upcast axes the value of AST node `u` can vary along (see ignored_axes), once per node."""
    if (ret := self.memo.get(("varies", u))) is not None: return ret
    if u.op in (Ops.LOAD, Ops.STORE, Ops.VALID, Ops.POSITION):
      ret = frozenset(range(self.first_upcast, len(self.full_shape))) - set(self.view_ignores(st_arg(u)))
      if u.op is Ops.STORE: ret |= self.varies_along(u.src[2])
    else:
      ret = frozenset().union(*(self.varies_along(s) for s in u.src))
      if u.op is Ops.REDUCE_AXIS: ret -= set(u.arg[1])
      elif u.op is Ops.CONTRACT: ret -= {a for a, _ in u.arg}
      elif u.op is Ops.EXPAND: ret |= {a for a, _ in u.arg}
      elif u.op is Ops.WMMA: ret -= self.wmma_axes(u)
    self.memo[("varies", u)] = ret
    return ret

  def _lower(self, u: UOp, env: Env) -> UOp:
    # a value for every lane of the vector axis at once (lower() zeroed the axis for values that do not vary along it)
    if self.vector_marker is not None and env[self.vector_axis] is self.vector_marker:
      return self.lower_vector(u, env)
    # arithmetic first: most of a kernel's nodes, lowered per lane
    if u.op in _ELEMENTWISE: return UOp(u.op, u.dtype, tuple([self.lower(s, env) for s in u.src]), u.arg)
    if u.op is Ops.SINK:
      if len(u.src) == 1 and (tiled := self.tile_stores(u.src[0], env)) is not None: return UOp(Ops.SINK, dtypes.void, tuple(tiled))
      stores = []
      for e in self.store_lanes(env, u.src):
        for s in u.src: stores += self.lower_stores(s, e)
      return UOp(Ops.SINK, dtypes.void, tuple(dict.fromkeys(stores)))
    if u.op in (Ops.CONST, Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL, Ops.DEFINE_VAR): return u
    if u.op is Ops.BIND: return u.src[0]
    if u.op is Ops.VALID: return self.indexed(st_arg(u), env)[1]
    if u.op is Ops.POSITION:  # the offset, in the AST's int type
      idx = self.indexed(st_arg(u), env)[0]
      return idx if idx.dtype == u.dtype else idx.cast(u.dtype)
    if u.op is Ops.LOAD: return self.lower_load(u, env)
    if u.op is Ops.STORE: return self.lower_store(u, env)
    if u.op is Ops.VIEW: return self.lower(u.src[0], env)  # a broadcast: the value is the same along the expanded axes
    if u.op is Ops.REDUCE_AXIS: return self.lower_reduce(u, env)
    if u.op is Ops.CONTRACT:
      lanes = [self.lower(u.src[0], self.with_axes(env, c)) for c in self.combos([a for a, _ in u.arg])]
      return UOp(Ops.VECTORIZE, u.dtype, tuple(lanes))
    if u.op is Ops.EXPAND:
      axes = [a for a, _ in u.arg]
      lane = _lane_of(env, u.arg)
      return UOp(Ops.GEP, u.dtype, (self.lower(u.src[0], self.with_axes(env, {a: 0 for a in axes})),), (lane,))
    if u.op is Ops.WMMA:
      zeroed = {a: 0 for a in self.wmma_axes(u)}
      e = self.with_axes(env, zeroed)
      return u.replace(src=tuple(self.lower(s, e) for s in u.src))
    raise KcError(f"cannot lower {u.op} in a kernel AST")

  @staticmethod
  def wmma_axes(wmma: UOp) -> set[int]:
    return {a for ax in wmma.arg.upcast_axes for a, _ in ax} | set(wmma.arg.reduce_axes)

  def indexed(self, st: ShapeTracker, env: Env) -> tuple[UOp, UOp]:
    """(offset, valid) of a view at env. Unrolled lanes share one expression: where the view walks the lane axes
    with a fixed stride (wherever it is valid) a lane's offset is lane 0's plus a constant, and its validity
    depends only on the lane axes the view masks."""
    lanes = {a: env[a].arg for a in range(self.first_upcast, len(env)) if env[a].op is Ops.CONST and env[a].arg != 0}
    if not lanes: return self.index_at(st, env)
    strides, masked = self.view_facts(st)
    zeroed = self.with_axes(env, {a: 0 for a in lanes})
    if all(isinstance(strides[a], int) for a in lanes):
      idx, valid = self.index_at(st, zeroed)
      shift = sum(strides[a] * v for a, v in lanes.items())
      if not any(a in masked for a in lanes): return _shifted(idx, shift), valid
      # the validity over a placeholder for each masked lane axis, built once per view and env; each lane's values are
      # put in afterwards
      holders = {a: self.holder(a) for a in masked}
      _, sym_valid = self.index_at(st, self.with_axes(zeroed, holders))
      return _shifted(idx, shift), self.at(sym_valid, {a: lanes.get(a, 0) for a in holders})
    holders = {a: self.holder(a) for a in lanes}
    sym_idx, sym_valid = self.index_at(st, self.with_axes(zeroed, holders))
    return self.at(sym_idx, lanes), self.at(sym_valid, {a: (v if a in masked else 0) for a, v in lanes.items()})

  def holder(self, axis: int) -> UOp:
    """The placeholder of an upcast axis's lane number in expressions shared by every lane. Its name is no C
    identifier, so no Variable of a kernel (which is rendered as one) can be mistaken for it."""
    if (ret := self.memo.get(key := ("holder", axis))) is None:
      ret = self.memo[key] = UOp.variable(f"{_HOLDER}{axis}", 0, self.full_shape[axis] - 1, self.idt)
    return ret

  def holder_axis(self, u: UOp) -> Optional[int]:
    """The upcast axis whose placeholder `u` is, else None."""
    if u.op is not Ops.DEFINE_VAR or not u.arg[0].startswith(_HOLDER): return None
    return axis if u is self.holder(axis := int(u.arg[0][len(_HOLDER):])) else None

  def lanes_in(self, expr: UOp) -> tuple[int, ...]:
    """The upcast axes whose placeholders `expr` uses."""
    if (ret := self.memo.get(("lanes", expr))) is None:
      if (axis := self.holder_axis(expr)) is not None: ret = (axis,)
      else: ret = tuple(sorted(set().union(*(self.lanes_in(s) for s in expr.src))))
      self.memo[("lanes", expr)] = ret
    return ret

  def at(self, expr: UOp, values: dict[int, int]) -> UOp:
    """`expr` with its lane placeholders set to `values` (axis -> lane), simplified. Remembered per the lanes `expr`
    uses, and a conjunction clause by clause: a clause depends on fewer lanes than the whole, so most lane
    combinations share it."""
    used = self.lanes_in(expr)
    key = ("at", expr, tuple([values.get(a, 0) for a in used]))
    if (ret := self.memo.get(key)) is None:
      if not used: ret = expr
      elif expr.op is Ops.AND and expr.dtype == dtypes.bool: ret = _conjunction(self.at(expr.src[0], values), self.at(expr.src[1], values))
      elif (known := self.decided(expr, values)) is not None: ret = UOp.const(dtypes.bool, known)
      else: ret = expr.substitute({self.holder(a): _index_const(values.get(a, 0), self.idt) for a in used}).simplify()
      self.memo[key] = ret
    return ret

  def decided(self, clause: UOp, values: dict[int, int]) -> Optional[bool]:
    """The value of a bound check `sum < c` (or its negation) at these lanes where the ranges of its terms decide it
    for every value of the other variables, else None. Most lane checks of a padded view are decided: this answers
    them without building and simplifying the check at each lane. A term that holds a placeholder inside a division
    counts with the placeholder's whole range, so a decision is always sound."""
    if clause.op is Ops.CMPNE and clause.src[1].op is Ops.CONST and clause.src[1].arg is True:
      inner = self.decided(clause.src[0], values)
      return None if inner is None else not inner
    if clause.op is not Ops.CMPLT or clause.src[1].op is not Ops.CONST or clause.src[0].dtype not in dtypes.ints: return None
    terms, const = split_sum(clause.src[0])
    # the placeholders of this lane are numbers: they move the constant; every other term counts with its range
    lanes = {t: k * values.get(axis, 0) for t, k in terms.items() if (axis := self.holder_axis(t)) is not None}
    lo, hi = sum_bounds({t: k for t, k in terms.items() if t not in lanes}, const + sum(lanes.values()))
    bound = clause.src[1].arg
    return True if hi < bound else False if lo >= bound else None

  def index_at(self, st: ShapeTracker, env: Env) -> tuple[UOp, UOp]:
    """(offset, valid) of a view at env. One view is a sum of strides and a few bounds: built at env directly. Several
    views unravel through divisions: their index over one RANGE per axis is built and simplified once (the Kernel's
    stride analysis already made it) and env's values are put in for the RANGEs afterwards, since re-simplifying an
    expression that is already canonical is far cheaper than unravelling the views again for every env."""
    key = ("at", st, env)
    if (ret := self.memo.get(key)) is None:
      if len(st.views) == 1: ret = st.to_indexed_uops(env)
      else:
        axes = _index_ranges(st.shape, self.idt)
        idx, valid = st.to_indexed_uops(axes)
        sub = {a: v for a, v in zip(axes, env) if a is not v}
        ret = (idx.substitute(sub).simplify(), valid.substitute(sub).simplify())
      self.memo[key] = ret
    return ret

  def view_ignores(self, st: ShapeTracker) -> tuple[int, ...]:
    """The upcast axes a view neither walks (stride 0) nor masks."""
    if (ret := self.memo.get(("ignores", st))) is None:
      strides, masked = self.view_facts(st)
      ret = self.memo[("ignores", st)] = tuple(a for a in range(self.first_upcast, len(self.full_shape)) if strides[a] == 0 and a not in masked)
    return ret

  def view_facts(self, st: ShapeTracker) -> tuple[tuple, set[int]]:
    """The strides a view walks its axes with (where valid) and the axes its mask depends on, once per view."""
    if (facts := self.memo.get(("facts", st))) is None:
      masked = {a for a in range(self.first_upcast, len(self.full_shape)) if st.axis_is_masked(a)}
      facts = self.memo[("facts", st)] = (st.real_strides(ignore_valid=True), masked)
    return facts

  def lower_load(self, u: UOp, env: Env) -> UOp:
    buf = u.src[0]
    idx, valid = self.indexed(st_arg(u), env)
    barrier: tuple = ()
    if buf.op is Ops.DEFINE_LOCAL and len(u.src) > 2:
      # the stores into local memory happen in every thread (and every upcast lane) before any thread reads
      home = self.with_axes(env, {a: self.base[a] for a in self.late})
      stores = tuple(dict.fromkeys(self.lower(u.src[2], e) for e in self.store_lanes(home, [u.src[2]])))
      barrier = (UOp(Ops.BARRIER, dtypes.void, stores),)
    return UOp(Ops.LOAD, u.dtype, (_index(buf, idx, self.guarded(valid)),) + barrier)

  def lower_store(self, u: UOp, env: Env) -> UOp:
    buf = u.src[0]
    idx, valid = self.indexed(st_arg(u), env)
    if buf.op is Ops.DEFINE_GLOBAL:
      # after a grouped reduce every thread of the group holds the result: only the first one writes it
      for a in self.late: valid = valid & self.base[a].eq(0)
    return UOp(Ops.STORE, dtypes.void, (_index(buf, idx, self.guarded(valid).simplify()), self.lower(u.src[2], env)))

  def guarded(self, valid: UOp) -> UOp:
    return valid if self.launch_guard is None else (valid & self.launch_guard)

  def lower_reduce(self, u: UOp, env: Env) -> UOp:
    op, axes = u.arg
    src = u.src[0]
    # an empty reduce is its identity; its input must not be lowered (a load hoisted out of a loop that never runs
    # would still read the empty buffer)
    if any(isinstance(self.full_shape[a], int) and self.full_shape[a] == 0 for a in axes): return UOp.const(u.dtype, identity_element(op, u.dtype))
    plan = self.plan_of(u, env)
    unrolled, ranges = plan.unrolled, plan.ranges
    inner = self.with_axes(env, dict(zip(plan.loops, ranges)))
    if self.lanes_reduced(u, plan): return lanes_combined(op, self.lane_accumulators(u, inner, plan), self.vector_widths)
    if src.op is Ops.EXPAND and src.src[0].op is Ops.WMMA and op is Ops.ADD and ranges:
      return self.lower_wmma_reduce(u, src, [self.with_axes(inner, c) for c in self.combos(unrolled)], env, ranges)
    if plan.ways > 1:
      parts = [self.lower(src, self.with_axes(step, c)) for step in self.steps(inner, plan) for c in self.combos(unrolled)]
      return pairwise(op, [self.accumulate(op, u.dtype, part, ranges) for part in parts])
    parts = [self.lower(src, self.with_axes(inner, c)) for c in self.combos(unrolled)]
    if not ranges: return pairwise(op, parts)
    if plan.per_lane: return pairwise(op, [self.accumulate(op, u.dtype, part, ranges) for part in parts])
    return self.accumulate(op, u.dtype, pairwise(op, parts), ranges)

  def plan_of(self, u: UOp, env: Env) -> ReducePlan:
    """The plan of reduce `u` at env: one per the indices of its other axes that are not lanes (its loops and launch
    indices; the vector axis's marker is a lane number too, every lane of the axis at once)."""
    around = tuple((i, e) for i, e in enumerate(env) if i not in u.arg[1] and e.op is not Ops.CONST and e is not self.vector_marker)
    if (plan := self.memo.get(key := ("reduce", u, around))) is None: plan = self.memo[key] = self.reduce_plan(u, around)
    return plan

  def steps(self, inner: Env, plan: ReducePlan) -> list[Env]:
    """The environments of a reduce's steps per loop iteration: the last loop's index i*ways + w for each way w of an
    interleaved reduce, else the loop's index itself."""
    if plan.ways == 1: return [inner]
    last, ways = plan.loops[-1], plan.ways
    return [self.with_axes(inner, {last: plan.ranges[-1] * ways + w}) for w in range(ways)]

  def reduce_plan(self, u: UOp, around: tuple) -> ReducePlan:
    """How a reduce is lowered under the indices `around` of its other (not unrolled) axes, the same for each of
    their lanes."""
    op, axes = u.arg
    loops = [a for a in axes if a < self.first_upcast]
    unrolled = self.upcast_axes(axes)
    # a reduce's loops are its own: reduces share them only when they walk the same axes at the same depth of a chain
    # under the same indices of the other axes (the lanes of an upcast axis do). A loop shared with a reduce in
    # another place (x.sum((0,1)) + x.sum(1), or one reduce used inside two others) would tie their nestings together.
    # (the first such set of loops at each depth has kind depth + 1, later ones kinds of their own above 1000)
    if (kind := self.loop_kinds.get(key := (self.depth[u], axes, around))) is None and loops:
      same_depth = sum(1 for k in self.loop_kinds if k[0] == self.depth[u])
      kind = self.loop_kinds[key] = self.depth[u] + 1 + 1001 * same_depth
    out_lanes = prod(self.full_shape[a] for a in range(self.first_upcast, len(self.full_shape)) if a not in axes)
    # one accumulator chain in all (one output lane, its lanes one vector or none): the loop runs `ways` steps per
    # iteration into as many accumulators, so it is bound by throughput, not by the latency of one op per step
    one_chain = out_lanes < 4 and (not unrolled or self.lanes_load_as_vectors(u, unrolled, out_lanes)) and u.src[0].op is not Ops.EXPAND
    ways = self.interleave(loops) if one_chain else 1
    ranges = [self.late[a] if a in self.late else _loop(self.idt, self.full_shape[a] // (ways if i == len(loops) - 1 else 1), (a, kind))
              for i, a in enumerate(loops)]
    # few output lanes: an accumulator per unrolled lane too, so the loop is not bound by the latency of one add
    # chain; they are combined once, after the loop. Many output lanes are independent chains already, and more
    # accumulators would only spill registers.
    per_lane = bool(ranges) and (out_lanes < 4 or self.lanes_load_as_vectors(u, unrolled, out_lanes))
    return ReducePlan(loops, unrolled, ways, ranges, per_lane)

  def interleave(self, loops: list[int]) -> int:
    """How many accumulators a reduce of one chain keeps: 4 (or 2) where its innermost loop divides into at least
    two iterations of that many steps, and the loop is an ordinary one (not a work-group's, not symbolic). On a host
    CPU only: a GPU hides an op's latency behind other threads, and more accumulators would cost it registers.
    (A 256x1024 row max on one AVX-512 core: 54 us of a log-softmax's 150 with one vector accumulator, 14 with 4.)"""
    if self.has_local or not loops or loops[-1] in self.late or not isinstance(n := self.full_shape[loops[-1]], int): return 1
    return next((w for w in (4, 2) if n % w == 0 and n >= 2 * w), 1)

  def lanes_load_as_vectors(self, u: UOp, unrolled: list[int], out_lanes: int) -> bool:
    """Whether a reduce's unrolled lanes are vectors the dialect computes on, along which every input it loads is
    contiguous or constant (a matmul's K where both operands are K-contiguous, a row sum): an accumulator per lane
    then becomes one vector accumulator per vector of lanes (kc.codegen.vectorize), updated by whole-vector loads.

    Exactly one vector of lanes, unmasked, qualifies whatever the number of output lanes (the heuristics sized the
    tile). Several vectors of lanes, or inputs masked along them (a convolution's padded window: its shifted rows are
    one permute of two loaded vectors each), qualify where one vector accumulator per output lane and vector of lanes
    fits three quarters of the vector registers: a weight gradient's 3x3 window of 32-lane rows on AVX-512 keeps 18
    (conv_net's first weight gradient: 1.4 ms with a horizontal sum per step, 0.08 ms so)."""
    if len(unrolled) != 1: return False
    n, widths = self.full_shape[a := unrolled[0]], self.vector_widths(u.dtype)
    if not isinstance(n, int) or not (fits := [w for w in widths if n % w == 0]): return False
    loads = [x for x in u.src[0].toposort if x.op is Ops.LOAD]
    facts = [self.view_facts(st_arg(x)) for x in loads]
    if not any(strides[a] == 1 for strides, _ in facts) or not all(strides[a] in (0, 1) for strides, _ in facts): return False
    if n in widths and not any(a in masked for _, masked in facts): return True
    width = max(fits)
    return out_lanes * (n // width) <= vector_registers(width * u.dtype.itemsize) * 3 // 4

  # ***** the vector axis: every lane of it at once *****

  def choose_vector_axis(self) -> None:
    """On a dialect that computes on vectors, the upcast axis that the kernel's first store walks contiguously (stride
    1, unmasked) with as many lanes as the widest vector of the stored dtype, else the one unrolled axis of a reduce
    with as many lanes as its dtype's widest vector: its values are lowered for all of its lanes at once instead of
    lane by lane and regrouped afterwards (graph.fold_vector_accesses, vectorize.vectorize_alu), which costs every
    pass a node per lane. The lowering builds the vectors those passes would build from the lanes and leaves them
    the lanes elsewhere (lower_vector), so the kernel is the lane-by-lane one: for every conformance and benchmark
    kernel (benchmarks/source_hashes.py). One difference is kept: where the lanes' accumulators of two reduces that
    are added up afterwards look to vectorize_alu like the lanes of one combine (a float2 accumulator per output
    lane), each reduce keeps its own vector accumulator here. A store along the axis that is not one vector raises
    ScalarLanes: the kernel is lowered lane by lane. (Not on dialects with work-groups: their local memory's stores
    are lowered lane by lane.)"""
    if self.has_local: return
    store = self.ast.src[0]
    if store.op is Ops.STORE and (dt := store.src[2].dtype) in VECTOR_FLOATS and (widths := self.vector_widths(dt)):
      strides, masked = self.view_facts(st_arg(store))
      for a in range(self.first_upcast, len(self.full_shape)):
        if strides[a] == 1 and a not in masked and self.full_shape[a] == widths[0]: return self.set_vector_axis(a, widths[0])
    # else a reduce's own unrolled axis, its lanes loaded as vectors (lanes_load_as_vectors: a row's sum)
    for r in self.ast.toposort:
      if r.op is Ops.REDUCE_AXIS and r.dtype in VECTOR_FLOATS and len(unrolled := self.upcast_axes(r.arg[1])) == 1 and \
         (widths := self.vector_widths(r.dtype)) and self.full_shape[unrolled[0]] == widths[0]:
        return self.set_vector_axis(unrolled[0], widths[0])

  def set_vector_axis(self, axis: int, width: int) -> None:
    self.vector_axis, self.vector_width = axis, width
    self.vector_marker = UOp.variable(f"{_VECTOR}{axis}", 0, width - 1, self.idt)

  def lower_vector(self, u: UOp, env: Env) -> UOp:
    """`u`'s value at every lane of the vector axis: a vector whose lanes are the lanes' values in order. A real
    vector (a load, arithmetic, an accumulator) where vectorize_alu would build one from the lanes: an access of one
    aligned vector, arithmetic with a real vector among its sources; else the lanes themselves, lowered one by one,
    in a VECTORIZE (vectorize_alu decides on them as it does on a kernel lowered lane by lane)."""
    n = self.vector_width
    if u.op is Ops.VIEW: return self.lower(u.src[0], env)
    if u.op in _ELEMENTWISE and self.vector_op(u.op, u.dtype) and all(s.dtype == u.dtype for s in u.src):
      if (vector := self.vector_alu(u.op, [self.lower(s, env) for s in u.src])) is not None: return vector
    elif u.op is Ops.LOAD and len(u.src) == 2:
      if (index := self.vector_index(u, u.dtype, env)) is not None: return UOp(Ops.LOAD, u.dtype.vec(n), (index,))
      return self.load_lanes(u, env)
    elif u.op is Ops.REDUCE_AXIS and (acc := self.lower_vector_reduce(u, env)) is not None: return acc
    return self.lanes(u, env)

  def lanes(self, u: UOp, env: Env) -> UOp:
    """`u` lowered at each lane of the vector axis, the lanes in a VECTORIZE."""
    if u.dtype.count != 1 or u.dtype == dtypes.void: raise ScalarLanes(f"{u.op} of {u.dtype} along the vector axis")
    return UOp(Ops.VECTORIZE, u.dtype.vec(self.vector_width), tuple(self.lower(u, self.with_axes(env, {self.vector_axis: i}))
                                                                    for i in range(self.vector_width)))

  def load_lanes(self, u: UOp, env: Env) -> UOp:
    """The lanes of a load that is not one aligned vector. Lanes at distinct offsets (stride 1 along the axis: a
    convolution's row shifted by its window) that may all load stay distinct loads through the rewrite: vectorize_alu
    takes them as one gathered source of a vector op (loaded_lanes). (A lane that never loads is a constant 0 after
    the rewrite, which puts it after the other operand of its op: its lanes' sources no longer line up.)"""
    lanes = self.lanes(u, env)
    if self.view_facts(st_arg(u))[0][self.vector_axis] == 1 and not any(_never_loads(x) for x in lanes.src): self.loaded_lanes.add(lanes)
    return lanes

  def vector_dtype(self, dt: DType) -> bool:
    """Whether `dt`'s widest vector is the vector axis's lanes (the width the vector passes fold it to)."""
    if (ret := self.memo.get(key := ("vector dtype", dt))) is None:
      ret = self.memo[key] = dt in VECTOR_FLOATS and self.vector_widths(dt)[:1] == (self.vector_width,)
    return ret

  def vector_op(self, op: Ops, dt: DType) -> bool:
    """Whether vectorize_alu computes `op` on vectors of the vector axis's width of `dt` (its lane ops: float
    arithmetic, the dialect's vector functions on float32) once a source is a real vector."""
    return self.vector_dtype(dt) and (op in _VECTOR_ARITHMETIC or (op in self.vector_functions and dt == dtypes.float32))

  def vector_alu(self, op: Ops, srcs: list[UOp]) -> Optional[UOp]:
    """`op` on values of the vector axis (real vectors, lanes in a VECTORIZE, or one value for every lane) as the
    vector op vectorize_alu would make of its lanes, else None. It makes one where a source is a real vector, or
    where one source is gathered lane by lane and the others are one value for every lane; lanes that the rewrite
    before it changes one by one (a constant lane moved to the right of a commutative op) do not line up, so the
    gathered sources here are only a load's lanes that all may load (loaded_lanes)."""
    n = self.vector_width
    gathered = [s for s in srcs if s.dtype.count == n and not _real(s)]
    if not self.vector_op(op, srcs[0].dtype.scalar()) or any(s not in self.loaded_lanes for s in gathered) or \
       not (any(_real(s) for s in srcs) or len(gathered) == 1):
      return None
    # as the rewrite does to each lane: a constant operand of a commutative op on the right (a float max keeps its order)
    if op in GroupOp.Commutative and srcs[0].op is Ops.CONST and srcs[1].op is not Ops.CONST and op is not Ops.MAX: srcs = srcs[::-1]
    return UOp(op, srcs[0].dtype.scalar().vec(n), tuple(s if s.dtype.count == n else _splat(s, n) for s in srcs))

  def combine(self, op: Ops, a: "Part", b: "Part") -> "Part":
    """a <op> b for two parts of a reduce (a pairwise combine of them, as lower_reduce builds lane by lane): the
    vector op where vectorize_alu would make one, else the lanes' ops in a VECTORIZE."""
    dt, n = a.value.dtype.scalar(), self.vector_width
    lanes = lambda: tuple(UOp(op, dt, (x, y)) for x, y in zip(a.lanes(), b.lanes()))  # noqa: E731
    if (vector := self.vector_alu(op, [a.value, b.value])) is not None: return Part(vector, lanes)
    return Part(UOp(Ops.VECTORIZE, dt.vec(n), built := lanes()), lambda: built)

  def vector_index(self, u: UOp, dt: DType, env: Env) -> Optional[UOp]:
    """The INDEX of lane 0 of a LOAD or STORE that accesses the vector axis's lanes as one aligned vector
    (fold_vector_accesses' run of them: stride 1, unmasked, the widest declared width aligned at lane 0, in global
    memory), else None."""
    st, buf, a, n = st_arg(u), u.src[0], self.vector_axis, self.vector_width
    strides, masked = self.view_facts(st)
    if buf.op is not Ops.DEFINE_GLOBAL or strides[a] != 1 or a in masked or not self.vector_dtype(dt): return None
    idx, valid = self.indexed(st, self.with_axes(env, {a: 0}))
    root, off = root_and_offset(idx)
    if off % n or not aligned_root(root, n): return None
    if u.op is Ops.STORE:
      for axis in self.late: valid = valid & self.base[axis].eq(0)
      return _index(buf, idx, self.guarded(valid).simplify())
    # a load that never happens is each lane's 0 (the rewrite folds what the lanes compute from it): no vector
    return None if valid.op is Ops.CONST and valid.arg is False else _index(buf, idx, self.guarded(valid))

  def lower_stores(self, store: UOp, env: Env) -> list[UOp]:
    """The lowered STOREs of `store` at env: one vector store where env holds the vector axis whole."""
    if self.vector_marker is None or env[self.vector_axis] is not self.vector_marker: return [self.lower(store, env)]
    # stores lane by lane would stand in the SINK in another order than the lanes' own: the kernel goes lane by lane
    if (index := self.vector_index(store, store.src[2].dtype, env)) is None: raise ScalarLanes("a store that is not one vector")
    value = self.lower(store.src[2], env)
    return [UOp(Ops.STORE, dtypes.void, (index, value if value.dtype.count == self.vector_width else _splat(value, self.vector_width)))]

  def lanes_reducible(self, u: UOp, plan: ReducePlan) -> bool:
    """Whether a reduce over the vector axis keeps vector accumulators (an accumulator per lane, or per lane and way,
    plan.per_lane or plan.ways, updated by an op vectorize_alu keeps on a vector accumulator)."""
    # (a value the same at every lane of the axis is one accumulator, which the lanes share: lowered lane by lane)
    return (plan.per_lane or plan.ways > 1) and bool(plan.ranges) and u.src[0].op is not Ops.EXPAND and self.vector_op(u.arg[0], u.dtype) \
      and u.arg[0] in accumulator_updates(self.vector_functions) and self.vector_axis in self.varies_along(u.src[0])

  def lanes_reduced(self, u: UOp, plan: ReducePlan) -> bool:
    """Whether reduce `u` (under `plan`) reduces the vector axis into vector accumulators (lane_accumulators)."""
    return self.vector_marker is not None and plan.unrolled == [self.vector_axis] and self.lanes_reducible(u, plan)

  def lane_accumulators(self, u: UOp, inner: Env, plan: ReducePlan) -> list[UOp]:
    """A reduce over the vector axis (and loops): the vector of its lanes' values accumulates into a vector
    accumulator (one per way of an interleaved reduce). The reduce's value is their lanes combined pairwise after the
    loops, the ways' lanes one after another (lanes_combined): what vectorize_alu makes of an accumulator per lane."""
    op = u.arg[0]
    return [self.accumulate(op, u.dtype, self.lower(u.src[0], self.with_axes(step, {self.vector_axis: self.vector_marker})), plan.ranges)
            for step in self.steps(inner, plan)]

  def tile_stores(self, store: UOp, env: Env) -> Optional[list[UOp]]:
    """The one STORE of a kernel whose value is a reduce over the vector axis, stored along an upcast axis of stride 1
    (the tile's rows: a row sum's; a Linear layer's x @ W.T, whose other upcast axis gives a tile per lane), as one
    vector store per tile of all its rows' vector accumulators combined at once: one butterfly over them down to the
    tile's lanes. It is what the stores lane by lane become after fold_vector_accesses makes each tile one vector
    store and transpose_combines one butterfly of its combines (kc.codegen.horizontal), built here without the rows'
    own butterflies; None where those passes would not make that (a tile that is no aligned vector of a declared
    width, tiles the fold would join into wider vectors, a butterfly through an undeclared width, rows whose vectors
    are more lanes than one vector)."""
    if self.vector_marker is None or store.op is not Ops.STORE or (r := store.src[2]).op is not Ops.REDUCE_AXIS: return None
    st, op, dt = st_arg(store), r.arg[0], r.dtype
    axes = [a for a in range(self.first_upcast, len(self.full_shape)) if st.shape[a] != 1]
    strides, masked = self.view_facts(st)
    if self.vector_axis in axes or store.src[0].op is not Ops.DEFINE_GLOBAL or len(tile := [a for a in axes if strides[a] == 1]) != 1: return None
    t, n, widths = tile[0], self.full_shape[tile[0]], self.vector_widths(dt)
    others = [a for a in axes if a != t]
    if any(a in masked for a in axes) or not power_of_two(n) or n not in widths or t not in self.varies_along(r) or \
       any(isinstance(self.full_shape[a], int) and self.full_shape[a] == 0 for a in r.arg[1]):
      return None
    # the fold joins neighbouring tiles into a wider vector: only where no tile starts n after another (the other axes
    # step by multiples of the widest vector, or the tile is the widest vector itself)
    if n != widths[0] and not all(isinstance(strides[a], int) and strides[a] % widths[0] == 0 for a in others): return None
    # the rows in the order the lanes are lowered in (the accumulators are numbered so), grouped by tile
    tiles: dict[tuple, list[tuple[Env, list[UOp]]]] = {}
    for e in self.store_lanes(env, (store,)):
      at = self.lowered_env(r, e)
      if not self.lanes_reduced(r, plan := self.plan_of(r, at)): return None
      accs = self.lane_accumulators(r, self.with_axes(at, dict(zip(plan.loops, plan.ranges))), plan)
      tiles.setdefault(tuple(e[a] for a in others), []).append((e, accs))
    stores = []
    for rows in tiles.values():
      vectors = [acc for _, accs in rows for acc in accs]
      w, k = vectors[0].dtype.count, len(rows[0][1])
      if not power_of_two(k) or any(len(accs) != k for _, accs in rows) or len(vectors) > w or \
         not declared_butterfly(self.vector_widths, dt, w, 1) or not declared_butterfly(self.vector_widths, dt, w, n):
        return None
      first = next(e for e, _ in rows if e[t] is self.zero)
      idx, valid = self.indexed(st, first)
      root, off = root_and_offset(idx)
      if off % n or not aligned_root(root, n): return None
      stores.append(UOp(Ops.STORE, dtypes.void, (_index(store.src[0], idx, self.guarded(valid).simplify()), butterfly(op, vectors, n))))
    return stores

  def lower_vector_reduce(self, u: UOp, env: Env) -> Optional[UOp]:
    """A reduce over loops and other unrolled axes, for every lane of the vector axis: its parts combined pairwise
    (vector_alu) and one vector accumulator (what vectorize_alu makes of the lanes' accumulators, each lane its own),
    else None."""
    op, axes = u.arg
    if u.src[0].op is Ops.EXPAND or op not in accumulator_updates(self.vector_functions) or not self.vector_op(op, u.dtype) or \
       any(isinstance(self.full_shape[a], int) and self.full_shape[a] == 0 for a in axes):
      return None
    if (plan := self.plan_of(u, env)).ways > 1 or plan.per_lane: return None
    inner = self.with_axes(env, dict(zip(plan.loops, plan.ranges)))
    parts = [self.part(u.src[0], self.with_axes(inner, c)) for c in self.combos(plan.unrolled)]
    while len(parts) > 1:  # pairwise
      parts = [self.combine(op, parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
    return self.accumulate(op, u.dtype, parts[0].value, plan.ranges) if plan.ranges else parts[0].value

  def part(self, u: UOp, env: Env) -> "Part":
    """`u` at env for every lane of the vector axis, with its lanes (as each lane's own lowering gives them)."""
    value = self.lower(u, env)
    if value.op is Ops.VECTORIZE and value.dtype.count == self.vector_width: return Part(value, lambda: value.src)
    if value.dtype.count == 1: return Part(value, lambda: (value,) * self.vector_width)
    return Part(value, lambda: tuple(self.lower(u, self.with_axes(env, {self.vector_axis: i})) for i in range(self.vector_width)))

  def accumulate(self, op: Ops, dtype: DType, value: UOp, ranges: list[UOp]) -> UOp:
    """acc = identity before the loops; acc = acc <op> value in them. One accumulator per distinct value: lanes
    of an upcast axis that reduce the same values share it. A vector value of the vector axis (a real vector or its
    lanes) gets a vector accumulator, an accumulator number per lane: what vectorize_alu makes of the lanes' own."""
    # the same value is accumulated once per lane that reduces it (a row's max, read by every lane of the row): the
    # update is built once, since a float identity constant alone costs its conversion each time it is made
    if (ret := self.memo.get(key := ("acc", op, dtype, value, loops := tuple(ranges)))) is None:
      lanes = (None,) if value.dtype.count == 1 else range(value.dtype.count)
      ids = tuple([self.acc_ids.setdefault((op, value, loops, lane), len(self.acc_ids)) for lane in lanes])
      # (the identity once per op and dtype: a vector's is a VECTORIZE of a lane's constant per lane)
      if (start := self.memo.get(start_key := ("identity", op, dtype, value.dtype))) is None:
        start = self.memo[start_key] = UOp.const(value.dtype, identity_element(op, dtype))
      acc = UOp(Ops.DEFINE_ACC, value.dtype, (start, *ranges), ids)
      ret = self.memo[key] = UOp(Ops.ASSIGN, value.dtype, (acc, acc.alu(op, value)))
    return ret

  def lower_wmma_reduce(self, u: UOp, expand: UOp, inners: list[Env], env: Env, ranges: list[UOp]) -> UOp:
    """sum over loops of a tensor-core product: one accumulator per output lane, fed back as the WMMA's C. `inners`:
    one environment per lane of the reduce's unrolled axes; each lane's WMMA adds onto the previous one's result."""
    wmma = expand.src[0]
    # one set of accumulators for all lanes: the WMMA does not depend on its own axes, only on the other ones
    key = ("wmma-acc", u, self.with_axes(env, {a: 0 for a in self.wmma_axes(wmma) | {a for a, _ in expand.arg}}))
    if (assigns := self.memo.get(key)) is None:
      n = wmma.dtype.count
      ids = [self.acc_ids.setdefault((key, lane), len(self.acc_ids)) for lane in range(n)]
      accs = [UOp(Ops.DEFINE_ACC, wmma.dtype.scalar(), (UOp.const(wmma.dtype.scalar(), 0.0), *ranges), (i,)) for i in ids]
      fused = UOp(Ops.VECTORIZE, wmma.dtype, tuple(accs))
      for inner in inners:
        e = self.with_axes(inner, {a: 0 for a in self.wmma_axes(wmma)})
        fused = UOp(Ops.WMMA, wmma.dtype, (self.lower(wmma.src[0], e), self.lower(wmma.src[1], e), fused), wmma.arg)
      assigns = self.memo[key] = [UOp(Ops.ASSIGN, acc.dtype, (acc, UOp(Ops.GEP, acc.dtype, (fused,), (i,)))) for i, acc in enumerate(accs)]
    return assigns[_lane_of(env, expand.arg)]


_ELEMENTWISE = GroupOp.ALU | {Ops.CAST, Ops.BITCAST, Ops.VECTORIZE, Ops.GEP}  # lowered as their sources are
# the float arithmetic lower_vector computes on whole vectors (vectorize_alu's lane ops that AST kernels hold)
_VECTOR_ARITHMETIC = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG, Ops.FDIV, Ops.RECIP})
_VECTOR = "vector:"  # the name prefix of the vector axis's marker (no C identifier: no kernel Variable is named so)


class ScalarLanes(Exception):
  """A kernel with a value along its vector axis that lower_vector does not build: lowered lane by lane instead."""


def _never_loads(load: UOp) -> bool:
  """A LOAD whose gate is false (the rewrite makes it 0)."""
  index = load.src[0]
  return len(index.src) == 3 and index.src[2].op is Ops.CONST and index.src[2].arg is False


def _real(x: UOp) -> bool:
  """A real vector of the vector axis: computed as one (not its lanes gathered, not one value splat)."""
  return x.dtype.count > 1 and x.op is not Ops.VECTORIZE


@dataclass(frozen=True)
class Part:
  """A value of the vector axis (a real vector, its lanes in a VECTORIZE, or one value for every lane) and its lanes
  as the lane-by-lane lowering builds them (for the lanes' ops, where no vector op is made of it)."""
  value: UOp
  lanes: Callable[[], tuple[UOp, ...]]


def _splat(x: UOp, n: int) -> UOp:
  """`x` in every lane of a vector of n, as vectorize_alu writes a splat (a constant stays a constant)."""
  return UOp.const(x.dtype.vec(n), x.arg) if x.op is Ops.CONST else UOp(Ops.VECTORIZE, x.dtype.vec(n), (x,) * n)


def aligned_root(root: Optional[UOp], n: int) -> bool:
  """The root of an index is a multiple of n wherever it is evaluated (so root+o with o % n == 0 is n-aligned)."""
  if root is None: return True
  terms, const = split_sum(root)
  return const % n == 0 and all(k % n == 0 for k in terms.values())


def _lane_of(env: Env, axes) -> int:
  """The lane of a vector over `axes` ((axis, size) pairs, the last fastest) that the environment selects."""
  lane, mul = 0, 1
  for a, size in reversed(axes):
    v = env[a]
    if v.op is not Ops.CONST: raise KcError(f"axis {a} must be unrolled to pick a lane, its index is {v.render()}")
    lane += v.arg * mul
    mul *= size
  return lane


def _index(buf: UOp, idx: UOp, valid: UOp) -> UOp:
  """INDEX(buffer, offset[, valid]); no gate where the view is never masked."""
  if valid.op is Ops.CONST and valid.arg is True: return UOp(Ops.INDEX, buf.dtype, (buf, idx))
  return UOp(Ops.INDEX, buf.dtype, (buf, idx, valid))


def lower(ast: UOp, renderer) -> UOp:
  """The lowered SINK of an optimized kernel AST for `renderer` (its has_local, global_max, local_max)."""
  vectors = {"vector_widths": renderer.vector_widths, "vector_functions": frozenset(renderer.vector_functions)} if renderer.vector_alu else {}

  def lowering() -> Lowering:
    return Lowering(ast, renderer.has_local, renderer.global_max, renderer.local_max, idt=idt, **vectors)
  idt = index_dtype(ast)
  lw = lowering()
  if any(isinstance(s, int) and s == 0 for s in st_arg(ast.src[0]).shape):
    # no output elements: zero-size work: a program that takes the kernel's buffers and does nothing (no load may touch an empty buffer)
    return UOp(Ops.SINK, dtypes.void, tuple(sorted({u for u in ast.toposort if u.op is Ops.DEFINE_GLOBAL}, key=lambda u: u.arg)))
  if renderer.vector_alu:
    lw.choose_vector_axis()
    if lw.vector_axis is not None:
      try: return lw.lower(ast, lw.base)
      except ScalarLanes: lw = lowering()  # afresh: nothing of the attempt (its loops, accumulators) is kept
  return lw.lower(ast, lw.base)
