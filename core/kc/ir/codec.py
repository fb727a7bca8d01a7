"""Float values <-> the bits a device holds them in: the one codec of the emulator, BEAM's check, kc fuzz and the
conformance suite.

numpy has no bfloat16 and no fp8: kc computes them in float32 holding values exact in their type, and hands a device
their raw bits (bfloat16 as uint16, fp8 as uint8). `round_to` rounds values to a type once (round to nearest even,
NaN stays NaN, past the range inf, or NaN for e4m3, which has no inf), `encode` gives a type's storage, `decode`
reads raw storage (any view of the same bytes) back as values. The fp8 tables live in kc.ir.dtype, which constant
folding needs below this module; the scalar bfloat16 rounding of constant folding is kc.ir.dtype.truncate."""
from __future__ import annotations
import numpy as np
from kc.ir.dtype import DType, dtypes, float_to_fp8, fp8_to_float32, round_fp8


def bf16_bits(x) -> np.ndarray:
  """float32 values to bfloat16 bits, rounding to nearest even; NaNs stay (quiet) NaNs."""
  bits = np.asarray(x, dtype=np.float32).view(np.uint32)
  rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
  nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
  return np.where(nan, ((bits >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16), rounded)


def bf16_values(bits) -> np.ndarray:
  """bfloat16 bits to their float32 values: exact."""
  return (np.asarray(bits).astype(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def round_bf16(x) -> np.ndarray:
  """Values rounded to bfloat16 through float32 (as the C dialects' __kc_f2bf((float)x) does), as float32."""
  with np.errstate(over="ignore"): return bf16_values(bf16_bits(np.asarray(x).astype(np.float32)))


def storage_np(dt: DType) -> np.dtype:
  """The numpy dtype of `dt`'s storage: bfloat16 as uint16, fp8 as uint8, the others as themselves."""
  s = dt.scalar()
  if s == dtypes.bfloat16: return np.dtype(np.uint16)
  if s in dtypes.fp8s: return np.dtype(np.uint8)
  return np.dtype(s.np)


def round_to(x, dt: DType) -> np.ndarray:
  """Values (float32, or float64: fp8 rounds it once) as the values `dt` holds: float32 for bfloat16 and fp8."""
  s = dt.scalar()
  if s == dtypes.bfloat16: return round_bf16(x)
  if s in dtypes.fp8s: return round_fp8(x, s)
  return np.asarray(x).astype(s.np)


def encode(x, dt: DType) -> np.ndarray:
  """Values `dt` holds as its storage (exact: bfloat16 and fp8 values are rounded to their type already)."""
  s = dt.scalar()
  if s == dtypes.bfloat16: return bf16_bits(x)
  if s in dtypes.fp8s: return float_to_fp8(x, s)
  return np.asarray(x, dtype=s.np)


def decode(raw, dt: DType) -> np.ndarray:
  """Raw storage of `dt` (its own dtype, or any view of the same bytes) as values: float32 for bfloat16 and fp8."""
  s, raw = dt.scalar(), np.asarray(raw)
  bits = raw if raw.dtype == storage_np(s) else raw.view(storage_np(s))
  if s == dtypes.bfloat16: return bf16_values(bits)
  if s in dtypes.fp8s: return fp8_to_float32(bits, s)
  return bits
