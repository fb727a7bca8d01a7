"""CLANG's exp2 of float vectors (kc_exp2_<n>, renderer.VECTOR_FUNCTIONS) against numpy's float64 exp2 rounded once
to float32: within 2 ulp everywhere, exact at the special values, subnormal results included."""
import numpy as np
import pytest
import kc
from kc import Opt, OptOps, dtypes
from kc import ast as A
from kc_clang.renderer import ClangRenderer


def _exp2_kernel(n: int, width: int):
  x = A.arg(1, dtypes.float32, (n,))
  return kc.compile(A.sink(A.store(0, x.exp2())), "CLANG", [Opt(OptOps.UPCAST, 0, width)])


def _ulps(got: np.ndarray, want64: np.ndarray) -> np.ndarray:
  want = want64.astype(np.float32)
  return np.abs(got.astype(np.float64) - want.astype(np.float64)) / np.spacing(np.abs(want)).astype(np.float64)


@pytest.mark.parametrize("width", [w for w in ClangRenderer().vector_widths(dtypes.float32) if w >= 4])
def test_vector_exp2_is_vectorized_and_within_2_ulp(width):
  rng = np.random.default_rng(width)
  n = 1 << 18
  x = np.concatenate([np.linspace(-152, 130, n // 2, dtype=np.float32), rng.uniform(-1, 1, n // 4).astype(np.float32),
                      rng.uniform(-149.9, -125, n // 4).astype(np.float32)])  # the subnormal results
  ck = _exp2_kernel(x.size, width)
  assert f"kc_exp2_{width}(" in ck.program.src  # the vector function, not exp2f lane by lane
  out = np.empty_like(x)
  ck(out, x)
  want = np.exp2(x.astype(np.float64))
  with np.errstate(over="ignore"): want32 = want.astype(np.float32)
  finite = np.isfinite(want32) & (want32 != 0)
  assert _ulps(out[finite], want[finite]).max() <= 2
  assert np.array_equal(out[~finite], want32[~finite])  # inf above 128, 0 below -149.5


def test_vector_exp2_special_values():
  specials = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 128.0, 127.99999, -126.0, -149.0, -149.5, -150.0, -151.0,
                       200.0, -200.0, 1e30, -1e30, 0.5, -0.5, 1.0, 3.0] * 4, dtype=np.float32)[:64]
  width = max(ClangRenderer().vector_widths(dtypes.float32))
  ck = _exp2_kernel(specials.size, width)
  out = np.empty_like(specials)
  ck(out, specials)
  with np.errstate(over="ignore"):
    want = np.exp2(specials.astype(np.float64)).astype(np.float32)
  np.testing.assert_array_equal(out, want)  # NaN matches NaN; inf, 0 and the exact powers of two exactly
