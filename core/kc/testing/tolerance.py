"""How close a float result must be to a reference: one table by dtype and op class, shared by the conformance suite,
kc fuzz and the BEAM search's correctness check, so that all three hold kernels to the same numbers.

`exact` (integer and bool arithmetic, movement, casts, bitcasts, max, compares) must match bit for bit. `arith`
allows what a backend may legitimately do to float arithmetic (OpenCL allows 2.5 ulp for a float division, a fused
multiply-add rounds once instead of twice). `transcendental` is a ULP bound against a float64 reference rounded
once (OpenCL's own bounds are 3-4 ulp for exp2/log2/sin and 3 for sqrt), with an absolute floor for results near
zero, where a ulp is tiny but the argument reduction's error is not. `reduce` allows a different summation order."""
from __future__ import annotations
from dataclasses import dataclass, replace
from typing import Optional
from kc.errors import KcError
from kc.ir.dtype import DType, dtypes

KINDS = ("exact", "arith", "transcendental", "reduce")


@dataclass(frozen=True)
class Tolerance:
  """An element passes when |got - want| <= atol + rtol * |want|, or, with `ulp` set, when
  |got - want| <= max(ulp * spacing(want), atol)."""
  rtol: float = 0.0
  atol: float = 0.0
  ulp: Optional[float] = None

  @property
  def exact(self) -> bool: return self.rtol == 0 and self.atol == 0 and self.ulp is None

  def scaled(self, scale: float) -> Tolerance:
    """This bound with its absolute term times `scale`: the rounding error of a sum follows the magnitude of what it
    adds up, not of its result."""
    return replace(self, atol=self.atol * scale)

  def describe(self) -> str:
    if self.exact: return "exact"
    if self.ulp is not None: return f"{self.ulp:g} ulp (atol {self.atol:g})"
    return f"rtol {self.rtol:g} atol {self.atol:g}"


EXACT = Tolerance()
TABLE: dict[DType, dict[str, Tolerance]] = {
  dtypes.float64: {"arith": Tolerance(1e-14, 1e-14), "transcendental": Tolerance(ulp=4, atol=1e-15),
                   "reduce": Tolerance(1e-10, 1e-10)},
  dtypes.float32: {"arith": Tolerance(1e-6, 1e-6), "transcendental": Tolerance(ulp=4, atol=1e-6),
                   "reduce": Tolerance(2e-5, 2e-5)},
  dtypes.float16: {"arith": Tolerance(2e-3, 2e-3), "transcendental": Tolerance(ulp=2, atol=2e-3),
                   "reduce": Tolerance(1e-2, 1e-2)},
  dtypes.bfloat16: {"arith": Tolerance(1.6e-2, 1e-2), "transcendental": Tolerance(ulp=2, atol=1e-2),
                    "reduce": Tolerance(5e-2, 5e-2)},
  # fp8 is computed in float and rounded to fp8 after each op, the oracle rounds float64 once: the two roundings of
  # a device differ from the one of numpy by at most one fp8 ulp (atol: the smallest subnormal)
  dtypes.fp8e4m3: {"arith": Tolerance(ulp=1, atol=2.0 ** -9), "transcendental": Tolerance(ulp=1, atol=2.0 ** -9),
                   "reduce": Tolerance(0.25, 2.0 ** -6)},
  dtypes.fp8e5m2: {"arith": Tolerance(ulp=1, atol=2.0 ** -16), "transcendental": Tolerance(ulp=1, atol=2.0 ** -16),
                   "reduce": Tolerance(0.5, 2.0 ** -14)},
}


def tolerance(dtype: DType, kind: str, override: Optional[dict] = None) -> Tolerance:
  """The bound for an output of `dtype` computed by ops of `kind`; `override` ({dtype name: Tolerance}) wins."""
  if kind not in KINDS: raise KcError(f"unknown tolerance kind {kind!r}: one of {KINDS}")
  if override and dtype.name in override: return override[dtype.name]
  if kind == "exact" or not dtypes.is_float(dtype): return EXACT
  return TABLE[dtype.scalar()][kind]
