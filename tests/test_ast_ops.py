"""kc.ast's everyday numpy ops, checked value by value, dtype by dtype and shape by shape against numpy 2 on CLANG and
EMU: sliding windows, comparisons over special values, the shape an input was declared with, the buffer indices of a
sink, var/std, tanh/sigmoid, rounding, sign, the float tests, shifts, squeeze/ravel/flatten and argmax/argmin.
kc.run's outputs must have numpy's shape and dtype exactly."""
import itertools, warnings
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
import kc
from kc import ast as A, dtypes, DTypeError, InvalidASTError, Ops, UOp
from kc.ast.examples import EXAMPLES
from kc.shape import ShapeTracker
from ast_run import DEVICES, device, run  # noqa: F401 (device is a fixture)

SWVIEW = np.lib.stride_tricks.sliding_window_view


def same(got: np.ndarray, want, rtol=1e-6, atol=0.0, signed_zeros=True):
  """numpy's shape and dtype exactly, the values within rtol (NaN where numpy has NaN, -0.0 where numpy has -0.0)."""
  want = np.asarray(want)
  assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
  g, w = got.astype(np.float64), want.astype(np.float64)
  np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
  if signed_zeros and got.dtype.kind == "f": assert np.array_equal(np.signbit(g[w == 0]), np.signbit(w[w == 0])), (got, want)


# ---------------------------------------------------------------------------------------------- sliding windows

@pytest.mark.parametrize("shape,axis,size", [((10,), 0, 3), ((10,), -1, 10), ((4, 7), 1, 3), ((4, 7), 0, 2), ((3, 4, 5), 1, 4)])
def test_windows_is_numpys_sliding_window_view(device, shape, axis, size):
  a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
  x = A.arg(1, dtypes.float32, shape)
  win = x.windows(axis, size)
  want = SWVIEW(a, size, axis=axis)
  assert win.shape == want.shape
  same(run(win, {1: a}, device), want)
  same(run(win.sum(-1), {1: a}, device), want.sum(-1), rtol=1e-5)
  same(run(np.lib.stride_tricks.sliding_window_view(x, size, axis=axis), {1: a}, device), want)


def test_windows_of_windows_and_of_a_padded_input(device):
  a = np.random.default_rng(1).standard_normal((3, 6, 7)).astype(np.float32)
  x = A.arg(1, dtypes.float32, a.shape).pad(((0, 0), (1, 1), (1, 1)))
  want = SWVIEW(SWVIEW(np.pad(a, ((0, 0), (1, 1), (1, 1))), 3, axis=1), 3, axis=2)
  same(run(x.windows(1, 3).windows(2, 3), {1: a}, device), want)


def test_conv2d_example_still_matches_numpy(device):
  sink, inputs, ref = EXAMPLES["conv2d"].build()
  np.testing.assert_allclose(kc.run(sink, inputs, device=device)[0].reshape(ref.shape), ref, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------------ buffer indices

def test_sink_refuses_a_gap_in_buffer_indices():
  x = A.arg(2, dtypes.float32, (4,))
  with pytest.raises(InvalidASTError, match="buffer index 1 is not used"): A.sink(A.store(0, x + 1.0))
  with pytest.raises(InvalidASTError, match="buffer index 0 is not used"): A.sink(A.store(1, A.arg(2, dtypes.float32, (4,))))
  A.sink(A.store(0, x + A.arg(1, dtypes.float32, (4,))))  # 0, 1, 2: no gap


# ---------------------------------------------------------------------------------------- comparisons, NaN etc.

def _specials(dt) -> np.ndarray:
  if dt == np.bool_: return np.array([False, True])
  if np.dtype(dt).kind in "iu":
    info = np.iinfo(dt)
    return np.unique(np.array([info.min, info.min + 1, 0, 1, info.max - 1, info.max], dtype=dt))
  return np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, np.finfo(dt).max, np.finfo(dt).tiny], dtype=dt)


COMPARISONS = {"<": np.less, ">": np.greater, "<=": np.less_equal, ">=": np.greater_equal, "==": np.equal, "!=": np.not_equal}
BUILD = {"<": lambda p, q: p < q, ">": lambda p, q: p > q, "<=": lambda p, q: p <= q, ">=": lambda p, q: p >= q,
         "==": lambda p, q: p == q, "!=": lambda p, q: p != q}
