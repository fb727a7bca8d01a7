"""The IR: Ops, GroupOp and the immutable, hash-consed UOp.

A UOp is (op, dtype, src, arg). Construction goes through a cache, so building the same UOp twice
returns the same object: equality is identity, hashing is by id, and a graph shares every common
subexpression by construction. Everything above this module (shapes, kernels, lowering, renderers)
is a function from UOp graphs to UOp graphs."""
from __future__ import annotations
import functools, math, weakref
from enum import IntEnum, auto
from fractions import Fraction
from collections.abc import Mapping
from typing import Any, Callable, Optional, Union
import numpy as np
from kc.ir.dtype import FLOAT_MAX, DType, dtypes, next_float, truncate
from kc.errors import SymbolicError, UOpError
from kc.enums import plain_members
from kc.helpers import c_div, c_mod


class Ops(IntEnum):
  # the order is the tie-break priority the linearizer uses later: definitions first, control flow last
  # graph and kernel structure
  SINK = auto(); NOOP = auto(); VIEW = auto(); KERNEL_INFO = auto()
  # definitions
  DEFINE_GLOBAL = auto(); DEFINE_LOCAL = auto(); DEFINE_VAR = auto(); BIND = auto(); SPECIAL = auto()
  DEFINE_ACC = auto(); CONST = auto(); VALID = auto()
  # vector structure and expansion
  EXPAND = auto(); CONTRACT = auto(); VECTORIZE = auto(); GEP = auto()
  # lanes of one or two vectors of one dtype, taken from their concatenation: arg the lane indices, dtype their vector
  # (at least two lanes; one lane is a GEP). A horizontal combine's levels (kc.codegen.horizontal) are each a pair of
  # them: one UOp per gathered vector where VECTORIZEs of GEPs took one per lane
  SHUFFLE = auto()
  # memory
  INDEX = auto(); LOAD = auto(); STORE = auto(); ASSIGN = auto()
  # reductions and tensor cores
  REDUCE_AXIS = auto(); REDUCE = auto(); WMMA = auto()
  # conversions
  CAST = auto(); BITCAST = auto()
  # unary ALU
  EXP2 = auto(); LOG2 = auto(); SIN = auto(); SQRT = auto(); RECIP = auto(); NEG = auto()
  # binary ALU
  ADD = auto(); SUB = auto(); MUL = auto(); IDIV = auto(); MOD = auto(); MAX = auto(); FDIV = auto(); POW = auto()
  CMPLT = auto(); CMPNE = auto(); AND = auto(); OR = auto(); XOR = auto(); SHL = auto(); SHR = auto()
  # ternary ALU
  WHERE = auto(); MULACC = auto()
  # control flow
  BARRIER = auto(); RANGE = auto(); IF = auto(); ENDRANGE = auto(); ENDIF = auto()
  # programs (kc.schedule): a value materialised in an intermediate buffer, src (value, VIEW of its kernel shape), arg
  # its numpy shape. It lives only in program graphs, above the kernels: the scheduler turns it into a kernel that
  # stores the value and LOADs of a buffer where it is read, so no kernel AST ever holds one
  BUFFER = auto()
  # an AST leaf like VALID, src (VIEW,): the element's offset in its view, which for a 1-D range view is numpy's
  # arange. Lowered to the view's index expression (its dtype: the AST's int type), so an arange is the loop index
  # itself and no memory is read. Last in the enum: the linearizer never sees one
  POSITION = auto()

  def __repr__(self): return f"Ops.{self.name}"
  def __str__(self): return f"Ops.{self.name}"


plain_members(Ops)  # `u.op is Ops.X` at a plain class attribute's speed (kc.enums)


class GroupOp:
  Unary = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP, Ops.NEG})
  Binary = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.FDIV, Ops.POW, Ops.CMPLT, Ops.CMPNE,
                      Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR})
  Ternary = frozenset({Ops.WHERE, Ops.MULACC})
  ALU = Unary | Binary | Ternary
  Comparison = frozenset({Ops.CMPLT, Ops.CMPNE})
  Commutative = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.XOR, Ops.AND, Ops.OR})
  Associative = frozenset({Ops.ADD, Ops.MUL, Ops.AND, Ops.OR, Ops.MAX})
  Idempotent = frozenset({Ops.OR, Ops.AND, Ops.MAX})
  IntOnly = frozenset({Ops.IDIV, Ops.MOD, Ops.SHL, Ops.SHR})
  IntOrBool = frozenset({Ops.AND, Ops.OR, Ops.XOR})
  FloatOnly = frozenset({Ops.FDIV, Ops.RECIP, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.POW})
  # ops whose value at 0 is not 0: padding their input with zeros changes the result (PADTO on a reduce)
  UnsafePad = frozenset({Ops.RECIP, Ops.LOG2, Ops.EXP2, Ops.IDIV, Ops.POW})
  Irreducible = frozenset({Ops.CONST, Ops.DEFINE_VAR, Ops.SPECIAL, Ops.RANGE})
  Buffer = frozenset({Ops.LOAD, Ops.STORE, Ops.VALID, Ops.POSITION})
  FromView = frozenset({Ops.VALID, Ops.POSITION})  # leaves whose value their view alone decides (src: the VIEW)
  Block = frozenset({Ops.RANGE, Ops.IF})
  BlockEnd = frozenset({Ops.ENDRANGE, Ops.ENDIF})
  Meta = frozenset({Ops.SINK, Ops.NOOP, Ops.VIEW, Ops.KERNEL_INFO})


def _arity(op: Ops) -> int: return 1 if op in GroupOp.Unary else 2 if op in GroupOp.Binary else 3


# ***** exact scalar semantics of the ALU ops (C semantics: truncating division, wrap-around ints) *****

