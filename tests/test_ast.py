"""kc.ast speaks numpy: each behaviour checked against numpy 2 on CLANG and EMU, and the dtype tables of
kc.ast.promotion checked entry by entry against the installed numpy."""
import numpy as np
import pytest
import kc
from kc import ast as A, dtypes, DTypeError, InvalidASTError, Ops
from kc.errors import ShapeError
from kc.ast import promotion as P
from kc.ir.dtype import least_upper_dtype

DEVICES = ["CLANG", "EMU"]
NP_DTYPES = [d for d in dtypes.all if d.np is not None]


@pytest.fixture(params=DEVICES)
def device(request):
  if request.param not in kc.Device.available(): pytest.skip(f"{request.param} cannot open here")
  return request.param


def run(expr: A.Expr, inputs: dict, device: str) -> np.ndarray:
  """The stored output, shaped as the expression's numpy shape (the buffer holds exactly its elements)."""
  out = kc.run(A.sink(A.store(0, expr)), inputs, device=device)[0]
  assert out.size == int(np.prod(expr.shape))
  return out.reshape(expr.shape)


def same(got: np.ndarray, want, rtol=1e-5, atol=1e-6):
  want = np.asarray(want)
  assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
  np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)


# ----------------------------------------------------------------------------------------------------- the tables

@pytest.mark.parametrize("a", NP_DTYPES, ids=lambda d: d.name)
def test_array_promotion_matches_numpy(a):
  for b in NP_DTYPES: assert least_upper_dtype(a, b).np == np.promote_types(a.np, b.np), (a, b)