SPECIAL_DTYPES = [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int16, np.int32, np.uint32, np.int64, np.uint64, np.bool_]


@pytest.mark.parametrize("dt", SPECIAL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("cmp", list(COMPARISONS))
def test_comparisons_over_special_values_match_numpy(device, dt, cmp):
  v = _specials(dt)
  a, b = (np.array(p, dtype=dt) for p in zip(*itertools.product(v, v)))  # every pair
  x, y = A.arg(1, dt, a.shape), A.arg(2, dt, b.shape)
  same(run(BUILD[cmp](x, y), {1: a, 2: b}, device), COMPARISONS[cmp](a, b))
  for s in ([2.0, float("nan"), float("inf")] if np.dtype(dt).kind == "f" else [True, 0]):  # against Python scalars too
    same(run(BUILD[cmp](x, s), {1: a}, device), COMPARISONS[cmp](a, s))
    same(run(BUILD[cmp](s, x), {1: a}, device), COMPARISONS[cmp](s, a))


# ---------------------------------------------------------------------------------- the shape an input declares

@pytest.mark.parametrize("build", [lambda x: x.reshape(-1).sum(), lambda x: x.reshape(3, 8), lambda x: x.reshape(4, 6).T,
                                   lambda x: x.reshape(6, 2, 2) + 1], ids=["ravel-sum", "3x8", "4x6.T", "6x2x2+1"])
def test_a_reshaped_input_takes_its_declared_shape(build):
  a = np.arange(24, dtype=np.float32).reshape(6, 4)
  x = A.arg(1, np.float32, (6, 4))
  want = build(a)
  for arr in (a, a.reshape(-1), a.reshape(6, 1, 4)):  # the declared shape, 1-D, size-1 dims aside: the documented forms
    same(run(build(x), {1: arr}, "CLANG"), want)
  with pytest.raises(kc.ArgumentError, match=r"input 1 .* must have shape \(6, 4\)"): run(build(x), {1: a.reshape(3, 8)}, "CLANG")


MOVES = st.sampled_from(["reshape", "permute", "flip", "pad", "shrink", "expand", "index", "windows"])


@st.composite
def movement_chains(draw):
  shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
  ops = []
  cur = np.empty(shape)
  for _ in range(draw(st.integers(1, 4))):
    kind = draw(MOVES)
    if kind == "reshape":
      n = cur.size
      first = draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
      ops.append((kind, (first, -1)))
    elif kind == "permute": ops.append((kind, tuple(draw(st.permutations(range(cur.ndim))))))
    elif kind == "flip": ops.append((kind, draw(st.integers(0, cur.ndim - 1))))
    elif kind == "pad": ops.append((kind, tuple((draw(st.integers(0, 1)), draw(st.integers(0, 1))) for _ in range(cur.ndim))))
    elif kind == "shrink": ops.append((kind, tuple((0, draw(st.integers(1, n))) for n in cur.shape)))
    elif kind == "expand": ops.append((kind, (2,) + cur.shape))
    elif kind == "index": ops.append((kind, draw(st.integers(0, cur.shape[0] - 1)) if cur.ndim > 1 else slice(None, None, -1)))
    else: ops.append((kind, (cur.ndim - 1, draw(st.integers(1, cur.shape[-1])))))
    cur = _move_np(cur, *ops[-1])
  return shape, ops


def _move_np(a, kind, arg):
  if kind == "reshape": return a.reshape(arg)
  if kind == "permute": return a.transpose(arg)
  if kind == "flip": return np.flip(a, arg)
  if kind == "pad": return np.pad(a, arg)
  if kind == "shrink": return a[tuple(slice(lo, hi) for lo, hi in arg)]
  if kind == "expand": return np.broadcast_to(a, arg)
  if kind == "index": return a[arg]
  return SWVIEW(a, arg[1], axis=arg[0])


def _move_kc(x, kind, arg):
  if kind == "reshape": return x.reshape(arg)
  if kind == "permute": return x.permute(arg)
  if kind == "flip": return x.flip(arg)
  if kind == "pad": return x.pad(arg)
  if kind == "shrink": return x.shrink(arg)
  if kind == "expand": return x.expand(arg)
  if kind == "index": return x[arg]
  return x.windows(*arg)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(movement_chains())
def test_any_movement_chain_of_an_input_takes_the_declared_shape(chain):
  shape, ops = chain
  a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
  x, want = A.arg(1, np.float32, shape), a
  for op in ops: x, want = _move_kc(x, *op), _move_np(want, *op)
  same(run(x + 0.0, {1: a}, "CLANG"), want + np.float32(0))  # the declared shape is accepted, the values are numpy's
  same(run(x + 0.0, {1: a.reshape(-1)}, "CLANG"), want + np.float32(0))


def test_an_ast_whose_loads_record_no_shape_falls_back_to_the_views():
  # an AST built without kc.ast: the input's shape comes from the load's view, or only its element count is checked
  buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(), (), 1)
  st_in = ShapeTracker.from_shape((6, 6)).shrink(((0, 6), (1, 5)))
  load = UOp(Ops.LOAD, dtypes.float32, (buf, st_in.to_uop()))
  out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(), (), 0)
  sink = UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (out, ShapeTracker.from_shape((6, 4)).to_uop(), load)),))
  k = kc.compile(sink, device="CLANG")
  assert k.specs[1].shape is None and k.specs[1].elements == 6 * 6 - 1
  plain = UOp(Ops.LOAD, dtypes.float32, (buf, ShapeTracker.from_shape((6, 4)).to_uop()))
  k = kc.compile(UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (out, ShapeTracker.from_shape((6, 4)).to_uop(), plain)),)), device="CLANG")
  assert k.specs[1].shape == (6, 4)


