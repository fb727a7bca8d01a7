"""kc.ast's builder: the expression (Expr) and numpy's operators, reduces, movement and functions over it.

Movement ops become ShapeTracker views at the leaves (the loads and the shaped constants); where no kernel can carry
a value further the builder materialises it (a BUFFER node, kc.schedule). The operators, reduces, indexing and dtype
rules are numpy 2's (docs/AST.md lists each op with its numpy namesake, and kc.ast.promotion holds the dtype tables).
What numpy refuses raises InvalidASTError (or DTypeError for a dtype rule) here, at build time.

An expression has two shapes. Its *kernel shape* is what a kernel computes it over: every shape in a kernel has one
rank, and a reduce keeps its reduced axes as size 1. Its *logical shape* (`.shape`) is numpy's: the kernel shape
without its hidden size-1 axes (the reduced axes of keepdims=False, the axes an int index or a reshape dropped). Storing
writes the logical elements in order (the hidden axes have size 1, so the order is the same); combining two expressions
broadcasts their logical shapes as numpy does and lines their hidden axes up in the kernel.

    a = A.arg(1, dtypes.float32, (M, K)); b = A.arg(2, dtypes.float32, (K, N))
    sink = A.sink(A.store(0, a @ b))                # logical (M, N); the kernel reduces (M, K, N) over K
"""
from __future__ import annotations
import builtins, math
from typing import Optional
import numpy as np
from kc.ast import promotion as P
from kc.schedule.movement import Move, extents, move
from kc.ir.dtype import DType, PtrDType, dtypes
from kc.errors import DTypeError, InvalidASTError, KcError, ShapeError
from kc.shape import ShapeTracker
from kc.shape.view import fmt_shape
from kc.ir.uop import Ops, UOp, sint
from kc.schedule import scheduler as _scheduler

Scalar = P.Scalar
# Python's scalars (weak) and numpy's (strong: kc.ast.promotion)
_SCALARS = (bool, int, float) + P.NUMPY_SCALARS
NDARRAY_OPERAND = ("np.ndarray operands are not kc expressions; use A.const or an A.arg buffer (kc passes arrays to "
                   "kernels as buffers, when the kernel runs)")


# recomputing a reduce per element of an expand is kept while it adds at most this factor of reduce work...
RECOMPUTE_FACTOR = 4
# ...or this many elements of reduce work in all (small programs stay one kernel)
RECOMPUTE_ELEMENTS = 1 << 16


def _reduce_work(u: UOp) -> int:
  """The elements a value's reduces loop over, in all (each reduce's input extent; symbolic axes count as 1)."""
  total = 0
  for r in _scheduler.kernel_nodes(u):
    if r.op is Ops.REDUCE_AXIS: total += math.prod(d if isinstance(d, int) else 1 for d in extents(r.src[0]))
  return total


def _recomputes(before: UOp, after: UOp) -> bool:
  """Whether a move turned `before` into `after` by multiplying its reduce work beyond what recomputing is worth."""
  old, new = _reduce_work(before), _reduce_work(after)
  return new > RECOMPUTE_FACTOR * old and new - old > RECOMPUTE_ELEMENTS


def _value(x):
  """The Python value of a scalar operand (a numpy scalar's or 0-d array's .item())."""
  return x.item() if isinstance(x, (np.generic, np.ndarray)) else x


def _sequence(x, what: str) -> tuple:
  """x as a tuple, where numpy takes any sequence (a shape, axes, a pad's pairs), numpy's integers as ints; anything
  else (None, a float, a 2-d array) is refused here rather than by tuple() or a truth test deeper in."""
  if isinstance(x, np.ndarray) and x.ndim == 1: x = x.tolist()
  if not isinstance(x, (tuple, list, range)): raise InvalidASTError(f"{what} is a tuple, got {type(x).__name__} {x!r:.60}")
  return tuple(int(v) if isinstance(v, np.integer) else v for v in x)


def _shape(shape) -> tuple[sint, ...]:
  if isinstance(shape, np.integer): shape = int(shape)
  if isinstance(shape, (int, UOp)): shape = (shape,)
  shape = _sequence(shape, "a shape")
  for s in shape:
    if isinstance(s, bool) or not isinstance(s, (int, UOp)) or (isinstance(s, int) and s < 0):
      raise InvalidASTError(f"a shape is a tuple of non-negative ints or Variables, got {shape!r}")
  return shape


def _dtype(dtype) -> DType:
  if isinstance(dtype, DType) and not isinstance(dtype, PtrDType) and dtype.count == 1 and dtype != dtypes.void: return dtype
  # numpy dtypes and scalar types too (np.float32, np.dtype("int8")); not names: "float" is float32 in kc, float64 in numpy
  if isinstance(dtype, np.dtype) or (isinstance(dtype, type) and issubclass(dtype, np.generic)):
    try: return dtypes.from_numpy(dtype)
    except DTypeError: pass
  raise InvalidASTError(f"unknown dtype {dtype!r}: use one of kc.dtypes ({', '.join(dtypes.fields())})")


def _size(shape) -> sint:
  return math.prod(shape) if all(isinstance(s, int) for s in shape) else None


def _axes(axis, ndim: int, what: str) -> tuple[int, ...]:
  if isinstance(axis, np.integer): axis = int(axis)
  axes = tuple(range(ndim)) if axis is None else (axis,) if isinstance(axis, int) else _sequence(axis, f"a {what} axis or axes")
  norm = []
  for a in axes:
    if isinstance(a, bool) or not isinstance(a, int) or not -ndim <= a < ndim:
      # a movement's bad axis is a ShapeError (as the shape layer's own are); a reduce's is an InvalidASTError
      raise (ShapeError if what in ("flip", "windows") else InvalidASTError)(f"{what} axis {a!r} out of range for {ndim} dims")
    norm.append(a % ndim)
  if len(set(norm)) != len(norm): raise InvalidASTError(f"repeated {what} axis in {axes}")
  return tuple(norm)


