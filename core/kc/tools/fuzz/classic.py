"""Random kernels over the whole kc.ast surface, each step written for kc.ast and numpy at once (see recipe.py).

The generator evaluates numpy as it goes and keeps only steps whose answer a correct kernel must reproduce: no NaN or
inf in the middle, compares and float->int casts only of exact values, logs of positive values, divisions by values
away from zero; float products whose partial products stay normal floats in any order (products_stay_normal), and
logs, square roots and reciprocals of inexact values only away from 0 by more than their error's scale
(Generator.error_floor): where the answer would be the order's or the rounding's, not the kernel's. Integer overflow
is kept on purpose: numpy wraps and kc must too.

Deterministic: a recipe depends only on (seed, size). `size` scales every drawn dimension and nothing else consumes a
different number of random draws, so a smaller size gives a smaller kernel of much the same structure (the
minimizer's shape shrinking).
"""
from __future__ import annotations
import inspect
from contextlib import contextmanager
from functools import lru_cache
from typing import Callable, Optional
import numpy as np
from kc import ast as A
from kc.ir.dtype import dtypes, least_upper_dtype
from kc.tools.fuzz.recipe import Node, Recipe, eval_node, input_node, is_exact, value_dtype
from kc.tools.fuzz.tolerance import finite_max

INT_DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "int64", "uint64")   # the 64-bit ones come from int sums
FLOAT_DTYPES = ("float16", "float32")
INPUT_DTYPES = INT_DTYPES[:5] + FLOAT_DTYPES
MAX_ELEMENTS = 4096
# the largest float magnitude a step may produce: well inside each type's range, so later sums and products stay finite
_LIMIT = {"float16": 2000.0, "float32": 1e6, "bfloat16": 1e6, "fp8e4m3": 100.0, "fp8e5m2": 1000.0}
# the share of steps followed by one of the ops kc.ast gained after the classic generator was written (Generator.later)
_LATER_P = 0.2
_LATER_OPS = ("tanh", "sigmoid", "floor", "ceil", "trunc", "rint", "round", "sign", "isnan", "isinf", "isfinite",
              "square", "var", "std", "argmax", "argmin", "squeeze", "flatten", "ravel", "windows", "__lshift__",
              "__rshift__", "arange")
# the share of steps followed by a step only a program of several kernels can run (Generator.scheduled), and of
# reduces that drop their axes (keepdims=False); both drawn from the scheduler's stream (Generator.wide)
_SCHEDULED_P = 0.2
_DROP_AXES_P = 0.5
_SCHEDULED_OPS = ("cumsum", "cumprod", "concatenate", "stack")
_BITCAST = {"int8": ("uint8",), "uint8": ("int8",), "int16": ("uint16", "float16"), "uint16": ("int16", "float16"),
            "float16": ("int16", "uint16"), "int32": ("float32",), "float32": ("int32",)}


@lru_cache(None)
def features() -> frozenset[str]:
  """What this kc.ast offers beyond the core surface: the generator uses each op only where the builder has it."""
  E, have = A.Expr, set()
  for name in ("exp", "log", "abs", "mean", "min", "__getitem__", "__matmul__"):
    if callable(getattr(E, name, None)): have.add(name.strip("_"))
  if "keepdims" in inspect.signature(E.sum).parameters: have.add("keepdims")
  if E.__eq__ is not object.__eq__: have.add("eq_operator")
  have.update(name.strip("_") for name in _LATER_OPS if callable(getattr(E, name, None)) or callable(getattr(A, name, None)))
  # the scans are methods (x.cumsum(axis)), the joins functions of the module (A.concatenate([...], axis))
  have.update(name for name in _SCHEDULED_OPS if callable(getattr(E, name, None)) or callable(getattr(A, name, None)))
  return frozenset(have)


def _np(dt: str) -> str: return "np.bool_" if dt == "bool" else f"np.{dt}"
def _kdt(dt: str) -> str: return f"dtypes.{dt}"
def _isf(dt: str) -> bool: return dt in FLOAT_DTYPES
def _isint(dt: str) -> bool: return dt in INT_DTYPES
def _float_max(v: np.ndarray) -> float: return finite_max(v) if v.dtype.kind == "f" and v.size else 0.0  # ints are exact


# the binary exponents every partial product of a float prod or cumprod must stay within: float32's normal range
# (half accumulates in float32), less a margin
_PRODUCT_EXPONENTS = (-120, 120)


def products_stay_normal(x: np.ndarray, axes: Optional[tuple[int, ...]]) -> bool:
  """Whether every product of any of x's finite factors along `axes` (None: all of them) stays a normal float32.
  Those are the partial products of a prod or cumprod in any order: kc multiplies in its own order (pairwise,
  interleaved, vectorized, a scan in blocks), and where one order overflows to inf before it meets a 0 (NaN) and
  numpy's loop meets the 0 first (0), or one underflows to 0 where another stays finite, the answer is the order's,
  not the kernel's. Ints wrap, the same in any order."""
  if x.dtype.kind != "f" or x.size == 0: return True
  with np.errstate(all="ignore"):
    mag = np.abs(x.astype(np.float64))
    logs = np.log2(np.where(np.isfinite(mag) & (mag > 0), mag, 1.0))
    lo, hi = _PRODUCT_EXPONENTS
    return bool(np.all(np.where(logs > 0, logs, 0).sum(axis=axes) < hi) and np.all(np.where(logs < 0, logs, 0).sum(axis=axes) > lo))


def _kc_dtype_name(dt: np.dtype) -> str: return "bool" if dt == np.bool_ else dt.name


