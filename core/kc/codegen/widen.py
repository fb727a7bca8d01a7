"""Narrow stores computed as one wide vector: on a renderer that computes on vectors, a register tile stores a few
narrow vectors (a matmul's 4x4 tile: four float4 rows), and whatever a kernel computes on its outputs after their
reduce (a GELU, an exp, a bias and a scale) runs once per store at the store's width: on AVX-512 a quarter of each
vector register. A Linear layer with an exact GELU spent 300 us of its 640 there, 64K outputs at float4.

Here the value trees of stores that compute the same ops, lane for lane (isomorphic trees: the same op, dtype and
arg at each position), are computed together as one vector of the widest declared width, and each store takes its
lanes of it:

  at a tree position where the stores' nodes are     the wide vector is
  one and the same node (a constant, a bias row)     that node repeated, store by store (a broadcast)
  one op the dialect computes on vectors             that op on the wide vectors of its sources
    (kc.codegen.vectorize.lane_op), at most one of
    whose sources must be packed
  anything else (a load, an accumulator's combine)   the nodes' lanes packed into one vector (a frontier)

Every lane computes the same op on the same operands as before, so each stored value is the same bits (the ops are
IEEE arithmetic lane by lane, and the functions compute every lane alike at any width). A group is widened only
where the ops it saves outweigh the packing: weight(ops) >= 4 * (packs + 1), an inlined function (exp2, log2)
weighing 16 and a division 4, so a bias add or a ReLU stays as it is and a GELU or an exp does not.

Stores are grouped by buffer, gate and index root (the same loop variables; offsets differ by constants), so the
group's values are computed where the stores were and only the stores move after the last of them; a buffer a kernel
writes is read only by the lane that writes each element (kc.codegen.verify), so no store of a group is read by
another's tree."""
from __future__ import annotations
from typing import Callable, Optional
from kc.ir.symbolic import root_and_offset
from kc.ir.dtype import DType
from kc.codegen.vectorize import VECTOR_FLOATS, lane_op, passing_toposort, replaced
from kc.ir.uop import Ops, UOp, shuffle_lanes

# what one op of a tree weighs against a pack of lanes: a function is an inlined polynomial, a division a slow op
_WEIGHT = {Ops.EXP2: 16, Ops.LOG2: 16, Ops.FDIV: 4, Ops.RECIP: 4}
# a group is widened where its ops' weight is at least this much per pack (the result's extraction counts as one)
_WEIGHT_PER_PACK = 4

Nodes = tuple[UOp, ...]


def _lanes_of(u: UOp) -> tuple[UOp, ...]:
  """The scalar lanes of a value: a scalar itself, a VECTORIZE's sources, a SHUFFLE's lanes of its sources, else a GEP
  per lane."""
  if u.dtype.count == 1: return (u,)
  if u.op is Ops.VECTORIZE: return u.src
  if u.op is Ops.SHUFFLE: return tuple(UOp(Ops.GEP, u.dtype.scalar(), (x,), (i,)) for x, i in shuffle_lanes(u))
  return tuple(UOp(Ops.GEP, u.dtype.scalar(), (u,), (i,)) for i in range(u.dtype.count))


