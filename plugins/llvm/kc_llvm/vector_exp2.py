"""exp2 of a float32 vector in LLVM IR, for the vector widths the renderer declares. llvm.exp2 on a vector is split
into one C library call per lane, a tenth of the speed of the arithmetic around it (exp-heavy kernels: softmax);
this computes all lanes at once, with the same method and accuracy as CLANG's vector exp2:

  2^x = 2^n * 2^f, n = x rounded to an integer (adding and subtracting 1.5 * 2^23 rounds a float to nearest even),
  f = x - n in [-1/2, 1/2], 2^f by its Taylor polynomial of degree 7 in f (the terms (ln 2)^k / k!; truncation below
  2^-27, within 2 ulp with the rounding of Horner's steps), 2^n as two factors built from exponent bits so that
  results down to the smallest subnormal round once. x is clamped to [-150, 128] first (2^-150 rounds to 0, 2^128
  is inf) and NaN passes through. Every step is a plain IEEE operation: nothing is fused or reassociated."""
from __future__ import annotations
import math, struct
from kc_llvm.small_floats import float_literal

# (ln 2)^k / k!, k = 7 .. 1, each rounded to float32
_TAYLOR = [struct.unpack("<f", struct.pack("<f", math.log(2) ** k / math.factorial(k)))[0] for k in range(7, 0, -1)]


def name(lanes: int) -> str: return f"@kc.exp2.v{lanes}f32"


def definition(lanes: int) -> str:
  """The internal function `name(lanes)`: <lanes x float> -> <lanes x float>."""
  f, i = f"<{lanes} x float>", f"<{lanes} x i32>"
  splat_f = lambda v: "<" + ", ".join([f"float {float_literal(v)}"] * lanes) + ">"  # noqa: E731
  splat_i = lambda v: "<" + ", ".join([f"i32 {v}"] * lanes) + ">"  # noqa: E731
  lines = [f"define internal {f} {name(lanes)}({f} %x) alwaysinline {{",
           f"  %big = fcmp ogt {f} %x, {splat_f(128.0)}",
           f"  %small = fcmp olt {f} %x, {splat_f(-150.0)}",
           f"  %nan = fcmp uno {f} %x, %x",
           f"  %c0 = select <{lanes} x i1> %big, {f} {splat_f(128.0)}, {f} %x",
           f"  %c1 = select <{lanes} x i1> %small, {f} {splat_f(-150.0)}, {f} %c0",
           f"  %c = select <{lanes} x i1> %nan, {f} zeroinitializer, {f} %c1",
           f"  %t = fadd {f} %c, {splat_f(12582912.0)}",
           f"  %n = fsub {f} %t, {splat_f(12582912.0)}",
           f"  %f = fsub {f} %c, %n"]
  p = splat_f(_TAYLOR[0])
  for k, coeff in enumerate([*_TAYLOR[1:], 1.0]):  # Horner: p = p*f + c
    lines += [f"  %m{k} = fmul {f} {p}, %f", f"  %p{k} = fadd {f} %m{k}, {splat_f(coeff)}"]
    p = f"%p{k}"
  lines += [f"  %e = fptosi {f} %n to {i}",
            f"  %a = ashr {i} %e, {splat_i(1)}",
            f"  %b = sub {i} %e, %a",
            f"  %ab = add {i} %a, {splat_i(127)}",
            f"  %as = shl {i} %ab, {splat_i(23)}",
            f"  %fa = bitcast {i} %as to {f}",
            f"  %bb = add {i} %b, {splat_i(127)}",
            f"  %bs = shl {i} %bb, {splat_i(23)}",
            f"  %fb = bitcast {i} %bs to {f}",
            f"  %r0 = fmul {f} {p}, %fa",
            f"  %r = fmul {f} %r0, %fb",
            f"  %out = select <{lanes} x i1> %nan, {f} %x, {f} %r",
            f"  ret {f} %out", "}"]
  return "\n".join(lines)
