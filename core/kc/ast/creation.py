"""numpy's arange as a kc.ast expression: values computed in the kernel, no buffer.

A kernel has no "index of this element" leaf, but a padded constant knows where its padding is: a (1,) constant of
value v padded to (2,) on the left is [0, v]. The index i < 2**B is the sum over its bits b of such a constant
2**b padded along an axis of its own, so B constants over (2,) * B axes, reshaped to 2**B and cut to n, are 0..n-1,
one kernel (argmax reads its indices the same way)."""
from __future__ import annotations
import builtins, math
from kc.errors import InvalidASTError
from kc.ir.dtype import dtypes
from kc.ast.builder import Expr, const, _dtype


def _index(n: int) -> Expr:
  """0, 1, ..., n-1 as int64."""
  bits = builtins.max(1, (n - 1).bit_length())
  ones = (1,) * bits
  index = None
  for b in range(bits):
    bit = const(2 ** (bits - 1 - b), dtypes.int64, ones).pad(tuple((1, 0) if i == b else (0, 0) for i in range(bits)))
    index = bit if index is None else index + bit
  assert index is not None
  return index.reshape(1 << bits)[:n]


def arange(start, stop=None, step=1, dtype=None) -> Expr:
  """numpy's arange: `start + i * step` for i in 0..ceil((stop - start) / step) - 1, int64 where every bound is an
  int (numpy's default), else float64, or `dtype`. Floats are `start + i * step` computed in `dtype` (numpy computes
  the same formula; it rounds its step once more, so the last bits of a float arange with an inexact step may
  differ). An empty range is a length-0 array, as numpy's."""
  if stop is None: start, stop = 0, start
  for v in (start, stop, step):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
      raise InvalidASTError(f"arange takes finite int or float bounds, got {v!r}")
  if step == 0: raise InvalidASTError("arange's step is 0 (numpy: Maximum allowed size exceeded)")
  all_int = all(isinstance(v, int) for v in (start, stop, step))
  dt = _dtype(dtype) if dtype is not None else dtypes.int64 if all_int else dtypes.float64
  n = builtins.max(0, math.ceil((stop - start) / step)) if not all_int else builtins.max(0, -((start - stop) // step))
  if n == 0: return const(0, dt, (0,))
  if dt == dtypes.bool: raise InvalidASTError("arange has no bool form (numpy: no arange loop for bool)")
  index = _index(n)
  if all_int and not dtypes.is_float(dt): return (index * step + start).astype(dt)
  compute = dt if dtypes.is_float(dt) else dtypes.float64
  return (index.astype(compute) * step + start).astype(dt)
