"""numpy's answers in the corners, end to end on EMU and CLANG: integer // and % by every int's MIN, -1, 0, 1 and MAX,
pads of computed values of every op (constant folding inside the padding must not raise), power's special cases for
every float dtype, half and bfloat16 matmuls rounded once, and the narrow floats' transcendentals rounded once."""
import itertools, math, warnings
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import kc
from kc import ast as A, dtypes

ml_dtypes = pytest.importorskip("ml_dtypes")
DEVICES = [d for d in ("EMU", "CLANG") if kc.Device.unavailable_reason(d) is None]
NP = {dtypes.float16: np.float16, dtypes.float32: np.float32, dtypes.float64: np.float64,
      dtypes.bfloat16: ml_dtypes.bfloat16, dtypes.fp8e4m3: ml_dtypes.float8_e4m3fn,
      dtypes.fp8e5m2: ml_dtypes.float8_e5m2}


def _run(expr, inputs, device):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    return kc.run(A.sink(A.store(0, expr)), inputs, device=device)[0]


def _same(got, want):
  """Equal element by element, NaN equal to NaN and the sign of a zero or an infinity counted."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return np.all((got == want) & (np.signbit(got) == np.signbit(want)) | (np.isnan(got) & np.isnan(want)))


# ***** integer division by the corners of every int dtype *****

def _divisors(dt, rng) -> list[int]:
  lo, hi = dtypes.min(dt), dtypes.max(dt)
  return sorted({lo, hi, 0, 1, int(rng.integers(lo, hi, endpoint=True, dtype=dt.np))} | ({-1} if lo < 0 else set()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt", dtypes.ints, ids=lambda d: d.name)
def test_int_floordiv_and_mod_by_every_corner_divisor(device, dt):
  """x // d and x % d for d in {MIN, -1, 0, 1, MAX, random} as constants: numpy's answers (x // 0 and x % 0 are 0), and
  no rewrite cycles (x // MIN rewrote itself into -(x // -MIN) = -(x // MIN))."""
  rng = np.random.default_rng(dt.itemsize)
  lo, hi = dtypes.min(dt), dtypes.max(dt)
  rand = rng.integers(lo, hi, 10, endpoint=True, dtype=dt.np).tolist()
  x = np.array(sorted({lo, lo + 1, -1 if lo else 0, 0, 1, hi - 1, hi, *rand}), dtype=dt.np)
  arg = A.arg(1, dt, x.shape)
  for d in _divisors(dt, rng):
    with np.errstate(all="ignore"):
      want_div, want_mod = x // dt.np.type(d), x % dt.np.type(d)
    np.testing.assert_array_equal(_run(arg // d, {1: x}, device), want_div, err_msg=f"{dt.name} // {d}")
    np.testing.assert_array_equal(_run(arg % d, {1: x}, device), want_mod, err_msg=f"{dt.name} % {d}")


# ***** pads of computed values: the padding's constants fold without raising *****

# name -> (kc.ast of x, y; numpy of x, y; whether it needs y; whether it is a float op)
PAD_CASES = {
  "floordiv": (lambda x, y: x // y, lambda x, y: x // y, True, False),
  "mod": (lambda x, y: x % y, lambda x, y: x % y, True, False),
  "sub": (lambda x, y: x - y, lambda x, y: x - y, True, False),
  "max": (A.maximum, np.maximum, True, False),
  "min": (A.minimum, np.minimum, True, False),
  "lt": (lambda x, y: x < y, lambda x, y: x < y, True, False),
  "to_uint8": (lambda x, y: x.cast(dtypes.uint8), lambda x, y: x.astype(np.uint8), False, False),
  "to_int": (lambda x, y: x.cast(dtypes.int32).cast(dtypes.float32), lambda x, y: x.astype(np.int32).astype(np.float32),
             False, True),
  "div": (lambda x, y: x / y, lambda x, y: x / y, True, True),
  "pow": (lambda x, y: x ** y, lambda x, y: x ** y, True, True),
  "log2": (lambda x, y: A.log2(x), lambda x, y: np.log2(x), False, True),
  "sqrt": (lambda x, y: A.sqrt(x), lambda x, y: np.sqrt(x), False, True),
  "exp2": (lambda x, y: A.exp2(x), lambda x, y: np.exp2(x), False, True),
  "recip": (lambda x, y: 1.0 / x, lambda x, y: 1 / x, False, True),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(PAD_CASES))
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.int32, dtypes.int8], ids=lambda d: d.name)
def test_a_pad_of_a_computed_value_compiles_and_is_zero_outside(device, name, dt):
  """f(x, y).pad(...) is 0 in the padding for every op f, with default opts: f of the padding's zeros (0 // 0 is NaN
  in floats, and its floor converted to an int) folds to whatever it folds to, without an error."""
  build, ref, binary, float_only = PAD_CASES[name]
  if float_only and dt != dtypes.float32: pytest.skip("a float op")
  xv, yv = np.array([3, -7, 5], dt.np), np.array([2, 3, -4], dt.np)
  expr = build(A.arg(1, dt, (3,)), A.arg(2, dt, (3,))).pad(((1, 2),))
  with np.errstate(all="ignore"): want = np.pad(np.asarray(ref(xv, yv)), (1, 2))
  got = _run(expr, {1: xv, 2: yv} if binary else {1: xv}, device)
  np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_pads_of_float_floordiv_and_mod_of_zero_by_zero(device):
  x, y = A.arg(1, dtypes.float32, (1,)), A.arg(2, dtypes.float32, (1,))
  xv, yv = np.array([3.0], np.float32), np.array([2.0], np.float32)
  for expr, want in (((x // y).pad(((1, 0),)), [0.0, 1.0]), ((x % y).pad(((1, 0),)), [0.0, 1.0])):
    np.testing.assert_array_equal(_run(expr, {1: xv, 2: yv}, device), np.array(want, np.float32))


# ***** power's special cases, every float dtype *****

POW_SPECIALS = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, -3.0, 2.5, -2.5, math.inf, -math.inf, math.nan, 7.0]


def _pow_want(x: np.ndarray, y) -> np.ndarray:
  with np.errstate(all="ignore"): return np.asarray(x ** y).astype(np.float64)


def _check_pow(got, want, dt, what):
  """Special results (NaN, infs, zeros, +-1) exactly, sign included; the rest within a unit in the last place of the
  narrow types (computed in float32 and rounded once, a tie can fall either way) and 1e-5 relative otherwise."""
  got = np.asarray(got).astype(np.float64)
  special = ~np.isfinite(want) | (want == 0) | (np.abs(want) == 1)
  assert _same(got[special], want[special]), f"{what}: got {got[special]}, numpy {want[special]}"
  rtol = {1: 0.13, 2: 8e-3}.get(dt.itemsize, 1e-5)
  np.testing.assert_allclose(got[~special], want[~special], rtol=rtol, err_msg=what)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt", list(NP), ids=lambda d: d.name)
def test_power_of_every_pair_of_specials(device, dt):
  """array ** array over every pair: x ** 0 = 1 (NaN too), 1 ** y = 1 (NaN too), (-1) ** +-inf = 1, 0 ** negative = inf,
  a negative base with an integer exponent keeps the sign of odd powers, (-inf) ** odd, (-0.0) ** odd."""
  xs, ys = map(list, zip(*itertools.product(POW_SPECIALS, POW_SPECIALS)))
  x, y = np.array(xs, NP[dt]), np.array(ys, NP[dt])
  got = _run(A.arg(1, dt, x.shape) ** A.arg(2, dt, y.shape), {1: x, 2: y}, device)
  _check_pow(got, _pow_want(x, y), dt, f"{dt.name} array ** array")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt", list(NP), ids=lambda d: d.name)
@pytest.mark.parametrize("e", [0, 1, 2, 3, -1, -2, -3, 0.0, 2.0, -3.0, 0.5, -0.5, 2.5, -2.5, 100.0, math.inf, -math.inf,
                               math.nan])
def test_power_by_a_python_scalar(device, dt, e):
  """array ** scalar as numpy computes it (numpy 2's weak scalars: the scalar takes the array's dtype, so e4m3 ** inf
  is NaN; numpy's own floats take ** 0.5 as sqrt, where (-0.0) ** 0.5 is -0.0)."""
  x = np.array(POW_SPECIALS, NP[dt])
  _check_pow(_run(A.arg(1, dt, x.shape) ** e, {1: x}, device), _pow_want(x, e), dt, f"{dt.name} ** {e}")


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.fp8e4m3, dtypes.bfloat16], ids=lambda d: d.name)
@settings(max_examples=25, deadline=None, derandomize=True)
@given(data=st.data())
def test_narrow_float_power_is_rounded_once(dt, data):
  """x ** y of half, bfloat16 and fp8 is float32's x ** y rounded once (0 ** 1.5 in e4m3 was NaN: log2(0) = -inf on the
  way has no e4m3 encoding)."""
  codes = np.arange(256, dtype=np.uint8) if dt.itemsize == 1 else np.arange(1 << 16, dtype=np.uint16)
  finite = codes.view(NP[dt])
  finite = finite[np.isfinite(finite.astype(np.float32))]
  xs = data.draw(st.lists(st.sampled_from(list(finite[finite.astype(np.float32) >= 0])), min_size=4, max_size=4))
  y = data.draw(st.sampled_from([1.5, 0.25, -1.5, 3.0, -2.0]))
  x = np.array(xs, NP[dt])
  want = _pow_want(x.astype(np.float32), np.float32(y)).astype(NP[dt]).astype(np.float64)
  _check_pow(_run(A.arg(1, dt, x.shape) ** y, {1: x}, "EMU"), want, dt, f"{dt.name} ** {y}")


def test_int_to_a_negative_int_power_is_refused_like_numpy():
  """numpy raises ValueError for an int array to a negative int power; kc refuses it when the expression is built."""
  with pytest.raises(ValueError): np.array([2], np.int32) ** -1
  with pytest.raises(kc.InvalidASTError, match="negative integer powers"): A.arg(1, dtypes.int32, (2,)) ** -1


@pytest.mark.parametrize("device", DEVICES)
def test_int_power_wraps_as_numpy(device):
  x = np.array([0, 1, -1, 2, -3, 7, 100], np.int8)
  for e in (0, 1, 2, 3, 7):
    np.testing.assert_array_equal(_run(A.arg(1, dtypes.int8, x.shape) ** e, {1: x}, device), x ** e)


# ***** matmuls of half and bfloat16: products and sum in float32, rounded once *****

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_narrow_matmul_rounds_once(device, dt):
  """[[3.015625, -3]] @ [[3.015625], [3.03125]]: the exact products differ by 2**-12, which rounding each product to the
  narrow type first loses (bfloat16 gave 0)."""
  a, b = np.array([[3.015625, -3]], NP[dt]), np.array([[3.015625], [3.03125]], NP[dt])
  want = (a.astype(np.float32) @ b.astype(np.float32)).astype(NP[dt])
  assert want.astype(np.float32)[0, 0] != 0
  got = _run(A.arg(1, dt, a.shape) @ A.arg(2, dt, b.shape), {1: a, 2: b}, device)
  np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
@settings(max_examples=10, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2 ** 16))
def test_narrow_matmul_is_the_float32_matmul_rounded_once(dt, seed):
  rng = np.random.default_rng(seed)
  a, b = rng.uniform(-4, 4, (3, 5)).astype(NP[dt]), rng.uniform(-4, 4, (5, 2)).astype(NP[dt])
  want = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32).astype(NP[dt]).astype(np.float32)
  got = _run(A.arg(1, dt, a.shape) @ A.arg(2, dt, b.shape), {1: a, 2: b}, "EMU").astype(np.float32)
  # float32 sums of 5 exact products: at most a tie rounds differently from the float64 sum
  np.testing.assert_allclose(got, want, rtol=2.0 ** -(8 if dt == dtypes.bfloat16 else 11), atol=1e-6)