@pytest.mark.parametrize("dt", NP_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("scalar", [True, 3, 2.5], ids=["bool", "int", "float"])
def test_weak_scalar_table_matches_numpy(dt, scalar):
  want = (np.ones(2, dt.np) + scalar).dtype
  assert P.result_dtype([dt], [scalar]).np == want
  rule = P.WEAK_SCALAR[(P.kind(dt), P.kind(scalar))]
  assert (dt if rule == "array" else least_upper_dtype(dt, rule)).np == want


@pytest.mark.parametrize("dt", NP_DTYPES, ids=lambda d: d.name)
def test_float_and_reduce_tables_match_numpy(dt):
  a = np.ones(3, dt.np)
  assert P.unary_float(dt).np == np.exp(a).dtype == np.sqrt(a).dtype
  assert P.divide_float(dt).np == (a / a).dtype == np.mean(a).dtype
  if not dtypes.is_bool(dt): assert P.sum_dtype(dt).np == np.sum(a).dtype == np.prod(a).dtype
  else: assert P.sum_dtype(dt).np == np.sum(a).dtype


def test_scalars_alone_take_numpys_defaults():
  assert P.result_dtype([], [1]) == dtypes.int64 and P.result_dtype([], [1, 2.5]) == dtypes.float64
  assert P.result_dtype([], [True]) == dtypes.bool


@pytest.mark.parametrize("dt", [d for d in NP_DTYPES if dtypes.is_int(d)], ids=lambda d: d.name)
def test_out_of_range_int_scalar_is_a_typed_error(dt):
  for v in (dtypes.max(dt) + 1, dtypes.min(dt) - 1):
    with pytest.raises(OverflowError): np.ones(2, dt.np) + v  # numpy's answer
    with pytest.raises(DTypeError, match=f"{v} out of bounds for {dt.name}"): A.arg(1, dt, (2,)) + v


# ----------------------------------------------------------------------------------------------------- the examples

def test_float_scalar_makes_int_float64(device):
  x = A.arg(1, dtypes.int32, (4,))
  a = np.arange(4, dtype=np.int32)
  same(run(x * 2.5, {1: a}, device), a * 2.5)
  same(run(x // 2.5, {1: a}, device), a // 2.5)
  h = A.arg(1, dtypes.float16, (4,))
  assert (h * 2.5).dtype == dtypes.float16 and (h + 1).dtype == dtypes.float16


def test_uint8_plus_300_raises():
  with pytest.raises(DTypeError, match="300 out of bounds for uint8"): A.arg(1, dtypes.uint8, (4,)) + 300
  with pytest.raises(DTypeError): A.arg(1, dtypes.uint8, (4,)) * -1


def test_eq_ne_build_comparisons(device):
  x, y = A.arg(1, dtypes.int32, (6,)), A.arg(2, dtypes.int32, (6,))
  a, b = np.array([0, 1, 0, 3, 4, 0], np.int32), np.array([0, 2, 1, 3, 0, 0], np.int32)
  assert isinstance(x == 0, A.Expr) and (x == 0).dtype == dtypes.bool
  out = kc.run(A.sink(A.store(0, x != y), A.store(3, x.eq(y)), A.store(4, x.ne(y))), {1: a, 2: b}, device=device)
  same(out[0], a != b); same(out[3], a == b); same(out[4], a != b)
  z = A.arg(2, dtypes.float32, (6,))
  f = np.arange(6, dtype=np.float32)
  same(run((x == 0).where(z, -1.0), {1: a, 2: f}, device), np.where(a == 0, f, np.float32(-1.0)))
  # identity hashing: Exprs are dict keys and set members
  d = {x: "x", y: "y"}
  assert d[x] == "x" and d[y] == "y" and len({x, y, x}) == 2
  with pytest.raises(InvalidASTError, match="truth value"): bool(x == y)


def test_out_of_range_comparisons_follow_numpy(device):
  u = np.array([0, 7, 255], np.uint8)
  x = A.arg(1, dtypes.uint8, (3,))
  for e, want in [(x < 300, u < 300), (x == -1, u == -1), (x >= -1, u >= -1), (300 > x, 300 > u)]: same(run(e, {1: u}, device), want)


@pytest.mark.parametrize("name,build,ref,lo,hi", [
  ("exp", lambda x: x.exp(), np.exp, -3, 3), ("log", lambda x: x.log(), np.log, 0.1, 5), ("sqrt", A.sqrt, np.sqrt, 0, 5),
  ("sin", A.sin, np.sin, -3, 3), ("cos", A.cos, np.cos, -3, 3), ("abs", abs, np.abs, -3, 3), ("neg", lambda x: -x, np.negative, -3, 3),
  ("pow3", lambda x: x ** 3, lambda a: a ** 3, -2, 2), ("pow-2", lambda x: x ** -2, lambda a: a ** -2, 0.5, 2),
  ("pow1.5", lambda x: x ** 1.5, lambda a: a ** 1.5, -2, 2), ("rpow", lambda x: 2.0 ** x, lambda a: 2.0 ** a, -2, 2),
  ("powexpr", lambda x: x ** (x * 0 + 3.0), lambda a: a ** np.float32(3.0), -2, 2),
  ("clip", lambda x: x.clip(-0.5, 0.5), lambda a: np.clip(a, -0.5, 0.5), -2, 2),
  ("floordiv", lambda x: x // 0.3, lambda a: a // np.float32(0.3), -2, 2), ("mod", lambda x: x % 0.3, lambda a: a % np.float32(0.3), -2, 2),
  ("maximum", lambda x: A.maximum(x, 0.25), lambda a: np.maximum(a, 0.25), -2, 2),
  ("minimum", lambda x: A.minimum(x, 0.25), lambda a: np.minimum(a, 0.25), -2, 2),
])
def test_elementwise_ops(device, name, build, ref, lo, hi):
  a = np.random.default_rng(0).uniform(lo, hi, (3, 5)).astype(np.float32)
  with np.errstate(invalid="ignore"): want = ref(a)
  same(run(build(A.arg(1, dtypes.float32, (3, 5))), {1: a}, device), want, rtol=2e-5, atol=2e-6)


def test_int_ops(device):
  a = np.random.default_rng(1).integers(-50, 50, (3, 4)).astype(np.int8)
  x = A.arg(1, dtypes.int8, (3, 4))
  with np.errstate(over="ignore"):
    cases = [(x ** 2, a ** 2), (abs(x), np.abs(a)), (~x, ~a), (x.exp2(), np.exp2(a)), (x / 3, a / 3), (x.sum(1), a.sum(1)),
             (x.min(1), a.min(1)), (x.mean(0), a.mean(0)), (x @ x.T, a @ a.T), (x + 1.5, a + 1.5)]
  for e, want in cases: same(run(e, {1: a}, device), want, rtol=1e-3, atol=1e-3)
  b = a > 0
  xb = A.arg(1, dtypes.bool, (3, 4))
  for e, want in [(xb + xb, b + b), (xb * 2.5, b * 2.5), (xb.sum(0), b.sum(0)), (xb ** 2, b ** 2), (xb @ xb.T, b @ b.T),
                  (xb.min(1), b.min(1)), (A.logical_or(xb, ~xb), np.logical_or(b, ~b)), (A.logical_xor(xb, True), np.logical_xor(b, True))]:
    same(run(e, {1: b}, device), want)


def test_reduces_with_keepdims(device):
  a = np.random.default_rng(2).standard_normal((3, 4, 5)).astype(np.float32)
  x = A.arg(1, dtypes.float32, (3, 4, 5))
  for axis in (None, 0, 1, 2, (0, 2), (-1, -3)):
    for keepdims in (False, True):
      for name in ("sum", "max", "min", "mean", "prod"):
        e = getattr(x, name)(axis, keepdims=keepdims)
        assert e.shape == getattr(a, name)(axis=axis, keepdims=keepdims).shape
  same(run(x.sum(1), {1: a}, device), a.sum(1), rtol=1e-5)
  same(run(x.min((0, 2)), {1: a}, device), a.min((0, 2)))
  same(run(x.mean(2, keepdims=True), {1: a}, device), a.mean(2, keepdims=True), rtol=1e-5)
  same(run(A.max(x, 0) - x, {1: a}, device), a.max(0) - a)
  same(run(x - x.mean(1, keepdims=True), {1: a}, device), a - a.mean(1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_reduce_results_reshape(device):
  a = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
  x = A.arg(1, dtypes.float32, (4, 6))
  s = x.sum(1)
  assert s.shape == (4,) and s.reshape(4, 1).shape == (4, 1) and s[None].shape == (1, 4)
  same(run(s.reshape(1, 4, 1) * 2.0, {1: a}, device), (a.sum(1) * 2).reshape(1, 4, 1), rtol=1e-5)
  same(run(x.sum(0).reshape(2, 3), {1: a}, device), a.sum(0).reshape(2, 3), rtol=1e-5)  # stored as the reduce's output
  # a general reshape of a reduce result computed with: the reduce is materialised by a kernel of its own
  same(run(x.sum(0).reshape(2, 3) + 1.0, {1: a}, device), a.sum(0).reshape(2, 3) + 1.0, rtol=1e-5)
  with pytest.raises(InvalidASTError, match="cannot reshape"): s.reshape(5)
  # the stored output holds exactly the logical elements
  out = np.zeros(4, np.float32)
  kc.compile(A.sink(A.store(0, s)), device=device)(out, a)
  same(out, a.sum(1), rtol=1e-5)


def test_indexing(device):
  a = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
  x = A.arg(1, dtypes.float32, (3, 4, 5))
  for idx in [1, -1, (0, 2), (slice(None), 1), (slice(1, None), slice(None, None, 2)), (Ellipsis, slice(None, None, -1)),
              (slice(None, None, -2), None, 1, slice(4, 0, -3)), (None, Ellipsis, 0), (2, 3, 4)]:
    same(run(x[idx] + 0.0, {1: a}, device), a[idx] + np.float32(0.0))
  same(run(x.sum(2)[1:, -1], {1: a}, device), a.sum(2)[1:, -1])
  for bad in [3, (0, 0, 0, 0), "a", 1.5]:  # (an empty slice is numpy's: test_empty_slices_are_numpys_empty_arrays)
    with pytest.raises(InvalidASTError): x[bad]


def test_matmul_shapes(device):
  rng = np.random.default_rng(4)
  for sa, sb in [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 2))]:
    a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
    same(run(A.arg(1, dtypes.float32, sa) @ A.arg(2, dtypes.float32, sb), {1: a, 2: b}, device), a @ b, rtol=1e-5, atol=1e-5)
  with pytest.raises(InvalidASTError, match="contracted dims"): A.arg(1, dtypes.float32, (3, 4)) @ A.arg(2, dtypes.float32, (3, 4))


def test_half_sums_accumulate_in_float32(device):
  # 4096 ones: a half accumulator stops at 2048 (2048 + 1 rounds back to 2048); numpy's answer is 4096
  a = np.ones((2, 4096), np.float16)
  x = A.arg(1, dtypes.float16, (2, 4096))
  e = x.sum(1)
  assert e.dtype == dtypes.float16 and any(u.op is Ops.REDUCE_AXIS and u.dtype == dtypes.float32 for u in e.uop.toposort)
  same(run(e, {1: a}, device), a.sum(1))
  same(run(x.mean(1), {1: a}, device), a.mean(1))
  assert all(u.dtype == dtypes.float16 for u in x.max(1).uop.toposort if u.op is Ops.REDUCE_AXIS)  # max needs no widening


def test_pad_of_a_computed_value_is_zero(device):
  a = np.arange(4, dtype=np.float32)
  x = A.arg(1, dtypes.float32, (4,))
  same(run(x.exp2().pad(((1, 1),)), {1: a}, device), np.pad(np.exp2(a), 1))
  same(run((x + 1.0).pad(((1, 1),)), {1: a}, device), np.pad(a + 1, 1))
  m = np.arange(12, dtype=np.float32).reshape(3, 4)
  y = A.arg(1, dtypes.float32, (3, 4))
  same(run(y.exp2().sum(1).pad(((2, 1),)), {1: m}, device), np.pad(np.exp2(m).sum(1), (2, 1)), rtol=1e-6)
  same(run(y.max(1, keepdims=True).pad(((0, 0), (1, 2))), {1: m}, device), np.pad(m.max(1, keepdims=True), ((0, 0), (1, 2))))


def test_reduce_broadcast_along_a_kept_axis_is_computed_per_row(device):
  a, b = np.arange(5, dtype=np.float32).reshape(1, 5), np.arange(4, dtype=np.float32).reshape(4, 1)
  e = A.arg(1, dtypes.float32, (1, 5)).sum(1) * A.arg(2, dtypes.float32, (4, 1))
  assert e.shape == (4, 1)
  same(run(e, {1: a, 2: b}, device), a.sum(1) * b)
  # the expand went below the reduce: its input is (4, 1, 5)-shaped, no VIEW above a value is needed
  reduce = next(u for u in e.uop.toposort if u.op is Ops.REDUCE_AXIS)
  assert 4 in reduce.src[0].src[1].arg.shape


def test_reduce_results_broadcast_as_numpy_does(device):
  """(4, 6) - (4,) does not broadcast in numpy, so it does not here (no kept-axes reading); (6, 4) - (4,) does, and the
  row maxima are then read along the other axis."""
  a = np.random.default_rng(5).standard_normal((4, 6)).astype(np.float32)
  x = A.arg(1, dtypes.float32, (4, 6))
  with pytest.raises(ShapeError, match="broadcast"): x.max(1).expand(4, 6)
  with pytest.raises(InvalidASTError, match="do not broadcast"): x - x.max(1)
  same(run((x - x.max(1, keepdims=True)).exp2().sum(1), {1: a}, device), np.exp2(a - a.max(1, keepdims=True)).sum(1), rtol=1e-5)
  same(run(x.T - x.max(1), {1: a}, device), a.T - a.max(1))
  same(run((x.T - x.max(1)).sum(0), {1: a}, device), (a.T - a.max(1)).sum(0), rtol=1e-5)


def test_typed_errors():
  x, b = A.arg(1, dtypes.float32, (3, 4)), A.arg(2, dtypes.bool, (3, 4))
  i = A.arg(3, dtypes.int32, (3, 4))
  for fn, err in [(lambda: -b, DTypeError), (lambda: b - b, DTypeError), (lambda: x & 1, DTypeError), (lambda: ~x, DTypeError),
                  (lambda: i ** -1, InvalidASTError),
                  (lambda: x + A.arg(4, dtypes.float32, (2, 4)), InvalidASTError),
                  (lambda: x.sum(2), InvalidASTError), (lambda: x.sum((0, 0)), InvalidASTError), (lambda: x + "a", DTypeError),
                  (lambda: x.permute(0, 0), InvalidASTError), (lambda: x.reshape(-1, -1), InvalidASTError), (lambda: A.clip(x), InvalidASTError),
                  (lambda: A.arg(1, "float", (3,)), InvalidASTError), (lambda: x.pad(((1, 1),)), InvalidASTError)]:
    with pytest.raises(err): fn()
  assert issubclass(DTypeError, TypeError) and issubclass(InvalidASTError, ValueError)  # numpy raises these classes


def test_astype_and_module_functions(device):
  a = np.random.default_rng(6).uniform(-3, 3, (5,)).astype(np.float32)
  x = A.arg(1, dtypes.float32, (5,))
  same(run(x.astype(np.int16), {1: a}, device), a.astype(np.int16))
  same(run(A.where(x > 0, x, 0), {1: a}, device), np.where(a > 0, a, 0).astype(np.float32))
  same(run(A.exp(x) + A.log(A.abs(x) + 1.0), {1: a}, device), np.exp(a) + np.log(np.abs(a) + 1), rtol=1e-5)
  same(run(A.sum(x) + A.mean(x), {1: a}, device), np.sum(a) + np.mean(a), rtol=1e-5)


def test_docs_table_is_the_builders_table():
  import pathlib, re
  doc = (pathlib.Path(__file__).parent.parent / "docs" / "AST.md").read_text()
  table = doc.split("<!-- weak-scalar-table -->")[1].split("<!-- /weak-scalar-table -->")[0]
  rows = [r for r in re.findall(r"^\| (\w+) \| (\w+) \| (\w+) \|$", table, re.M) if r[0] != "array"]
  names = {v: k for k, v in P.KIND_NAMES.items()}
  documented = {(names[a], names[s]): (r if r == "array" else getattr(dtypes, r)) for a, s, r in rows}
  assert documented == P.WEAK_SCALAR


@pytest.mark.parametrize("dt", [np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint32, np.bool_])
def test_int_arrays_to_int_array_powers_as_numpy(dt, device):
  """x ** y of int arrays: numpy's values (wrapping) for every exponent >= 0; a negative exponent, where numpy raises,
  is C's integer power (1 for 1, +-1 for -1, else 0), as docs/AST.md says."""
  rng = np.random.default_rng(np.dtype(dt).itemsize)
  signed = np.issubdtype(dt, np.signedinteger)
  a = rng.integers(-4 if signed else 0, 5, 40).astype(dt) if dt is not np.bool_ else rng.integers(0, 2, 40).astype(bool)
  b = rng.integers(0, 80 if dt is not np.bool_ else 2, 40).astype(dt)
  x, y = A.arg(1, dtypes.from_numpy(dt), (40,)), A.arg(2, dtypes.from_numpy(dt), (40,))
  got = kc.run(A.sink(A.store(0, x ** y)), {1: a, 2: b}, device)[0]
  assert got.dtype == (a ** b).dtype and np.array_equal(got, a ** b)
  if signed:
    base, exp = np.array([1, -1, -1, 2, -3, 0], dt), np.array([-3, -3, -2, -1, -1, -5], dt)
    got = kc.run(A.sink(A.store(0, A.arg(1, dtypes.from_numpy(dt), (6,)) ** A.arg(2, dtypes.from_numpy(dt), (6,)))),
                 {1: base, 2: exp}, device)[0]
    assert got.tolist() == [1, -1, 1, 0, 0, 0]


@pytest.mark.parametrize("idx", [np.s_[1:1], np.s_[:, 3:1], np.s_[::-1, 5:], np.s_[2:0:1, ::2], np.s_[0, 2:2]])
def test_empty_slices_are_numpys_empty_arrays(idx, device):
  a = np.arange(12, dtype=np.float32).reshape(3, 4)
  y = A.arg(1, dtypes.float32, (3, 4))
  e = y[idx]
  assert e.shape == a[idx].shape
  out = kc.run(A.sink(A.store(0, e * 2), A.store(2, e.sum(0) if e.ndim else e)), {1: a}, device)
  assert out[0].shape == a[idx].shape and np.array_equal(out[2], a[idx].sum(0) if a[idx].ndim else a[idx])