def _safe_exp2(x):
  try: return 2.0 ** x
  except OverflowError: return math.inf


def _safe_log2(x):
  if math.isnan(x) or x < 0: return math.nan
  return -math.inf if x == 0 else math.log2(x)


def _fdiv(a, b):
  if b == 0:
    if a == 0 or math.isnan(a): return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)
  return a / b


def _pow(a, b):
  """C's pow, numpy's power: every special case (0 ** -1 is inf, (-8) ** (1/3) NaN, NaN ** 0 and 1 ** NaN are 1)."""
  with np.errstate(all="ignore"):  # on arrays: numpy's scalar power takes x ** 0.5 as sqrt(x), so (-inf) ** 0.5 is NaN
    return float(np.power(np.array([a], dtype=np.float64), np.array([b], dtype=np.float64))[0])


def _max(a, b):
  """numpy's maximum: a NaN in either operand wins, and of two equal ones (-0.0 and 0.0) the second."""
  return a if a > b or a != a else b


PYTHON_ALU: dict[Ops, Callable] = {
  Ops.ADD: lambda a, b: a + b, Ops.SUB: lambda a, b: a - b, Ops.MUL: lambda a, b: a * b,
  Ops.IDIV: lambda a, b: c_div(a, b) if b != 0 else 0, Ops.MOD: lambda a, b: c_mod(a, b) if b != 0 else 0,
  Ops.MAX: _max, Ops.CMPLT: lambda a, b: a < b, Ops.CMPNE: lambda a, b: a != b,
  Ops.AND: lambda a, b: a & b, Ops.OR: lambda a, b: a | b, Ops.XOR: lambda a, b: a ^ b,
  Ops.SHL: lambda a, b: a << b, Ops.SHR: lambda a, b: a >> b, Ops.FDIV: _fdiv, Ops.POW: _pow,
  Ops.WHERE: lambda c, a, b: a if c else b, Ops.MULACC: lambda a, b, c: a * b + c,
  Ops.NEG: lambda a: (not a) if isinstance(a, bool) else -a, Ops.RECIP: lambda a: _fdiv(1.0, a),
  Ops.EXP2: _safe_exp2, Ops.LOG2: _safe_log2, Ops.SQRT: lambda a: math.sqrt(a) if a >= 0 else math.nan,
  Ops.SIN: lambda a: math.sin(a) if math.isfinite(a) else math.nan,
}


def exec_alu(op: Ops, dtype: DType, operands: tuple):
  """The value of `op` on Python scalars, as a backend computing in `dtype` would produce it."""
  if dtype.count > 1:
    return tuple(exec_alu(op, dtype.scalar(), tuple(x[i] if isinstance(x, tuple) else x for x in operands)) for i in range(dtype.count))
  return truncate(dtype, PYTHON_ALU[op](*operands))


# ***** the hash-consed UOp *****

_UCACHE: dict[tuple, weakref.ReferenceType] = {}


# The typing rules of most ops read nothing but a signature: ALU ops and casts their op and dtypes, a CONST its dtype,
# the Python type of its value and what it stands on, the rest their op and dtype. Each signature that passed is
# remembered. Variables (and their bindings) are checked against their values every time.
_DTYPE_TYPED = GroupOp.ALU | {Ops.CAST, Ops.BITCAST}
_VALUE_TYPED = frozenset({Ops.DEFINE_VAR, Ops.BIND})
_TYPED_OK: set[tuple] = set()


def _check(op, dtype, src, arg):
  """The IR's typing rules, checked once per distinct UOp (on a cache miss)."""
  if type(src) is not tuple: raise UOpError(f"{op}: src must be a tuple of UOps, got {src!r}")
  for s in src:
    if type(s) is not UOp: raise UOpError(f"{op}: src must be a tuple of UOps, got {src!r}")
  if op in _VALUE_TYPED: return _check_typing(op, dtype, src, arg)
  if op in _DTYPE_TYPED:
    # most ALU ops take two sources: their signature without a list built per UOp
    signature: tuple = (op, dtype, src[0].dtype, src[1].dtype) if len(src) == 2 else (op, dtype, *[s.dtype for s in src])
  elif op is Ops.CONST: signature = (op, dtype, type(arg), *[s.op for s in src])
  elif op is Ops.SHUFFLE:  # its lanes are part of its typing: remembered only as exact ints (1.0 and True equal 1)
    if type(arg) is not tuple or not all(type(i) is int for i in arg): return _check_typing(op, dtype, src, arg)
    signature = (op, dtype, arg, *[s.dtype for s in src])
  else: signature = (op, dtype)
  if signature not in _TYPED_OK:
    _check_typing(op, dtype, src, arg)
    _TYPED_OK.add(signature)


