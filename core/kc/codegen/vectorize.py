"""Vector arithmetic for dialects that compute on vectors (Renderer.vector_alu): after the vector accesses are folded
(graph.fold_vector_accesses) and the graph is rewritten, a vector built lane by lane from scalar values (a
VECTORIZE, e.g. the value of a vector store) is rebuilt as one vector computation where its lanes line up:

  lanes that are the lanes of one vector, in order      that vector (a vector load, a vector accumulator)
  lanes that are one and the same value                 that value splat to every lane
  lanes of one arithmetic op (ADD SUB MUL MULACC NEG    that op on the vectors of its sources' lanes
    FDIV RECIP, and the renderer's vector_functions on
    float32), same dtype
  lanes of one WHERE of float32 values, of one           that op on vectors, the bools as lane masks
    comparison of float32 values or of one AND OR XOR
    or logical not of bools (Renderer.vector_select)
  lanes that update accumulators, acc_i = acc_i <op>    one accumulator of the vector dtype updated with the vector
    x_i (op ADD or MUL, or MAX where it is one of the     of the x_i
    vector_functions), the same loops

Accumulators are also found where no vector uses them: a reduce over unrolled lanes keeps one accumulator per lane
and combines them pairwise after its loops (kc.codegen.lower). Such a combine of a declared width's accumulators,
combined by their own update op, becomes one vector accumulator and the same pairwise combine of its lanes: every
lane adds the same values in the same order, so the result is the same bit for bit.

Every other set of lanes stays a VECTORIZE of scalars: lanes that mix vectors or cross lanes (GEPs out of order, a
reduce across an upcast axis), comparisons and WHERE where the renderer has no vector_select (a comparison of C
vectors gives an int vector of lane masks, not a bool one), casts (a C cast between vector types reinterprets, it
converts nothing), transcendentals the renderer has no vector function for, and every int computation. An op is
only made a vector where at least one of its sources is a vector already, or where at most one source is gathered
lane by lane and the rest are splats: with two gathers, the scalar computation costs less than packing the lanes of
both. Lanes of at most two vectors of the same width, or constants, count as no gather: a C compiler makes that one
permute (a convolution's input row shifted by its window's column, zero where the pad is).

Only the dtypes and widths the renderer declares vector accesses of (Renderer.vector_widths) are vectorized, and
only float32 and float64, whose C arithmetic on vectors is the same IEEE arithmetic lane by lane."""
from __future__ import annotations
from typing import Callable, Iterable, Optional, Reversible
from kc.ir.dtype import DType, dtypes
from kc.codegen.combine import lanes_combined
from kc.ir.uop import Ops, UOp

# the ops whose C operators compute lane by lane on GCC/Clang vector types with the scalar operators' results
VECTOR_OPS = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.MULACC, Ops.NEG, Ops.FDIV, Ops.RECIP})
# with Renderer.vector_select: the ops on float32 lanes that give bool lanes (lane masks), and the ops on bool lanes
_COMPARES = frozenset({Ops.CMPLT, Ops.CMPNE})
_MASK_LOGIC = frozenset({Ops.AND, Ops.OR, Ops.XOR, Ops.CMPNE})  # CMPNE of bools: logical not (x != true) and xor
# the updates of an accumulator that stay lane by lane on a vector accumulator; MAX too where the dialect computes it
# on vectors (Renderer.vector_functions; elsewhere it is a WHERE by now)
_ACC_UPDATES = frozenset({Ops.ADD, Ops.MUL})


def accumulator_updates(functions: frozenset) -> frozenset: return _ACC_UPDATES | (functions & {Ops.MAX})
# the float dtypes whose C arithmetic on vectors is the same IEEE arithmetic lane by lane
VECTOR_FLOATS = frozenset({dtypes.float32, dtypes.float64})
_NO_ACCS: frozenset[UOp] = frozenset()

Lanes = tuple[UOp, ...]


def passing_toposort(sink: UOp) -> dict[UOp, None]:
  """sink.toposort for a graph that one codegen pass walks and then drops: a cached toposort holds the sink itself, a
  reference cycle that keeps the whole graph alive until the cyclic collector finds it, and a kernel's intermediate
  graphs (lowered, folded, rewritten) are tens of thousands of UOps that every collection until then walks again.
  Uncached, the graph is freed by reference counting as soon as the pass returns; a toposort cached already is used."""
  known = sink.__dict__.get("toposort")
  return known if known is not None else type(sink).toposort.func(sink)  # type: ignore[attr-defined]


