"""The graph rewrites between lowering and linearizing: fold neighbouring scalar loads and stores into vector
accesses of the widths the renderer declares (Renderer.vector_widths), then one walk that simplifies every value, drops what can never happen
(stores behind a false gate), replaces ops the renderer lacks (transcendentals) with ones it has and applies the
renderer's own rules; then, on a renderer that computes on vectors (Renderer.vector_alu), the lanes of each vector
become one vector computation where they line up (vectorize.py), and the lane-by-lane combines of vector accumulators
after their loops one shuffle tree for several at once (horizontal.py); last, on a renderer with fused multiply-adds, sums
of products accumulate with them (fma.py)."""
from __future__ import annotations
import functools
from collections import defaultdict
from typing import Callable, Optional
from kc.errors import KcError
from kc.ir.dtype import DType, PtrDType, dtypes
from kc.ir.rewrite import PatternMatcher, UPat, graph_rewrite
from kc.ir.symbolic import root_and_offset, symbolic
from kc.codegen.fma import fuse_accumulations
from kc.codegen.lower import aligned_root
from kc.codegen.horizontal import combines_found, transposable, transpose_combines, vector_ops
from kc.codegen.transcendental import transcendental_rules
from kc.codegen.vectorize import passing_toposort, vectorize_alu
from kc.codegen.widen import widen_stores
from kc.ir.uop import Ops, UOp


def _drop_noops(root: UOp) -> Optional[UOp]:
  kept = tuple(x for x in root.src if x.op is not Ops.NOOP)
  return root.replace(src=kept) if len(kept) != len(root.src) else None


structural = PatternMatcher([
  # a gate that is always true is no gate; one that is always false means the access never happens
  (UPat(Ops.INDEX, src=(UPat(name="b"), UPat(name="i"), UPat.const(dtypes.bool, True))), lambda b, i: UOp(Ops.INDEX, b.dtype, (b, i))),
  (UPat(Ops.LOAD, src=(UPat(Ops.INDEX, src=(UPat(), UPat(), UPat.const(dtypes.bool, False))),), allow_any_len=True, name="x"),
   lambda x: UOp.const(x.dtype, 0)),
  (UPat(Ops.STORE, src=(UPat(Ops.INDEX, src=(UPat(), UPat(), UPat.const(dtypes.bool, False))), UPat())), lambda: UOp(Ops.NOOP)),
  (UPat((Ops.SINK, Ops.BARRIER), name="root"), _drop_noops),
  # vector plumbing
  (UPat(Ops.GEP, src=(UPat(Ops.VECTORIZE, name="v"),), name="g"), lambda g, v: v.src[g.arg[0]]),
  (UPat(Ops.VECTORIZE, src=UPat(Ops.GEP), name="v"),
   lambda v: v.src[0].src[0] if all(s.src[0] is v.src[0].src[0] and s.arg == (i,) for i, s in enumerate(v.src)) and
   v.src[0].src[0].dtype == v.dtype else None),
], memoize=True)

simplify_all = symbolic + structural


Widths = tuple[int, ...]


def _declared_widths(renderer) -> Callable[[DType], Widths]:
  """renderer.vector_widths, checked once per dtype: ints >= 2, widest first (the fold takes the first that fits)."""
  known: dict[DType, Widths] = {}

  def widths(dt: DType) -> Widths:
    if (ws := known.get(dt)) is None:
      ws = tuple(renderer.vector_widths(dt))
      if not all(isinstance(n, int) and n >= 2 for n in ws) or list(ws) != sorted(set(ws), reverse=True):
        raise KcError(f"{type(renderer).__name__}.vector_widths({dt}) gave {ws}: give distinct ints >= 2, widest first, or () for none")
      known[dt] = ws
    return ws
  return widths


Group = dict[tuple, dict[int, UOp]]