def _check_typing(op, dtype, src, arg):
  if type(op) is not Ops: raise UOpError(f"op must be an Ops member, got {op!r}")
  if not isinstance(dtype, DType): raise UOpError(f"{op}: dtype must be a DType, got {dtype!r}")
  if op in GroupOp.ALU:
    if len(src) != _arity(op): raise UOpError(f"{op} takes {_arity(op)} sources, got {len(src)}")
    sdt = [s.dtype for s in src]
    if op is Ops.WHERE:
      if sdt[0].scalar() != dtypes.bool: raise UOpError(f"{op}: the condition must be bool, got {sdt[0]}")
      if not (sdt[1] == sdt[2] == dtype):
        raise UOpError(f"{op}: both branches and the result must share one dtype, got {sdt[1]}, {sdt[2]} -> {dtype}")
      return
    if op in GroupOp.Comparison:
      if dtype.scalar() != dtypes.bool or dtype.count != sdt[0].count: raise UOpError(f"{op} yields bool of the operands' width, got {dtype}")
      if sdt[0] != sdt[1]: raise UOpError(f"{op}: operands must share one dtype, got {sdt[0]} and {sdt[1]}")
      return
    if op in (Ops.SHL, Ops.SHR):
      if sdt[0] != dtype or not dtypes.is_int(dtype) or not dtypes.is_int(sdt[1]):
        raise UOpError(f"{op}: shifts take ints and keep the left operand's dtype, got {sdt} -> {dtype}")
      return
    if any(d != dtype for d in sdt): raise UOpError(f"{op}: every operand must have the result dtype {dtype}, got {sdt}")
    if op in GroupOp.IntOnly and not dtypes.is_int(dtype): raise UOpError(f"{op} is defined on ints only, got {dtype}")
    if op in GroupOp.IntOrBool and not (dtypes.is_int(dtype) or dtypes.is_bool(dtype)):
      raise UOpError(f"{op} is defined on ints and bools only, got {dtype}")
    if op in GroupOp.FloatOnly and not dtypes.is_float(dtype): raise UOpError(f"{op} is defined on floats only, got {dtype}")
    if op is Ops.NEG and dtypes.is_bool(dtype): raise UOpError("NEG is not defined on bool: negate a condition with x.logical_not()")
  elif op is Ops.CONST:
    if len(src) > 1 or (src and src[0].op is not Ops.VIEW):
      raise UOpError(f"CONST takes no sources (or one VIEW in an AST), got {[s.op for s in src]}")
    scalar = dtype.scalar()
    want = bool if scalar == dtypes.bool else int if dtypes.is_int(scalar) else float if dtypes.is_float(scalar) else None
    if want is None: raise UOpError(f"CONST cannot have dtype {dtype}")
    if type(arg) is not want: raise UOpError(f"CONST of {dtype} holds a Python {want.__name__}, got {arg!r}; build it with UOp.const")
  elif op is Ops.DEFINE_VAR:
    if not (isinstance(arg, tuple) and len(arg) == 3 and isinstance(arg[0], str)): raise UOpError(f"DEFINE_VAR arg is (name, min, max), got {arg!r}")
    if not dtypes.is_int(dtype): raise UOpError(f"a Variable is an integer, got {dtype}")
    if not (isinstance(arg[1], int) and isinstance(arg[2], int)):
      raise SymbolicError(f"Variable {arg[0]!r} needs int bounds, got {arg[1]!r}..{arg[2]!r}")
    if arg[1] > arg[2]: raise SymbolicError(f"Variable {arg[0]!r} has min {arg[1]} > max {arg[2]}")
  elif op is Ops.CAST or op is Ops.BITCAST:
    if len(src) != 1: raise UOpError(f"{op} takes one source, got {len(src)}")
    if op is Ops.BITCAST and src[0].dtype.itemsize != dtype.itemsize:
      raise UOpError(f"BITCAST needs equal sizes, got {src[0].dtype} ({src[0].dtype.itemsize} B) -> {dtype} ({dtype.itemsize} B)")
  elif op is Ops.SHUFFLE:
    if len(src) not in (1, 2) or (w := src[0].dtype.count) < 2 or any(x.dtype != src[0].dtype for x in src):
      raise UOpError(f"SHUFFLE takes one or two vectors of one dtype, got {[x.dtype for x in src]}")
    if type(arg) is not tuple or len(arg) < 2 or any(type(i) is not int or not 0 <= i < w * len(src) for i in arg):
      raise UOpError(f"SHUFFLE's arg is a tuple of at least two lanes of its sources (0 to {w * len(src) - 1}), got {arg!r}")
    if dtype != (want := src[0].dtype.scalar().vec(len(arg))):
      raise UOpError(f"SHUFFLE of {len(arg)} lanes of {src[0].dtype} is a {want}, got {dtype}")
  elif op is Ops.BIND:
    if len(src) != 2 or src[0].op is not Ops.DEFINE_VAR or src[1].op is not Ops.CONST: raise UOpError("BIND takes (DEFINE_VAR, CONST)")
    v, (name, lo, hi) = src[1].arg, src[0].arg
    if not lo <= v <= hi: raise SymbolicError(f"value {v} is outside the range [{lo}, {hi}] of Variable {name!r}")


def _arg_key(arg: Any) -> Any:
  """An arg as the hash-consing key holds it. 0.0 == -0.0 and they hash alike, but they are different constants; two
  NaN objects are unequal (a second nan constant would be a second UOp, and equal ASTs different objects): every NaN
  is one key. Floats inside a vector constant's tuple alike."""
  if type(arg) is float: return ("nan",) if arg != arg else (arg, math.copysign(1.0, arg))
  if type(arg) is tuple and any(type(a) is float for a in arg): return ("tuple", *map(_arg_key, arg))
  return arg


def _less_equal(x: "UOp", y: "UOp") -> "UOp":
  """x <= y. Ints and bools are totally ordered: not (y < x). Floats are not: a NaN is neither less, equal nor greater,
  so not (y < x) would be True for it; (x < y) or (x == y) is False for a NaN and exact for infs and -0.0 == 0.0."""
  if not dtypes.is_float(x.dtype): return y.lt(x).logical_not()
  return x.lt(y) | x.ne(y).logical_not()


