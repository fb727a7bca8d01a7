"""numpy's cumsum, cumprod (kc.ast.scan), concatenate and stack (kc.ast.joining) against numpy on CLANG and EMU: random
shapes, axes (None and negative ones), dtypes, `dtype=` keywords and part counts, with loads, computed values and
reduce results as operands; long axes take the blocked scan; numpy's errors are kc's typed ones (docs/AST.md).

numpy's float16 cumsum rounds to half after every step; kc's accumulates in float32 and rounds once, as its sum does,
so for float16 the oracle is numpy's float32 scan rounded to half (test_half_scan_rounds_once shows the difference)."""
from __future__ import annotations
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
import kc
from kc import ast as A, dtypes, DTypeError, InvalidASTError, ShapeError
from kc.ast.joining import CASTINGS, can_cast, concatenate, stack
from kc.ast.scan import BLOCKED_FROM, cumprod, cumsum
from kc.ir.uop import Variable
from kc.testing.compare import compare
from kc.testing.tolerance import EXACT, tolerance

DEVICES = [d for d in ("CLANG", "EMU") if d in kc.Device.available()]
DTYPES = [dtypes.float32, dtypes.float16, dtypes.int8, dtypes.int32, dtypes.bool, dtypes.uint8]
# numpy's exception class -> kc's typed error for the same input (docs/AST.md "Errors")
ERRORS = {TypeError: DTypeError, ValueError: InvalidASTError}
SCANS = {"cumsum": (cumsum, np.cumsum), "cumprod": (cumprod, np.cumprod)}
FORMS = ("load", "computed", "reduce")


def _values(rng, dt, shape) -> np.ndarray:
  if dt == dtypes.bool: return np.asarray(rng.random(shape) > 0.5)
  if dtypes.is_int(dt): return np.asarray(rng.integers(0 if dtypes.is_unsigned(dt) else -5, 6, shape)).astype(dt.np)
  # zeros among the floats: a computed -(x * 2) of them is -0.0, whose sign a join must keep
  return np.asarray(np.where(rng.random(shape) < 0.2, 0.0, rng.uniform(-2, 2, shape))).astype(dt.np)


def _operand(form: str, idx: int, dt, shape, rng):
  """An operand of `shape` read from buffer `idx` and its numpy value: a load, a value computed from one (exact in
  every dtype), or the max of a load over an extra axis of 2 to 4 (a reduce result: parts reduced over different
  lengths cannot share one kernel's reduce loop, and the scheduler splits them)."""
  if form == "reduce":
    a = _values(rng, dt, shape + (int(rng.integers(2, 5)),))
    return A.arg(idx, dt, a.shape).max(-1), a, np.asarray(a.max(-1))
  a = _values(rng, dt, shape)
  x = A.arg(idx, dt, shape)
  if form == "load": return x, a, a
  if dt == dtypes.bool: return ~x, a, np.asarray(~a)
  if dtypes.is_float(dt): return -(x * 2), a, np.asarray(-(a * 2))
  return x * 2, a, np.asarray(a * 2)


def _run(expr: A.Expr, inputs: dict) -> dict:
  sink = A.sink(A.store(0, expr))
  return {d: kc.run(sink, inputs, device=d)[0] for d in DEVICES}


def _check(got: np.ndarray, want: np.ndarray, tol, device: str, what) -> None:
  assert (got.shape, got.dtype) == (want.shape, want.dtype), (device, got.shape, got.dtype, want.dtype, what)
  res = compare(0, got, want, dtypes.from_numpy(want.dtype), tol)
  assert res.ok, f"{device}: {res.describe()}\n{what}"


# ***** cumsum, cumprod *****

