"""numpy's arange as a kc.ast expression: values computed in the kernel, no buffer.

The index 0..n-1 is a POSITION leaf: the offset of each element in a contiguous (n,) view. Movement (reshape, pad,
expand, permute, windows) moves its view as it moves a load's, and the kernel computes the offset from its loop
indices as it computes a load's address: an arange broadcast along an axis is that axis's loop index."""
from __future__ import annotations
import builtins, math
from kc.errors import InvalidASTError
from kc.ir.dtype import dtypes
from kc.ast.builder import Expr, const, position, _dtype


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
  index = position(n)
  if all_int and not dtypes.is_float(dt): return (index * step + start).astype(dt)
  compute = dt if dtypes.is_float(dt) else dtypes.float64
  return (index.astype(compute) * step + start).astype(dt)
