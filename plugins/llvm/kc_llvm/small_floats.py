"""half, bfloat16 and the fp8s as LLVM holds them: as their bits (i16, i8), converted to and from float by internal
functions each kernel that uses them defines. LLVM's own `half` and `bfloat` conversions lower to library calls
(__extendhfsf2, __truncsfbf2, ...) on CPUs without the instructions, and a kernel loaded in-process has no compiler
runtime to resolve them; integer code runs everywhere. Arithmetic on these dtypes runs in float (the renderer's
extra_matcher rewrites it so), each result rounded back once, as numpy's half does.

Float to small float rounds to nearest even; past the largest finite value e4m3 becomes NaN, e5m2 and half inf.
A double is first rounded to float "to odd", so that the second rounding rounds as one would (double rounding).
Every helper is branch-free (selects), so the vectorizers can widen the loops that call it."""
from __future__ import annotations
import math, struct
from dataclasses import dataclass


@dataclass(frozen=True)
class SmallFloat:
  name: str           # the kc dtype's name, which names the helpers: @kc.<name>.to.f32, @kc.f32.to.<name>
  exp_bits: int
  man_bits: int
  max_value: float    # the largest finite value
  has_inf: bool       # an all-ones exponent is inf or NaN (half, e5m2); e4m3's only NaN is S.1111.111

  @property
  def width(self) -> int: return 1 + self.exp_bits + self.man_bits

  @property
  def bias(self) -> int: return (1 << (self.exp_bits - 1)) - 1


# the formats, as IEEE 754 and the OCP fp8 specification define them
FORMATS = {f.name: f for f in (SmallFloat("float16", 5, 10, 65504.0, True), SmallFloat("fp8e4m3", 4, 3, 448.0, False),
                               SmallFloat("fp8e5m2", 5, 2, 57344.0, True))}
BFLOAT16 = "bfloat16"


def _bits(x: float) -> int: return struct.unpack("<I", struct.pack("<f", x))[0]


def float_literal(x: float) -> str:
  """An LLVM float or double constant: the double's bits in hex, the one spelling LLVM takes for every value."""
  return f"0x{struct.unpack('<Q', struct.pack('<d', x))[0]:016X}"


def to_f32(name: str) -> str: return f"@kc.{name}.to.f32"
def from_f32(name: str) -> str: return f"@kc.f32.to.{name}"
ROUND_TO_ODD = "@kc.f64.to.f32.odd"


def _decode(f: SmallFloat) -> str:
  """bits -> float, exact: the sign moved to bit 31, the exponent rebiased, a subnormal as its mantissa times its
  quantum, NaN and inf kept (a NaN stays quiet)."""
  w, m = f.width, f.man_bits
  top = (1 << f.exp_bits) - 1
  sign = 1 << (w - 1)
  special = (f"%sp = icmp eq i32 %e, {top}" if f.has_inf else
             f"%ep = icmp eq i32 %e, {top}\n  %mp = icmp eq i32 %m, {(1 << m) - 1}\n  %sp = and i1 %ep, %mp")
  special_bits = ("%mnz = icmp ne i32 %m, 0\n  %q = select i1 %mnz, i32 4194304, i32 0\n  %sb0 = or i32 %s32, 2139095040\n"
                  "  %sb = or i32 %sb0, %q" if f.has_inf else "%sb = or i32 %s32, 2143289344")
  return f"""define internal float {to_f32(f.name)}(i{w} %b) alwaysinline {{
  %w = zext i{w} %b to i32
  %s = and i32 %w, {sign}
  %s32 = shl i32 %s, {32 - w}
  %e0 = lshr i32 %w, {m}
  %e = and i32 %e0, {top}
  %m = and i32 %w, {(1 << m) - 1}
  {special}
  {special_bits}
  %eb = add i32 %e, {127 - f.bias}
  %es = shl i32 %eb, 23
  %ms = shl i32 %m, {23 - m}
  %n0 = or i32 %s32, %es
  %n = or i32 %n0, %ms
  %nb = select i1 %sp, i32 %sb, i32 %n
  %nf = bitcast i32 %nb to float
  %mf = uitofp i32 %m to float
  %sv = fmul float %mf, {float_literal(2.0 ** (1 - f.bias - m))}
  %neg = icmp ne i32 %s, 0
  %svn = fneg float %sv
  %sub = select i1 %neg, float %svn, float %sv
  %isz = icmp eq i32 %e, 0
  %r = select i1 %isz, float %sub, float %nf
  ret float %r
}}"""


