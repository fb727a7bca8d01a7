"""Families of fuzz kernels, each aimed at a class of bug the classic generator (classic.Generator) steers clear of.

The classic generator keeps every value finite and every division safe, so that numpy's answer is one a kernel must
match whatever it does with NaN. The families here give those cases a numpy answer that is exact too:

- specials: inputs with NaN, +-inf and -0.0 (floats) or MIN, -1, 0, MAX (ints) mixed in, in every dtype kc has,
  bfloat16 and fp8 included, through elementwise ops, compares, casts and reduces (numpy's IEEE answers).
- intdiv: `//` and `%` of every int width with divisors MIN, -1 and 0 among ordinary ones (kc documents numpy's
  answers: MIN // -1 is MIN, MIN % -1 is 0, a divisor of 0 gives 0).
- computed: pads, shrinks, clips and wheres applied to computed values ((x // y).pad, (x ** 2.5).clip(lo, hi)),
  minimum/maximum with NaN.
- compare: any/all and the six compares of bool and every int and float dtype, cast to other widths.
- lowp_matmul: half and bfloat16 matmuls against products and sums in float32 rounded once to the output dtype.
- bigsum: int64/uint64 sums of values near 2^40 over reduce axes that no small power of two divides (the random opts
  pad and unroll them, worker.random_opts).
- bigindex: views of small buffers expanded to shapes of 2^32 elements and strided or shrunk down to a small output,
  so the index arithmetic passes 2^31 while every buffer stays small.
- epilogue: a float32 product of register-tile size, x @ W.T (as a Linear layer stores it) or x @ W, plus a bias row,
  then a chain of elementwise steps (exp2, log2, sqrt, sin, a division, a select on a compare, a max, a scale): the
  arithmetic after a reduce that a vector dialect computes for several narrow stores as one wide vector
  (kc.codegen.widen).
- window: 1-D convolutions as kc-torch lowers them (padded windows times a weight or a gradient, summed): the forward,
  the weight gradient (reduced along the padded rows that the window shifts) and the input gradient, over rows as wide
  as one or several vectors and odd widths, with their padding masked lane by lane.

- rows: one reduce along the rows of x, stored as it is (a sum or max of x, of x * y, of x * x, or x @ W.T with few
  outputs), rows and lengths multiples of the vector widths: a register tile of rows whose vector accumulators are
  combined and stored as one vector (kc.codegen.lower.Lowering.tile_stores); now and then scaled after the reduce.

A recipe's family is drawn from its seed with a random stream of its own, and a classic recipe is drawn from the seed
exactly as before the families existed, so an old seed whose family is classic still makes the same kernel.
"""
from __future__ import annotations
import math
from dataclasses import replace
from typing import Optional, Sequence
import numpy as np
from kc import ast as A, dtypes
from kc.errors import KcError
from kc.tools.fuzz.classic import Generator, _broadcasts, products_stay_normal
from kc.tools.fuzz.recipe import NARROW_FLOATS, Node, Recipe, narrow_round, special_problem

# the share of each family among drawn seeds; classic keeps most, so a run still covers the whole surface. classic is
# drawn first and keeps 0.6 of the total, so a seed that drew classic still does when a family is added (its share
# comes out of the others')
FAMILIES: dict[str, float] = {"classic": 0.6, "specials": 0.05, "intdiv": 0.04, "computed": 0.04, "compare": 0.04,
                              "lowp_matmul": 0.04, "bigsum": 0.03, "bigindex": 0.03, "window": 0.04, "epilogue": 0.03,
                              "siblings": 0.03, "rows": 0.03}
FLOATS = ("float32", "float16", "bfloat16", "fp8e4m3", "fp8e5m2")
INTS = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")
_SUMMABLE = ("float32", "float16", "bfloat16")   # fp8 sums accumulate in fp8: their rounding depends on the order
_CAST_TO = ("int64", "int32", "uint8", "int8", "uint64", "float32", "float16", "bfloat16")
_MOVES = frozenset({"reshape", "permute", "expand", "pad", "shrink", "flip", "getitem", "bigview", "squeeze", "flatten",
                    "ravel", "windows"})
_LATER_SPECIAL_P = 0.5   # the share of specials steps that are a later op (Generator.later) or a power
_TOP = {"float32": 20, "float16": 10, "bfloat16": 20, "fp8e4m3": 8, "fp8e5m2": 12}   # largest exp2 argument kept


def pick_family(seed: int, among: Optional[Sequence[str]] = None) -> str:
  """The family of `seed` (among `among`, weighted as FAMILIES), from a random stream apart from the kernel's."""
  names = tuple(among) if among else tuple(FAMILIES)
  for n in names:
    if n not in FAMILIES: raise KcError(f"unknown fuzz family {n!r}: one of {', '.join(FAMILIES)}")
  w = np.array([FAMILIES[n] for n in names])
  return names[int(np.random.default_rng([seed, 0x6661]).choice(len(names), p=w / w.sum()))]