class Expr:
  """A value of the program: a UOp, its kernel shape, and which kernel axes are hidden (size 1, not part of numpy's
  shape)."""
  __slots__ = ("uop", "kshape", "hidden")

  def __init__(self, uop: UOp, kshape: tuple[sint, ...], hidden: tuple[int, ...] = ()):
    self.uop, self.kshape, self.hidden = uop, tuple(kshape), tuple(sorted(hidden))

  @property
  def dtype(self) -> DType: return self.uop.dtype
  @property
  def shape(self) -> tuple[sint, ...]:
    return tuple(s for i, s in enumerate(self.kshape) if i not in self.hidden)
  @property
  def ndim(self) -> int: return len(self.shape)
  @property
  def size(self): return _size(self.shape)
  def __repr__(self): return f"<kc.ast.Expr {self.dtype.name}{fmt_shape(self.shape)}>"
  def __len__(self) -> int:
    """numpy's len(): the first axis' length; a 0-d or symbolic first axis has none (numpy: TypeError)."""
    if not self.shape:
      raise DTypeError("len() of a 0-d kc.ast expression (numpy: len() of unsized object); use .shape or .size")
    if not isinstance(self.shape[0], int):
      raise DTypeError(f"len() of {fmt_shape(self.shape)}: the first axis is symbolic, its length is known when the "
                       "kernel runs; use .shape")
    return self.shape[0]

  def __iter__(self):
    """numpy's iteration: x[0], x[1], ... along the first axis, each an expression of the same kernel."""
    return (self[i] for i in range(len(self)))

  # numpy's protocols: ufuncs and functions on an Expr are kc.ast's ops (_UFUNCS, _FUNCTIONS); an Expr has no values
  # to convert to an array before its kernel runs, so that is refused rather than materialized
  def __array_ufunc__(self, ufunc, method, *inputs, **kwargs): return _array_ufunc(ufunc, method, inputs, kwargs)
  def __array_function__(self, func, types, args, kwargs): return _array_function(func, args, kwargs)

  def __array__(self, dtype=None, copy=None):
    raise DTypeError(f"{self!r} has no values until its kernel runs, so numpy cannot convert it to an array: store it "
                     "(A.store) and read kc.run's output, or use numpy functions on it (np.exp(x) is x.exp())")

  # == and != build comparisons as in numpy, so an Expr hashes by identity (object's hash): Exprs still work as dict
  # keys and set members, and a lookup finds the same object (Python checks identity before ==)
  __hash__ = object.__hash__

  def __bool__(self):
    raise InvalidASTError("the truth value of a kc.ast expression is not known until the kernel runs; compare with "
                          "A.store outputs instead, or use .where")

  def realize(self) -> "Expr":
    """This value materialised: computed by a kernel of its own into an intermediate buffer, and read from there.
    kc.ast realizes a value itself where one kernel cannot carry it further (kc.schedule); this is the explicit form."""
    if self.uop.op is Ops.LOAD and not self.hidden and self.uop.src[1].arg.contiguous: return self
    buf = _scheduler.realize(self.uop, self.kshape, self.shape)
    return Expr(UOp(Ops.LOAD, self.dtype, (buf, ShapeTracker.from_shape(self.shape).to_uop()), self.shape), self.shape)

  def _buffered(self) -> "Expr":
    """This value read from an intermediate buffer through its own kernel shape: any movement applies to it."""
    buf = _scheduler.realize(self.uop, self.kshape, self.shape)
    return Expr(UOp(Ops.LOAD, self.dtype, (buf, ShapeTracker.from_shape(self.kshape).to_uop()), self.shape), self.kshape, self.hidden)

  @property
  def _logical(self) -> list[int]:
    """The kernel axis of each logical axis."""
    return [i for i in range(len(self.kshape)) if i not in self.hidden]

  def _with(self, mv: Move, hidden: Optional[tuple[int, ...]] = None) -> "Expr":
    new = mv.apply(ShapeTracker.from_shape(self.kshape)).shape  # a move numpy refuses fails here, for every value
    try: uop = move(self.uop, mv, self.kshape)
    except InvalidASTError:
      # a move one kernel cannot push through a reduce (a reduce result reshaped, or broadcast to another size): the
      # value is materialised, and the move applies to its buffer's view
      if not any(u.op is Ops.REDUCE_AXIS for u in _scheduler.kernel_nodes(self.uop)): raise
      uop = move(self._buffered().uop, mv, self.kshape)
    else:
      # an expand of a reduce result along an axis it kept recomputes the reduce for every new element: cheap for a
      # few, but a materialised result is read instead where that would multiply the reduce work (p @ v after a softmax)
      if mv.kind == "expand" and _recomputes(self.uop, uop): uop = move(self._buffered().uop, mv, self.kshape)
    return Expr(uop, new, self.hidden if hidden is None else hidden)

  def _kernel_move(self, kind: str, arg, what: str, hidden: Optional[tuple[int, ...]] = None) -> "Expr":
    try: return self._with(Move(kind, arg), hidden)
    except InvalidASTError: raise
    except KcError as e: raise InvalidASTError(f"{what} of {fmt_shape(self.shape)}: {e}") from e

  # ***** movement: pushed to the leaves *****

  def reshape(self, *shape) -> "Expr":
    shape = shape[0] if len(shape) == 1 and not isinstance(shape[0], (int, np.integer, UOp)) else shape
    shape = self._infer(_sequence(shape, "reshape's shape"))
    if shape == self.shape: return self
    if self.size is not None and _size(shape) != self.size:
      raise ShapeError(f"reshape: cannot reshape {fmt_shape(self.shape)} ({self.size} elements) to {fmt_shape(shape)}")
    if [s for s in shape if s != 1] == [s for s in self.shape if s != 1]: return self._regroup(shape)
    # the kernel shape becomes the new shape: the hidden (size-1) axes are reshaped away with the rest
    return self._kernel_move("reshape", shape, "reshape", hidden=())

  def _infer(self, shape: tuple) -> tuple[sint, ...]:
    if builtins.sum(1 for s in shape if isinstance(s, int) and s == -1) > 1: raise ShapeError(f"reshape: at most one -1 in {shape}")
    if -1 in [s for s in shape if isinstance(s, int)]:
      known = _size([s for s in shape if not (isinstance(s, int) and s == -1)])
      if known is None or self.size is None or known == 0 or self.size % known:
        raise ShapeError(f"reshape: cannot infer -1 in {shape} for {fmt_shape(self.shape)}")
      shape = tuple(self.size // known if isinstance(s, int) and s == -1 else s for s in shape)
    return _shape(shape)

  def _regroup(self, shape: tuple) -> "Expr":
    """A reshape that only adds or removes size-1 axes: removed axes become hidden, new ones are inserted."""
    old, logical = self.kshape, set(self._logical)
    entries: list[Optional[int]] = []
    hidden_new: list[int] = []
    k = 0
    for s in shape:
      if s == 1:
        # the next kernel axis, hidden or not, serves when it has size 1 (x.sum(1).reshape(M, 1) is the keepdims form)
        if k < len(old) and old[k] == 1: entries.append(k); k += 1
        else: entries.append(None)
        continue
      while old[k] == 1 or k not in logical: hidden_new.append(len(entries)); entries.append(k); k += 1
      entries.append(k); k += 1
    while k < len(old): hidden_new.append(len(entries)); entries.append(k); k += 1
    if None not in entries: return Expr(self.uop, old, tuple(hidden_new))
    return self._with(Move("insert", tuple(entries)), tuple(hidden_new))

  def _insert(self, entries: list, hidden: tuple[int, ...]) -> "Expr":
    if entries == list(range(len(self.kshape))): return Expr(self.uop, self.kshape, hidden)
    return self._with(Move("insert", tuple(entries)), hidden)

  def permute(self, *order) -> "Expr":
    order = _sequence(order[0] if len(order) == 1 and not isinstance(order[0], (int, np.integer)) else order, "permute's order")
    if any(isinstance(a, bool) or not isinstance(a, int) for a in order) or \
       sorted(a % self.ndim if -self.ndim <= a < self.ndim else a for a in order) != list(range(self.ndim)):
      raise ShapeError(f"permute: {order} is not an order of the {self.ndim} axes of {fmt_shape(self.shape)}")
    lg, korder = self._logical, list(range(len(self.kshape)))
    for j, a in enumerate(order): korder[lg[j]] = lg[a % self.ndim]
    return self._kernel_move("permute", tuple(korder), "permute")

  @property
  def T(self) -> "Expr": return self.permute(tuple(reversed(range(self.ndim))))
  def transpose(self, *order) -> "Expr": return self.permute(*order) if order else self.T

  def _per_axis(self, arg, hidden_value, what: str) -> tuple:
    arg = _sequence(arg, f"{what}'s (before, after) pairs")
    if len(arg) != self.ndim: raise InvalidASTError(f"{what}: {arg!r} has {len(arg)} entries for the {self.ndim} axes of {fmt_shape(self.shape)}")
    out, lg = [hidden_value] * len(self.kshape), self._logical
    for j, a in enumerate(arg): out[lg[j]] = tuple(a) if isinstance(a, (tuple, list)) else a
    return tuple(out)

  def pad(self, arg) -> "Expr": return self._kernel_move("pad", self._per_axis(arg, (0, 0), "pad"), "pad")
  def shrink(self, arg) -> "Expr": return self._kernel_move("shrink", self._per_axis(arg, (0, 1), "shrink"), "shrink")

  def flip(self, axes) -> "Expr":
    axes = _axes(axes, self.ndim, "flip")
    return self._kernel_move("flip", tuple(self._logical[a] for a in axes), "flip")

  def expand(self, *shape) -> "Expr":
    """numpy's broadcast_to."""
    shape = _shape(shape[0] if len(shape) == 1 and not isinstance(shape[0], (int, UOp)) else shape)
    return self._broadcast_to(shape)

  def _broadcast_to(self, shape: tuple) -> "Expr":
    me = self
    if len(shape) < me.ndim or any(o != 1 and o != n for o, n in zip(me.shape, shape[len(shape) - me.ndim:])):
      raise ShapeError(f"expand: {fmt_shape(me.shape)} does not broadcast to {fmt_shape(shape)}")
    me = me._lead(len(shape))
    target = list(me.kshape)
    for j, k in enumerate(me._logical): target[k] = shape[j]
    return me if tuple(target) == me.kshape else me._kernel_move("expand", tuple(target), "expand")

  def _lead(self, ndim: int) -> "Expr":
    """Leading size-1 logical axes up to `ndim` (numpy's broadcasting aligns shapes on the right)."""
    extra = ndim - self.ndim
    if extra <= 0: return self
    return self._insert([None] * extra + list(range(len(self.kshape))), tuple(h + extra for h in self.hidden))

  def windows(self, axis: int, size: int) -> "Expr":
    """numpy's sliding_window_view(x, size, axis): `axis` (length n) becomes the n - size + 1 window starts and a new
    last axis of `size` walks each window: out[..., i, ..., j] = self[..., i + j, ...]."""
    if isinstance(axis, np.integer): axis = int(axis)
    if isinstance(axis, bool) or not isinstance(axis, int): raise ShapeError(f"windows: the axis is an int, got {axis!r:.60}")
    k = self._logical[_axes(axis, self.ndim, "windows")[0]]
    # the window axis is the last kernel axis, so it is the last logical one too; the hidden axes keep their places
    try: return self._with(Move("windows", (k, size)))
    except InvalidASTError: raise
    except KcError as e: raise InvalidASTError(f"windows of {fmt_shape(self.shape)}: {e}") from e

  def __getitem__(self, idx) -> "Expr":
    """numpy basic indexing: ints, slices (any step), None and one Ellipsis."""
    idx = idx if isinstance(idx, tuple) else (idx,)
    if builtins.sum(1 for i in idx if i is Ellipsis) > 1: raise InvalidASTError("an index can only have a single ellipsis")
    real = [i for i in idx if i is not None and i is not Ellipsis]
    for i in real:
      if isinstance(i, bool) or not isinstance(i, (int, slice)):
        raise InvalidASTError(f"kc.ast indexes with ints, slices, None and ..., got {type(i).__name__} {i!r}")
    if len(real) > self.ndim: raise InvalidASTError(f"too many indices for {fmt_shape(self.shape)}: {len(real)}")
    if Ellipsis in idx:
      at = idx.index(Ellipsis)
      idx = idx[:at] + (slice(None),) * (self.ndim - len(real)) + idx[at + 1:]
    else: idx = idx + (slice(None),) * (self.ndim - len(real))
    x, shrink, flips, steps, out_shape = self, [], [], [], []
    for i in idx:
      if i is None: out_shape.append(1); continue
      axis, n = len(shrink), self.shape[len(shrink)]
      if not isinstance(n, int): raise InvalidASTError(f"indexing a symbolic axis of {fmt_shape(self.shape)}")
      if isinstance(i, int):
        if not -n <= i < n: raise InvalidASTError(f"index {i} is out of bounds for axis {axis} with size {n}")
        shrink.append((i % n, i % n + 1)); steps.append(1)
        continue
      r = range(*i.indices(n))
      if len(r) == 0:  # numpy's empty slice: an axis of length 0
        shrink.append((0, 0)); steps.append(1); out_shape.append(0)
        continue
      first, step = r[0], r.step
      if step < 0: flips.append(axis); first, step = n - 1 - first, -step
      shrink.append((first, first + (len(r) - 1) * step + 1)); steps.append(step); out_shape.append(len(r))
    if flips: x = x.flip(flips)
    if any(s != (0, n) for s, n in zip(shrink, self.shape)): x = x.shrink(shrink)
    if any(s != 1 for s in steps): x = x._kernel_move("stride", x._per_axis(steps, 1, "stride"), "a stepped slice")
    return x.reshape(tuple(out_shape))

  # ***** elementwise *****

  def __add__(self, x): return _add(self, x)
  def __radd__(self, x): return _add(x, self)
  def __sub__(self, x): return _sub(self, x)
  def __rsub__(self, x): return _sub(x, self)
  def __mul__(self, x): return _mul(self, x)
  def __rmul__(self, x): return _mul(x, self)
  def __truediv__(self, x): return _elementwise(Ops.FDIV, self, x, dtype_rule=P.divide_float)
  def __rtruediv__(self, x): return _elementwise(Ops.FDIV, x, self, dtype_rule=P.divide_float)
  def __floordiv__(self, x): return _floordiv(self, x)
  def __rfloordiv__(self, x): return _floordiv(x, self)
  def __mod__(self, x): return _mod(self, x)
  def __rmod__(self, x): return _mod(x, self)
  def __and__(self, x): return _bitwise(Ops.AND, self, x)
  def __rand__(self, x): return _bitwise(Ops.AND, x, self)
  def __or__(self, x): return _bitwise(Ops.OR, self, x)
  def __ror__(self, x): return _bitwise(Ops.OR, x, self)
  def __xor__(self, x): return _bitwise(Ops.XOR, self, x)
  def __rxor__(self, x): return _bitwise(Ops.XOR, x, self)
  def __lt__(self, x): return _compare("<", self, x)
  def __gt__(self, x): return _compare(">", self, x)
  def __le__(self, x): return _compare("<=", self, x)
  def __ge__(self, x): return _compare(">=", self, x)
  def __eq__(self, x): return _compare("==", self, x)  # type: ignore[override]
  def __ne__(self, x): return _compare("!=", self, x)  # type: ignore[override]
  def __pow__(self, x): return _pow(self, x)
  def __rpow__(self, x): return _pow(x, self)
  def __matmul__(self, x): return matmul(self, x)
  def __rmatmul__(self, x): return matmul(x, self)
  def __lshift__(self, x): return _shift(Ops.SHL, self, x)
  def __rlshift__(self, x): return _shift(Ops.SHL, x, self)
  def __rshift__(self, x): return _shift(Ops.SHR, self, x)
  def __rrshift__(self, x): return _shift(Ops.SHR, x, self)
  def __neg__(self) -> "Expr": return _neg(self)
  def __pos__(self) -> "Expr": return self
  def __abs__(self) -> "Expr": return self.abs()
  def __invert__(self) -> "Expr":
    if dtypes.is_float(self.dtype): raise DTypeError(f"~ (bitwise not) needs bool or int, got {self.dtype.name}")
    if dtypes.is_bool(self.dtype): return self.logical_not()
    return _unary_uop(self, lambda u: u.alu(Ops.XOR, UOp.const(u.dtype, dtypes.max(u.dtype) if dtypes.is_unsigned(u.dtype) else -1)))

  def ne(self, x) -> "Expr": return self != x
  def eq(self, x) -> "Expr": return self == x
  def maximum(self, x) -> "Expr": return maximum(self, x)
  def minimum(self, x) -> "Expr": return minimum(self, x)
  def clip(self, lo=None, hi=None) -> "Expr": return clip(self, lo, hi)
  def logical_not(self) -> "Expr": return _unary_uop(_truth(self), lambda u: u.alu(Ops.CMPNE, UOp.const(dtypes.bool, True)))
  def where(self, a, b) -> "Expr": return where(self, a, b)

  def _float_unary(self, fn) -> "Expr":
    dt = P.unary_float(self.dtype)
    return _unary_uop(self, lambda u: fn(u.cast(dt)))

  def exp2(self) -> "Expr": return self._float_unary(lambda u: u.alu(Ops.EXP2))
  def log2(self) -> "Expr": return self._float_unary(lambda u: u.alu(Ops.LOG2))
  def _composite_unary(self, fn) -> "Expr":
    """A function kc builds from two ops (exp is exp2 of x*log2(e)): computed in float32 for the floats narrower than
    it and rounded once, as numpy computes them; rounding the inner result to half first would put exp(9) off by 35."""
    dt = P.unary_float(self.dtype)
    if dt.itemsize >= dtypes.float32.itemsize: return self._float_unary(fn)
    return _unary_uop(self, lambda u: fn(u.cast(dtypes.float32)).cast(dt))

  def exp(self) -> "Expr": return self._composite_unary(_exp_uop)
  def log(self) -> "Expr": return self._composite_unary(_log_uop)
  def sin(self) -> "Expr": return self._float_unary(lambda u: u.alu(Ops.SIN))
  def cos(self) -> "Expr": return self._composite_unary(lambda u: (UOp.const(u.dtype, math.pi / 2) - u).alu(Ops.SIN))
  def sqrt(self) -> "Expr": return self._float_unary(lambda u: u.alu(Ops.SQRT))
  def recip(self) -> "Expr": return self._float_unary(lambda u: u.alu(Ops.RECIP))
  reciprocal = recip

  def abs(self) -> "Expr":
    if dtypes.is_bool(self.dtype) or dtypes.is_unsigned(self.dtype): return self
    return _unary_uop(self, lambda u: u.alu(Ops.CMPLT, UOp.const(u.dtype, 0)).where(_neg_uop(u), u))

  def square(self) -> "Expr":
    # numpy's square has no bool loop: bools square as int8
    x = self.cast(dtypes.int8) if dtypes.is_bool(self.dtype) else self
    return x * x

  def tanh(self) -> "Expr":
    """tanh |x| = -m / (2 + m) with m = expm1(-2|x|), and expm1(y) = (e^y - 1) * y / log(e^y) (Kahan's form, exact to
    a few ulp where e^y - 1 alone would cancel: tanh(1e-5) keeps its digits); the sign is restored after."""
    return self._composite_unary(_tanh_uop)

  def sigmoid(self) -> "Expr":
    """The logistic function 1 / (1 + exp(-x)) (not a numpy function: scipy.special.expit), in numpy's float dtypes."""
    return self._composite_unary(lambda u: _exp_uop(u.alu(Ops.NEG)).alu(Ops.ADD, UOp.const(u.dtype, 1)).alu(Ops.RECIP))

  def floor(self) -> "Expr": return self._rounding(lambda u: _rounded(u, "floor"))
  def ceil(self) -> "Expr": return self._rounding(lambda u: _rounded(u, "ceil"))
  def trunc(self) -> "Expr": return self._rounding(lambda u: _rounded(u, "trunc"))
  def rint(self) -> "Expr":
    """numpy's rint: to the nearest integer, halves to the even one (2.5 -> 2.0, -0.5 -> -0.0); the float dtype rule."""
    return self._float_unary(lambda u: _rounded(u, "rint"))

  def round(self, decimals: int = 0) -> "Expr":
    """numpy's round: rint of x * 10**decimals, divided back (a negative `decimals` divides first, as numpy does).
    ints keep their dtype and are unchanged for decimals >= 0; bools round as float16, as numpy's rint."""
    if isinstance(decimals, bool) or not isinstance(decimals, int):
      raise InvalidASTError(f"round: decimals is an int, got {decimals!r}")
    if dtypes.is_bool(self.dtype): return self.rint()
    if not dtypes.is_float(self.dtype):
      if decimals >= 0: return self
      raise InvalidASTError(f"round of {self.dtype.name} to decimals={decimals}: kc.ast rounds ints to >= 0 decimals "
                            "only (they are unchanged); cast to a float dtype to round to tens")
    if decimals == 0: return self.rint()
    # numpy's 10**decimals overflows to inf past float64's range (its answer is then nan); Python's raises instead
    scale = 10.0 ** builtins.abs(decimals) if builtins.abs(decimals) <= 308 else math.inf
    return (self * scale).rint() / scale if decimals > 0 else (self / scale).rint() * scale

  __round__ = round
  around = round

  def _rounding(self, fn) -> "Expr":
    """floor, ceil and trunc: floats rounded in their dtype; numpy 2 returns ints and bools unchanged."""
    return _unary_uop(self, fn) if dtypes.is_float(self.dtype) else self

  def sign(self) -> "Expr":
    """numpy's sign: -1, 0 or 1 in the operand's dtype; NaN stays NaN, -0.0 gives 0.0; bools are refused, as numpy
    has no loop for them."""
    if dtypes.is_bool(self.dtype):
      raise DTypeError("numpy's sign has no bool loop; cast to an int dtype first (x.astype(np.int8))")
    def fn(u: UOp) -> UOp:
      zero = UOp.const(u.dtype, 0)
      rest = u.alu(Ops.CMPNE, u).where(u, zero) if dtypes.is_float(u.dtype) else zero  # NaN != NaN
      pos = zero.alu(Ops.CMPLT, u).where(UOp.const(u.dtype, 1), rest)
      return pos if dtypes.is_unsigned(u.dtype) else u.alu(Ops.CMPLT, zero).where(UOp.const(u.dtype, -1), pos)
    return _unary_uop(self, fn)

  def isnan(self) -> "Expr": return self._float_test(lambda u: u.alu(Ops.CMPNE, u), False)
  def isinf(self) -> "Expr": return self._float_test(lambda u: _eq_const(_abs_uop(u), math.inf), False)
  def isfinite(self) -> "Expr":
    return self._float_test(lambda u: _abs_uop(u).alu(Ops.CMPLT, UOp.const(u.dtype, math.inf)), True)

  def _float_test(self, fn, other: bool) -> "Expr":
    """A test of float values (a bool per element); ints and bools are never NaN or inf: `other` everywhere."""
    # fp8 is tested in float32, where it is exact: e4m3 has no infinity, so an inf constant of its own is NaN
    if self.dtype in dtypes.fp8s: return _unary_uop(self, lambda u: fn(u.cast(dtypes.float32)))
    if dtypes.is_float(self.dtype): return _unary_uop(self, fn)
    # x != x is False for every int and bool, a value of x's shape without a constant's view
    return _unary_uop(self, lambda u: u.alu(Ops.CMPNE, u) if not other else _not(u.alu(Ops.CMPNE, u)))

  def cast(self, dtype) -> "Expr": return _unary_uop(self, lambda u: u.cast(_dtype(dtype)))
  def astype(self, dtype) -> "Expr": return self.cast(dtype)

  def squeeze(self, axis=None) -> "Expr":
    """numpy's squeeze: drop the size-1 axes (all, or those of `axis`, which must have size 1)."""
    if axis is None: axes = [a for a, n in enumerate(self.shape) if isinstance(n, int) and n == 1]
    else: axes = _axes(axis, self.ndim, "squeeze")
    if bad := [a for a in axes if not (isinstance(self.shape[a], int) and self.shape[a] == 1)]:
      raise InvalidASTError(f"squeeze: axis {bad[0]} of {fmt_shape(self.shape)} has size {self.shape[bad[0]]}, not 1")
    return self.reshape(tuple(n for a, n in enumerate(self.shape) if a not in axes))

  def ravel(self) -> "Expr": return self.reshape(-1)
  def flatten(self) -> "Expr": return self.reshape(-1)

  def bitcast(self, dtype) -> "Expr":
    dtype = _dtype(dtype)
    if dtype.itemsize != self.dtype.itemsize: raise InvalidASTError(f"bitcast needs equal sizes: {self.dtype.name} -> {dtype.name}")
    return _unary_uop(self, lambda u: u.bitcast(dtype))

  # ***** reduces: numpy's axis and keepdims (default False) *****

  def _reduce(self, op: Ops, axis, keepdims: bool, acc: Optional[DType] = None) -> "Expr":
    if not isinstance(keepdims, (bool, np.bool_, int, np.integer)): raise InvalidASTError(f"keepdims is a bool, got {keepdims!r:.60}")
    me = self
    axes = _axes(axis, me.ndim, "reduce")
    kaxes = tuple(sorted(me._logical[a] for a in axes))
    src = me.uop if acc is None else me.uop.cast(acc)
    # a reduce over size-1 axes is the value itself: no REDUCE_AXIS, whose loop the Kernel would have nothing to put in
    live = tuple(k for k in kaxes if not (isinstance(me.kshape[k], int) and me.kshape[k] == 1))
    uop = UOp(Ops.REDUCE_AXIS, src.dtype, (src,), (op, live)) if live else src
    kshape = tuple(1 if i in kaxes else s for i, s in enumerate(me.kshape))
    return Expr(uop, kshape, me.hidden if keepdims else me.hidden + kaxes)

  def sum(self, axis=None, keepdims: bool = False, dtype=None, acc_dtype=None) -> "Expr":
    """numpy's sum: small ints widen to int64/uint64 unless `dtype` is given; half sums accumulate in float32 unless
    `acc_dtype` (kc's own keyword) names the accumulator, e.g. float16 for a tensor core that accumulates in half."""
    out = P.sum_dtype(self.dtype) if dtype is None else _dtype(dtype)
    return self._reduce(Ops.ADD, axis, keepdims, P.ACCUMULATE.get(out, out) if acc_dtype is None else _dtype(acc_dtype)).cast(out)

  def prod(self, axis=None, keepdims: bool = False, dtype=None) -> "Expr":
    out = P.sum_dtype(self.dtype) if dtype is None else _dtype(dtype)
    return self._reduce(Ops.MUL, axis, keepdims, P.ACCUMULATE.get(out, out)).cast(out)

  def max(self, axis=None, keepdims: bool = False) -> "Expr":
    if dtypes.is_bool(self.dtype): return self.cast(dtypes.uint8)._reduce(Ops.MAX, axis, keepdims).cast(dtypes.bool)
    return self._reduce(Ops.MAX, axis, keepdims)

  def min(self, axis=None, keepdims: bool = False) -> "Expr":
    # the order-reversing map of each kind turns a max into a min exactly: not for bools, ~ for ints, - for floats
    flip = (lambda x: x.logical_not()) if dtypes.is_bool(self.dtype) else (lambda x: ~x) if dtypes.is_int(self.dtype) else (lambda x: -x)
    return flip(flip(self).max(axis, keepdims))

  def mean(self, axis=None, keepdims: bool = False) -> "Expr":
    out = P.divide_float(self.dtype)
    n = self._count(axis, "mean")
    acc = P.ACCUMULATE.get(out, out)
    s = self.cast(out)._reduce(Ops.ADD, axis, keepdims, acc)
    return (s / n).cast(out)

  def var(self, axis=None, ddof=0, keepdims: bool = False) -> "Expr":
    """numpy's var in one kernel, in two passes as numpy computes it: the mean (a reduce broadcast back), then the sum
    of squared deviations over the same axes, divided by max(n - ddof, 0). ints and bools give float64; float16
    and bfloat16 are computed in float32 and rounded once."""
    out = P.divide_float(self.dtype)
    acc = P.ACCUMULATE.get(out, out)
    n = self._count(axis, "var")
    if isinstance(ddof, bool) or not isinstance(ddof, (int, float)):
      raise InvalidASTError(f"var: ddof is a number, got {ddof!r}")
    x = self.cast(acc)
    dev = x - x._reduce(Ops.ADD, axis, True) / n
    return ((dev * dev)._reduce(Ops.ADD, axis, keepdims) / builtins.max(n - ddof, 0)).cast(out)

  def std(self, axis=None, ddof=0, keepdims: bool = False) -> "Expr":
    """numpy's std: the square root of var (the same kernel, the same dtypes)."""
    out = P.divide_float(self.dtype)
    v = self.cast(P.ACCUMULATE.get(out, out)).var(axis, ddof, keepdims)
    return v.sqrt().cast(out)

  def _count(self, axis, what: str) -> int:
    n = _size([self.shape[a] for a in _axes(axis, self.ndim, what)])
    if n is None:
      raise InvalidASTError(f"{what} over a symbolic axis of {fmt_shape(self.shape)}: the count is not known when "
                            "building")
    return n

  def argmax(self, axis=None, keepdims: bool = False) -> "Expr":
    """numpy's argmax: the first index of the largest element along one axis (axis=None: of the flattened array), as
    int64; a NaN is the largest, so the first NaN wins. See _arg_extreme for how one kernel finds an index."""
    return _arg_extreme(self, axis, keepdims, largest=True)

  def argmin(self, axis=None, keepdims: bool = False) -> "Expr":
    """numpy's argmin: the first index of the smallest element (the first NaN where there is one), as int64."""
    return _arg_extreme(self, axis, keepdims, largest=False)

  # numpy's scans: kc.ast.scan registers them as np.cumsum's and np.cumprod's overrides (`implements`)
  def cumsum(self, axis=None, dtype=None) -> "Expr": return np.cumsum(self, axis=axis, dtype=dtype)
  def cumprod(self, axis=None, dtype=None) -> "Expr": return np.cumprod(self, axis=axis, dtype=dtype)

  def any(self, axis=None, keepdims: bool = False) -> "Expr": return _truth(self).max(axis, keepdims)
  def all(self, axis=None, keepdims: bool = False) -> "Expr": return _truth(self).min(axis, keepdims)


# ***** combining expressions *****

def _broadcast_shape(shapes: list[tuple]) -> Optional[tuple]:
  ndim = builtins.max(len(s) for s in shapes)
  out = []
  for i in range(ndim):
    dims = {s[i - ndim + len(s)] for s in shapes if i - ndim + len(s) >= 0} - {1}
    if len(dims) > 1: return None
    out.append(dims.pop() if dims else 1)
  return tuple(out)


def _align(name: str, xs: list[Expr]) -> list[Expr]:
  """numpy broadcasting of the logical shapes, with the hidden axes of every operand lined up in one kernel shape.
  Operands whose hidden axes sit in the same place over the same sizes share them (x.sum(1) + y.sum(1)); others
  get their own kernel axes."""
  shape = _broadcast_shape([x.shape for x in xs])
  if shape is None: raise InvalidASTError(f"{name}: shapes {', '.join(fmt_shape(x.shape) for x in xs)} do not broadcast")
  xs = [_kept_where_fused(x, shape) for x in xs]
  xs = [x._lead(len(shape)) for x in xs]
  if all(x.kshape == xs[0].kshape and x.hidden == xs[0].hidden for x in xs): layout = None
  else: layout = _gaps(xs, len(shape))
  out = []
  for i, x in enumerate(xs):
    if layout is not None:
      gaps, entries, hidden = _gap_axes(x), [], []
      for g, slots in enumerate(layout):
        for owner, pos in slots:
          mine = gaps[g][pos] if (owner == i or (owner is None and gaps[g])) else None
          hidden.append(len(entries)); entries.append(mine)
        if g < len(shape): entries.append(x._logical[g])
      x = x._insert(entries, tuple(hidden))
    out.append(x._broadcast_to(shape))
  return out


def _kept_where_fused(x: Expr, shape: tuple) -> Expr:
  """x with its hidden axes made numpy's where that means the same and fuses: hidden axes that all lead (x.mean(),
  x.sum(0)) broadcast to `shape` exactly as numpy broadcasts x (right-aligned, a size-1 axis each), and where each
  lines up with an axis of `shape` as long as the loop that reduced it (x - x.mean()), the result is read inside that
  loop (the fused reduce chain, one kernel) rather than on axes of its own."""
  if not x.hidden or x.hidden != tuple(range(len(x.hidden))) or len(x.kshape) > len(shape): return x
  loops, at = extents(x.uop), len(shape) - len(x.kshape)
  if all(shape[at + h] == loops[h] for h in x.hidden if h < len(loops)): return Expr(x.uop, x.kshape)
  return x


def _gap_axes(x: Expr) -> list[list[int]]:
  """The hidden kernel axes of x before each logical axis, and after the last."""
  gaps: list[list[int]] = [[] for _ in range(x.ndim + 1)]
  j = 0
  for k in range(len(x.kshape)):
    if k in x.hidden: gaps[j].append(k)
    else: j += 1
  return gaps


def _gaps(xs: list[Expr], ndim: int) -> list[list[tuple[Optional[int], int]]]:
  """The hidden slots of the common kernel shape in each gap: (None, pos) shared by every operand that has hidden axes
  there (same count, same sizes), or (operand, pos) owned by one operand."""
  gaps = [_gap_axes(x) for x in xs]
  ext = [extents(x.uop) if any(gaps[i]) else () for i, x in enumerate(xs)]
  layout = []
  for g in range(ndim + 1):
    having = [i for i in range(len(xs)) if gaps[i][g]]
    sizes = [tuple(ext[i][k] if k < len(ext[i]) else 1 for k in gaps[i][g]) for i in having]
    if having and all(len(s) == len(sizes[0]) for s in sizes) and \
       all(len({d for d in dims if d != 1}) <= 1 for dims in zip(*sizes)):
      layout.append([(None, p) for p in range(len(sizes[0]))])
    else: layout.append([(i, p) for i in having for p in range(len(gaps[i][g]))])
  return layout


def _check_operands(name: str, xs) -> None:
  """Expressions and scalars only: anything else is numpy's TypeError, kc's DTypeError, naming what to write instead."""
  for x in xs:
    if isinstance(x, np.ndarray) and not P.is_strong(x):
      raise DTypeError(f"{name}: {NDARRAY_OPERAND}; got an array of shape {x.shape}")
    if not isinstance(x, (Expr,) + _SCALARS) and not P.is_strong(x):
      raise DTypeError(f"{name}: cannot combine a kc.ast expression with {type(x).__name__} {x!r}: operands are kc.ast "
                       "expressions, Python or numpy scalars")


def _operands(name: str, xs) -> tuple[list, Optional[Expr]]:
  _check_operands(name, xs)
  exprs = [x for x in xs if isinstance(x, Expr)]
  if not exprs: raise InvalidASTError(f"{name} needs at least one kc.ast expression")
  aligned = iter(_align(name, exprs) if len(exprs) > 1 else [exprs[0]])
  return [next(aligned) if isinstance(x, Expr) else x for x in xs], None


def _result_dtype(xs) -> DType:
  _check_operands("kc.ast", xs)
  return P.result_dtype([x.dtype for x in xs if isinstance(x, Expr)], [x for x in xs if not isinstance(x, Expr)])


def _build(name: str, xs, fn, dtype: Optional[DType] = None) -> Expr:
  """fn over the operands' UOps, each cast to `dtype` (default: numpy's result dtype of the operands)."""
  dt = _result_dtype(xs) if dtype is None else dtype
  ops, _ = _operands(name, xs)
  base = next(x for x in ops if isinstance(x, Expr))
  uops = [x.uop.cast(dt) if isinstance(x, Expr) else UOp.const(dt, _value(x)) for x in ops]
  return Expr(fn(*uops), base.kshape, base.hidden)


def _elementwise(op: Ops, *xs, dtype_rule=None) -> Expr:
  dt = _result_dtype(xs)
  return _build(op.name, xs, lambda *u: u[0].alu(op, *u[1:]), dt if dtype_rule is None else dtype_rule(dt))


def _unary_uop(x: Expr, fn) -> Expr:
  return Expr(fn(x.uop), x.kshape, x.hidden)


def _add(a, b) -> Expr:
  if _result_dtype((a, b)) == dtypes.bool: return _elementwise(Ops.OR, a, b)  # numpy: bool + bool is or
  return _elementwise(Ops.ADD, a, b)


def _mul(a, b) -> Expr:
  if _result_dtype((a, b)) == dtypes.bool: return _elementwise(Ops.AND, a, b)
  return _elementwise(Ops.MUL, a, b)


def _sub(a, b) -> Expr:
  dt = _result_dtype((a, b))
  if dt == dtypes.bool: raise DTypeError("numpy boolean subtract, the - operator, is not supported; use ^ or logical_xor")
  # a scalar subtrahend is added negated (exact in floats, the same wrap-around in ints): x + -c folds like any sum
  if isinstance(b, _SCALARS): return _build("subtract", (a, b), lambda x, y: x + UOp.const(dt, -y.arg), dt)
  return _elementwise(Ops.SUB, a, b)


def _neg_uop(u: UOp) -> UOp:
  if dtypes.is_float(u.dtype): return u.alu(Ops.NEG)
  return UOp.const(u.dtype, 0).alu(Ops.SUB, u)  # ints wrap: -INT_MIN is INT_MIN, -1 as uint8 is 255, as in numpy


def _neg(x: Expr) -> Expr:
  if dtypes.is_bool(x.dtype): raise DTypeError("numpy boolean negative, the - operator, is not supported; use ~ or logical_not")
  return _unary_uop(x, _neg_uop)


def _floor(u: UOp) -> UOp:
  """floor of a float: the truncation minus one where it rounded up. Beyond 2**mantissa every float is an integer (and
  the int64 conversion could overflow), so those, infs and NaNs pass through."""
  big = UOp.const(u.dtype, 2.0 ** dtypes.finfo(u.dtype)[1])
  t = u.cast(dtypes.int64).cast(u.dtype)
  fl = u.alu(Ops.CMPLT, t).where(t - UOp.const(u.dtype, 1), t)
  a = u.alu(Ops.CMPLT, UOp.const(u.dtype, 0)).where(u.alu(Ops.NEG), u)
  return a.alu(Ops.CMPLT, big).where(fl, u)


def _floordiv(a, b) -> Expr:
  dt = _result_dtype((a, b))
  if dtypes.is_float(dt): return _build("floordiv", (a, b), lambda x, y: _floor(x.alu(Ops.FDIV, y)), dt)
  if dt == dtypes.bool: dt = dtypes.int8  # numpy: bool // bool is int8
  return _build("floordiv", (a, b), lambda x, y: _floored(x, y)[0], dt)


def _mod(a, b) -> Expr:
  dt = _result_dtype((a, b))
  if dtypes.is_float(dt): return _build("mod", (a, b), lambda x, y: x - _floor(x.alu(Ops.FDIV, y)) * y, dt)
  if dt == dtypes.bool: dt = dtypes.int8
  return _build("mod", (a, b), lambda x, y: _floored(x, y)[1], dt)


def _floored(x: UOp, y: UOp) -> tuple[UOp, UOp]:
  """numpy's integer // and % (the quotient rounds down, the remainder has the divisor's sign) from the IR's IDIV and
  MOD, which truncate as C does: where the truncated remainder is non-zero and its sign differs from the divisor's,
  the quotient is one less and the remainder one divisor more. A divisor of 0 gives 0 for both, as in numpy."""
  q, r = x.alu(Ops.IDIV, y), x.alu(Ops.MOD, y)
  if dtypes.is_unsigned(x.dtype) or x.dtype == dtypes.bool: return q, r
  zero = UOp.const(x.dtype, 0)
  off = r.ne(zero) & r.lt(zero).ne(y.lt(zero))
  return off.where(q - UOp.const(x.dtype, 1), q), off.where(r + y, r)


def _bitwise(op: Ops, a, b) -> Expr:
  dt = _result_dtype((a, b))
  if dtypes.is_float(dt): raise DTypeError(f"{op.name.lower()} needs bool or int operands, got {dt.name}")
  return _elementwise(op, a, b)


_FLIPPED = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "==": "==", "!=": "!="}