class Generator:
  """Grows one Recipe step by step; every step is checked against numpy before it is kept."""

  def __init__(self, seed: int, size: float = 1.0, specials: bool = False):
    self.seed, self.size = seed, size
    self.specials = specials      # NaN and infs may stay (the families that aim at them); else a step making one is dropped
    self.rng = np.random.default_rng(seed)
    # the later ops' own stream: whether a step gets one and every draw it makes come from here, so the kernel's stream
    # gives the same draws as before they existed, and a seed none is drawn for makes the kernel it made then
    self.more = np.random.default_rng([seed, 0x6C61746572])
    # the stream of every choice only a program of several kernels (kc.schedule) can run: a reduce result moved,
    # reduced again or broadcast to another shape, keepdims=False, outputs of several shapes, scans and joins. A seed
    # that draws none of them (`widened` stays False) makes the kernel it made when kc.ast was one kernel
    self.wide = np.random.default_rng([seed, 0x7363686564])
    self.widened = False
    self.nodes: list[Node] = []
    self.values: dict[int, np.ndarray] = {}
    self.data: dict[int, np.ndarray] = {}
    self.exact: set[int] = set()
    self.reduced: set[int] = set()   # nodes computed from a reduce: moving one takes an intermediate buffer

  # ***** random draws (each draw consumes the same randomness whatever `size` is) *****

  def chance(self, p: float) -> bool: return bool(self.rng.random() < p)
  def pick(self, xs): return xs[int(self.rng.integers(len(xs)))]
  def dim(self, hi: int) -> int: return 1 + int(self.rng.random() * hi * self.size)

  def widen(self, p: float) -> bool:
    """A choice of the scheduler's stream: True with probability p (and the kernel is no longer the old one)."""
    if self.wide.random() >= p: return False
    self.widened = True
    return True

  def shape(self) -> tuple[int, ...]:
    ndim = int(self.rng.integers(1, 4))
    dims = [self.dim(6) for _ in range(ndim)]
    if self.chance(0.03): dims[int(self.rng.integers(ndim))] = 0   # a zero-size kernel now and then
    return tuple(dims)

  # ***** nodes *****

  def add(self, node: Node, reduced: bool = False) -> Optional[int]:
    """Append `node` if numpy can evaluate it and its value is one a correct kernel must match; else forget it."""
    i = len(self.nodes)
    self.nodes.append(node)
    try: v = eval_node(Recipe(tuple(self.nodes), (i,), self.data, specials=self.specials), i, self.values)
    except Exception:  # numpy refuses (e.g. max of an empty axis): this step is not a kernel
      v = None
    if v is None or not self._keep(node, v):
      self.nodes.pop()
      self.data.pop(i, None)
      return None
    self.values[i] = v
    if is_exact(node, v, self.exact): self.exact.add(i)
    if reduced or any(s in self.reduced for s in node.srcs): self.reduced.add(i)
    return i

  def _keep(self, node: Node, v: np.ndarray) -> bool:
    # a 0-d value (a full reduce without keepdims) only where the scheduler's stream has made the kernel a new one
    if v.size > MAX_ELEMENTS or (v.ndim == 0 and not self.widened) or v.ndim > 4: return False
    if v.dtype.kind == "f":
      if (dt := value_dtype(v, node)) not in _LIMIT: return False
      with np.errstate(all="ignore"):
        finite = np.isfinite(v)
        if not (self.specials or np.all(finite)) or np.abs(np.where(finite, v, 0)).max(initial=0) > _LIMIT[dt]: return False
    if node.needs_exact and any(self.values[s].dtype.kind == "f" and s not in self.exact for s in node.srcs): return False
    return True

  def node(self, op: str, kc: str, np_: str, srcs: tuple[int, ...], kind: str = "arith", narrow: str = "",
           needs_exact: bool = False, reduced: bool = False) -> Optional[int]:
    """A step whose result is of the narrow float `narrow` gets numpy's float32 answer rounded once to it."""
    if narrow: np_ = f"rnd({np_}, {narrow!r})"
    return self.add(Node(op, kc, np_, srcs, kind, needs_exact, narrow), reduced=reduced)

  def error_floor(self, x: int) -> float:
    """The smallest magnitude an ill-conditioned op (log, a square root, a reciprocal) may take from x: 0 for an
    exact x; else 2**-6 of the largest magnitude met on the way to x (its ancestors' values, and a matmul's products
    of its operands' largest), which the fuzz bound takes as the scale of x's absolute error (tolerance.py). Closer
    to 0 than that, x may be cancellation's leftover, whose error such an op turns into one the bound cannot hold:
    log2 of a matmul's 0.06 from products of 16 carried the sum's last digits into its third."""
    if x in self.exact: return 0.0
    scale, seen, stack = 1.0, set(), [x]
    while stack:
      if (i := stack.pop()) in seen: continue
      seen.add(i)
      node, tops = self.nodes[i], [_float_max(self.values[s]) for s in self.nodes[i].srcs]
      scale = max(scale, _float_max(self.values[i]), tops[0] * tops[1] if node.op == "matmul" and len(tops) == 2 else 0.0)
      stack.extend(node.srcs)
    return 2.0 ** -6 * scale

  def dt(self, i: int) -> str: return value_dtype(self.values[i], self.nodes[i])
  def narrow(self, x: int) -> str: return ""      # a narrow float (bfloat16, fp8) x is of: classic has none
  def isfloat(self, x: int) -> bool: return _isf(self.dt(x))
  def isint(self, x: int) -> bool: return _isint(self.dt(x))
  def shp(self, i: int) -> tuple[int, ...]: return self.values[i].shape

  def input(self, dtype: str, shape: tuple[int, ...]) -> Optional[int]:
    i = len(self.nodes)
    self.data[i] = np.asarray(self._array(dtype, shape))   # a 0-d one too is an array (numpy's draws give a scalar)
    return self.add(input_node(dtype, shape))

  def _array(self, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    profile = int(self.rng.integers(3))
    if dtype == "bool": return self.rng.random(shape) < 0.5
    if _isf(dtype):
      if profile == 0: x = self.rng.uniform(-2, 2, shape)
      elif profile == 1: x = self.rng.uniform(0.5, 4, shape)
      else: x = self.rng.integers(-8, 9, shape)
      return np.asarray(x).astype(dtype)
    info = np.iinfo(dtype)
    lo, hi = (max(info.min, -2 ** 31), min(info.max, 2 ** 31 - 1)) if profile == 0 else (max(info.min, -10), min(info.max, 20))
    return self.rng.integers(lo, int(hi) + 1, shape, dtype=np.int64).astype(dtype)

  def const(self, dtype: str, shape: tuple[int, ...]) -> Optional[int]:
    value = self.scalar(dtype)
    return self.add(Node("const", f"A.const({value!r}, {_kdt(dtype)}, {shape})", f"np.full({shape}, {value!r}, {_np(dtype)})"))

  def scalar(self, dtype: str):
    if dtype == "bool": return self.chance(0.5)
    if _isf(dtype): return float(self.pick((0.5, 1.5, 2.0, -1.25, 3.0, -0.75)))
    info = np.iinfo(dtype)
    return int(np.clip(int(self.rng.integers(-5, 10)), info.min, info.max))

  # ***** steps *****

  def step(self, x: int) -> Optional[int]:
    moves: list[tuple[float, Callable[[int], Optional[int]]]] = [
      (4, self.binary), (2, self.unary), (1.5, self.cast), (1.5, self.compare), (1, self.where), (2.5, self.reduce),
      (1.5, self.fused), (3, self.movement), (0.3, self.bitcast)]
    weights = np.array([w for w, _ in moves])
    move = moves[int(self.rng.choice(len(moves), p=weights / weights.sum()))][1]
    y = move(x)
    if self.more.random() < _LATER_P and (z := self.later(x if y is None else y)) is not None: y = z
    if self.widen(_SCHEDULED_P) and (z := self.scheduled(x if y is None else y)) is not None: y = z
    return y

  def operand(self, x: int, dtype: Optional[str] = None) -> Optional[int]:
    """A second operand for x: an existing value of a shape that broadcasts with it, or a new input or constant
    of x's shape with some dims set to 1 (numpy broadcasting)."""
    shape = self.shp(x)
    dtype = dtype or (self.dt(x) if self.chance(0.7) else self.pick(INPUT_DTYPES))
    if self.chance(0.4):
      fits = [i for i in self.values if i != x and self.dt(i) == dtype and _broadcasts(self.shp(i), shape)]
      if fits: return self.pick(fits)
    bshape = tuple(1 if self.chance(0.25) else d for d in shape)
    if self.chance(0.2) and len(bshape) > 1: bshape = bshape[1:]
    return self.const(dtype, bshape) if self.chance(0.2) else self.input(dtype, bshape)

  def agree(self, x: int, y: int) -> Optional[tuple[int, int]]:
    """x and y with dtypes whose kc promotion equals numpy's (kc's lattice differs in places): y is cast to x's dtype
    where they would disagree."""
    dx, dy = self.dt(x), self.dt(y)
    if dx == dy: return x, y
    kc_dt = least_upper_dtype(getattr(dtypes, dx), getattr(dtypes, dy)).name
    if kc_dt == _kc_dtype_name(np.result_type(self.values[x], self.values[y])) and kc_dt in INT_DTYPES + FLOAT_DTYPES + ("bool",): return x, y
    y = self.cast_to(y, dx)
    return None if y is None else (x, y)

  def binary(self, x: int) -> Optional[int]:
    dt = self.dt(x)
    if dt == "bool": return self.bitop(x)
    ops = ["add", "sub", "mul", "maximum", "minimum"] + (["div"] if _isf(dt) else ["idiv", "mod", "bitop"])
    op = self.pick(ops)
    if op == "bitop": return self.bitop(x)
    if self.chance(0.3):  # a Python scalar: weak, it takes x's dtype in kc and in numpy 2
      s = self.scalar(dt)
      if op in ("idiv", "mod") and s == 0: s = 3
      if op == "div" and abs(s) < 0.25: s = 2.0
      sym = {"add": "+", "sub": "-", "mul": "*", "div": "/", "idiv": "//", "mod": "%"}.get(op)
      if sym is None: return self.add(Node(op, f"{{0}}.{op}({s!r})", f"np.{op}({{0}}, {s!r})", (x,), "arith"))
      rev = self.chance(0.3) and op not in ("idiv", "mod", "div")
      tmpl = f"{s!r} {sym} {{0}}" if rev else f"{{0}} {sym} {s!r}"
      return self.add(Node(op, tmpl, tmpl, (x,), "arith"))
    y = self.operand(x, dt if op in ("idiv", "mod") else None)
    if y is None or (pair := self.agree(x, y)) is None: return None
    x, y = pair
    if op in ("idiv", "mod"):
      b, a = self.values[y], self.values[x]
      if not _isint(self.dt(y)): return None
      if np.any(b == 0) and not self.chance(0.15): return None   # division by zero: numpy gives 0, rarely tried
      if self.dt(x) in ("int8", "int16", "int32"):
        if np.any(np.broadcast_to(a, np.broadcast_shapes(a.shape, b.shape)) == np.iinfo(a.dtype).min): return None
    if op == "div":
      with np.errstate(all="ignore"):
        if not np.all(np.abs(self.values[y]) >= 0.25): return None
    sym = {"add": "+", "sub": "-", "mul": "*", "div": "/", "idiv": "//", "mod": "%"}.get(op)
    if sym is not None: return self.add(Node(op, f"{{0}} {sym} {{1}}", f"{{0}} {sym} {{1}}", (x, y), "arith"))
    return self.add(Node(op, f"{{0}}.{op}({{1}})", f"np.{op}({{0}}, {{1}})", (x, y), "arith"))

  def bitop(self, x: int) -> Optional[int]:
    if not (_isint(self.dt(x)) or self.dt(x) == "bool"): return None
    y = self.operand(x, self.dt(x))
    if y is None: return None
    sym = self.pick(("&", "|", "^"))
    return self.add(Node("bitop", f"{{0}} {sym} {{1}}", f"{{0}} {sym} {{1}}", (x, y)))

  def unary(self, x: int) -> Optional[int]:
    dt, v, f = self.dt(x), self.values[x], features()
    if dt == "bool": return self.add(Node("not", "{0}.logical_not()", "np.logical_not({0})", (x,)))
    if not _isf(dt):
      if "abs" in f and self.chance(0.3): return self.add(Node("abs", "abs({0})", "np.abs({0})", (x,)))
      return self.add(Node("neg", "-{0}", "-{0}", (x,)))
    lo, hi = (float(v.min()), float(v.max())) if v.size else (0.0, 0.0)
    top, floor = 10 if dt == "float16" else 20, self.error_floor(x)
    choices = [("neg", "-{0}", "-{0}", "arith")]
    if hi <= top and lo >= -20: choices.append(("exp2", "{0}.exp2()", "np.exp2({0})", "transcendental"))
    if lo >= max(2 ** -6, floor): choices.append(("log2", "{0}.log2()", "np.log2({0})", "transcendental"))
    if lo >= 0 and (floor == 0 or lo >= floor): choices.append(("sqrt", "{0}.sqrt()", "np.sqrt({0})", "transcendental"))
    if max(abs(lo), abs(hi)) <= 8: choices.append(("sin", "{0}.sin()", "np.sin({0})", "transcendental"))
    if lo >= max(0.25, floor) or hi <= -max(0.25, floor): choices.append(("recip", "{0}.recip()", f"{_np(dt)}(1) / {{0}}", "arith"))
    if "exp" in f and hi <= top / 1.5 and lo >= -14: choices.append(("exp", "{0}.exp()", "np.exp({0})", "transcendental"))
    if "log" in f and lo >= max(2 ** -6, floor): choices.append(("log", "{0}.log()", "np.log({0})", "transcendental"))
    if "abs" in f: choices.append(("abs", "abs({0})", "np.abs({0})", "arith"))
    op, k, n, kind = self.pick(choices)
    return self.add(Node(op, k, n, (x,), kind))

  def cast_to(self, x: int, dt: str) -> Optional[int]:
    src, v = self.dt(x), self.values[x]
    if src == dt: return x
    if _isf(src) and not _isf(dt):
      # float -> int or bool: only exact values, and (for ints) only in range: out of range is undefined in C
      w = v.astype(np.float64)
      if _isint(dt) and v.size and (w.min() < np.iinfo(dt).min or w.max() > np.iinfo(dt).max): return None
      return self.add(Node("cast", f"{{0}}.cast({_kdt(dt)})", f"{{0}}.astype({_np(dt)})", (x,), needs_exact=True))
    if dt == "float16" and v.size and np.abs(v.astype(np.float64)).max() > 60000: return None
    return self.add(Node("cast", f"{{0}}.cast({_kdt(dt)})", f"{{0}}.astype({_np(dt)})", (x,), "arith"))

  def cast(self, x: int) -> Optional[int]: return self.cast_to(x, self.pick(INPUT_DTYPES + ("bool",)))

  def bitcast(self, x: int) -> Optional[int]:
    if (targets := _BITCAST.get(self.dt(x))) is None: return None
    dt = self.pick(targets)
    return self.add(Node("bitcast", f"{{0}}.bitcast({_kdt(dt)})", f"{{0}}.view({_np(dt)})", (x,), needs_exact=True))

  def compare(self, x: int) -> Optional[int]:
    if self.dt(x) == "bool": return None
    y = self.scalar(self.dt(x)) if self.chance(0.4) else self.operand(x, self.dt(x))
    if y is None: return None
    eq_kc = "{0} == {1}" if "eq_operator" in features() else "{0}.eq({1})"
    ne_kc = "{0} != {1}" if "eq_operator" in features() else "{0}.ne({1})"
    sym, k = self.pick((("<", "{0} < {1}"), (">", "{0} > {1}"), ("<=", "{0} <= {1}"), (">=", "{0} >= {1}"), ("==", eq_kc), ("!=", ne_kc)))
    if isinstance(y, (bool, int, float)):
      return self.add(Node("cmp", k.format("{0}", repr(y)), f"{{0}} {sym} {y!r}", (x,), needs_exact=True))
    return self.add(Node("cmp", k, f"{{0}} {sym} {{1}}", (x, y), needs_exact=True))

  def where(self, x: int) -> Optional[int]:
    conds = [i for i in self.values if self.dt(i) == "bool" and _broadcasts(self.shp(i), self.shp(x))]
    c = self.pick(conds) if conds else self.compare(x)
    if c is None: return None
    y = self.operand(x, self.dt(x))
    if y is None: return None
    return self.add(Node("where", "{0}.where({1}, {2})", "np.where({0}, {1}, {2})", (c, x, y)))

  # ***** reduces *****

  def axes(self, x: int) -> tuple[int, ...]:
    nd = len(self.shp(x))
    if nd == 0: return ()   # a 0-d value has no axis to reduce (the reduces refuse it)
    return tuple(sorted(int(a) for a in self.rng.choice(nd, size=int(self.rng.integers(1, nd + 1)), replace=False)))

  def keepdims(self) -> bool:
    """Whether a reduce keeps its axes: numpy's default (False) is drawn from the scheduler's stream."""
    return "keepdims" not in features() or not self.widen(_DROP_AXES_P)

  def reduce_node(self, x: int, op: str, axes: tuple[int, ...]) -> Optional[int]:
    if not self.shp(x): return None
    dt, kd = self.dt(x), self.keepdims()
    keep = f", keepdims={kd}" if "keepdims" in features() else ""
    ax = f"axis={axes}, keepdims={kd}"
    if op == "prod" and not products_stay_normal(self.values[x], axes): return None
    if op in ("sum", "prod"):
      if dt == "float16": n = f"{{0}}.astype(np.float32).{op}({ax}).astype(np.float16)"
      else: n = f"{{0}}.{op}({ax})"   # numpy widens small ints (and bools) to 64 bits, as kc.ast does
      kind = "reduce"
    elif op == "mean":
      if not _isf(dt): return None
      n, kind = f"{{0}}.astype(np.float32).mean({ax}).astype({_np(dt)})", "reduce"
    else: n, kind = f"{{0}}.{op}({ax})", "arith"
    return self.add(Node(op, f"{{0}}.{op}(axis={axes}{keep})", n, (x,), kind), reduced=True)

  def reduce_op(self, x: int) -> str:
    if self.dt(x) == "bool": return self.pick(("sum", "max"))
    ops = ["sum", "sum", "max"] + [o for o in ("min", "mean") if o in features()]
    if _isint(self.dt(x)) or self.chance(0.2): ops.append("prod")
    return self.pick(ops)

  def reduce(self, x: int) -> Optional[int]:
    if not self.shp(x): return None
    return self.reduce_node(x, self.reduce_op(x), self.axes(x))

  def fused(self, x: int) -> Optional[int]:
    """x combined with a reduce of itself broadcast back (x - x.max(1)), then often reduced again."""
    if not self.shp(x): return None
    r = self.reduce_node(x, self.pick(("max", "sum")), self.axes(x))
    if r is None or self.dt(x) == "bool": return r
    op, sym = self.pick((("sub", "-"), ("add", "+"), ("mul", "*")))
    y = self.add(Node(op, f"{{0}} {sym} {{1}}", f"{{0}} {sym} {{1}}", (x, r), "arith"))
    if y is not None and self.chance(0.6):
      if _isf(self.dt(y)) and self.chance(0.5) and (e := self.unary(y)) is not None: y = e
      return self.reduce(y)
    return y

  def matmul(self) -> Optional[int]:
    """A matmul as kc.ast spells it (a broadcast multiply and a sum), in half with a float accumulator now and then
    (the pattern tensor cores match), or with `@` where the builder has it."""
    M, K, N = (self.dim(8) * self.pick((1, 2)) for _ in range(3))
    dt = self.pick(("float32", "float16", "int32", "int8"))
    a, b = self.input(dt, (M, K)), self.input(dt, (K, N))
    if a is None or b is None: return None
    if "matmul" in features() and dt in ("float32", "int32") and self.chance(0.3):
      return self.add(Node("matmul", "{0} @ {1}", "np.matmul({0}, {1})", (a, b), "reduce"), reduced=True)
    if "matmul" in features() and dt == "float16" and self.more.random() < 0.4:
      # products and sums in float32, rounded once
      n = "np.matmul({0}.astype(np.float32), {1}.astype(np.float32)).astype(np.float16)"
      return self.add(Node("matmul", "{0} @ {1}", n, (a, b), "arith"), reduced=True)
    ra = self.add(Node("reshape", f"{{0}}.reshape({(M, K, 1)})", f"{{0}}.reshape({(M, K, 1)})", (a,)))
    rb = self.add(Node("reshape", f"{{0}}.reshape({(1, K, N)})", f"{{0}}.reshape({(1, K, N)})", (b,)))
    if ra is None or rb is None: return None
    m = self.add(Node("mul", "{0} * {1}", "{0} * {1}", (ra, rb), "arith"))
    if m is not None and dt == "float16" and self.chance(0.6): m = self.cast_to(m, "float32")
    return None if m is None else self.reduce_node(m, "sum", (1,))

  # ***** movement *****

  def movement(self, x: int) -> Optional[int]:
    shape = self.shp(x)
    # a reduce result moved otherwise than by an expand is read from an intermediate buffer (kc.schedule)
    if not shape or (x in self.reduced and not self.widen(0.6)): return self.expand(x)
    moves = [self.reshape, self.expand, self.pad, self.shrink, self.flip] + ([self.permute] if len(shape) > 1 else [])
    if "getitem" in features(): moves.append(self.getitem)
    return self.pick(moves)(x)

  def mv(self, op: str, x: int, kc_arg: str, np_tmpl: str) -> Optional[int]:
    return self.add(Node(op, f"{{0}}.{op}({kc_arg})", np_tmpl, (x,)))

  def reshape(self, x: int) -> Optional[int]:
    shape = list(self.shp(x))
    if not shape: return self.mv("reshape", x, repr((1,)), "{0}.reshape((1,))")   # a 0-d value has one element
    kind = int(self.rng.integers(4))
    if kind == 0 and len(shape) > 1:   # merge two neighbours
      i = int(self.rng.integers(len(shape) - 1))
      shape[i:i + 2] = [shape[i] * shape[i + 1]]
    elif kind == 1:                    # split one dim by a factor
      i = int(self.rng.integers(len(shape)))
      fs = [f for f in (2, 3) if shape[i] % f == 0 and shape[i] > f]
      if not fs: return None
      f = self.pick(fs)
      shape[i:i + 1] = [f, shape[i] // f]
    elif kind == 2 and len(shape) < 4: shape.insert(int(self.rng.integers(len(shape) + 1)), 1)
    else: shape = [int(np.prod(shape))]
    new = tuple(shape)
    return self.mv("reshape", x, repr(new), f"{{0}}.reshape({new})")

  def permute(self, x: int) -> Optional[int]:
    order = tuple(int(a) for a in self.rng.permutation(len(self.shp(x))))
    return self.mv("permute", x, repr(order), f"{{0}}.transpose({order})")

  def expand(self, x: int) -> Optional[int]:
    shape = self.shp(x)
    if 1 not in shape:
      if len(shape) >= 4 or (x in self.reduced and not self.widen(0.6)): return None
      x = self.mv("reshape", x, repr((1,) + shape), f"{{0}}.reshape({(1,) + shape})")
      if x is None: return None
      shape = (1,) + shape
    new = tuple(d if d != 1 or self.chance(0.3) else self.dim(4) for d in shape)
    return self.mv("expand", x, repr(new), f"np.broadcast_to({{0}}, {new})")

  def pad(self, x: int) -> Optional[int]:
    arg = tuple((int(self.rng.integers(3)), int(self.rng.integers(3))) if self.chance(0.6) else (0, 0) for _ in self.shp(x))
    return self.mv("pad", x, repr(arg), f"np.pad({{0}}, {arg})")

  def shrink(self, x: int) -> Optional[int]:
    arg = []
    for d in self.shp(x):
      s = int(self.rng.integers(d)) if d else 0
      arg.append((s, s + 1 + int(self.rng.integers(d - s)) if d else 0))
    sl = ", ".join(f"{s}:{e}" for s, e in arg)
    return self.mv("shrink", x, repr(tuple(arg)), f"{{0}}[{sl}]")

  def flip(self, x: int) -> Optional[int]:
    if not self.shp(x): return None
    axes = tuple(sorted(int(a) for a in self.rng.choice(len(self.shp(x)), size=int(self.rng.integers(1, len(self.shp(x)) + 1)), replace=False)))
    return self.mv("flip", x, repr(axes), f"np.flip({{0}}, {axes})")

  def getitem(self, x: int) -> Optional[int]:
    parts = []
    for d in self.shp(x):
      k = int(self.rng.integers(4))
      parts.append(":" if k == 0 or d == 0 else "::-1" if k == 1 else str(int(self.rng.integers(d))) if k == 2 else f"{int(self.rng.integers(d))}:")
    idx = ", ".join(parts)
    return self.add(Node("getitem", f"{{0}}[{idx}]", f"{{0}}[{idx}]", (x,)))

  # ***** the ops kc.ast gained later, drawn from their own stream (self.more) *****

  @contextmanager
  def drawing_from(self, rng: np.random.Generator):
    """Every draw made inside comes from `rng` instead of the kernel's stream."""
    main, self.rng = self.rng, rng
    try: yield
    finally: self.rng = main

  def later(self, x: int, move: Optional[Callable[[int], Optional[int]]] = None) -> Optional[int]:
    """One later op on x (`move`, or one drawn: rounding, tests, tanh, sigmoid, sign, square, shifts, var/std,
    argmax/argmin, squeeze, flatten/ravel, windows). Its draws all come from self.more, and one that is not kept
    leaves no node behind (not even an input it made), so the kernel goes on as if it had not been tried."""
    n = len(self.nodes)
    with self.drawing_from(self.more):
      if move is None:
        moves = [(4, self.later_unary), (1.5, self.shift), (2.5, self.later_reduce), (2, self.later_movement),
                 (1, self.positions)]
        weights = np.array([w for w, _ in moves])
        move = moves[int(self.rng.choice(len(moves), p=weights / weights.sum()))][1]
      out = move(x)
    if out is None: self.forget_from(n)
    return out

  def forget_from(self, n: int) -> None:
    """Drop node n and every node after it."""
    for i in range(n, len(self.nodes)):
      self.values.pop(i, None)
      self.data.pop(i, None)
      self.exact.discard(i)
      self.reduced.discard(i)
    del self.nodes[n:]

  def input_of(self, dtype: str, values: np.ndarray) -> Optional[int]:
    """A new input holding `values` (of numpy's `dtype`)."""
    i = len(self.nodes)
    self.data[i] = np.asarray(values).astype(dtype)
    return self.add(input_node(dtype, tuple(self.data[i].shape)))

  def later_unary(self, x: int) -> Optional[int]:
    dt, f = self.dt(x), features()
    # a float-only op of an int or bool gives numpy's float dtype for it (float16 for 8 bits, float32 for 16, float64
    # for more, which the generator drops); a narrow float's is its own (numpy computes on its float32 values, and the
    # result is rounded once)
    out = dt if self.isfloat(x) else _kc_dtype_name(np.tanh(np.zeros(0, self.values[x].dtype)).dtype)
    wide = "{0}" if self.values[x].dtype == np.float32 else "{0}.astype(np.float32)"
    back = "" if self.narrow(x) else f".astype({_np(out)})"
    choices = [(op, f"{{0}}.{op}()", f"np.{op}({{0}})", "arith", True) for op in ("floor", "ceil", "trunc", "rint")]
    tests = ("isnan", "isinf", "isfinite") if self.isfloat(x) or self.chance(0.25) else ()   # an int's are constant
    choices += [(op, f"{{0}}.{op}()", f"np.{op}({{0}})", "arith", False) for op in ("square",) + tests]
    choices += [("tanh", "{0}.tanh()", "np.tanh({0})", "transcendental", False),
                ("sigmoid", "{0}.sigmoid()", f"(1 / (1 + np.exp(-{wide})))" + back, "transcendental", False)]
    if dt != "bool": choices.append(("sign", "{0}.sign()", "np.sign({0})", "arith", True))   # numpy: no bool loop
    # round to decimals: a float's only to 0 when narrow (x * 10**d would round in it); an int is unchanged for d >= 0
    ds = (0,) if dt == "bool" or self.narrow(x) else (0, 1, 2, -1) if self.isfloat(x) else (0, 2)
    d = int(self.pick(ds))
    choices.append(("round", f"{{0}}.round({d})", f"np.round({{0}}, {d})", "arith", True))
    op, k, n, kind, jumps = self.pick([c for c in choices if c[0] in f])
    # floor, rint, sign...: a result that jumps where its operand crosses an integer (or a half, or 0) needs exact
    # operands, as a compare does
    narrow = self.narrow(x) if op not in ("isnan", "isinf", "isfinite") else ""
    return self.node(op, k, n, (x,), kind, narrow, needs_exact=jumps and self.isfloat(x))

  def shift(self, x: int) -> Optional[int]:
    """x << y or x >> y with amounts from -2 to the bit width + 2: numpy's answers past the width (0, or -1 for a
    negative value shifted right) are kc's documented ones."""
    dt = self.dt(x)
    if not (self.isint(x) or dt == "bool") or "lshift" not in features(): return None
    sym = self.pick(("<<", ">>"))
    if dt == "bool": y = self.operand(x, "bool")
    else:
      info = np.iinfo(self.values[x].dtype)
      lo, hi = max(-2, int(info.min)), info.bits + 2
      if self.chance(0.3):   # a Python scalar: weak, it takes x's dtype
        s = int(self.pick([a for a in (0, 1, 3, info.bits - 1, info.bits, hi, lo) if info.min <= a <= info.max]))
        return self.node("shift", f"{{0}} {sym} {s!r}", f"{{0}} {sym} {s!r}", (x,))
      bshape = tuple(1 if self.chance(0.25) else d for d in self.shp(x))
      y = self.input_of(dt, self.rng.integers(lo, hi + 1, bshape))
    if y is None: return None
    return self.node("shift", f"{{0}} {sym} {{1}}", f"{{0}} {sym} {{1}}", (x, y))

  def later_reduce(self, x: int) -> Optional[int]:
    if not self.shp(x) or (x in self.reduced and not self.widen(0.6)): return None   # reduces of reduces: kc.schedule
    if self.chance(0.6) and (self.isint(x) or self.dt(x) in ("float32", "float16", "bfloat16")): return self.var_std(x)
    return self.arg_extreme(x)

  def var_std(self, x: int) -> Optional[int]:
    """x.var or x.std over some axes with ddof 0, 1 or 2 (n - ddof >= 1): numpy's, computed in float32 for half and
    bfloat16 and rounded once, as kc.ast does. An int's is of its float32 cast (its own would be float64, which the
    generator leaves out)."""
    axes = self.axes(x)
    n, ddof, keep = int(np.prod([self.shp(x)[a] for a in axes])), int(self.pick((0, 0, 1, 2))), self.chance(0.5)
    if n - ddof < 1 or not _spread_ok(self.values[x], axes): return None
    op = self.pick(("var", "std"))
    args = f"axis={axes}, ddof={ddof}, keepdims={keep}"
    wide = "{0}" if self.values[x].dtype == np.float32 else "{0}.astype(np.float32)"
    back = ".astype(np.float16)" if self.values[x].dtype == np.float16 else ""
    k = "{0}.cast(dtypes.float32)" if self.isint(x) else "{0}"
    return self.node(op, f"{k}.{op}({args})", f"np.{op}({wide}, {args}){back}", (x,), "reduce", self.narrow(x),
                     reduced=True)

  def arg_extreme(self, x: int) -> Optional[int]:
    """argmax or argmin along one axis, or of the flattened array (its keepdims from the scheduler's stream). The
    first index wins a tie, and a NaN wins over numbers: an inexact operand could break a near tie either way."""
    if "argmax" not in features(): return None
    op = self.pick(("argmax", "argmin"))
    if self.chance(0.3): axis, keep = None, self.keepdims()
    else: axis, keep = int(self.rng.integers(len(self.shp(x)))), self.chance(0.5)
    args = f"axis={axis}, keepdims={keep}"
    return self.node(op, f"{{0}}.{op}({args})", f"np.{op}({{0}}, {args})", (x,), needs_exact=True, reduced=True)

  def positions(self, x: int) -> Optional[int]:
    """x plus a small arange along one of its axes (broadcast along the others, in x's dtype): an index computed from
    the kernel's loop indices, which the opts reorder, upcast and split with the rest of the kernel."""
    shape, dt = self.shp(x), self.dt(x)
    if "arange" not in features() or not shape or dt == "bool": return None
    a = int(self.rng.integers(len(shape)))
    start, step, view = int(self.rng.integers(0, 4)), int(self.pick((1, 2, 3))), tuple(d if k == a else 1 for k, d in enumerate(shape))
    bounds = f"{start}, {start + step * shape[a]}, {step}"
    return self.node("arange", f"({{0}} + (A.arange({bounds}) % 5).cast({_kdt(dt)}).reshape({view}))",
                     f"({{0}} + (np.arange({bounds}) % 5).astype({_np(dt)}).reshape({view}))", (x,))

  def later_movement(self, x: int) -> Optional[int]:
    # a reduce result moved otherwise than by its size-1 axes is read from an intermediate buffer (kc.schedule)
    if not self.shp(x) or (x in self.reduced and not self.widen(0.6)): return self.squeeze(x)
    return self.pick((self.squeeze, self.flatten, self.windows, self.windows))(x)

  def squeeze(self, x: int) -> Optional[int]:
    ones = [a for a, d in enumerate(self.shp(x)) if d == 1]
    if not ones or "squeeze" not in features(): return None
    if self.chance(0.5): return self.add(Node("squeeze", "{0}.squeeze()", "np.squeeze({0})", (x,)))
    a = int(self.pick(ones))
    return self.add(Node("squeeze", f"{{0}}.squeeze({a})", f"np.squeeze({{0}}, {a})", (x,)))

  def flatten(self, x: int) -> Optional[int]:
    op = self.pick(("flatten", "ravel"))
    return self.add(Node(op, f"{{0}}.{op}()", "np.ravel({0})", (x,)))

  def windows(self, x: int) -> Optional[int]:
    """numpy's sliding_window_view along one axis: the n - size + 1 window starts in place, the window last."""
    shape = self.shp(x)
    if not shape: return None
    a = int(self.rng.integers(len(shape)))
    if shape[a] == 0 or len(shape) >= 4 or "windows" not in features(): return None
    size = 1 + int(self.rng.integers(shape[a]))
    return self.add(Node("windows", f"{{0}}.windows({a}, {size})",
                         f"np.lib.stride_tricks.sliding_window_view({{0}}, {size}, axis={a})", (x,)))

  # ***** steps only a program of several kernels runs (kc.schedule), drawn from the scheduler's stream *****

  def scheduled(self, x: int) -> Optional[int]:
    """One step that takes more than one kernel: a reduce of a reduce on any axes, a reduce result moved (reshaped,
    permuted, flipped, padded, sliced, windowed, broadcast), a value combined with one of another shape by numpy's
    right-aligned broadcasting (a reduce result most often), a scan or a join. Its draws all come from self.wide, and
    one that is not kept leaves no node behind."""
    n, f = len(self.nodes), features()
    with self.drawing_from(self.wide):
      moves = [(3, self.rereduce), (3, self.moved_reduce), (3, self.broadcast_against)]
      if {"cumsum", "cumprod"} & f: moves.append((1.5, self.scan))
      if {"concatenate", "stack"} & f: moves.append((1.5, self.join))
      weights = np.array([w for w, _ in moves])
      out = moves[int(self.rng.choice(len(moves), p=weights / weights.sum()))][1](x)
    if out is None: self.forget_from(n)
    return out

  def a_reduce_result(self, x: int) -> Optional[int]:
    """A reduce result that has axes: an earlier one now and then, else a new reduce of x."""
    done = sorted(i for i in self.reduced if self.shp(i))
    return self.pick(done) if done and self.chance(0.4) else self.reduce(x)

  def rereduce(self, x: int) -> Optional[int]:
    """A reduce of a reduce result, over any of its axes, each with or without keepdims."""
    r = self.a_reduce_result(x)
    return None if r is None else self.reduce(r)

  def moved_reduce(self, x: int) -> Optional[int]:
    """A reduce result moved: reshaped, permuted, flipped, padded, sliced, indexed, broadcast or windowed."""
    r = self.a_reduce_result(x)
    if r is None or not self.shp(r): return r
    moves = [self.reshape, self.expand, self.pad, self.shrink, self.flip, self.flatten]
    moves += [self.permute] if len(self.shp(r)) > 1 else []
    moves += [m for m, op in ((self.getitem, "getitem"), (self.windows, "windows")) if op in features()]
    return self.pick(moves)(r)

  def broadcast_against(self, x: int) -> Optional[int]:
    """x combined with a value of another shape under numpy's broadcasting (shapes aligned on the right, the result
    maybe larger than either): an earlier value, a reduce result most often, or a reduce of x (x - x.max(0))."""
    shape = self.shp(x)
    def fits(i: int) -> bool:
      try: out = np.broadcast_shapes(shape, self.shp(i))
      except ValueError: return False
      return i != x and self.shp(i) != shape and int(np.prod(out)) <= MAX_ELEMENTS
    found = [i for i in self.values if fits(i) and self.nodes[i].op != "input"]
    reduced = [i for i in found if i in self.reduced]
    y = self.pick(reduced if reduced and self.chance(0.7) else found) if found and self.chance(0.7) else self.reduce(x)
    if y is None or (pair := self.agree(x, y)) is None: return None
    a, b = pair if self.chance(0.6) else pair[::-1]
    if self.dt(a) == "bool": sym = self.pick(("&", "|", "^"))
    else: sym = self.pick(("+", "-", "*", "maximum", "minimum"))
    if sym in ("maximum", "minimum"):
      return self.add(Node(sym, f"{{0}}.{sym}({{1}})", f"np.{sym}({{0}}, {{1}})", (a, b), "arith"))
    op = {"+": "add", "-": "sub", "*": "mul"}.get(sym, "bitop")
    return self.add(Node(op, f"{{0}} {sym} {{1}}", f"{{0}} {sym} {{1}}", (a, b), "arith"))

  def scan(self, x: int) -> Optional[int]:
    """numpy's cumsum or cumprod along one axis or of the flattened array: small ints and bools widen to 64 bits,
    half is computed in float32 and rounded once (as kc.ast does; numpy's own half scan rounds every step)."""
    if not self.shp(x): return None
    op = self.pick(sorted({"cumsum", "cumprod"} & features()))
    axis = None if self.chance(0.2) else int(self.rng.integers(len(self.shp(x))))
    if op == "cumprod" and not products_stay_normal(self.values[x], None if axis is None else (axis,)): return None
    dt = self.dt(x)
    n = f"np.{op}({{0}}.astype(np.float32), axis={axis}).astype(np.float16)" if dt == "float16" else \
        f"np.{op}({{0}}, axis={axis})"
    return self.node(op, f"{{0}}.{op}(axis={axis})", n, (x,), "reduce" if _isf(dt) else "arith", reduced=True)

  def join(self, x: int) -> Optional[int]:
    """numpy's concatenate (along an axis, or flattened with axis=None) or stack (along a new axis) of x and one or
    two values of x's dtype: earlier values of a fitting shape (reduce results among them) or new inputs."""
    op = self.pick(sorted({"concatenate", "stack"} & features()))
    shape = self.shp(x)
    if op == "concatenate" and not shape: return None
    if op == "concatenate": axis = None if self.chance(0.15) else int(self.rng.integers(len(shape)))
    else: axis = int(self.rng.integers(len(shape) + 1))
    parts = [x]
    for _ in range(int(self.rng.integers(1, 3))):
      if (p := self.join_part(x, op, axis)) is None: return None
      parts.append(p)
    names = ", ".join(f"{{{k}}}" for k in range(len(parts)))
    return self.add(Node(op, f"A.{op}([{names}], axis={axis})", f"np.{op}([{names}], axis={axis})", tuple(parts)))

  def join_part(self, x: int, op: str, axis: Optional[int]) -> Optional[int]:
    shape = self.shp(x)
    def fits(s: tuple) -> bool:
      if op == "stack": return s == shape
      if axis is None: return len(s) > 0
      return len(s) == len(shape) and all(a == b for k, (a, b) in enumerate(zip(s, shape)) if k != axis)
    found = sorted(i for i in self.values if fits(self.shp(i)) and self.nodes[i].op != "input")
    if found and self.chance(0.6): return self.cast_to(self.pick(found), self.dt(x))
    if op == "concatenate" and axis is not None: shape = shape[:axis] + (self.dim(4),) + shape[axis + 1:]
    return self.input(self.dt(x), shape)

  def more_outputs(self, outs: list[int]) -> list[int]:
    """One or two more outputs of shapes no output has yet (a reduce result most often): one program stores them all,
    each shape in a kernel of its own."""
    extra: list[int] = []
    for _ in range(int(self.rng.integers(1, 3))):
      shapes = {self.shp(o) for o in outs + extra}
      cand = sorted(i for i in self.values if self.shp(i) not in shapes and self.nodes[i].op != "input")
      if not cand: break
      reduced = [i for i in cand if i in self.reduced]
      extra.append(self.pick(reduced if reduced and self.chance(0.6) else cand))
    return extra

  # ***** a whole kernel *****

  def recipe(self) -> Recipe:
    if self.chance(0.12): x = self.matmul()
    else:
      shape = self.shape()
      x = self.input(self.pick(INPUT_DTYPES), shape)
    if x is None: x = self.input("float32", (4,))
    for _ in range(int(self.rng.integers(2, 8))):
      base = x if self.chance(0.75) else self.pick(sorted(self.values))
      y = self.step(base)
      if y is not None: x = y
    outs = [x]
    for _ in range(int(self.rng.integers(3)) if self.chance(0.3) else 0):
      cand = [i for i in self.values if i not in outs and self.nodes[i].op != "input"]
      if cand: outs.append(self.pick(cand))
    if self.widen(0.3):
      with self.drawing_from(self.wide): outs += self.more_outputs(outs)
    return self.finish(outs)

  def finish(self, outs: list[int], family: str = "classic") -> Recipe:
    return Recipe(tuple(self.nodes), tuple(outs), dict(self.data), self.seed, family, self.specials)


def _broadcasts(small: tuple[int, ...], big: tuple[int, ...]) -> bool:
  """`small` broadcasts to exactly `big` (numpy rules, without growing `big`)."""
  if len(small) > len(big): return False
  return all(s in (1, b) for s, b in zip(small[::-1], big[::-1]))


def _spread_ok(v: np.ndarray, axes: tuple[int, ...]) -> bool:
  """var and std lose digits where values are far larger than their spread (x - mean cancels): kept where every
  slice's values are small or its spread is at least 1/64 of its largest value, so the reduce bound holds."""
  if v.size == 0: return True
  with np.errstate(all="ignore"):
    w = v.astype(np.float64)
    w = np.where(np.isfinite(w), w, 0)
    top = np.abs(w).max(axis=axes, keepdims=True, initial=0)
    spread = w.std(axis=axes, keepdims=True)
  return bool(np.all((top <= 16) | (spread * 64 >= top)))
