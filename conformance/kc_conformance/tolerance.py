"""How close a device's result must be to numpy's, by dtype and by the kind of op that produced it.

`exact` kinds (integer and bool arithmetic, movement, casts, bitcasts, max) must match bit for bit. Float
arithmetic allows the reassociation a backend may do; transcendentals allow a few ulp of the backend's math
library (or kc's polynomial rewrites); reductions allow summation order to differ."""
from __future__ import annotations
import numpy as np
from kc import DType, dtypes

KINDS = ("exact", "arith", "transcendental", "reduce")

# (rtol, atol) per float dtype and kind
_FLOAT = {
  dtypes.float64: {"arith": (1e-12, 1e-12), "transcendental": (1e-12, 1e-12), "reduce": (1e-10, 1e-10)},
  dtypes.float32: {"arith": (1e-6, 1e-6), "transcendental": (4e-6, 1e-6), "reduce": (2e-5, 2e-5)},
  dtypes.float16: {"arith": (2e-3, 2e-3), "transcendental": (4e-3, 2e-3), "reduce": (1e-2, 1e-2)},
  dtypes.bfloat16: {"arith": (1.6e-2, 1e-2), "transcendental": (3e-2, 1e-2), "reduce": (5e-2, 5e-2)},
}


def tolerance(dtype: DType, kind: str) -> tuple[float, float]:
  """(rtol, atol) for an output of `dtype` computed by ops of `kind`; (0, 0) means exact."""
  if kind not in KINDS: raise ValueError(f"unknown tolerance kind {kind!r}: one of {KINDS}")
  if kind == "exact" or not dtypes.is_float(dtype): return (0.0, 0.0)
  return _FLOAT[dtype.scalar()][kind]


def assert_close(got: np.ndarray, want: np.ndarray, dtype: DType, kind: str, what: str = ""):
  rtol, atol = tolerance(dtype, kind)
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape, f"{what}: shape {got.shape}, numpy says {want.shape}"
  if rtol == 0 and atol == 0:
    np.testing.assert_array_equal(got, want, err_msg=f"{what}: must match numpy exactly ({dtype.name}, {kind})")
  else:
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True,
                               err_msg=f"{what}: {dtype.name} {kind} tolerance rtol={rtol} atol={atol}")
