"""The graph rewrites between lowering and linearizing: simplify every index and value, drop what can never
happen (stores behind a false gate), fold neighbouring scalar loads and stores into vector accesses where the
renderer supports them, and replace ops the renderer lacks (transcendentals) with ones it has."""
from __future__ import annotations
import functools
from collections import defaultdict
from typing import Optional
from kc.dtype import PtrDType, dtypes
from kc.rewrite import PatternMatcher, UPat, graph_rewrite
from kc.symbolic import split_sum, symbolic
from kc.transcendental import transcendental_rules
from kc.uop import Ops, UOp


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


def _split_index(idx: UOp) -> tuple[Optional[UOp], int]:
  """(root, constant offset) of an index expression."""
  if idx.op is Ops.CONST: return None, idx.arg
  if idx.op is Ops.ADD and idx.src[1].op is Ops.CONST: return idx.src[0], idx.src[1].arg
  return idx, 0


def _aligned(root: Optional[UOp], n: int) -> bool:
  """The root of an index is a multiple of n wherever it is evaluated (so root+o with o % n == 0 is n-aligned)."""
  if root is None: return True
  terms, const = split_sum(root)
  return const % n == 0 and all(k % n == 0 for k in terms.values())


VECTOR_WIDTHS = (4, 2)


def _accesses(sink: UOp, op: Ops) -> dict[tuple, dict[int, UOp]]:
  """Scalar float/half LOADs or STOREs grouped by (buffer, index root, gate, extra sources), keyed by constant offset."""
  groups: dict[tuple, dict[int, UOp]] = defaultdict(dict)
  for u in sink.toposort:
    if u.op is not op or u.src[0].op is not Ops.INDEX: continue
    index = u.src[0]
    value_dt = u.dtype if op is Ops.LOAD else u.src[1].dtype
    if value_dt.count != 1 or value_dt.scalar() not in (dtypes.float32, dtypes.float16) or not isinstance(index.src[0].dtype, PtrDType): continue
    root, off = _split_index(index.src[1])
    groups[(index.src[0], root, index.src[2] if len(index.src) == 3 else None, u.src[1:] if op is Ops.LOAD else ())][off] = u
  return groups


def _runs(by_off: dict[int, UOp], root: Optional[UOp]):
  """Aligned runs of VECTOR_WIDTHS neighbouring offsets, widest first, each access in at most one run."""
  taken: set[int] = set()
  for off in sorted(by_off):
    for n in VECTOR_WIDTHS:
      if off % n == 0 and _aligned(root, n) and all(off + i in by_off and off + i not in taken for i in range(n)):
        taken.update(range(off, off + n))
        yield [by_off[off + i] for i in range(n)]
        break


def fold_vector_accesses(sink: UOp) -> UOp:
  """Groups of 4 (or 2) scalar loads of float/half from one buffer at aligned neighbouring offsets become one vector
  load and lane reads; then groups of such stores become one vector store (of the loaded vector itself when the
  values are its lanes in order: a copy)."""
  replace: dict[UOp, UOp] = {}
  for (buf, root, gate, rest), by_off in _accesses(sink, Ops.LOAD).items():
    for group in _runs(by_off, root):
      first = group[0]
      vec = UOp(Ops.LOAD, first.dtype.vec(len(group)), (first.src[0],) + rest)
      for i, g in enumerate(group): replace[g] = UOp(Ops.GEP, g.dtype, (vec,), (i,))
  if replace: sink = sink.substitute(replace)
  # stores second, on the graph with vector loads: a folded store's values are then already the lane reads
  replace, dropped = {}, set()
  for (buf, root, gate, _), by_off in _accesses(sink, Ops.STORE).items():
    for group in _runs(by_off, root):
      values = [g.src[1] for g in group]
      whole = values[0].src[0] if values[0].op is Ops.GEP else None
      if whole is None or whole.dtype.count != len(values) or any(v.op is not Ops.GEP or v.src[0] is not whole or v.arg != (i,) for i, v in enumerate(values)):
        whole = UOp(Ops.VECTORIZE, values[0].dtype.vec(len(group)), tuple(values))
      replace[group[0]] = UOp(Ops.STORE, dtypes.void, (group[0].src[0], whole))
      dropped.update(group[1:])
  if not replace: return sink
  # the stores folded into a neighbour's leave the SINK (and any BARRIER waiting on them)
  for u in sink.toposort:
    if u.op in (Ops.SINK, Ops.BARRIER) and any(x in dropped for x in u.src):
      replace[u] = u.replace(src=tuple(replace.get(x, x) for x in u.src if x not in dropped))
  return sink.substitute(replace)


def _max_as_where(a: UOp, b: UOp) -> UOp:
  """max(a, b) as a<b ? b : a; for floats a NaN in either operand wins, as in numpy."""
  take_b = a.lt(b)
  if dtypes.is_float(a.dtype): take_b = take_b | b.ne(b)
  return take_b.where(b, a)


@functools.lru_cache(maxsize=None)
def _missing_op_rules(spelled: frozenset) -> Optional[PatternMatcher]:
  """Rewrites of the ops a renderer does not spell into ones it does (it declares them in code_for_op)."""
  rules = []
  if Ops.MAX not in spelled: rules.append((UPat(Ops.MAX, src=(UPat(name="a"), UPat(name="b"))), _max_as_where))
  rules += transcendental_rules(spelled)
  if Ops.MULACC in spelled:  # a*b+c in one instruction where the dialect has one (fma): one rounding instead of two
    rules.append((UPat(Ops.ADD, dtype=dtypes.floats, src=[UPat(Ops.MUL, name="m"), UPat(name="c")]),
                  lambda m, c: UOp(Ops.MULACC, c.dtype, (m.src[0], m.src[1], c)) if m.dtype.count == 1 else None))
  return PatternMatcher(rules) + structural if rules else None


@functools.lru_cache(maxsize=None)
def _with_simplify(extra: PatternMatcher) -> PatternMatcher:
  """A renderer's extra rules followed by the simplifier, built once per rule set (building one is not free)."""
  return extra + simplify_all


def rewrite_lowered(sink: UOp, renderer) -> UOp:
  """Every graph rewrite of a lowered kernel, in order, for `renderer`."""
  sink = graph_rewrite(sink, simplify_all)
  if getattr(renderer, "supports_float4", False): sink = fold_vector_accesses(sink)
  if (missing := _missing_op_rules(frozenset(getattr(renderer, "code_for_op", {}) or {}))) is not None: sink = graph_rewrite(sink, missing)
  if (extra := getattr(renderer, "extra_matcher", None)) is not None: sink = graph_rewrite(sink, _with_simplify(extra))
  return sink