def _compare(cmp: str, a, b) -> Expr:
  if not isinstance(a, Expr): a, b, cmp = b, a, _FLIPPED[cmp]
  if isinstance(b, int) and not isinstance(b, bool) and dtypes.is_int(a.dtype) and not P.fits(b, a.dtype):
    # numpy 2 compares an int array with an out-of-range Python int by value: the answer is the same everywhere
    above = b > dtypes.max(a.dtype)
    value = {"<": above, "<=": above, ">": not above, ">=": not above, "==": False, "!=": True}[cmp]
    if value is False: return _unary_uop(a, lambda u: u.alu(Ops.CMPNE, u))
    return _unary_uop(a, lambda u: u.alu(Ops.CMPNE, u).alu(Ops.CMPNE, UOp.const(dtypes.bool, True)))
  dt = _result_dtype((a, b))
  def fn(x: UOp, y: UOp) -> UOp:
    if cmp == "<": return x.alu(Ops.CMPLT, y)
    if cmp == ">": return y.alu(Ops.CMPLT, x)
    if cmp == "<=": return x <= y
    if cmp == ">=": return x >= y
    if cmp == "!=": return x.alu(Ops.CMPNE, y)
    return _not(x.alu(Ops.CMPNE, y))
  return _build(cmp, (a, b), fn, dt)


