"""numpy objects meeting kc.ast expressions: numpy scalars promote as numpy 2 promotes them (strong, unlike Python's),
numpy's ufuncs and functions on an Expr are kc.ast's ops (reversed operands included), and what kc.ast cannot mean
(an ndarray operand, np.asarray, out=, a ufunc it lacks, len() of a 0-d value) is a TypeError naming what to write."""
import numpy as np
import pytest
from kc import ast as A, dtypes, DTypeError
from ast_run import DEVICES, device, run  # noqa: F401 (device is a fixture)

ARRAY_DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64, np.float16, np.float32, np.float64]
NUMPY_SCALARS = [np.bool_(True), np.int8(3), np.uint8(3), np.int16(3), np.int32(3), np.int64(3), np.uint64(3),
                 np.float16(2), np.float32(2), np.float64(2)]


def same(got: np.ndarray, want, rtol=1e-6):
  want = np.asarray(want)
  assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
  np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, equal_nan=True)


@pytest.mark.parametrize("dt", ARRAY_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("s", NUMPY_SCALARS, ids=lambda s: type(s).__name__)
def test_numpy_scalars_are_strong_as_in_numpy2(dt, s):
  x = A.arg(1, dt, (3,))
  want = np.result_type(np.zeros(3, dt), s)
  for expr in (x + s, s + x, x * s, s * x, A.maximum(x, s), A.where(x == x, s, x)):
    assert expr.dtype == dtypes.from_numpy(want), (expr.dtype, want)


def test_numpy_scalars_compute_as_numpy(device):
  f, i = np.array([1.5, -2.0, 0.25], np.float32), np.array([1, -2, 100], np.int8)
  x, b = A.arg(1, np.float32, (3,)), A.arg(1, np.int8, (3,))
  with np.errstate(all="ignore"):
    for build, ref, arr in [(lambda: x * np.float32(2), f * np.float32(2), f), (lambda: np.float32(2) * x, np.float32(2) * f, f),
                            (lambda: x * np.float64(2), f * np.float64(2), f), (lambda: np.float32(2) * b, np.float32(2) * i, i),
                            (lambda: b + np.int8(100), i + np.int8(100), i), (lambda: b - np.int16(300), i - np.int16(300), i),
                            (lambda: x ** np.float32(2), f ** np.float32(2), f), (lambda: b ** np.int64(2), i ** np.int64(2), i),
                            (lambda: x < np.float32(0.25), f < np.float32(0.25), f), (lambda: b + np.True_, i + np.True_, i),
                            (lambda: np.float32(1) / x, np.float32(1) / f, f),
                            (lambda: A.clip(x, np.float32(0), 1), np.clip(f, np.float32(0), 1), f)]:
      same(run(build(), {1: arr}, device), ref)
  assert (x + np.array(2.0)).dtype == dtypes.float64  # a 0-d array handed over by numpy is its scalar, strong


UFUNCS = [np.add, np.subtract, np.multiply, np.divide, np.floor_divide, np.remainder, np.power, np.maximum, np.minimum,
          np.less, np.greater, np.less_equal, np.greater_equal, np.equal, np.not_equal, np.logical_and, np.logical_or,
          np.logical_xor]


@pytest.mark.parametrize("ufunc", UFUNCS, ids=lambda u: u.__name__)
def test_binary_ufuncs_on_expressions(device, ufunc):
  a = np.array([1.5, -2.0, 0.25, 3.0], np.float32)
  c = np.array([2.0, 0.5, -1.0, 3.0], np.float32)
  x, y = A.arg(1, np.float32, (4,)), A.arg(2, np.float32, (4,))
  with np.errstate(all="ignore"):
    same(run(ufunc(x, y), {1: a, 2: c}, device), ufunc(a, c), rtol=1e-5)
    same(run(ufunc(x, 2), {1: a}, device), ufunc(a, 2), rtol=1e-5)  # a Python scalar stays weak
    same(run(ufunc(np.float32(2), x), {1: a}, device), ufunc(np.float32(2), a), rtol=1e-5)  # reversed, numpy scalar first


UNARY = [np.exp, np.exp2, np.log, np.log2, np.sqrt, np.sin, np.cos, np.tanh, np.negative, np.positive, np.absolute, np.abs,
         np.reciprocal, np.square, np.sign, np.floor, np.ceil, np.trunc, np.rint, np.isnan, np.isinf, np.isfinite]


@pytest.mark.parametrize("ufunc", UNARY, ids=lambda u: u.__name__)
def test_unary_ufuncs_on_expressions(device, ufunc):
  a = np.array([1.5, 2.0, 0.25, 3.5], np.float32)
  same(run(ufunc(A.arg(1, np.float32, (4,))), {1: a}, device), ufunc(a), rtol=1e-5)


def test_int_ufuncs_on_expressions(device):
  a = np.array([1, -2, 7, 0], np.int16)
  x = A.arg(1, np.int16, (4,))
  for ufunc in (np.bitwise_and, np.bitwise_or, np.bitwise_xor, np.left_shift, np.right_shift):
    same(run(ufunc(x, 3), {1: a}, device), ufunc(a, 3))
  same(run(np.invert(x), {1: a}, device), np.invert(a))
  same(run(np.bitwise_not(x), {1: a}, device), np.bitwise_not(a))


def test_numpy_functions_on_expressions(device):
  a = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
  x = A.arg(1, np.float32, (3, 4))
  for got, want in [(np.sum(x), np.sum(a)), (np.sum(x, axis=0), np.sum(a, axis=0)), (np.sum(x, 1, keepdims=True), np.sum(a, 1, keepdims=True)),
                    (np.mean(x, axis=1), np.mean(a, axis=1)), (np.max(x, axis=0), np.max(a, axis=0)), (np.amin(x), np.amin(a)),
                    (np.prod(x, axis=1), np.prod(a, axis=1)), (np.var(x, axis=1, ddof=1), np.var(a, axis=1, ddof=1)),
                    (np.std(x), np.std(a)), (np.any(x > 5, axis=1), np.any(a > 5, axis=1)), (np.all(x > -6), np.all(a > -6)),
                    (np.argmax(x, axis=1), np.argmax(a, axis=1)), (np.argmin(x), np.argmin(a)),
                    (np.where(x > 0, x, 0), np.where(a > 0, a, 0)), (np.clip(x, -1, 2), np.clip(a, -1, 2)),
                    (np.reshape(x, (4, 3)), np.reshape(a, (4, 3))), (np.transpose(x), np.transpose(a)),
                    (np.transpose(x, (1, 0)), np.transpose(a, (1, 0))), (np.flip(x, 1), np.flip(a, 1)), (np.ravel(x), np.ravel(a)),
                    (np.broadcast_to(x, (2, 3, 4)), np.broadcast_to(a, (2, 3, 4))), (np.round(x / 3, 1), np.round(a / 3, 1)),
                    (np.add.reduce(x), np.add.reduce(a)), (np.maximum.reduce(x, axis=1), np.maximum.reduce(a, axis=1)),
                    (np.matmul(x, np.transpose(x)), np.matmul(a, a.T))]:
    same(run(got, {1: a}, device), want, rtol=1e-5)
  assert np.shape(x) == (3, 4) and np.ndim(x) == 2 and np.size(x) == 12


@pytest.mark.parametrize("bad,match", [
  (lambda x: np.arange(4) + x, "np.ndarray operands are not kc expressions; use A.const or an A.arg buffer"),
  (lambda x: x + np.arange(4), "np.ndarray operands are not kc expressions"),
  (lambda x: np.add(x, np.ones(4)), "np.ndarray operands are not kc expressions"),
  (lambda x: np.where(np.ones(4) > 0, x, 0), "np.ndarray operands are not kc expressions"),
  (lambda x: np.asarray(x), "has no values until its kernel runs"),
  (lambda x: np.array(x), "has no values until its kernel runs"),
  (lambda x: np.sum(x, out=np.zeros(())), "is not written in place; store it with A.store"),
  (lambda x: np.exp(x, out=np.zeros(4)), "is not written in place"),
  (lambda x: np.add(x, 1, where=np.ones(4, bool)), "where="),
  (lambda x: np.sinh(x), "numpy.sinh has no kc.ast counterpart"),
  (lambda x: np.add.accumulate(x), "numpy.add.accumulate has no kc.ast counterpart"),
  (lambda x: np.sort(x), "numpy.sort has no kc.ast counterpart"),
  (lambda x: np.sum(x, initial=1.0), "numpy.sum with these arguments has no kc.ast counterpart"),
  (lambda x: np.add(x, 1, dtype=np.float64), "cast the operands with .astype"),
  (lambda x: np.where(x > 0), "returns indices"),
  (lambda x: x + "a", "cannot combine a kc.ast expression with str"),
  (lambda x: len(x.sum()), "len\\(\\) of a 0-d kc.ast expression"),
  (lambda x: list(x.sum()), "len\\(\\) of a 0-d kc.ast expression"),
])
def test_what_kc_cannot_mean_is_a_type_error_saying_what_to_write(bad, match):
  x = A.arg(1, np.float32, (4,))
  with pytest.raises(DTypeError, match=match): bad(x)
  assert issubclass(DTypeError, TypeError)


def test_iteration_and_len_follow_numpy(device):
  a = np.arange(6, dtype=np.float32).reshape(2, 3)
  x = A.arg(1, np.float32, (2, 3))
  assert len(x) == 2 and [r.shape for r in x] == [(3,), (3,)]
  for row, want in zip(x, a): same(run(row * 2, {1: a}, device), want * 2)


def test_sliding_window_view_takes_axes_of_the_input_as_given():
  # each window adds an axis at the end: negative axes are the input's, resolved before the first window
  x = A.arg(1, dtypes.float32, (5, 6))
  swv = np.lib.stride_tricks.sliding_window_view
  assert swv(x, (2, 3), axis=(-2, -1)).shape == swv(np.zeros((5, 6)), (2, 3), axis=(-2, -1)).shape == (4, 4, 2, 3)


def test_np_power_and_the_operator_treat_a_numpy_scalar_exponent_alike(device):
  i, f = A.arg(1, dtypes.int32, (4,)), A.arg(1, dtypes.float32, (4,))
  iv, fv = np.arange(4, dtype=np.int32), np.array([0.5, -2, 3, 1e3], np.float32)
  for e in (np.int64(2), np.int8(3)):
    assert np.power(i, e).dtype == (i ** e).dtype == dtypes.from_numpy(np.power(iv, e).dtype)
    np.testing.assert_array_equal(run(np.power(i, e), {1: iv}, device), np.power(iv, e))
  # a numpy float scalar of an integer value squares exactly, whichever spelling
  assert np.power(f, np.float32(2)).uop is (f ** np.float32(2)).uop
  np.testing.assert_array_equal(run(np.power(f, np.float32(2)), {1: fv}, device), fv * fv)
