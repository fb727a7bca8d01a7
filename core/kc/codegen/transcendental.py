"""exp2, log2 and sin from polynomials and integer bit operations, for renderers that do not spell them.

float32 (and float16/bfloat16, computed in float32) and float64 each split the argument into a part handled
exactly with the float's bits (the exponent) and a small remainder handled by a polynomial:
  exp2(x) = 2^n * 2^f       n = round(x), |f| <= 1/2, 2^f by its Taylor series in f*ln2
  log2(x) = e + log2(m)     x = m * 2^e with m in [sqrt(1/2), sqrt(2)), log2(m) = 2*atanh((m-1)/(m+1)) / ln2
  sin(x)  = +-sin(r) or +-cos(r)   x = k*pi/2 + r, |r| <= pi/4, pi/2 split in three parts (Cody-Waite)
Accuracy: a few ulp for exp2 and log2 over their whole domain (inf, nan, 0 and subnormals included); sin is
a few ulp for |x| < 2^15 and degrades beyond, as the single-precision reduction loses the fraction of x*2/pi."""
from __future__ import annotations
import math
from fractions import Fraction
from kc.ir.dtype import DType, dtypes
from kc.ir.rewrite import UPat
from kc.ir.uop import Ops, UOp

# float layout: (int type, mantissa bits, exponent bias, exponent mask)
_LAYOUT = {dtypes.float32: (dtypes.int32, 23, 127, 0xFF), dtypes.float64: (dtypes.int64, 52, 1023, 0x7FF)}


def _c(like: UOp, v) -> UOp: return UOp.const(like.dtype, v)


def _horner(x: UOp, coeffs: list[float]) -> UOp:
  """coeffs[0] + x*(coeffs[1] + x*(...)), coefficients lowest degree first."""
  acc = _c(x, coeffs[-1])
  for c in reversed(coeffs[:-1]): acc = acc * x + c
  return acc


def _round_to_int(x: UOp, it: DType) -> UOp:
  """x rounded half away from zero, as an int (x within the int's range)."""
  return (x + x.lt(0.0).where(_c(x, -0.5), _c(x, 0.5))).cast(it)


def _pow2(n: UOp, ft: DType) -> UOp:
  """2^n for n in the float's normal exponent range, built from its bits."""
  it, mant, bias, _ = _LAYOUT[ft]
  return ((n + bias).cast(it) << mant).bitcast(ft)


def _is_nan(x: UOp) -> UOp: return x.ne(x)


def exp2(x: UOp) -> UOp:
  it, mant, bias, _ = _LAYOUT[x.dtype]
  lo, hi = -(bias + mant + 1), bias + 1  # below lo the result rounds to 0, at hi it is inf
  xc = x.lt(lo).where(_c(x, float(lo)), (_c(x, float(hi)).lt(x)).where(_c(x, float(hi)), x))
  n = _round_to_int(xc, it)
  f = xc - n.cast(x.dtype)
  terms = 8 if x.dtype == dtypes.float32 else 14
  poly = _horner(f, [math.log(2) ** k / math.factorial(k) for k in range(terms)])
  half = n // 2  # two factors keep each power of two a normal number (subnormal and overflowing results included)
  out = poly * _pow2(half, x.dtype) * _pow2(n - half, x.dtype)
  return _is_nan(x).where(x, out)


def log2(x: UOp) -> UOp:
  it, mant, bias, emask = _LAYOUT[x.dtype]
  tiny = 2.0 ** (1 - bias)
  scale_bits = 64 if x.dtype == dtypes.float32 else 512
  subnormal = x.lt(tiny)
  xs = subnormal.where(x * (2.0 ** scale_bits), x)
  bits = xs.bitcast(it)
  e = ((bits >> mant) & emask) - bias + subnormal.where(UOp.const(it, -scale_bits), UOp.const(it, 0))
  m = ((bits & ((1 << mant) - 1)) | (bias << mant)).bitcast(x.dtype)  # the mantissa as a number in [1, 2)
  big = _c(x, math.sqrt(2)).lt(m)
  m = big.where(m * 0.5, m)
  e = e + big.where(UOp.const(it, 1), UOp.const(it, 0))
  t = (m - 1.0) / (m + 1.0)
  terms = 6 if x.dtype == dtypes.float32 else 12
  ln_m = t * _horner(t * t, [2.0 / (2 * k + 1) for k in range(terms)])
  out = e.cast(x.dtype) + ln_m * (1 / math.log(2))
  out = x.lt(0.0).where(_c(x, math.nan), out)
  out = x.ne(0.0).where(out, _c(x, -math.inf))
  out = x.ne(math.inf).where(out, _c(x, math.inf))
  return _is_nan(x).where(x, out)


# pi/2 to 64 digits: math.pi/2 alone carries only the 53 bits a float64 reduction would need in its first part
_HALF_PI = Fraction("1.5707963267948966192313216916397514420985846996875529104874722961")


def _split_half_pi(ft: DType) -> tuple[float, float, float]:
  """pi/2 as three numbers whose products with small ints are exact in the float type (Cody-Waite)."""
  keep = 12 if ft == dtypes.float32 else 30
  def chop(v: Fraction) -> float:
    m, e = math.frexp(float(v))
    return math.ldexp(math.floor(m * 2 ** keep) / 2 ** keep, e)
  p1 = chop(_HALF_PI)
  p2 = chop(_HALF_PI - Fraction(p1))
  return p1, p2, float(_HALF_PI - Fraction(p1) - Fraction(p2))


def sin(x: UOp) -> UOp:
  it = _LAYOUT[x.dtype][0]
  finite = (x - x).eq(0.0)  # inf - inf and nan - nan are nan
  xf = finite.where(x, _c(x, 0.0))
  k = _round_to_int(xf * (2 / math.pi), it)
  kf = k.cast(x.dtype)
  p1, p2, p3 = _split_half_pi(x.dtype)
  r = ((xf - kf * p1) - kf * p2) - kf * p3
  r2 = r * r
  terms = 6 if x.dtype == dtypes.float32 else 10
  s = r * _horner(r2, [(-1) ** j / math.factorial(2 * j + 1) for j in range(terms)])
  c = _horner(r2, [(-1) ** j / math.factorial(2 * j) for j in range(terms)])
  q = k & 3
  val = (q & 1).ne(0).where(c, s)
  val = (q & 2).ne(0).where(-val, val)
  return finite.where(val, _c(x, math.nan))


def _in_float32(fxn):
  """half and bfloat16 go through float32 and back."""
  def rule(x: UOp) -> UOp:
    if x.dtype.scalar() in _LAYOUT: return fxn(x.src[0])
    return fxn(x.src[0].cast(dtypes.float32)).cast(x.dtype)
  return rule


_FALLBACKS = {Ops.EXP2: exp2, Ops.LOG2: log2, Ops.SIN: sin}


def transcendental_rules(spelled: set) -> list[tuple[UPat, object]]:
  """Rules replacing each of EXP2, LOG2, SIN the renderer does not spell (scalar float types)."""
  return [(UPat(op, dtype=dtypes.floats, name="x"), _scalar_only(_in_float32(fxn))) for op, fxn in _FALLBACKS.items() if op not in spelled]


def _scalar_only(rule):
  def apply(x: UOp):
    return rule(x) if x.dtype.count == 1 else None
  return apply
