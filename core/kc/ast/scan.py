"""numpy's cumsum and cumprod for kc.ast, built from movement and a reduce.

A scan along an axis of length n is a sliding window: the axis padded on the left by n - 1 elements of the
operation's identity (0 for a sum, 1 for a product), windows of n (`Expr.windows`), and the window axis reduced, so
out[i] is the reduce of x[0..i]. That is n operations per element; past BLOCKED_FROM, the axis is cut into blocks
instead: a windowed scan inside each block, the scan of the block totals before each block (itself a scan, blocked
again where it is long), and the two combined. The totals are a reduce result moved by a window, which one kernel
cannot hold: the builder splits such a program into kernels with an intermediate buffer.

The dtypes are numpy's (kc.ast.promotion): small ints and bools widen to int64 (unsigned to uint64) unless `dtype` is
given, floats keep theirs; half, bfloat16 and fp8 accumulate in float32 and are rounded once, as Expr.sum and
Expr.prod do (numpy's own float16 accumulate rounds to half after every step, so it drifts from the exact prefix
sums on long axes; kc's result is the exact one rounded). A `dtype` of bool is numpy's logical or (cumsum) and
logical and (cumprod) of the elements' truth."""
from __future__ import annotations
import math, operator
from dataclasses import dataclass
from typing import Callable
import numpy as np
from kc.ast import promotion as P
from kc.ast.builder import implements, Expr, _axes, _dtype, _no_expr, _truth, const, where
from kc.errors import DTypeError, InvalidASTError
from kc.ir.dtype import dtypes
from kc.ir.uop import Ops
from kc.shape.view import fmt_shape

# the longest axis scanned with one window (one kernel, which fuses with what reads it): beyond it the n operations per
# element of a window outweigh the blocked form's two windows of about sqrt(n), its intermediates and its launches.
# On CLANG (2 cores), a million float32 elements in rows of 16, 64 or 256 take 17, 104 and 236 ms windowed against 2.3,
# 3.8 and 8.2 ms blocked, while 4 rows of 16 or 32 take 37 and 34 us windowed against 50 and 58 us blocked: the
# crossover for large arrays is far below 256
BLOCKED_FROM = 256


@dataclass(frozen=True)
class Scan:
  """One cumulative operation: its numpy name, the reduce that folds a window, its identity (what the padding before
  the first element holds) and how a block's values combine with the scan of the blocks before it."""
  name: str
  op: Ops
  identity: int
  combine: Callable[[Expr, Expr], Expr]


CUMSUM = Scan("cumsum", Ops.ADD, 0, operator.add)
CUMPROD = Scan("cumprod", Ops.MUL, 1, operator.mul)


@implements(np.cumsum)
def cumsum(x: Expr, axis=None, dtype=None) -> Expr:
  """numpy.cumsum: the running sums along `axis` (None: of the flattened array)."""
  return _scan(CUMSUM, x, axis, dtype)


@implements(np.cumprod)
def cumprod(x: Expr, axis=None, dtype=None) -> Expr:
  """numpy.cumprod: the running products along `axis` (None: of the flattened array)."""
  return _scan(CUMPROD, x, axis, dtype)


def _scan(scan: Scan, x: Expr, axis, dtype) -> Expr:
  if not isinstance(x, Expr): _no_expr(scan.name, x)
  # numpy scans a 0-d array as a 1-d one: axis 0 and -1 are valid and the result has shape (1,)
  a = _axis(scan.name, axis, max(x.ndim, 1))
  if axis is None or x.ndim == 0: x, a = x.reshape(-1), 0
  n = x.shape[a]
  if not isinstance(n, int):
    raise InvalidASTError(f"{scan.name} over the symbolic axis {a} of {fmt_shape(x.shape)}: the window length is not "
                          "known when building")
  out = P.sum_dtype(x.dtype) if dtype is None else _dtype(dtype)
  if out == dtypes.bool:
    # numpy's bool add and multiply are or and and: a count (or product) of the truths, nonzero where any (all) hold
    return _scan_along(scan, _truth(x).cast(dtypes.int64), a, n).cast(dtypes.bool)
  acc = P.ACCUMULATE.get(out, out)
  # the elements take the result dtype first (numpy casts the input to `dtype`), then the accumulator's
  return _scan_along(scan, x.cast(out).cast(acc), a, n).cast(out)


def _axis(name: str, axis, ndim: int) -> int:
  """numpy's axis of a scan: None or one int (numpy's TypeError, a DTypeError, for anything else)."""
  if axis is None: return 0
  if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
    raise DTypeError(f"{name}: the axis is an int or None, got {type(axis).__name__} {axis!r}")
  return _axes(int(axis), ndim, name)[0]


def _scan_along(scan: Scan, v: Expr, a: int, n: int) -> Expr:
  """The inclusive scan of `v` (already in the accumulation dtype) along its axis `a` of length `n`."""
  return _windowed(scan, v, a, n) if n <= BLOCKED_FROM else _blocked(scan, v, a, n)


def _windowed(scan: Scan, v: Expr, a: int, n: int) -> Expr:
  """out[i] = the reduce of v[i - n + 1 .. i] along `a`, the positions before 0 holding the identity."""
  if n <= 1: return v  # one element is its own scan; an empty axis has nothing to scan (numpy: an empty result)
  return _pad_identity(scan, v, a, (n - 1, 0)).windows(a, n)._reduce(scan.op, -1, False)


def _pad_identity(scan: Scan, v: Expr, a: int, amount: tuple[int, int]) -> Expr:
  """`v` padded along `a` with the scan's identity. A pad is 0 outside; for a product a padded mask selects 1 there."""
  around = tuple(amount if i == a else (0, 0) for i in range(v.ndim))
  padded = v.pad(around)
  if scan.identity == 0: return padded
  inside = const(True, dtypes.bool, tuple(v.shape[a] if i == a else 1 for i in range(v.ndim))).pad(around)
  return where(inside, padded, scan.identity)


def _block_size(n: int) -> int:
  """A power of two near sqrt(n), at most BLOCKED_FROM: both windows (inside a block, over the blocks) stay short."""
  return min(BLOCKED_FROM, 1 << math.ceil(math.log2(n) / 2))


def _blocked(scan: Scan, v: Expr, a: int, n: int) -> Expr:
  """The scan of a long axis: `a` padded to nb blocks of `block` and reshaped to (nb, block); a windowed scan inside
  each block, combined with the exclusive scan of the block totals (the scan of the totals shifted by one block).
  The padding after the last element only reaches results past n, which are shrunk away, so a plain pad serves."""
  block = _block_size(n)
  nb = -(-n // block)
  shape = v.shape
  if nb * block != n: v = v.pad(tuple((0, nb * block - n) if i == a else (0, 0) for i in range(v.ndim)))
  blocks = v.reshape(shape[:a] + (nb, block) + shape[a + 1:])
  inner = _windowed(scan, blocks, a + 1, block)
  totals = inner.shrink(tuple((block - 1, block) if i == a + 1 else (0, s) for i, s in enumerate(inner.shape)))
  shifted = _pad_identity(scan, totals, a, (1, 0))
  shifted = shifted.shrink(tuple((0, nb) if i == a else (0, s) for i, s in enumerate(shifted.shape)))
  # the scan of the totals reduces over other axes than the scan inside the blocks: its own kernel, read back here
  before = _scan_along(scan, shifted, a, nb)
  out = scan.combine(inner, before).reshape(shape[:a] + (nb * block,) + shape[a + 1:])
  if nb * block == n: return out
  return out.shrink(tuple((0, n) if i == a else (0, s) for i, s in enumerate(out.shape)))
