"""numpy 2's dtype rules for kc.ast, written down once: the builder reads these tables, docs/AST.md prints them,
and the tests compare every entry with the installed numpy.

Python scalars are *weak* (NEP 50): they adapt to the array they meet instead of promoting it, unless they are of a
higher kind (bool < int < float), in which case the result is the array's dtype promoted with the scalar kind's
default dtype (int64, float64). An int scalar must fit the dtype it ends up in (numpy raises OverflowError; kc raises
kc.DTypeError, which is a TypeError, naming the value and the dtype).

numpy's scalars (np.float32(2), np.int8(3), np.True_) are *strong*: numpy 2 promotes them as 0-d arrays of their
dtype (an np.float32 scalar times an int8 array is float32, an np.float64 one makes a float32 array float64), and
np.float64, a subclass of Python's float, is one of them."""
from __future__ import annotations
from typing import Union
import numpy as np
from kc.ir.dtype import DType, dtypes, least_upper_dtype
from kc.errors import DTypeError

Scalar = Union[bool, int, float, np.bool_, np.integer, np.floating]
NUMPY_SCALARS = (np.bool_, np.integer, np.floating)

# the kind of a dtype or a Python scalar: bool < int < float
BOOL, INT, FLOAT = 0, 1, 2
KIND_NAMES = {BOOL: "bool", INT: "int", FLOAT: "float"}
# the dtype a Python scalar takes when nothing else decides (numpy's defaults on a 64-bit platform)
SCALAR_DEFAULT: dict[int, DType] = {BOOL: dtypes.bool, INT: dtypes.int64, FLOAT: dtypes.float64}

# (kind of the array, kind of the Python scalar) -> the result dtype: "array" keeps the array's dtype, a DType is
# promoted with the array's dtype (least_upper_dtype). np.array([1], np.int16) * 2.5 is float64, not float32;
# np.array([True]) + 1 is int64; a float16 array stays float16 with any scalar.
WEAK_SCALAR: dict[tuple[int, int], Union[str, DType]] = {
  (BOOL, BOOL): "array", (BOOL, INT): dtypes.int64, (BOOL, FLOAT): dtypes.float64,
  (INT, BOOL): "array", (INT, INT): "array", (INT, FLOAT): dtypes.float64,
  (FLOAT, BOOL): "array", (FLOAT, INT): "array", (FLOAT, FLOAT): "array",
}

# The float dtype numpy's float-only unary ufuncs (exp, log, exp2, log2, sqrt, sin, cos) compute an int or bool array
# in: the smallest float that holds every value. Float dtypes keep their own.
UNARY_FLOAT: dict[DType, DType] = {
  dtypes.bool: dtypes.float16, dtypes.int8: dtypes.float16, dtypes.uint8: dtypes.float16,
  dtypes.int16: dtypes.float32, dtypes.uint16: dtypes.float32,
  dtypes.int32: dtypes.float64, dtypes.uint32: dtypes.float64, dtypes.int64: dtypes.float64, dtypes.uint64: dtypes.float64,
}
# true division, float powers, floor division by a float and mean make any int or bool operand float64
DIVIDE_FLOAT = dtypes.float64

# sum and prod widen small ints to the platform int (numpy's add.reduce on int8..int32 gives int64, uint8..uint32
# gives uint64, bool gives int64); floats keep their dtype
SUM_DTYPE: dict[DType, DType] = {dtypes.bool: dtypes.int64, **{d: dtypes.int64 for d in dtypes.sints},
                                 **{d: dtypes.uint64 for d in dtypes.uints}}
# half-precision sums accumulate in float32 (as numpy's pairwise half sum does) and are rounded back once; fp8 too
# (ml_dtypes' float8 sums do; added up in fp8, a sum would depend on the order of its terms at every step)
ACCUMULATE: dict[DType, DType] = {dtypes.float16: dtypes.float32, dtypes.bfloat16: dtypes.float32,
                                  dtypes.fp8e4m3: dtypes.float32, dtypes.fp8e5m2: dtypes.float32}


def kind(x) -> int:
  """The kind of a DType or a scalar."""
  if is_strong(x): x = numpy_scalar_dtype(x)
  if isinstance(x, DType): return BOOL if dtypes.is_bool(x) else FLOAT if dtypes.is_float(x) else INT
  return BOOL if isinstance(x, bool) else INT if isinstance(x, int) else FLOAT


def numpy_scalar_dtype(x) -> DType:
  """The kc dtype of a numpy scalar (a DTypeError for the few numpy has and kc lacks, such as longdouble)."""
  return dtypes.from_numpy(x.dtype)


def is_strong(x) -> bool:
  """A numpy scalar, or a 0-d array (numpy 2 promotes both by their dtype)."""
  return isinstance(x, NUMPY_SCALARS) or (isinstance(x, np.ndarray) and x.ndim == 0)


def fits(value: Scalar, dt: DType) -> bool:
  """A Python int fits an int dtype when it is in the dtype's range (bools and floats always convert; a numpy scalar
  was promoted with its own dtype, which the result holds)."""
  if isinstance(value, (bool, np.generic)) or not isinstance(value, int) or not dtypes.is_int(dt): return True
  return dtypes.min(dt) <= value <= dtypes.max(dt)


def check_fits(value: Scalar, dt: DType) -> None:
  if not fits(value, dt):
    raise DTypeError(f"Python integer {value} out of bounds for {dt.name} ({dtypes.min(dt)}..{dtypes.max(dt)}); "
                     f"cast the array first (numpy 2 raises OverflowError here)")


def result_dtype(arrays: list[DType], scalars: list[Scalar]) -> DType:
  """numpy 2's result_type for arrays of `arrays` dtypes mixed with `scalars`: Python's weak, numpy's strong (they
  count as arrays of their dtype). An int scalar that does not fit the result is a DTypeError."""
  arrays = list(arrays) + [numpy_scalar_dtype(s) for s in scalars if is_strong(s)]
  scalars = [s for s in scalars if not is_strong(s)]
  if not arrays:
    out = least_upper_dtype(*(SCALAR_DEFAULT[kind(s)] for s in scalars))
  else:
    out = least_upper_dtype(*arrays)
    for s in scalars:
      rule = WEAK_SCALAR[(kind(out), kind(s))]
      if rule != "array": out = least_upper_dtype(out, rule)
  for s in scalars: check_fits(s, out)
  return out


def unary_float(dt: DType) -> DType:
  """The dtype exp/log/sqrt/sin/cos compute `dt` in."""
  return dt if dtypes.is_float(dt) else UNARY_FLOAT[dt.scalar()]


def divide_float(dt: DType) -> DType:
  """The dtype true division, float powers and mean compute `dt` in."""
  return dt if dtypes.is_float(dt) else DIVIDE_FLOAT


def sum_dtype(dt: DType) -> DType:
  """The dtype numpy's sum and prod return for `dt`."""
  return SUM_DTYPE.get(dt.scalar(), dt)
