"""How close a device's result must be to numpy's: the core's one table by dtype and op class (kc.testing.tolerance,
shared with kc fuzz and the BEAM search), per-case overrides, and the observed errors of every comparison (recorded in
the report whether the test passes or not).

The op classes (exact, arith, transcendental, reduce) are described there."""
from __future__ import annotations
from dataclasses import asdict, dataclass
from typing import Optional
import numpy as np
from kc import DType, dtypes
from kc.testing.tolerance import EXACT, KINDS, TABLE, Tolerance, tolerance

# the table's names stay this module's too: the suite and its users imported them from here before the table moved
__all__ = ["KINDS", "Tolerance", "EXACT", "TABLE", "tolerance", "Comparison", "compare"]


def _spacing(want: np.ndarray, dtype: DType) -> np.ndarray:
  """The size of one ulp of each expected value in `dtype`."""
  if dtype == dtypes.bfloat16: return np.spacing(np.abs(want).astype(np.float32)).astype(np.float64) * 65536.0
  if dtype in dtypes.fp8s:  # the quantum of want's binade; subnormals share the smallest normal binade's
    exp_bits, man_bits = dtypes.finfo(dtype)
    binade = np.maximum(np.frexp(np.abs(want).astype(np.float64))[1] - 1, 2 - 2 ** (exp_bits - 1))
    return np.ldexp(1.0, binade - man_bits)
  return np.spacing(np.abs(want).astype(dtype.np)).astype(np.float64)


@dataclass
class Comparison:
  """One output compared: the observed errors (over elements where both are numbers), the bound, and the verdict.
  mismatches counts elements outside the bound (a NaN on one side only counts, and makes the errors inf)."""
  output: int
  dtype: str
  tolerance: str
  max_abs: float
  max_rel: float
  max_ulp: Optional[float]
  mismatches: int
  elements: int
  ok: bool
  shape_error: Optional[str] = None

  def to_json(self) -> dict: return asdict(self)

  def describe(self) -> str:
    if self.shape_error: return f"output {self.output}: {self.shape_error}"
    ulp = f", max {self.max_ulp:.3g} ulp" if self.max_ulp is not None else ""
    return (f"output {self.output} ({self.dtype}): {self.mismatches} of {self.elements} elements outside {self.tolerance}; "
            f"max abs error {self.max_abs:.3g}, max rel error {self.max_rel:.3g}{ulp}")


def compare(output: int, got: np.ndarray, want: np.ndarray, dtype: DType, tol: Tolerance) -> Comparison:
  got, want = np.asarray(got), np.asarray(want)
  if got.shape != want.shape:
    return Comparison(output, dtype.name, tol.describe(), float("inf"), float("inf"), None, want.size, want.size, False,
                      f"shape {got.shape}, numpy says {want.shape}")
  g, w = got.astype(np.float64).reshape(-1), want.astype(np.float64).reshape(-1)
  if dtypes.is_int(dtype) and dtype.itemsize == 8:  # int64 values beyond 2**53 differ by less than float64 can hold
    diff = np.abs(got.reshape(-1).astype(object) - want.reshape(-1).astype(object)).astype(np.float64)
  else:
    with np.errstate(invalid="ignore"): diff = np.abs(g - w)
  both_nan = np.isnan(g) & np.isnan(w)
  same_inf = np.isinf(g) & (g == w)
  diff = np.where(both_nan | same_inf, 0.0, np.where(np.isnan(diff), np.inf, diff))
  with np.errstate(divide="ignore", invalid="ignore"):
    rel = np.where(diff == 0, 0.0, diff / np.maximum(np.abs(w), np.finfo(np.float64).tiny))
  ulps = None
  if dtypes.is_float(dtype):
    with np.errstate(invalid="ignore"): ulps = np.where(diff == 0, 0.0, diff / _spacing(np.where(np.isfinite(w), w, 0.0), dtype))
  if tol.exact: bad = diff != 0
  elif tol.ulp is not None: bad = diff > np.maximum(tol.ulp * _spacing(np.where(np.isfinite(w), w, 0.0), dtype), tol.atol)
  else: bad = diff > tol.atol + tol.rtol * np.abs(w)
  n = int(bad.sum())
  return Comparison(output, dtype.name, tol.describe(), float(diff.max(initial=0.0)), float(rel.max(initial=0.0)),
                    float(ulps.max(initial=0.0)) if ulps is not None else None, n, int(w.size), n == 0)
