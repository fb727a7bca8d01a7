"""The value model: the numpy function of each value UOp (ALU ops with C's rules, casts, bitcasts, constants,
vectors and their elements), over arrays of lanes. Types numpy lacks are computed in float32 and rounded."""
from __future__ import annotations
from typing import Callable
import numpy as np
from kc.ir.codec import decode, encode, round_to, storage_np, value_np
from kc.ir.dtype import DType, dtypes
from kc.ir.uop import GroupOp, Ops, UOp
from kc.emu.errors import UnsupportedOpError


# the types numpy lacks, computed in float32 and rounded to their precision after every op that produces one
# (kc.ir.codec.round_to: bfloat16 goes through float32 first, fp8 rounds a float64 once)
_IN_FLOAT32 = frozenset({dtypes.bfloat16, *dtypes.fp8s})


def _fix(dt: DType, fn: Callable) -> Callable:
  """`fn` with its result held in `dt` exactly: the numpy type, and bfloat16 / fp8 rounding."""
  vnp = value_np(dt)
  if dt.scalar() in _IN_FLOAT32: return lambda *a: round_to(np.asarray(fn(*a), dtype=np.float32), dt)
  return lambda *a: np.asarray(fn(*a)).astype(vnp, copy=False)


def _c_idiv(a, b):
  # C truncates toward zero; a - fmod(a, b) is an exact multiple of b, so floor division of it is exact
  return (a - np.fmod(a, b)) // np.where(b == 0, 1, b) * (b != 0)


def _shift(fn):
  return lambda a, b: fn(a, np.asarray(b).astype(np.asarray(a).dtype))


def _neg(a):
  a = np.asarray(a)
  return np.logical_not(a) if a.dtype == np.bool_ else np.negative(a)


def _where(c, a, b):
  c = np.asarray(c)
  if np.ndim(a) == 2 or np.ndim(b) == 2: c = c[..., None] if c.ndim < 2 else c  # a scalar condition picks whole vectors
  return np.where(c, a, b)


# MAX: a NaN in either operand wins, as kc's rewrite of MAX for the renderers that do not spell it defines it
_ALU: dict[Ops, Callable] = {
  Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.MAX: np.maximum, Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal,
  Ops.AND: np.bitwise_and, Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor, Ops.SHL: _shift(np.left_shift),
  Ops.SHR: _shift(np.right_shift), Ops.FDIV: np.divide, Ops.POW: np.power, Ops.NEG: _neg, Ops.RECIP: np.reciprocal,
  Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin, Ops.SQRT: np.sqrt, Ops.WHERE: _where,
  Ops.MULACC: lambda a, b, c: np.add(np.multiply(a, b), c),
}


def alu_function(op: Ops, dt: DType, src_dt: DType) -> Callable:
  """The numpy function of an ALU UOp of result dtype `dt` whose (first) operand has dtype `src_dt`."""
  is_int, is_bool = dtypes.is_int(dt), dtypes.is_bool(dt)
  # x // 0 and x % 0 are 0 for ints (numpy's answer, which every backend renders), MIN // -1 wraps to MIN
  if op is Ops.IDIV: fn = (lambda a, b: a // np.where(b == 0, 1, b) * (b != 0)) if dtypes.is_unsigned(dt) else _c_idiv
  elif op is Ops.MOD: fn = np.fmod  # C: the remainder has the dividend's sign; np.fmod gives 0 for a 0 divisor
  elif op is Ops.SUB: fn = np.bitwise_xor if is_bool else np.subtract  # bool - bool, read back as bool, is xor
  elif op in _ALU: fn = _ALU[op]
  else: raise UnsupportedOpError(f"EMU does not know the ALU op {op.name}")
  if op in GroupOp.Comparison:
    if src_dt.scalar() in _IN_FLOAT32: return fn  # compared as the float32 values they are
    return lambda a, b: np.asarray(fn(a, b))
  if op in (Ops.IDIV, Ops.MOD) and not is_int: raise UnsupportedOpError(f"EMU runs {op.name} on ints only, got {dt}")
  return _fix(dt, fn)


def cast_function(src: DType, dt: DType) -> Callable:
  """A value conversion with C's rules: floats to ints truncate, anything to bool is `!= 0`."""
  if dt.scalar() in _IN_FLOAT32: return lambda x: round_to(x, dt)
  vnp = value_np(dt)
  return lambda x: np.asarray(x).astype(vnp)


def bitcast_function(src: DType, dt: DType) -> Callable:
  """Reinterpretation of the bits; the lane counts may differ (float -> half2) when the sizes match."""
  if src.itemsize != dt.itemsize: raise UnsupportedOpError(f"BITCAST from {src} to {dt} changes the size")
  def bitcast(x):
    bits = encode(x, src)
    if src.count == 1: bits = bits[..., None]
    out = np.ascontiguousarray(bits).view(storage_np(dt))
    if dt.count == 1: out = out[..., 0]
    elif out.ndim == 1: out = out[None]
    return decode(out, dt)
  return bitcast


def const_value(u: UOp) -> np.ndarray:
  v = np.asarray(u.arg, dtype=np.float64 if isinstance(u.arg, float) else None)
  v = round_to(v, u.dtype) if u.dtype.scalar() in _IN_FLOAT32 else v.astype(value_np(u.dtype))
  return np.full((1, u.dtype.count), v) if u.dtype.count > 1 else v


def vectorize(*xs):
  out = np.stack(np.broadcast_arrays(*xs), axis=-1)
  return out[None] if out.ndim == 1 else out


def gep_function(lanes: tuple) -> Callable:
  """A GEP: one lane (several lanes at once are a SHUFFLE)."""
  (lane,) = lanes
  return lambda x: np.asarray(x)[..., lane]


def shuffle_function(lanes: tuple) -> Callable:
  """A SHUFFLE: the lanes of its one vector, or of its two vectors' concatenation (lanes last, as every vector here)."""
  taken = list(lanes)
  def shuffle(*xs):
    whole = np.asarray(xs[0]) if len(xs) == 1 else np.concatenate(np.broadcast_arrays(*map(np.asarray, xs)), axis=-1)
    return whole[..., taken]
  return shuffle