def _encode(f: SmallFloat) -> str:
  """float -> bits, rounding to nearest even: NaN and overflow first; a normal result rounds the float's bits on the
  dropped mantissa bits and rebiases the exponent (a carry into the exponent is right); a subnormal one rounds the
  whole mantissa shifted down to the subnormal quantum; below half the smallest subnormal is a signed zero."""
  w, m = f.width, f.man_bits
  drop, rebias, top = 23 - m, 127 - f.bias, (1 << f.exp_bits) - 1
  sign = 1 << (w - 1)
  # the float halfway from the largest finite value to the next binade step: at or past it (past it, where the
  # largest value's mantissa is even and so wins the tie) the value overflows
  mid = _bits(f.max_value + 2.0 ** (math.frexp(f.max_value)[1] - 1 - m) / 2)
  overflow_at = mid + 1 if (_bits(f.max_value) >> drop) & 1 == 0 else mid
  nan_code, overflow_code = ((top << m) | (1 << (m - 1)), top << m) if f.has_inf else (sign - 1, sign - 1)
  return f"""define internal i{w} {from_f32(f.name)}(float %f) alwaysinline {{
  %u = bitcast float %f to i32
  %sh = lshr i32 %u, {32 - w}
  %s = and i32 %sh, {sign}
  %a = and i32 %u, 2147483647
  %isnan = icmp ugt i32 %a, 2139095040
  %isovf = icmp uge i32 %a, {overflow_at}
  %ex = lshr i32 %a, 23
  %e = sub i32 %ex, 127
  %isnorm = icmp sge i32 %e, {1 - f.bias}
  %odd0 = lshr i32 %a, {drop}
  %odd = and i32 %odd0, 1
  %r0 = add i32 %a, {(1 << (drop - 1)) - 1}
  %r1 = add i32 %r0, %odd
  %r2 = lshr i32 %r1, {drop}
  %nv = sub i32 %r2, {rebias << m}
  %sh0 = sub i32 {24 - f.bias - m}, %e
  %big = icmp sgt i32 %sh0, 24
  %sh1 = select i1 %isnorm, i32 1, i32 %sh0
  %sc = select i1 %big, i32 25, i32 %sh1
  %mant0 = and i32 %a, 8388607
  %mant = or i32 %mant0, 8388608
  %n = lshr i32 %mant, %sc
  %mask = shl i32 1, %sc
  %maskm = sub i32 %mask, 1
  %rem = and i32 %mant, %maskm
  %scm1 = sub i32 %sc, 1
  %tie = shl i32 1, %scm1
  %gt = icmp ugt i32 %rem, %tie
  %eq = icmp eq i32 %rem, %tie
  %nodd = trunc i32 %n to i1
  %tieup = and i1 %eq, %nodd
  %up = or i1 %gt, %tieup
  %inc = zext i1 %up to i32
  %nn = add i32 %n, %inc
  %sv = select i1 %big, i32 0, i32 %nn
  %v1 = select i1 %isnorm, i32 %nv, i32 %sv
  %v2 = select i1 %isovf, i32 {overflow_code}, i32 %v1
  %v3 = select i1 %isnan, i32 {nan_code}, i32 %v2
  %res = or i32 %s, %v3
  %t = trunc i32 %res to i{w}
  ret i{w} %t
}}"""


# bfloat16 is float's top half: widening is a shift; narrowing rounds the dropped half to nearest even, and keeps a
# NaN a (quiet) NaN where rounding its payload away would make it inf
_BFLOAT16 = f"""define internal float {to_f32(BFLOAT16)}(i16 %b) alwaysinline {{
  %w = zext i16 %b to i32
  %u = shl i32 %w, 16
  %f = bitcast i32 %u to float
  ret float %f
}}
define internal i16 {from_f32(BFLOAT16)}(float %f) alwaysinline {{
  %u = bitcast float %f to i32
  %a = and i32 %u, 2147483647
  %isnan = icmp ugt i32 %a, 2139095040
  %hi = lshr i32 %u, 16
  %q = or i32 %hi, 64
  %odd = and i32 %hi, 1
  %r0 = add i32 %u, 32767
  %r1 = add i32 %r0, %odd
  %r = lshr i32 %r1, 16
  %v = select i1 %isnan, i32 %q, i32 %r
  %t = trunc i32 %v to i16
  ret i16 %t
}}"""

# the float next to a double whose last bit is odd where the conversion is inexact: d - (double)f is exact, and an
# inexact f with an even last bit moves one step toward d (f has d's sign, so a positive difference means a larger
# magnitude exactly when f is positive)
_ROUND_TO_ODD = f"""define internal float {ROUND_TO_ODD}(double %d) alwaysinline {{
  %f = fptrunc double %d to float
  %u = bitcast float %f to i32
  %fd = fpext float %f to double
  %e = fsub double %d, %fd
  %inexact = fcmp one double %e, 0.0
  %lsb = trunc i32 %u to i1
  %even = xor i1 %lsb, true
  %adj = and i1 %inexact, %even
  %epos = fcmp ogt double %e, 0.0
  %fpos = icmp sgt i32 %u, -1
  %away = icmp eq i1 %epos, %fpos
  %up = add i32 %u, 1
  %dn = sub i32 %u, 1
  %mv = select i1 %away, i32 %up, i32 %dn
  %r = select i1 %adj, i32 %mv, i32 %u
  %rf = bitcast i32 %r to float
  ret float %rf
}}"""


def helpers(names: set[str], round_to_odd: bool) -> list[str]:
  """The definitions of the conversions of the small floats `names` (kc dtype names), and of the round-to-odd step."""
  out = [_BFLOAT16] if BFLOAT16 in names else []
  out += [code for name in sorted(names) if name in FORMATS for code in (_decode(FORMATS[name]), _encode(FORMATS[name]))]
  return out + ([_ROUND_TO_ODD] if round_to_odd else [])