class _Widener:
  """The wide vector of one group's value trees, position by position, and what it cost: ops widened and packs."""

  def __init__(self, functions: frozenset, select: bool):
    self.functions, self.select = functions, select
    self.memo: dict[Nodes, Optional[UOp]] = {}
    self.packs: set[Nodes] = set()
    self.weight = 0

  def wide(self, nodes: Nodes) -> Optional[UOp]:
    """The wide vector of `nodes` as an op (or a broadcast of one shared node); None where they must be packed."""
    if nodes not in self.memo: self.memo[nodes] = self._wide(nodes)
    return self.memo[nodes]

  def _wide(self, nodes: Nodes) -> Optional[UOp]:
    first, k = nodes[0], len(nodes)
    if all(x is first for x in nodes): return self.repeated(first, k)
    if any(x.op is not first.op or x.arg != first.arg or x.dtype != first.dtype or len(x.src) != len(first.src) or
           any(s.dtype != f.dtype for s, f in zip(x.src, first.src)) for x in nodes[1:]):
      return None
    if not lane_op(first, self.functions, self.select) or any(s.dtype.count != first.dtype.count for s in first.src): return None
    columns = [tuple(x.src[j] for x in nodes) for j in range(len(first.src))]
    srcs = [self.wide(c) for c in columns]
    # an op whose sources are all packs is packed itself: packing its results costs what packing its sources would
    if sum(s is None for s in srcs) > 1: return None
    srcs = [s if s is not None else self.packed(c) for s, c in zip(srcs, columns)]
    if any(s is None for s in srcs): return None
    self.weight += _WEIGHT.get(first.op, 1)
    return UOp(first.op, first.dtype.scalar().vec(first.dtype.count * k), tuple(srcs), first.arg)

  def repeated(self, u: UOp, k: int) -> UOp:
    """One node's lanes in each of k places (a constant's are constants: a vector literal)."""
    return UOp(Ops.VECTORIZE, u.dtype.scalar().vec(u.dtype.count * k), _lanes_of(u) * k)

  def packed(self, nodes: Nodes) -> Optional[UOp]:
    """The nodes' lanes packed in order, where they are floats (masks and ints are never packed)."""
    if nodes[0].dtype.scalar() not in VECTOR_FLOATS: return None
    self.packs.add(nodes)
    return UOp(Ops.VECTORIZE, nodes[0].dtype.scalar().vec(nodes[0].dtype.count * len(nodes)), tuple(x for u in nodes for x in _lanes_of(u)))


def _chunks(stores: list[UOp], width: int, widths: tuple[int, ...]) -> list[list[UOp]]:
  """Runs of stores (of `width` lanes each) whose lanes together make a declared width, widest first."""
  out, i = [], 0
  while i < len(stores):
    k = next((n // width for n in widths if n % width == 0 and 2 <= n // width <= len(stores) - i), 0)
    if k == 0: break
    out.append(stores[i:i + k])
    i += k
  return out


def widen_stores(sink: UOp, widths: Callable[[DType], tuple[int, ...]], functions: frozenset = frozenset(),
                 select: bool = False) -> UOp:
  """`sink` with the float stores of each group (module docstring) whose value trees are worth widening computed as
  one vector of a declared width (`widths`), each store taking its lanes. `functions`, `select`: the dialect's
  vector_functions and vector_select (kc.codegen.vectorize.lane_op)."""
  topo = passing_toposort(sink)
  groups: dict[tuple, dict[int, UOp]] = {}
  for u in topo:
    if u.op is not Ops.STORE or len(u.src) != 2 or u.src[0].op is not Ops.INDEX or (vdt := u.src[1].dtype).scalar() not in VECTOR_FLOATS:
      continue
    root, off = root_and_offset((index := u.src[0]).src[1])
    groups.setdefault((index.src[0], root, index.src[2:], vdt), {})[off] = u
  found: dict[UOp, UOp] = {}
  for (_, _, _, vdt), by_off in groups.items():
    if len(by_off) < 2 or not (ws := widths(vdt.scalar())): continue
    for chunk in _chunks([by_off[o] for o in sorted(by_off)], vdt.count, ws):
      wz = _Widener(functions, select)
      wide = wz.wide(tuple(s.src[1] for s in chunk))
      if wide is None or wide.op is Ops.VECTORIZE or wz.weight < _WEIGHT_PER_PACK * (len(wz.packs) + 1): continue
      w = vdt.count
      for i, s in enumerate(chunk):
        lanes = tuple(UOp(Ops.GEP, vdt.scalar(), (wide,), (i * w + j,)) for j in range(w))
        found[s] = UOp(Ops.STORE, s.dtype, (s.src[0], lanes[0] if w == 1 else UOp(Ops.VECTORIZE, vdt, lanes)), s.arg)
  return replaced(topo, found) if found else sink