def replaced(topo: dict[UOp, None], found: dict[UOp, UOp]) -> UOp:
  """The graph whose toposort is `topo` (its sink last) with each node of `found` replaced by its value, and every
  node above one rebuilt on the new sources (a pass's last step, without caching a toposort on the new graph).

  A value is built from nodes of the old graph, which may lie above another replaced node (a combine of an
  accumulator whose update holds a combine replaced too): its old nodes are taken as rebuilt, or the graph would keep
  the old copy beside the new one (an accumulator then updated twice)."""
  rebuilt: dict[UOp, UOp] = {}
  new_nodes: dict[UOp, UOp] = {}  # a value's own nodes (not of the old graph) -> rebuilt on the rebuilt old nodes

  def on_rebuilt(x: UOp) -> UOp:
    if (got := rebuilt.get(x)) is not None: return got
    if (got := new_nodes.get(x)) is not None: return got
    src = tuple(on_rebuilt(s) for s in x.src)
    got = new_nodes[x] = x if src == x.src else UOp(x.op, x.dtype, src, x.arg)
    return got

  for u in topo:
    if u in found: rebuilt[u] = on_rebuilt(found[u])
    else:
      src = tuple(rebuilt[x] for x in u.src)
      rebuilt[u] = u if src == u.src else UOp(u.op, u.dtype, src, u.arg)
  return rebuilt[next(reversed(topo))]


def lane_op(u: UOp, functions: frozenset = frozenset(), select: bool = False) -> bool:
  """Whether `u`'s op computes lane by lane on vectors of its (scalar) dtype in a dialect with these vector_functions
  and vector_select: arithmetic of floats, the functions on float32, and with select the WHERE of float32 values, the
  comparisons of float32 values and the logic of their lane masks. `u` may be a scalar or a vector already (its
  sources as wide as it, which the caller checks); the dtypes are read lane by lane."""
  dt, sdts = u.dtype.scalar(), [s.dtype.scalar() for s in u.src]
  if u.op in VECTOR_OPS: return dt != dtypes.bool and all(s == dt for s in sdts)
  if u.op in functions and dt == dtypes.float32 and all(s == dt for s in sdts): return True
  if not select: return False
  # lane masks are as wide as float32's lanes: selects of float32, comparisons of float32, logic of their masks
  if u.op is Ops.WHERE: return dt == dtypes.float32 and sdts[0] == dtypes.bool and sdts[1] == sdts[2] == dt
  if u.op in _COMPARES and all(s == dtypes.float32 for s in sdts): return True
  return u.op in _MASK_LOGIC and dt == dtypes.bool and all(s == dtypes.bool for s in sdts)