def _accesses(topo, widths: Callable[[DType], Widths]) -> tuple[Group, Group, Group]:
  """Scalar LOADs and STOREs of the dtypes the renderer has vectors of, each grouped by (buffer, index root, gate, extra
  sources, vector widths) and keyed by constant offset; and the vector LOADs of a declared width already there (the
  lowering's vector axis builds them), grouped alike."""
  groups: dict[Ops, Group] = {Ops.LOAD: defaultdict(dict), Ops.STORE: defaultdict(dict)}
  vector_loads: Group = defaultdict(dict)
  for u in topo:
    if (op := u.op) is not Ops.LOAD and op is not Ops.STORE or u.src[0].op is not Ops.INDEX: continue
    index = u.src[0]
    value_dt = u.dtype if op is Ops.LOAD else u.src[1].dtype
    if not isinstance(index.src[0].dtype, PtrDType) or not (ws := widths(value_dt.scalar())): continue
    if value_dt.count != 1 and (op is not Ops.LOAD or value_dt.count not in ws): continue
    root, off = root_and_offset(index.src[1])
    key = (index.src[0], root, index.src[2] if len(index.src) == 3 else None, u.src[1:] if op is Ops.LOAD else (), ws)
    (groups[op] if value_dt.count == 1 else vector_loads)[key][off] = u
  return groups[Ops.LOAD], groups[Ops.STORE], vector_loads


def _runs(by_off: dict[int, UOp], root: Optional[UOp], widths: Widths, taken: set[int]):
  """Aligned runs of neighbouring offsets, of the first (widest) of `widths` that fits, each access in at most one run
  (none at the offsets `taken` already)."""
  for off in sorted(by_off):
    for n in widths:
      if off % n == 0 and aligned_root(root, n) and all(off + i in by_off and off + i not in taken for i in range(n)):
        taken.update(range(off, off + n))
        yield [by_off[off + i] for i in range(n)]
        break


def _vector_store(run: list[UOp], memo: dict[UOp, UOp]) -> UOp:
  """One store of the (rebuilt) values of a run of scalar stores: the loaded vector itself when they are its lanes."""
  values = [memo[g.src[1]] for g in run]
  whole = values[0].src[0] if values[0].op is Ops.GEP else None
  if whole is None or whole.dtype.count != len(values) or \
     any(v.op is not Ops.GEP or v.src[0] is not whole or v.arg != (i,) for i, v in enumerate(values)):
    whole = UOp(Ops.VECTORIZE, values[0].dtype.vec(len(run)), tuple(values))
  return UOp(Ops.STORE, dtypes.void, (memo[run[0].src[0]], whole))


def fold_vector_accesses(sink: UOp, renderer) -> UOp:
  """Groups of scalar loads from one buffer at aligned neighbouring offsets become one vector load and lane reads,
  in the widths renderer.vector_widths declares for their dtype (float4, else float2, by default), and scalar loads
  at the offsets of a vector load already there that vector's lanes; groups of such stores become one vector store
  (of the loaded vector itself when the values are its lanes in order: a copy). One walk over the graph rebuilds it
  with both."""
  topo = passing_toposort(sink)
  load_groups, store_groups, vector_loads = _accesses(topo, _declared_widths(renderer))
  lane: dict[UOp, tuple[list[UOp], int]] = {}  # scalar load -> (its run, its lane)
  loaded: dict[UOp, UOp] = {}  # scalar load -> its lane of a vector load already there
  for key, by_off in load_groups.items():
    # a vector load already there is the run its offsets would make (the widest width, aligned): the scalar loads
    # at its offsets are its lanes, and no other run takes them
    taken: set[int] = set()
    for start, vec in vector_loads.get(key, {}).items():
      for i in range(vec.dtype.count):
        if (g := by_off.get(start + i)) is not None: loaded[g] = UOp(Ops.GEP, g.dtype, (vec,), (i,))
      taken.update(range(start, start + vec.dtype.count))
    for run in _runs(by_off, key[1], key[4], taken):
      for i, g in enumerate(run): lane[g] = (run, i)
  runs_of: dict[UOp, list[UOp]] = {}  # the first store of each run of stores -> the run
  for (_, root, _, _, widths), by_off in store_groups.items():
    for run in _runs(by_off, root, widths, set()): runs_of[run[0]] = run
  if not lane and not runs_of and not loaded: return sink
  memo: dict[UOp, UOp] = {}
  vectors: dict[int, UOp] = {}  # id of a run of loads -> its vector load
  dropped: set[UOp] = set()
  for u in topo:
    if (lane_of_vector := loaded.get(u)) is not None:  # (an INDEX is left as it is: the vector load is final)
      memo[u] = lane_of_vector
      continue
    if u in lane:
      run, i = lane[u]
      if (vec := vectors.get(id(run))) is None:
        # the run's first load gives the address; an INDEX holds only index math and gates, which this walk leaves as
        # they are, so the first load's sources are final even where the walk has not reached them yet
        first = run[0]
        vec = vectors[id(run)] = UOp(Ops.LOAD, first.dtype.vec(len(run)), tuple(memo.get(x, x) for x in first.src))
      memo[u] = UOp(Ops.GEP, u.dtype, (vec,), (i,))
      continue
    src = tuple([memo[x] for x in u.src])
    if u.op is Ops.SINK or u.op is Ops.BARRIER:
      # the stores of a run become one at the run's first; they all reach the SINK (or BARRIER) before it is rebuilt
      heads = [x for x in u.src if x in runs_of and all(g in memo for g in runs_of[x])]
      for x in heads: dropped.update(runs_of[x][1:])
      src = tuple(_vector_store(runs_of[x], memo) if x in heads else memo[x] for x in u.src if x not in dropped)
    memo[u] = u if src == u.src else UOp(u.op, u.dtype, src, u.arg)
  return memo[sink]