# ***** the narrow floats' transcendentals: float32's value rounded once *****

UNARY = {"exp2": np.exp2, "log2": np.log2, "sin": np.sin, "sqrt": np.sqrt, "recip": lambda v: np.float32(1) / v,
         "exp": np.exp, "log": np.log}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2], ids=lambda d: d.name)
@pytest.mark.parametrize("name", list(UNARY))
def test_narrow_float_unary_is_float32_rounded_once(device, dt, name):
  """Every value of an fp8 type (a sample of the 16-bit ones) incl. 0, -0, infs and NaN: float32's f(x) rounded once to
  the type (log2(0) = -inf is NaN in e4m3, which has no infinity, as ml_dtypes converts it)."""
  codes = np.arange(256, dtype=np.uint8) if dt.itemsize == 1 else np.arange(0, 1 << 16, 97, dtype=np.uint16)
  x = codes.view(NP[dt])
  if dt.itemsize == 2: x = np.concatenate([x, np.array([0, -0.0, np.inf, -np.inf, np.nan, 1, 2, 0.5], NP[dt])])
  with np.errstate(all="ignore"): want = np.asarray(UNARY[name](x.astype(np.float32))).astype(NP[dt]).astype(np.float64)
  got = _run(getattr(A.arg(1, dt, x.shape), name)(), {1: x}, device).astype(np.float64)
  special = ~np.isfinite(want) | (want == 0)
  assert _same(got[special], want[special]), f"{name}: {x[special][~(got[special] == want[special])]}"
  # a last-place difference where float32's value lies near a tie of the narrow type
  ulp = {1: 0.13, 2: 2.0 ** -7 if dt == dtypes.bfloat16 else 2.0 ** -10}[dt.itemsize]
  np.testing.assert_allclose(got[~special], want[~special], rtol=ulp, atol=1e-30)