class UOpMetaClass(type):
  def __call__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple = (), arg: Any = None):
    # most args are None, ints or strings, which are their own key: _arg_key only for floats and tuples
    key = (op, dtype, src, _arg_key(arg) if type(arg) is float or type(arg) is tuple else arg)
    try: ref = _UCACHE.get(key)
    except TypeError as e: raise UOpError(f"{op}: arg must be hashable, got {type(arg).__name__} {arg!r}") from e
    if ref is not None and (ret := ref()) is not None: return ret
    _check(op, dtype, src, arg)
    ret = object.__new__(cls)
    _set_op(ret, op); _set_dtype(ret, dtype); _set_src(ret, src); _set_arg(ret, arg); _set_key(ret, key)
    _set_ref(ret, ref := weakref.ref(ret))
    _UCACHE[key] = ref
    return ret


def _visit(u: "UOp", out: dict) -> None:
  """UOp.toposort's walk: `u`'s sources not in `out` yet, in order, then `u`. (A function of its own, not a closure
  over `out`: a closure that calls itself is a reference cycle, which would keep every UOp it walked alive until the
  cyclic collector runs.)"""
  for s in u.src:
    if s not in out: _visit(s, out)
  out[u] = None


def _toposort_iterative(root: "UOp") -> dict["UOp", None]:
  """UOp.toposort for graphs deeper than Python's stack: the same walk, each open node with an iterator over its
  sources."""
  out: dict[UOp, None] = {}
  open_nodes = [(root, iter(root.src))]
  while open_nodes:
    node, sources = open_nodes[-1]
    for s in sources:
      if s not in out:
        open_nodes.append((s, iter(s.src)))
        break
    else:
      open_nodes.pop()
      out[node] = None
  return out


