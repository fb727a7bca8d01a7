"""The search's correctness check: a candidate's outputs against the hand-coded kernel's on the same inputs, with the
one comparison (kc.testing.compare) that the conformance suite and kc fuzz use too.

Integers and bools must match bit for bit. Floats may differ as a different summation order makes them differ:
the tolerance table's "reduce" bound, its absolute term scaled by the largest output magnitude (a sum's rounding
error follows the size of what it adds up, not of its result). Both sides NaN (or the same inf) is a match."""
from __future__ import annotations
from typing import Optional
import numpy as np
from kc.ir.codec import decode
from kc.ir.dtype import dtypes
from kc.search.timing import BufferInfo
from kc.testing.compare import compare
from kc.testing.tolerance import EXACT, tolerance


def mismatch(info: BufferInfo, got: np.ndarray, want: np.ndarray) -> Optional[str]:
  """None when output `info` of a candidate (`got`, raw bytes) matches the reference's (`want`), else what differs."""
  if got.shape != want.shape: return f"output {info.index}: {got.size} bytes, the reference has {want.size}"
  if np.array_equal(got, want): return None
  dt = info.dtype
  g, w = decode(got, dt), decode(want, dt)
  tol = EXACT
  if dtypes.is_float(dt):
    finite = np.abs(w[np.isfinite(w)].astype(np.float64))
    tol = tolerance(dt, "reduce").scaled(max(1.0, float(finite.max(initial=0.0))))
  result = compare(info.index, g, w, dt, tol)
  return None if result.ok else f"{result.describe()} (the reference is the hand-coded kernel)"
