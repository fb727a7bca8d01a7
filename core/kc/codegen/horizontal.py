"""Horizontal combines of vector accumulators, several at once: on a renderer that computes on vectors, a reduce
vectorized along its own axis leaves one vector accumulator per output lane, and after its loops each is combined
lane by lane, pairwise, built as a butterfly of even/odd shuffles down to one lane (kc.codegen.combine). A register
tile of a matmul whose operands are both contiguous along K (x @ W.T, every Linear layer) stores 4 lanes, each such
a combine of a 16-lane vector on AVX-512: 4 levels of shuffles and ever narrower vector ops per lane, down to a
2-lane vector and a scalar.

Here the lanes of a VECTORIZE whose N lanes (a power of two, at most the width W) are each such a combine of the same
number of vectors are combined together: one butterfly over all their vectors, in the lanes' order, down to N lanes
(kc.codegen.combine.butterfly with out=N), every level over whole vectors. Lane j is the combine of the j-th run of
the vectors' lanes, the same combine in the same order, bit for bit; a C compiler turns each even or odd shuffle into
one permute (vpermt2ps, uzp1). For the tile above: 10 shuffles and 5 vector adds per store."""
from __future__ import annotations
from typing import Callable, Optional
from kc.ir.dtype import DType
from kc.codegen.combine import butterfly, declared_butterfly, power_of_two
from kc.codegen.vectorize import VECTOR_FLOATS, passing_toposort, replaced
from kc.ir.uop import Ops, UOp


def _halved(x: UOp, op: Ops, dt: DType) -> Optional[tuple[UOp, ...]]:
  """The sources of a butterfly level: (a,) or (a, b) where x is (a[,b])[0::2] <op> (a[,b])[1::2] of dtype dt."""
  if x.op is not op or x.dtype != dt or len(x.src) != 2: return None
  even, odd = x.src
  if even.op is not Ops.SHUFFLE or odd.op is not Ops.SHUFFLE or even.src != odd.src: return None
  n = 2 * dt.count
  return even.src if even.arg == tuple(range(0, n, 2)) and odd.arg == tuple(range(1, n, 2)) else None


def combined_vectors(u: UOp, ops: frozenset, combined: Optional[Callable[[UOp], Optional[tuple[UOp, ...]]]] = None) -> Optional[tuple[UOp, ...]]:
  """The vectors v_0 .. v_{m-1} (one dtype, m a power of two) where the scalar `u` is pairwise's combine of their
  lanes in order by u's op, in either form: `butterfly(u.op, (v_0, ...), 1)`, every level neighbouring lanes combined,
  down from whole vectors that are no such level themselves (accumulators); or u's op on two such combines of as many
  vectors each (pairwise's tree over the lanes of both, as a reduce's ways combine after each way's lanes); else
  None. `combined`: this function for u's sources, memoized by the caller."""
  if u.op not in ops or u.dtype not in VECTOR_FLOATS or len(u.src) != 2: return None
  a, b = u.src
  if a.op is Ops.GEP and b.op is Ops.GEP and a.src == b.src and a.arg == (0,) and b.arg == (1,) and a.src[0].dtype.count == 2:
    level = [a.src[0]]
    # down the levels while every vector of the level is one: levels inside one vector, then levels over pairs
    while (below := [_halved(x, u.op, level[0].dtype) for x in level])[0] is not None and \
          all(s is not None and len(s) == len(below[0]) for s in below):
      level = [v for s in below if s is not None for v in s]
    return tuple(level)
  if a.op is not u.op or b.op is not u.op or a.dtype != u.dtype or b.dtype != u.dtype: return None
  if combined is None: combined = lambda x: combined_vectors(x, ops)  # noqa: E731
  left, right = combined(a), combined(b)
  if left is None or right is None or len(left) != len(right) or left[0].dtype != right[0].dtype: return None
  return left + right


def combines_found(ops: frozenset) -> Callable[[UOp], Optional[tuple[UOp, ...]]]:
  """combined_vectors, memoized for one walk: a combine can be a lane of many VECTORIZEs (a softmax's row max is splat
  into every vector that reads it), and a scalar combine of combines asks for its halves."""
  walked: dict[UOp, Optional[tuple[UOp, ...]]] = {}

  def combined(x: UOp) -> Optional[tuple[UOp, ...]]:
    if x not in walked: walked[x] = combined_vectors(x, ops, combined)
    return walked[x]
  return combined


def vector_ops(functions: frozenset) -> frozenset:
  """The ops whose combines are transposed: ADD and MUL, and MAX where the dialect computes it on float vectors."""
  return frozenset({Ops.ADD, Ops.MUL}) | (functions & {Ops.MAX})


def transposable(v: UOp, ops: frozenset, widths: Callable[[DType], tuple[int, ...]],
                 combined: Optional[Callable[[UOp], Optional[tuple[UOp, ...]]]] = None) -> Optional[tuple[UOp, ...]]:
  """All the vectors, lane after lane, of a VECTORIZE whose lanes are combines (combined_vectors) of one op of `ops`,
  each over as many vectors, at most a vector's width of them in all, where every width of the butterfly over them is
  declared (`widths`); else None. `combined`: combined_vectors memoized by the caller."""
  if v.op is not Ops.VECTORIZE or v.dtype.scalar() not in VECTOR_FLOATS or not power_of_two(n := v.dtype.count) or n < 2: return None
  if combined is None: combined = combines_found(ops)
  if combined(v.src[0]) is None: return None  # most VECTORIZEs are no combines (a splat of a load): one look
  lanes = [combined(x) for x in v.src]
  if len({x.op for x in v.src}) != 1 or len({len(vs) if vs is not None else 0 for vs in lanes}) != 1: return None
  vectors = tuple(x for vs in lanes if vs is not None for x in vs)
  width, dt = vectors[0].dtype.count, vectors[0].dtype
  if len(vectors) > width or any(x.dtype != dt for x in vectors) or not declared_butterfly(widths, dt.scalar(), width, n): return None
  return vectors


def transpose_combines(sink: UOp, widths: Callable[[DType], tuple[int, ...]], functions: frozenset = frozenset()) -> UOp:
  """`sink` with each VECTORIZE of combines of vectors built as one butterfly over all their vectors (transposed;
  module docstring), and each scalar combine of combines as one butterfly. `functions`: the ops the dialect computes
  on float vectors beside ADD and MUL (Renderer.vector_functions: MAX)."""
  ops = vector_ops(functions)
  topo = passing_toposort(sink)
  combined = combines_found(ops)

  found: dict[UOp, UOp] = {}
  for u in topo:
    if u.op is Ops.VECTORIZE:
      if (vs := transposable(u, ops, widths, combined)) is not None: found[u] = butterfly(u.src[0].op, vs, u.dtype.count)
    # a scalar combine of several butterflies (a reduce's ways, each way's lanes first) is one butterfly over them all
    elif u.dtype.count == 1 and u.op in ops and u.src[0].op is u.op and (vs := combined(u)) is not None and \
         declared_butterfly(widths, u.dtype, vs[0].dtype.count, 1):
      found[u] = butterfly(u.op, vs, 1)
  return replaced(topo, found) if found else sink