class _Vectorizer:
  """Rebuilds the VECTORIZEs of one graph as vector computations. `rebuilt` maps each scalar of the original graph
  to its rebuilt version (the walk fills it sources first); `built` remembers each set of lanes, so lanes shared by
  two vectors (an accumulator read by its update and by the store after the loop) become one vector."""

  def __init__(self, rebuilt: dict[UOp, UOp], accs_under: dict[UOp, frozenset[UOp]], functions: frozenset = frozenset(),
               select: bool = False):
    self.rebuilt, self.accs_under, self.functions, self.select = rebuilt, accs_under, functions, select
    self.built: dict[Lanes, tuple[UOp, bool]] = {}
    self.combined: set[UOp] = set()  # roots of combines rebuilt over a vector accumulator that loads without gathers

  def vector(self, lanes: Lanes) -> UOp: return self.build(lanes)[0]

  def build(self, lanes: Lanes) -> tuple[UOp, bool]:
    """(the vector of `lanes`, whether it is a true vector: neither a splat nor a lane-by-lane gather)."""
    if (ret := self.built.get(lanes)) is None: ret = self.built[lanes] = self._build(lanes)
    return ret

  def _build(self, lanes: Lanes) -> tuple[UOp, bool]:
    first, n = lanes[0], len(lanes)
    vdt = first.dtype.vec(n)
    if all(x is first for x in lanes): return self.splat(first, n), False
    # a combine of a vector accumulator is its lanes' sum already: lanes across such combines (a register tile's
    # outputs, the reduce vectorized along its own axis) are packed, not vectorized across a second set of accumulators
    if self.combined and any(x in self.combined for x in lanes): return self.gather(lanes), False
    whole = first.src[0] if first.op is Ops.GEP else None
    if whole is not None and whole.dtype == vdt and all(x.op is Ops.GEP and x.src[0] is whole and x.arg == (i,) for i, x in enumerate(lanes)):
      return self.rebuilt[whole], True
    if first.op is Ops.ASSIGN and (acc := self.accumulator(lanes)) is not None: return acc, True
    if all(x.op is first.op and x.arg == first.arg and x.dtype == first.dtype and len(x.src) == len(first.src) for x in lanes) \
       and lane_op(first, self.functions, self.select) and all(s.dtype == f.dtype for x in lanes for s, f in zip(x.src, first.src)):
      srcs = [self.build(tuple(x.src[j] for x in lanes)) for j in range(len(first.src))]
      # a vector op where a source is a vector already, or where at most one source must be packed lane by lane
      # (the rest splats): packing that one source costs what packing the op's results would, and the packed
      # vector is shared by every op that uses the same lanes (a conv's masked input row times each output channel)
      # Lanes shuffled from at most two vectors in registers (a conv window's shifted row, zero where it is padded)
      # are one permute, not a packing: they do not count.
      if any(real for _, real in srcs) or sum(v.op is Ops.VECTORIZE and len(set(v.src)) > 1 and not _shuffle(v) for v, _ in srcs) <= 1:
        return UOp(first.op, vdt, tuple(v for v, _ in srcs), first.arg), True
    if (by_lane := self.over_vector_sources(lanes)) is not None: return by_lane, False
    return self.gather(lanes), False

  def over_vector_sources(self, lanes: Lanes) -> Optional[UOp]:
    """Lanes of one op that stays scalar (a WHERE, a comparison, a cast: a ReLU or mask after a matmul), some of whose
    sources are the lanes of a true vector (accumulators, vector arithmetic): that vector is built, and the op runs
    lane by lane on its lanes, so the accumulators stay one vector; else None."""
    first = lanes[0]
    if first.op in (Ops.ASSIGN, Ops.DEFINE_ACC, Ops.GEP, Ops.VECTORIZE) or not first.src or \
       any(x.op is not first.op or x.arg != first.arg or x.dtype != first.dtype or len(x.src) != len(first.src) for x in lanes):
      return None
    vectors: dict[int, UOp] = {}
    for j, s0 in enumerate(first.src):
      col = tuple(x.src[j] for x in lanes)
      if s0.dtype in VECTOR_FLOATS and (s0.op is Ops.ASSIGN or s0.op in VECTOR_OPS) and all(c.op is s0.op for c in col) and len(set(col)) == len(col):
        v, real = self.build(col)
        if real: vectors[j] = v
    if not vectors: return None
    return UOp(Ops.VECTORIZE, first.dtype.vec(len(lanes)), tuple(
      UOp(x.op, x.dtype, tuple(UOp(Ops.GEP, s.dtype, (vectors[j],), (i,)) if j in vectors else self.rebuilt[s] for j, s in enumerate(x.src)), x.arg)
      for i, x in enumerate(lanes)))

  def splat(self, x: UOp, n: int) -> UOp:
    """`x` in every lane of a vector (a constant stays a constant)."""
    if x.op is Ops.CONST: return UOp.const(x.dtype.vec(n), x.arg)
    return UOp(Ops.VECTORIZE, x.dtype.vec(n), (self.rebuilt[x],) * n)

  def gather(self, lanes: Lanes) -> UOp:
    return UOp(Ops.VECTORIZE, lanes[0].dtype.vec(len(lanes)), tuple(self.rebuilt[x] for x in lanes))

  def accumulator(self, lanes: Lanes) -> Optional[UOp]:
    """One vector accumulator for lanes acc_i = acc_i <op> x_i (distinct scalar accumulators over the same loops,
    with the same start), else None. The scalar accumulators' lanes are remembered as the vector one before the x_i
    are built: a read of the running value inside them then reads the vector."""
    # lanes that are not all accumulator updates (an update beside another op, as lanes gathered from a stack of
    # reduce results are) are gathered as they are
    if any(x.op is not Ops.ASSIGN for x in lanes): return None
    accs = tuple(x.src[0] for x in lanes)
    first, upd = accs[0], lanes[0].src[1]
    if len(set(accs)) != len(accs) or upd.op not in accumulator_updates(self.functions): return None
    for x, acc in zip(lanes, accs):
      u = x.src[1]
      if x.op is not Ops.ASSIGN or acc.op is not Ops.DEFINE_ACC or acc.dtype != first.dtype or acc.src[1:] != first.src[1:] \
         or acc.src[0] is not first.src[0] or u.op is not upd.op or u.dtype != first.dtype or u.src[0] is not acc or acc in self.accs_under[u.src[1]]:
        return None
    if accs in self.built: return None  # these accumulators are a vector already, updated elsewhere: no second update
    vdt = first.dtype.vec(len(lanes))
    start = self.splat(first.src[0], len(lanes))
    vacc = UOp(Ops.DEFINE_ACC, vdt, (start, *(self.rebuilt[r] for r in first.src[1:])), tuple(a.arg[0] for a in accs))
    self.built[accs] = (vacc, True)
    value = self.vector(tuple(x.src[1].src[1] for x in lanes))
    return UOp(Ops.ASSIGN, vdt, (vacc, UOp(upd.op, vdt, (vacc, value))))


