"""The search's correctness check: a candidate's outputs against the hand-coded kernel's on the same inputs.

Integers and bools must match bit for bit. Floats may differ as a different summation order makes them differ:
the core tolerance table's "reduce" bound, its absolute term scaled by the largest output magnitude (a sum's
rounding error follows the size of what it adds up, not of its result). Both sides NaN (or the same inf) is a match."""
from __future__ import annotations
from typing import Optional
import numpy as np
from kc.ir.codec import decode
from kc.ir.dtype import DType, dtypes
from kc.testing.tolerance import tolerance
from kc.search.timing import BufferInfo


def float_values(raw: np.ndarray, dt: DType) -> np.ndarray:
  """The values of a float buffer's raw bytes, as float64 (bfloat16 and fp8 decoded from their bits)."""
  return decode(raw, dt).astype(np.float64)


def mismatch(info: BufferInfo, got: np.ndarray, want: np.ndarray) -> Optional[str]:
  """None when output `info` of a candidate (`got`, raw bytes) matches the reference's (`want`), else what differs."""
  if got.shape != want.shape: return f"output {info.index}: {got.size} bytes, the reference has {want.size}"
  if np.array_equal(got, want): return None
  dt = info.dtype
  if not dtypes.is_float(dt):
    bad = int((got.reshape(info.size, -1) != want.reshape(info.size, -1)).any(axis=1).sum())
    return f"output {info.index} ({dt.name}): {bad} of {info.size} elements differ (integers must match exactly)"
  g, w = float_values(got, dt), float_values(want, dt)
  tol = tolerance(dt, "reduce")
  finite = np.isfinite(w)
  scale = max(1.0, float(np.abs(w[finite]).max(initial=0.0)))
  with np.errstate(invalid="ignore"):
    same = (np.isnan(g) & np.isnan(w)) | (g == w)
    diff = np.abs(g - w)
    bad = ~same & ~(diff <= tol.atol * scale + tol.rtol * np.abs(w))
  if not bad.any(): return None
  worst = int(np.argmax(np.where(bad, np.nan_to_num(diff, nan=np.inf), -1.0)))
  return (f"output {info.index} ({dt.name}): {int(bad.sum())} of {info.size} elements outside {tol.describe()} (atol scaled by "
          f"{scale:.3g}); worst at element {worst}: {g[worst]!r}, the hand-coded kernel gives {w[worst]!r}")