@st.composite
def scan_cases(draw):
  dt = draw(st.sampled_from(DTYPES))
  shape = tuple(draw(st.lists(st.integers(1, 6), max_size=3)))
  axis = draw(st.one_of(st.none(), st.integers(-max(len(shape), 1), max(len(shape), 1) - 1)))
  dtype = draw(st.sampled_from([None, None, dtypes.float32, dtypes.int32, dtypes.bool]))
  name, form = draw(st.sampled_from(sorted(SCANS))), draw(st.sampled_from(FORMS))
  return name, dt, shape, axis, dtype, form, draw(st.integers(0, 2**16))


def _want_scan(fn, a: np.ndarray, axis, dtype) -> np.ndarray:
  out = fn(a, axis, dtype=None if dtype is None else dtype.np)
  # kc accumulates half in float32 and rounds once (the module docstring)
  return fn(a.astype(np.float32), axis).astype(np.float16) if out.dtype == np.float16 else out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scan_cases())
def test_scans_match_numpy(case):
  name, dt, shape, axis, dtype, form, seed = case
  fx, fa = SCANS[name]
  x, a, value = _operand(form, 1, dt, shape, np.random.default_rng(seed))
  y = fx(x, axis, dtype)
  want = _want_scan(fa, value, axis, dtype)
  assert y.shape == want.shape and y.dtype.np == want.dtype, (y, want.shape, want.dtype)
  tol = tolerance(dtypes.from_numpy(want.dtype), "reduce") if want.dtype.kind == "f" else EXACT
  for device, got in _run(y, {1: a}).items(): _check(got, want, tol, device, case)


# kc.ast.store writes a value read whole from an intermediate as the intermediate itself, and its test (a contiguous
# view) also takes a prefix of it: A.store(0, x.sum(1).realize()[:1]) stores both sums. A blocked scan of a length
# that is no whole number of blocks, stored as it is, ends in such a prefix (its last shrink)


@pytest.mark.parametrize("name, dt, shape, axis", [
  # one element past the windowed form: the last block padded
  pytest.param("cumsum", dtypes.float32, (BLOCKED_FROM + 1,), 0),
  ("cumsum", dtypes.uint8, (5, 512), 1),  # whole blocks, a row at a time
  ("cumsum", dtypes.int32, (3, 1000), 1),  # padded to whole blocks and shrunk back, a row at a time
  ("cumsum", dtypes.int8, (1024, 2), -2),  # whole blocks, the first axis of two
  ("cumprod", dtypes.float32, (2, 700), -1),
  # int64 products that wrap: exact in any order
  pytest.param("cumprod", dtypes.int8, (600,), None),
  # more blocks than BLOCKED_FROM: the block totals are blocked again
  pytest.param("cumsum", dtypes.int32, (70001,), 0),
])
def test_long_axes_take_the_blocked_scan(name, dt, shape, axis):
  fx, fa = SCANS[name]
  rng = np.random.default_rng(len(shape) + shape[-1])
  if dt == dtypes.float32:  # close to 1, so that long products stay finite and sums keep their relative precision
    a = (1 + rng.uniform(-0.01, 0.01, shape) if name == "cumprod" else rng.uniform(0, 1, shape)).astype(np.float32)
  else: a = _values(rng, dt, shape)
  y = fx(A.arg(1, dt, shape), axis)
  # float sums against float64's rounded once: the blocked sum is closer to it than numpy's sequential float32 one
  want = fa(a.astype(np.float64), axis).astype(np.float32) if dt == dtypes.float32 else fa(a, axis)
  tol = tolerance(dtypes.float32, "reduce") if dt == dtypes.float32 else EXACT
  for device, got in _run(y, {1: a}).items(): _check(got, want, tol, device, (name, shape, axis))


def test_half_scan_rounds_once():
  """256 halves of 0.1: numpy's half accumulate rounds at every step and ends at 25.16; kc's float32 accumulator
  rounded once ends at 25.6, the float32 scan's value in half."""
  a = np.full(256, 0.1, np.float16)
  want = np.cumsum(a.astype(np.float32)).astype(np.float16)
  for device, got in _run(cumsum(A.arg(1, dtypes.float16, (256,))), {1: a}).items():
    _check(got, want, tolerance(dtypes.float16, "arith"), device, "half cumsum")
    assert got[-1] == np.float16(25.6) != np.cumsum(a)[-1]


