import itertools, pickle
import numpy as np
import pytest
import kc
from kc import dtypes, DType, DTypeError
from kc.ir.dtype import least_upper_dtype, least_upper_float, truncate, PtrDType, ImageDType

NUMPY_DTYPES = [d for d in dtypes.all if d.np is not None]


def test_contract_names_and_aliases():
  for name in ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "bfloat16", "float32", "float64"]:
    dt = getattr(kc.dtypes, name)
    assert isinstance(dt, DType) and dt.name == name and dt.count == 1
  assert dtypes.half is dtypes.float16 and dtypes.float is dtypes.float32 and dtypes.double is dtypes.float64


@pytest.mark.parametrize("dt", NUMPY_DTYPES, ids=lambda d: d.name)
def test_itemsize_range_and_numpy_mapping(dt):
  npdt = dt.np
  assert dt.itemsize == npdt.itemsize
  assert dtypes.from_numpy(npdt) is dt
  if dt == dtypes.bool: assert (dt.min, dt.max) == (False, True)
  elif dtypes.is_int(dt): assert (dt.min, dt.max) == (np.iinfo(npdt).min, np.iinfo(npdt).max)
  else: assert dt.min == -np.inf and dt.max == np.inf


def test_bfloat16_has_no_numpy_type():
  assert dtypes.bfloat16.np is None and dtypes.bfloat16.itemsize == 2


def test_fp8_types_are_one_byte_floats_without_numpy_type():
  for name, alias in (("fp8e4m3", "float8_e4m3fn"), ("fp8e5m2", "float8_e5m2")):
    dt = getattr(dtypes, name)
    assert getattr(dtypes, alias) is dt and dt.name == name and dt.np is None and dt.itemsize == 1 and dtypes.is_float(dt)
    assert pickle.loads(pickle.dumps(dt.vec(4))) is dt.vec(4)
  assert truncate(dtypes.fp8e4m3, 1.0 + 2**-4) == 1.0 and truncate(dtypes.fp8e4m3, 1.0 + 3 * 2**-4) == 1.25  # ties to even
  assert truncate(dtypes.fp8e5m2, 2.0**-17) == 0.0 and truncate(dtypes.fp8e5m2, 3 * 2.0**-17) == 2.0**-15  # subnormals


def test_from_numpy_rejects_unsupported():
  with pytest.raises(DTypeError, match="complex128"): dtypes.from_numpy(np.complex128)
  with pytest.raises(DTypeError): dtypes.from_numpy("not a dtype")


def test_vectors_and_pointers_are_interned():
  f4 = dtypes.float32.vec(4)
  assert f4 is dtypes.float32.vec(4) and f4.count == 4 and f4.itemsize == 16 and f4.scalar() is dtypes.float32
  assert dtypes.float32.vec(1) is dtypes.float32
  p = dtypes.float32.ptr()
  assert isinstance(p, PtrDType) and p is dtypes.float32.ptr() and p.base is dtypes.float32 and not p.local
  lp = dtypes.half.ptr(local=True)
  assert lp.local and lp is not dtypes.half.ptr() and lp.base is dtypes.half
  assert pickle.loads(pickle.dumps(f4)) is f4 and pickle.loads(pickle.dumps(lp)) is lp
  with pytest.raises(DTypeError): f4.vec(2)
  with pytest.raises(DTypeError): dtypes.float32.vec(0)
  with pytest.raises(DTypeError): p.ptr()


def test_image_dtypes():
  img = dtypes.imagef((8, 16, 4))
  assert isinstance(img, ImageDType) and img.shape == (8, 16, 4) and img.base is dtypes.float32 and dtypes.is_float(img)
  assert dtypes.imageh((8, 16, 4)).base is dtypes.half and img is dtypes.imagef((8, 16, 4))
  with pytest.raises(DTypeError, match="height, width, 4"): dtypes.imagef((8, 16))


@pytest.mark.parametrize("a,b", list(itertools.product(NUMPY_DTYPES, repeat=2)), ids=lambda d: d.name)
def test_promotion_matches_numpy(a, b):
  assert least_upper_dtype(a, b).np == np.promote_types(a.np, b.np)


def test_promotion_with_bfloat16_and_many():
  assert least_upper_dtype(dtypes.bfloat16, dtypes.float16) is dtypes.float32
  assert least_upper_dtype(dtypes.int8, dtypes.bfloat16) is dtypes.bfloat16
  assert least_upper_dtype(dtypes.bool, dtypes.uint8, dtypes.int8) is dtypes.int16
  assert least_upper_float(dtypes.int32) is dtypes.float32 and least_upper_float(dtypes.half) is dtypes.half
  with pytest.raises(DTypeError): least_upper_dtype()


def test_truncate_wraps_ints_and_rounds_floats():
  assert truncate(dtypes.uint8, 300) == 44 and truncate(dtypes.int8, 200) == -56 and truncate(dtypes.int32, 2**31) == -2**31
  assert truncate(dtypes.float16, 1 / 3) == float(np.float16(1 / 3))
  assert truncate(dtypes.float32, 1 / 3) == float(np.float32(1 / 3))
  assert truncate(dtypes.float32, 1e40) == float("inf")
  assert truncate(dtypes.bfloat16, 1.0 + 2**-9) == 1.0  # below half an ulp of bfloat16 (2**-7)
  assert truncate(dtypes.bfloat16, 1.0 + 3 * 2**-9) == 1.0 + 2**-7


def test_as_const_and_from_py():
  assert dtypes.as_const(3.7, dtypes.int32) == 3 and dtypes.as_const(1, dtypes.float32) == 1.0
  assert type(dtypes.as_const(1, dtypes.float32)) is float and dtypes.as_const(2, dtypes.bool) is True
  with pytest.raises(DTypeError): dtypes.as_const(float("inf"), dtypes.int32)
  assert dtypes.from_py(True) is dtypes.bool and dtypes.from_py(1) is dtypes.int32 and dtypes.from_py(1.0) is dtypes.float32