def _not(u: UOp) -> UOp: return u.alu(Ops.CMPNE, UOp.const(dtypes.bool, True))


def _exp_uop(u: UOp) -> UOp: return (u * UOp.const(u.dtype, 1 / math.log(2))).alu(Ops.EXP2)
def _log_uop(u: UOp) -> UOp: return u.alu(Ops.LOG2) * UOp.const(u.dtype, math.log(2))


def _abs_uop(u: UOp) -> UOp: return u.alu(Ops.CMPLT, UOp.const(u.dtype, 0)).where(_neg_uop(u), u)


def _eq_const(u: UOp, value) -> UOp: return _not(u.alu(Ops.CMPNE, UOp.const(u.dtype, value)))


def _tanh_uop(u: UOp) -> UOp:
  dt = u.dtype
  y = _abs_uop(u) * UOp.const(dt, -2)
  e = _exp_uop(y)
  em1 = (e - UOp.const(dt, 1)) * y.alu(Ops.FDIV, _log_uop(e))
  em1 = _eq_const(e, 0).where(UOp.const(dt, -1), em1)  # |x| past the range of exp: tanh is 1
  t = em1.alu(Ops.NEG).alu(Ops.FDIV, em1 + UOp.const(dt, 2))
  # e == 1 where 2|x| is below half an ulp of 1: tanh(x) is x to the last bit there (and -0.0 stays -0.0)
  return _eq_const(e, 1).where(u, u.alu(Ops.CMPLT, UOp.const(dt, 0)).where(t.alu(Ops.NEG), t))


