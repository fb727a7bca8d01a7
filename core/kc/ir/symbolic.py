"""Symbolic integer algebra as rewrite rules: index expressions of shapes and kernels get simplified here.

Integer semantics are C's: `//` truncates toward zero and `%` takes the dividend's sign. Every rule below is
exact under those semantics (the property tests check this against direct evaluation); rules that only
hold for non-negative values check `vmin >= 0` first. Wrap-around is assumed not to happen in index math,
as every backend does; range analysis widens to the dtype's range wherever it could."""
from __future__ import annotations
import math, numbers
from collections.abc import Mapping
from typing import Optional, Union
from kc.ir.dtype import DType, cast_scalar, dtypes
from kc.errors import SymbolicError
from kc.ir.rewrite import PatternMatcher, UPat, graph_rewrite
from kc.ir.uop import GroupOp, Ops, UOp, Variable, exec_alu, sint

__all__ = ["symbolic", "Variable", "sint", "resolve", "sym_infer", "ssimplify", "smax", "smin", "split_sum", "root_and_offset", "simplify"]


# ***** sums as (terms with coefficients) + constant *****

def root_and_offset(idx: UOp) -> tuple[Optional[UOp], int]:
  """(root, constant offset) of a simplified index expression (None for a constant one): accesses under one root are
  in the same loops, at offsets that differ by constants."""
  if idx.op is Ops.CONST: return None, idx.arg
  if idx.op is Ops.ADD and idx.src[1].op is Ops.CONST: return idx.src[0], idx.src[1].arg
  return idx, 0


def split_sum(x: UOp) -> tuple[dict[UOp, int], int]:
  """An integer expression as {term: coefficient} and a constant: x*3 + y + x + 5 -> ({x: 4, y: 1}, 5).
  Cached on each ADD; callers must not mutate the returned dict."""
  if (ret := x.__dict__.get("_sum")) is not None: return ret
  terms: dict[UOp, int] = {}
  const = 0
  stack = [(x, 1)]
  while stack:
    u, coef = stack.pop()
    if u.op is Ops.ADD:
      if (cached := u.__dict__.get("_sum")) is not None:
        for t, k in cached[0].items(): terms[t] = terms.get(t, 0) + coef * k
        const += coef * cached[1]
      else:
        stack.append((u.src[1], coef)); stack.append((u.src[0], coef))
    elif u.op is Ops.CONST: const += coef * u.arg
    elif u.op is Ops.MUL and u.src[1].op is Ops.CONST: stack.append((u.src[0], coef * u.src[1].arg))
    else: terms[u] = terms.get(u, 0) + coef
  ret = (terms, const)
  if x.op is Ops.ADD: x.__dict__["_sum"] = ret
  return ret


def build_sum(terms: dict[UOp, int], const: int, dtype: DType) -> UOp:
  """The expression of split_sum's output: terms in their order, the constant last, coefficients folded in."""
  out: Optional[UOp] = None
  for t, c in terms.items():
    if c == 0: continue
    term = t if c == 1 else UOp(Ops.MUL, dtype, (t, UOp.const(dtype, c)))
    out = term if out is None else UOp(Ops.ADD, dtype, (out, term))
  if out is None: return UOp.const(dtype, const)
  return out if const == 0 else UOp(Ops.ADD, dtype, (out, UOp.const(dtype, const)))


def sum_bounds(terms: dict[UOp, int], const: int) -> tuple[int, int]:
  """The range of build_sum(terms, const) from the terms' ranges, without building it."""
  lo = hi = const
  for t, k in terms.items():
    a, b = k * t.vmin, k * t.vmax
    lo, hi = lo + min(a, b), hi + max(a, b)
  return lo, hi


def _fits(dtype: DType, lo: int, hi: int) -> bool:
  return dtypes.min(dtype) <= lo and hi <= dtypes.max(dtype)


# ***** rule callbacks *****

def fold_alu(x: UOp) -> Optional[UOp]:
  """What every ALU op tries first: fold constant operands, fold an int/bool whose range is one value, and put a
  constant operand of a commutative op on the right (so the other rules need to look in one place only)."""
  src = x.src
  for s in src:
    if s.op is not Ops.CONST: break
  else:
    if x.op in (Ops.SHL, Ops.SHR) and not 0 <= src[1].arg < 8 * x.dtype.itemsize: return None  # undefined in C
    return UOp.const(x.dtype, exec_alu(x.op, x.dtype, tuple(s.arg for s in src)))
  if x.dtype in _INT_OR_BOOL and (mm := x.bounds)[0] == mm[1]: return UOp.const(x.dtype, mm[0])
  # a float MAX is not quite commutative: of two equal operands (-0.0 and 0.0) it gives the second, as numpy does
  if x.op in GroupOp.Commutative and src[0].op is Ops.CONST and not (x.op is Ops.MAX and dtypes.is_float(x.dtype)):
    return x.replace(src=(src[1], src[0]))
  return None


