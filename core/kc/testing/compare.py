"""The one comparison of a result with its reference: the conformance suite (a device against numpy), kc fuzz (kc
against numpy) and BEAM's check (a candidate against the hand-coded kernel) all judge outputs here, with a bound from
the one table (kc.testing.tolerance).

An element matches when both sides are NaN, both the same inf, or equal (-0.0 equals 0.0, as numpy's == says);
otherwise it passes only when both are numbers within the bound: a bound relative to an infinite answer would let
anything pass. Integers and bools compare exactly, int64 and uint64 past 2**53 included. The observed errors (largest
absolute, relative and ulp error, a one-sided NaN or inf counting as an infinite error) are kept whatever the verdict,
for the conformance report."""
from __future__ import annotations
from dataclasses import dataclass
from typing import Any, Optional
import numpy as np
from kc.ir.codec import value_np
from kc.ir.dtype import DType, dtypes
from kc.testing.tolerance import Tolerance


def spacing(values, dtype: DType) -> np.ndarray:
  """One ulp of the float type `dtype` at each finite value, as float64: the quantum of the value's binade, where
  subnormals and zero share the smallest normal binade's. One rule for every float type, bfloat16 and fp8 included,
  read from its exponent and mantissa bits (np.spacing knows neither, and gives inf at a type's largest value)."""
  exp_bits, man_bits = dtypes.finfo(dtype)
  magnitude = np.abs(np.asarray(values, dtype=np.float64))
  smallest_normal = 2 - 2 ** (exp_bits - 1)
  binade = np.where(magnitude == 0, smallest_normal, np.frexp(magnitude)[1] - 1)
  return np.ldexp(1.0, np.maximum(binade, smallest_normal) - man_bits)


@dataclass
class Comparison:
  """One output compared: the observed errors, the bound, how many elements are outside it, and the verdict.
  `worst` is the index of the element furthest outside the bound (`got` and `want` its two values), None when all
  pass; `shape_error` says why the two could not be compared element by element."""
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
  worst: Optional[tuple[int, ...]] = None
  got: Any = None
  want: Any = None

  def to_json(self) -> dict:
    """The fields of the conformance report's comparison (report.schema.json): the errors, not the worst element."""
    return {k: v for k, v in vars(self).items() if k not in ("worst", "got", "want")}

  def describe(self) -> str:
    if self.shape_error: return f"output {self.output}: {self.shape_error}"
    worst = f"; worst at {self.worst}: {self.got!r}, expected {self.want!r}" if self.worst is not None else ""
    ulp = f", max {self.max_ulp:.3g} ulp" if self.max_ulp is not None else ""
    return (f"output {self.output} ({self.dtype}): {self.mismatches} of {self.elements} elements outside "
            f"{self.tolerance}{worst}; max abs error {self.max_abs:.3g}, max rel error {self.max_rel:.3g}{ulp}")


def _matched_and_diff(got: np.ndarray, want: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Which elements match outright, and |got - want| as float64 (0 where matched, inf where a side is NaN)."""
  if got.dtype.kind in "biu" and want.dtype.kind in "biu":
    wide = max(got.dtype.itemsize, want.dtype.itemsize) == 8  # past 2**53 float64 would merge neighbours
    g, w = (got.astype(object), want.astype(object)) if wide else (got.astype(np.int64), want.astype(np.int64))
    return got == want, np.abs(g - w).astype(np.float64)
  g, w = got.astype(np.float64), want.astype(np.float64)
  with np.errstate(invalid="ignore"):
    matched = (np.isnan(g) & np.isnan(w)) | (g == w)
    diff = np.abs(g - w)
  return matched, np.where(matched, 0.0, np.where(np.isnan(diff), np.inf, diff))


def _limit(want: np.ndarray, dtype: DType, tol: Tolerance) -> np.ndarray:
  """The largest |got - want| the bound allows at each finite expected value."""
  if tol.exact: return np.zeros(want.shape)
  if tol.ulp is not None: return np.maximum(tol.ulp * spacing(want, dtype), tol.atol)
  return tol.atol + tol.rtol * np.abs(want)


def _plain(x) -> Any:
  """A numpy scalar as a Python value."""
  return x.item() if hasattr(x, "item") else x


def compare(output: int, got, want, dtype: DType, tol: Tolerance) -> Comparison:
  """Output `output` (`got`, values of `dtype` as kc.ir.codec.decode gives them: bfloat16 and fp8 as float32) against
  its reference `want` (any numpy type holding the expected values), judged by `tol`. A `got` of another shape or
  numpy type is a mismatch of every element."""
  got, want = np.asarray(got), np.asarray(want)
  if got.shape != want.shape or got.dtype != value_np(dtype):
    why = f"{got.dtype} values of shape {got.shape}, expected {value_np(dtype)} values of shape {want.shape}"
    inf = float("inf")
    return Comparison(output, dtype.name, tol.describe(), inf, inf, None, want.size, want.size, False, why)
  matched, diff = _matched_and_diff(got, want)
  w = want.astype(np.float64)
  finite_w = np.where(np.isfinite(w), w, 0.0)
  with np.errstate(invalid="ignore"):
    numbers = np.isfinite(got.astype(np.float64)) & np.isfinite(w)
    bad = ~matched & ~(numbers & (diff <= _limit(finite_w, dtype, tol)))
  with np.errstate(divide="ignore", invalid="ignore"):
    rel = np.where(diff == 0, 0.0, diff / np.maximum(np.abs(w), np.finfo(np.float64).tiny))
    ulps = np.where(diff == 0, 0.0, diff / spacing(finite_w, dtype)) if dtypes.is_float(dtype) else None
  count = int(bad.sum())
  result = Comparison(output, dtype.name, tol.describe(), float(diff.max(initial=0.0)), float(rel.max(initial=0.0)),
                      float(ulps.max(initial=0.0)) if ulps is not None else None, count, int(want.size), count == 0)
  if count:
    worst = np.unravel_index(int(np.argmax(np.where(bad, diff, -1.0))), want.shape)
    result.worst, result.got, result.want = tuple(int(i) for i in worst), _plain(got[worst]), _plain(want[worst])
  return result
