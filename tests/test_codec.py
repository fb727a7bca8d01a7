"""kc.ir.codec: float values <-> the bits bfloat16, fp8 and the numpy types are stored in, checked against ml_dtypes,
and its users: BEAM's check decodes raw bytes with it."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from kc import dtypes
from kc.ir.codec import decode, encode, round_to
from kc.ir.dtype import bf16_bits, round_bf16
from kc.search.check import mismatch
from kc.search.timing import BufferInfo

NARROW = {dtypes.bfloat16: ml_dtypes.bfloat16, dtypes.fp8e4m3: ml_dtypes.float8_e4m3fn, dtypes.fp8e5m2: ml_dtypes.float8_e5m2}
BITS = {dtypes.bfloat16: np.uint16, dtypes.fp8e4m3: np.uint8, dtypes.fp8e5m2: np.uint8}


@pytest.mark.parametrize("dt", NARROW, ids=lambda d: d.name)
def test_every_code_decodes_as_ml_dtypes_and_encodes_back(dt):
  codes = np.arange(1 << (8 * np.dtype(BITS[dt]).itemsize)).astype(BITS[dt])
  values = decode(codes, dt)
  assert values.dtype == np.float32
  assert np.array_equal(values, codes.view(NARROW[dt]).astype(np.float32), equal_nan=True)
  finite = np.isfinite(values)
  assert np.array_equal(encode(values[finite], dt), codes[finite])  # every value encodes to its own code
  assert np.isnan(decode(encode(values[~np.isnan(values)], dt), dt)).sum() == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=64))
def test_rounding_is_ml_dtypes_rounding_once(xs):
  x = np.array(xs, dtype=np.float32)
  for dt, md in NARROW.items():
    with np.errstate(over="ignore", invalid="ignore"): want = x.astype(np.float64).astype(md).astype(np.float32)
    assert np.array_equal(round_to(x, dt), want, equal_nan=True), dt
    assert np.array_equal(np.signbit(round_to(x, dt)[x == 0]), np.signbit(x[x == 0]))  # -0.0 stays -0.0


def test_bfloat16_nan_stays_nan_and_large_values_round_to_inf():
  # rounding the bits of a NaN with a full mantissa would carry into the sign: it stays a NaN
  nan_bits = np.array([0x7FFFFFFF, 0xFFFFFFFF], dtype=np.uint32).view(np.float32)
  assert np.isnan(round_bf16(nan_bits)).all() and (bf16_bits(nan_bits) & 0x7F80 == 0x7F80).all()
  assert np.isinf(round_bf16(np.array([3.4e38], np.float32))).all()


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float16, dtypes.int32, dtypes.uint8], ids=lambda d: d.name)
def test_numpy_types_round_trip_through_their_bytes(dt):
  x = np.arange(-3, 9).astype(dt.np)
  assert np.array_equal(decode(encode(x, dt).view(np.uint8), dt), x) and decode(x, dt).dtype == dt.np


@pytest.mark.parametrize("dt", [dtypes.fp8e5m2, dtypes.bfloat16], ids=lambda d: d.name)
def test_the_search_check_reads_infinities_and_nans_from_raw_bytes(dt):
  # the check's own fp8 decoder read e5m2's inf and NaN codes as finite numbers
  values = np.array([np.inf, -np.inf, np.nan, 1.5], np.float32)
  info = BufferInfo(0, dt, values.size, True, False)
  raw = encode(values, dt).view(np.uint8)
  assert mismatch(info, raw, raw.copy()) is None
  largest = decode(np.array([0x7B if dt == dtypes.fp8e5m2 else 0x7F7F], BITS[dt]), dt)[0]   # the largest finite value
  for i, other in enumerate([largest, np.inf, 1.5, np.nan]):   # each special against another value: a mismatch
    changed = values.copy()
    changed[i] = other
    assert "1 of 4 elements outside" in mismatch(info, encode(changed, dt).view(np.uint8), raw)


@pytest.mark.parametrize("dt", [*NARROW, dtypes.float16, dtypes.float32, dtypes.int8], ids=lambda d: d.name)
@pytest.mark.parametrize("shape", [(), (1,), (3, 2)])
def test_every_function_gives_an_array_of_the_input_shape(dt, shape):
  """A 0-d input came back as a numpy scalar from the bit tricks (ufuncs do that), which kc.run refuses as an input
  (kc fuzz --device LLVM --device OPENCL --seed 4416, case 5: an fp8 0-d input)."""
  x = np.full(shape, 1.5, np.float32)
  for got in (encode(x, dt), round_to(x, dt), decode(encode(x, dt), dt)):
    assert type(got) is np.ndarray and got.shape == shape


def test_a_0d_narrow_input_encoded_runs():
  import kc
  from kc import ast as A
  for dt in NARROW:
    bits = encode(np.asarray(np.float32(1.5)), dt)
    got = kc.run(A.sink(A.store(0, A.arg(1, dt, ()))), {1: bits}, device="EMU")[0]
    assert decode(got, dt) == 1.5
