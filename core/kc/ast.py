"""kc.ast: a thin builder of kernel ASTs for embedding kc in frameworks and for tests.

One builder expression is one kernel. Movement ops become ShapeTracker views at the leaves (the loads and
the shaped constants); a reduce keeps its reduced axes as 1; a reduce result may be expanded back along its
reduced axes and used again (a fused reduce chain). Illegal combinations raise InvalidASTError here, at build
time, not later in code generation.

    a = A.arg(1, dtypes.float32, (M, K)); b = A.arg(2, dtypes.float32, (K, N))
    c = (a.reshape(M, K, 1) * b.reshape(1, K, N)).sum(axis=1)
    sink = A.sink(A.store(0, c))
"""
from __future__ import annotations
from typing import Callable, Union
from kc.dtype import DType, PtrDType, dtypes, least_upper_dtype, least_upper_float
from kc.errors import InvalidASTError, KcError
from kc.shape import ShapeTracker
from kc.shape.view import fmt_shape
from kc.uop import GroupOp, Ops, UOp, sint

Scalar = Union[bool, int, float]


def _shape(shape) -> tuple[sint, ...]:
  if isinstance(shape, (int, UOp)): shape = (shape,)
  try: shape = tuple(shape)
  except TypeError: raise InvalidASTError(f"a shape is a tuple of ints or Variables, got {shape!r}") from None
  for s in shape:
    if isinstance(s, bool) or not isinstance(s, (int, UOp)) or (isinstance(s, int) and s < 0):
      raise InvalidASTError(f"a shape is a tuple of non-negative ints or Variables, got {shape!r}")
  return shape


def _dtype(dtype) -> DType:
  if isinstance(dtype, DType) and not isinstance(dtype, PtrDType) and dtype.count == 1 and dtype != dtypes.void: return dtype
  raise InvalidASTError(f"unknown dtype {dtype!r}: use one of kc.dtypes ({', '.join(dtypes.fields())})")