def test_scan_of_a_computed_value_pads_with_the_identity():
  """exp2(x) scanned: the padding before the first element is 0 for a sum and 1 for a product, not exp2(0)."""
  a = np.array([[0.5, -1.0, 2.0], [3.0, 0.0, -0.25]], np.float32)
  x = A.arg(1, dtypes.float32, a.shape).exp2()
  for y, want in [(cumsum(x, 1), np.cumsum(np.exp2(a), 1)), (cumprod(x, 1), np.cumprod(np.exp2(a), 1))]:
    tol = tolerance(dtypes.float32, "transcendental")
    for device, got in _run(y, {1: a}).items(): _check(got, want, tol, device, y)


# ***** concatenate, stack *****

@st.composite
def join_cases(draw):
  name = draw(st.sampled_from(["concatenate", "stack"]))
  ndim = draw(st.integers(1 if name == "concatenate" else 0, 3))
  shape = [draw(st.integers(1, 3)) for _ in range(ndim)]
  if name == "stack": axis = draw(st.integers(-ndim - 1, ndim))
  else: axis = draw(st.one_of(st.none(), st.integers(-ndim, ndim - 1)))
  parts = []
  for _ in range(draw(st.integers(1, 4))):
    part = list(shape)
    if name == "concatenate": part[0 if axis is None else axis] = draw(st.integers(1, 3))
    parts.append((draw(st.sampled_from(DTYPES)), tuple(part), draw(st.sampled_from(FORMS))))
  dtype = draw(st.sampled_from([None, None, None] + DTYPES))
  return name, axis, parts, dtype, draw(st.integers(0, 2**16))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(join_cases())
def test_joins_match_numpy(case):
  name, axis, specs, dtype, seed = case
  rng = np.random.default_rng(seed)
  operands = [_operand(form, i + 1, dt, shape, rng) for i, (dt, shape, form) in enumerate(specs)]
  fx, fa = (concatenate, np.concatenate) if name == "concatenate" else (stack, np.stack)
  try: want = fa([v for _, _, v in operands], axis=axis, dtype=None if dtype is None else dtype.np)
  except TypeError:  # a `dtype` the parts cannot reach under numpy's same_kind casting
    with pytest.raises(DTypeError): fx([x for x, _, _ in operands], axis, dtype)
    return
  y = fx([x for x, _, _ in operands], axis, dtype)
  assert y.shape == want.shape and y.dtype.np == want.dtype, (y, want.shape, want.dtype)
  for device, got in _run(y, {i + 1: a for i, (_, a, _) in enumerate(operands)}).items():
    # every part is exact, so the join is too, bit for bit (-0.0 keeps its sign)
    same_bits = got.dtype == want.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8))
    assert same_bits, (device, got, want, case)


def test_join_keeps_negative_zero():
  x = A.arg(1, dtypes.float32, (2, 2))
  a = np.array([[0.0, 1.0], [-2.0, 0.0]], np.float32)
  joins = [(concatenate([-x, x], 1), np.concatenate([-a, a], 1)), (stack([x, -x, x], -1), np.stack([a, -a, a], -1))]
  for y, want in joins:
    for device, got in _run(y, {1: a}).items():
      assert np.array_equal(np.signbit(got), np.signbit(want)) and np.array_equal(got, want), (device, got, want)


def test_joined_reduce_results():
  """Reduce results as parts, beside a load and with the same kernel's reduce axis shared: sums, maxima and a row."""
  a = np.random.default_rng(3).uniform(-1, 1, (4, 5)).astype(np.float32)
  x = A.arg(1, dtypes.float32, a.shape)
  y = concatenate([x.sum(1), x.max(1), x[0]])
  want = np.concatenate([a.sum(1), a.max(1), a[0]])
  for device, got in _run(y, {1: a}).items(): _check(got, want, tolerance(dtypes.float32, "reduce"), device, y)