def _shuffle(v: UOp) -> bool:
  """Whether a VECTORIZE's lanes are lanes of at most two vectors of its own dtype, or constants: a permute of
  registers (C compilers turn such a vector literal into one shuffle instruction)."""
  wholes = {x.src[0] for x in v.src if x.op is Ops.GEP}
  return len(wholes) <= 2 and all(w.dtype == v.dtype for w in wholes) and all(x.op in (Ops.GEP, Ops.CONST) for x in v.src)


def _gathers(v: UOp) -> bool:
  """Whether the vector computation `v` packs a vector from scalars loaded one by one (a strided load's lanes): a
  reduce whose every step loads whole vectors along its own axis has none. Lanes computed from a vector's own lanes
  (a ReLU of a loaded vector, lane by lane) are packed from registers, not memory: they do not count."""
  seen, stack = set(), [v]
  while stack:
    x = stack.pop()
    if x in seen or x.dtype.count == 1: continue
    seen.add(x)
    if x.op is Ops.VECTORIZE:
      if len(set(x.src)) > 1 and any(_loaded_alone(s) for s in x.src): return True
      continue
    stack.extend(x.src)
  return False


def _loaded_alone(lane: UOp, depth: int = 4) -> bool:
  """Whether a scalar lane is, or is computed from, a scalar LOAD (within a few ops: a lane's own arithmetic)."""
  if lane.op is Ops.LOAD: return True
  if depth == 0 or lane.op in (Ops.GEP, Ops.CONST): return False
  return any(_loaded_alone(s, depth - 1) for s in lane.src if s.dtype.count == 1 and s.op is not Ops.INDEX)


def accumulators_under(topo: Iterable[UOp]) -> dict[UOp, frozenset[UOp]]:
  """The DEFINE_ACCs each UOp of `topo` (sources first) depends on, itself included, in one pass: every lane asks
  whether its update value reads its own accumulator, and the lanes' values share most of their subgraphs (index
  math, loads), so one pass answers all of them where a toposort per lane would walk each value's subgraph again."""
  under: dict[UOp, frozenset[UOp]] = {}
  for u in topo:
    below = [a for s in u.src if (a := under[s]) is not _NO_ACCS]
    accs = below[0] if len(below) == 1 else frozenset().union(*below) if below else _NO_ACCS
    under[u] = accs | {u} if u.op is Ops.DEFINE_ACC else accs
  return under


def _vectorizable(u: UOp, widths: Callable[[DType], tuple[int, ...]]) -> bool:
  """A VECTORIZE of scalars of a float dtype, as wide as a vector the renderer declares."""
  dt = u.dtype.scalar()
  return u.op is Ops.VECTORIZE and dt in VECTOR_FLOATS and all(s.dtype == dt for s in u.src) and u.dtype.count in widths(dt)


def _may_change(v: UOp) -> bool:
  """Whether _Vectorizer._build can give a VECTORIZE other than its rebuilt lanes: lanes of one op that are not all
  one value, or a splat of a constant that is not already what the splat of it builds."""
  first = v.src[0]
  if all(x is first for x in v.src): return first.op is Ops.CONST and UOp.const(v.dtype, first.arg) is not v
  return all(x.op is first.op for x in v.src)


