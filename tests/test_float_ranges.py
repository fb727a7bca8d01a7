"""Float value ranges are sound for every float value, NaN and the infinities included: a float's (vmin, vmax) holds
each non-NaN value it takes and is (-inf, inf) wherever it may be NaN, so no fold that reads bounds (a comparison, a
clamp, 0*y) fires where a NaN or an infinity would change the answer. The property tests build random float expression
trees, check every node's value against its bounds, and check the simplified tree against the original through the
rewrite's own evaluator (exec_alu), which test_exec_alu_is_numpy holds to numpy."""
import math
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import kc
from kc import ast as A, dtypes
from kc.ir.dtype import cast_scalar, truncate
from kc.ir.symbolic import simplify
from kc.ir.uop import Ops, UOp, exec_alu

ml_dtypes = pytest.importorskip("ml_dtypes")
DEVICES = [d for d in ("EMU", "CLANG") if kc.Device.unavailable_reason(d) is None]
SPECIALS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, 2.5, -2.5, 3.0, 1e-3, 1e30, -1e30]
FLOAT_DTYPES = [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64, dtypes.fp8e4m3, dtypes.fp8e5m2]
NP_FLOAT = {dtypes.float16: np.float16, dtypes.float32: np.float32, dtypes.float64: np.float64}


# ***** random float expression trees over UOps *****

def _input(dt, i: int) -> UOp:
  """An unknown float: a LOAD the evaluator reads from its environment (it may be anything, NaN included)."""
  return UOp(Ops.LOAD, dt, (UOp(Ops.DEFINE_GLOBAL, dt.ptr(), (), i),))


def _bounded(dt, i: int, lo: int, hi: int) -> UOp:
  """A float known to lie in [lo, hi]: a converted int Variable."""
  return UOp.variable(f"v{i}_{lo}_{hi}", lo, hi).cast(dt)


UNARY = {"exp2": Ops.EXP2, "log2": Ops.LOG2, "sqrt": Ops.SQRT, "recip": Ops.RECIP, "sin": Ops.SIN}


@st.composite
def float_trees(draw, dt, depth=4):
  if depth == 0 or draw(st.integers(0, 3)) == 0:
    kind = draw(st.sampled_from(["input", "bounded", "const"]))
    if kind == "input": return _input(dt, draw(st.integers(0, 1)))
    if kind == "bounded":
      lo = draw(st.integers(-4, 4))
      return _bounded(dt, draw(st.integers(0, 1)), lo, lo + draw(st.integers(0, 4)))
    return UOp.const(dt, draw(st.sampled_from(SPECIALS)))
  sub = lambda: draw(float_trees(dt, depth - 1))  # noqa: E731
  op = draw(st.sampled_from(["add", "sub", "mul", "max", "min", "neg", "where", "fdiv", "pow", "exp2", "log2", "sqrt",
                             "recip", "sin", "int_round_trip"]))
  if op == "neg": return -sub()
  if op in UNARY: return sub().alu(UNARY[op])
  if op == "where": return draw(bool_trees(dt, depth - 1)).where(sub(), sub())
  if op == "int_round_trip": return sub().cast(dtypes.int32).cast(dt)  # NaN, inf, huge to an int: never an error
  a, b = sub(), sub()
  return {"add": lambda: a + b, "sub": lambda: a.alu(Ops.SUB, b), "mul": lambda: a * b, "max": lambda: a.maximum(b),
          "min": lambda: a.minimum(b), "fdiv": lambda: a.alu(Ops.FDIV, b), "pow": lambda: a.alu(Ops.POW, b)}[op]()


@st.composite
def bool_trees(draw, dt, depth=3):
  a, b = draw(float_trees(dt, depth)), draw(float_trees(dt, depth))
  return draw(st.sampled_from([a.lt(b), a.ne(b), a.eq(b), b.lt(a)]))


def evaluate(root: UOp, env: dict) -> dict:
  """Every node's value, through exec_alu (constant folding's evaluator) and cast_scalar."""
  vals: dict[UOp, object] = {}
  for u in root.toposort:
    if u.op is Ops.CONST: vals[u] = u.arg
    elif u.op is Ops.LOAD: vals[u] = truncate(u.dtype, env[u.src[0].arg])
    elif u.op is Ops.DEFINE_VAR: vals[u] = env[u.arg[0]]
    elif u.op is Ops.CAST: vals[u] = cast_scalar(u.dtype, vals[u.src[0]])
    elif u.op is Ops.DEFINE_GLOBAL: continue
    else: vals[u] = exec_alu(u.op, u.dtype, tuple(vals[s] for s in u.src))
  return vals


def same(a, b) -> bool:
  """Equal as values, NaN equal to NaN and -0.0 not equal to 0.0."""
  if isinstance(a, float) and isinstance(b, float):
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
  return a == b