def test_parts_are_iterated_as_numpy_does():
  """numpy joins what iterating its argument gives: an array's rows, and so an expression's."""
  a = np.arange(12, dtype=np.int32).reshape(3, 4)
  x = A.arg(1, dtypes.int32, a.shape)
  for y, want in [(concatenate(x), np.concatenate(a)), (stack(x, 1), np.stack(a, 1)), (stack((x[2], x[0])), a[[2, 0]])]:
    for device, got in _run(y, {1: a}).items(): _check(got, want, EXACT, device, y)


@pytest.mark.parametrize("casting", CASTINGS)
def test_can_cast_is_numpys(casting):
  kinds = [d for d in dtypes.fields().values() if d.np is not None]
  assert len(kinds) == 12  # bool, 8 ints, 3 floats: every kc dtype numpy has
  wrong = [(s.name, d.name) for s in kinds for d in kinds
           if can_cast(s, d, casting) != np.can_cast(s.np, d.np, casting)]
  assert not wrong, wrong


# ***** errors: numpy's class, kc's typed error *****

M, MA = A.arg(1, dtypes.float32, (2, 3)), np.zeros((2, 3), np.float32)
V, VA = A.arg(2, dtypes.float32, (2,)), np.zeros(2, np.float32)
S, SA = A.arg(3, dtypes.float32, ()), np.zeros((), np.float32)
JOINS = {"concatenate": (concatenate, np.concatenate), "stack": (stack, np.stack)}
# (kc's call, numpy's call) of a function pair (kc's, numpy's): the scans' or the joins'
SCAN_ERRORS = {
  "axis out of range": (lambda f: f(M, 2), lambda f: f(MA, 2)),
  "negative axis out of range": (lambda f: f(M, -3), lambda f: f(MA, -3)),
  "axis a tuple": (lambda f: f(M, (0,)), lambda f: f(MA, (0,))),
  "axis a float": (lambda f: f(M, 1.0), lambda f: f(MA, 1.0)),
  "axis a bool": (lambda f: f(M, True), lambda f: f(MA, True)),
  "0-d on axis 1": (lambda f: f(S, 1), lambda f: f(SA, 1)),
}
JOIN_ERRORS = {
  "nothing": (lambda f: f([]), lambda f: f([])),
  "axis out of range": (lambda f: f([M, M], 3), lambda f: f([MA, MA], 3)),
  "negative axis out of range": (lambda f: f([M, M], -4), lambda f: f([MA, MA], -4)),
  "axis a float": (lambda f: f([M, M], 1.0), lambda f: f([MA, MA], 1.0)),
  "unknown casting": (lambda f: f([M], casting="bogus"), lambda f: f([MA], casting="bogus")),
  "float parts to an int dtype": (lambda f: f([M, M], dtype=dtypes.int32), lambda f: f([MA, MA], dtype=np.int32)),
  "a mismatched part": (lambda f: f([M, M[:, :2]], 0), lambda f: f([MA, MA[:, :2]], 0)),
  "parts of two ranks": (lambda f: f([M, V]), lambda f: f([MA, VA])),
  "0-d parts": (lambda f: f([S, S]), lambda f: f([SA, SA])),
}
ERROR_CASES = {f"{name}: {case}": (family[name], table[case])
               for family, table in ((SCANS, SCAN_ERRORS), (JOINS, JOIN_ERRORS)) for name in family for case in table}


@pytest.mark.parametrize("name", sorted(ERROR_CASES))
def test_numpy_errors_are_typed_errors(name):
  """Where numpy raises, kc raises the typed error of numpy's class; where it does not (stack of 0-d parts), neither
  does kc, and the shapes agree."""
  (fx, fa), (cx, ca) = ERROR_CASES[name]
  try: want = ca(fa)
  except Exception as e:
    with pytest.raises(next(k for cls, k in ERRORS.items() if isinstance(e, cls))): cx(fx)
  else: assert cx(fx).shape == want.shape


