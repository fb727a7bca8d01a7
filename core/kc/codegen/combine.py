"""How a reduce's values combine: the order of a combine (pairwise), its form on vectors (a butterfly of shuffles),
and the value a reduce starts from.

The lanes of vector accumulators after their loops are combined pairwise too. On a renderer that computes on
vectors, that tree over the lanes of m vectors (m a power of two, every vector of one width w) is built as a
butterfly: each level combines neighbouring lanes, lanes[0::2] <op> lanes[1::2], as pairwise's level does, with
one even and one odd SHUFFLE and one vector op:

  level over two vectors a, b (k partial-sum groups each)   (a,b)[0::2] + (a,b)[1::2]: one vector, 2k groups
  level inside one vector of width w                        v[0::2] + v[1::2]: one vector of width w/2

The same sums in the same order, bit for bit, in 3 UOps per level where the scalar tree took one per lane."""
from __future__ import annotations
from typing import Any, Callable, Sequence
from kc.errors import KcError
from kc.ir.dtype import DType, dtypes
from kc.ir.uop import Ops, UOp


def pairwise(op: Ops, values: list[UOp]) -> UOp:
  """values combined pairwise: a balanced tree has the shortest dependency chain (and sums round better)."""
  while len(values) > 1:
    values = [values[i].alu(op, values[i + 1]) if i + 1 < len(values) else values[i] for i in range(0, len(values), 2)]
  return values[0]


def identity_element(op: Ops, dt) -> Any:
  """The value a reduce starts from: 0 for sums, 1 for products, the dtype's minimum for max."""
  if op is Ops.ADD: return 0
  if op is Ops.MUL: return 1
  if op is Ops.MAX: return dtypes.min(dt)
  raise KcError(f"no identity for the reduce {op}")


def power_of_two(n: int) -> bool: return n >= 1 and n & (n - 1) == 0


def halvings(width: int, out: int) -> list[int]:
  """The vector widths a butterfly's levels inside one vector pass through from `width` down to `out` lanes
  (scalars excluded)."""
  ret, w = [], width // 2
  while w >= max(out, 2): ret, w = ret + [w], w // 2
  return ret


def neighbours_combined(op: Ops, vectors: tuple[UOp, ...]) -> UOp:
  """The lanes of one or two vectors (of one dtype) taken in order, neighbours combined: lanes[0::2] <op> lanes[1::2],
  a vector half as wide as all their lanes (a scalar from the two lanes of one vector)."""
  dt, n = vectors[0].dtype, sum(v.dtype.count for v in vectors)
  if n == 2: return UOp(op, dt.scalar(), (UOp(Ops.GEP, dt.scalar(), vectors, (0,)), UOp(Ops.GEP, dt.scalar(), vectors, (1,))))
  half = dt.scalar().vec(n // 2)
  return UOp(op, half, (UOp(Ops.SHUFFLE, half, vectors, tuple(range(0, n, 2))), UOp(Ops.SHUFFLE, half, vectors, tuple(range(1, n, 2)))))


def butterfly(op: Ops, vectors: Sequence[UOp], out: int) -> UOp:
  """The vectors' lanes, taken in order, combined by `op` into `out` lanes (a scalar for 1): lane j is the pairwise
  combine of the j-th of `out` equal runs of them (module docstring). len(vectors) and out: powers of two, out at
  most the vectors' width."""
  level = list(vectors)
  while len(level) > 1: level = [neighbours_combined(op, (a, b)) for a, b in zip(level[0::2], level[1::2])]
  v = level[0]
  while v.dtype.count > out: v = neighbours_combined(op, (v,))
  return v


def declared_butterfly(widths: Callable[[DType], tuple[int, ...]], dt: DType, width: int, out: int) -> bool:
  """Whether a butterfly over vectors of `width` lanes of `dt` down to `out` lanes passes only through vector widths
  the renderer computes on (`widths`: Renderer.vector_widths)."""
  ws = widths(dt)
  return width in ws and all(w in ws for w in halvings(width, out))


def lanes_combined(op: Ops, vectors: Sequence[UOp], widths: Callable[[DType], tuple[int, ...]]) -> UOp:
  """The lanes of `vectors` (one dtype), taken in order, combined pairwise into one value: a butterfly where their
  number is a power of two and their width and every halving of it are widths the renderer computes on (`widths`),
  else pairwise's scalar tree over their lanes. The same value either way, bit for bit."""
  dt, w = vectors[0].dtype.scalar(), vectors[0].dtype.count
  if power_of_two(len(vectors)) and power_of_two(w) and w >= 2 and declared_butterfly(widths, dt, w, 1):
    return butterfly(op, vectors, 1)
  return pairwise(op, [UOp(Ops.GEP, dt, (v,), (i,)) for v in vectors for i in range(w)])