# --------------------------------------------------------------------------------------------- elementwise ops

FLOATS = [np.float32, np.float16, np.float64]
INTS = [np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64]
ROUNDING = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 0.49999997, -0.3, 7.5, -7.5, 1e-5,
                     -3.7, 1e30, 2.0 ** 24 + 2, 2.0 ** 52 + 1, 1023.5, 2047.0])


def _values(dt) -> np.ndarray:
  if dt == np.bool_: return np.array([True, False, True])
  if np.dtype(dt).kind in "iu":
    info = np.iinfo(dt)
    return np.array([info.min, info.min + 1, -3 if info.min else 3, 0, 1, 5, info.max], dtype=dt)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    return ROUNDING.astype(dt)


def _sigmoid(a):
  out = np.result_type(a.dtype, np.float16) if a.dtype.kind != "f" else a.dtype
  with np.errstate(over="ignore"): return (1 / (1 + np.exp(-a.astype(np.float64)))).astype(out)


UNARY = {"floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "rint": np.rint, "round": np.round, "sign": np.sign,
         "isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite, "square": np.square, "tanh": np.tanh, "sigmoid": _sigmoid}
# transcendental results are a few ulp off numpy's (kc builds them from exp2 and log2); the rest are exact
ULPS = {"tanh": 4, "sigmoid": 4}


@pytest.mark.parametrize("dt", FLOATS + INTS + [np.bool_], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_ops_match_numpy(device, dt, name):
  a = _values(dt)
  if name == "square" and np.dtype(dt).kind in "iu": a = (a % 7).astype(dt)  # numpy wraps too, but keep clear of it
  try:
    with np.errstate(all="ignore"): want = UNARY[name](a)
  except TypeError:  # numpy has no loop (sign of bool): kc refuses with its TypeError
    with pytest.raises(DTypeError): getattr(A.arg(1, dt, a.shape), name)()
    return
  rtol = ULPS.get(name, 0) * float(np.finfo(want.dtype).eps) if want.dtype.kind == "f" else 0
  x = A.arg(1, dt, a.shape)
  same(run(getattr(x, name)(), {1: a}, device), want, rtol=rtol)
  if name != "sigmoid":
    same(run(UNARY[name](x), {1: a}, device), want, rtol=rtol)  # numpy's ufunc (round: numpy's function) on an Expr
    same(run(getattr(A, name)(x), {1: a}, device), want, rtol=rtol)


def test_tanh_keeps_its_digits_near_zero(device):
  a = np.concatenate([np.geomspace(1e-9, 20, 400), -np.geomspace(1e-9, 20, 100)]).astype(np.float32)
  same(run(A.arg(1, np.float32, a.shape).tanh(), {1: a}, device), np.tanh(a), rtol=4 * float(np.finfo(np.float32).eps))


def test_round_with_decimals(device):
  a = np.array([1.25, -2.675, 123.456, 0.5, 15.0, 25.0, -35.0], np.float64)
  x = A.arg(1, np.float64, a.shape)
  for d in (1, 2, -1):
    same(run(x.round(d), {1: a}, device), np.round(a, d), rtol=1e-15)
  same(run(np.round(x, 1), {1: a}, device), np.round(a, 1), rtol=1e-15)
  i = A.arg(1, np.int32, (3,))
  assert i.round(2) is i
  with pytest.raises(InvalidASTError, match="decimals=-1"): i.round(-1)


@pytest.mark.parametrize("dt", [np.int8, np.uint8, np.int16, np.int32, np.uint32, np.int64, np.uint64], ids=lambda d: np.dtype(d).name)
def test_shifts_match_numpy_past_the_bit_width(device, dt):
  info = np.iinfo(dt)
  xs = np.array([1, info.max, info.min, 5, info.max // 3, 3, 1], dt)
  amounts = np.array([0, 1, info.bits - 1, info.bits, info.bits + 3, 2 * info.bits, 2], dt)
  if info.min < 0: amounts[-1] = -1  # a negative amount is a huge one to numpy
  x, n = A.arg(1, dt, xs.shape), A.arg(2, dt, xs.shape)
  for op, ref in ((lambda p, q: p << q, np.left_shift), (lambda p, q: p >> q, np.right_shift)):
    same(run(op(x, n), {1: xs, 2: amounts}, device), ref(xs, amounts))
    for s in (0, 3, info.bits - 1, info.bits):
      same(run(op(x, s), {1: xs}, device), ref(xs, s))
  if dt == np.uint64:  # a strong int32 scalar makes uint64 float64: numpy has no shift for it, nor has kc
    with pytest.raises(DTypeError, match="needs bool or int operands, got float64"): A.left_shift(x, np.int32(3))
  else: same(run(A.left_shift(x, np.int32(3)), {1: xs}, device), np.left_shift(xs, np.int32(3)))  # a strong numpy scalar
  same(run(np.right_shift(x, n), {1: xs, 2: amounts}, device), np.right_shift(xs, amounts))


def test_shift_dtypes_and_refusals():
  b = A.arg(1, np.bool_, (2,))
  assert (b << b).dtype == dtypes.int8 and (A.arg(1, np.int8, (2,)) << A.arg(2, np.int32, (2,))).dtype == dtypes.int32
  with pytest.raises(DTypeError, match="left_shift needs bool or int"): A.arg(1, np.float32, (2,)) << 1
  with pytest.raises(DTypeError, match="out of bounds for int8"): A.arg(1, np.int8, (2,)) << 200


# -------------------------------------------------------------------------------------------- var, std, argmax

AXES = [None, 0, -1, (0, 2), 1]


@pytest.mark.parametrize("dt", [np.float32, np.float16, np.float64, np.int16, np.uint8, np.bool_], ids=lambda d: np.dtype(d).name)
def test_var_and_std_match_numpy(device, dt):
  rng = np.random.default_rng(3)
  a = (rng.standard_normal((3, 4, 5)) * 5 + 100).astype(dt) if dt != np.bool_ else rng.random((3, 4, 5)) > 0.5
  x = A.arg(1, dt, a.shape)
  rtol = 5e-3 if dt == np.float16 else 1e-5
  for axis, ddof, keepdims in itertools.product(AXES, (0, 1), (False, True)):
    for name in ("var", "std"):
      want = getattr(np, name)(a, axis=axis, ddof=ddof, keepdims=keepdims)
      got = getattr(np, name)(x, axis=axis, ddof=ddof, keepdims=keepdims) if keepdims else getattr(x, name)(axis, ddof=ddof)
      same(run(got, {1: a}, device), want, rtol=rtol, atol=1e-6)  # numpy's function and the method


def test_float32_var_is_two_pass(device):
  # a large mean and a small spread: one pass (E[x^2] - E[x]^2) loses every digit in float32, two passes keep them
  a = (np.float32(1e4) + np.random.default_rng(4).standard_normal(4096).astype(np.float32))
  got = run(A.arg(1, np.float32, a.shape).var(), {1: a}, device)
  same(got, a.var(), rtol=1e-4)


def test_var_with_ddof_past_the_count_is_numpys_inf_or_nan(device):
  a = np.array([1.0, 2.0, 3.0], np.float32)
  with np.errstate(all="ignore"), warnings.catch_warnings():
    warnings.simplefilter("ignore")
    same(run(A.arg(1, np.float32, (3,)).var(ddof=3), {1: a}, device), a.var(ddof=3))


def _argvalues(dt, rng, shape) -> np.ndarray:
  if dt == np.bool_: return rng.random(shape) > 0.7
  a = rng.integers(-3, 4, shape).astype(dt) if np.dtype(dt).kind in "iu" else rng.integers(-3, 4, shape).astype(dt) * 0.5
  return a  # few distinct values: ties are everywhere, and the first must win


@pytest.mark.parametrize("dt", [np.float32, np.float16, np.int8, np.uint8, np.int64, np.bool_], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5), (2, 3, 9)])
def test_argmax_argmin_match_numpy(device, dt, shape):
  rng = np.random.default_rng(5)
  a = _argvalues(dt, rng, shape)
  x = A.arg(1, dt, shape)
  for axis in [None] + list(range(-len(shape), len(shape))):
    for keepdims, name in itertools.product((False, True), ("argmax", "argmin")):
      want = getattr(np, name)(a, axis=axis, keepdims=keepdims)
      got = getattr(np, name)(x, axis=axis, keepdims=keepdims) if keepdims else getattr(x, name)(axis)
      same(run(got, {1: a}, device), want)  # numpy's function and the method


@pytest.mark.parametrize("values", [[1.0, np.nan, 3.0, np.nan], [np.nan, np.nan], [np.inf, 1.0, np.inf], [-0.0, 0.0],
                                    [-np.inf, -np.inf, 2.0], [3.0, np.inf, np.nan, -np.inf]])
def test_argmax_argmin_special_values(device, values):
  a = np.array(values, np.float32)
  x = A.arg(1, np.float32, a.shape)
  same(run(x.argmax(), {1: a}, device), np.argmax(a))
  same(run(x.argmin(), {1: a}, device), np.argmin(a))


def test_argmax_refusals():
  x = A.arg(1, np.float32, (3, 4))
  with pytest.raises(InvalidASTError, match="one axis"): x.argmax((0, 1))
  with pytest.raises(InvalidASTError): x.argmax(2)


# ---------------------------------------------------------------------------------------------- squeeze & co

def test_squeeze_ravel_flatten(device):
  a = np.arange(12, dtype=np.int32).reshape(1, 3, 1, 4)
  x = A.arg(1, np.int32, a.shape)
  for build, want in [(x.squeeze(), a.squeeze()), (x.squeeze(0), a.squeeze(0)), (x.squeeze((0, 2)), a.squeeze((0, 2))),
                      (x.ravel(), a.ravel()), (x.flatten(), a.flatten()), (np.squeeze(x, axis=2), np.squeeze(a, axis=2)),
                      (np.ravel(x), np.ravel(a)), (A.squeeze(x), np.squeeze(a)), (x.sum(1).squeeze(), a.sum(1).squeeze())]:
    same(run(build, {1: a}, device), want)
  with pytest.raises(InvalidASTError, match="axis 1 .* has size 3, not 1"): x.squeeze(1)


def test_square_of_bool_is_int8(device):
  a = np.array([True, False])
  same(run(A.arg(1, np.bool_, (2,)).square(), {1: a}, device), np.square(a))


@pytest.mark.parametrize("device", ["EMU", "CLANG"])
@pytest.mark.parametrize("dt", [dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.bfloat16, dtypes.float16])
@pytest.mark.parametrize("largest", [True, False])
def test_argmax_argmin_of_narrow_floats_with_a_padded_axis(device, dt, largest):
  # the axis (6) is padded to 8 with the dtype's least value: fp8e4m3 has no -inf (its -inf bits are NaN), and a
  # padded NaN won as "the first NaN" (every row gave 8)
  ml_dtypes = pytest.importorskip("ml_dtypes")
  md = {dtypes.fp8e4m3: ml_dtypes.float8_e4m3fn, dtypes.fp8e5m2: ml_dtypes.float8_e5m2, dtypes.bfloat16: ml_dtypes.bfloat16,
        dtypes.float16: np.float16}[dt]
  vals = np.array([[1, 2, 3, .5, .25, 1.5], [-448, -448, -1, 0, 2, 448], [0.25] * 6], np.float32).astype(md)
  x = A.arg(1, dt, (3, 6))
  got = kc.run(A.sink(A.store(0, x.argmax(1) if largest else x.argmin(1))), {1: vals}, device=device)[0]
  f32 = vals.astype(np.float32)
  np.testing.assert_array_equal(got, f32.argmax(1) if largest else f32.argmin(1))