def shuffle_lanes(u: "UOp") -> list[tuple["UOp", int]]:
  """A SHUFFLE's lanes in order, each as (the source vector, its lane in that vector)."""
  w = u.src[0].dtype.count
  return [(u.src[i // w], i % w) for i in u.arg]


def _as_uop(x, like: "UOp") -> "UOp":
  return x if isinstance(x, UOp) else UOp.const(like.dtype, x)


class UOp(metaclass=UOpMetaClass):
  __slots__ = ("op", "dtype", "src", "arg", "_key", "_ref", "__weakref__", "__dict__")

  op: Ops
  dtype: DType
  src: tuple["UOp", ...]
  arg: Any

  def __setattr__(self, name, value):
    if name in UOp.__slots__: raise AttributeError(f"UOp is immutable: cannot set {name}")
    object.__setattr__(self, name, value)

  def __del__(self):
    try:
      if _UCACHE.get(self._key) is self._ref: del _UCACHE[self._key]
    except (AttributeError, TypeError, KeyError): pass  # interpreter shutdown or a half-built UOp

  def __reduce__(self): return UOp, (self.op, self.dtype, self.src, self.arg)
  __hash__ = object.__hash__

  def replace(self, **kwargs) -> "UOp":
    return UOp(kwargs.get("op", self.op), kwargs.get("dtype", self.dtype), kwargs.get("src", self.src), kwargs.get("arg", self.arg))

  # ***** graph structure *****

  @functools.cached_property
  def toposort(self) -> dict["UOp", None]:
    """Every UOp this one depends on, itself last, each after all of its sources (a depth-first walk, sources in
    order). Recursion is the fast path (half the time of a loop over an explicit stack); a graph too deep for
    Python's stack is walked again with one, in the same order."""
    out: dict[UOp, None] = {}
    try: _visit(self, out)
    except RecursionError: return _toposort_iterative(self)
    return out

  @property
  def parents(self) -> dict["UOp", None]:
    """Every UOp this one depends on, not itself."""
    return {u: None for u in self.toposort if u is not self}

  @property
  def sparents(self) -> dict["UOp", None]: return self.toposort

  def variables(self) -> list["UOp"]:
    """The DEFINE_VARs this expression uses (bound ones unbound), ordered by name."""
    vs = {u.src[0] if u.op is Ops.BIND else u: None for u in self.toposort if u.op in (Ops.DEFINE_VAR, Ops.BIND)}
    return sorted(vs, key=lambda v: v.arg)

  def substitute(self, mapping: dict["UOp", "UOp"]) -> "UOp":
    """This graph with each key UOp replaced by its value (keys are matched by identity, outermost wins)."""
    if (type(mapping) is not dict and not isinstance(mapping, Mapping)) or not all(type(k) is UOp and type(v) is UOp for k, v in mapping.items()):
      raise UOpError(f"substitute takes a dict of UOps to UOps, got {mapping!r:.80}")
    memo: dict[UOp, UOp] = dict(mapping)
    for node in self.toposort:
      if node in memo: continue
      new_src = tuple([memo[s] for s in node.src])
      memo[node] = node if new_src == node.src else UOp(node.op, node.dtype, new_src, node.arg)  # == is identity for UOps
    return memo[self]

  # ***** constructors *****

  @staticmethod
  def const(dtype: DType, value) -> "UOp":
    """A constant; `value` is converted to what `dtype` holds (wrapping ints, rounding floats). A vector dtype
    with a scalar value broadcasts; a tuple value gives a VECTORIZE of constants."""
    if type(value) is int and (r := _INT_RANGE.get(dtype)) is not None and r[0] <= value <= r[1]:
      return UOp(Ops.CONST, dtype, (), value)  # the common case of index math, without conversions
    if isinstance(value, UOp): return value
    if isinstance(value, tuple):
      if len(value) != dtype.count: raise UOpError(f"{len(value)} values for the vector dtype {dtype}")
      return UOp(Ops.VECTORIZE, dtype, tuple(UOp.const(dtype.scalar(), v) for v in value))
    if dtype.count > 1: return UOp(Ops.VECTORIZE, dtype, (UOp.const(dtype.scalar(), value),) * dtype.count)
    return UOp(Ops.CONST, dtype, (), truncate(dtype, dtypes.as_const(value, dtype)))

  def const_like(self, value) -> "UOp": return UOp.const(self.dtype, value)

  @staticmethod
  def variable(name: str, min_val: int, max_val: int, dtype: DType = dtypes.int32) -> "UOp":
    return UOp(Ops.DEFINE_VAR, dtype, (), (name, min_val, max_val))

  @staticmethod
  def range(dtype: DType, start, end, idx: int) -> "UOp":
    return UOp(Ops.RANGE, dtype, (_as_uop(start, UOp.const(dtype, 0)), _as_uop(end, UOp.const(dtype, 0))), idx)

  def cast(self, dtype: DType) -> "UOp": return self if self.dtype == dtype else UOp(Ops.CAST, dtype, (self,))
  def bitcast(self, dtype: DType) -> "UOp": return self if self.dtype == dtype else UOp(Ops.BITCAST, dtype, (self,))

  def alu(self, op: Ops, *src) -> "UOp":
    operands = (self,) + tuple(_as_uop(s, self) for s in src)
    if op in GroupOp.Comparison: out = dtypes.bool.vec(self.dtype.count)
    elif op is Ops.WHERE: out = operands[1].dtype
    else: out = self.dtype
    return UOp(op, out, operands)

  # ***** Python operators: integers use C semantics (// truncates toward zero, % keeps the dividend's sign) *****

  def _lift(self, x) -> "UOp":
    if isinstance(x, UOp): return x
    if not isinstance(x, (bool, int, float)): raise UOpError(f"cannot combine a UOp with {type(x).__name__} {x!r}")
    return UOp.const(self.dtype, x)

  def __add__(self, x): return self.alu(Ops.ADD, self._lift(x))
  def __radd__(self, x): return self._lift(x).alu(Ops.ADD, self)
  def __sub__(self, x): return self + (-self._lift(x))
  def __rsub__(self, x): return self._lift(x) + (-self)
  def __mul__(self, x): return self.alu(Ops.MUL, self._lift(x))
  def __rmul__(self, x): return self._lift(x).alu(Ops.MUL, self)
  def __floordiv__(self, x): return self.alu(Ops.IDIV, self._lift(x))
  def __rfloordiv__(self, x): return self._lift(x).alu(Ops.IDIV, self)
  def __mod__(self, x): return self.alu(Ops.MOD, self._lift(x))
  def __rmod__(self, x): return self._lift(x).alu(Ops.MOD, self)
  def __truediv__(self, x): return self.alu(Ops.FDIV, self._lift(x))
  def __rtruediv__(self, x): return self._lift(x).alu(Ops.FDIV, self)
  def __neg__(self):
    if dtypes.is_bool(self.dtype): return self.alu(Ops.CMPNE, self.const_like(True))
    return self * -1 if dtypes.is_int(self.dtype) else self.alu(Ops.NEG)
  def __lt__(self, x): return self.alu(Ops.CMPLT, self._lift(x))
  def __gt__(self, x): return self._lift(x).alu(Ops.CMPLT, self)
  def __le__(self, x): return _less_equal(self, self._lift(x))
  def __ge__(self, x): return _less_equal(self._lift(x), self)
  def __and__(self, x): return self.alu(Ops.AND, self._lift(x))
  def __rand__(self, x): return self._lift(x).alu(Ops.AND, self)
  def __or__(self, x): return self.alu(Ops.OR, self._lift(x))
  def __ror__(self, x): return self._lift(x).alu(Ops.OR, self)
  def __xor__(self, x): return self.alu(Ops.XOR, self._lift(x))
  def __lshift__(self, x): return self.alu(Ops.SHL, self._lift(x))
  def __rshift__(self, x): return self.alu(Ops.SHR, self._lift(x))

  def lt(self, x) -> "UOp": return self.__lt__(x)
  def ne(self, x) -> "UOp": return self.alu(Ops.CMPNE, self._lift(x))
  def eq(self, x) -> "UOp": return self.ne(x).logical_not()
  def logical_not(self) -> "UOp": return self.ne(True) if dtypes.is_bool(self.dtype) else self.eq(0)
  def maximum(self, x) -> "UOp": return self.alu(Ops.MAX, self._lift(x))
  def minimum(self, x) -> "UOp": return self.lt(x).where(self, self._lift(x))
  def where(self, a, b) -> "UOp":
    a = a if isinstance(a, UOp) else (b.const_like(a) if isinstance(b, UOp) else UOp.const(dtypes.from_py(a), a))
    return self.alu(Ops.WHERE, a, a._lift(b))
  def recip(self) -> "UOp": return self.alu(Ops.RECIP)
  def sqrt(self) -> "UOp": return self.alu(Ops.SQRT)
  def exp2(self) -> "UOp": return self.alu(Ops.EXP2)
  def log2(self) -> "UOp": return self.alu(Ops.LOG2)
  def sin(self) -> "UOp": return self.alu(Ops.SIN)

  # ***** Variables *****

  def bind(self, value: int) -> "UOp":
    if self.op is not Ops.DEFINE_VAR: raise SymbolicError(f"only a Variable can be bound, not {self.op}")
    if not isinstance(value, int) or isinstance(value, bool): raise SymbolicError(f"Variable {self.arg[0]!r} binds an int, got {value!r}")
    return UOp(Ops.BIND, self.dtype, (self, UOp.const(self.dtype, value)))

  def unbind(self) -> tuple["UOp", int]:
    if self.op is not Ops.BIND: raise SymbolicError(f"only a bound Variable can be unbound, not {self.op}")
    return self.src[0], self.src[1].arg

  @property
  def expr(self) -> str:
    if self.op is Ops.DEFINE_VAR: return self.arg[0]
    if self.op is Ops.BIND: return self.src[0].arg[0]
    raise SymbolicError(f"{self.op} has no variable name")

  # ***** range analysis *****

  @property
  def vmin(self): return _mm(self)[0]
  @property
  def vmax(self): return _mm(self)[1]
  @property
  def bounds(self) -> tuple:
    """(vmin, vmax) in one lookup."""
    return _mm(self)

  def simplify(self) -> "UOp":
    """This expression with kc's symbolic rules applied until nothing changes (the rules memoize on each UOp)."""
    # the one import back within the ir layer: symbolic builds its rules out of UOps, so it imports this module;
    # importing it here, when the rules are first needed, keeps both modules free of a setter and of global state
    from kc.ir.symbolic import simplify
    return simplify(self)

  # ***** Python protocol *****

  def __bool__(self):
    if self.vmin == self.vmax: return bool(self.vmin)
    raise SymbolicError(f"the truth of {self.render()} depends on its variables; use kc.resolve(expr, default) to decide it")

  def __int__(self):
    if self.vmin == self.vmax and (dtypes.is_int(self.dtype) or dtypes.is_bool(self.dtype)): return int(self.vmin)
    raise SymbolicError(f"{self.render()} is not a constant integer")

  def __repr__(self) -> str: return pretty_print(self)

  def render(self, simplify: bool = True) -> str:
    """A Python-like string of the expression (variables by name)."""
    return render_expr(self.simplify() if simplify else self)


# construction writes the slots through their descriptors: UOp.__setattr__ refuses them, so UOps stay immutable
_set_op, _set_dtype, _set_src, _set_arg, _set_key, _set_ref = (UOp.__dict__[n].__set__ for n in ("op", "dtype", "src", "arg", "_key", "_ref"))

# ***** range analysis *****

def _corners(fxn, a: UOp, b: UOp) -> tuple:
  vals = [fxn(x, y) for x in (a.vmin, a.vmax) for y in (b.vmin, b.vmax)]
  return min(vals), max(vals)


def _div_bounds(a: UOp, b: UOp) -> Optional[tuple]:
  if b.vmin > 0 or b.vmax < 0: return _corners(c_div, a, b)  # truncating division is monotone in each argument away from 0
  return None


def _mod_bounds(a: UOp, b: UOp) -> Optional[tuple]:
  if b.vmin == b.vmax and b.vmin != 0:
    c = abs(b.vmin)
    if a.vmin >= 0 and c_div(a.vmin, c) == c_div(a.vmax, c): return c_mod(a.vmin, c), c_mod(a.vmax, c)
    if a.vmax <= 0 and c_div(a.vmin, c) == c_div(a.vmax, c): return c_mod(a.vmin, c), c_mod(a.vmax, c)
  if b.vmin > 0 or b.vmax < 0:
    c = max(abs(b.vmin), abs(b.vmax)) - 1  # |a % b| < |b| and the remainder has the dividend's sign
    return (0 if a.vmin >= 0 else max(a.vmin, -c)), (0 if a.vmax <= 0 else min(a.vmax, c))
  return None


def _min_max(root: UOp) -> tuple:
  """Bounds that hold for every value `root` can take (exact for constants, conservative elsewhere), cached on
  each UOp. Sources are done first, without recursion, so deep graphs need no deep Python stack."""
  for s in root.src:
    if "_mm" not in s.__dict__: break
  else:  # the usual case: the sources' bounds are known
    ret = root.__dict__["_mm"] = _bounds(root)
    return ret
  stack = [root]
  while stack:
    u = stack[-1]
    if "_mm" in u.__dict__:
      stack.pop()
      continue
    missing = [s for s in u.src if "_mm" not in s.__dict__]
    if missing: stack.extend(missing)
    else: u.__dict__["_mm"] = _bounds(stack.pop())
  return root.__dict__["_mm"]


_DTYPE_RANGE = {dt: (dtypes.min(dt), dtypes.max(dt)) for dt in dtypes.all}
_INT_RANGE = {dt: r for dt, r in _DTYPE_RANGE.items() if dtypes.is_int(dt)}
_BOOL = dtypes.bool
_INTS, _FLOATS = frozenset(dt for dt in dtypes.all if dtypes.is_int(dt)), frozenset(dt for dt in dtypes.all if dtypes.is_float(dt))


def _mm(u: UOp) -> tuple:
  """(vmin, vmax) of u: cached on it, computed on first use."""
  return u.__dict__.get("_mm") or _min_max(u)


def _cmplt_bounds(u, s):
  (a0, a1), (b0, b1) = _mm(s[0]), _mm(s[1])
  return (True, True) if a1 < b0 else (False, False) if a0 >= b1 else None


def _cmpne_bounds(u, s):
  (a0, a1), (b0, b1) = _mm(s[0]), _mm(s[1])
  return (True, True) if a1 < b0 or a0 > b1 else (False, False) if a0 == a1 == b0 == b1 else None


def _where_bounds(u, s):
  c0, c1 = _mm(s[0])
  if c0 == c1: return _mm(s[1]) if c0 else _mm(s[2])
  (a0, a1), (b0, b1) = _mm(s[1]), _mm(s[2])
  return min(a0, b0), max(a1, b1)


def _and_bounds(u, s):
  (a0, a1), (b0, b1) = _mm(s[0]), _mm(s[1])
  if u.dtype is _BOOL: return bool(a0 and b0), bool(a1 and b1)
  return (0, min(a1, b1)) if u.dtype in _INTS and a0 >= 0 and b0 >= 0 else None


def _or_bounds(u, s):
  (a0, a1), (b0, b1) = _mm(s[0]), _mm(s[1])
  return (bool(a0 or b0), bool(a1 or b1)) if u.dtype is _BOOL else None


def _shl_bounds(u, s):
  (a0, a1), (b0, b1) = _mm(s[0]), _mm(s[1])
  return (a0 << b0, a1 << b0) if b0 == b1 and a0 >= 0 and 0 <= b0 < 8 * u.dtype.itemsize else None


def _shr_bounds(u, s):
  (a0, a1), (b0, b1) = _mm(s[0]), _mm(s[1])
  return (a0 >> b1, a1 >> b0) if a0 >= 0 and b0 >= 0 else None


def _cast_bounds(u, s):
  dt, src_dt = u.dtype, s[0].dtype
  if dt in _INTS and src_dt.scalar() in _INTS: return _mm(s[0])
  if dt is _BOOL:
    a0, a1 = _mm(s[0])
    return (bool(a0) if a0 == a1 else False, bool(a0 or a1))
  return None


# op -> the bounds of a UOp from its sources' (None: unknown); each reads only what it needs
_BOUNDS = {
  Ops.RANGE: lambda u, s: (_mm(s[0])[0], _mm(s[1])[1] - 1),
  Ops.SPECIAL: lambda u, s: (0, u.arg[1] - 1) if isinstance(u.arg[1], int) else (0, u.arg[1].vmax - 1),
  Ops.ADD: lambda u, s: ((a := _mm(s[0]))[0] + (b := _mm(s[1]))[0], a[1] + b[1]),
  Ops.SUB: lambda u, s: ((a := _mm(s[0]))[0] - (b := _mm(s[1]))[1], a[1] - b[0]),
  Ops.MUL: lambda u, s: _corners(lambda x, y: x * y if x != 0 and y != 0 else 0, s[0], s[1]),
  Ops.NEG: lambda u, s: None if u.dtype is _BOOL else (-(a := _mm(s[0]))[1], -a[0]),
  Ops.MAX: lambda u, s: (max((a := _mm(s[0]))[0], (b := _mm(s[1]))[0]), max(a[1], b[1])),
  Ops.IDIV: lambda u, s: _div_bounds(s[0], s[1]) if u.dtype in _INTS else None,
  Ops.MOD: lambda u, s: _mod_bounds(s[0], s[1]) if u.dtype in _INTS else None,
  Ops.WHERE: _where_bounds, Ops.CMPLT: _cmplt_bounds, Ops.CMPNE: _cmpne_bounds, Ops.AND: _and_bounds, Ops.OR: _or_bounds,
  Ops.SHL: _shl_bounds, Ops.SHR: _shr_bounds, Ops.CAST: _cast_bounds,
}


def _bounds(u: UOp) -> tuple:
  dt = u.dtype
  if dt in _FLOATS: return _float_bounds(u)
  if (dt_range := _DTYPE_RANGE.get(dt)) is None: return _ANY_FLOAT  # vectors, pointers, void
  op = u.op
  if op is Ops.CONST: return u.arg, u.arg
  if op is Ops.DEFINE_VAR: return u.arg[1], u.arg[2]
  if op is Ops.BIND: return _mm(u.src[0])
  lo, hi = dt_range
  r = fxn(u, u.src) if (fxn := _BOUNDS.get(op)) is not None else None
  if r is None or r[0] < lo or r[1] > hi: return lo, hi  # unknown, or it may wrap around: only the dtype's own range is certain
  if dt is _BOOL: return bool(r[0]), bool(r[1])
  if dt in _INTS: return int(r[0]), int(r[1])
  return r


# ***** float ranges *****
# A float's (vmin, vmax) holds every value it takes that is not NaN, and an expression that may be NaN has the whole
# range (-inf, inf): so the whole range is read as "may be NaN" (e4m3 too, whose finite values end at +-448). A
# comparison folded from such bounds is then sound: x < c can only be folded to True where x's range lies below c's,
# which a NaN never does, and NaN < c is False like everything the range puts at or above c. Exact ops (NEG, MAX, WHERE)
# keep their bounds; rounding ops compute the exact result's bounds (Fractions) and round them outward to the dtype,
# which bounds every round-to-nearest result, through float32 or not.

_ANY_FLOAT = (-math.inf, math.inf)


def _may_be_nan(b: tuple) -> bool: return b[0] == -math.inf and b[1] == math.inf


def _exact(x) -> Union[Fraction, float]:
  return Fraction(x) if math.isfinite(x) else float(x)


def _round_out(dt: DType, lo, hi) -> tuple:
  """Float bounds of dt that hold every round-to-nearest result of an exact value in [lo, hi] (Fractions or +-inf)."""
  down, up = _round_toward(dt, lo, False), _round_toward(dt, hi, True)
  return _ANY_FLOAT if down is None or up is None else (down, up)


def _round_toward(dt: DType, x, up: bool) -> Optional[float]:
  """The value of dt nearest to x on the side of `up` (never past x's side); None where rounding x can give NaN (past
  e4m3's largest value)."""
  top = FLOAT_MAX[dt]
  if math.isinf(x) or abs(x) > top:
    if dt == dtypes.fp8e4m3: return None
    if (x > 0) != up: return math.copysign(top, x)  # on the near side of an overflow: the largest finite value
    return math.copysign(math.inf, x)
  v = truncate(dt, float(x))  # within one step of x
  wrong_side = Fraction(v) < x if up else Fraction(v) > x
  return next_float(dt, v, up) if wrong_side else v


def _float_add(u, s):
  (a0, a1), (b0, b1) = _mm(s[0]), _mm(s[1])
  if (a1 == math.inf and b0 == -math.inf) or (a0 == -math.inf and b1 == math.inf): return None  # inf + -inf is NaN
  return _round_out(u.dtype, _exact(a0) + _exact(b0), _exact(a1) + _exact(b1))


def _float_sub(u, s):
  (a0, a1), (b0, b1) = _mm(s[0]), _mm(s[1])
  if (a1 == math.inf and b1 == math.inf) or (a0 == -math.inf and b0 == -math.inf): return None  # inf - inf is NaN
  return _round_out(u.dtype, _exact(a0) - _exact(b1), _exact(a1) - _exact(b0))


def _float_mul(u, s):
  (a0, a1), (b0, b1) = _mm(s[0]), _mm(s[1])
  if (a0 <= 0 <= a1 and math.inf in (-b0, b1)) or (b0 <= 0 <= b1 and math.inf in (-a0, a1)): return None  # 0*inf: NaN
  prods = [_exact(x) * _exact(y) for x in (a0, a1) for y in (b0, b1)]
  return _round_out(u.dtype, min(prods), max(prods))


def _float_cast(u, s):
  lo, hi = _mm(s[0])
  return _round_out(u.dtype, _exact(lo), _exact(hi))


# op -> the bounds of a float UOp from its sources' (None: it may be NaN); the others (FDIV, transcendentals, MULACC,
# loads) are unknown
_FLOAT_BOUNDS = {
  Ops.ADD: _float_add, Ops.SUB: _float_sub, Ops.MUL: _float_mul, Ops.CAST: _float_cast,
  Ops.NEG: lambda u, s: (-(a := _mm(s[0]))[1], -a[0]),
  Ops.MAX: lambda u, s: (max((a := _mm(s[0]))[0], (b := _mm(s[1]))[0]), max(a[1], b[1])),
  Ops.WHERE: _where_bounds,
}


def _float_bounds(u: UOp) -> tuple:
  op = u.op
  if op is Ops.CONST: return _ANY_FLOAT if math.isnan(u.arg) else (u.arg, u.arg)
  if (fxn := _FLOAT_BOUNDS.get(op)) is None: return _ANY_FLOAT
  # a NaN operand makes every one of these NaN but WHERE, whose other branch may be taken (its bounds join both)
  if op is not Ops.WHERE and any(_may_be_nan(_mm(x)) for x in u.src): return _ANY_FLOAT
  r = fxn(u, u.src)
  return _ANY_FLOAT if r is None else r


# ***** printing *****

_INFIX = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.FDIV: "/", Ops.CMPLT: "<",
          Ops.CMPNE: "!=", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.SHL: "<<", Ops.SHR: ">>", Ops.POW: "**"}
_CALL = {Ops.MAX: "max", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt", Ops.RECIP: "recip"}


def render_expr(root: UOp) -> str:
  """Render an expression graph as Python-like text; each shared node is rendered once and reused."""
  out: dict[UOp, str] = {}
  for u in root.toposort:
    s = [out[x] for x in u.src]
    if u.op is Ops.CONST: r = repr(u.arg)
    elif u.op is Ops.DEFINE_VAR: r = u.arg[0]
    elif u.op is Ops.BIND: r = f"{s[0]}={u.src[1].arg}"
    elif u.op is Ops.SPECIAL: r = str(u.arg[0])
    elif u.op is Ops.RANGE: r = f"ridx{u.arg}"
    elif u.op is Ops.ADD and u.src[1].op is Ops.MUL and u.src[1].src[1].op is Ops.CONST and u.src[1].src[1].arg == -1:
      r = f"({s[0]}-{out[u.src[1].src[0]]})"
    elif u.op is Ops.MUL and u.src[1].op is Ops.CONST and u.src[1].arg == -1 and dtypes.is_int(u.dtype): r = f"(-{s[0]})"
    elif u.op is Ops.CMPNE and u.src[1].op is Ops.CONST and u.src[1].arg is True: r = f"(not {s[0]})"
    elif u.op in _INFIX: r = f"({s[0]}{_INFIX[u.op]}{s[1]})"
    elif u.op in _CALL: r = f"{_CALL[u.op]}({', '.join(s)})"
    elif u.op is Ops.NEG: r = f"(-{s[0]})"
    elif u.op is Ops.WHERE: r = f"({s[1]} if {s[0]} else {s[2]})"
    elif u.op is Ops.MULACC: r = f"(({s[0]}*{s[1]})+{s[2]})"
    elif u.op is Ops.CAST: r = f"{u.dtype.name}({s[0]})"
    else: r = f"{u.op.name}({', '.join(s + ([repr(u.arg)] if u.arg is not None else []))})"
    out[u] = r
  return out[root]


def pretty_print(root: UOp, indent: str = "  ") -> str:
  """The graph as nested UOp(...) constructors; a node used more than once is named x<n> where it first
  appears and referred to by that name afterwards."""
  uses: dict[UOp, int] = {}
  for u in root.toposort:
    for s in u.src: uses[s] = uses.get(s, 0) + 1
  names: dict[UOp, str] = {}

  def fmt(u: UOp, depth: int) -> str:
    if u in names: return names[u]
    tag = ""
    if uses.get(u, 0) > 1:
      names[u] = f"x{len(names)}"
      tag = f"{names[u]}:="
    pad = indent * (depth + 1)
    srcs = "" if not u.src else ", src=(\n" + "".join(pad + fmt(s, depth + 1) + ",\n" for s in u.src) + indent * depth + ")"
    return f"{tag}UOp({u.op}, {u.dtype!r}, arg={u.arg!r}{srcs})"
  return fmt(root, 0)


def Variable(name: str, min_val: int, max_val: int, dtype: DType = dtypes.int32) -> UOp:
  """A symbolic integer in [min_val, max_val], given its value at run time."""
  return UOp.variable(name, min_val, max_val, dtype)


sint = Union[int, UOp]
