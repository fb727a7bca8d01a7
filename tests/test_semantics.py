"""Numeric semantics every backend agrees on, with numpy as the oracle: narrow ints wrap after every op (C would
compute them in int), integer division and remainder by zero give 0 and MIN // -1 wraps (C traps on both), and
float division by zero is IEEE's inf/nan. Each case runs on CLANG, EMU and OPENCL (skipped where a device cannot open)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import kc
from kc import Ops, UOp, Variable, dtypes
from kc import ast as A

pytestmark = pytest.mark.usefixtures("cache_dir")

DEVICES = ["CLANG", "EMU", "OPENCL"]
NARROW = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16]
INTS = NARROW + [dtypes.int32]
N = 64


@pytest.fixture(params=DEVICES)
def device(request):
  if request.param not in kc.Device.available(): pytest.skip(f"{request.param} cannot open here: {kc.Device.unavailable_reason(request.param)}")
  return request.param


def edge_values(rng, dt, n: int = N) -> np.ndarray:
  """n values of `dt` over its whole range, its extremes, 0, 1 and -1 included."""
  info = np.iinfo(dt.np)
  edges = np.array([info.min, info.max, 0, 1, info.max - 1, info.min + 1] + ([-1, -2] if info.min < 0 else [2, 3]), dtype=np.int64)
  rest = rng.integers(info.min, info.max, n - len(edges), endpoint=True, dtype=np.int64)
  return rng.permutation(np.concatenate([edges, rest])).astype(dt.np)


def alu(op: Ops, a: A.Expr, b: A.Expr) -> A.Expr:
  """The IR op itself on two same-shaped args, whatever the builder's operator for it means (a numpy-style // may
  floor; IDIV truncates)."""
  return A.Expr(a.uop.alu(op, b.uop), a.kshape, a.hidden)


def trunc_div(a: np.ndarray, b: np.ndarray, dt) -> tuple[np.ndarray, np.ndarray]:
  """kc's IDIV and MOD (C's truncating division, the remainder with the dividend's sign) with numpy's answers where C has
  none: x // 0 == x % 0 == 0, and MIN // -1 wraps to MIN. Computed exactly in Python ints (object arrays), then
  wrapped to `dt` by numpy."""
  a_, b_ = a.astype(object), b.astype(object)
  safe = np.where(b_ == 0, 1, b_)
  q = np.where(b_ == 0, 0, np.sign(a_) * np.sign(safe) * (abs(a_) // abs(safe)))
  r = np.where(b_ == 0, 0, a_ - q * b_)
  bits = 8 * dt.itemsize
  wrap = lambda v: np.array([int(x) % 2**bits for x in v], dtype=np.uint64).astype(dt.np)  # noqa: E731
  return wrap(q), wrap(r)


# ---------------------------------------------------------------------------------------------------------- narrow ints wrap

def test_narrow_sum_compares_after_the_wrap(device):
  a, b = np.array([200, 10, 250, 5], np.uint8), np.array([100, 10, 10, 5], np.uint8)
  x, y = A.arg(1, dtypes.uint8, (4,)), A.arg(2, dtypes.uint8, (4,))
  out = kc.run(A.sink(A.store(0, (x + y) < 100)), {1: a, 2: b}, device=device)[0]
  np.testing.assert_array_equal(out, (a + b) < 100)
  np.testing.assert_array_equal(out, [True, True, True, True])


@pytest.mark.parametrize("dt", INTS, ids=lambda d: d.name)
def test_arithmetic_wraps_as_in_numpy(device, dt):
  rng = np.random.default_rng(1)
  a, b = edge_values(rng, dt), edge_values(rng, dt)
  bits = 8 * dt.itemsize
  s = rng.integers(0, bits, N).astype(dt.np)
  # a shift left of a negative value is undefined in C: those lanes shift their magnitude's bits only
  a_shl = a if dtypes.is_unsigned(dt) else np.abs(a.astype(np.int64)).clip(0, np.iinfo(dt.np).max).astype(dt.np)
  x, y, z, w = (A.arg(i, dt, (N,)) for i in (10, 11, 12, 13))
  k = A.const(100, dt, (N,))
  exprs = [x + y, x - y, x * y, -x, alu(Ops.SHL, w, z), x + y < k, k < x * y, (x - y).maximum(x * y), (x + y < k).where(x * y, x - y), (x * y).ne(k)]
  want = [a + b, a - b, a * b, -a, a_shl << s, a + b < 100, 100 < a * b, np.maximum(a - b, a * b), np.where(a + b < 100, a * b, a - b), a * b != 100]
  with np.errstate(over="ignore"):
    out = kc.run(A.sink(*(A.store(i, e) for i, e in enumerate(exprs))), {10: a, 11: b, 12: s, 13: a_shl}, device=device)
  for i, w_ in enumerate(want): np.testing.assert_array_equal(out[i], w_, err_msg=f"{device} {dt.name} output {i}")


@pytest.mark.parametrize("dt", NARROW, ids=lambda d: d.name)
@pytest.mark.parametrize("opts", ["none", "hand"])
def test_narrow_reduce_wraps_in_its_dtype(device, dt, opts):
  a = edge_values(np.random.default_rng(2), dt, 16 * 64).reshape(16, 64)
  x = A.arg(1, dt, (16, 64))
  out = kc.run(A.sink(A.store(0, x.sum(1, keepdims=True, dtype=dt)), A.store(2, (x * x).max(1, keepdims=True)),
                      A.store(3, x.prod(1, keepdims=True, dtype=dt))), {1: a}, device=device, opts=opts)
  np.testing.assert_array_equal(out[0], np.add.reduce(a, axis=1, dtype=dt.np, keepdims=True))
  with np.errstate(over="ignore"):
    np.testing.assert_array_equal(out[2], (a * a).max(1, keepdims=True))
    np.testing.assert_array_equal(out[3], np.multiply.reduce(a, axis=1, dtype=dt.np, keepdims=True))


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(NARROW), st.data())
def test_narrow_add_then_compare_any_inputs(dt, data):
  info = np.iinfo(dt.np)
  vals = st.lists(st.integers(int(info.min), int(info.max)), min_size=8, max_size=8)
  a, b = np.array(data.draw(vals), dt.np), np.array(data.draw(vals), dt.np)
  c = data.draw(st.integers(int(info.min), int(info.max)))
  x, y = A.arg(1, dt, (8,)), A.arg(2, dt, (8,))
  sink = A.sink(A.store(0, (x + y) < A.const(c, dt, (8,))), A.store(3, alu(Ops.IDIV, x * y, A.const(7, dt, (8,)))))
  with np.errstate(over="ignore"): want_lt, prod = (a + b) < dt.np.type(c), a * b
  for device in ("CLANG", "EMU"):
    out = kc.run(sink, {1: a, 2: b}, device=device)
    np.testing.assert_array_equal(out[0], want_lt, err_msg=device)
    np.testing.assert_array_equal(out[3], trunc_div(prod, np.full(8, 7, dt.np), dt)[0], err_msg=device)


# ---------------------------------------------------------------------------------------------------------- integer division

@pytest.mark.parametrize("dt", INTS + [dtypes.int64, dtypes.uint32], ids=lambda d: d.name)
def test_division_by_zero_is_zero_and_min_by_minus_one_wraps(device, dt):
  rng = np.random.default_rng(3)
  a = edge_values(rng, dt)
  b = edge_values(rng, dt)
  b[::4] = 0  # plenty of zero divisors, and -1 under MIN where the type is signed
  if not dtypes.is_unsigned(dt): a[1::8], b[1::8] = np.iinfo(dt.np).min, -1
  x, y = A.arg(2, dt, (N,)), A.arg(3, dt, (N,))
  out = kc.run(A.sink(A.store(0, alu(Ops.IDIV, x, y)), A.store(1, alu(Ops.MOD, x, y))), {2: a, 3: b}, device=device)
  q, r = trunc_div(a, b, dt)
  np.testing.assert_array_equal(out[0], q)
  np.testing.assert_array_equal(out[1], r)
  np.testing.assert_array_equal(out[0][b == 0], 0)
  np.testing.assert_array_equal(out[1][b == 0], 0)
  with np.errstate(divide="ignore"):  # numpy's own answer for a zero divisor
    np.testing.assert_array_equal(out[0][b == 0], np.floor_divide(a[b == 0], b[b == 0]))
    np.testing.assert_array_equal(out[1][b == 0], np.remainder(a[b == 0], b[b == 0]))


def test_division_by_constant_zero_and_minus_one(device):
  a = edge_values(np.random.default_rng(4), dtypes.int32)
  x = A.arg(1, dtypes.int32, (N,))
  zero, m1 = A.const(0, dtypes.int32, (N,)), A.const(-1, dtypes.int32, (N,))
  div, mod = lambda p, q: alu(Ops.IDIV, p, q), lambda p, q: alu(Ops.MOD, p, q)  # noqa: E731
  out = kc.run(A.sink(A.store(0, div(x, zero)), A.store(2, mod(x, zero)), A.store(3, div(x, m1)), A.store(4, mod(x, m1)),
                      A.store(5, div(A.const(7, dtypes.int32, (N,)), zero))), {1: a}, device=device)
  for i in (0, 2, 4, 5): np.testing.assert_array_equal(out[i], np.zeros(N, np.int32))
  np.testing.assert_array_equal(out[3], -a)  # numpy's negation wraps MIN to MIN


def test_constant_folding_gives_the_backends_answer():
  assert (UOp.const(dtypes.int32, 7) // 0).simplify().arg == 0
  assert (UOp.const(dtypes.int32, -7) % 0).simplify().arg == 0
  assert (UOp.const(dtypes.int32, -2**31) // -1).simplify().arg == -2**31
  assert (UOp.const(dtypes.int8, -128) // -1).simplify().arg == -128
  v = Variable("v", -5, 5)
  assert kc.sym_infer((v * 3) // 0, {v: 4}) == 0


def test_division_keeps_the_plain_operator_where_the_divisor_cannot_be_zero():
  from kc_clang.renderer import ClangRenderer
  x = A.arg(1, dtypes.int32, (N,))
  def src(e): return kc.Kernel(A.sink(A.store(0, e)), opts=ClangRenderer()).to_program().src
  def div(dt, q=None): return alu(Ops.IDIV, A.arg(1, dt, (N,)), A.arg(2, dt, (N,)) if q is None else A.const(q, dt, (N,)))
  plain = src(div(dtypes.int32, 3) + alu(Ops.MOD, x, A.const(5, dtypes.int32, (N,))))
  assert "==0" not in plain and "==-1" not in plain and "/3" in plain and "%5" in plain
  guarded = src(div(dtypes.int32))
  assert "==0?0:" in guarded and "==-1?" in guarded  # any int32 divisor may be 0 or -1
  unsigned = src(div(dtypes.uint32))
  assert "==0?0:" in unsigned and "==-1" not in unsigned  # an unsigned divisor is never -1
  narrow = src(div(dtypes.int8))
  assert "==-1" not in narrow  # int8 is divided in int, where MIN / -1 cannot trap; the cast wraps it


# ---------------------------------------------------------------------------------------------------------- float division

@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_float_division_by_zero_is_ieee(device, dt):
  if not kc.Device[device].renderer.supports_dtype(dt): pytest.skip(f"{device} does not compute in {dt.name}")
  a = np.array([1.0, -1.0, 0.0, -0.0, np.inf, np.nan, 3.5, -2.0], dt.np)
  b = np.array([0.0, 0.0, 0.0, -0.0, 0.0, 0.0, -0.0, -0.0], dt.np)
  x, y = A.arg(2, dt, (8,)), A.arg(3, dt, (8,))
  out = kc.run(A.sink(A.store(0, x / y), A.store(1, y.recip())), {2: a, 3: b}, device=device)
  with np.errstate(divide="ignore", invalid="ignore"):
    np.testing.assert_array_equal(out[0], a / b)
    np.testing.assert_array_equal(out[1], np.reciprocal(b))
    want = a / b
  # the sign of a zero divisor counts (1/-0 is -inf; assert_array_equal tells inf from -inf); a NaN's sign means nothing
  assert np.array_equal(np.signbit(out[0])[~np.isnan(want)], np.signbit(want)[~np.isnan(want)])


# ---------------------------------------------------------------------------------------------------------- half

def test_half_single_ops_round_once_as_in_numpy(device):
  # one op on half inputs is exact in float and rounded once to half, natively or through float (OPENCL without
  # cl_khr_fp16): every backend gives numpy's bits
  rng = np.random.default_rng(5)
  x, y = (rng.standard_normal(N) * 300).astype(np.float16), (rng.standard_normal(N) * 300).astype(np.float16)
  x[:3], y[:3] = [60000, -60000, 1], [60000, -60000, 0]  # overflow to +-inf, and a division by zero
  a, b = A.arg(4, dtypes.float16, (N,)), A.arg(5, dtypes.float16, (N,))
  out = kc.run(A.sink(A.store(0, a + b), A.store(1, a * b), A.store(2, a / b), A.store(3, a.maximum(b))), {4: x, 5: y}, device=device)
  with np.errstate(all="ignore"): want = [x + y, x * y, x / y, np.maximum(x, y)]
  for i, w in enumerate(want): np.testing.assert_array_equal(out[i], w, err_msg=f"{device} output {i}")


@pytest.mark.parametrize("dt,c", [(dtypes.float32, -1.0), (dtypes.int32, -2)])
def test_subtracting_a_negative_constant_renders_as_c(device, dt, c):
  # `a - -1` spelled `a--1` would be C's decrement operator
  from kc.ast import Expr
  x = A.arg(1, dt, (4,))
  e = Expr(x.uop.alu(Ops.SUB, UOp.const(dt, c)), x.shape)
  a = np.arange(4).astype(dt.np)
  out = kc.run(A.sink(A.store(0, e)), {1: a}, device=device)[0]
  assert np.array_equal(out.reshape(-1), a - np.array(c, dt.np))


@pytest.mark.parametrize("dt", [dtypes.int32, dtypes.int64])
def test_signed_overflow_wraps_before_a_widening_use(device, dt):
  # a signed overflow is undefined in C: a compiler may widen a*b to 64 bits before the sum's cast; numpy wraps first
  rng = np.random.default_rng(3)
  info = np.iinfo(dt.np)
  a = rng.integers(info.min, info.max, (4, 2, 1), dtype=dt.np, endpoint=True)
  b = rng.integers(info.min, info.max, (1, 2, 2), dtype=dt.np, endpoint=True)
  x, y = A.arg(1, dt, (4, 2, 1)), A.arg(2, dt, (1, 2, 2))
  sink = A.sink(A.store(0, (x * y).sum(1)), A.store(3, ((x + y) - (-x)).sum(1)))
  with np.errstate(all="ignore"): want0, want3 = (a * b).sum(1), ((a + b) - (-a)).sum(1)
  out = kc.run(sink, {1: a, 2: b}, device=device)
  np.testing.assert_array_equal(out[0], want0)
  np.testing.assert_array_equal(out[3], want3)


@pytest.mark.skipif("OPENCL" not in kc.Device.available(), reason="no OpenCL device")
def test_only_values_that_may_overflow_go_through_unsigned():
  # OpenCL C leaves signed overflow undefined; CLANG compiles with -fwrapv and renders it plainly
  x = A.arg(1, dtypes.int32, (8, 8))
  src = kc.compile(A.sink(A.store(0, x * A.arg(2, dtypes.int32, (8, 8)))), device="OPENCL", opts="none").program.src
  assert "(int)(((uint)(val0)*(uint)(val1)))" in src and "*(data0+gidx0)" in src  # the index stays plain
  small = kc.compile(A.sink(A.store(0, (x.cast(dtypes.int8).cast(dtypes.int32) * 3) + 1)), device="OPENCL", opts="none").program.src
  assert "uint" not in small  # an int8's value times 3 plus 1 fits an int32
  assert "unsigned" not in kc.compile(A.sink(A.store(0, x * A.arg(2, dtypes.int32, (8, 8)))), device="CLANG", opts="none").program.src


def test_int64_sum_of_an_unrolled_reduce_is_exact(device):
  # gcc 12's -O2 loop vectorizer summed wrong through unsigned casts; CLANG now relies on -fwrapv instead
  a = np.random.default_rng(0).integers(-1000, 1000, (8, 24)).astype(np.int32)
  sink = A.sink(A.store(0, A.arg(1, dtypes.int32, (8, 24)).sum(1)))
  for opts in ([kc.Opt(kc.OptOps.UNROLL, 0, 3)], [kc.Opt(kc.OptOps.UNROLL, 0, 4)], "hand"):
    np.testing.assert_array_equal(kc.run(sink, {1: a}, device=device, opts=opts)[0], a.sum(1))