def test_symbolic_lengths():
  """A symbolic length may be any axis but the scanned or joined one, whose offsets must be numbers."""
  n = Variable("n", 1, 10)
  x = A.arg(1, dtypes.float32, (n, 3))
  assert cumsum(x, 1).shape == (n, 3) and concatenate([x, x], 1).shape == (n, 6) and stack([x, x], 1).shape == (n, 2, 3)
  with pytest.raises(InvalidASTError, match="symbolic axis 0"): cumsum(x, 0)
  with pytest.raises(InvalidASTError, match="symbolic axis 0"): concatenate([x, x])


def test_shape_errors_say_what_numpy_says():
  with pytest.raises(ShapeError, match="along dimension 1, the array at index 0 has size 3 and the array at index 1 "
                                       "has size 2"):
    concatenate([M, M[:, :2]])
  with pytest.raises(ShapeError, match="same number of dimensions"): concatenate([M, V])
  with pytest.raises(ShapeError, match=r"same shape, but the array at index 1 has shape \(2, 2\)"): stack([M, M[:, :2]])
  with pytest.raises(InvalidASTError, match="zero-dimensional"): concatenate([S, S])
  n, m = Variable("n", 1, 10), Variable("m", 1, 10)
  with pytest.raises(ShapeError, match="index 0 has size n and the array at index 1 has size m"):
    concatenate([A.arg(1, dtypes.float32, (n, 2)), A.arg(2, dtypes.float32, (m, 2))], 1)
  with pytest.raises(InvalidASTError, match="need at least one array to stack"): stack([])


@pytest.mark.parametrize("call, error", [
  (lambda: cumsum(MA), InvalidASTError), (lambda: cumprod(2.0), InvalidASTError),  # as every kc.ast function's
  (lambda: concatenate([M, MA]), DTypeError), (lambda: stack(MA), DTypeError),  # as an operator's operands
  (lambda: concatenate([M, 1.0]), DTypeError), (lambda: stack(5), DTypeError)])
def test_non_expressions_are_refused(call, error):
  """numpy would take arrays and scalars here; kc.ast takes expressions (A.const, A.arg), which have no values before
  their kernel runs."""
  with pytest.raises(error): call()


@pytest.mark.parametrize("shape,axis", [((0,), 0), ((1, 0, 2), 1), ((3, 0), None), ((2, 0, 3), 2), ((2, 0, 3), 0)])
@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
def test_scans_over_empty_arrays_are_numpys(name, shape, axis):
  """kc fuzz seed 1 case 135: a scan of a length-0 axis padded it by -1. An empty scan is an empty result."""
  a = np.zeros(shape, np.float16)
  x = A.arg(1, dtypes.float16, shape)
  got = kc.run(A.sink(A.store(0, getattr(x.sqrt(), name)(axis=axis).tanh())), {1: a}, "CLANG")[0]
  want = np.tanh(getattr(np, name)(np.sqrt(a), axis=axis))
  assert got.shape == want.shape and got.dtype == want.dtype


@pytest.mark.parametrize("lengths", [(0, 2), (2, 0), (0, 0), (0, 2, 0), (1, 0, 1)])
def test_joins_with_empty_parts_keep_every_buffer(lengths):
  """A part of length 0 adds no element but is still a buffer the program takes (numpy takes it too)."""
  arrays = [np.arange(n * 3, dtype=np.float32).reshape(n, 3) + 10 * i for i, n in enumerate(lengths)]
  parts = [A.arg(i + 1, dtypes.float32, (n, 3)) for i, n in enumerate(lengths)]
  got = kc.run(A.sink(A.store(0, A.concatenate([p * 2 for p in parts], 0))), {i + 1: a for i, a in enumerate(arrays)}, "CLANG")[0]
  assert np.array_equal(got, np.concatenate([a * 2 for a in arrays], 0))