def environments(draw):
  return {0: draw(st.sampled_from(SPECIALS) | st.floats(-1e6, 1e6)),
          1: draw(st.sampled_from(SPECIALS) | st.floats(-10, 10))}


def _bind_variables(root: UOp, env: dict, draw) -> None:
  for v in root.variables(): env[v.arg[0]] = draw(st.integers(v.arg[1], v.arg[2]))


def assert_within_bounds(root: UOp, vals: dict) -> None:
  for u, v in vals.items():
    if u.dtype.count != 1 or u.dtype.scalar() == dtypes.void: continue
    lo, hi = u.bounds
    if isinstance(v, float) and math.isnan(v):
      assert (lo, hi) == (-math.inf, math.inf), f"{u.render(False)} is NaN, bounds {lo}..{hi}"
    else: assert lo <= v <= hi, f"{u.render(False)} = {v} is outside its bounds {lo}..{hi}"


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.data())
def test_bounds_hold_every_value_and_folding_keeps_it(data):
  dt = data.draw(st.sampled_from(FLOAT_DTYPES))
  root = data.draw(st.one_of(float_trees(dt), bool_trees(dt)))
  for _ in range(4):
    env = environments(data.draw)
    _bind_variables(root, env, data.draw)
    want = evaluate(root, env)
    assert_within_bounds(root, want)
    folded = simplify(root)
    got = evaluate(folded, env)
    assert_within_bounds(folded, got)
    assert same(got[folded], want[root]), \
      f"{root.render(False)} -> {folded.render(False)}: {got[folded]} != {want[root]} at {env}"


# ***** the evaluator is numpy *****

_NUMPY_OPS = {Ops.ADD: np.add, Ops.SUB: np.subtract, Ops.MUL: np.multiply, Ops.MAX: np.maximum, Ops.FDIV: np.divide,
              Ops.POW: np.power, Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal, Ops.NEG: np.negative,
              Ops.RECIP: np.reciprocal, Ops.SQRT: np.sqrt}


@pytest.mark.parametrize("dt", list(NP_FLOAT), ids=lambda d: d.name)
@pytest.mark.parametrize("op", list(_NUMPY_OPS), ids=lambda o: o.name)
def test_exec_alu_is_numpy(dt, op):
  """Constant folding gives numpy's answer for every pair of special values (the correctly rounded ops exactly)."""
  npt = NP_FLOAT[dt]
  vals = [truncate(dt, v) for v in SPECIALS]
  pairs = [(a,) for a in vals] if op in (Ops.NEG, Ops.RECIP, Ops.SQRT) else [(a, b) for a in vals for b in vals]
  for args in pairs:
    # on arrays: numpy's scalar power takes x ** 0.5 as sqrt(x)
    with np.errstate(all="ignore"): want = _NUMPY_OPS[op](*(np.array([a], npt) for a in args))[0]
    want = bool(want) if op in (Ops.CMPLT, Ops.CMPNE) else float(want)
    got = exec_alu(op, dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE) else dt, args)
    if op is Ops.POW and dt != dtypes.float64 and isinstance(got, float) and math.isfinite(got) and got != 0:
      assert math.isclose(got, want, rel_tol=2.0 ** -(10 if dt == dtypes.float16 else 22)), (op, args, got, want)
    elif op is Ops.MAX and got == want == 0: continue  # of -0.0 and 0.0 numpy's float16 maximum gives the first
    else: assert same(got, want), (op, args, got, want)


# ***** the reproducers, on the devices *****

def _run(expr, inputs, device):
  return kc.run(A.sink(A.store(0, expr)), inputs, device=device)[0]


F32 = np.float32


@pytest.mark.parametrize("device", DEVICES)
def test_a_clamp_of_a_nan_capable_power_is_kept(device):
  x = np.array([2.0, -1.0, 0.25], F32)
  got = _run((A.arg(1, dtypes.float32, (3,)) ** 2.5).clip(-2.0, 1.0), {1: x}, device)
  with np.errstate(invalid="ignore"): want = np.clip(x ** F32(2.5), -2.0, 1.0)
  np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_a_comparison_of_a_where_with_a_nan_capable_branch_is_kept(device):
  x, c = np.array([2.0, 0.25], F32), np.array([False, False])
  got = _run(A.where(A.arg(2, dtypes.bool, (2,)), 2.0, A.arg(1, dtypes.float32, (2,)) ** 2.5) < 2, {1: x, 2: c}, device)
  np.testing.assert_array_equal(got, np.where(c, 2.0, x ** F32(2.5)) < 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("y", [math.nan, math.inf, -math.inf])
def test_zero_times_y_in_a_padded_region_is_not_folded(device, y):
  x, yv = np.array([1.0], F32), np.full(2, y, F32)
  padded = A.arg(1, dtypes.float32, (1,)).pad(((1, 0),))
  with np.errstate(invalid="ignore"):
    got = _run((padded * A.arg(2, dtypes.float32, (2,))) == 0, {1: x, 2: yv}, device)
    np.testing.assert_array_equal(got, (np.pad(x, (1, 0)) * yv) == 0)
    got = _run(A.minimum(padded * y, -2.0), {1: x}, device)
    np.testing.assert_array_equal(got, np.minimum(np.pad(x, (1, 0)) * F32(y), F32(-2.0)))


# ***** random kc.ast expressions on the devices against numpy *****

CONSTS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5]


