"""kc.testing.compare: the one comparison of the conformance suite, kc fuzz and BEAM's check, for every float type
(bfloat16 and fp8 included, as their float32 values), integers and bools."""
import json
from pathlib import Path
import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from kc import dtypes
from kc.ir.codec import decode, round_to, value_np
from kc.testing.compare import compare, spacing
from kc.testing.tolerance import EXACT, Tolerance, tolerance

FLOATS = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64, dtypes.fp8e4m3, dtypes.fp8e5m2)
_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
SCHEMA = Path(__file__).resolve().parents[1] / "conformance" / "kc_conformance" / "report.schema.json"


def _value(dt, code: int) -> np.ndarray:
  """The value of `dt` whose bits are `code`, as the one-element array a device result decodes to."""
  return decode(np.array([code], _BITS[dt.itemsize]), dt)


@st.composite
def neighbours(draw, dt):
  """Two finite values of `dt` in one binade (or both subnormal or zero), k codes apart, so exactly k ulps apart."""
  exp_bits, man_bits = dtypes.finfo(dt)
  exponent = draw(st.integers(0, 2 ** exp_bits - 2))   # the all-ones exponent holds inf and NaN (e4m3: NaN only)
  mantissa = draw(st.integers(0, 2 ** man_bits - 1))
  k = draw(st.integers(0, min(12, 2 ** man_bits - 1 - mantissa)))
  code = (draw(st.integers(0, 1)) << (8 * dt.itemsize - 1)) | (exponent << man_bits) | mantissa
  return _value(dt, code), _value(dt, code + k), k


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
@settings(max_examples=150, deadline=None)
@given(data=st.data(), ulps=st.sampled_from([0.5, 1, 2, 3, 4, 8]))
def test_a_value_k_ulps_away_passes_iff_k_is_within_the_bound(dt, data, ulps):
  want, got, k = data.draw(neighbours(dt))
  for a, b in ((got, want), (want, got)):
    c = compare(0, a, b, dt, Tolerance(ulp=ulps))
    assert c.ok == (k <= ulps) and c.max_ulp == k, (a, b, k, c)
    assert c.mismatches == (0 if c.ok else 1) and (c.worst is None) == c.ok


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_one_ulp_is_the_spacing_of_the_type_numpy_or_ml_dtypes_would_give(dt):
  ml_dtypes = pytest.importorskip("ml_dtypes")
  np_type = {dtypes.bfloat16: ml_dtypes.bfloat16, dtypes.fp8e4m3: ml_dtypes.float8_e4m3fn,
             dtypes.fp8e5m2: ml_dtypes.float8_e5m2}.get(dt, dt.np)
  x = round_to(np.geomspace(1e-3, 200.0, 97), dt)
  x = np.concatenate([x, -x, [0.0]]).astype(value_np(dt))
  # one ulp of x is the step from |x| to the next value up (from 0: the smallest subnormal)
  largest = np.array(ml_dtypes.finfo(np_type).max, np_type)   # e4m3 has no inf to step towards
  up = np.nextafter(np.abs(x).astype(np_type), largest).astype(np.float64) - np.abs(x).astype(np.float64)
  assert np.array_equal(spacing(x, dt), up) and up[-1] == ml_dtypes.finfo(np_type).smallest_subnormal


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
@settings(max_examples=60, deadline=None)
@given(x=st.floats(-100, 100), rtol=st.floats(0, 1e6), atol=st.floats(0, 1e6), ulps=st.sampled_from([None, 1, 1e6]))
def test_nan_and_inf_match_only_themselves_whatever_the_bound(dt, x, rtol, atol, ulps):
  value, nan, inf = round_to(np.array([x]), dt).astype(value_np(dt)), np.array([np.nan]), np.array([np.inf])
  nan, inf = nan.astype(value_np(dt)), inf.astype(value_np(dt))
  loose = Tolerance(rtol, atol, ulps)
  for bound in (loose, EXACT):
    for same in (nan, inf, -inf, value): assert compare(0, same, same, dt, bound).ok
    for got, want in ((nan, value), (value, nan), (inf, value), (value, inf), (-inf, inf), (inf, -inf), (nan, inf),
                      (inf, nan)):
      c = compare(0, got, want, dt, bound)
      assert not c.ok and c.mismatches == 1 and c.max_abs == np.inf, (got, want, bound)