_SIGNED_OF_SIZE = {1: dtypes.int8, 2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}


def _rounded(u: UOp, mode: str) -> UOp:
  """floor, ceil, trunc or rint (halves to even) of a float. The truncation is a round trip through int64, exact
  below 2**mantissa; beyond it every float is an integer, and those, infs and NaNs pass through. A zero result keeps
  the operand's sign, as numpy's does (floor(-0.0) and ceil(-0.5) are -0.0)."""
  dt, one = u.dtype, UOp.const(u.dtype, 1)
  ti = u.cast(dtypes.int64)
  t = ti.cast(dt)
  if mode == "trunc": r = t
  elif mode == "floor": r = u.alu(Ops.CMPLT, t).where(t - one, t)
  elif mode == "ceil": r = t.alu(Ops.CMPLT, u).where(t + one, t)
  else:
    fi = u.alu(Ops.CMPLT, t).where(ti - UOp.const(dtypes.int64, 1), ti)
    f = fi.cast(dt)
    frac, half = u - f, UOp.const(dt, 0.5)  # exact: f is u's integer part
    odd = fi.alu(Ops.AND, UOp.const(dtypes.int64, 1)).alu(Ops.CMPNE, UOp.const(dtypes.int64, 0))
    up = half.alu(Ops.CMPLT, frac).alu(Ops.OR, _not(frac.alu(Ops.CMPNE, half)).alu(Ops.AND, odd))
    r = up.where(f + one, f)
  r = _abs_uop(u).alu(Ops.CMPLT, UOp.const(dt, 2.0 ** dtypes.finfo(dt)[1])).where(r, u)
  negative = u.bitcast(_SIGNED_OF_SIZE[dt.itemsize]).alu(Ops.CMPLT, UOp.const(_SIGNED_OF_SIZE[dt.itemsize], 0))
  return _eq_const(r, 0).where(negative.where(UOp.const(dt, -0.0), UOp.const(dt, 0.0)), r)


