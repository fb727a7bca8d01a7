"""linearize: a lowered SINK to a deterministic list of UOps with loops (RANGE/ENDRANGE) and gated stores
(IF/ENDIF) as blocks.

Each UOp needs a set of open loops: the RANGEs it depends on. A DEFINE_ACC is declared outside its own loops,
an ASSIGN to it is inside them, and a value computed from a finished accumulator is outside them again: that is
how a reduce's loop closes, and how a second reduce of a fused chain gets a loop of its own after the first.
UOps are placed in the innermost block their loops allow, so loop-invariant code sits outside the loop."""
from __future__ import annotations
import heapq, itertools
from kc.ir.dtype import dtypes
from kc.errors import KcError
from kc.ir.uop import Ops, UOp


def _loops(sink: UOp, around: dict[UOp, frozenset[UOp]]) -> dict[UOp, frozenset[UOp]]:
  """For each UOp, the RANGEs that must be open where it is computed. `around[r]` are the loops r nests in."""
  need: dict[UOp, frozenset[UOp]] = {}
  # what a user of an ASSIGN or a DEFINE_ACC reads of its loops, once per node: a finished accumulator is outside its
  # loops; a read of an accumulator's running value (and the update, an ASSIGN) happens inside them
  read: dict[UOp, frozenset[UOp]] = {}
  none: frozenset[UOp] = frozenset()
  for u in sink.toposort:
    if u.op is Ops.RANGE:
      need[u] = none.union(*(need[s] for s in u.src)) | {u} | around.get(u, none)
    elif u.op is Ops.DEFINE_ACC:  # declared (and reset) inside the loops around its own, before they start
      need[u] = none.union(*(need[s] for s in u.src)) - frozenset(u.src[1:])
      read[u] = need[u].union(*(need[r] for r in u.src[1:]))
    else:
      loops = none
      for s in u.src:
        inner = read.get(s, need[s])
        if not inner <= loops: loops = loops | inner if loops else inner
      need[u] = loops
      if u.op is Ops.ASSIGN: read[u] = loops - _closed_by(u)
  return need


def _nesting(sink: UOp) -> tuple[dict[UOp, frozenset[UOp]], dict[UOp, frozenset[UOp]]]:
  """For each RANGE, the loops it nests in (all of them, not only the next one out), derived from the data:
  - a reduce's own loops (its DEFINE_ACC's ranges) nest inside every loop its ASSIGN's value needs that are not its
    own: the loops of an enclosing reduce, the output's loops. Among its own loops, axis order.
  - any other two loops that are ever open together nest in _nesting_key order (an inner loop's body is inside
    every loop around it, so nothing is hoisted into a second copy of an outer loop).
  Each new nesting can make more loops open together, so this repeats until nothing changes. Returns the nesting
  and each UOp's loops under it (_loops)."""
  assigns = [u for u in sink.toposort if u.op is Ops.ASSIGN and u.src[0].op is Ops.DEFINE_ACC]
  around: dict[UOp, frozenset[UOp]] = {}
  while True:
    need = _loops(sink, around)
    inside: dict[UOp, set[UOp]] = {r: set(a) for r, a in around.items()}
    for a in assigns:
      own = sorted(a.src[0].src[1:], key=_nesting_key)
      outer = need[a.src[1]] - frozenset(own)
      for i, r in enumerate(own): inside.setdefault(r, set()).update(outer, own[:i])
    inside = _closure(inside)
    for loops in set(need.values()):
      for p, q in itertools.combinations(sorted(loops, key=_nesting_key), 2):
        if p not in inside.get(q, ()) and q not in inside.get(p, ()): inside.setdefault(q, set()).add(p)
    new = {r: frozenset(a) for r, a in _closure(inside).items()}
    if new == around: return around, need
    around = new