def test_zero_signs_match_and_the_worst_element_is_named():
  got, want = np.array([0.0, -0.0, 1.0, 5.0], np.float32), np.array([-0.0, 0.0, 1.5, 5.0], np.float32)
  c = compare(3, got, want, dtypes.float32, Tolerance(rtol=0.1))
  assert (c.mismatches, c.worst, c.got, c.want, c.max_abs) == (1, (2,), 1.0, 1.5, 0.5)
  assert c.describe().startswith("output 3 (float32): 1 of 4 elements outside rtol 0.1 atol 0; worst at (2,): 1.0, "
                                 "expected 1.5")


@pytest.mark.parametrize("dt", [dtypes.int64, dtypes.uint64, dtypes.int32, dtypes.int8, dtypes.bool],
                         ids=lambda d: d.name)
def test_integers_and_bools_compare_exactly(dt):
  info = np.iinfo(dt.np) if dt != dtypes.bool else None
  want = np.array([info.max - 1, info.max // 2, 0] if info else [True, False, True], dt.np)
  assert compare(0, want.copy(), want, dt, EXACT).ok
  got = want.copy()
  got[0] = info.max if info else False   # 2**63 - 1 and 2**63 - 2 are one float64 apart from nothing
  c = compare(0, got, want, dt, EXACT)
  assert not c.ok and c.mismatches == 1 and c.max_abs == 1.0 and c.worst == (0,)
  # a reference in a narrower integer type is compared by value
  assert compare(0, np.array([3, -1], np.int64), np.array([3, -1], np.int32), dtypes.int64, EXACT).ok


def test_a_result_of_another_shape_or_numpy_type_fails_every_element():
  want = np.ones((2, 3), np.float32)
  for got in (np.ones((3, 2), np.float32), np.ones((2, 3), np.float64), np.ones((2, 3), np.uint16)):
    c = compare(1, got, want, dtypes.float32, tolerance(dtypes.float32, "arith"))
    assert not c.ok and c.mismatches == 6 and c.shape_error and c.describe().startswith("output 1: ")
  # bfloat16 and fp8 results are their float32 values
  assert compare(0, np.ones(3, np.float32), np.ones(3, np.float32), dtypes.bfloat16, EXACT).ok
  assert not compare(0, np.ones(3, np.uint16), np.ones(3, np.float32), dtypes.bfloat16, EXACT).ok


def test_the_reduce_bound_scales_its_absolute_term():
  t = tolerance(dtypes.float32, "reduce")
  assert t.scaled(100.0) == Tolerance(t.rtol, t.atol * 100.0) and t.scaled(1.0) == t
  want, got = np.array([0.0], np.float32), np.array([50 * t.atol], np.float32)
  assert not compare(0, got, want, dtypes.float32, t).ok and compare(0, got, want, dtypes.float32, t.scaled(100.0)).ok


def test_a_comparison_is_what_the_conformance_report_schema_says():
  schema = json.loads(SCHEMA.read_text())
  comparison = {**schema["$defs"]["comparison"], "additionalProperties": False}
  for got in (np.array([1.0, np.nan], np.float32), np.array([1.0, 2.0], np.float32), np.ones(3, np.float32)):
    data = compare(0, got, np.array([1.0, 2.0], np.float32), dtypes.float32, Tolerance(ulp=4, atol=1e-6)).to_json()
    data = {k: (str(v) if isinstance(v, float) and not np.isfinite(v) else v) for k, v in data.items()}
    jsonschema.validate(data, comparison)
  assert "max_ulp" in data
  assert compare(0, np.ones(1, np.int32), np.ones(1, np.int32), dtypes.int32, EXACT).max_ulp is None