@st.composite
def ast_trees(draw, depth=3):
  """(kc.ast expression, numpy function of the inputs) of float32 (2,) inputs 1 and 2, a pad among the ops. Ops that
  need not round exactly alike (pow, exp2, log2) only feed ops that cannot magnify a last-bit difference."""
  if depth == 0 or draw(st.integers(0, 3)) == 0:
    kind = draw(st.sampled_from(["x", "y", "padded", "const"]))
    if kind == "const":
      c = draw(st.sampled_from(CONSTS))
      return (lambda x, y, c=c: A.const(c, dtypes.float32, (2,))), (lambda x, y, c=c: F32(c)), True
    if kind == "padded": return (lambda x, y: x[:1].pad(((1, 0),))), (lambda x, y: np.pad(x[:1], (1, 0))), True
    return (lambda x, y, k=kind: x if k == "x" else y), (lambda x, y, k=kind: x if k == "x" else y), True
  op = draw(st.sampled_from(["add", "mul", "maximum", "minimum", "where", "neg", "sqrt", "recip", "pow", "exp2", "log2",
                             "clip"]))
  (fa, na, ea), (fb, nb, eb) = draw(ast_trees(depth - 1)), draw(ast_trees(depth - 1))
  if op in ("add", "mul") and not (ea and eb): op = "maximum"
  exact = ea and eb and op not in ("pow", "exp2", "log2")
  table = {
    "add": (lambda x, y: fa(x, y) + fb(x, y), lambda x, y: na(x, y) + nb(x, y)),
    "mul": (lambda x, y: fa(x, y) * fb(x, y), lambda x, y: na(x, y) * nb(x, y)),
    "maximum": (lambda x, y: A.maximum(fa(x, y), fb(x, y)), lambda x, y: np.maximum(na(x, y), nb(x, y))),
    "minimum": (lambda x, y: A.minimum(fa(x, y), fb(x, y)), lambda x, y: np.minimum(na(x, y), nb(x, y))),
    "where": (lambda x, y: A.where(fa(x, y) < fb(x, y), fb(x, y), fa(x, y)),
              lambda x, y: np.where(na(x, y) < nb(x, y), nb(x, y), na(x, y))),
    "neg": (lambda x, y: -fa(x, y), lambda x, y: -na(x, y)),
    "sqrt": (lambda x, y: A.sqrt(fa(x, y)), lambda x, y: np.sqrt(na(x, y))),
    "recip": (lambda x, y: 1.0 / fa(x, y), lambda x, y: F32(1.0) / na(x, y)),
    "pow": (lambda x, y: fa(x, y) ** 2.5, lambda x, y: na(x, y) ** F32(2.5)),
    "exp2": (lambda x, y: A.exp2(fa(x, y)), lambda x, y: np.exp2(na(x, y))),
    "log2": (lambda x, y: A.log2(fa(x, y)), lambda x, y: np.log2(na(x, y))),
    "clip": (lambda x, y: A.clip(fa(x, y), -2.0, 1.0), lambda x, y: np.clip(na(x, y), F32(-2.0), F32(1.0))),
  }
  build, ref = table[op]
  return build, ref, exact


def _reading(expr, like):
  return A.where(like == like, expr, expr)  # the same value, with `like`'s buffer read even where expr is a constant


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=40, deadline=None, derandomize=True)
@given(tree=ast_trees(), xs=st.lists(st.sampled_from(SPECIALS), min_size=4, max_size=4))
def test_random_float_expressions_match_numpy(device, tree, xs):
  build, ref, _ = tree
  xy = A.arg(1, dtypes.float32, (2, 2))  # x and y are its rows: a tree that reads only one still reads the buffer
  x, y = xy[0], xy[1]
  xv, yv = np.array(xs[:2], F32), np.array(xs[2:], F32)
  with np.errstate(all="ignore"): want = np.broadcast_to(F32(ref(xv, yv)), (2,)).astype(F32)
  got = _run(_reading(build(x, y), x), {1: np.stack([xv, yv])}, device)
  special = ~np.isfinite(want) | (want == 0)
  np.testing.assert_array_equal(np.where(special, got, 0), np.where(special, want, 0))
  np.testing.assert_allclose(got[~special], want[~special], rtol=1e-5)