_INT_OR_BOOL = frozenset(dtypes.ints + (dtypes.bool,))


def canonical_sum(x: UOp) -> Optional[UOp]:
  """Combine like terms and gather constants of an integer sum: (a+2)+(a*3+b) -> (a*4+b)+2."""
  if not dtypes.is_int(x.dtype) or x.dtype.count != 1: return None
  a, b = x.src
  # sources are rewritten first, so `a` is already canonical: x is too when b adds a constant or a new term
  # to an `a` that carries no constant (the common case, decided without rebuilding the sum)
  if b.op is not Ops.ADD and a.op is not Ops.CONST and not (a.op is Ops.ADD and a.src[1].op is Ops.CONST):
    if b.op is Ops.CONST:
      if b.arg != 0: return None
    else:
      base = b.src[0] if b.op is Ops.MUL and b.src[1].op is Ops.CONST else b
      if base.op not in (Ops.ADD, Ops.CONST, Ops.MUL) and base not in split_sum(a)[0]: return None
  terms, const = split_sum(x)
  return build_sum(terms, const, x.dtype)


def divmod_fold(x: UOp, c: UOp, op: Ops) -> Optional[UOp]:
  """Fold x // c or x % c for a constant c from the ranges and the coefficients of the sum x."""
  d = c.arg
  if not dtypes.is_int(x.dtype) or x.dtype.count != 1 or d == 0: return None
  if d < 0:  # C semantics: x // -d == -(x // d) and x % -d == x % d; the int's MIN has no -d (it wraps to itself)
    return (-(x // -d) if op is Ops.IDIV else x % -d) if -d <= dtypes.max(x.dtype) else None
  if d == 1: return x if op is Ops.IDIV else x.const_like(0)
  dt = x.dtype
  # the whole range of x sits in one quotient bucket
  if x.vmin >= 0 and x.vmin // d == x.vmax // d:
    q = x.vmin // d
    return x.const_like(q) if op is Ops.IDIV else (x if q == 0 else x - q * d)
  if x.vmax <= 0 and -x.vmax // d == -x.vmin // d:
    q = -(-x.vmin // d)
    return x.const_like(q) if op is Ops.IDIV else (x if q == 0 else x - q * d)
  terms, const = split_sum(x)
  # every fold below reasons about the sum as a mathematical integer: where it can leave the dtype's range it wraps
  # (x * 65535 in uint16 is -x), and (x*65535)//6 is not (x*21845)//2
  if not _fits(dt, *sum_bounds(terms, const)): return None
  # a common factor of every coefficient, the constant and the divisor cancels (exact for any sign)
  g = math.gcd(d, const, *terms.values())
  if g > 1:
    inner = build_sum({t: k // g for t, k in terms.items()}, const // g, dt)
    if g == d: return inner if op is Ops.IDIV else x.const_like(0)
    return inner // (d // g) if op is Ops.IDIV else (inner % (d // g)) * g
  if x.vmin < 0: return None
  # terms that share a factor g of d, plus a rest R that stays in [0, g): x // d == (A/g) // (d/g) and
  # x % d == (A/g % d/g)*g + R, since floor((g*A' + R)/(g*m)) == floor(A'/m) there: (x*4+l)//8 -> x//2 for l in [0, 4)
  for g in sorted({math.gcd(d, k) for k in terms.values()} - {1, d}, reverse=True):
    rest = {t: k for t, k in terms.items() if k % g != 0}
    lo, hi = sum_bounds(rest, const)
    if lo >= 0 and hi < g:
      a = build_sum({t: k // g for t, k in terms.items() if k % g == 0}, 0, dt)
      return a // (d // g) if op is Ops.IDIV else (a % (d // g)) * g + build_sum(rest, const, dt)
  # x == d*Q + R exactly; when R always lies in [0, d), Q is the quotient and R the remainder
  quot = {t: k // d for t, k in terms.items()}
  rem = {t: k % d for t, k in terms.items()}
  if any(quot.values()) or const >= d:
    lo, hi = sum_bounds(rem, const % d)
    if lo >= 0 and hi < d:
      return build_sum(quot, const // d, dt) if op is Ops.IDIV else build_sum(rem, const % d, dt)
  # pull out the multiples of d when the rest is non-negative: (d*A + B) // d == A + B // d for B >= 0
  multiples = {t: k for t, k in terms.items() if k % d == 0}
  if multiples and len(multiples) < len(terms) or (multiples and const != 0):
    rest = {t: k for t, k in terms.items() if k % d != 0}
    if sum_bounds(rest, const)[0] >= 0:
      a, b = build_sum({t: k // d for t, k in multiples.items()}, 0, dt), build_sum(rest, const, dt)
      return a + b // d if op is Ops.IDIV else b % d
  return None


def divmod_by_variable(x: UOp, d: UOp, op: Ops) -> Optional[UOp]:
  """x // d and x % d for a positive non-constant d: pull out the terms that are multiples of d.
  x == d*Q + R exactly; with x >= 0 and R >= 0 (truncation is floor there), x//d == Q + R//d and x%d == R%d,
  and when R < d always, x//d == Q and x%d == R."""
  if d.op is Ops.CONST or d.vmin <= 0 or not dtypes.is_int(x.dtype) or x.dtype.count != 1: return None
  terms, const = split_sum(x)
  quot: dict[UOp, int] = {}
  rest: dict[UOp, int] = {}
  for t, k in terms.items():
    if t is d: quot[UOp.const(x.dtype, 1)] = quot.get(UOp.const(x.dtype, 1), 0) + k
    elif t.op is Ops.MUL and d in t.src: quot[t.src[1] if t.src[0] is d else t.src[0]] = k
    else: rest[t] = k
  lo, hi = sum_bounds(rest, const)
  if x.vmin < 0 or lo < 0: return None
  # the rest never reaches d: by its range, or because it is a loop index that runs to d
  below_d = hi < d.vmin or (const == 0 and len(rest) == 1 and (t := next(iter(rest))).op is Ops.RANGE and rest[t] == 1 and
                            t.src[0].op is Ops.CONST and t.src[0].arg == 0 and t.src[1] is d)
  if below_d:
    if not quot: return x.const_like(0) if op is Ops.IDIV else None
    q = build_sum({t: k for t, k in quot.items() if t.op is not Ops.CONST}, sum(k for t, k in quot.items() if t.op is Ops.CONST), x.dtype)
    return q if op is Ops.IDIV else build_sum(rest, const, x.dtype)
  if not quot: return None
  q = build_sum({t: k for t, k in quot.items() if t.op is not Ops.CONST}, sum(k for t, k in quot.items() if t.op is Ops.CONST), x.dtype)
  r = build_sum(rest, const, x.dtype)
  return q + r // d if op is Ops.IDIV else r % d


def nested_div(x: UOp, a: UOp, b: UOp) -> Optional[UOp]:
  """(x // a) // b == x // (a*b) for positive a and b (for truncating and flooring division alike)."""
  if a.arg > 0 and b.arg > 0 and _fits(x.dtype, 0, a.arg * b.arg): return x // (a.arg * b.arg)
  return None


def nested_mod(x: UOp, a: UOp, b: UOp) -> Optional[UOp]:
  """(x % a) % b == x % b when b divides a and x >= 0."""
  if a.arg > 0 and b.arg > 0 and a.arg % b.arg == 0 and x.vmin >= 0: return x % b.arg
  return None


def lt_fold(x: UOp, c: UOp) -> Optional[UOp]:
  """Move constants across `x < c` for integer x."""
  if not dtypes.is_int(x.dtype) or x.dtype.count != 1: return None
  bound = c.arg
  if x.op is Ops.ADD and x.src[1].op is Ops.CONST:
    inner, k = x.src[0], x.src[1].arg
    if _fits(x.dtype, inner.vmin + k, inner.vmax + k) and _fits(x.dtype, bound - k, bound - k): return inner < (bound - k)
  if x.op is Ops.MUL and x.src[1].op is Ops.CONST and x.src[1].arg > 0 and _product_fits(x):
    return x.src[0] < -(-bound // x.src[1].arg)  # y*k < c  <=>  y < ceil(c/k)
  if x.op is Ops.IDIV and x.src[1].op is Ops.CONST and x.src[1].arg > 0 and x.src[0].vmin >= 0:
    if _fits(x.dtype, bound * x.src[1].arg, bound * x.src[1].arg): return x.src[0] < bound * x.src[1].arg  # y//k < c  <=>  y < c*k
  # a sum whose coefficients share a factor with no remainder left over: 4*a + 8*b < 6  <=>  a + 2*b < 2
  if x.op is Ops.ADD:
    terms, const = split_sum(x)
    if terms and const == 0:
      g = math.gcd(*terms.values())
      if g > 1: return build_sum({t: k // g for t, k in terms.items()}, 0, x.dtype) < -(-bound // g)
  return None


def _product_fits(x: UOp) -> bool:
  """Whether y*k (x, with k a constant) never wraps: a product that wraps can land on any value, so reasoning about
  y from y*k's comparisons (int8: y*3 == 1 for y = -85) holds only where it cannot."""
  y, k = x.src[0], x.src[1].arg
  return _fits(x.dtype, min(y.vmin * k, y.vmax * k), max(y.vmin * k, y.vmax * k))


def ne_fold(x: UOp, c: UOp) -> Optional[UOp]:
  """Move constants across `x != c` for integer x."""
  if not dtypes.is_int(x.dtype) or x.dtype.count != 1: return None
  if x.op is Ops.ADD and x.src[1].op is Ops.CONST:
    inner, k = x.src[0], x.src[1].arg
    if _fits(x.dtype, inner.vmin + k, inner.vmax + k) and _fits(x.dtype, c.arg - k, c.arg - k): return inner.ne(c.arg - k)
  if x.op is Ops.MUL and x.src[1].op is Ops.CONST and x.src[1].arg != 0 and _product_fits(x):
    k = x.src[1].arg
    return UOp.const(dtypes.bool, True) if c.arg % k != 0 else x.src[0].ne(c.arg // k)
  return None


def fold_cast(x: UOp, c: UOp) -> Optional[UOp]:
  """A cast of a constant: the value the devices compute (a NaN or an out-of-range float to an int included)."""
  return UOp.const(x.dtype, cast_scalar(x.dtype, c.arg)) if x.dtype.count == 1 else None


def nan_operand(x: UOp, c: UOp) -> Optional[UOp]:
  """x + nan, x * nan, x / nan, nan / x: NaN, whatever x is (IEEE 754; numpy's too)."""
  # (the pattern takes float ops only; a scalar op's constant operand holds a Python float)
  return UOp.const(x.dtype, math.nan) if x.dtype.count == 1 and math.isnan(c.arg) else None


def add_zero(s: UOp, x: UOp) -> Optional[UOp]:
  """x + 0 is x, but for a float x of -0.0 where the zero is +0.0 (-0.0 + 0.0 is 0.0, and 1/x tells them apart)."""
  if not dtypes.is_float(x.dtype) or math.copysign(1.0, s.src[1].arg) < 0 or _never_negative_zero(x): return x
  return None


def _never_negative_zero(x: UOp) -> bool:
  """A float that cannot be -0.0: a converted int or bool, or one whose range leaves out 0."""
  return (x.op is Ops.CAST and not dtypes.is_float(x.src[0].dtype)) or x.vmin > 0 or x.vmax < 0


def max_fold(a: UOp, b: UOp) -> Optional[UOp]:
  if a.vmin >= b.vmax: return a
  if b.vmin >= a.vmax: return b
  return None


def _is_not(x: UOp) -> Optional[UOp]:
  return x.src[0] if x.op is Ops.CMPNE and x.src[1].op is Ops.CONST and x.src[1].arg is True else None


def where_not(c: UOp, a: UOp, b: UOp) -> Optional[UOp]:
  return inner.where(b, a) if (inner := _is_not(c)) is not None else None


def distribute_mul(s: UOp, c: UOp) -> Optional[UOp]:
  """(a + b + ...) * c -> a*c + b*c + ... for ints in one step, so sums stay flat for division folding."""
  if not dtypes.is_int(c.dtype) or c.dtype.count != 1: return None
  terms, const = split_sum(s)
  return build_sum({t: k * c.arg for t, k in terms.items()}, const * c.arg, s.dtype)


var, cvar = UPat.var, UPat.cvar
ints = dtypes.ints
bools = (dtypes.bool,)

symbolic = PatternMatcher([
  # everything known: constant operands, or a range of one value
  (UPat(GroupOp.ALU, name="x"), fold_alu),
  (UPat((Ops.CAST,), src=(UPat(Ops.CONST, name="c"),), name="x"), fold_cast),
  # identities that hold for every dtype
  # (fold_alu has already put a constant operand of a commutative op on the right: ordered patterns suffice)
  (UPat(Ops.ADD, src=(var("x"), UPat.const(None, 0)), name="s"), add_zero),
  (UPat(Ops.MUL, src=(var("x"), UPat.const(None, 1))), lambda x: x),
  # a NaN operand makes a NaN of every float sum, product and quotient: folded here, the constant the device sees
  # is the result (an OpenCL driver computed exp2(log2(x) * NAN) as 1.0, numpy's x ** nan as x or 1)
  # (a constant operand on either side: the pattern's sources in any order, and a node without one is passed over)
  (UPat((Ops.ADD, Ops.MUL, Ops.FDIV), dtype=dtypes.floats, src=[UPat.cvar("c"), UPat.var()], name="x"), nan_operand),
  (UPat(Ops.WHERE, src=(var(), var("x"), var("x"))), lambda x: x),
  (UPat(Ops.WHERE, src=(UPat(Ops.CONST, name="c"), var("a"), var("b"))), lambda c, a, b: a if c.arg else b),
  (UPat(Ops.WHERE, src=(var("c"), var("a"), var("b"))), where_not),
  (UPat(Ops.WHERE, dtype=bools, src=(var("c"), UPat.const(dtypes.bool, True), UPat.const(dtypes.bool, False))), lambda c: c),
  (UPat(Ops.WHERE, dtype=bools, src=(var("c"), UPat.const(dtypes.bool, False), UPat.const(dtypes.bool, True))), lambda c: c.logical_not()),
  (UPat(Ops.MAX, src=(var("x"), var("x"))), lambda x: x),
  (UPat(Ops.MAX, dtype=ints, src=(var("a"), var("b"))), max_fold),
  # integer identities
  (UPat(Ops.MUL, src=(var("x", ints), UPat.const(None, 0))), lambda x: x.const_like(0)),
  (UPat(Ops.SUB, dtype=ints, src=(var("a"), var("b"))), lambda a, b: a + b * -1),
  (UPat(Ops.CMPLT, src=(var("x"), var("x"))), lambda x: UOp.const(dtypes.bool, False)),  # NaN < NaN is False too
  (UPat(Ops.CMPNE, src=(var("x", ints + bools), var("x"))), lambda x: UOp.const(dtypes.bool, False)),
  (UPat(Ops.XOR, src=(var("x", ints), UPat.const(None, 0))), lambda x: x),
  # booleans
  (UPat((Ops.AND, Ops.OR), dtype=bools, src=(var("x"), var("x"))), lambda x: x),
  (UPat(Ops.AND, dtype=bools, src=(var("x"), UPat.const(dtypes.bool, True))), lambda x: x),
  (UPat(Ops.AND, dtype=bools, src=(var("x"), UPat.const(dtypes.bool, False))), lambda x: x.const_like(False)),
  (UPat(Ops.OR, dtype=bools, src=(var("x"), UPat.const(dtypes.bool, False))), lambda x: x),
  (UPat(Ops.OR, dtype=bools, src=(var("x"), UPat.const(dtypes.bool, True))), lambda x: x.const_like(True)),
  (UPat(Ops.CMPNE, src=(UPat(Ops.CMPNE, src=(var("x", bools), UPat.const(dtypes.bool, True))), UPat.const(dtypes.bool, True))), lambda x: x),
  # integer sums: like terms, constants gathered at the end; products: constants gathered at the end
  (UPat(Ops.ADD, dtype=ints, name="x"), canonical_sum),
  (UPat(Ops.MUL, dtype=ints, src=(UPat(Ops.MUL, src=(var("x"), cvar("c1"))), cvar("c2"))), lambda x, c1, c2: x * (c1.arg * c2.arg)),
  (UPat(Ops.MUL, dtype=ints, src=[UPat(Ops.MUL, src=(var("x"), cvar("c"))), var("y")]),
   lambda x, c, y: (x * y) * c if y.op is not Ops.CONST else None),
  (UPat(Ops.MUL, dtype=ints, src=(UPat(Ops.ADD, name="s"), cvar("c"))), distribute_mul),
  # division and modulo by constants
  (UPat(Ops.IDIV, src=(UPat(Ops.IDIV, src=(var("x"), cvar("a"))), cvar("b"))), nested_div),
  (UPat(Ops.MOD, src=(UPat(Ops.MOD, src=(var("x"), cvar("a"))), cvar("b"))), nested_mod),
  (UPat(Ops.IDIV, dtype=ints, src=(var("x"), cvar("c"))), lambda x, c: divmod_fold(x, c, Ops.IDIV)),
  (UPat(Ops.MOD, dtype=ints, src=(var("x"), cvar("c"))), lambda x, c: divmod_fold(x, c, Ops.MOD)),
  (UPat(Ops.IDIV, dtype=ints, src=(var("x"), var("d"))), lambda x, d: divmod_by_variable(x, d, Ops.IDIV)),
  (UPat(Ops.MOD, dtype=ints, src=(var("x"), var("d"))), lambda x, d: divmod_by_variable(x, d, Ops.MOD)),
  # comparisons against constants
  (UPat(Ops.CMPLT, src=(var("x", ints), cvar("c"))), lt_fold),
  (UPat(Ops.CMPNE, src=(var("x", ints), cvar("c"))), ne_fold),
], memoize=True)


def simplify(x: UOp) -> UOp:
  return graph_rewrite(x, symbolic)


# ***** sint helpers used by the shape and kernel layers *****

def ssimplify(x: sint) -> sint:
  """A symbolic int simplified; a constant comes back as a plain int."""
  if not isinstance(x, UOp): return x
  x = x.simplify()
  return x.arg if x.op is Ops.CONST else x


def resolve(x: Union[bool, int, UOp], default: bool = True) -> bool:
  """The truth of a condition that may depend on variables: its value where the ranges decide it, else `default`."""
  if not isinstance(x, UOp): return bool(x)
  if not dtypes.is_bool(x.dtype): x = x.ne(0)
  x = x.simplify()
  return bool(x.vmin) if x.vmin == x.vmax else default


def smax(*xs: sint) -> sint:
  out = xs[0]
  for x in xs[1:]:
    out = max(out, x) if not isinstance(out, UOp) and not isinstance(x, UOp) else ssimplify(_uop(out, x).maximum(x))
  return out


def smin(*xs: sint) -> sint:
  out = xs[0]
  for x in xs[1:]:
    out = min(out, x) if not isinstance(out, UOp) and not isinstance(x, UOp) else ssimplify(_uop(out, x).minimum(x))
  return out


def _uop(a: sint, b: sint) -> UOp:
  return a if isinstance(a, UOp) else UOp.const(b.dtype, a)  # type: ignore[union-attr]


def sym_infer(expr: Union[int, UOp], var_vals: dict) -> Union[int, float, bool]:
  """The value of `expr` with its variables set by `var_vals` (keys are Variables or their names). Bound
  variables not in `var_vals` take their bound value."""
  if not isinstance(expr, UOp): return expr
  if not isinstance(var_vals, Mapping): raise SymbolicError(f"var_vals maps Variables (or their names) to ints, got {type(var_vals).__name__}")
  by_name = {(k.expr if isinstance(k, UOp) else k): v for k, v in var_vals.items()}
  for u in expr.toposort:
    if u.op is Ops.BIND: by_name.setdefault(u.src[0].arg[0], u.src[1].arg)
  vals: dict[UOp, object] = {}
  for u in expr.toposort:
    if u.op is Ops.CONST: vals[u] = u.arg
    elif u.op is Ops.DEFINE_VAR:
      if u.arg[0] not in by_name: raise SymbolicError(f"no value for Variable {u.arg[0]!r}; give it in var_vals")
      v = by_name[u.arg[0]]
      if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise SymbolicError(f"the value of Variable {u.arg[0]!r} is an int, got {v!r:.60}")
      if not u.arg[1] <= v <= u.arg[2]: raise SymbolicError(f"value {v} is outside the range [{u.arg[1]}, {u.arg[2]}] of Variable {u.arg[0]!r}")
      vals[u] = v
    elif u.op is Ops.BIND: vals[u] = vals[u.src[0]]
    elif u.op in GroupOp.ALU:
      vals[u] = exec_alu(u.op, u.dtype, tuple(vals[s] for s in u.src))
    elif u.op is Ops.CAST: vals[u] = cast_scalar(u.dtype, vals[u.src[0]])
    elif u.op is Ops.VIEW: vals[u] = None
    else: raise SymbolicError(f"sym_infer cannot evaluate {u.op}")
  return vals[expr]