def build(family: str, seed: int, size: float = 1.0) -> Recipe:
  if family not in FAMILIES: raise KcError(f"unknown fuzz family {family!r}: one of {', '.join(FAMILIES)}")
  if family == "classic": return Generator(seed, size).recipe()
  g = FamilyGenerator(seed, size)
  outs = getattr(g, f"family_{family}")()
  if not outs: outs = [g.fallback()]
  if g.widen(0.25):   # more outputs, of other shapes: one program, a kernel per shape (kc.schedule)
    with g.drawing_from(g.wide): outs += g.more_outputs(outs)
  return g.finish(outs, family)


def lit(v) -> str:
  """A Python scalar as source both sides read (nan and infs spelled as float(...))."""
  if isinstance(v, float) and not math.isfinite(v): return f"float({str(v)!r})"
  return repr(v)


def _np(dt: str) -> str: return "np.bool_" if dt == "bool" else f"np.{dt}"


class FamilyGenerator(Generator):
  """A Generator whose values may hold NaN and infs and whose dtypes include bfloat16 and fp8. Each step is also
  built with kc.ast as it is added: a step kc refuses, or whose dtype or shape kc.ast and numpy see differently
  (kc's promotion lattice differs from numpy's in documented places), is dropped, not made a case."""

  def __init__(self, seed: int, size: float = 1.0):
    super().__init__(seed, size, specials=True)
    self.special_p = 0.0     # the share of special values in new inputs (0: ordinary values only)
    self.exprs: dict[int, A.Expr] = {}

  # ***** nodes, checked against kc.ast too *****

  def add(self, node: Node, reduced: bool = False) -> Optional[int]:
    if node.op in _MOVES and not node.dtype and len(node.srcs) == 1:   # a view of a narrow float is one too
      node = replace(node, dtype=self.nodes[node.srcs[0]].dtype)
    return super().add(node, reduced)

  def _keep(self, node: Node, v: np.ndarray) -> bool:
    if not super()._keep(node, v): return False
    i = len(self.nodes) - 1
    if special_problem(Recipe(tuple(self.nodes), (i,), self.data), node, v, self.values) is not None: return False
    names = {"A": A, "dtypes": dtypes, **{f"_k{s}": self.exprs[s] for s in node.srcs}}
    try:
      if node.op == "input": e = A.arg(0, getattr(dtypes, self.kdt(node, v)), v.shape)
      else: e = eval(node.kc.format(*(f"_k{s}" for s in node.srcs), idx=0), names)  # noqa: S307 (our own templates)
    except (KcError, TypeError, ValueError): return False
    if e.dtype.name != self.kdt(node, v) or tuple(e.shape) != v.shape: return False
    self.exprs[i] = e
    return True

  def forget_from(self, n: int) -> None:
    for i in range(n, len(self.nodes)): self.exprs.pop(i, None)
    super().forget_from(n)

  @staticmethod
  def kdt(node: Node, v: np.ndarray) -> str: return node.dtype or ("bool" if v.dtype == np.bool_ else v.dtype.name)

  def narrow(self, x: int) -> str: return self.dt(x) if self.dt(x) in NARROW_FLOATS else ""
  def isfloat(self, x: int) -> bool: return self.dt(x) in FLOATS
  def isint(self, x: int) -> bool: return self.dt(x) in INTS

  # ***** values *****

  def _array(self, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    if dtype in NARROW_FLOATS: x = super()._array("float32", shape)
    elif dtype in ("uint32",): x = self.rng.integers(0, 2 ** 32, shape, dtype=np.int64).astype(np.uint32)
    else: x = super()._array(dtype, shape)
    if self.special_p and dtype != "bool":
      mask = self.rng.random(shape) < self.special_p
      x = np.where(mask, self.rng.choice(np.array(specials_of(dtype), dtype=x.dtype), shape), x).astype(x.dtype)
    return rnd_values(x, dtype)

  def const(self, dtype: str, shape: tuple[int, ...]) -> Optional[int]:
    value = self.scalar(dtype)
    k = f"A.const({lit(value)}, dtypes.{dtype}, {shape})"
    if dtype in NARROW_FLOATS:
      return self.node("const", k, f"np.full({shape}, {lit(value)}, np.float32)", (), narrow=dtype)
    return self.add(Node("const", k, f"np.full({shape}, {lit(value)}, {_np(dtype)})"))

  def scalar(self, dtype: str):
    if dtype in FLOATS and self.special_p and self.chance(0.3): return self.pick((math.nan, math.inf, -math.inf, -0.0))
    if dtype in FLOATS: return float(self.pick((0.5, 1.5, 2.0, -1.25, 3.0, -0.75)))
    if dtype in INTS and self.special_p and self.chance(0.3): return int(self.pick(specials_of(dtype)))
    return super().scalar(dtype)

  def small_shape(self, ndim_hi: int = 3, hi: int = 6) -> tuple[int, ...]:
    return tuple(self.dim(hi) for _ in range(int(self.rng.integers(1, ndim_hi + 1))))

  def fallback(self) -> int:
    x = self.input("float32", (4,))
    if x is not None: return x
    return self.add(Node("const", "A.const(1.0, dtypes.float32, (4,))", "np.full((4,), 1.0, np.float32)"))

  # ***** steps over any dtype *****

  def binop(self, op: str, x: int, y: Optional[int] = None, scalar=None) -> Optional[int]:
    """x op y, y a node of x's dtype, or x op `scalar`, a Python scalar."""
    sym = {"add": "+", "sub": "-", "mul": "*", "div": "/", "idiv": "//", "mod": "%"}.get(op)
    (b, nb), srcs = (("{1}", "{1}"), (x, y)) if y is not None else ((lit(scalar), self.np_scalar(scalar, x)), (x,))
    if y is not None and op == "div" and not self.safe_divisor(y): return None
    if y is None and op == "div" and scalar == 0: return None
    if sym: k, n = f"{{0}} {sym} {b}", f"{{0}} {sym} {nb}"
    else: k, n = f"{{0}}.{op}({b})", f"np.{op}({{0}}, {nb})"
    return self.node(op, k, n, srcs, "arith", self.narrow(x))

  def np_scalar(self, v, x: int) -> str:
    """A Python scalar as the reference reads it beside x. Beside a narrow float it is that type's value first, as a
    weak scalar takes the array's dtype (NEP 50) in kc.ast and in ml_dtypes: fp8e4m3 has no inf, so float('inf')
    there is NaN (x / inf is NaN, x < inf False)."""
    if not self.narrow(x) or not isinstance(v, float): return lit(v)
    return lit(float(narrow_round(np.array([v], np.float32), self.narrow(x))[0]))

  def safe_divisor(self, y: int) -> bool:
    """A divisor whose zeros have a sign every backend agrees on (an input's or a constant's): x / 0 is +-inf by it."""
    return self.nodes[y].op in ("input", "const") or not np.any(self.values[y] == 0)

  def unary(self, x: int) -> Optional[int]:
    dt, v = self.dt(x), self.values[x]
    if dt == "bool": return self.node("not", "{0}.logical_not()", "np.logical_not({0})", (x,))
    if not self.isfloat(x):
      if self.chance(0.4): return self.node("abs", "abs({0})", "np.abs({0})", (x,))
      return self.node("neg", "-{0}", "-{0}", (x,))
    with np.errstate(all="ignore"):
      fin = v[np.isfinite(v)]
      lo, hi = (float(fin.min()), float(fin.max())) if fin.size else (0.0, 0.0)
      pos, floor = fin[fin > 0], self.error_floor(x)
      small_pos = bool(pos.size and pos.min() < max(2 ** -6, floor))
      near0 = bool(np.any((fin != 0) & (np.abs(fin) < max(0.25, floor))))
      # a square root of a value whose error may take it across 0 (NaN on one side): exact ones, or away from 0
      signed_near0 = floor > 0 and bool(np.any(np.abs(fin) < floor))
    choices = [("neg", "-{0}", "-{0}", "arith"), ("abs", "abs({0})", "np.abs({0})", "arith")]
    if not signed_near0: choices.append(("sqrt", "{0}.sqrt()", "np.sqrt({0})", "transcendental"))
    if hi <= _TOP[dt] and lo >= -20: choices.append(("exp2", "{0}.exp2()", "np.exp2({0})", "transcendental"))
    if not small_pos: choices.append(("log2", "{0}.log2()", "np.log2({0})", "transcendental"))
    if max(abs(lo), abs(hi)) <= 8: choices.append(("sin", "{0}.sin()", "np.sin({0})", "transcendental"))
    if not near0 and self.safe_divisor(x):
      choices.append(("recip", "{0}.recip()", f"{_np('float32' if self.narrow(x) else dt)}(1) / {{0}}", "arith"))
    op, k, n, kind = self.pick(choices)
    return self.node(op, k, n, (x,), kind, self.narrow(x))

  def cast_to(self, x: int, dt: str) -> Optional[int]:
    src = self.dt(x)
    if src == dt: return x
    if dt in NARROW_FLOATS:
      # an int -> bfloat16/fp8 cast rounds twice in C (to float, then to the narrow type): only exact ones are kept
      if src in INTS and np.any(np.abs(self.values[x].astype(np.float64)) > 256): return None
      return self.node("cast", f"{{0}}.cast(dtypes.{dt})", "{0}", (x,), "arith", dt)
    if src in FLOATS and dt != "bool" and dt not in FLOATS:
      w = self.values[x].astype(np.float64)
      with np.errstate(all="ignore"):
        fin = w[np.isfinite(w)]
        if fin.size and (fin.min() < np.iinfo(dt).min or fin.max() > np.iinfo(dt).max): return None
      return self.node("cast", f"{{0}}.cast(dtypes.{dt})", f"{{0}}.astype({_np(dt)})", (x,), needs_exact=True)
    if dt == "float16" and np.any(np.abs(np.nan_to_num(self.values[x].astype(np.float64))) > 60000): return None
    return self.node("cast", f"{{0}}.cast(dtypes.{dt})", f"{{0}}.astype({_np(dt)})", (x,), "arith")

  def compare_with(self, x: int, y: Optional[int], sym: str, scalar=None) -> Optional[int]:
    (b, nb), srcs = (("{1}", "{1}"), (x, y)) if y is not None else ((lit(scalar), self.np_scalar(scalar, x)), (x,))
    return self.node("cmp", f"{{0}} {sym} {b}", f"{{0}} {sym} {nb}", srcs, needs_exact=True)

  def reduce_any(self, x: int, op: str, axes: tuple[int, ...]) -> Optional[int]:
    """x.op(axis=axes, keepdims=...) with numpy's answer: floats of 16 bits sum in float32 and round once. keepdims
    is drawn from the scheduler's stream (Generator.keepdims): without it, a full reduce is a 0-d value."""
    if not axes: return None
    dt, ax = self.dt(x), f"axis={axes}, keepdims={self.keepdims()}"
    k = f"{{0}}.{op}({ax})"
    if op == "prod" and not products_stay_normal(self.values[x], axes): return None
    if op in ("sum", "prod", "mean"):
      if dt in ("fp8e4m3", "fp8e5m2"): return None
      if dt in ("float16", "bfloat16"):
        n = f"{{0}}.astype(np.float32).{op}({ax})"
        n = f"{n}.astype(np.float16)" if dt == "float16" else n
        return self.node(op, k, n, (x,), "reduce", self.narrow(x), reduced=True)
      if op == "mean" and dt not in FLOATS: return None
      kind = "reduce" if dt in FLOATS else "arith"
      return self.node(op, k, f"{{0}}.{op}({ax})", (x,), kind, reduced=True)
    if op in ("any", "all"): return self.node(op, k, f"np.{op}({{0}}, {ax})", (x,), reduced=True)
    return self.node(op, k, f"{{0}}.{op}({ax})", (x,), narrow=self.narrow(x), reduced=True)

  def same_dtype_operand(self, x: int) -> Optional[int]:
    """Another value of x's dtype that broadcasts to x's shape: an existing one or a new input."""
    if self.chance(0.3):
      fits = [i for i in self.values if i != x and self.dt(i) == self.dt(x) and _broadcasts(self.shp(i), self.shp(x))]
      if fits: return self.pick(fits)
    bshape = tuple(1 if self.chance(0.2) else d for d in self.shp(x))
    return self.input(self.dt(x), bshape)

  def special_step(self, x: int) -> Optional[int]:
    """One step of the specials family on x: often one of the later ops or a power (from their own stream, so the
    other steps draw as they did before those existed)."""
    if self.more.random() < _LATER_SPECIAL_P:
      pick = int(self.more.integers(5))   # powers and the elementwise ops most often: they meet the NaN and infs first
      if pick <= 1 and self.isfloat(x): return self.later(x, self.power)
      return self.later(x, self.later_unary if pick == 2 else None)
    dt, kind = self.dt(x), int(self.rng.integers(10))
    if kind < 4 and dt != "bool":
      ops = ["add", "sub", "mul", "maximum", "minimum"] + (["div"] if self.isfloat(x) else ["idiv", "mod"])
      op = self.pick(ops)
      if self.chance(0.3): return self.binop(op, x, scalar=self.scalar(dt))
      y = self.same_dtype_operand(x)
      return None if y is None else self.binop(op, x, y)
    if kind < 6: return self.unary(x)
    if kind == 6:
      y = self.same_dtype_operand(x)
      if y is None: return None
      c = self.compare_with(x, y, self.pick(("<", ">", "<=", ">=", "==", "!=")))
      return None if c is None else self.where_of(c, x, y)
    if kind == 7: return self.cast_to(x, self.pick(FLOATS + INTS + ("bool",)))
    axes = self.axes(x)
    op = self.pick(("sum", "max", "min", "any", "all") if dt != "bool" else ("any", "all", "max"))
    return self.reduce_any(x, op, axes)

  def power(self, x: int) -> Optional[int]:
    """x ** e, b ** x or x ** y with C's and numpy's special cases: x ** 0 and 1 ** y are 1 even for NaN, (-1) ** +-inf
    is 1, a negative base (or -0.0) is negative for odd integer exponents and NaN for others. ** 0.5 of numpy's own
    floats is their sqrt ((-0.0) ** 0.5 is -0.0, (-inf) ** 0.5 NaN); bfloat16's and fp8's is C's pow per element, as
    ml_dtypes computes it ((-inf) ** 0.5 is inf): numpy's power of an exponent array, which takes no sqrt shortcut.
    Half, bfloat16 and fp8 are computed in float32 and rounded once, as numpy's half is."""
    kind = int(self.rng.integers(3))
    if kind == 0:
      e = self.pick((0, 0.0, 0.5, 0.5, 1, 2, 3, -1, -2, -0.5, 1.5, math.inf, -math.inf, math.nan))
      k = n = f"{{0}} ** {lit(e)}"
      if self.narrow(x): n = f"np.power({{0}}, np.full(np.shape({{0}}), {self.np_scalar(e, x)}, np.float32))"
      srcs: tuple[int, ...] = (x,)
    elif kind == 1:
      b = self.pick((1.0, 1.0, -1.0, 2.0, 0.5, 0.0, -0.0, -2.0, math.inf))
      k, n = f"({lit(b)}) ** {{0}}", f"({self.np_scalar(b, x)}) ** {{0}}"
      srcs = (x,)
    else:
      y = self.same_dtype_operand(x)
      if y is None: return None
      k = n = "{0} ** {1}"
      srcs = (x, y)
    return self.node("pow", k, n, srcs, "transcendental", self.narrow(x))

  def where_of(self, c: int, a: int, b: int) -> Optional[int]:
    return self.node("where", "{0}.where({1}, {2})", "np.where({0}, {1}, {2})", (c, a, b), narrow=self.narrow(a))

  # ***** the families *****

  def family_specials(self) -> list[int]:
    self.special_p = float(self.pick((0.1, 0.2, 0.35)))
    dt = self.pick(FLOATS + FLOATS + INTS)
    x = self.input(dt, self.small_shape())
    if x is None: return []
    for _ in range(int(self.rng.integers(1, 5))):
      y = self.special_step(x)
      if y is not None: x = y
    return [x]

  def family_intdiv(self) -> list[int]:
    self.special_p = float(self.pick((0.3, 0.5)))
    dt = self.pick(INTS)
    x = self.input(dt, self.small_shape(2, 8))
    if x is None: return []
    mn, mx = int(np.iinfo(dt).min), int(np.iinfo(dt).max)
    sym = self.pick(("//", "%"))
    if self.chance(0.35):   # a Python scalar divisor: MIN and -1 (or MAX for the unsigned) and 0
      s = self.pick((mn, -1 if mn < 0 else mx, 0, mx, 7))
      y = self.node("idiv" if sym == "//" else "mod", f"{{0}} {sym} {s!r}", f"{{0}} {sym} {_np(dt)}({s!r})", (x,))
    else:
      d = self.input(dt, tuple(1 if self.chance(0.2) else s for s in self.shp(x)))
      if d is None: return []
      y = self.node("idiv" if sym == "//" else "mod", f"{{0}} {sym} {{1}}", f"{{0}} {sym} {{1}}", (x, d))
    if y is None: return []
    if self.chance(0.4): y = self.pad(y) or y
    if self.chance(0.3): y = self.reduce_any(y, "sum", self.axes(y)) or y
    elif self.chance(0.3): y = self.cast_to(y, self.pick(("int64", "int32", "float32"))) or y
    return [y]

  def family_computed(self) -> list[int]:
    self.special_p = float(self.pick((0.0, 0.1, 0.25)))
    kind = int(self.rng.integers(5))
    shape = self.small_shape(2, 6)
    if kind == 0:   # (x // y).pad and shrink
      dt = self.pick(("int8", "int16", "int32", "int64", "uint8", "float32"))
      x, y = self.input(dt, shape), self.input(dt, shape)
      if x is None or y is None: return []
      v = self.binop("idiv", x, y) if dt != "float32" else self.binop("mul", x, y)
    elif kind == 1:   # (x ** 2.5).clip(lo, hi)
      dt = self.pick(("float32", "float16"))
      x = self.input(dt, shape)
      if x is None: return []
      e = self.pick((2.5, 0.5, 3.0, 2))
      # numpy's operator, as kc.ast's: x ** 0.5 is its sqrt ((-inf) ** 0.5 is NaN), where np.power(half, 0.5) is C's pow
      v = self.node("pow", f"{{0}} ** {e!r}", f"{{0}} ** {e!r}", (x,), "transcendental")
      if v is not None:
        lo, hi = sorted((float(self.pick((-1.0, 0.5, 1.5, 2.0))), float(self.pick((0.5, 3.0, 4.0, math.inf)))))
        n = f"np.minimum(np.maximum({{0}}, {lit(lo)}), {lit(hi)})"   # kc.ast's definition, NaN propagating as numpy's
        v = self.node("clip", f"{{0}}.clip({lit(lo)}, {lit(hi)})", n, (v,), "arith")
    elif kind == 2:   # where(c, a, b) of computed values
      dt = self.pick(("float32", "float16", "int32", "int64", "bfloat16"))
      x, y = self.input(dt, shape), self.input(dt, shape)
      if x is None or y is None: return []
      a, b = self.binop("mul", x, y), self.binop(self.pick(("add", "sub", "maximum")), x, y)
      if a is None or b is None: return []
      c = self.compare_with(a, b, self.pick(("<", ">=", "==", "!=")))
      v = None if c is None else self.where_of(c, a, b)
    elif kind == 3:   # minimum / maximum with NaN, of computed values
      self.special_p = max(self.special_p, 0.2)
      dt = self.pick(("float32", "float16", "bfloat16", "fp8e5m2"))
      x, y = self.input(dt, shape), self.input(dt, shape)
      if x is None or y is None: return []
      s = self.binop(self.pick(("add", "mul", "sub")), x, y)
      op = self.pick(("maximum", "minimum"))
      if s is None: return []
      v = self.binop(op, s, scalar=math.nan) if self.chance(0.3) else self.binop(op, s, self.pick((x, y)))
    else:   # a value computed then reduced over padding
      dt = self.pick(("float32", "int32", "int64", "float16"))
      x = self.input(dt, shape)
      if x is None: return []
      v = self.binop(self.pick(("add", "mul", "maximum")), x, scalar=self.scalar(dt))
      if v is not None: v = self.pad(v)
      if v is not None: v = self.reduce_any(v, self.pick(("sum", "max", "min")), self.axes(v))
    if v is None: return []
    for _ in range(int(self.rng.integers(0, 3))):
      w = self.pick((self.pad, self.shrink, self.flip, self.getitem))(v)
      if w is not None: v = w
    return [v]

  def family_compare(self) -> list[int]:
    self.special_p = float(self.pick((0.0, 0.2)))
    dt = self.pick(("bool",) + INTS + FLOATS)
    x = self.input(dt, self.small_shape())
    if x is None: return []
    if self.chance(0.4) or dt == "bool":
      v = self.reduce_any(x, self.pick(("any", "all")), self.axes(x))
    else:
      other = self.pick(INTS + FLOATS) if self.chance(0.3) else dt
      y = self.input(other, tuple(1 if self.chance(0.2) else s for s in self.shp(x)))
      if y is None: return []
      if dt in INTS and self.chance(0.3):   # neighbours at the top of the range: a compare done in float would tie
        self.data[y] = np.full(self.shp(y), np.iinfo(other).max if other in INTS else 1, dtype=self.data[y].dtype)
        self.values[y] = self.data[y]
      v = self.compare_with(x, y, self.pick(("<", ">", "<=", ">=", "==", "!=")))
      if v is not None and self.chance(0.4): v = self.reduce_any(v, self.pick(("any", "all", "sum")), self.axes(v))
    if v is None: return []
    if self.chance(0.7): v = self.cast_to(v, self.pick(_CAST_TO)) or v
    return [v]

  def family_lowp_matmul(self) -> list[int]:
    dt = self.pick(("float16", "bfloat16"))
    M, K, N = (self.dim(8) * self.pick((1, 2, 4)) for _ in range(3))
    a, b = self.input(dt, (M, K)), self.input(dt, (K, N))
    if a is None or b is None: return []
    n = "np.matmul({0}.astype(np.float32), {1}.astype(np.float32))"
    if dt == "float16": v = self.node("matmul", "{0} @ {1}", f"{n}.astype(np.float16)", (a, b), "arith", reduced=True)
    else: v = self.node("matmul", "{0} @ {1}", n, (a, b), "arith", narrow=dt, reduced=True)
    return [] if v is None else [v]

  def family_bigsum(self) -> list[int]:
    dt = self.pick(("int64", "uint64", "int64"))
    shape = (self.dim(6), self.pick((3, 5, 6, 7, 9, 13, 17, 30)))
    if self.chance(0.5): shape = shape[::-1]
    i = len(self.nodes)
    lo = 2 ** 40
    sign = 1 if dt == "uint64" else self.rng.choice((-1, 1), shape)
    self.data[i] = (self.rng.integers(lo, 2 * lo, shape) * sign).astype(dt)
    x = self.add(Node("input", f"A.arg({{idx}}, dtypes.{dt}, {shape})", "inputs[{idx}]"))
    if x is None: return []
    if self.chance(0.4): x = self.binop(self.pick(("mul", "add")), x, scalar=int(self.pick((3, 7, 1 << 20)))) or x
    v = self.reduce_any(x, "sum", (int(self.rng.integers(2)),) if self.chance(0.8) else (0, 1))
    return [] if v is None else [v]

  def family_window(self) -> list[int]:
    """x (N, C, W) padded by p on both sides and cut into windows of k: the forward (times w (O, C, k), summed over C
    and the window), the weight gradient (times g (N, O, W'), summed over N and the row) or the input gradient (g's
    windows times w flipped), W' = W + 2p - k + 1 outputs per row."""
    N, C, O = self.dim(2), self.dim(3), self.dim(4)
    W = self.pick((7, 8, 16, 17, 32, 48))
    k, p = self.pick(((3, 1), (3, 0), (5, 2), (2, 1), (1, 0)))
    out = W + 2 * p - k + 1
    windows = "np.lib.stride_tricks.sliding_window_view(np.pad({x}, ((0, 0), (0, 0), ({p}, {p}))), {k}, axis=2)"
    kind = self.pick(("forward", "weight_grad", "input_grad"))
    x = self.input("float32", (N, C, W) if kind != "input_grad" else (N, O, out))
    other = self.input("float32", (O, C, k) if kind != "weight_grad" else (N, O, out))
    if x is None or other is None: return []
    if kind == "forward":
      kc_ = f"({{0}}.pad(((0, 0), (0, 0), ({p}, {p}))).windows(2, {k}).reshape({N}, 1, {C}, {out}, {k}) * " \
            f"{{1}}.reshape(1, {O}, {C}, 1, {k})).sum((2, 4))"
      np_ = f"np.einsum('ncwk,ock->now', {windows.format(x='{0}', p=p, k=k)}, {{1}})"
    elif kind == "weight_grad":
      kc_ = f"({{0}}.pad(((0, 0), (0, 0), ({p}, {p}))).windows(2, {k}).reshape({N}, 1, {C}, {out}, {k}) * " \
            f"{{1}}.reshape({N}, {O}, 1, {out}, 1)).sum((0, 3))"
      np_ = f"np.einsum('ncwk,now->ock', {windows.format(x='{0}', p=p, k=k)}, {{1}})"
    else:   # the gradient's windows (padded by k - 1 - p) times the weight flipped along the window: (N, C, W)
      q = k - 1 - p
      kc_ = f"({{0}}.pad(((0, 0), (0, 0), ({q}, {q}))).windows(2, {k}).reshape({N}, {O}, 1, {W}, {k}) * " \
            f"{{1}}.flip(2).reshape(1, {O}, {C}, 1, {k})).sum((1, 4))"
      np_ = f"np.einsum('nowk,ock->ncw', {windows.format(x='{0}', p=q, k=k)}, {{1}}[:, :, ::-1])"
    v = self.node(kind, kc_, np_, (x, other), "arith", reduced=True)
    return [] if v is None else [v]

  def family_epilogue(self) -> list[int]:
    """x @ W.T or x @ W (float32, M and N multiples of 4, K a few vectors long) plus a bias row, then 2 to 5
    elementwise steps on the result."""
    M, N, K = 4 * self.pick((1, 2, 3, 4, 8)), 4 * self.pick((1, 2, 4, 8)), self.pick((8, 16, 32, 48, 64))
    transposed = self.chance(0.7)
    x, w, b = self.input("float32", (M, K)), self.input("float32", (N, K) if transposed else (K, N)), self.input("float32", (N,))
    if x is None or w is None or b is None: return []
    k, n = ("{0} @ {1}.T", "np.matmul({0}, {1}.T)") if transposed else ("{0} @ {1}", "np.matmul({0}, {1})")
    v = self.node("matmul", k, n, (x, w), "arith", reduced=True)
    v = None if v is None else self.binop("add", v, b)
    for _ in range(int(self.rng.integers(2, 6))):
      if v is None: return []
      step = self.pick(("unary", "unary", "scale", "div", "select", "max"))
      if step == "unary": nxt = self.unary(v)
      elif step == "scale":
        nxt = self.binop("mul", v, scalar=float(self.pick((0.5, -1.25, 0.125))))
        nxt = None if nxt is None else self.binop("add", nxt, scalar=float(self.pick((1.0, -0.75))))
      elif step == "div":   # v / (v * v + 1): a divisor that is never 0
        sq = self.binop("mul", v, v)
        sq = None if sq is None else self.binop("add", sq, scalar=1.0)
        nxt = None if sq is None else self.binop("div", v, sq)
      elif step == "select":
        c = self.compare_with(v, None, self.pick(("<", ">=")), scalar=0.0)
        a = self.binop("mul", v, scalar=float(self.pick((0.5, 2.0))))
        nxt = None if c is None or a is None else self.where_of(c, a, v)
      else: nxt = self.binop("maximum", v, scalar=0.0)
      v = nxt if nxt is not None else v
    return [] if v is None else [v]

  def family_rows(self) -> list[int]:
    """x (R, K) reduced along its rows and stored: sum or max of x, the sum of x * y (y of x's shape or one row) or of
    x * x, or x @ W.T for a few outputs (float32); R and K multiples of the vector widths, so that the hand-coded opts
    keep a vector accumulator per row of a tile and store the rows as one vector. Now and then scaled after the
    reduce (the rows then stored lane by lane)."""
    R, K = self.pick((2, 4, 8, 12, 16, 32)), self.pick((16, 32, 48, 64, 128, 256))
    kind = self.pick(("sum", "max", "xy", "xx", "linear"))
    x = self.input("float32" if kind == "linear" else self.pick(("float32", "float32", "float16")), (R, K))
    if x is None: return []
    v: Optional[int] = None
    if kind == "linear":
      w = self.input("float32", (self.pick((1, 2, 4, 8, 16)), K))
      if w is not None: v = self.node("matmul", "{0} @ {1}.T", "np.matmul({0}, {1}.T)", (x, w), "arith", reduced=True)
    elif kind in ("sum", "max"): v = self.reduce_any(x, kind, (1,))
    else:
      y = x if kind == "xx" else self.input(self.dt(x), (R, K) if self.chance(0.5) else (1, K))
      prod = None if y is None else self.binop("mul", x, y)
      v = None if prod is None else self.reduce_any(prod, "sum", (1,))
    if v is not None and self.chance(0.3): v = self.binop("mul", v, scalar=0.5) or v
    return [] if v is None else [v]

  def family_siblings(self) -> list[int]:
    """Terms reduced over the same axis of x and y (sum(x * y), sum(x), sum(x * x), max(y)), two or three of them,
    added; half the time kept as keepdims and combined with x at its full shape, as a layer norm's backward is."""
    # rows that the matrix-vector heuristic's blocks divide (16, 32, 64) as often as not
    shape = (self.pick((self.dim(8), 16, 32, 64)), self.pick((3, 16, 17, 64, 128, 256, 1024)))
    if self.chance(0.3): shape = shape[::-1]
    axis, full = int(self.rng.integers(2)), self.chance(0.5)
    x, y = self.input("float32", shape), self.input("float32", shape if self.chance(0.7) else (1, shape[1]))
    if x is None or y is None: return []
    ax = f"axis=({axis},), keepdims={full}"
    # per term: its kc.ast and numpy templates (x is {0}, y {1}) and its operands
    kinds = {"xy": (f"({{0}} * {{1}}).sum({ax})", f"np.sum({{0}} * {{1}}, {ax})", (x, y)),
             "x": (f"{{0}}.sum({ax})", f"np.sum({{0}}, {ax})", (x,)),
             "xx": (f"({{0}} * {{0}}).sum({ax})", f"np.sum({{0}} * {{0}}, {ax})", (x,)),
             "ymax": (f"{{0}}.max({ax})", f"np.max({{0}}, {ax})", (y,))}
    names = list(kinds)
    terms = []
    for i in self.rng.choice(len(names), size=int(self.rng.integers(2, 4)), replace=False):
      kc_, np_, srcs = kinds[names[int(i)]]
      t = self.node(f"sibling_{names[int(i)]}", kc_, np_, srcs, "reduce", reduced=True)
      if t is not None: terms.append(t)
    if len(terms) < 2: return terms
    v: Optional[int] = terms[0]
    for t in terms[1:]: v = None if v is None else self.binop("add", v, t)
    if v is not None and full: v = self.binop("sub", x, v) or v
    return [] if v is None else [v]

  def family_bigindex(self) -> list[int]:
    """A small buffer's view expanded to 2^32 elements, then strided, shrunk or flattened down to a small result."""
    kind = int(self.rng.integers(3))
    H, W = self.pick(((1 << 16, 1 << 16), (1 << 20, 1 << 12), (1 << 12, 1 << 20)))
    src = self.pick(((1, 1), (1, 16), (16, 1), (1, 64)))
    src = (src[0] if src[0] == 1 else src[0] if H % src[0] == 0 else 1, src[1])
    if src[0] != 1: src = (1, src[1]) if src[1] != 1 else (1, 1)
    x = self.input(self.pick(("float32", "int32", "int64", "float16")), src)
    if x is None: return []
    if src[1] != 1:   # a (1, w) row tiled across the huge axis: reshape to (1, w) -> (w,) -> expand
      x = self.mv("reshape", x, repr((1, 1, src[1])), f"{{0}}.reshape({(1, 1, src[1])})")
      if x is None: return []
      big, ex = (H, W // src[1], src[1]), f"np.broadcast_to({{0}}, {(H, W // src[1], src[1])})"
    else: big, ex = (H, W), f"np.broadcast_to({{0}}, {(H, W)})"
    if kind == 0:   # strided corner: a few rows and columns far apart
      sl = [f"{int(self.rng.integers(d // 2))}::{max(1, d // self.pick((8, 16, 32)))}" for d in big]
      idx = ", ".join(sl)
      v = self.add(Node("bigview", f"{{0}}.expand{big}[{idx}]", f"{ex}[{idx}]", (x,)))
    elif kind == 1:   # flattened past 2^31, then a stride that lands in far rows
      n = math.prod(big)
      step = self.pick(((1 << 20) + 1, (1 << 22) + 3, n // 1024 + 1))
      start = int(self.rng.integers(1 << 30, 1 << 31)) if self.chance(0.5) else 0
      cnt = len(range(start, n, step))
      v = self.add(Node("bigview", f"{{0}}.expand{big}.reshape({n})[{start}::{step}]",
                        f"{ex}[np.unravel_index(np.arange({start}, {n}, {step}), {big})]", (x,)))
      if v is not None and cnt % 4 == 0 and self.chance(0.5):
        v = self.mv("reshape", v, repr((4, cnt // 4)), f"{{0}}.reshape({(4, cnt // 4)})")
    else:   # a reduce over a few thousand iterations of an axis whose index passes 2^31
      rows = self.pick((4, 8))
      stride_r, stride_c = big[0] // rows, max(1, big[-1] // self.pick((512, 2048, 4096)))
      idx = ", ".join([f"::{stride_r}"] + [":1"] * (len(big) - 2) + [f"::{stride_c}"])
      v = self.add(Node("bigview", f"{{0}}.expand{big}[{idx}]", f"{ex}[{idx}]", (x,)))
      # a half sum of thousands of values would round a long way from numpy's float32 one: max for half
      op = "max" if v is None or self.dt(v) == "float16" else self.pick(("sum", "max"))
      if v is not None: v = self.reduce_any(v, op, (len(big) - 1,))
    if v is None: return []
    if self.chance(0.3): v = self.binop("add", v, scalar=self.scalar(self.dt(v))) or v
    return [v]


def specials_of(dtype: str) -> tuple:
  """The special values of a dtype: NaN, +-inf and -0.0 for floats (fp8e4m3 has no inf: it becomes NaN), MIN, -1, 0
  and MAX for ints (-1 is MAX for the unsigned)."""
  if dtype in FLOATS: return (math.nan, math.inf, -math.inf, -0.0)
  info = np.iinfo(dtype)
  return (int(info.min), -1 if info.min < 0 else int(info.max), 0, int(info.max))


def rnd_values(x: np.ndarray, dtype: str) -> np.ndarray:
  """Input values as the dtype holds them: a narrow float's rounded once (float32), others as numpy's dtype."""
  if dtype in NARROW_FLOATS: return narrow_round(x.astype(np.float32), dtype)
  return np.asarray(x).astype(dtype)