def _shift(op: Ops, a, b) -> Expr:
  """numpy's left_shift and right_shift: both operands promote to one int dtype (bool to int8). A shift by the bit
  width or more, or by a negative amount, gives 0 (and -1 for a negative int shifted right), as numpy does; C leaves
  those undefined, so the kernel shifts only by amounts in range."""
  name = "left_shift" if op is Ops.SHL else "right_shift"
  dt = _result_dtype((a, b))
  if dtypes.is_float(dt): raise DTypeError(f"{name} needs bool or int operands, got {dt.name}")
  if dt == dtypes.bool: dt = dtypes.int8
  def fn(x: UOp, y: UOp) -> UOp:
    zero = UOp.const(dt, 0)
    ok = y.alu(Ops.CMPLT, UOp.const(dt, dt.itemsize * 8))
    if not dtypes.is_unsigned(dt): ok = ok.alu(Ops.AND, _not(y.alu(Ops.CMPLT, zero)))
    sign_fill = op is Ops.SHR and not dtypes.is_unsigned(dt)
    fill = x.alu(Ops.CMPLT, zero).where(UOp.const(dt, -1), zero) if sign_fill else zero
    return ok.where(x.alu(op, ok.where(y, zero)), fill)
  return _build(name, (a, b), fn, dt)


def _arg_extreme(x: Expr, axis, keepdims: bool, largest: bool) -> Expr:
  """argmax / argmin in one kernel: two fused reduces along the axis, the extreme value (NaN-propagating), then the
  largest n-1-index (a POSITION leaf: the loop index) among the elements that equal it or are NaN: the first one."""
  name = "argmax" if largest else "argmin"
  if axis is None:
    flat = _arg_extreme(x.reshape(-1), 0, False, largest)
    return flat.reshape((1,) * x.ndim) if keepdims else flat
  a = _axes(axis, x.ndim, name)[0] if isinstance(axis, int) and not isinstance(axis, bool) else \
      _refuse(f"{name} takes one axis (an int) or None, got {axis!r}")
  n = x.shape[a]
  if not isinstance(n, int): raise InvalidASTError(f"{name} over a symbolic axis of {fmt_shape(x.shape)}")
  # the order-reversing map of each kind turns argmin into argmax (as min is built from max); bools compare as uint8
  key = x.cast(dtypes.uint8) if dtypes.is_bool(x.dtype) else x
  if not largest: key = -key if dtypes.is_float(key.dtype) else ~key
  index = position(n).reshape((1,) * a + (n,) + (1,) * (x.ndim - a - 1))
  top = key.max(a, keepdims=True)
  hit = key == top
  if dtypes.is_float(key.dtype): hit = hit | key.isnan()
  return (n - 1) - where(hit, (n - 1) - index, -1).max(a, keepdims)


def position(n: int) -> Expr:
  """0, 1, ..., n-1 as int64: the offset of each element in a contiguous (n,) view (a POSITION leaf), which a kernel
  computes from its loop indices as it computes a load's address, reading nothing."""
  return Expr(UOp(Ops.POSITION, dtypes.int64, (ShapeTracker.from_shape((n,)).to_uop(),)), (n,))


def _refuse(msg: str):
  raise InvalidASTError(msg)


def _truth(x: Expr) -> Expr:
  """numpy's truth of any dtype: nonzero."""
  return x if dtypes.is_bool(x.dtype) else x != 0


def _pow(a, b) -> Expr:
  """numpy's power. An int exponent is repeated multiplication (by squaring); a float exponent is exp2(b * log2|a|)
  with C's (and numpy's) special cases: x ** 0 and 1 ** y are 1 (NaN included), (-1) ** +-inf is 1, a negative base
  (or -0.0) gives a negative result for an odd integer exponent and NaN for a non-integer one (but -inf's are infs and
  zeros). half, bfloat16 and fp8 compute in float32 and round once, as numpy does: log2(0) = -inf on the way to
  0 ** 1.5 has no fp8e4m3 encoding, and x*x*x rounds twice in half."""
  if isinstance(a, Expr) and P.is_strong(b):
    # a numpy scalar exponent (np.power and ** alike) is strong: the base takes the promoted dtype, then the power is
    # a Python scalar's
    a, b = a.cast(_result_dtype((a, b))), int(_value(b)) if P.kind(b) == P.BOOL else _value(b)
  if isinstance(b, int) and not isinstance(b, bool) and isinstance(a, Expr):
    dt = a.dtype if not dtypes.is_bool(a.dtype) else dtypes.int8  # numpy: bool ** int is int8
    P.check_fits(b, dt) if dtypes.is_int(dt) else None
    if b < 0 and not dtypes.is_float(dt): raise InvalidASTError(f"integers to negative integer powers are not allowed ({dt.name} ** {b})")
    x = a.cast(dt)
    if b == 0:  # x < x is False for every x, NaN included: x ** 0 is 1 everywhere
      return _unary_uop(x, lambda u: u.alu(Ops.CMPLT, u).where(UOp.const(dt, 0), UOp.const(dt, 1)))
    wide = dtypes.float32 if dtypes.is_float(dt) and dt.itemsize < dtypes.float32.itemsize else dt
    out = _power_by_squaring(x.cast(wide), builtins.abs(b))
    return (out.recip() if b < 0 else out).cast(dt)
  if isinstance(b, float) and isinstance(a, Expr) and builtins.abs(b) <= 64 and b == int(b):
    return _pow(a.cast(P.result_dtype([a.dtype], [b])), int(b))
  if isinstance(b, float) and b == 0.5 and isinstance(a, Expr) and (r := P.result_dtype([a.dtype], [b])).np is not None:
    return a.cast(r).sqrt()  # numpy's own floats take ** 0.5 as sqrt: (-0.0) ** 0.5 is -0.0, (-inf) ** 0.5 NaN
  dt = _result_dtype((a, b))
  if not dtypes.is_float(dt):
    return _build("power", (a, b), _int_power, dtypes.int8 if dt == dtypes.bool else dt)
  wide = dtypes.float32 if dt.itemsize < dtypes.float32.itemsize else dt

  def fn(x: UOp, y: UOp) -> UOp:
    x, y = x.cast(wide), y.cast(wide)
    ax, ay = (x < 0).where(-x, x), (y < 0).where(-y, y)
    mag = (y * ax.log2()).exp2()
    # from 2**mantissa on every float is an integer, and from 2**(mantissa+1) on an even one (infs count as even):
    # only below that is y's int64 conversion needed, and defined
    mant = dtypes.finfo(wide)[1]
    yi = y.cast(dtypes.int64)
    integral = (ay < 2.0 ** mant).logical_not() | yi.cast(wide).eq(y)
    odd = (ay < 2.0 ** (mant + 1)) & (yi & 1).ne(0)
    signed = (x < 0) | (x.recip() < 0)  # the sign bit: negative or -0.0 (1/-0.0 is -inf)
    out = (signed & integral & odd).where(-mag, mag)
    out = ((x < 0) & x.ne(-math.inf) & integral.logical_not()).where(math.nan, out)
    one = y.eq(0) | x.eq(1) | (ax.eq(1) & ay.eq(math.inf))
    return one.where(1.0, out).cast(dt)
  return _build("power", (a, b), fn, dt)