class Expr:
  """A value of the kernel: a UOp with a shape (its ShapeTracker views live at its leaves)."""
  __slots__ = ("uop", "shape")

  def __init__(self, uop: UOp, shape: tuple[sint, ...]):
    self.uop, self.shape = uop, shape

  @property
  def dtype(self) -> DType: return self.uop.dtype
  @property
  def ndim(self) -> int: return len(self.shape)
  def __repr__(self): return f"<kc.ast.Expr {self.dtype.name}{fmt_shape(self.shape)}>"

  # ***** movement: pushed to the leaves *****

  def _move(self, name: str, fxn: Callable[[ShapeTracker], ShapeTracker]) -> "Expr":
    try:
      new_shape = fxn(ShapeTracker.from_shape(self.shape)).shape
      return Expr(_push_view(self.uop, name, fxn, self.shape, new_shape), new_shape)
    except InvalidASTError: raise
    except KcError as e: raise InvalidASTError(str(e)) from e

  def reshape(self, *shape) -> "Expr":
    shape = _shape(shape[0] if len(shape) == 1 and not isinstance(shape[0], (int, UOp)) else shape)
    return self._move("reshape", lambda st: st.reshape(shape))

  def permute(self, *order) -> "Expr":
    order = tuple(order[0]) if len(order) == 1 and not isinstance(order[0], int) else order
    return self._move("permute", lambda st: st.permute(order))

  def expand(self, *shape) -> "Expr":
    shape = _shape(shape[0] if len(shape) == 1 and not isinstance(shape[0], (int, UOp)) else shape)
    return self._move("expand", lambda st: st.expand(shape))

  def pad(self, arg) -> "Expr": return self._move("pad", lambda st: st.pad(tuple(arg)))
  def shrink(self, arg) -> "Expr": return self._move("shrink", lambda st: st.shrink(tuple(arg)))
  def flip(self, axes) -> "Expr": return self._move("flip", lambda st: st.flip(tuple(axes) if not isinstance(axes, int) else (axes,)))

  def windows(self, axis: int, size: int) -> "Expr":
    """`axis` (length n) replaced by (size, n - size + 1) sliding windows: out[..., i, j, ...] = self[..., i + j, ...]."""
    return self._move("windows", lambda st: st.windows(axis, size))

  # ***** elementwise *****

  def _lift(self, x) -> "Expr":
    if isinstance(x, Expr): return x
    if isinstance(x, (bool, int, float)): return Expr(UOp.const(self.dtype, x), self.shape)
    raise InvalidASTError(f"cannot combine {self!r} with {type(x).__name__} {x!r}")

  def _binary(self, op: Ops, other, reverse: bool = False) -> "Expr":
    a, b = _broadcast_together(op.name, *((self._lift(other), self) if reverse else (self, self._lift(other))))
    dt = least_upper_dtype(a.dtype, b.dtype)
    if op in GroupOp.FloatOnly: dt = least_upper_float(dt)
    return Expr(_alu(op, a.uop.cast(dt), b.uop.cast(dt)), a.shape)

  def __add__(self, x): return self._binary(Ops.ADD, x)
  def __radd__(self, x): return self._binary(Ops.ADD, x, True)
  def __sub__(self, x): return self + (-self._lift(x))
  def __rsub__(self, x): return self._lift(x) + (-self)
  def __mul__(self, x): return self._binary(Ops.MUL, x)
  def __rmul__(self, x): return self._binary(Ops.MUL, x, True)
  def __truediv__(self, x): return self._binary(Ops.FDIV, x)
  def __rtruediv__(self, x): return self._binary(Ops.FDIV, x, True)
  def __floordiv__(self, x): return self._int_binary(Ops.IDIV, x)
  def __mod__(self, x): return self._int_binary(Ops.MOD, x)
  def __and__(self, x): return self._int_binary(Ops.AND, x)
  def __or__(self, x): return self._int_binary(Ops.OR, x)
  def __xor__(self, x): return self._int_binary(Ops.XOR, x)
  def __lt__(self, x): return self._binary(Ops.CMPLT, x)
  def __gt__(self, x): return self._binary(Ops.CMPLT, x, True)
  def __le__(self, x): return (self > x).logical_not()
  def __ge__(self, x): return (self < x).logical_not()
  def ne(self, x) -> "Expr": return self._binary(Ops.CMPNE, x)
  def eq(self, x) -> "Expr": return self.ne(x).logical_not()
  def maximum(self, x) -> "Expr": return self._binary(Ops.MAX, x)
  def minimum(self, x) -> "Expr": return -((-self).maximum(-self._lift(x))) if not dtypes.is_unsigned(self.dtype) else (self < x).where(self, x)

  def _int_binary(self, op: Ops, x) -> "Expr":
    other = self._lift(x)
    ok = dtypes.is_int if op in (Ops.IDIV, Ops.MOD) else (lambda d: dtypes.is_int(d) or dtypes.is_bool(d))
    if not (ok(self.dtype) and ok(other.dtype)): raise InvalidASTError(f"{op.name} needs integer operands, got {self.dtype.name} and {other.dtype.name}")
    return self._binary(op, other)

  def __neg__(self) -> "Expr":
    if dtypes.is_bool(self.dtype): return self.logical_not()
    return Expr(self.uop * -1 if dtypes.is_int(self.dtype) else _alu(Ops.NEG, self.uop), self.shape)

  def logical_not(self) -> "Expr":
    if not dtypes.is_bool(self.dtype): raise InvalidASTError(f"logical_not needs bool, got {self.dtype.name}")
    return self.ne(True)

  def where(self, a, b) -> "Expr":
    if not dtypes.is_bool(self.dtype): raise InvalidASTError(f"where needs a bool condition, got {self.dtype.name}")
    a = a if isinstance(a, Expr) else (b._lift(a) if isinstance(b, Expr) else const(a, dtypes.from_py(a), self.shape))
    c, a, b = _broadcast_together("where", self, a, a._lift(b))
    dt = least_upper_dtype(a.dtype, b.dtype)
    return Expr(_alu(Ops.WHERE, c.uop, a.uop.cast(dt), b.uop.cast(dt)), c.shape)

  def _unary(self, op: Ops) -> "Expr":
    dt = least_upper_float(self.dtype) if op in GroupOp.FloatOnly else self.dtype
    return Expr(_alu(op, self.uop.cast(dt)), self.shape)

  def exp2(self) -> "Expr": return self._unary(Ops.EXP2)
  def log2(self) -> "Expr": return self._unary(Ops.LOG2)
  def sin(self) -> "Expr": return self._unary(Ops.SIN)
  def sqrt(self) -> "Expr": return self._unary(Ops.SQRT)
  def recip(self) -> "Expr": return self._unary(Ops.RECIP)

  def cast(self, dtype: DType) -> "Expr": return Expr(self.uop.cast(_dtype(dtype)), self.shape)

  def bitcast(self, dtype: DType) -> "Expr":
    dtype = _dtype(dtype)
    if dtype.itemsize != self.dtype.itemsize: raise InvalidASTError(f"bitcast needs equal sizes: {self.dtype.name} -> {dtype.name}")
    return Expr(self.uop.bitcast(dtype), self.shape)

  # ***** reduces *****

  def _reduce(self, op: Ops, axis) -> "Expr":
    axes = tuple(range(self.ndim)) if axis is None else (axis,) if isinstance(axis, int) else tuple(axis)
    norm = []
    for a in axes:
      if not isinstance(a, int) or not -self.ndim <= a < self.ndim: raise InvalidASTError(f"reduce axis {a!r} out of range for shape {fmt_shape(self.shape)}")
      norm.append(a % self.ndim)
    if len(set(norm)) != len(norm): raise InvalidASTError(f"repeated reduce axis in {axes}")
    if dtypes.is_bool(self.dtype) and op is Ops.ADD: return self.cast(dtypes.int32)._reduce(op, tuple(norm))
    new_shape = tuple(1 if i in norm else s for i, s in enumerate(self.shape))
    return Expr(UOp(Ops.REDUCE_AXIS, self.dtype, (self.uop,), (op, tuple(sorted(norm)))), new_shape)

  def sum(self, axis=None) -> "Expr": return self._reduce(Ops.ADD, axis)
  def max(self, axis=None) -> "Expr": return self._reduce(Ops.MAX, axis)
  def prod(self, axis=None) -> "Expr": return self._reduce(Ops.MUL, axis)


