"""Random kc.ast expressions against numpy 2: a chain of ops drawn from the builder's surface (arithmetic with arrays
and weak Python scalars, comparisons, where, maximum/minimum, unary math, casts, movement, indexing, pads of computed
values, one reduce or matmul with random axes and keepdims) over random shapes and dtypes. Each is run on CLANG and
EMU, and on OPENCL where its renderer declares every dtype the kernel uses; the result must match numpy's within the
conformance tolerance table, and where numpy raises, kc must raise the typed error ERRORS maps numpy's class to.

Draws stay clear of what other parts of kc do not promise yet: one reduce per kernel (a reduce of a reduce, and two
reduces over different axes, are code-generation limits), and narrow ints only in ops that cannot overflow."""
from __future__ import annotations
import sys
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
import kc
from kc import ast as A, dtypes, DTypeError, InvalidASTError, Ops
from kc.testing.compare import compare
from kc.testing.tolerance import tolerance

# numpy's exception class -> kc's typed error for the same input (docs/AST.md "Errors")
ERRORS = {OverflowError: DTypeError, TypeError: DTypeError, ValueError: InvalidASTError}
DTYPES = [dtypes.float32, dtypes.float16, dtypes.float64, dtypes.int32, dtypes.int16, dtypes.uint8, dtypes.bool]
NARROW = (dtypes.int16, dtypes.uint8)
DEVICES = [d for d in ("CLANG", "EMU", "OPENCL") if d in kc.Device.available()]


class Chain:
  """The expression built so far, on both sides: kc's Expr and numpy's array, plus what the draws must respect."""
  def __init__(self, x: A.Expr, a: np.ndarray, leaves: list):
    self.x, self.a, self.leaves, self.reduced, self.loose, self.transcendental = x, a, leaves, False, False, 0
    self.steps = [f"{x!r} and {leaves[1][0]!r}"]

  def __repr__(self): return " -> ".join(self.steps)

  def set(self, x, a, loose=False):
    self.steps.append(f"{sys._getframe(1).f_code.co_name}: {x!r}")  # the reproducer hypothesis prints
    self.x, self.a = x, np.asarray(a)
    self.loose |= loose
    return self


def _values(draw, dt, shape) -> np.ndarray:
  rng = np.random.default_rng(draw(st.integers(0, 2**16)))
  if dt == dtypes.bool: return rng.random(shape) > 0.5
  if dtypes.is_int(dt): return rng.integers(0 if dtypes.is_unsigned(dt) else -5, 6, shape).astype(dt.np)
  return rng.uniform(-2, 2, shape).astype(dt.np)


def _scalar(draw, dt):
  kind = draw(st.sampled_from(["bool", "int", "float"]))
  if kind == "bool": return draw(st.booleans())
  if kind == "int": return draw(st.integers(0 if dt in NARROW or dtypes.is_unsigned(dt) else -3, 3))
  return draw(st.sampled_from([0.5, -1.25, 2.0]))


def _broadcasts(*shapes) -> bool:
  try: np.broadcast_shapes(*shapes); return True
  except ValueError: return False


def _other(draw, c: Chain):
  """A leaf that broadcasts with the chain, or a Python scalar."""
  ok = [leaf for leaf in c.leaves if _broadcasts(leaf[1].shape, c.a.shape)]
  if ok and draw(st.booleans()): return draw(st.sampled_from(ok))
  s = _scalar(draw, c.x.dtype)
  return s, s


