"""The dtype x op matrix (every ALU op the builder reaches, for every dtype it applies to), casts between every pair
of dtypes, and bitcasts between every pair of dtypes of one size. One case per cell, so that a report names the
cell a backend gets wrong.

Inputs stay where C defines the result (no signed overflow in a cast, no division by zero, no INT_MIN / -1);
integer arithmetic that wraps is defined for kc (ints wrap), so products may wrap. Float references are computed
in float64 and rounded once to the output dtype."""
from __future__ import annotations
from typing import Callable
import numpy as np
from kc import DType, dtypes
from kc import ast as A
from kc.ir.codec import decode, encode, round_to
from .case import BASIC, HAND, Case, Setup, arg, nonzero, register, single

SHAPE = (5, 12)
FLOATS = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
INTS = (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64)


def short(dt: DType) -> str:
  return {"bool": "bool", "float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64",
          "fp8e4m3": "fp8e4m3", "fp8e5m2": "fp8e5m2"}.get(dt.name, dt.name.replace("int", "i"))


def as_dtype(x: np.ndarray, dt: DType) -> np.ndarray:
  """numpy values of `dt` (bfloat16: float32 values rounded to bfloat16; fp8: float32 values of the fp8 type, rounded
  once from float64 by kc's own conversion, which the tests check against ml_dtypes)."""
  return round_to(x, dt)


def values(rng, dt: DType, lo: float, hi: float, shape=SHAPE) -> np.ndarray:
  """Deterministic inputs of `dt` in [lo, hi] (clipped to the dtype's range)."""
  if dtypes.is_bool(dt): return rng.integers(0, 1, shape, endpoint=True).astype(bool)
  if dtypes.is_int(dt):
    lo, hi = max(int(lo), dtypes.min(dt)), min(int(hi), dtypes.max(dt))
    return rng.integers(lo, hi, shape, endpoint=True, dtype=dt.np)
  return as_dtype(rng.uniform(lo, hi, shape), dt)


def float_ref(fn: Callable, dt: DType) -> Callable:
  """fn computed in float64 and rounded once to dt."""
  return lambda *xs: as_dtype(fn(*(np.asarray(x, np.float64) for x in xs)), dt)


# ----------------------------------------------------------------------------------------------------- ALU ops

