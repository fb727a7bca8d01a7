"""ShapeTracker: a stack of Views that records movement ops on a buffer without copying it.

views[0] addresses the buffer; each later view addresses the previous one as if that were a contiguous array of
its shape. Most movement ops rewrite the last view in place; a reshape that one view cannot express stacks a new
view, and simplify() collapses neighbours back into one where View composition allows. The Kernel asks a tracker
for its shape, its real strides and masks, and finally for one index expression with a validity condition."""
from __future__ import annotations
import functools, operator
from dataclasses import dataclass
from typing import Optional, Sequence
from kc.ir.dtype import dtypes
from kc.errors import ShapeError, SymbolicError
from kc.ir.symbolic import split_sum, ssimplify, sym_infer
from kc.ir.uop import Ops, UOp, sint
from kc.shape.view import View, as_shape, hash_once, state_without_hash, fmt_shape, normalize_axes, same_size, strides_for_shape, unravel

# bounded: a long search compiles thousands of kernels and must not keep every view and index it ever built
CACHE_SIZE = 1 << 14

__all__ = ["ShapeTracker", "axis_ranges"]


@functools.lru_cache(maxsize=CACHE_SIZE)
def axis_ranges(shape: tuple[sint, ...]) -> tuple[UOp, ...]:
  """One RANGE per dim, numbered by axis: the placeholders the index over a whole tracker is built on (real_strides,
  axis_is_masked and the lowering read it back or put values in for them)."""
  return tuple(UOp.range(dtypes.int32, 0, s, i) for i, s in enumerate(shape))


@functools.lru_cache(maxsize=CACHE_SIZE)
def _indexed(views: tuple[View, ...], idxs: tuple[UOp, ...]) -> tuple[UOp, UOp]:
  views = ShapeTracker(views).simplify().views  # every view collapsed away is a layer of divisions saved
  idx, valid = views[-1].to_indexed_uops(idxs)
  for view in reversed(views[:-1]):
    view = view.minify()  # fewer dims: fewer divisions to unravel the flat index
    idx, valid = view.to_indexed_uops(unravel(view.shape, idx.simplify()), valid)
  return idx.simplify(), valid.simplify()


def _range_axes(u: UOp) -> set[int]: return {x.arg for x in u.toposort if x.op is Ops.RANGE}


@functools.lru_cache(maxsize=CACHE_SIZE)
def _masked_axes(views: tuple[View, ...]) -> frozenset[int]:
  if len(views) == 1 and (mask := views[0].mask) is None: return frozenset()
  if len(views) == 1 and all(isinstance(x, int) for m in mask for x in m):
    # a canonical mask only narrows axes it really cuts: those are the axes the validity reads (none when it is empty)
    if any(b >= e for b, e in mask): return frozenset()
    return frozenset(i for i, ((b, e), s) in enumerate(zip(mask, views[0].shape)) if b != 0 or e != s)
  return frozenset(_range_axes(_indexed(views, axis_ranges(views[-1].shape))[1]))


@functools.lru_cache(maxsize=CACHE_SIZE)
def _real_strides(views: tuple[View, ...], ignore_valid: bool) -> tuple[Optional[sint], ...]:
  if len(simple := ShapeTracker(views).simplify().views) == 1:
    # one view's index is its offset plus a stride per axis: its strides, but where a mask makes the axis unknown
    # (a padded input's strides, which the Kernel asks of every buffer, without building and simplifying its index)
    if simple[0].mask is None: return simple[0].strides
    unknown = frozenset() if ignore_valid else _masked_axes(views)
    return tuple(None if i in unknown else st for i, st in enumerate(simple[0].strides))
  return _strides_from_index(views, ignore_valid)


def _strides_from_index(views: tuple[View, ...], ignore_valid: bool) -> tuple[Optional[sint], ...]:
  """_real_strides read off the simplified index over a RANGE per axis: the coefficient of each axis's RANGE."""
  shape = views[-1].shape
  idx, _ = _indexed(views, axis_ranges(shape))
  ret: list[Optional[sint]] = [0] * len(shape)  # an axis the index does not use has stride 0
  unknown: set[int] = set() if ignore_valid else set(_masked_axes(views))
  for term, coef in split_sum(idx)[0].items():
    if term.op is Ops.RANGE: ret[term.arg] = coef
    elif term.op is Ops.MUL and (ax := _symbolic_stride(term)) is not None: ret[ax[0]] = ssimplify(ax[1] * coef)
    else: unknown |= _range_axes(term)  # the axis is inside a // or %: no single stride
  return tuple(None if i in unknown else (0 if s == 1 else st) for i, (st, s) in enumerate(zip(ret, shape)))


