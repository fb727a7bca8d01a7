"""The structural corpus: elementwise arithmetic, unary math, reductions, movement views, fused and multi-output
kernels, matmuls, and kernels larger than common launch limits.

Shapes stay small: EMU interprets every UOp, and a FULL case runs under some thirty optimization choices on each
device."""
from __future__ import annotations
from typing import Callable
import numpy as np
from kc import DType, Variable, dtypes
from kc import ast as A
from .case import BASIC, TENSOR, Case, Setup, arg, case, ints, nonzero, register, single, uniform
from kc.testing.tolerance import Tolerance
from kc.ir.codec import round_to
from kc.ir.dtype import round_bf16


# ----------------------------------------------------------------------------------------------------- elementwise

def _arith(rng, dt: DType) -> Setup:
  shape = (7, 13)
  a, b, c = (uniform(rng, shape, dt=dt.np) for _ in range(3))
  b = np.where(np.abs(b) < 0.25, dt.np.type(0.5), b).astype(dt.np)
  x, y, z = arg(1, shape, dt), arg(2, shape, dt), arg(3, shape, dt)
  out = (x < y).where(((x + y) * z - x / y).maximum(z), -z)
  want = np.where(a < b, np.maximum((a + b) * c - a / b, c), -c)
  return single(A.sink(A.store(0, out)), {1: a, 2: b, 3: c}, {0: want})


@case("arith", "elementwise")
def f32_arith(rng): return _arith(rng, dtypes.float32)


@case("arith", "elementwise")
def f16_arith(rng): return _arith(rng, dtypes.float16)


@case("arith", "elementwise")
def f64_arith(rng): return _arith(rng, dtypes.float64)