# op name -> (builder, reference): the reference runs on the inputs' numpy values (float64 for float dtypes)
BINARY = {
  "add": (lambda x, y: x + y, lambda a, b: a + b),
  "sub": (lambda x, y: x - y, lambda a, b: a - b),
  "mul": (lambda x, y: x * y, lambda a, b: a * b),
  "max": (lambda x, y: x.maximum(y), np.maximum),
  "cmplt": (lambda x, y: x < y, lambda a, b: a < b),
  "cmpne": (lambda x, y: x.ne(y), lambda a, b: a != b),
  "where": (lambda x, y: (x < y).where(x, y), lambda a, b: np.where(a < b, a, b)),
}
INT_ONLY = {
  "idiv": (lambda x, y: x // y, lambda a, b: a // b),  # kc.ast's // and % are numpy's (floor), not C's
  "mod": (lambda x, y: x % y, lambda a, b: a % b),
  "and": (lambda x, y: x & y, np.bitwise_and),
  "or": (lambda x, y: x | y, np.bitwise_or),
  "xor": (lambda x, y: x ^ y, np.bitwise_xor),
}
FLOAT_ONLY = {"fdiv": (lambda x, y: x / y, lambda a, b: a / b)}
UNARY = {"neg": (lambda x: -x, np.negative)}
# transcendental: builder, float64 reference, input range per float dtype
TRANSCENDENTAL = {
  "exp2": (lambda x: x.exp2(), np.exp2, {dtypes.float16: (-12, 12), dtypes.bfloat16: (-20, 20), dtypes.float32: (-60, 60),
                                          dtypes.float64: (-500, 500), dtypes.fp8e4m3: (-6, 6), dtypes.fp8e5m2: (-12, 12)}),
  "log2": (lambda x: x.log2(), np.log2, None),
  "sin": (lambda x: x.sin(), np.sin, {dtypes.float16: (-6, 6), dtypes.bfloat16: (-6, 6), dtypes.float32: (-20, 20),
                                      dtypes.float64: (-20, 20), dtypes.fp8e4m3: (-6, 6), dtypes.fp8e5m2: (-6, 6)}),
  "sqrt": (lambda x: x.sqrt(), np.sqrt, None),
  "recip": (lambda x: x.recip(), np.reciprocal, None),
}
POSITIVE = {"log2": (1e-3, 1e3), "sqrt": (0.0, 1e3), "recip": (0.25, 200.0)}


def _int_range(dt: DType) -> tuple[int, int]:
  # mul of int64 wraps in numpy and C alike; keep the other ops clear of the dtype's edges (sub of two mins overflows
  # in a signed type, which C leaves undefined)
  if dtypes.is_unsigned(dt): return 0, dtypes.max(dt)
  half = dtypes.max(dt) // 2
  return -half, half


def _binary_case(dt: DType, op: str, build, ref, specs: str) -> Case:
  def setup(rng) -> Setup:
    if dtypes.is_bool(dt): a, b = values(rng, dt, 0, 1), values(rng, dt, 0, 1)
    elif dtypes.is_int(dt):
      lo, hi = _int_range(dt)
      a, b = values(rng, dt, lo, hi), values(rng, dt, lo, hi)
      if op in ("idiv", "mod"):
        b = nonzero(values(rng, dt, -100 if not dtypes.is_unsigned(dt) else 1, 100))
        if not dtypes.is_unsigned(dt): a = np.where(a == dtypes.min(dt), dt.np.type(0), a)
    else:
      a, b = values(rng, dt, -4.0, 4.0), values(rng, dt, -4.0, 4.0)
      if op == "fdiv": b = as_dtype(np.where(np.abs(b.astype(np.float32)) < 0.25, 0.5, b.astype(np.float32)), dt)
    x, y = arg(1, SHAPE, dt), arg(2, SHAPE, dt)
    out = build(x, y)
    if dtypes.is_float(dt) and op not in ("cmplt", "cmpne"): want = float_ref(ref, dt)(a, b)
    else:
      with np.errstate(over="ignore"): want = ref(a, b)
    out_dt = dtypes.bool if op in ("cmplt", "cmpne") else dt
    want = want if out_dt == dtypes.bool else as_dtype(want, out_dt)
    return single(A.sink(A.store(0, out)), {1: a, 2: b}, {0: want})
  # max, compares and where select one of their inputs: exact in any dtype
  kind = "exact" if not dtypes.is_float(dt) or op in ("max", "cmplt", "cmpne", "where") else "arith"
  return Case(f"{op}_{short(dt)}", setup, kind, specs=specs, group="dtype x op")


def _unary_case(dt: DType, op: str, build, ref, kind: str, lo: float, hi: float, specs: str) -> Case:
  def setup(rng) -> Setup:
    a = values(rng, dt, lo, hi)
    want = float_ref(ref, dt)(a) if dtypes.is_float(dt) else ref(a)
    return single(A.sink(A.store(0, build(arg(1, SHAPE, dt)))), {1: a}, {0: as_dtype(want, dt)})
  return Case(f"{op}_{short(dt)}", setup, kind, specs=specs, group="dtype x op")


def _register_alu_matrix():
  for dt in dtypes.all:
    for op, (build, ref) in BINARY.items():
      if dtypes.is_bool(dt) and op not in ("cmpne", "where"): continue
      register(_binary_case(dt, op, build, ref, BASIC))
    if dtypes.is_int(dt) or dtypes.is_bool(dt):
      for op, (build, ref) in INT_ONLY.items():
        if dtypes.is_bool(dt) and op in ("idiv", "mod"): continue
        register(_binary_case(dt, op, build, ref, BASIC))
    if dtypes.is_float(dt):
      for op, (build, ref) in FLOAT_ONLY.items(): register(_binary_case(dt, op, build, ref, BASIC))
      for op, (build, ref, ranges) in TRANSCENDENTAL.items():
        lo, hi = POSITIVE[op] if ranges is None else ranges[dt]
        register(_unary_case(dt, op, build, ref, "transcendental", lo, hi, BASIC))
    if not dtypes.is_bool(dt):
      lo, hi = (0, 200) if dtypes.is_unsigned(dt) else (-100, 100)
      register(_unary_case(dt, "neg", UNARY["neg"][0], UNARY["neg"][1], "exact", lo, hi, BASIC))


# ----------------------------------------------------------------------------------------------------- casts

def _cast_inputs(rng, src: DType, dst: DType) -> np.ndarray:
  """Values of `src` whose conversion to `dst` C defines: inside dst's range (non-negative for an unsigned dst),
  with fractions where src is a float (so float -> int truncation is exercised)."""
  if dtypes.is_bool(src): return values(rng, src, 0, 1)
  lo = 0 if dtypes.is_unsigned(dst) or dtypes.is_bool(dst) else -100
  hi = 100
  if dtypes.is_bool(dst) and not dtypes.is_float(src): lo, hi = (-3, 3) if not dtypes.is_unsigned(src) else (0, 3)
  if dtypes.is_float(src):
    x = rng.uniform(lo, hi, SHAPE)
    x[0, :3] = (0.0, 0.5 if lo >= 0 else -0.5, 1.0)  # zero, a fraction that truncates to zero, one
    return as_dtype(x, src)
  return values(rng, src, lo, hi)


def _cast_ref(a: np.ndarray, src: DType, dst: DType) -> np.ndarray:
  if dtypes.is_bool(dst): return a != 0
  if dtypes.is_float(src) and dtypes.is_int(dst): return np.trunc(a.astype(np.float64)).astype(dst.np)
  if dtypes.is_float(dst): return as_dtype(a.astype(np.float64), dst)
  return a.astype(dst.np)


def _cast_case(src: DType, dst: DType) -> Case:
  def setup(rng) -> Setup:
    a = _cast_inputs(rng, src, dst)
    return single(A.sink(A.store(0, arg(1, SHAPE, src).cast(dst))), {1: a}, {0: _cast_ref(a, src, dst)})
  return Case(f"cast_{short(src)}_to_{short(dst)}", setup, "exact", specs=HAND, group="casts")


# ----------------------------------------------------------------------------------------------------- bitcasts

def _bits(rng, dt: DType) -> np.ndarray:
  """Random values of `dt` whose bit patterns, read as any float of the same size, are finite and normal (no NaN:
  hardware may quiet a signalling NaN as it moves it)."""
  nbits = dt.itemsize * 8
  exp_bits = {16: 5, 32: 8, 64: 11}.get(nbits)
  raw = rng.integers(0, 2**min(nbits, 63), SHAPE, dtype=np.uint64)
  if exp_bits is not None:  # keep every float view's exponent away from all-ones and zero: bfloat16 (8 exponent bits)
    # and float16 (5) share 16 bits, so clear the top exponent bit of both layouts and set a low one
    top = nbits - 2
    raw &= ~np.uint64(1 << top)
    raw |= np.uint64(1 << (top - 4 if nbits == 16 else top - 1))
  if nbits == 8: raw &= ~np.uint64(0x40)  # both fp8 layouts: the exponent's top bit clear, so never inf or NaN
  u = raw.astype({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dt.itemsize])
  return decode(u, dt)


def _as_bits(a: np.ndarray, dt: DType) -> np.ndarray:
  return encode(a, dt).view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dt.itemsize])


def _from_bits(bits: np.ndarray, dt: DType) -> np.ndarray: return decode(bits, dt)


def _bitcast_case(src: DType, dst: DType) -> Case:
  def setup(rng) -> Setup:
    a = _bits(rng, src)
    want = _from_bits(_as_bits(a, src), dst)
    return single(A.sink(A.store(0, arg(1, SHAPE, src).bitcast(dst))), {1: a}, {0: want})
  return Case(f"bitcast_{short(src)}_to_{short(dst)}", setup, "exact", specs=HAND, group="bitcasts")


def _register_conversions():
  for src in dtypes.all:
    for dst in dtypes.all:
      if src != dst: register(_cast_case(src, dst))
  for src in dtypes.all:
    for dst in dtypes.all:
      if src != dst and src.itemsize == dst.itemsize and not dtypes.is_bool(src) and not dtypes.is_bool(dst): register(_bitcast_case(src, dst))


_register_alu_matrix()
_register_conversions()