@dataclass(frozen=True)
class ShapeTracker:
  views: tuple[View, ...]

  def __hash__(self) -> int: return hash_once(self)
  def __getstate__(self): return state_without_hash(self)

  def __post_init__(self):
    if not isinstance(self.views, tuple) or not self.views or not all(isinstance(v, View) for v in self.views):
      raise ShapeError(f"a ShapeTracker is a non-empty tuple of Views, got {self.views!r}")

  @staticmethod
  def from_shape(shape) -> ShapeTracker:
    """The tracker of a contiguous buffer of this shape."""
    return ShapeTracker((View.create(as_shape(shape, "from_shape")),))

  # ***** what the tracker looks like *****

  @property
  def shape(self) -> tuple[sint, ...]: return self.views[-1].shape

  @property
  def ndim(self) -> int: return len(self.shape)

  @property
  def size(self) -> int:
    """Number of elements of the shape (symbolic dims at their largest value)."""
    return self.views[-1].size()

  @property
  def contiguous(self) -> bool: return len(self.views) == 1 and self.views[0].contiguous

  @property
  def consecutive(self) -> bool:
    """One unmasked view with row-major strides (the offset may be anything)."""
    return len(self.views) == 1 and (v := self.views[0]).mask is None and v.strides == strides_for_shape(v.shape)

  def reduce(self, axes) -> tuple[sint, ...]:
    """The shape after reducing over `axes` (they become 1)."""
    axes = normalize_axes(axes, self.ndim, "reduce", self.shape)
    return tuple(1 if i in axes else s for i, s in enumerate(self.shape))

  def vars(self) -> set[UOp]:
    """The Variables of the shapes, strides, offsets and masks (unbound)."""
    return {v.src[0] if v.op is Ops.BIND else v for view in self.views for v in view.vars()}

  @property
  def var_vals(self) -> dict[UOp, int]:
    """The values of the bound Variables, by Variable."""
    return dict(v.unbind() for view in self.views for v in view.vars() if v.op is Ops.BIND)

  def unbind(self) -> tuple[ShapeTracker, dict[UOp, int]]:
    """This tracker with bound Variables replaced by the Variables themselves, and their values."""
    bound = {v: v.src[0] for view in self.views for v in view.vars() if v.op is Ops.BIND}
    return ShapeTracker(tuple(v.substitute(bound) for v in self.views)), self.var_vals

  def to_uop(self) -> UOp: return UOp(Ops.VIEW, dtypes.void, (), self)

  def __repr__(self) -> str: return f"ShapeTracker(views={self.views!r})"

  # ***** index expressions and what the Kernel reads from them *****

  def to_indexed_uops(self, idxs: Optional[Sequence[UOp]] = None) -> tuple[UOp, UOp]:
    """(index, valid): the buffer offset and whether it is a real element, at the coordinates `idxs` (one int32
    UOp per dim; by default a RANGE per axis), simplified. valid is the bool constant True where nothing is masked."""
    if idxs is None: idxs = axis_ranges(self.shape)
    idxs = tuple(idxs)
    if len(idxs) != self.ndim or not all(isinstance(i, UOp) and dtypes.is_int(i.dtype) for i in idxs):
      raise ShapeError(f"to_indexed_uops: needs one integer UOp per dim of shape {fmt_shape(self.shape)}, got {len(idxs)} indices")
    return _indexed(self.views, idxs)

  def real_strides(self, ignore_valid: bool = False) -> tuple[Optional[sint], ...]:
    """The stride of each axis in the buffer: how far one step along it moves the offset, everywhere. None where that
    is not one number (the axis is unravelled through a division or modulo) or, unless ignore_valid, where the axis
    is masked."""
    return _real_strides(self.views, ignore_valid)

  def unit_stride_axes(self, ignore_valid: bool = False) -> list[int]:
    return [i for i, st in enumerate(self.real_strides(ignore_valid)) if isinstance(st, int) and st == 1]

  def axis_is_masked(self, axis: int) -> bool:
    """Whether the validity condition depends on this axis."""
    (axis,) = normalize_axes((axis,), self.ndim, "axis_is_masked", self.shape)
    return axis in _masked_axes(self.views)

  def real_size(self) -> int:
    """How many buffer elements this tracker needs: one past the largest offset it reads where valid."""
    if any(isinstance(s, int) and s == 0 for s in self.shape): return 0
    first = self.views[0]
    if first.is_void: return 0
    if first.mask is not None: first = first.shrink(first.mask)
    if all(isinstance(x, int) for x in (*first.shape, *first.strides, first.offset)):  # a box: the largest offset in closed form
      return first.offset + sum((s - 1) * st for s, st in zip(first.shape, first.strides) if st > 0) + 1
    idx, _ = first.to_indexed_uops(axis_ranges(first.shape))
    return int(idx.simplify().vmax) + 1

  def offset_of(self, coords: Sequence[int], var_vals: Optional[dict] = None) -> Optional[int]:
    """The flat element offset into the buffer at integer `coords`, None where the position is padding. Symbolic
    dims take their values from `var_vals` ({Variable or name: int}) or from their binding."""
    def ev(x: sint) -> int:
      if isinstance(x, int): return x
      try: return int(sym_infer(x, var_vals or {}))
      except SymbolicError as e: raise ShapeError(f"offset_of on shape {fmt_shape(self.shape)} needs concrete values: {e}") from None
    try: coords = tuple(operator.index(c) for c in coords)
    except TypeError: raise ShapeError(f"offset_of: coordinates must be ints, got {coords!r}") from None
    shape = tuple(ev(s) for s in self.shape)
    if len(coords) != len(shape) or not all(0 <= c < s for c, s in zip(coords, shape)):
      raise ShapeError(f"offset_of: {coords!r} is not a position in shape {fmt_shape(shape)}")
    off = self.views[-1].offset_of(coords, ev)
    for view in reversed(self.views[:-1]):
      if off is None: return None
      off = view.offset_of(tuple(unravel(tuple(ev(s) for s in view.shape), off)), ev)
    return off

  # ***** simplification *****

  def simplify(self) -> ShapeTracker:
    """Collapse the last two views into one while View composition can."""
    views = self.views
    while len(views) >= 2 and (merged := views[-2] + views[-1]) is not None: views = views[:-2] + (merged,)
    return self if views is self.views else ShapeTracker(views)

  def __add__(self, other: ShapeTracker) -> ShapeTracker:
    """`other` applied on top of this tracker (other's views index this tracker's shape)."""
    if not same_size(other.views[0].shape, self.shape):
      raise ShapeError(f"cannot stack a tracker over shape {fmt_shape(other.views[0].shape)} on one of shape {fmt_shape(self.shape)}")
    ret = self if other.views[0].shape == self.shape else self.reshape(other.views[0].shape)
    for v in other.views: ret = ShapeTracker(ret.views + (v,)).simplify()
    return ret

  # ***** movement ops *****

  def _with_last(self, view: View) -> ShapeTracker: return ShapeTracker(self.views[:-1] + (view,))

  def reshape(self, shape) -> ShapeTracker:
    new_shape = as_shape(shape, "reshape")
    if (view := self.views[-1].reshape(new_shape)) is not None:
      # a contiguous last view of the previous view's shape is the identity: drop it (reshape round trips)
      if len(self.views) >= 2 and view.contiguous and view.shape == self.views[-2].shape: return ShapeTracker(self.views[:-1])
      return self._with_last(view)
    return ShapeTracker(self.views + (View.create(new_shape),))

  def windows(self, axis: int, size: int) -> ShapeTracker:
    """`axis` (length n) replaced by (size, n - size + 1) overlapping windows: element (..., i, j, ...) is element
    (..., i + j, ...) of this tracker. One view over this tracker's shape (merged into it where it can be): the
    sliding windows of a convolution, without the repeat-and-reshape that needs several views."""
    (axis,) = normalize_axes((axis,), self.ndim, "windows", self.shape)
    n = self.shape[axis]
    if not isinstance(n, int) or not isinstance(size, int) or not 1 <= size <= n:
      raise ShapeError(f"windows of size {size!r} do not fit axis {axis} of length {n!r} in shape {fmt_shape(self.shape)}")
    strides = strides_for_shape(self.shape)
    view = View.create(self.shape[:axis] + (size, n - size + 1) + self.shape[axis + 1:], strides[:axis] + (strides[axis],) * 2 + strides[axis + 1:])
    return ShapeTracker(self.views + (view,)).simplify()

  def permute(self, order) -> ShapeTracker: return self._with_last(self.views[-1].permute(order))
  def expand(self, shape) -> ShapeTracker: return self._with_last(self.views[-1].expand(shape))
  def pad(self, arg) -> ShapeTracker: return self._with_last(self.views[-1].pad(arg))
  def shrink(self, arg) -> ShapeTracker: return self._with_last(self.views[-1].shrink(arg))
  def stride(self, mul) -> ShapeTracker: return self._with_last(self.views[-1].stride(mul))

  def flip(self, axes=None) -> ShapeTracker:
    """Reverse the given axes (numpy's np.flip: a tuple of axis indices, negatives from the end, None for all)."""
    return self._with_last(self.views[-1].flip(axes))


def _symbolic_stride(term: UOp) -> Optional[tuple[int, UOp]]:
  """(axis, stride) of a term RANGE * x where x is free of ranges (a symbolic stride), else None."""
  for r, x in (term.src, term.src[::-1]):
    if r.op is Ops.RANGE and not _range_axes(x): return r.arg, x
  return None