def op_arith(draw, c: Chain):
  (o, on), name = _other(draw, c), draw(st.sampled_from(["+", "-", "*", "max", "min"]))
  narrow = c.x.dtype in NARROW or (isinstance(o, A.Expr) and o.dtype in NARROW)
  if name == "*" and narrow: name = "+"
  if name == "-" and (dtypes.is_unsigned(c.x.dtype) or narrow or dtypes.is_bool(c.x.dtype)): name = "max"
  if name == "-" and (isinstance(o, bool) or (isinstance(o, A.Expr) and dtypes.is_bool(o.dtype))): name = "+"
  # integer floor division and modulo (numpy's rounding, and 0 for a divisor of 0) where both sides are integers
  if dtypes.is_int(c.x.dtype) and (isinstance(o, int) and not isinstance(o, bool) or isinstance(o, A.Expr) and dtypes.is_int(o.dtype)) \
     and draw(st.booleans()): name = draw(st.sampled_from(["//", "%"]))
  fx = {"+": lambda p, q: p + q, "-": lambda p, q: p - q, "*": lambda p, q: p * q, "max": A.maximum, "min": A.minimum,
        "//": lambda p, q: p // q, "%": lambda p, q: p % q}[name]
  fa = {"+": np.add, "-": np.subtract, "*": np.multiply, "max": np.maximum, "min": np.minimum, "//": np.floor_divide, "%": np.remainder}[name]
  if name in ("+", "-", "*", "//", "%") and draw(st.booleans()): return c.set(fx(o, c.x), fa(on, c.a))  # the reflected operator
  return c.set(fx(c.x, o), fa(c.a, on))


def op_divide(draw, c: Chain):
  o, on = draw(st.sampled_from(c.leaves)) if draw(st.booleans()) else (None, None)
  if o is None or not _broadcasts(on.shape, c.a.shape) or dtypes.is_bool(o.dtype): return c.set(c.x / 4, c.a / 4)
  return c.set(c.x / (abs(o) + 1), c.a / (np.abs(on) + 1), loose=True)


def op_compare(draw, c: Chain):
  (o, on), cmp = _other(draw, c), draw(st.sampled_from(["<", ">", "<=", ">=", "==", "!="]))
  f = {"<": lambda p, q: p < q, ">": lambda p, q: p > q, "<=": lambda p, q: p <= q, ">=": lambda p, q: p >= q,
       "==": lambda p, q: p == q, "!=": lambda p, q: p != q}[cmp]
  cond, condn = f(c.x, o), f(c.a, on)
  if draw(st.booleans()): return c.set(cond, condn)
  (p, pn) = _other(draw, c)
  if draw(st.booleans()): return c.set(A.where(cond, c.x, p), np.where(condn, c.a, pn))
  return c.set(cond.where(p, c.x), np.where(condn, pn, c.a))


def op_unary(draw, c: Chain):
  dt, name = c.x.dtype, draw(st.sampled_from(["neg", "abs", "sin", "cos", "sqrt", "log", "exp", "square", "cube", "clip", "not"]))
  if name == "not": return c.set(A.logical_not(c.x), np.logical_not(c.a))
  if name == "neg" and (dtypes.is_bool(dt) or dtypes.is_unsigned(dt)): name = "abs"
  if name in ("square", "cube") and (dt in NARROW or dtypes.is_bool(dt)): name = "clip"
  if name == "exp" and (c.transcendental or c.reduced or c.loose): name = "sin"
  if name in ("sin", "cos", "sqrt", "log", "exp"): c.transcendental += 1
  if name == "clip":
    lo = 0 if dtypes.is_unsigned(dt) or dtypes.is_bool(dt) else -1
    return c.set(c.x.clip(lo, 2), np.clip(c.a, lo, 2))
  fx = {"neg": lambda x: -x, "abs": abs, "sin": A.sin, "cos": A.cos, "sqrt": lambda x: A.sqrt(abs(x)),
        "log": lambda x: (abs(x) + 1).log(), "exp": A.exp, "square": lambda x: x ** 2, "cube": lambda x: x ** 3}[name]
  fa = {"neg": np.negative, "abs": np.abs, "sin": np.sin, "cos": np.cos, "sqrt": lambda a: np.sqrt(np.abs(a)),
        "log": lambda a: np.log(np.abs(a) + 1), "exp": np.exp, "square": lambda a: a ** 2, "cube": lambda a: a ** 3}[name]
  return c.set(fx(c.x), fa(c.a))


def op_cast(draw, c: Chain):
  # float -> int conversions of values outside the int's range are undefined in C: only widen, or go to a float
  to = draw(st.sampled_from([dtypes.float32, dtypes.float64, dtypes.float16] + ([dtypes.int32] if not dtypes.is_float(c.x.dtype) else [])))
  return c.set(c.x.astype(to), c.a.astype(to.np))


def op_move(draw, c: Chain):
  nd = c.x.ndim
  if nd == 0: return c.set(c.x[None], c.a[None])
  kind = draw(st.sampled_from(["flip", "T", "index", "pad", "newaxis", "reshape"]))
  if kind == "flip": return c.set(c.x.flip(nd - 1), np.flip(c.a, nd - 1))
  if kind == "T": return c.set(c.x.T, c.a.T)
  if kind == "newaxis": return c.set(c.x[:, None], c.a[:, None])
  if kind == "reshape":
    if c.reduced: return c.set(c.x.reshape(c.a.shape + (1,)), c.a.reshape(c.a.shape + (1,)))
    return c.set(c.x.reshape(-1), c.a.reshape(-1))
  if kind == "pad":
    return c.set(c.x.pad(((1, 0),) + ((0, 0),) * (nd - 1)), np.pad(c.a, ((1, 0),) + ((0, 0),) * (nd - 1)))
  n = c.a.shape[0]
  idx = draw(st.sampled_from([0, -1, slice(None, None, -1), slice(1, None), slice(None, None, 2)]))
  if isinstance(idx, slice) and len(range(*idx.indices(n))) == 0: idx = 0
  return c.set(c.x[idx], c.a[idx])


def op_reduce(draw, c: Chain):
  if c.reduced or c.x.ndim == 0: return op_unary(draw, c)
  c.reduced = True
  if draw(st.integers(0, 3)) == 0 and c.x.ndim >= 1 and not dtypes.is_bool(c.x.dtype) and c.x.dtype not in NARROW:
    k = c.a.shape[-1]
    w = _values(draw, c.x.dtype, (k, 2))
    wx = A.arg(3, c.x.dtype, (k, 2))
    c.leaves = c.leaves + [(wx, w)]
    c.inputs[3] = w
    return c.set(c.x @ wx, c.a @ w, loose=True)
  name = draw(st.sampled_from(["sum", "max", "min", "mean", "prod"]))
  if name == "prod" and (c.x.dtype in NARROW): name = "sum"
  axes = draw(st.lists(st.integers(0, c.x.ndim - 1), min_size=1, max_size=c.x.ndim, unique=True))
  axis = None if len(axes) == c.x.ndim and draw(st.booleans()) else tuple(axes)
  keepdims = draw(st.booleans())
  return c.set(getattr(c.x, name)(axis, keepdims=keepdims), getattr(c.a, name)(axis=axis, keepdims=keepdims),
               loose=name in ("sum", "mean", "prod"))


OPS = [op_arith, op_arith, op_compare, op_unary, op_unary, op_cast, op_move, op_reduce, op_reduce, op_divide]


@st.composite
def chains(draw):
  dt = draw(st.sampled_from(DTYPES))
  shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
  drop = draw(st.integers(0, len(shape) - 1))
  shape2 = tuple(1 if draw(st.booleans()) else s for s in shape[drop:])
  dt2 = draw(st.sampled_from([dt, dt, dtypes.float32, dtypes.int32]))
  a, b = _values(draw, dt, shape), _values(draw, dt2, shape2)
  x, y = A.arg(1, dt, shape), A.arg(2, dt2, shape2)
  c = Chain(x, a, [(x, a), (y, b)])
  c.inputs = {1: a, 2: b}
  for op in draw(st.lists(st.sampled_from(OPS), min_size=1, max_size=4)):
    # a move one kernel cannot express is refused by the builder, typed and at once: the chain goes on without it
    try: c = op(draw, c)
    except kc.InvalidASTError as e:
      assert "one kernel" in str(e) or "same kernel" in str(e), e
      continue
    if c.x.dtype in NARROW and c.transcendental: break
  return c


def _kernel_dtypes(sink) -> set:
  return {u.dtype.scalar() for u in sink.toposort if u.dtype.count == 1 and u.dtype in dtypes.all}


def _renumber(store, inputs: dict):
  """Buffer indices with none missing: a chain may use the matmul weight (3) but not the second leaf (2), and A.sink
  refuses the gap."""
  bufs = sorted({u for u in store.toposort if u.op is Ops.DEFINE_GLOBAL}, key=lambda u: u.arg)
  subst = {u: u.replace(arg=i) for i, u in enumerate(bufs) if u.arg != i}
  return A.sink(store.substitute(subst) if subst else store), {i: inputs[u.arg] for i, u in enumerate(bufs) if u.arg in inputs}


def _kind(c: Chain, out_dt) -> str:
  if not dtypes.is_float(out_dt): return "exact"
  return "reduce" if (c.loose or c.transcendental or c.reduced) else "arith"


@settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(chains())
def test_random_expressions_match_numpy(c: Chain):
  want = np.asarray(c.a)
  assert c.x.shape == want.shape and c.x.dtype.np == want.dtype, (c.x, want.shape, want.dtype)
  sink, inputs = _renumber(A.store(0, c.x), c.inputs)
  used = _kernel_dtypes(sink)
  # a value computed in half and cast to float32 carries half's error: the tolerance is that of the least precise float
  floats = sorted((d for d in used if dtypes.is_float(d)), key=lambda d: d.itemsize)
  tol = tolerance(floats[0] if floats and dtypes.is_float(c.x.dtype) else c.x.dtype, _kind(c, c.x.dtype))
  for device in DEVICES:
    renderer = kc.Device[device].renderer
    if device == "OPENCL" and not all(getattr(renderer, "supports_dtype", lambda d: True)(d) for d in used): continue
    # half held in float keeps float intermediates (kc_opencl's README): an exact output computed from half values, a
    # comparison say, may differ from numpy's half-rounded one by design
    if getattr(renderer, "half_in_float", False) and dtypes.float16 in used and not dtypes.is_float(c.x.dtype): continue
    try:
      with np.errstate(all="ignore"): got = kc.run(sink, _buffers(inputs, sink, device), device=device)[0]
    except kc.CompileError as e: raise AssertionError(f"{device}: {e}\n{e.src}\n{c}") from e
    assert got.size == want.size
    res = compare(0, got.reshape(want.shape), want, c.x.dtype, tol)
    assert res.ok, f"{device}: {res.describe()}\n{c}"


def _buffers(inputs: dict, sink, device: str) -> dict:
  """Inputs as kc.Buffers: the kernel reads them through views, whatever shape they were declared with."""
  dts = {u.arg: u.dtype.base for u in sink.toposort if u.op is Ops.DEFINE_GLOBAL}
  return {i: kc.Buffer(device, a.size, dts[i]).allocate().copyin(memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)))
          for i, a in inputs.items()}


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([d for d in DTYPES if dtypes.is_int(d)] + [dtypes.bool]), st.data())
def test_numpy_errors_are_typed_errors(dt, data):
  x, a = A.arg(1, dt, (3, 2)), np.zeros((3, 2), dt.np)
  case = data.draw(st.sampled_from(["overflow", "broadcast", "bool_sub", "bool_neg", "neg_power"]))
  if case == "overflow" and dtypes.is_int(dt):
    v = data.draw(st.sampled_from([dtypes.max(dt) + 1, dtypes.min(dt) - 1, 2**70]))
    fx, fa = (lambda: x + v), (lambda: a + v)
  elif case == "bool_sub" and dt == dtypes.bool: fx, fa = (lambda: x - x), (lambda: a - a)
  elif case == "bool_neg" and dt == dtypes.bool: fx, fa = (lambda: -x), (lambda: -a)
  elif case == "neg_power" and dtypes.is_int(dt): fx, fa = (lambda: x ** -2), (lambda: a ** -2)
  else: fx, fa = (lambda: x + A.arg(2, dt, (4,))), (lambda: a + np.zeros(4, dt.np))
  with pytest.raises(Exception) as np_err: fa()
  kc_error = next(k for cls, k in ERRORS.items() if isinstance(np_err.value, cls))
  with pytest.raises(kc_error): fx()
