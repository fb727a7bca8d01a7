"""Horizontal combines of vector accumulators, several at once: on a renderer that computes on vectors, a reduce
vectorized along its own axis leaves one vector accumulator per output lane, and after its loops each is combined
lane by lane, `pairwise(op, [v[0], ..., v[W-1]])` (kc.codegen.vectorize). A register tile of a matmul whose operands
are both contiguous along K (x @ W.T, every Linear layer) stores 4 lanes, each such a combine of a 16-lane vector on
AVX-512: 60 scalar adds and 64 lane extracts per store, as many instructions as the 32 steps of its K loop.

Here the lanes of N such vectors (N a power of two, at most the width W) are combined together, halving the partial
sums of every vector at each level with one even/odd shuffle pair and one vector op:

  level over two vectors a, b (k partial-sum groups each)   (a,b)[0::2] + (a,b)[1::2]: one vector, 2k groups
  level inside one vector of width w                        v[0::2] + v[1::2]: one vector of width w/2

until each vector's lanes are one value, in the order the vectors were given (a VECTORIZE of N combines is that
vector itself; a pairwise tree over the combines of N vectors, as an interleaved reduce keeps, is the same tree over
its lanes). Every level adds neighbouring partial sums, as `pairwise` does, so each result is the same sum in the same
order, bit for bit; a C compiler turns each vector literal of even or odd lanes into one permute (vpermt2ps, uzp1).
For the tile above: 10 shuffles and 5 vector adds per store instead of 124 scalar operations."""
from __future__ import annotations
from typing import Callable, Optional
from kc.ir.dtype import DType
from kc.codegen.vectorize import VECTOR_FLOATS, passing_toposort, replaced
from kc.ir.uop import Ops, UOp


def _power_of_two(n: int) -> bool: return n >= 1 and n & (n - 1) == 0