def _broadcast_together(name: str, *xs: Expr) -> tuple[Expr, ...]:
  """numpy broadcasting: shapes are aligned on the right and size-1 dims are expanded to the common size."""
  ndim = max(x.ndim for x in xs)
  out = []
  for i in range(ndim):
    dims = {x.shape[i - ndim + x.ndim] for x in xs if i - ndim + x.ndim >= 0} - {1}
    if len(dims) > 1: raise InvalidASTError(f"{name}: shapes {', '.join(fmt_shape(x.shape) for x in xs)} do not broadcast (dim {i})")
    out.append(dims.pop() if dims else 1)
  shape = tuple(out)
  return tuple(x if x.shape == shape else x.reshape((1,) * (ndim - x.ndim) + x.shape).expand(shape) if x.ndim < ndim else x.expand(shape) for x in xs)


def _alu(op: Ops, *src: UOp) -> UOp:
  return src[0].alu(op, *src[1:])


def _push_view(u: UOp, name: str, fxn: Callable[[ShapeTracker], ShapeTracker], old_shape, new_shape) -> UOp:
  """Apply a movement op to every leaf view under u (elementwise ops commute with movement)."""
  memo: dict[UOp, UOp] = {}

  def walk(x: UOp) -> UOp:
    if x in memo: return memo[x]
    if x.op is Ops.LOAD: ret = x.replace(src=(x.src[0], fxn(x.src[1].arg).to_uop()))
    elif x.op is Ops.VALID: ret = x.replace(src=(fxn(x.src[0].arg).to_uop(),))
    elif x.op in (Ops.CONST, Ops.DEFINE_VAR, Ops.BIND): ret = x
    elif x.op in (Ops.REDUCE_AXIS, Ops.VIEW):
      ret = _broadcast(x, name, fxn, old_shape, new_shape)
    else: ret = x.replace(src=tuple(walk(s) for s in x.src))
    memo[x] = ret
    return ret
  return walk(u)


