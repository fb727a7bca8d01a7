"""linearize: a lowered SINK to a deterministic list of UOps with loops (RANGE/ENDRANGE) and gated stores
(IF/ENDIF) as blocks.

Each UOp needs a set of open loops: the RANGEs it depends on. A DEFINE_ACC is declared outside its own loops,
an ASSIGN to it is inside them, and a value computed from a finished accumulator is outside them again: that is
how a reduce's loop closes, and how a second reduce of a fused chain gets a loop of its own after the first.
UOps are placed in the innermost block their loops allow, so loop-invariant code sits outside the loop."""
from __future__ import annotations
import heapq
from kc.dtype import dtypes
from kc.errors import KcError
from kc.uop import Ops, UOp


def _loops(sink: UOp, around: dict[UOp, frozenset[UOp]]) -> dict[UOp, frozenset[UOp]]:
  """For each UOp, the RANGEs that must be open where it is computed. `around[r]` are the loops r nests in."""
  need: dict[UOp, frozenset[UOp]] = {}
  for u in sink.toposort:
    if u.op is Ops.RANGE:
      need[u] = frozenset().union(*(need[s] for s in u.src)) | {u} | around.get(u, frozenset())
    elif u.op is Ops.DEFINE_ACC:  # declared (and reset) inside the loops around its own, before they start
      own = frozenset(u.src[1:])
      need[u] = frozenset().union(*(need[s] for s in u.src)) - own
    else:
      loops = frozenset().union(*(need[s] - _closed_by(s) for s in u.src))
      # a read of an accumulator's running value (and the update, an ASSIGN) happens inside the accumulator's loops
      for acc in (s for s in u.src if s.op is Ops.DEFINE_ACC): loops |= frozenset().union(*(need[r] for r in acc.src[1:]))
      need[u] = loops
  return need


def _nesting(sink: UOp) -> dict[UOp, frozenset[UOp]]:
  """For each RANGE, the loops it nests in: loops that are ever open together nest in _nesting_key order (an
  inner loop's body is inside every loop around it, so nothing is hoisted into a second copy of an outer loop)."""
  around: dict[UOp, set[UOp]] = {}
  for loops in set(_loops(sink, {}).values()):
    for r in loops: around.setdefault(r, set()).update(x for x in loops if _nesting_key(x) < _nesting_key(r))
  for r in sorted(around, key=_nesting_key):  # outer loops first, so their own surroundings are complete
    around[r] |= set().union(*(around[x] for x in around[r]))
  return {r: frozenset(a) for r, a in around.items()}


def _closed_by(u: UOp) -> frozenset[UOp]:
  """The loops a value has finished with: an accumulator's ASSIGN is complete once its loops are."""
  return frozenset(u.src[0].src[1:]) if u.op is Ops.ASSIGN else frozenset()


def _nesting_key(r: UOp):
  """Loops of the output's own axes (kind 0) are outermost, in axis order; reduce loops nest inside them."""
  axis, kind = r.arg
  return (kind != 0, axis, kind)


def linearize(sink: UOp) -> list[UOp]:
  """The UOps of `sink` in execution order, with ENDRANGE after each loop body and IF/ENDIF around gated stores.
  The SINK itself is not included."""
  if sink.op is not Ops.SINK: raise KcError(f"linearize takes a SINK, got {sink.op}")
  need = _loops(sink, _nesting(sink))
  order = {u: i for i, u in enumerate(sink.toposort)}
  nodes = [u for u in sink.toposort if u is not sink and u.op is not Ops.RANGE]
  out: list[UOp] = []
  _emit_block(nodes, frozenset(), need, order, out)
  return _gate_stores(out)


def _emit_block(nodes: list[UOp], open_loops: frozenset, need: dict, order: dict, out: list[UOp]) -> None:
  """Emit `nodes` (all needing at least `open_loops`) in dependency order; nodes needing one more loop are gathered
  into that loop's block, which is emitted where its first node would be."""
  here = [u for u in nodes if need[u] == open_loops]
  deeper = [u for u in nodes if need[u] != open_loops]
  # group the deeper nodes by the outermost loop they add
  blocks: dict[UOp, list[UOp]] = {}
  for u in deeper:
    extra = need[u] - open_loops
    outer = min(extra, key=_nesting_key)
    blocks.setdefault(outer, []).append(u)
  # items: single nodes and whole blocks, ordered so every item comes after the items it reads from
  item_of: dict[UOp, object] = {u: u for u in here}
  for r, members in blocks.items():
    for u in members: item_of[u] = r
  deps: dict[object, set] = {item: set() for item in list(here) + list(blocks)}
  for u in here + deeper:
    me = item_of[u]
    for s in u.src:
      if s in item_of and item_of[s] is not me: deps[me].add(item_of[s])
  for r in blocks:
    for b in r.src:
      if b in item_of and item_of[b] is not r: deps[r].add(item_of[b])
  first = {item: order[item] if isinstance(item, UOp) and item not in blocks else min(order[u] for u in blocks[item]) for item in deps}
  # (first is unique per item: each node belongs to one item, so the heap never compares two UOps)
  done: set = set()
  emitted: list = []
  ready = [i for i in deps if not deps[i]]
  waiting = {i: set(d) for i, d in deps.items() if d}
  users: dict[object, list] = {}
  for i, d in waiting.items():
    for x in d: users.setdefault(x, []).append(i)
  heap = [(first[i], i) for i in ready]
  heapq.heapify(heap)
  while heap:
    _, item = heapq.heappop(heap)
    if item in done: continue
    done.add(item)
    emitted.append(item)
    for user in users.get(item, []):
      waiting[user].discard(item)
      if not waiting[user]: heapq.heappush(heap, (first[user], user))
  if len(emitted) != len(deps): raise KcError("linearize: the loops of this graph cannot be nested (a value is needed inside and after one loop)")
  for item in emitted:
    if item in blocks:
      r = item
      out.append(r)
      _emit_block(blocks[r], open_loops | {r}, need, order, out)
      out.append(UOp(Ops.ENDRANGE, dtypes.void, (r,)))
    else: out.append(item)


def _gate_stores(uops: list[UOp]) -> list[UOp]:
  """Wrap each run of stores that share a gate in IF(gate) ... ENDIF."""
  out: list[UOp] = []
  block = None  # the open IF
  for u in uops:
    gate = u.src[0].src[2] if u.op is Ops.STORE and u.src[0].op is Ops.INDEX and len(u.src[0].src) == 3 else None
    if block is not None and gate is not block.src[0]:
      out.append(UOp(Ops.ENDIF, dtypes.void, (block,)))
      block = None
    if gate is not None and block is None:
      block = UOp(Ops.IF, dtypes.void, (gate,))
      out.append(block)
    out.append(u)
  if block is not None: out.append(UOp(Ops.ENDIF, dtypes.void, (block,)))
  return out