def combined_vectors(u: UOp, ops: frozenset) -> Optional[tuple[tuple[UOp, ...], list[UOp]]]:
  """(the vectors v_0 .. v_{m-1}, the tree's ops) where `u` is `pairwise(u.op, [v_0[0], ..., v_0[W-1], v_1[0], ...])`:
  vectors of one width W, m a power of two, each vector's lanes in order; else None. The walk follows only u's op
  and dtype."""
  if u.op not in ops or u.dtype not in VECTOR_FLOATS: return None
  # the first and the last leaf first: most ADDs of a kernel are no combine, and a long chain (a convolution's sum)
  # must not be walked whole from each of its nodes
  left, right = u, u
  while left.op is u.op and left.dtype == u.dtype: left = left.src[0]
  while right.op is u.op and right.dtype == u.dtype: right = right.src[-1]
  if left.op is not Ops.GEP or right.op is not Ops.GEP or left.arg != (0,) or (width := left.src[0].dtype.count) < 2 or \
     right.arg != (width - 1,):
    return None
  leaves, inner, stack, depths = [], [], [(u, 0)], set()
  while stack:
    x, depth = stack.pop()
    if x.op is u.op and x.dtype == u.dtype:
      inner.append(x)
      stack.extend((s, depth + 1) for s in reversed(x.src))
    elif x.op is Ops.GEP and len(leaves) < width * width: leaves.append(x); depths.add(depth)
    else: return None
  first = leaves[0].src[0]
  if not _power_of_two(width) or first.dtype != u.dtype.vec(width) or len(leaves) % width: return None
  vectors = tuple(leaves[i].src[0] for i in range(0, len(leaves), width))
  if not _power_of_two(len(vectors)) or any(v.dtype != first.dtype for v in vectors) or \
     any(x.src[0] is not vectors[i // width] or x.arg != (i % width,) for i, x in enumerate(leaves)):
    return None
  # pairwise over a power of two of leaves is the perfect binary tree over them in order: every leaf (found in
  # order above) at the same depth, log2 of their number
  return (vectors, inner) if depths == {len(leaves).bit_length() - 1} else None


def vector_ops(functions: frozenset) -> frozenset:
  """The ops whose combines are transposed: ADD and MUL, and MAX where the dialect computes it on float vectors."""
  return frozenset({Ops.ADD, Ops.MUL}) | (functions & {Ops.MAX})


def combines_of_many_vectors(v: UOp, ops: frozenset) -> bool:
  """Whether a VECTORIZE's lanes are combines of one op (combined_vectors) over the same number of vectors, and the
  lanes' j-th vectors are more than two different vectors for every j: then each level of the lanes' trees gathers
  lanes of more than two vectors (no one permute), so vectorize_alu leaves the VECTORIZE as it is and only
  transpose_combines can build it; vectorize_alu need not walk its trees."""
  # (a splat, a softmax's row max in every lane, has one vector per j: never more than two)
  if v.op is not Ops.VECTORIZE or len(set(v.src)) < 3 or len({x.op for x in v.src}) != 1: return False
  trees = [combined_vectors(x, ops) for x in v.src]
  if any(t is None for t in trees) or len({len(t[0]) for t in trees if t is not None}) != 1: return False
  return all(len(set(js)) > 2 for js in zip(*(t[0] for t in trees if t is not None)))


def _neighbours_combined(op: Ops, vectors: tuple[UOp, ...]) -> UOp:
  """The lanes of one or two vectors (of one dtype) taken in order, neighbours combined: lanes[0::2] <op> lanes[1::2],
  a vector half as wide as all their lanes (a scalar from the two lanes of one vector)."""
  dt, n = vectors[0].dtype, sum(v.dtype.count for v in vectors)
  if n == 2: return UOp(op, dt.scalar(), (UOp(Ops.GEP, dt.scalar(), vectors, (0,)), UOp(Ops.GEP, dt.scalar(), vectors, (1,))))
  half = dt.scalar().vec(n // 2)
  return UOp(op, half, (UOp(Ops.SHUFFLE, half, vectors, tuple(range(0, n, 2))), UOp(Ops.SHUFFLE, half, vectors, tuple(range(1, n, 2)))))


def butterfly(op: Ops, vectors: tuple[UOp, ...], out: int) -> UOp:
  """The vectors' lanes, taken in order, combined by `op` into `out` lanes (a scalar for 1): lane j is the pairwise
  combine of the j-th of `out` equal runs of them (module docstring). len(vectors) and out: powers of two, at most the
  vectors' width, out at most len(vectors). Each level gathers its even and odd lanes with one SHUFFLE each."""
  level = list(vectors)
  while len(level) > 1: level = [_neighbours_combined(op, (a, b)) for a, b in zip(level[0::2], level[1::2])]
  v = level[0]
  while v.dtype.count > out: v = _neighbours_combined(op, (v,))
  return v


def transpose_combines(sink: UOp, widths: Callable[[DType], tuple[int, ...]], functions: frozenset = frozenset()) -> UOp:
  """`sink` with each VECTORIZE of combines of vectors (its lanes' vectors, all lanes together, at most one vector
  width's worth) and each scalar combine of vectors not inside such a VECTORIZE built as one butterfly (module
  docstring), where every vector width on the way is one the renderer declares (`widths`). `functions`: the ops the
  dialect computes on float vectors beside ADD and MUL (Renderer.vector_functions: MAX)."""
  ops = vector_ops(functions)
  topo = passing_toposort(sink)
  found: dict[UOp, UOp] = {}
  inside: set[UOp] = set()
  walked: dict[UOp, Optional[tuple[tuple[UOp, ...], list[UOp]]]] = {}

  def combined(x: UOp) -> Optional[tuple[tuple[UOp, ...], list[UOp]]]:
    # once per node: a combine is a lane of many VECTORIZEs where every lane reads it (a softmax's row max, splat)
    if x not in walked: walked[x] = combined_vectors(x, ops)
    return walked[x]

  def declared(dt: DType, width: int, out: int) -> bool:
    ws = widths(dt)
    return width in ws and all(w in ws for w in _halvings(width, out))

  for u in reversed(topo):  # roots before the trees under them: the largest combine wins
    if u in inside: continue
    if u.op is Ops.VECTORIZE and u.dtype.scalar() in VECTOR_FLOATS and _power_of_two(n := u.dtype.count) and n >= 2:
      if combined(u.src[0]) is None: continue  # every lane must be a combine (most VECTORIZEs are splats of a load)
      lanes = [c for x in u.src if (c := combined(x)) is not None]
      if len(lanes) != n or len({x.op for x in u.src}) != 1 or len({len(vs) for vs, _ in lanes}) != 1: continue
      vectors = tuple(v for vs, _ in lanes for v in vs)
      width = vectors[0].dtype.count
      if len(vectors) > width or any(v.dtype != vectors[0].dtype for v in vectors) or not declared(u.dtype.scalar(), width, n): continue
      found[u] = butterfly(u.src[0].op, vectors, n)
      for _, inner in lanes: inside.update(inner)
    elif u.dtype.count == 1 and (c := combined(u)) is not None:
      vectors, inner = c
      if len(vectors) > (width := vectors[0].dtype.count) or not declared(u.dtype, width, 1): continue
      found[u] = butterfly(u.op, vectors, 1)
      inside.update(inner)
  return replaced(topo, found) if found else sink


def _halvings(width: int, out: int) -> list[int]:
  """The vector widths the halving levels pass through from `width` down to `out` (scalars excluded)."""
  ret, w = [], width // 2
  while w >= max(out, 2): ret, w = ret + [w], w // 2
  return ret