def _closure(inside: dict[UOp, set[UOp]]) -> dict[UOp, set[UOp]]:
  """`inside` closed transitively (a loop inside r is inside everything r is inside); a loop inside itself is a
  nesting no program can have."""
  out = {r: set(a) for r, a in inside.items()}
  changed = True
  while changed:
    changed = False
    for a in out.values():
      more = set().union(*(out.get(x, ()) for x in a)) - a
      if more:
        a |= more
        changed = True
  if any(r in a for r, a in out.items()):
    raise KcError("linearize: the loops of this graph cannot be nested (a reduce needs a loop that is itself inside that reduce's loops)")
  return out


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
  around, need = _nesting(sink)
  # each UOp's loops from the outermost in: a block `depth` loops deep opens the next loop of its nodes' chains
  chains: dict[frozenset, tuple] = {}
  depth = {r: len(a) for r, a in around.items()}  # every two loops open together nest: the outer one is inside fewer
  outer_first = lambda r: (depth.get(r, 0), _nesting_key(r))
  chain = {u: chains[n] if n in chains else chains.setdefault(n, tuple(sorted(n, key=outer_first))) for u, n in need.items()}
  order = {u: i for i, u in enumerate(sink.toposort)}
  nodes = [u for u in sink.toposort if u is not sink and u.op is not Ops.RANGE]
  out: list[UOp] = []
  _emit_block(nodes, 0, chain, order, out)
  return _gate_stores(out)


def _emit_block(nodes: list[UOp], depth: int, chain: dict, order: dict, out: list[UOp]) -> None:
  """Emit `nodes` (all inside the same `depth` loops) in dependency order; nodes needing one more loop are gathered
  into that loop's block, which is emitted where its first node would be."""
  # items: single nodes and whole blocks (keyed by their loop), ordered so every item comes after the items it reads from
  blocks: dict[UOp, list[UOp]] = {}
  item_of: dict[UOp, UOp] = {}
  for u in nodes:
    loops = chain[u]
    if len(loops) == depth: item_of[u] = u
    else:
      r = loops[depth]
      item_of[u] = r
      if r in blocks: blocks[r].append(u)
      else: blocks[r] = [u]
  if not blocks:  # single nodes only: the toposort order they come in is the order
    out.extend(nodes)
    return
  if len(blocks) == 1 and len(item_of) == len(nodes) == len(next(iter(blocks.values()))):  # one block and nothing else
    r, members = next(iter(blocks.items()))
    out.append(r)
    _emit_block(members, depth + 1, chain, order, out)
    out.append(UOp(Ops.ENDRANGE, dtypes.void, (r,)))
    return
  deps: dict[UOp, set] = {item: set() for item in item_of.values()}
  for u in nodes:
    me = item_of[u]
    for x in u.src:  # a node reads its sources
      if (it := item_of.get(x)) is not None and it is not me: deps[me].add(it)
  # and every loop a node sits in (this one and deeper ones) reads its bounds on entry: once per chain of loops, for
  # the block of its loop at this depth
  for loops in dict.fromkeys(chain[u] for u in nodes if len(chain[u]) > depth):
    me = loops[depth]
    for r in loops[depth:]:
      for x in r.src:
        if (it := item_of.get(x)) is not None and it is not me: deps[me].add(it)
  first = {item: order[item] for item in deps if item not in blocks}
  for r, members in blocks.items(): first[r] = order[members[0]]  # members keep the toposort order
  # (first is unique per item: each node belongs to one item, so the heap never compares two UOps)
  emitted = sorted(deps, key=first.__getitem__)
  done: set = set()
  for item in emitted:  # the toposort's order already reads every item after what it reads: nothing to reorder
    if not deps[item] <= done: break
    done.add(item)
  else: return _emit_items(emitted, blocks, depth, chain, order, out)
  users: dict[UOp, list] = {}
  waiting: dict[UOp, int] = {}
  for item, d in deps.items():
    waiting[item] = len(d)
    for x in d: users.setdefault(x, []).append(item)
  heap = [(first[i], i) for i, n in waiting.items() if n == 0]
  heapq.heapify(heap)
  emitted: list = []
  while heap:
    _, item = heapq.heappop(heap)
    emitted.append(item)
    for user in users.get(item, ()):
      waiting[user] -= 1
      if waiting[user] == 0: heapq.heappush(heap, (first[user], user))
  if len(emitted) != len(deps): raise KcError("linearize: the loops of this graph cannot be nested (a value is needed inside and after one loop)")
  _emit_items(emitted, blocks, depth, chain, order, out)


def _emit_items(items: list[UOp], blocks: dict[UOp, list[UOp]], depth: int, chain: dict, order: dict, out: list[UOp]) -> None:
  """Emit the items of one depth in order: a node as itself, a loop as RANGE, its block, ENDRANGE."""
  for item in items:
    if item in blocks:
      out.append(item)
      _emit_block(blocks[item], depth + 1, chain, order, out)
      out.append(UOp(Ops.ENDRANGE, dtypes.void, (item,)))
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
