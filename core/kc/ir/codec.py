"""Float values <-> the bits a device holds them in: the one codec of the emulator, BEAM's check, kc fuzz and the
conformance suite.

numpy has no bfloat16 and no fp8: kc computes them in float32 holding values exact in their type, and hands a device
their raw bits (bfloat16 as uint16, fp8 as uint8). `round_to` rounds values to a type once (round to nearest even,
NaN stays NaN, past the range inf, or NaN for e4m3, which has no inf), `encode` gives a type's storage, `decode`
reads raw storage (any view of the same bytes) back as values. The conversions of each type (bf16_bits, round_bf16,
float_to_fp8, ...) live in kc.ir.dtype, whose constant folding rounds with them below this module; this module picks
the one a dtype needs."""
from __future__ import annotations
import numpy as np
from kc.errors import DTypeError
from kc.ir.dtype import DType, bf16_bits, bf16_values, dtypes, float_to_fp8, fp8_to_float32, round_bf16, round_fp8


def value_np(dt: DType) -> np.dtype:
  """The numpy dtype `dt`'s values are held in: float32 for bfloat16 and fp8, the others as themselves."""
  s = dt.scalar()
  if s == dtypes.bfloat16 or s in dtypes.fp8s: return np.dtype(np.float32)
  if s.np is None: raise DTypeError(f"{dt} has no values to hold: a buffer's type is a number type or bool")
  return np.dtype(s.np)


def storage_np(dt: DType) -> np.dtype:
  """The numpy dtype of `dt`'s storage: bfloat16 as uint16, fp8 as uint8, the others as their values."""
  s = dt.scalar()
  if s == dtypes.bfloat16: return np.dtype(np.uint16)
  if s in dtypes.fp8s: return np.dtype(np.uint8)
  return value_np(s)


def round_to(x, dt: DType) -> np.ndarray:
  """Values (float32, or float64: fp8 rounds it once) as the values `dt` holds: float32 for bfloat16 and fp8."""
  s = dt.scalar()
  # np.asarray: the bit tricks below are ufuncs, which give a numpy scalar, not an array, for a 0-d input
  if s == dtypes.bfloat16: return np.asarray(round_bf16(x))
  if s in dtypes.fp8s: return np.asarray(round_fp8(x, s))
  return np.asarray(x).astype(value_np(s))


def encode(x, dt: DType) -> np.ndarray:
  """Values as `dt`'s storage: exact for values `dt` holds (a float of more precision rounds to nearest even)."""
  s = dt.scalar()
  if s == dtypes.bfloat16: return np.asarray(bf16_bits(x))
  if s in dtypes.fp8s: return np.asarray(float_to_fp8(x, s))  # an array for a 0-d input too (kc.run takes no scalar)
  return np.asarray(x, dtype=value_np(s))


def decode(raw, dt: DType) -> np.ndarray:
  """Raw storage of `dt` (its own dtype, or any view of the same bytes) as values: float32 for bfloat16 and fp8."""
  s, raw = dt.scalar(), np.asarray(raw)
  bits = raw if raw.dtype == storage_np(s) else raw.view(storage_np(s))
  if s == dtypes.bfloat16: return np.asarray(bf16_values(bits))
  if s in dtypes.fp8s: return np.asarray(fp8_to_float32(bits, s))
  return bits