@case("exact", "elementwise")
def i32_arith(rng):
  shape = (9, 8)
  a, b = ints(rng, shape, -100, 100, np.int32), nonzero(ints(rng, shape, -9, 9, np.int32))
  x, y = arg(1, shape, dtypes.int32), arg(2, shape, dtypes.int32)
  out = (x * y + x // y - x % y).maximum(x ^ y) | (x & 7)
  want = np.maximum(a * b + a // b - a % b, a ^ b) | (a & 7)
  return single(A.sink(A.store(0, out)), {1: a, 2: b}, {0: want})


@case("exact", "elementwise")
def i8_wraparound(rng):
  shape = (6, 10)
  a, b = ints(rng, shape, -128, 127, np.int8), ints(rng, shape, -128, 127, np.int8)
  x, y = arg(1, shape, dtypes.int8), arg(2, shape, dtypes.int8)
  want = (a * b + a - b).astype(np.int8)  # numpy wraps int8 like C does after the conversion back
  return single(A.sink(A.store(0, x * y + x - y)), {1: a, 2: b}, {0: want})


@case("exact", "elementwise")
def u8_arith(rng):
  shape = (5, 12)
  a, b = ints(rng, shape, 0, 255, np.uint8), ints(rng, shape, 1, 255, np.uint8)
  x, y = arg(1, shape, dtypes.uint8), arg(2, shape, dtypes.uint8)
  out = (x + y).maximum(x // y) + x % y
  want = (np.maximum(a + b, a // b) + a % b).astype(np.uint8)
  return single(A.sink(A.store(0, out)), {1: a, 2: b}, {0: want})


@case("exact", "elementwise")
def i64_arith(rng):
  shape = (4, 9)
  a, b = ints(rng, shape, -2**40, 2**40, np.int64), nonzero(ints(rng, shape, -2**20, 2**20, np.int64))
  x, y = arg(1, shape, dtypes.int64), arg(2, shape, dtypes.int64)
  want = a * 3 + b + a // b - a % b
  return single(A.sink(A.store(0, x * 3 + y + x // y - x % y)), {1: a, 2: b}, {0: want})


@case("exact", "elementwise")
def casts(rng):
  shape = (6, 11)
  a = uniform(rng, shape, -300.0, 300.0)
  u = uniform(rng, shape, 0.0, 255.0)
  x, y = arg(1, shape), arg(2, shape)
  sink = A.sink(A.store(0, x.cast(dtypes.int32)), A.store(3, x.cast(dtypes.float16)), A.store(4, y.cast(dtypes.uint8)),
                A.store(5, (x.cast(dtypes.int32) * 7).cast(dtypes.float32)), A.store(6, (x.cast(dtypes.int8).cast(dtypes.bool))))
  want = {0: a.astype(np.int32), 3: a.astype(np.float16), 4: u.astype(np.uint8), 5: (a.astype(np.int32) * 7).astype(np.float32),
          6: a.astype(np.int32).astype(np.int8) != 0}
  return single(sink, {1: a, 2: u}, want)


@case("exact", "elementwise")
def bitcasts(rng):
  shape = (8, 9)
  a = uniform(rng, shape, -5.0, 5.0)
  x = arg(1, shape)
  absx = (x.bitcast(dtypes.int32) & 0x7FFFFFFF).bitcast(dtypes.float32)
  sink = A.sink(A.store(0, absx), A.store(2, x.bitcast(dtypes.uint32) // 8388608))  # the biased exponent and sign
  return single(sink, {1: a}, {0: np.abs(a), 2: a.view(np.uint32) // 8388608})


@case("arith", "elementwise")
def bf16_arith(rng):
  shape = (6, 8)
  a, b = round_bf16(uniform(rng, shape)), round_bf16(uniform(rng, shape))
  x, y = arg(1, shape, dtypes.bfloat16), arg(2, shape, dtypes.bfloat16)
  f = arg(3, shape)
  c = uniform(rng, shape)
  sink = A.sink(A.store(0, x * y + x), A.store(4, f.cast(dtypes.bfloat16)), A.store(5, (x + y).cast(dtypes.float32)))
  want = {0: round_bf16(round_bf16(a * b) + a), 4: round_bf16(c), 5: round_bf16(a + b)}
  return single(sink, {1: a, 2: b, 3: c}, want)


@case("exact", "elementwise")
def compare_to_bool(rng):
  shape = (7, 7)
  a, b = ints(rng, shape, -3, 3, np.int32), ints(rng, shape, -3, 3, np.int32)
  x, y = arg(1, shape, dtypes.int32), arg(2, shape, dtypes.int32)
  sink = A.sink(A.store(0, x < y), A.store(3, x.eq(y).where(x, y * 2)), A.store(4, (x >= y).logical_not()))
  want = {0: a < b, 3: np.where(a == b, a, b * 2), 4: ~(a >= b)}
  return single(sink, {1: a, 2: b}, want)


# ----------------------------------------------------------------------------------------------------- reductions

def _sum_axes(rng, axis) -> Setup:
  shape = (5, 6, 7)
  a = uniform(rng, shape)
  want = a.astype(np.float64).sum(axis=axis, keepdims=True).astype(np.float32)
  return single(A.sink(A.store(0, arg(1, shape).sum(axis))), {1: a}, {0: want})


@case("reduce", "reduce")
def sum_axis0(rng): return _sum_axes(rng, 0)


@case("reduce", "reduce")
def sum_axis1(rng): return _sum_axes(rng, 1)


@case("reduce", "reduce")
def sum_axis2(rng): return _sum_axes(rng, 2)


@case("reduce", "reduce")
def sum_axes02(rng): return _sum_axes(rng, (0, 2))


@case("reduce", "reduce")
def sum_to_scalar(rng):
  a = uniform(rng, (1000,))
  return single(A.sink(A.store(0, arg(1, 1000).sum())), {1: a}, {0: a.astype(np.float64).sum(keepdims=True).astype(np.float32)})


@case("exact", "reduce")
def max_rows(rng):
  a = uniform(rng, (13, 17))
  return single(A.sink(A.store(0, arg(1, (13, 17)).max(1))), {1: a}, {0: a.max(1, keepdims=True)})


@case("exact", "reduce")
def max_i32_cols(rng):
  a = ints(rng, (12, 5), -1000, 1000, np.int32)
  return single(A.sink(A.store(0, arg(1, (12, 5), dtypes.int32).max(0))), {1: a}, {0: a.max(0, keepdims=True)})


@case("exact", "reduce")
def sum_i32(rng):
  a = ints(rng, (8, 24), -1000, 1000, np.int32)
  return single(A.sink(A.store(0, arg(1, (8, 24), dtypes.int32).sum(1))), {1: a}, {0: a.sum(1, keepdims=True, dtype=np.int32)})


@case("exact", "reduce")
def int_div_mod_sum(rng):
  a = ints(rng, (8, 8), -50, 50, np.int32)
  x = arg(1, (8, 8), dtypes.int32)
  want = (a // np.int32(3) + a % np.int32(5)).sum(1, keepdims=True, dtype=np.int32)
  return single(A.sink(A.store(0, (x // 3 + x % 5).sum(1))), {1: a}, {0: want})


@case("reduce", "reduce")
def prod_rows(rng):
  a = uniform(rng, (4, 12), 0.8, 1.25)
  return single(A.sink(A.store(0, arg(1, (4, 12)).prod(1))), {1: a}, {0: a.astype(np.float64).prod(1, keepdims=True).astype(np.float32)})


@case("reduce", "reduce")
def sum_f16(rng):
  a = uniform(rng, (8, 16), 0.0, 1.0, np.float16)
  return single(A.sink(A.store(0, arg(1, (8, 16), dtypes.float16).sum(1))), {1: a},
                {0: a.astype(np.float64).sum(1, keepdims=True).astype(np.float16)})


@case("reduce", "reduce")
def symbolic_sum(rng):
  n = Variable("n", 1, 64)
  a = uniform(rng, (4, 37))
  return single(A.sink(A.store(0, arg(1, (4, n)).sum(1))), {1: a}, {0: a.astype(np.float64).sum(1, keepdims=True).astype(np.float32)}, n=37)


@case("arith", "reduce")
def symbolic_elementwise(rng):
  n = Variable("n", 1, 100)
  a = uniform(rng, (3, 29))
  return single(A.sink(A.store(0, arg(1, (3, n)) * 3.0 + 1.0)), {1: a}, {0: a * np.float32(3.0) + np.float32(1.0)}, n=29)


def _reduce_axes(rng, shape, axis, op: str) -> Setup:
  a = uniform(rng, shape)
  x = arg(1, shape)
  if op == "sum": out, want = x.sum(axis), a.astype(np.float64).sum(axis=axis, keepdims=True).astype(np.float32)
  else: out, want = x.max(axis), a.max(axis=axis, keepdims=True)
  return single(A.sink(A.store(0, out)), {1: a}, {0: want})


def _register_axis_positions():
  """sum and max over every axis position of a 3-d and a 4-d shape, and over all axes (a scalar)."""
  from .case import Case, register
  for shape in ((5, 6, 7), (2, 3, 4, 5)):
    for op in ("sum", "max"):
      axes = [(i,) for i in range(len(shape))] + [tuple(range(len(shape)))]
      for axis in axes:
        if shape == (5, 6, 7) and op == "sum" and len(axis) == 1: continue  # sum_axis0..2 above
        name = f"{op}_{len(shape)}d_axis{''.join(map(str, axis)) if len(axis) < len(shape) else '_all'}"
        register(Case(name, lambda rng, s=shape, ax=axis, o=op: _reduce_axes(rng, s, ax, o), "reduce" if op == "sum" else "exact",
                      group="reduce"))


_register_axis_positions()


@case("exact", "reduce")
def symbolic_max(rng):
  n = Variable("n", 1, 64)
  a = uniform(rng, (5, 23))
  return single(A.sink(A.store(0, arg(1, (5, n)).max(1))), {1: a}, {0: a.max(1, keepdims=True)}, n=23)


@case("reduce", "reduce")
def symbolic_rows_sum(rng):
  # the Variable is the kept axis: launch dims (or loop bounds) depend on it, the reduce does not
  m = Variable("m", 1, 32)
  a = uniform(rng, (11, 12))
  return single(A.sink(A.store(0, arg(1, (m, 12)).sum(1))), {1: a}, {0: a.astype(np.float64).sum(1, keepdims=True).astype(np.float32)}, m=11)


@case("reduce", "reduce")
def symbolic_to_scalar(rng):
  n = Variable("n", 1, 512)
  a = uniform(rng, (301,))
  return single(A.sink(A.store(0, arg(1, (n,)).sum())), {1: a}, {0: a.astype(np.float64).sum(keepdims=True).astype(np.float32)}, n=301)


# ----------------------------------------------------------------------------------------------------- movement

def _movement(rng, shape, build: Callable, ref: Callable) -> Setup:
  a = uniform(rng, shape)
  return single(A.sink(A.store(0, build(arg(1, shape)) + 1.0)), {1: a}, {0: ref(a) + np.float32(1.0)})


@case("exact", "movement")
def pad(rng): return _movement(rng, (5, 7), lambda x: x.pad(((1, 2), (0, 3))), lambda a: np.pad(a, ((1, 2), (0, 3))))


@case("exact", "movement")
def shrink(rng): return _movement(rng, (9, 11), lambda x: x.shrink(((2, 7), (1, 10))), lambda a: a[2:7, 1:10])


@case("exact", "movement")
def flip(rng): return _movement(rng, (6, 5), lambda x: x.flip((0, 1)), lambda a: a[::-1, ::-1])


@case("exact", "movement")
def permute(rng): return _movement(rng, (3, 4, 5), lambda x: x.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1))


@case("exact", "movement")
def expand(rng):
  a, b = uniform(rng, (5, 1)), uniform(rng, (1, 7))
  out = arg(1, (5, 1)).expand(5, 7) * arg(2, (1, 7)).expand(5, 7)
  return single(A.sink(A.store(0, out)), {1: a, 2: b}, {0: a * b})


@case("exact", "movement")
def movement_chain(rng):
  return _movement(rng, (4, 6), lambda x: x.pad(((1, 1), (2, 0))).flip((0,)).permute(1, 0).shrink(((1, 7), (0, 5))),
                   lambda a: np.pad(a, ((1, 1), (2, 0)))[::-1].T[1:7, 0:5])


@case("reduce", "movement")
def padded_reduce(rng):
  a = uniform(rng, (6, 10))
  out = arg(1, (6, 10)).pad(((0, 0), (2, 3))).flip((1,)).sum(1)
  return single(A.sink(A.store(0, out)), {1: a}, {0: a.astype(np.float64).sum(1, keepdims=True).astype(np.float32)})


@case("exact", "movement")
def expand_3d(rng): return _movement(rng, (4, 1, 6), lambda x: x.expand(4, 5, 6), lambda a: np.broadcast_to(a, (4, 5, 6)))


@case("exact", "movement")
def expand_permute_flip(rng):
  return _movement(rng, (3, 1, 5), lambda x: x.expand(3, 4, 5).permute(2, 0, 1).flip((1,)),
                   lambda a: np.broadcast_to(a, (3, 4, 5)).transpose(2, 0, 1)[:, ::-1])


@case("exact", "movement")
def pad_shrink_into_padding(rng):
  # the shrink keeps part of the padding: masked reads next to real ones
  return _movement(rng, (6, 6), lambda x: x.pad(((3, 3), (0, 2))).shrink(((1, 8), (2, 8))), lambda a: np.pad(a, ((3, 3), (0, 2)))[1:8, 2:8])


@case("exact", "movement")
def reshape_after_permute(rng):
  return _movement(rng, (4, 6), lambda x: x.permute(1, 0).reshape(3, 8), lambda a: a.T.reshape(3, 8))


@case("exact", "movement")
def flip_middle_axis(rng): return _movement(rng, (3, 7, 4), lambda x: x.flip((1,)), lambda a: a[:, ::-1])


# ----------------------------------------------------------------------------------------------------- several outputs, fused chains

@case("arith", "fused")
def two_outputs(rng):
  a, b = uniform(rng, (6, 8)), uniform(rng, (6, 8))
  x, y = arg(2, (6, 8)), arg(3, (6, 8))
  return single(A.sink(A.store(0, x + y), A.store(1, x * y - 1.0)), {2: a, 3: b}, {0: a + b, 1: a * b - np.float32(1.0)})


@case("reduce", "fused")
def sum_and_max(rng):
  a = uniform(rng, (7, 12))
  x = arg(2, (7, 12))
  want = {0: a.astype(np.float64).sum(1, keepdims=True).astype(np.float32), 1: a.max(1, keepdims=True)}
  return single(A.sink(A.store(0, x.sum(1)), A.store(1, x.max(1))), {2: a}, want)


@case("reduce", "fused")
def softmax_denominator(rng):
  a = uniform(rng, (8, 32), -4.0, 4.0)
  x = arg(1, (8, 32))
  out = (x - x.max(1, keepdims=True).expand(8, 32)).exp2().sum(1)
  want = np.exp2(a.astype(np.float64) - a.max(1, keepdims=True)).sum(1, keepdims=True).astype(np.float32)
  return single(A.sink(A.store(0, out)), {1: a}, {0: want})


@case("reduce", "fused")
def softmax(rng):
  a = uniform(rng, (6, 16), -4.0, 4.0)
  x = arg(1, (6, 16))
  e = (x - x.max(1, keepdims=True).expand(6, 16)).exp2()
  out = e * e.sum(1, keepdims=True).recip().expand(6, 16)
  ea = np.exp2(a.astype(np.float64) - a.max(1, keepdims=True))
  return single(A.sink(A.store(0, out)), {1: a}, {0: (ea / ea.sum(1, keepdims=True)).astype(np.float32)})


@case("reduce", "fused")
def variance(rng):
  a = uniform(rng, (8, 24))
  x = arg(1, (8, 24))
  mean = (x.sum(1, keepdims=True) * (1 / 24)).expand(8, 24)
  out = ((x - mean) * (x - mean)).sum(1) * (1 / 24)
  return single(A.sink(A.store(0, out)), {1: a}, {0: a.astype(np.float64).var(1, keepdims=True).astype(np.float32)})


# ----------------------------------------------------------------------------------------------------- matmul

def _matmul(rng, M, K, N, transposed=False, dt=dtypes.float32) -> Setup:
  a, b = uniform(rng, (K, M) if transposed else (M, K), dt=dt.np), uniform(rng, (K, N), dt=dt.np)
  x = arg(1, (K, M), dt).permute(1, 0) if transposed else arg(1, (M, K), dt)
  y = arg(2, (K, N), dt)
  if dt != dtypes.float32: x, y = x.cast(dtypes.float32), y.cast(dtypes.float32)
  out = (x.reshape(M, K, 1) * y.reshape(1, K, N)).sum(1)
  am = a.T if transposed else a
  want = (am.astype(np.float64) @ b.astype(np.float64)).astype(np.float32).reshape(M, 1, N)
  return single(A.sink(A.store(0, out)), {1: a, 2: b}, {0: want})


# a float32 tensor core may round its inputs to tf32 (10 mantissa bits, CUDA's m16n8k8): a product is then good to about
# 1e-3 relative, and a sum of K of them to about K * 1e-3 of its terms' size
TF32 = {"float32": Tolerance(1e-2, 1e-2)}


@case("reduce", "matmul", tensor_core=(dtypes.float32, dtypes.float32), tc_tolerance=TF32)
def matmul_square(rng): return _matmul(rng, 16, 16, 16)


@case("reduce", "matmul", tensor_core=(dtypes.float32, dtypes.float32), tc_tolerance=TF32)
def matmul_odd(rng): return _matmul(rng, 7, 9, 5)


@case("reduce", "matmul", tensor_core=(dtypes.float32, dtypes.float32), tc_tolerance=TF32)
def matmul_transposed(rng): return _matmul(rng, 8, 12, 6, transposed=True)


@case("reduce", "matmul", tensor_core=(dtypes.float16, dtypes.float32))
def matmul_half_in_float_acc(rng): return _matmul(rng, 8, 16, 8, dt=dtypes.float16)


@case("reduce", "matmul", tensor_core=(dtypes.float32, dtypes.float32), tc_tolerance=TF32)
def matmul_batched(rng):
  B, M, K, N = 3, 8, 6, 4
  a, b = uniform(rng, (B, M, K)), uniform(rng, (B, K, N))
  out = (arg(1, (B, M, K)).reshape(B, M, K, 1) * arg(2, (B, K, N)).reshape(B, 1, K, N)).sum(2)
  want = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32).reshape(B, M, 1, N)
  return single(A.sink(A.store(0, out)), {1: a, 2: b}, {0: want})


@case("reduce", "matmul", tensor_core=(dtypes.float32, dtypes.float32), tc_tolerance=TF32)
def matmul_both_transposed(rng):
  M, K, N = 6, 10, 4
  a, b = uniform(rng, (K, M)), uniform(rng, (N, K))
  out = (arg(1, (K, M)).permute(1, 0).reshape(M, K, 1) * arg(2, (N, K)).permute(1, 0).reshape(1, K, N)).sum(1)
  want = (a.T.astype(np.float64) @ b.T.astype(np.float64)).astype(np.float32).reshape(M, 1, N)
  return single(A.sink(A.store(0, out)), {1: a, 2: b}, {0: want})


@case("reduce", "matmul", tensor_core=(dtypes.float16, dtypes.float32))
def matmul_half_32(rng): return _matmul(rng, 32, 32, 32, dt=dtypes.float16)


# A tensor core for each (input, accumulator) pair a backend may declare: a square matmul of whole tensor-core tiles,
# an odd one (PADTO pads M, K and N) and a batched one, in the tensor core's own dtypes (numpy computes in float64
# from the same inputs, which the input dtype holds exactly).

def _tc_matmul(rng, B: int, M: int, K: int, N: int, dt_in: DType, dt_acc: DType) -> Setup:
  """B matmuls (M, K) @ (K, N) in dt_in accumulating in dt_acc; B == 1 is a plain 2-D matmul."""
  lead = (B,) if B > 1 else ()
  def data(shape):
    x = uniform(rng, lead + shape, -1.0, 1.0)
    return round_to(x, dt_in)  # bfloat16 and fp8 data as their float32 values
  a, b = data((M, K)), data((K, N))
  x, y = arg(1, lead + (M, K), dt_in).reshape(*lead, M, K, 1), arg(2, lead + (K, N), dt_in).reshape(*lead, 1, K, N)
  prod = x * y if dt_in == dt_acc else x.cast(dt_acc) * y.cast(dt_acc)
  want = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
  want = round_to(want, dt_acc).reshape(*lead, M, 1, N)
  return single(A.sink(A.store(0, prod.sum(len(lead) + 1, acc_dtype=dt_acc))), {1: a, 2: b}, {0: want})


# half accumulation rounds every partial sum to half: K = 32 of them stay within 2e-2 of the float64 answer
_HALF_ACC = {"float16": Tolerance(2e-2, 2e-2)}
_TAGS = {dtypes.float16: "f16", dtypes.bfloat16: "bf16", dtypes.float32: "f32", dtypes.fp8e4m3: "fp8e4m3", dtypes.fp8e5m2: "fp8e5m2"}
for _in, _acc, _tol in ((dtypes.float16, dtypes.float32, None), (dtypes.bfloat16, dtypes.float32, None), (dtypes.float16, dtypes.float16, _HALF_ACC),
                        (dtypes.fp8e4m3, dtypes.float32, None), (dtypes.fp8e5m2, dtypes.float32, None)):
  _tag = f"{_TAGS[_in]}_{_TAGS[_acc]}"
  for _suffix, _dims in (("tiles", (1, 16, 32, 16)), ("odd", (1, 9, 20, 7)), ("batched", (3, 16, 16, 8))):
    register(Case(f"tc_matmul_{_tag}_{_suffix}", lambda rng, d=_dims, i=_in, o=_acc: _tc_matmul(rng, *d, i, o), "reduce",
                  tensor_core=(_in, _acc), tolerance=_tol, group="matmul", specs=TENSOR))


# ----------------------------------------------------------------------------------------------------- past launch limits

@case("arith", "limits", specs=BASIC)
def wide_elementwise(rng):
  # 140000 elements: more than 65535, the largest global dim many GPUs (and EMU) take, so the lowering must split them
  a = uniform(rng, (2, 70000))
  return single(A.sink(A.store(0, arg(1, (2, 70000)) * 2.0 + 1.0)), {1: a}, {0: a * np.float32(2.0) + np.float32(1.0)})


@case("reduce", "limits", specs=BASIC)
def long_reduce(rng):
  a = uniform(rng, (3, 66000), 0.0, 1.0)
  return single(A.sink(A.store(0, arg(1, (3, 66000)).sum(1))), {1: a}, {0: a.astype(np.float64).sum(1, keepdims=True).astype(np.float32)})


@case("exact", "limits")
def deep_3d(rng):
  # a z extent of 96 is more than the 64 many GPUs allow in a work-group's third dim
  return _movement(rng, (4, 3, 96), lambda x: x.permute(0, 2, 1).reshape(4, 96, 3), lambda a: a.transpose(0, 2, 1))


# ----------------------------------------------------------------------------------------------------- images and vector accesses

def _image_copy(rng, read_image: bool) -> Setup:
  """out = 2 * in where `in` (read_image) or `out` is a (4, 8) image of float4 texels, read through a (4, 32) view."""
  from kc import Ops, ShapeTracker, UOp
  img = dtypes.imagef((4, 8, 4))
  st = ShapeTracker.from_shape((4, 32)).to_uop()
  src_dt, dst_dt = (img, dtypes.float32.ptr()) if read_image else (dtypes.float32.ptr(), img)
  val = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.DEFINE_GLOBAL, src_dt, (), 1), st)) * UOp.const(dtypes.float32, 2.0)
  sink = UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (UOp(Ops.DEFINE_GLOBAL, dst_dt, (), 0), st, val)),))
  a = uniform(rng, (4, 32))
  return Setup(sink, {1: a}, {0: a * np.float32(2.0)}, images={1 if read_image else 0: img})


@case("exact", "images", specs=BASIC)
def image_read(rng): return _image_copy(rng, True)


# an image is written a whole texel at a time: "none" still applies the required texel upcast by 4
@case("exact", "images", specs=BASIC)
def image_write(rng): return _image_copy(rng, False)


@case("arith", "vectors", needs=("float4",), vector_access=True)
def float4_access(rng):
  # contiguous float rows plus a broadcast row (which keeps the two axes apart): an UPCAST of the last axis by 4 must
  # become vector loads and stores where float4 is declared
  a, b = uniform(rng, (8, 16)), uniform(rng, (1, 16))
  out = arg(1, (8, 16)) * arg(2, (1, 16)).expand(8, 16) + 1.0
  return single(A.sink(A.store(0, out)), {1: a, 2: b}, {0: a * b + np.float32(1.0)})


# ----------------------------------------------------------------------------------------------------- numpy's surface of kc.ast
# Each op kc.ast adds on top of the IR's own (docs/AST.md), built as a user writes it and compared with numpy's answer,
# so that every backend is certified on the ASTs the builder makes: exp/log through exp2/log2 and a constant, cos
# through sin, powers, means, mins, numpy-shaped reduces and indexing, @, and the dtype rules of weak scalars.

# exp and log go through exp2/log2 and a multiply: the rounding of x * log2(e) adds up to |x| ulp to the ulp bound
_VIA_EXP2 = {"float32": Tolerance(ulp=8, atol=1e-6), "float16": Tolerance(ulp=3, atol=2e-3)}


def _float_unary(rng, build, ref, lo, hi, dt=dtypes.float32, shape=(6, 9)) -> Setup:
  a = uniform(rng, shape, lo, hi, dt.np)
  want = ref(a.astype(np.float64)).astype(dt.np)
  return single(A.sink(A.store(0, build(arg(1, shape, dt)))), {1: a}, {0: want})


@case("transcendental", "numpy", specs=BASIC, tolerance=_VIA_EXP2)
def np_exp(rng): return _float_unary(rng, lambda x: x.exp(), np.exp, -3.0, 3.0)


@case("transcendental", "numpy", specs=BASIC, tolerance=_VIA_EXP2)
def np_exp_f16(rng): return _float_unary(rng, lambda x: A.exp(x), np.exp, -2.0, 2.0, dtypes.float16)


@case("transcendental", "numpy", specs=BASIC, tolerance=_VIA_EXP2)
def np_log(rng): return _float_unary(rng, lambda x: x.log(), np.log, 0.01, 50.0)


@case("transcendental", "numpy", specs=BASIC, tolerance={"float32": Tolerance(ulp=4, atol=2e-6)})
def np_cos(rng): return _float_unary(rng, lambda x: x.cos(), np.cos, -6.0, 6.0)


@case("exact", "numpy", specs=BASIC)
def np_abs_neg(rng):
  a, i = uniform(rng, (5, 8)), ints(rng, (5, 8), -100, 100, np.int32)
  x, y = arg(1, (5, 8)), arg(2, (5, 8), dtypes.int32)
  return single(A.sink(A.store(0, abs(x) - x), A.store(3, abs(y) + -y)), {1: a, 2: i}, {0: np.abs(a) - a, 3: np.abs(i) + -i})


@case("arith", "numpy", specs=BASIC)
def np_pow_int(rng):
  a = uniform(rng, (6, 7), 0.5, 2.0)
  x = arg(1, (6, 7))
  want = (a.astype(np.float64) ** 5 + a.astype(np.float64) ** -2).astype(np.float32)
  return single(A.sink(A.store(0, x ** 5 + x ** -2)), {1: a}, {0: want})


@case("transcendental", "numpy", specs=BASIC, tolerance={"float32": Tolerance(ulp=16, atol=1e-6)})
def np_pow_float(rng):
  # exp2(y * log2|x|) with numpy's signs: a negative base to a non-integer power is NaN, to an odd integer negative
  a = uniform(rng, (6, 8), -2.0, 2.0)
  e = np.tile(np.array([1.5, 3.0, 2.0, 0.5], np.float32), (6, 2))
  x, y = arg(1, (6, 8)), arg(2, (6, 8))
  with np.errstate(invalid="ignore"): want = (a.astype(np.float64) ** e.astype(np.float64)).astype(np.float32)
  return single(A.sink(A.store(0, x ** y)), {1: a, 2: e}, {0: want})


@case("reduce", "numpy", specs=BASIC)
def np_mean_min(rng):
  a = uniform(rng, (5, 6, 7))
  x = arg(1, (5, 6, 7))
  sink = A.sink(A.store(0, x.min(1).reshape(5, 1, 7) + x.mean(1, keepdims=True)))
  return single(sink, {1: a}, {0: (a.min(1, keepdims=True) + a.astype(np.float64).mean(1, keepdims=True)).astype(np.float32)})


@case("reduce", "numpy", specs=BASIC)
def np_mean_axes(rng):
  a = uniform(rng, (5, 6, 7))
  return single(A.sink(A.store(0, arg(1, (5, 6, 7)).mean((0, 2)))), {1: a}, {0: a.astype(np.float64).mean((0, 2)).astype(np.float32)})


@case("exact", "numpy", specs=BASIC)
def np_min_ints(rng):
  a, u = ints(rng, (6, 9), -128, 127, np.int8), ints(rng, (6, 9), 0, 255, np.uint8)
  x, y = arg(1, (6, 9), dtypes.int8), arg(2, (6, 9), dtypes.uint8)
  return single(A.sink(A.store(0, x.min(1)), A.store(3, y.min(1).cast(dtypes.int8))), {1: a, 2: u},
                {0: a.min(1), 3: u.min(1).astype(np.int8)})


@case("exact", "numpy", specs=BASIC)
def np_sum_widens_ints(rng):
  # numpy's sum of int8 is int64: 200 values near 127 do not wrap
  a = ints(rng, (3, 200), 100, 127, np.int8)
  return single(A.sink(A.store(0, arg(1, (3, 200), dtypes.int8).sum(1))), {1: a}, {0: a.sum(1)})


@case("reduce", "numpy", specs=BASIC)
def np_half_sum_in_float32(rng):
  # a half accumulator stalls at 2048 (2048 + 1 rounds to 2048); numpy's float32 accumulation reaches 3000
  a = np.ones((2, 3000), np.float16)
  x = arg(1, (2, 3000), dtypes.float16)
  return single(A.sink(A.store(0, x.sum(1)), A.store(2, x.mean(1))), {1: a}, {0: a.sum(1), 2: a.mean(1)})


@case("reduce", "numpy")
def np_matmul(rng):
  a, b = uniform(rng, (7, 9)), uniform(rng, (9, 5))
  want = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
  return single(A.sink(A.store(0, arg(1, (7, 9)) @ arg(2, (9, 5)))), {1: a, 2: b}, {0: want})


@case("reduce", "numpy", specs=BASIC)
def np_matmul_batched_broadcast(rng):
  a, b = uniform(rng, (2, 1, 4, 6)), uniform(rng, (3, 6, 5))
  want = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
  return single(A.sink(A.store(0, arg(1, (2, 1, 4, 6)) @ arg(2, (3, 6, 5)))), {1: a, 2: b}, {0: want})


@case("reduce", "numpy", specs=BASIC)
def np_matvec(rng):
  a, v = uniform(rng, (8, 6)), uniform(rng, (6,))
  want = (a.astype(np.float64) @ v.astype(np.float64)).astype(np.float32)
  return single(A.sink(A.store(0, arg(1, (8, 6)) @ arg(2, (6,)))), {1: a, 2: v}, {0: want})


@case("exact", "numpy", specs=BASIC)
def np_getitem(rng):
  a = uniform(rng, (5, 6, 7))
  x = arg(1, (5, 6, 7))
  return single(A.sink(A.store(0, x[1:, ::-2, None, 3] * 2.0)), {1: a}, {0: a[1:, ::-2, None, 3] * np.float32(2.0)})


@case("exact", "numpy", specs=BASIC)
def np_getitem_steps(rng):
  a = uniform(rng, (5, 6, 7))
  return single(A.sink(A.store(0, arg(1, (5, 6, 7))[-1, 1::3, ::2] + 1.0)), {1: a}, {0: a[-1, 1::3, ::2] + np.float32(1.0)})


@case("reduce", "numpy", specs=BASIC)
def np_reduce_reshape(rng):
  a = uniform(rng, (4, 6, 5))
  x = arg(1, (4, 6, 5))
  s = a.astype(np.float64).sum(1)
  sink = A.sink(A.store(0, x.sum(1).reshape(20)), A.store(2, (x.sum(1) * 2.0).reshape(2, 10)))
  return single(sink, {1: a}, {0: s.reshape(20).astype(np.float32), 2: (s * 2).astype(np.float32).reshape(2, 10)})


@case("exact", "numpy", specs=BASIC)
def np_weak_scalars(rng):
  i, u = ints(rng, (4, 6), -50, 50, np.int32), ints(rng, (4, 6), 0, 255, np.uint8)
  x, y = arg(1, (4, 6), dtypes.int32), arg(2, (4, 6), dtypes.uint8)
  sink = A.sink(A.store(0, x * 2.5), A.store(3, x // 2.5), A.store(4, y + 200), A.store(5, y < 300))
  with np.errstate(over="ignore"): wrapped = u + 200
  return single(sink, {1: i, 2: u}, {0: i * 2.5, 3: i // 2.5, 4: wrapped, 5: u < 300})


@case("exact", "numpy", specs=BASIC)
def np_compare_where_clip(rng):
  a, b = ints(rng, (6, 6), -3, 3, np.int32).astype(np.float32), uniform(rng, (6, 6))
  x, y = arg(1, (6, 6)), arg(2, (6, 6))
  sink = A.sink(A.store(0, (x == 0).where(y, x)), A.store(3, A.where(x != y, x.clip(-1, 1), A.maximum(y, 0.5))),
                A.store(4, A.minimum(x, y)), A.store(5, A.logical_and(x > 0, ~(y > 0)) | A.logical_xor(x == 1, y < 0)))
  want = {0: np.where(a == 0, b, a), 3: np.where(a != b, np.clip(a, -1, 1), np.maximum(b, np.float32(0.5))), 4: np.minimum(a, b),
          5: np.logical_and(a > 0, ~(b > 0)) | np.logical_xor(a == 1, b < 0)}
  return single(sink, {1: a, 2: b}, want)


@case("arith", "numpy", specs=BASIC)
def np_floordiv_mod_float(rng):
  a = uniform(rng, (5, 9), -10.0, 10.0)
  x = arg(1, (5, 9))
  # the divisor 0.75 is exact in binary: numpy's floor and kc's agree to the last bit away from the jumps
  return single(A.sink(A.store(0, x // 0.75), A.store(2, x % 0.75)), {1: a}, {0: a // np.float32(0.75), 2: a % np.float32(0.75)})


@case("exact", "numpy", specs=BASIC)
def np_astype(rng):
  a = uniform(rng, (4, 7), -100.0, 100.0)
  x = arg(1, (4, 7))
  return single(A.sink(A.store(0, x.astype(np.int16)), A.store(2, x.astype(dtypes.float16).astype(dtypes.float64))), {1: a},
                {0: a.astype(np.int16), 2: a.astype(np.float16).astype(np.float64)})


@case("transcendental", "numpy", specs=BASIC)
def np_pad_of_computed(rng):
  # the pad of exp2(x) is 0, not exp2(0) = 1: the builder masks a padded value where the pad is applied
  a = uniform(rng, (5, 6))
  x = arg(1, (5, 6))
  sink = A.sink(A.store(0, x.exp2().pad(((1, 2), (0, 1)))))
  return single(sink, {1: a}, {0: np.pad(np.exp2(a.astype(np.float64)), ((1, 2), (0, 1))).astype(np.float32)})


@case("reduce", "numpy", specs=BASIC)
def np_pad_of_reduce(rng):
  a = uniform(rng, (5, 6))
  s = (a.astype(np.float64) + 1).sum(1)
  return single(A.sink(A.store(0, (arg(1, (5, 6)) + 1.0).sum(1).pad(((2, 0),)))), {1: a}, {0: np.pad(s, (2, 0)).astype(np.float32)})


@case("reduce", "numpy")
def np_reduce_broadcast_kept_axis(rng):
  # a reduce result broadcast along an axis it kept: computed per row below the reduce
  a, b = uniform(rng, (1, 9)), uniform(rng, (6, 1))
  want = (a.astype(np.float64).sum(1) * b).astype(np.float32)
  return single(A.sink(A.store(0, arg(1, (1, 9)).sum(1) * arg(2, (6, 1)))), {1: a, 2: b}, {0: want})