def _int_power(x: UOp, y: UOp) -> UOp:
  """An int array to int array powers, as numpy computes it: squaring, with each bit of the exponent choosing whether
  its square multiplies in (wrapping as numpy's ints wrap). A negative exponent, where numpy raises at run time, is
  C's integer power: 1 for a base of 1, -1 or 1 by the exponent's parity for -1, else 0 (docs/AST.md)."""
  dt = y.dtype
  zero, one = UOp.const(dt, 0), UOp.const(dt, 1)
  out, square = one, x
  for bit in range(dt.itemsize * 8 - (0 if dtypes.is_unsigned(dt) else 1)):
    chosen = (y >> UOp.const(dt, bit)).alu(Ops.AND, one).alu(Ops.CMPNE, zero)
    out = chosen.where(out * square, out)
    square = square * square
  if dtypes.is_unsigned(dt): return out
  odd = y.alu(Ops.AND, one).alu(Ops.CMPNE, zero)
  minus_one = odd.where(UOp.const(dt, -1), one)
  negative = _eq_const(x, 1).where(one, _eq_const(x, -1).where(minus_one, zero))
  return y.alu(Ops.CMPLT, zero).where(negative, out)


def _power_by_squaring(x: Expr, n: int) -> Expr:
  out, sq = None, x
  while n:
    if n & 1: out = sq if out is None else out * sq
    n >>= 1
    if n: sq = sq * sq
  return out


# ***** numpy's module functions *****

def where(cond, a, b) -> Expr:
  """numpy.where(cond, a, b): cond is true where nonzero; a and b promote as numpy's operands do."""
  if not isinstance(cond, Expr): raise InvalidASTError(f"where needs a kc.ast expression as the condition, got {type(cond).__name__}")
  cond = _truth(cond)
  dt = _result_dtype((a, b))
  ops, _ = _operands("where", (cond, a, b))
  c, a, b = ops
  u = [x.uop.cast(dt) if isinstance(x, Expr) else UOp.const(dt, _value(x)) for x in (a, b)]
  return Expr(c.uop.alu(Ops.WHERE, *u), c.kshape, c.hidden)


def maximum(a, b) -> Expr:
  if _result_dtype((a, b)) == dtypes.bool: return _elementwise(Ops.OR, a, b)
  return _elementwise(Ops.MAX, a, b)


def minimum(a, b) -> Expr:
  dt = _result_dtype((a, b))
  if dt == dtypes.bool: return _elementwise(Ops.AND, a, b)
  rev = (lambda u: u.alu(Ops.NEG)) if dtypes.is_float(dt) else \
        (lambda u: u.alu(Ops.XOR, UOp.const(dt, dtypes.max(dt) if dtypes.is_unsigned(dt) else -1)))
  return _build("minimum", (a, b), lambda x, y: rev(rev(x).alu(Ops.MAX, rev(y))), dt)


def clip(x: Expr, lo=None, hi=None) -> Expr:
  """numpy.clip: minimum(maximum(x, lo), hi)."""
  if lo is None and hi is None: raise InvalidASTError("clip needs lo or hi")
  out = x if lo is None else maximum(x, lo)
  return out if hi is None else minimum(out, hi)


def logical_not(x: Expr) -> Expr: return x.logical_not() if isinstance(x, Expr) else _no_expr("logical_not", x)
def logical_and(a, b) -> Expr: return _elementwise(Ops.AND, *_truths(a, b))
def logical_or(a, b) -> Expr: return _elementwise(Ops.OR, *_truths(a, b))
def logical_xor(a, b) -> Expr: return _elementwise(Ops.CMPNE, *_truths(a, b))


def _truths(*xs):
  return [_truth(x) if isinstance(x, Expr) else bool(x) if isinstance(x, _SCALARS) else x for x in xs]


def _no_expr(name: str, x):
  raise InvalidASTError(f"{name} needs a kc.ast expression, got {type(x).__name__} {x!r}")


def matmul(a, b) -> Expr:
  """numpy.matmul: 2-D, batched (batch dims broadcast) and 1-D operands (a vector loses its axis in the result)."""
  if not (isinstance(a, Expr) and isinstance(b, Expr)): raise InvalidASTError("matmul needs two kc.ast expressions")
  if a.ndim == 0 or b.ndim == 0: raise InvalidASTError("matmul: 0-d operands are not allowed (use *)")
  va, vb = a.ndim == 1, b.ndim == 1
  x = a.reshape((1,) + a.shape) if va else a
  y = b.reshape(b.shape + (1,)) if vb else b
  if x.shape[-1] != y.shape[-2]:
    raise InvalidASTError(f"matmul: {fmt_shape(a.shape)} @ {fmt_shape(b.shape)}: the contracted dims {x.shape[-1]} and {y.shape[-2]} differ")
  dt = _result_dtype((a, b))
  x, y = x.cast(dt).reshape(x.shape[:-1] + (x.shape[-1], 1)), y.cast(dt).reshape(y.shape[:-2] + (1,) + y.shape[-2:])
  if dt == dtypes.bool: out = (x & y).max(-2)
  else:  # the products and their sum in the accumulation dtype, rounded once (half * half is exact in float32)
    acc = P.ACCUMULATE.get(dt, dt)
    out = (x.cast(acc) * y.cast(acc))._reduce(Ops.ADD, -2, False, acc).cast(dt)
  shape = out.shape
  if va: shape = shape[:-2] + shape[-1:]
  if vb: shape = shape[:-1]
  return out.reshape(shape)


def _method(name: str):
  def fn(x, *args, **kw):
    if not isinstance(x, Expr): _no_expr(name, x)
    return getattr(x, name)(*args, **kw)
  fn.__name__, fn.__doc__ = name, f"numpy.{name} as a function: x.{name}(...)"
  return fn


exp, log, exp2, log2, sqrt, sin, cos = (_method(n) for n in ("exp", "log", "exp2", "log2", "sqrt", "sin", "cos"))
tanh, sigmoid, square, sign, reciprocal = (_method(n) for n in ("tanh", "sigmoid", "square", "sign", "reciprocal"))
floor, ceil, trunc, rint, around = (_method(n) for n in ("floor", "ceil", "trunc", "rint", "round"))
isnan, isinf, isfinite = (_method(n) for n in ("isnan", "isinf", "isfinite"))
var, std, argmax, argmin = (_method(n) for n in ("var", "std", "argmax", "argmin"))
squeeze, ravel, astype = (_method(n) for n in ("squeeze", "ravel", "astype"))
transpose, reshape = _method("transpose"), _method("reshape")
round = around  # noqa: A001  (numpy's name; this module calls builtins.round if it ever needs Python's)


def left_shift(a, b) -> Expr: return _shift(Ops.SHL, a, b)
def right_shift(a, b) -> Expr: return _shift(Ops.SHR, a, b)
# numpy's names; they shadow the builtins inside this module, which therefore calls builtins.max etc. explicitly
abs, sum, prod, mean = (_method(n) for n in ("abs", "sum", "prod", "mean"))  # noqa: A001
amax, amin = _method("max"), _method("min")
max, min = amax, amin  # noqa: A001


# ***** leaves and outputs *****

def arg(idx: int, dtype: DType, shape) -> Expr:
  """Buffer argument `idx`, read as a contiguous array of `shape`."""
  if not isinstance(idx, int) or isinstance(idx, bool) or idx < 0: raise InvalidASTError(f"a buffer index is a non-negative int, got {idx!r}")
  dtype, shape = _dtype(dtype), _shape(shape)
  buf = UOp(Ops.DEFINE_GLOBAL, _pointer(dtype, shape), (), idx)
  # the LOAD's arg is the declared shape: movement rewrites the view, the arg travels along, and a call checks the
  # caller's array against it (kc.runtime.arguments), not against the view a reshape left; codegen ignores it
  return Expr(UOp(Ops.LOAD, dtype, (buf, ShapeTracker.from_shape(shape).to_uop()), shape), shape)


def _pointer(dtype: DType, shape) -> DType:
  """The pointer type of a buffer argument, with the element count it was declared with where that is a number: a
  view of it (an index, a slice) cannot tell a call's checks how large the buffer is, the pointer can."""
  return dtype.ptr() if (n := _size(shape)) is None else dtype.ptr(size=n)


def const(value: Scalar, dtype: DType, shape) -> Expr:
  """A constant of `shape`: every element is `value`. It is VALID(view).where(value, 0), so a pad of it is 0 outside."""
  dtype, shape = _dtype(dtype), _shape(shape)
  if not isinstance(value, _SCALARS): raise InvalidASTError(f"a constant is a bool, int or float, got {value!r}")
  value = value.item() if isinstance(value, np.generic) else value
  P.check_fits(value, dtype)
  st = ShapeTracker.from_shape((1,) * len(shape)).expand(shape)
  valid = UOp(Ops.VALID, dtypes.bool, (st.to_uop(),))
  return Expr(valid.where(UOp.const(dtype, value), UOp.const(dtype, 0)), shape)


def store(idx: int, expr: Expr) -> UOp:
  """Write `expr` to buffer argument `idx`: its logical elements, contiguous, in order (the kernel view is its kernel
  shape, which differs from the logical one only by size-1 axes). A value read whole and in order from an
  intermediate (a reduce result reshaped) is stored as the value itself: the intermediate would be a copy."""
  if not isinstance(expr, Expr): raise InvalidASTError(f"store takes a kc.ast expression, got {type(expr).__name__}")
  if not isinstance(idx, int) or isinstance(idx, bool) or idx < 0: raise InvalidASTError(f"a buffer index is a non-negative int, got {idx!r}")
  value, view = expr.uop, ShapeTracker.from_shape(expr.kshape).to_uop()
  if value.op is Ops.LOAD and value.src[0].op is Ops.BUFFER and value.src[1].arg.contiguous and \
     value.src[1].arg.size == value.src[0].src[1].arg.size: value, view = value.src[0].src  # all of it, in order
  buf = UOp(Ops.DEFINE_GLOBAL, _pointer(expr.dtype, view.arg.shape), (), idx)
  # the arg is the logical (numpy) shape of what is stored: kc.run allocates its outputs in it; codegen ignores it
  return UOp(Ops.STORE, dtypes.void, (buf, view, value), tuple(expr.shape))