def vectorize_alu(sink: UOp, widths: Callable[[DType], tuple[int, ...]], functions: frozenset = frozenset(),
                  select: bool = False, left: Callable[[UOp], bool] = lambda v: False) -> UOp:
  """`sink` with each VECTORIZE of scalars of a declared vector width rebuilt as a vector computation where its
  lanes line up (see the module's docstring); nothing else changes. `functions`: the unary ops (EXP2, ...) the
  dialect also computes on float32 vectors (Renderer.vector_functions); `select`: comparisons and WHERE on float32
  vectors with lane masks (Renderer.vector_select). `left`: VECTORIZEs left as they are, not walked (those a later
  pass replaces whole: kc.codegen.horizontal.transposable)."""
  topo = passing_toposort(sink)
  candidates = [u for u in topo if u.op is Ops.VECTORIZE and _vectorizable(u, widths) and not left(u)]
  combines = _accumulator_combines(topo, widths, {x for v in candidates for x in v.src}, accumulator_updates(functions))
  # walked: the VECTORIZEs _build can change. A splat and lanes of different ops (no vector, no accumulator, no one
  # op) come back as their rebuilt lanes, which the rebuild of every other node gives them too
  vectors = {u: None for u in candidates if _may_change(u)}  # in order, asked again below
  if not vectors and not combines: return sink
  rebuilt: dict[UOp, UOp] = {}
  vz = _Vectorizer(rebuilt, accumulators_under(topo), functions, select)
  for u in topo:
    if u in vectors: rebuilt[u] = vz.vector(u.src)
    elif u in combines and (acc := vz.vector(combines[u])).op is Ops.ASSIGN:
      rebuilt[u] = lanes_combined(u.op, [acc], widths)
      if not _gathers(acc.src[1].src[1]): vz.combined.add(u)
    else:
      src = tuple(rebuilt[x] for x in u.src)
      rebuilt[u] = u if src == u.src else UOp(u.op, u.dtype, src, u.arg)
  return rebuilt[sink]


def _accumulator_combines(topo: Reversible[UOp], widths: Callable[[DType], tuple[int, ...]], in_vectors: set[UOp],
                          updates: frozenset = _ACC_UPDATES) -> dict[UOp, tuple[UOp, ...]]:
  """The roots of pairwise combines (trees of one op of `updates`: ADD, MUL, MAX) of a declared width's accumulator
  updates, each with its leaves in order: accumulators of one op over the same loops, which no vector of
  `in_vectors`' lanes holds."""
  found: dict[UOp, tuple[UOp, ...]] = {}
  inside: set[UOp] = set()
  candidates = _accumulator_trees(topo, widths, updates)
  for u in reversed(topo):  # a combine's root before its subtrees: the largest combine wins
    if u in inside or u not in candidates: continue
    leaves, inner, stack = [], [], [u]
    while stack:
      x = stack.pop()
      if x.op is u.op and x.dtype == u.dtype: inner.append(x); stack.extend(reversed(x.src))
      else: leaves.append(x)
    if len(leaves) not in widths(u.dtype) or any(x in in_vectors for x in leaves): continue
    first = leaves[0]
    if all(x.op is Ops.ASSIGN and x.src[0].op is Ops.DEFINE_ACC and x.src[1].op is u.op and x.src[0].src[1:] == first.src[0].src[1:]
           for x in leaves):
      found[u] = tuple(leaves)
      inside.update(inner)
  return found


def _accumulator_trees(topo: Iterable[UOp], widths: Callable[[DType], tuple[int, ...]], updates: frozenset = _ACC_UPDATES) -> set[UOp]:
  """The float ADDs and MULs (the ops of `updates`) whose tree of the same op and dtype has a declared width's number of leaves (a shared
  subtree counted each time the walk over the tree reaches it), every leaf an update of an accumulator by that op.
  Found for every node in one pass, sources first: walking every subtree of a long chain (a conv's unrolled sum) to
  find its leaves would take time quadratic in the chain's length, for trees that are almost never combines."""
  counts: dict[UOp, int] = {}  # leaves, capped above the widest width; 0 where a leaf is no accumulator update
  caps: dict[DType, int] = {}  # per dtype: one above its widest width (asked only of the dtypes the graph has)
  for u in topo:
    if u.op not in updates or u.dtype not in VECTOR_FLOATS: continue
    if (cap := caps.get(u.dtype)) is None: cap = caps[u.dtype] = max(widths(u.dtype), default=0) + 1
    n = 0
    for x in u.src:
      if x.op is u.op and x.dtype == u.dtype: k = counts[x]
      else: k = 1 if x.op is Ops.ASSIGN and x.src[0].op is Ops.DEFINE_ACC and x.src[1].op is u.op else 0
      if k == 0: break
      n += k
    else:
      counts[u] = min(cap, n)
      continue
    counts[u] = 0
  return {u for u, n in counts.items() if n in widths(u.dtype)}