def _max_as_where(a: UOp, b: UOp) -> UOp:
  """max(a, b) as b<a ? a : b: numpy's maximum, which gives the second of two equal operands (-0.0 and 0.0), as
  constant folding does (uop._max); for floats a NaN in either operand wins."""
  take_a = b.lt(a)
  if dtypes.is_float(a.dtype): take_a = take_a | a.ne(a)
  return take_a.where(a, b)


@functools.lru_cache(maxsize=None)
def _missing_op_rules(spelled: frozenset) -> Optional[PatternMatcher]:
  """Rewrites of the ops a renderer does not spell into ones it does (it declares them in code_for_op)."""
  rules = []
  if Ops.MAX not in spelled: rules.append((UPat(Ops.MAX, src=(UPat(name="a"), UPat(name="b"))), _max_as_where))
  rules += transcendental_rules(spelled)
  if Ops.MULACC in spelled:  # a*b+c in one instruction where the dialect has one (fma): one rounding instead of two
    rules.append((UPat(Ops.ADD, dtype=dtypes.floats, src=[UPat(Ops.MUL, name="m"), UPat(name="c")]),
                  lambda m, c: UOp(Ops.MULACC, c.dtype, (m.src[0], m.src[1], c)) if m.dtype.count == 1 else None))
  return PatternMatcher(rules, memoize=True) if rules else None


@functools.lru_cache(maxsize=None)
def lowered_rules(spelled: frozenset, extra: Optional[PatternMatcher]) -> PatternMatcher:
  """Every rule a lowered kernel is rewritten with, for a renderer spelling `spelled` with its own rules `extra`:
  simplification first, then the ops the renderer lacks, then the renderer's rules. One matcher, so one walk does
  them all; UOps the lowering already simplified skip the simplifier's rules (see PatternMatcher.parts)."""
  rules = simplify_all
  if (missing := _missing_op_rules(spelled)) is not None: rules = rules + missing
  return rules if extra is None else rules + extra


def rewrite_lowered(sink: UOp, renderer) -> UOp:
  """Every graph rewrite of a lowered kernel, in order, for `renderer`."""
  rules = lowered_rules(frozenset(renderer.code_for_op or {}), renderer.extra_matcher)
  # the lowering left every index and gate simplified already, so the vector accesses are found before the one walk
  sink = graph_rewrite(fold_vector_accesses(sink, renderer), rules)
  # vector arithmetic last: it only regroups lanes of values already simplified and rewritten into the ops the
  # dialect spells, so the rules above never see a vector op they were not written for
  if renderer.vector_alu:
    widths, functions = _declared_widths(renderer), frozenset(renderer.vector_functions)
    ops = vector_ops(functions)
    # a VECTORIZE of combines the next pass transposes is left as it is: nothing vectorize_alu makes of it is better
    combined = combines_found(ops)
    sink = vectorize_alu(sink, widths, functions, renderer.vector_select, left=lambda v: transposable(v, ops, widths, combined) is not None)
    sink = transpose_combines(sink, widths, functions)
    # the stores' own arithmetic last: the combines above leave each tile's stores at their own width
    sink = widen_stores(sink, widths, functions, renderer.vector_select)
  # sums of products fused last, on the vectors the accumulators became
  return fuse_accumulations(sink, renderer.fused_multiply_add) if renderer.fuses_accumulation else sink