def _check_buffer_indices(stores) -> None:
  """A kernel's buffers are numbered 0..n-1, each index used: a call passes them in that order, so a gap has no
  argument to stand for (kc.compile would refuse it later, without saying which expression skipped it)."""
  used = sorted({u.arg for u in UOp(Ops.SINK, dtypes.void, tuple(stores)).toposort if u.op is Ops.DEFINE_GLOBAL})
  if missing := sorted(set(range(used[-1] + 1)) - set(used)):
    raise InvalidASTError(f"buffer index {missing[0]} is not used: a kernel's buffers are 0..n-1 with none missing, "
                          f"these stores and args use {used}; renumber the A.arg/A.store indices")


def sink(*stores: UOp) -> UOp:
  """The program: its STOREs, each to its own buffer index. kc.schedule decides its kernels (one where it can be
  one; the scheduling is checked here, so a program that cannot run fails when it is built)."""
  if not stores or not all(isinstance(s, UOp) and s.op is Ops.STORE for s in stores): raise InvalidASTError("sink takes one or more A.store(...)")
  idxs = [s.src[0].arg for s in stores]
  if len(set(idxs)) != len(idxs): raise InvalidASTError(f"two stores to the same buffer index: {idxs}")
  _check_buffer_indices(stores)
  out = UOp(Ops.SINK, dtypes.void, tuple(stores))
  _scheduler.schedule(out)
  return out


# ***** numpy's ufuncs and functions on expressions (__array_ufunc__, __array_function__) *****

def _divide(a, b) -> Expr: return _elementwise(Ops.FDIV, a, b, dtype_rule=P.divide_float)
def _unary(name: str): return lambda x: getattr(x, name)()


# numpy ufunc name -> kc.ast's op of the same meaning (numpy's aliases, np.abs and np.mod, are these ufuncs)
_UFUNCS = {
  "add": _add, "subtract": _sub, "multiply": _mul, "divide": _divide, "true_divide": _divide, "floor_divide": _floordiv,
  "remainder": _mod, "power": _pow, "matmul": matmul, "maximum": maximum, "minimum": minimum,
  "less": lambda a, b: _compare("<", a, b), "greater": lambda a, b: _compare(">", a, b),
  "less_equal": lambda a, b: _compare("<=", a, b), "greater_equal": lambda a, b: _compare(">=", a, b),
  "equal": lambda a, b: _compare("==", a, b), "not_equal": lambda a, b: _compare("!=", a, b),
  "logical_and": logical_and, "logical_or": logical_or, "logical_xor": logical_xor, "logical_not": logical_not,
  "bitwise_and": lambda a, b: _bitwise(Ops.AND, a, b), "bitwise_or": lambda a, b: _bitwise(Ops.OR, a, b),
  "bitwise_xor": lambda a, b: _bitwise(Ops.XOR, a, b), "invert": lambda x: ~x, "left_shift": left_shift,
  "right_shift": right_shift, "negative": _neg, "positive": lambda x: +x, "absolute": _unary("abs"),
  **{n: _unary(n) for n in ("exp", "exp2", "log", "log2", "sqrt", "sin", "cos", "tanh", "reciprocal", "square", "sign",
                            "floor", "ceil", "trunc", "rint", "isnan", "isinf", "isfinite")},
}
# ufunc.reduce(x, axis=0): the reduce of the same meaning
_UFUNC_REDUCES = {"add": "sum", "multiply": "prod", "maximum": "max", "minimum": "min", "logical_and": "all",
                  "logical_or": "any"}


def _numpy_operand(name: str, x):
  """What numpy handed an override: a 0-d array is numpy's scalar (strong); any other array is no expression."""
  if isinstance(x, np.ndarray):
    if x.ndim == 0: return x[()]
    raise DTypeError(f"numpy.{name}: {NDARRAY_OPERAND}; got an array of shape {x.shape}")
  return x


def _no_out(name: str, kwargs: dict) -> dict:
  """numpy's keywords that kc.ast has no counterpart for are refused, naming what to do instead."""
  kwargs = dict(kwargs)
  out = kwargs.pop("out", None)
  if out is not None and not (isinstance(out, tuple) and all(o is None for o in out)):
    raise DTypeError(f"numpy.{name}(..., out=...): a kc.ast expression is not written in place; store it with "
                     "A.store(idx, expr)")
  if kwargs.get("where", True) is not True:
    raise DTypeError(f"numpy.{name}(..., where=...): use A.where(cond, x, y) on the result")
  kwargs.pop("where", None)
  return kwargs


def _array_ufunc(ufunc, method: str, inputs, kwargs):
  name = ufunc.__name__
  inputs = [_numpy_operand(name, x) for x in inputs]
  kwargs = _no_out(name, kwargs)
  if method == "reduce" and name in _UFUNC_REDUCES:
    x, axis = inputs[0], kwargs.pop("axis", 0)
    return _call(f"{name}.reduce", getattr(x, _UFUNC_REDUCES[name]), (axis,), kwargs)
  if method != "__call__" or name not in _UFUNCS:
    what = f"numpy.{name}" + ("" if method == "__call__" else f".{method}")
    raise DTypeError(f"{what} has no kc.ast counterpart; docs/AST.md lists the numpy ufuncs and functions kc.ast "
                     "follows")
  if kwargs:
    raise DTypeError(f"numpy.{name}(..., {', '.join(f'{k}=' for k in kwargs)}) has no kc.ast counterpart; cast the "
                     f"operands with .astype and call numpy.{name} with operands only")
  return _UFUNCS[name](*inputs)


def _call(name: str, fn, args, kwargs):
  """fn(*args, **kwargs), where a keyword or argument fn does not take is numpy's TypeError (a DTypeError) naming it."""
  import inspect
  try: inspect.signature(fn).bind(*args, **kwargs)
  except TypeError as e:
    raise DTypeError(f"numpy.{name} with these arguments has no kc.ast counterpart ({e}); docs/AST.md lists what "
                     "kc.ast takes") from None
  return fn(*args, **kwargs)


def _sliding_window_view(x, window_shape, axis=None, **kwargs) -> Expr:
  """numpy.lib.stride_tricks.sliding_window_view: windows along each of `axis` (all axes when None) in turn."""
  if kwargs.get("subok") or kwargs.get("writeable"):
    raise DTypeError("sliding_window_view: kc.ast windows are read-only views")
  sizes = (window_shape,) if isinstance(window_shape, int) else tuple(window_shape)
  # the axes of the input as given: each window adds an axis at the end, so negative axes are resolved first
  axes = _axes(axis, x.ndim, "sliding_window_view")
  if len(sizes) != len(axes):
    raise InvalidASTError(f"sliding_window_view: {len(sizes)} window sizes for the axes {axes}")
  for a, n in zip(axes, sizes): x = x.windows(a, n)
  return x


def _np_clip(x, a_min=None, a_max=None, **kwargs) -> Expr:
  lo, hi = kwargs.pop("min", a_min), kwargs.pop("max", a_max)
  if kwargs: raise DTypeError(f"numpy.clip(..., {', '.join(kwargs)}=) has no kc.ast counterpart")
  return clip(x, lo, hi)


def _np_reshape(x, shape=None, order="C", *, newshape=None, copy=None) -> Expr:
  if order != "C": raise DTypeError(f"numpy.reshape(..., order={order!r}): kc.ast reshapes in C order only")
  return x.reshape(newshape if shape is None else shape)


def _np_transpose(x, axes=None) -> Expr: return x.T if axes is None else x.permute(axes)


def _np_where(cond, *xy) -> Expr:
  if len(xy) != 2:
    raise DTypeError("numpy.where(cond) with one argument returns indices, which kc.ast has no value for; use "
                     "where(cond, x, y)")
  return where(cond, *xy)


def _np_flip(x, axis=None) -> Expr: return x.flip(axis)


def _np_ravel(x, order="C") -> Expr:
  if order != "C": raise DTypeError(f"numpy.ravel(..., order={order!r}): kc.ast flattens in C order only")
  return x.ravel()


def _functions() -> dict:
  """numpy function -> kc.ast's of the same meaning (keywords as numpy's: the methods take numpy's names)."""
  table = {np.sum: "sum", np.prod: "prod", np.max: "max", np.amax: "max", np.min: "min", np.amin: "min",
           np.mean: "mean", np.var: "var", np.std: "std", np.any: "any", np.all: "all", np.argmax: "argmax",
           np.argmin: "argmin", np.squeeze: "squeeze", np.round: "round", np.around: "round", np.broadcast_to: "expand"}
  if hasattr(np, "astype"): table[np.astype] = "astype"  # numpy >= 2.1
  out = {f: getattr(Expr, name) for f, name in table.items()}
  out.update({np.where: _np_where, np.clip: _np_clip, np.reshape: _np_reshape, np.transpose: _np_transpose,
              np.flip: _np_flip, np.ravel: _np_ravel, np.lib.stride_tricks.sliding_window_view: _sliding_window_view,
              np.shape: lambda x: x.shape, np.ndim: lambda x: x.ndim, np.size: lambda x: x.size})
  return out


_FUNCTIONS = _functions()


def implements(*funcs):
  """Register the decorated function as kc.ast's override of the numpy functions `funcs` on expressions (numpy's NEP 18
  pattern): kc.ast.scan and kc.ast.joining, which build on this module, add theirs."""
  def register(fn):
    for f in funcs: _FUNCTIONS[f] = fn
    return fn
  return register


def _array_function(func, args, kwargs):
  name = getattr(func, "__name__", repr(func))
  args = [_numpy_operand(name, x) for x in args]
  if (fn := _FUNCTIONS.get(func)) is None:
    raise DTypeError(f"numpy.{name} has no kc.ast counterpart; docs/AST.md lists the numpy functions kc.ast follows "
                     "(build it from those, or compute it on the host from kc.run's outputs)")
  if not isinstance(args[0], Expr) and not (func in (np.concatenate, np.stack) and isinstance(args[0], (list, tuple))):
    raise DTypeError(f"numpy.{name}: the first argument is not a kc.ast expression: {type(args[0]).__name__}")
  return _call(name, fn, args, _no_out(name, kwargs))