@pytest.mark.parametrize("device", [d for d in ("EMU", "CLANG", "OPENCL") if kc.Device.unavailable_reason(d) is None])
def test_a_nan_constant_operand_is_folded_to_nan(device):
  # PoCL computed exp2(log2(|x|) * NAN) as 1.0, so OPENCL's x ** nan was 1 (or x, through the fp8 codecs): a NaN
  # operand of a float +, * or / is folded before any device sees it
  x = A.arg(1, dtypes.float32, (4,))
  vals = np.array([4.0, 0.5, -2.0, 1.0], np.float32)
  for expr, want in ((x ** float("nan"), vals ** np.float32("nan")), (x * float("nan") + 1, vals * np.nan + 1),
                     (float("nan") / x, np.nan / vals)):
    got = kc.run(A.sink(A.store(0, expr)), {1: vals}, device=device, opts="none")[0]
    np.testing.assert_array_equal(got, want.astype(np.float32))
  y = kc.UOp.variable("y", 0, 9).cast(dtypes.float32)
  for op in ("__add__", "__mul__", "__truediv__", "__rtruediv__"):
    folded = getattr(y, op)(kc.UOp.const(dtypes.float32, float("nan"))).simplify()
    assert folded.op is kc.Ops.CONST and np.isnan(folded.arg), folded


@pytest.mark.parametrize("device", [d for d in ("EMU", "CLANG", "OPENCL") if kc.Device.unavailable_reason(d) is None])
def test_maximum_of_equal_zeros_is_the_second_as_numpy_and_folding_give(device):
  # lowered as a<b ? b : a, max gave the first of -0.0 and 0.0 where numpy and constant folding give the second
  x, y = A.arg(1, dtypes.float32, (4,)), A.arg(2, dtypes.float32, (4,))
  a, b = np.array([-0.0, 0.0, np.nan, 1], np.float32), np.array([0.0, -0.0, 1, np.nan], np.float32)
  got = kc.run(A.sink(A.store(0, A.maximum(x, y))), {1: a, 2: b}, device=device)[0]
  want = np.maximum(a, b)
  np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
  np.testing.assert_array_equal(got, want)
  folded = kc.UOp.const(dtypes.float32, -0.0).maximum(kc.UOp.const(dtypes.float32, 0.0)).simplify()
  assert folded.arg == 0.0 and not np.signbit(folded.arg)