def _broadcast(x: UOp, name: str, fxn, old_shape, new_shape) -> UOp:
  """Movement above a reduce: only an expand of its size-1 dims, which broadcasts the result (a fused chain)."""
  if name != "expand" or len(old_shape) != len(new_shape) or any(o != n and o != 1 for o, n in zip(old_shape, new_shape)):
    raise InvalidASTError(f"{name} of a reduce result {fmt_shape(old_shape)} -> {fmt_shape(new_shape)}: only an expand of its reduced "
                          "axes can follow a reduce in the same kernel; movement belongs before the reduce")
  base = x.src[0] if x.op is Ops.VIEW else x
  return UOp(Ops.VIEW, x.dtype, (base,), ShapeTracker.from_shape(old_shape if x.op is not Ops.VIEW else _reduced_shape(x)).expand(new_shape))


def _reduced_shape(view: UOp) -> tuple[sint, ...]:
  st: ShapeTracker = view.arg
  strides = st.real_strides()
  return tuple(1 if strides[i] == 0 else s for i, s in enumerate(st.shape))


# ***** leaves and outputs *****

def arg(idx: int, dtype: DType, shape) -> Expr:
  """Buffer argument `idx`, read as a contiguous array of `shape`."""
  if not isinstance(idx, int) or isinstance(idx, bool) or idx < 0: raise InvalidASTError(f"a buffer index is a non-negative int, got {idx!r}")
  dtype, shape = _dtype(dtype), _shape(shape)
  buf = UOp(Ops.DEFINE_GLOBAL, dtype.ptr(), (), idx)
  return Expr(UOp(Ops.LOAD, dtype, (buf, ShapeTracker.from_shape(shape).to_uop())), shape)


def const(value: Scalar, dtype: DType, shape) -> Expr:
  """A constant of `shape`: every element is `value`."""
  dtype, shape = _dtype(dtype), _shape(shape)
  if not isinstance(value, (bool, int, float)): raise InvalidASTError(f"a constant is a bool, int or float, got {value!r}")
  st = ShapeTracker.from_shape((1,) * len(shape)).expand(shape)
  valid = UOp(Ops.VALID, dtypes.bool, (st.to_uop(),))
  return Expr(valid.where(UOp.const(dtype, value), UOp.const(dtype, 0)), shape)


def store(idx: int, expr: Expr) -> UOp:
  """Write `expr` to buffer argument `idx` as a contiguous array of its shape."""
  if not isinstance(expr, Expr): raise InvalidASTError(f"store takes a kc.ast expression, got {type(expr).__name__}")
  if not isinstance(idx, int) or isinstance(idx, bool) or idx < 0: raise InvalidASTError(f"a buffer index is a non-negative int, got {idx!r}")
  buf = UOp(Ops.DEFINE_GLOBAL, expr.dtype.ptr(), (), idx)
  return UOp(Ops.STORE, dtypes.void, (buf, ShapeTracker.from_shape(expr.shape).to_uop(), expr.uop))


def sink(*stores: UOp) -> UOp:
  """The kernel: its STOREs. Buffer indices must not repeat between outputs."""
  if not stores or not all(isinstance(s, UOp) and s.op is Ops.STORE for s in stores): raise InvalidASTError("sink takes one or more A.store(...)")
  idxs = [s.src[0].arg for s in stores]
  if len(set(idxs)) != len(idxs): raise InvalidASTError(f"two stores to the same buffer index: {idxs}")
  from kc.kernel.verify import verify_ast
  out = UOp(Ops.SINK, dtypes.void, tuple(stores))
  verify_ast(out)
  return out
