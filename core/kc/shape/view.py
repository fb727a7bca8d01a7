"""View: one strided, offset, masked window onto a flat buffer, and the movement ops on it.

A View of shape S maps a coordinate i (0 <= i_d < S_d) to the buffer element offset + sum(i_d * strides_d),
valid only where mask_d[0] <= i_d < mask_d[1] for every d (no mask: everywhere). Views are canonical: the
stride of a size-1 dim is 0, a mask that covers everything is dropped, a dim masked down to one index gets
stride 0 (its one valid index is folded into the offset), and a view with no valid element at all is the
"void" view (strides 0, offset 0, every mask (0, 0)). Canonical views make equal windows compare equal, which
is what lets reshape and composition recognise what they can merge.

Dims, strides, offsets and mask bounds are sints: Python ints or kc symbolic integers (Variables and
expressions of them). Every op that needs a concrete value says so with a ShapeError."""
from __future__ import annotations
import functools, operator
from collections import Counter
from dataclasses import dataclass, fields
from typing import Optional, Sequence
from kc.ir.dtype import DType, dtypes
from kc.errors import ShapeError
from kc.helpers import all_int, ceildiv, prod
from kc.ir.symbolic import resolve, smax, smin, ssimplify
from kc.ir.uop import Ops, UOp, sint

# bounded: a long search compiles thousands of kernels and must not keep every view and index it ever built
CACHE_SIZE = 1 << 14

__all__ = ["View", "strides_for_shape", "unravel", "fmt_shape", "sint_to_uop"]

Mask = Optional[tuple[tuple[sint, sint], ...]]


# ***** sints: ints or symbolic integers *****

def fmt_shape(xs) -> str:
  """A shape (or any nest of sints) as text for error messages: Variables by name, not as UOp trees."""
  if isinstance(xs, UOp): return xs.render()
  if isinstance(xs, (tuple, list)): return "(" + ", ".join(fmt_shape(x) for x in xs) + ("," if len(xs) == 1 else "") + ")"
  return repr(xs)


def sint_to_uop(x: sint, dtype: DType = dtypes.int32) -> UOp:
  """A UOp of an sint in the index dtype: int32, or int64 in a kernel whose indices can leave int32's range
  (kc.codegen.lower.index_dtype decides)."""
  if isinstance(x, UOp): return x if x.dtype == dtype else x.cast(dtype)
  return UOp.const(dtype, x)


def _as_sint(x, op: str, what: str) -> sint:
  """Validate and canonicalize one user-given integer: an int (or anything with __index__, such as a numpy int)
  or an integer UOp; symbolic values come back simplified, a symbolic constant as a plain int."""
  if type(x) is int: return x
  if isinstance(x, UOp):
    if not dtypes.is_int(x.dtype): raise ShapeError(f"{op}: {what} {fmt_shape(x)} has dtype {x.dtype}, an integer is needed")
    return ssimplify(x)
  if isinstance(x, bool) or not hasattr(x, "__index__"):
    raise ShapeError(f"{op}: {what} {x!r} is neither an int nor a kc.Variable expression")
  try: return operator.index(x)
  except TypeError: raise ShapeError(f"{op}: {what} {x!r:.60} is neither an int nor a kc.Variable expression") from None


def _as_dim(x, op: str, shape) -> sint:
  x = _as_sint(x, op, "dimension")
  if (x.vmin if isinstance(x, UOp) else x) < 0:
    raise ShapeError(f"{op}: shape {fmt_shape(shape)} has a negative dimension {fmt_shape(x)}" +
                     (f" (its range is {x.vmin}..{x.vmax})" if isinstance(x, UOp) else ""))
  return x


def as_shape(shape, op: str) -> tuple[sint, ...]:
  """A validated shape tuple: non-negative ints or integer UOps whose range is non-negative."""
  if type(shape) is tuple and all(type(s) is int and s >= 0 for s in shape): return shape  # the usual case, already valid
  if isinstance(shape, (int, UOp)) and not isinstance(shape, bool): shape = (shape,)
  try: shape = tuple(shape)
  except TypeError: raise ShapeError(f"{op}: a shape is a tuple of dimensions, got {shape!r}") from None
  return tuple(_as_dim(s, op, shape) for s in shape)


def _is1(x: sint) -> bool: return isinstance(x, int) and x == 1
def _is0(x: sint) -> bool: return isinstance(x, int) and x == 0


def _same(a: sint, b: sint) -> bool:
  """a == b, decided without evaluating: ints by value, symbolic values structurally (UOps are hash-consed)."""
  a, b = ssimplify(a), ssimplify(b)
  return a == b if isinstance(a, int) and isinstance(b, int) else a is b


def provably_equal(a: sint, b: sint) -> bool:
  """True only where a == b for every value of the variables involved."""
  if _same(a, b): return True
  if isinstance(a, int) and isinstance(b, int): return False
  return not resolve(sint_to_uop(a).ne(sint_to_uop(b)), True)


def provably_le(a: sint, b: sint) -> bool:
  """True only where a <= b for every value of the variables involved."""
  if isinstance(a, int) and isinstance(b, int): return a <= b
  return _same(a, b) or resolve(sint_to_uop(a) <= sint_to_uop(b), False)


def same_size(a: tuple[sint, ...], b: tuple[sint, ...]) -> bool:
  """Whether two shapes provably hold the same number of elements. Symbolic dims that appear on both sides cancel
  (so (N, 4) and (4, N) agree without the simplifier having to order a product); the rest is left to it."""
  ia, ib = prod(x for x in a if isinstance(x, int)), prod(x for x in b if isinstance(x, int))
  if Counter(x for x in a if isinstance(x, UOp)) == Counter(x for x in b if isinstance(x, UOp)): return ia == ib
  return provably_equal(ssimplify(prod(a)), ssimplify(prod(b)))


def _hashable(x):
  if type(x) is tuple and all(type(y) is int for y in x): return x  # the usual argument: a shape or a permutation
  if isinstance(x, (UOp, str)) or not hasattr(x, "__iter__"): return x
  return tuple(_hashable(y) for y in x)


def _memo(fn):
  """Cache a movement op on (view, argument). Views are immutable and shared, so trackers that repeat the same
  chain of ops (the Kernel does, for every buffer) pay once; lists in the argument are made tuples for the key."""
  cached = functools.lru_cache(maxsize=CACHE_SIZE)(fn)
  @functools.wraps(fn)
  def wrapper(self, arg):
    key = _hashable(arg)
    try: hash(key)
    except TypeError: raise ShapeError(f"{fn.__name__}: cannot use {arg!r} as the argument of a movement op") from None
    return cached(self, key)
  return wrapper


# ***** helpers on shapes *****

def strides_for_shape(shape) -> tuple[sint, ...]:
  """Row-major strides of a contiguous buffer of this shape, canonical (0 for size-1 dims)."""
  return _strides_for_shape(shape if isinstance(shape, tuple) else as_shape(shape, "strides_for_shape"))


@functools.lru_cache(maxsize=CACHE_SIZE)
def _strides_for_shape(shape: tuple[sint, ...]) -> tuple[sint, ...]:
  strides, acc = [], 1
  for s in reversed(shape):
    strides.append(0 if _is1(s) else acc)
    acc = ssimplify(acc * s)
  return tuple(reversed(strides))


def unravel(shape: tuple[sint, ...], flat):
  """The coordinates of a row-major flat index (an int or a UOp). The outermost coordinate takes no modulo: the
  flat index of a valid element is below the size, and a modulo there only hides that from the simplifier."""
  out, acc = [], 1
  # a symbolic dim (an int32 Variable) takes the flat index's dtype (int64 in a kernel with wide indices)
  like = (lambda x: sint_to_uop(x, flat.dtype)) if isinstance(flat, UOp) else (lambda x: x)
  for i, d in enumerate(reversed(shape)):
    q = flat if _is1(acc) else flat // like(acc)
    out.append(q if i == len(shape) - 1 else q % like(d))
    acc = acc * d
  return out[::-1]


def _canonical_mask(mask, shape, op: str) -> Mask:
  if mask is None: return None
  try: mask = tuple((_as_sint(b, op, "mask bound"), _as_sint(e, op, "mask bound")) for b, e in mask)
  except (TypeError, ValueError): raise ShapeError(f"{op}: a mask is one (start, end) pair per dim, got {mask!r}") from None
  if len(mask) != len(shape): raise ShapeError(f"{op}: mask {fmt_shape(mask)} has {len(mask)} pairs for shape {fmt_shape(shape)}")
  for (b, e), s in zip(mask, shape):
    if isinstance(b, int) and b < 0 or all_int((e, s)) and e > s:
      raise ShapeError(f"{op}: mask {fmt_shape(mask)} reaches outside shape {fmt_shape(shape)}")
  return mask


def _is_empty(b: sint, e: sint) -> bool: return provably_le(e, b)
def _is_single(b: sint, e: sint) -> bool: return _same(ssimplify(e - b), 1)


# ***** View *****

# Views and trackers (frozen dataclasses) are memo keys everywhere: their hash is computed once and kept. It is never
# pickled, since UOps in the fields hash by identity, which another process does not share.
def hash_once(obj) -> int:
  if (h := obj.__dict__.get("_hash")) is None: object.__setattr__(obj, "_hash", h := hash(tuple(getattr(obj, f.name) for f in fields(obj))))
  return h


def state_without_hash(obj) -> dict: return {k: v for k, v in obj.__dict__.items() if k != "_hash"}



@dataclass(frozen=True)
class View:
  shape: tuple[sint, ...]
  strides: tuple[sint, ...]
  offset: sint
  mask: Mask
  contiguous: bool

  def __hash__(self) -> int: return hash_once(self)
  def __getstate__(self): return state_without_hash(self)

  @staticmethod
  def create(shape, strides=None, offset: sint = 0, mask=None) -> "View":
    """The canonical View of this window (see the module docstring); validates what it is given."""
    shape = as_shape(shape, "View.create")
    if strides is None: strides = strides_for_shape(shape)
    else:
      strides = tuple(_as_sint(s, "View.create", "stride") for s in strides)
      if len(strides) != len(shape): raise ShapeError(f"View.create: strides {fmt_shape(strides)} do not match shape {fmt_shape(shape)}")
    return _create(shape, strides, _as_sint(offset, "View.create", "offset"), _canonical_mask(mask, shape, "View.create"))

  @staticmethod
  def void(shape: tuple[sint, ...]) -> "View":
    """The view of this shape with no valid element (everything is padding). A 0-d view has no dim to hold the empty
    mask: it cannot be void, and a caller keeps such a view under another one instead."""
    if not len(shape): raise ShapeError("a 0-d view cannot be void: keep the masked view under the 0-d one")
    return View(shape, (0,) * len(shape), 0, ((0, 0),) * len(shape), False)

  @property
  def is_void(self) -> bool: return self.mask is not None and any(_is_empty(b, e) for b, e in self.mask)

  def size(self) -> int:
    """Number of elements of the shape; a symbolic dim counts at its largest value (an upper bound for buffers)."""
    return prod(s.vmax if isinstance(s, UOp) else s for s in self.shape)

  def vars(self) -> set[UOp]:
    flat = self.shape + self.strides + (self.offset,) + (tuple(x for m in self.mask for x in m) if self.mask else ())
    return {v for x in flat if isinstance(x, UOp) for v in x.toposort if v.op in (Ops.DEFINE_VAR, Ops.BIND)}

  def substitute(self, mapping: dict[UOp, UOp]) -> "View":
    def sub(x: sint) -> sint: return x.substitute(mapping) if isinstance(x, UOp) else x
    mask = tuple((sub(b), sub(e)) for b, e in self.mask) if self.mask is not None else None
    return View.create(tuple(map(sub, self.shape)), tuple(map(sub, self.strides)), sub(self.offset), mask)

  # ***** index expressions *****

  def to_indexed_uops(self, idxs: Sequence[UOp], valid: Optional[UOp] = None) -> tuple[UOp, UOp]:
    """(index, valid) of this view at the coordinates `idxs`, unsimplified; `valid` is and-ed onto what is given. The
    index is computed in the coordinates' dtype (int32, or int64 where indices are wide)."""
    dt = idxs[0].dtype if len(idxs) else dtypes.int32
    idx: Optional[UOp] = None if _is0(self.offset) else sint_to_uop(self.offset, dt)
    conds = [] if valid is None else [valid]
    for i, s, st, m in zip(idxs, self.shape, self.strides, self.mask or [None] * len(self.shape)):
      # a coordinate of 0 (an upcast lane the lowering puts 0 at) adds nothing: no term for the simplifier to fold
      if not _is1(s) and not _is0(st) and not (i.op is Ops.CONST and i.arg == 0):
        idx = i * sint_to_uop(st, dt) if idx is None else idx + i * sint_to_uop(st, dt)
      if m is not None:
        if not _is0(m[0]): conds.append(i >= sint_to_uop(m[0], dt))
        if not _same(m[1], s): conds.append(i < sint_to_uop(m[1], dt))
    return sint_to_uop(0, dt) if idx is None else idx, functools.reduce(operator.and_, conds) if conds else UOp.const(dtypes.bool, True)

  def offset_of(self, coords: Sequence[int], ev) -> Optional[int]:
    """The buffer offset at integer coords, None where masked; `ev` turns an sint into an int."""
    if self.mask is not None and not all(ev(b) <= c < ev(e) for c, (b, e) in zip(coords, self.mask)): return None
    return ev(self.offset) + sum(c * ev(st) for c, st in zip(coords, self.strides))

  # ***** movement ops: each returns a new View, or raises ShapeError naming the op and the shapes *****

  def _check_arity(self, op: str, arg) -> tuple:
    try: arg = tuple(arg)
    except TypeError: raise ShapeError(f"{op}: needs one entry per dim of shape {fmt_shape(self.shape)}, got {arg!r}") from None
    if len(arg) != len(self.shape):
      raise ShapeError(f"{op}: {fmt_shape(arg)} has {len(arg)} entries for the {len(self.shape)} dims of shape {fmt_shape(self.shape)}")
    return arg

  def _pairs(self, op: str, arg) -> tuple[tuple[sint, sint], ...]:
    arg = self._check_arity(op, arg)
    try: return tuple((_as_sint(b, op, "bound"), _as_sint(e, op, "bound")) for b, e in arg)
    except (TypeError, ValueError): raise ShapeError(f"{op}: needs one (before, after) pair per dim, got {arg!r}") from None

  def _resize(self, window: tuple[tuple[sint, sint], ...], mask: Mask = None) -> View:
    """The view of the window [b, e) of each dim (b may be negative and e past the end: pad); `mask` is the valid
    part of the new shape that the caller adds, and-ed with the old mask moved into the window."""
    new_shape = tuple(ssimplify(e - b) for b, e in window)
    offset = self.offset + sum(b * st for (b, _), st in zip(window, self.strides))
    if self.mask is not None:
      moved = tuple((smax(0, smin(mb - b, e - b)), smax(0, smin(me - b, e - b))) for (mb, me), (b, e) in zip(self.mask, window))
      mask = moved if mask is None else tuple((smax(b1, b2), smin(e1, e2)) for (b1, e1), (b2, e2) in zip(moved, mask))
    return _create(new_shape, self.strides, ssimplify(offset), mask)

  @_memo
  def pad(self, arg) -> View:
    arg = self._pairs("pad", arg)
    for b, e in arg:
      if not (provably_le(0, b) and provably_le(0, e)):
        raise ShapeError(f"pad: {fmt_shape(arg)} of shape {fmt_shape(self.shape)} has a negative amount")
    if all(_is0(b) and _is0(e) for b, e in arg): return self
    return self._resize(tuple((-b, s + e) for (b, e), s in zip(arg, self.shape)),
                        tuple((b, s + b) for (b, _), s in zip(arg, self.shape)))

  @_memo
  def shrink(self, arg) -> View:
    arg = self._pairs("shrink", arg)
    for (b, e), s in zip(arg, self.shape):
      if not (provably_le(0, b) and provably_le(b, e) and provably_le(e, s)):
        raise ShapeError(f"shrink: {fmt_shape(arg)} is out of bounds for shape {fmt_shape(self.shape)} (each dim needs 0 <= start <= end <= size)")
    if all(_is0(b) and _same(e, s) for (b, e), s in zip(arg, self.shape)): return self
    return self._resize(arg)

  @_memo
  def expand(self, new_shape) -> View:
    new_shape = as_shape(new_shape, "expand")
    if len(new_shape) != len(self.shape):
      raise ShapeError(f"expand: shape {fmt_shape(self.shape)} cannot expand to {fmt_shape(new_shape)}, which has another number of dims")
    for s, ns in zip(self.shape, new_shape):
      if not (_is1(s) or provably_equal(s, ns)):
        raise ShapeError(f"expand: shape {fmt_shape(self.shape)} cannot expand to {fmt_shape(new_shape)}: "
                         f"only size-1 dims expand, {fmt_shape(s)} is not 1")
    if any(_is0(s) for s in self.shape): return View.create(new_shape)
    if self.is_void: return View.void(new_shape)  # its (0, 0) masks must stay empty, not grow to (0, new size)
    # an expanded size-1 dim has stride 0 already; its mask (0, 1) grows to the new size
    mask = None if self.mask is None else tuple(m if _same(s, ns) else (0, ns) for m, s, ns in zip(self.mask, self.shape, new_shape))
    return _create(new_shape, self.strides, self.offset, mask)

  @_memo
  def permute(self, order) -> View:
    order = self._check_arity("permute", order)
    if all(hasattr(a, "__index__") and not isinstance(a, (bool, UOp)) for a in order): order = tuple(operator.index(a) for a in order)
    if not all_int(order) or sorted(order) != list(range(len(self.shape))):
      raise ShapeError(f"permute: {fmt_shape(order)} is not a permutation of the {len(self.shape)} dims of shape {fmt_shape(self.shape)}")
    return _create(tuple(self.shape[a] for a in order), tuple(self.strides[a] for a in order), self.offset,
                   tuple(self.mask[a] for a in order) if self.mask is not None else None)

  @_memo
  def stride(self, mul) -> View:
    """Every mul-th element of each dim (a negative mul walks backwards from the end, -1 flips)."""
    mul = self._check_arity("stride", mul)
    if not all(isinstance(m, int) and not isinstance(m, bool) and m != 0 for m in mul):
      raise ShapeError(f"stride: {mul!r} of shape {fmt_shape(self.shape)} must be non-zero ints")
    for s, m, mk in zip(self.shape, mul, self.mask or [(0, 0)] * len(mul)):
      if abs(m) != 1 and not all_int((s,) + tuple(mk)):
        raise ShapeError(f"stride: {mul!r} needs concrete sizes, shape {fmt_shape(self.shape)} is symbolic")
    shape = tuple(s if abs(m) == 1 else ceildiv(s, abs(m)) for s, m in zip(self.shape, mul))
    offset = self.offset + sum((s - 1) * st for s, st, m in zip(self.shape, self.strides, mul) if m < 0)
    mask = None
    if self.mask is not None:
      def moved(b, e, s, m):
        if m == 1: return b, e
        if m == -1: return ssimplify(s - e), ssimplify(s - b)
        return (ceildiv(b, m), ceildiv(e, m)) if m > 0 else (ceildiv(s - e, -m), ceildiv(s - b, -m))
      mask = tuple(moved(b, e, s, m) for (b, e), s, m in zip(self.mask, self.shape, mul))
    return _create(shape, tuple(st * m for st, m in zip(self.strides, mul)), ssimplify(offset), mask)

  def flip(self, axes) -> View:
    axes = normalize_axes(axes, len(self.shape), "flip", self.shape)
    return self.stride(tuple(-1 if i in axes else 1 for i in range(len(self.shape))))

  @_memo
  def reshape(self, new_shape) -> Optional[View]:
    """This view with another shape of the same size, or None where one view cannot express it (the caller then
    stacks a new view on top)."""
    new_shape = as_shape(new_shape, "reshape")
    if new_shape == self.shape: return self
    if not same_size(self.shape, new_shape):
      sizes = f"{fmt_shape(ssimplify(prod(self.shape)))} -> {fmt_shape(ssimplify(prod(new_shape)))}"
      raise ShapeError(f"reshape from {fmt_shape(self.shape)} to {fmt_shape(new_shape)} changes the size {sizes}" +
                       ("" if all_int(self.shape + new_shape) else " (or kc cannot prove the sizes equal)"))
    if any(_is0(s) for s in self.shape) or self.contiguous: return View.create(new_shape)
    if self.is_void:
      # a 0-d view has no dim to hold the empty mask: the caller keeps this view under a 0-d one, so it stays void
      return View.void(new_shape) if len(new_shape) else None
    if (split := _split_one(self, new_shape)) is not None: return split
    return _reshape_strided(self, new_shape)

  @functools.lru_cache(maxsize=CACHE_SIZE)  # noqa: B019
  def minify(self) -> View:
    """The same window with the fewest dims: neighbours that step through memory as one dim are merged. Inner views
    are minified before they are indexed, so that unravelling a flat index takes as few divisions as possible."""
    min_shape = tuple(r[0] for r in _runs(self))
    if len(min_shape) == len(self.shape): return self
    return self.reshape(min_shape) or self

  # ***** composition *****

  @functools.lru_cache(maxsize=CACHE_SIZE)  # noqa: B019  (views are immutable; composing the same pair again is free)
  def __add__(self, outer: View) -> Optional[View]:
    """The single view equal to `outer` looking at this view as if it were a contiguous buffer of this view's shape,
    or None where one view cannot express the pair."""
    inner = self
    if inner.contiguous: return outer
    if outer.contiguous and outer.shape == inner.shape: return inner
    if inner.is_void or outer.is_void: return View.void(outer.shape) if len(outer.shape) else None  # see reshape
    if outer.contiguous and same_size(outer.shape, inner.shape) and (ret := inner.reshape(outer.shape)) is not None: return ret
    if outer.mask is not None:
      # compose the valid window only, then pad the outer mask back around it
      if (merged := inner + outer.shrink(outer.mask)) is None: return None
      return merged.pad(tuple((b, s - e) for (b, e), s in zip(outer.mask, outer.shape)))
    flat = (outer.shape, outer.strides, (outer.offset,), inner.shape, inner.strides, (inner.offset,))
    if not all(all_int(x) for x in flat) or (inner.mask is not None and not all_int(x for m in inner.mask for x in m)): return None
    return _compose(inner, outer)


def normalize_axes(axes, ndim: int, op: str, shape) -> tuple[int, ...]:
  """Axes numpy-style: None is every axis, negatives count from the end, a repeat is an error."""
  if axes is None: return tuple(range(ndim))
  if isinstance(axes, int): axes = (axes,)
  try: axes = tuple(axes)
  except TypeError: raise ShapeError(f"{op}: axes must be a tuple of ints, got {axes!r}") from None
  out = []
  for a in axes:
    if isinstance(a, bool) or not hasattr(a, "__index__") or not -ndim <= operator.index(a) < ndim:
      raise ShapeError(f"{op}: axis {a!r} is out of range for shape {fmt_shape(shape)} ({ndim} dims)")
    out.append(operator.index(a) % ndim)
  if len(set(out)) != len(out): raise ShapeError(f"{op}: axes {axes!r} repeat an axis of shape {fmt_shape(shape)}")
  return tuple(out)


@functools.lru_cache(maxsize=CACHE_SIZE)
def _create(shape: tuple[sint, ...], strides: tuple[sint, ...], offset: sint, mask: Mask) -> View:
  """View.create after validation: canonicalize (see the module docstring)."""
  if any(_is0(s) for s in shape): return View(shape, (0,) * len(shape), 0, None, True)
  strides = tuple(0 if _is1(s) else ssimplify(st) for s, st in zip(shape, strides))
  if mask is not None:
    mask = tuple((ssimplify(b), ssimplify(e)) for b, e in mask)
    if all(_is0(b) and _same(e, s) for (b, e), s in zip(mask, shape)): mask = None
    elif any(_is_empty(b, e) for b, e in mask): return View.void(shape)
    else:
      # a dim with one valid index: that index moves into the offset, and the stride no longer matters
      single = [_is_single(b, e) for b, e in mask]
      offset = offset + sum(b * st for (b, _), st, one in zip(mask, strides, single) if one)
      strides = tuple(0 if one else st for st, one in zip(strides, single))
  offset = ssimplify(offset)
  contiguous = _is0(offset) and mask is None and strides == strides_for_shape(shape)
  return View(shape, strides, offset, mask, contiguous)


# ***** reshape of a strided, possibly masked view *****

def _runs(v: View) -> list[tuple[sint, sint, tuple[sint, sint]]]:
  """The dims of v (size-1 dims dropped) merged, right to left, into runs that step through memory linearly on the
  valid elements: (size, stride, valid interval of the run's flat index). A dim joins the run to its right when
  its mask leaves the run's flat valid set an interval (the run is all valid, or this dim has one valid index)
  and its stride continues the run's (or it has one valid index, so its stride is irrelevant). Sizes and masks
  must be ints to merge; strides may be symbolic (a symbolic dim elsewhere makes them so)."""
  mask = v.mask or tuple((0, s) for s in v.shape)
  runs: list[list] = []
  for s, st, (b, e) in reversed(list(zip(v.shape, v.strides, mask))):
    if _is1(s): continue
    if runs and all_int((s, b, e)) and all_int((runs[-1][0], runs[-1][2], runs[-1][3])):
      size, sigma, lo, hi = runs[-1]
      full, single = (lo, hi) == (0, size), e - b == 1
      if (full or single) and (single or _same(st, ssimplify(sigma * size))):
        runs[-1] = [size * s, sigma, b * size if full else b * size + lo, e * size if full else b * size + hi]
        continue
    runs.append([s, st, b, e])
  return [(size, sigma, (lo, hi)) for size, sigma, lo, hi in reversed(runs)]


def _contract(old: tuple[sint, ...], new: tuple[sint, ...]) -> Optional[list[tuple[list[int], list[int]]]]:
  """Pair runs of old and new dims (by index, size-1 dims left out) whose sizes multiply to the same value, from the
  right; a symbolic dim pairs only with an identical one. None if the shapes do not line up that way."""
  io = [i for i, s in enumerate(old) if not _is1(s)]
  jn = [j for j, s in enumerate(new) if not _is1(s)]
  groups = []
  while io or jn:
    if io and jn and (isinstance(old[io[-1]], UOp) or isinstance(new[jn[-1]], UOp)):
      if not _same(old[io[-1]], new[jn[-1]]): return None
      groups.append(([io.pop()], [jn.pop()]))
      continue
    go, gn, po, pn = [], [], 1, 1
    while not (go and gn and po == pn):
      if po <= pn and io and isinstance(old[io[-1]], int): go.append(io.pop()); po *= old[go[-1]]
      elif jn and isinstance(new[jn[-1]], int): gn.append(jn.pop()); pn *= new[gn[-1]]
      else: return None
    groups.append((go[::-1], gn[::-1]))
  return groups


def _split_group(v: View, go: list[int], new_sizes: list[int]) -> Optional[tuple[list[sint], list[tuple[int, int]], sint]]:
  """Express the old dims `go` of v (int sizes and masks) as new dims of `new_sizes` (same product): (strides, masks,
  the sum of mask start * stride over the old dims minus that over the new dims). None when the old dims do not
  step through memory linearly on their valid elements, or their valid set is not a box in the new dims."""
  mask = v.mask or tuple((0, s) for s in v.shape)
  if not all(all_int((v.shape[i],) + tuple(mask[i])) for i in go): return None
  # the valid elements of the group, as an interval [lo, hi) of its flat index, and the stride sigma of that index
  lo, hi, size, sigma = 0, 1, 1, v.strides[go[-1]]
  for i in reversed(go):
    s, st, (b, e) = v.shape[i], v.strides[i], mask[i]
    single = e - b == 1
    if not single and not _same(st, ssimplify(sigma * size)): return None
    if (lo, hi) == (0, size): lo, hi = b * size, e * size
    elif single: lo, hi = b * size + lo, b * size + hi
    else: return None
    size *= s
  # cut the interval into the new dims, innermost first: it must fit in one block or cover whole blocks
  strides, masks, place = [], [], 1
  for n in reversed(new_sizes):
    strides.append(ssimplify(sigma * place))
    if lo // n == (hi - 1) // n: masks.append((lo % n, (hi - 1) % n + 1)); lo, hi = lo // n, lo // n + 1
    elif lo % n == 0 and hi % n == 0: masks.append((0, n)); lo, hi = lo // n, hi // n
    else: return None
    place *= n
  shift = sum(mask[i][0] * v.strides[i] for i in go) - sum(b * st for (b, _), st in zip(masks, strides))
  return strides[::-1], masks[::-1], shift


def _split_one(v: View, new_shape: tuple[sint, ...]) -> Optional[View]:
  """The reshape every opt of the Kernel starts with, without _reshape_strided's general search: one int dim that
  is not masked split into two, (.., n, ..) -> (.., n / k, k, ..), every other dim as it was; else None."""
  old = v.shape
  if len(new_shape) != len(old) + 1 or not all(type(x) is int for x in old) or not all(type(x) is int for x in new_shape): return None
  # the first dim that differs (or the last one: n -> (n, 1))
  i = min(next((j for j, (a, b) in enumerate(zip(old, new_shape)) if a != b), len(old)), len(old) - 1)
  if i < 0 or old[i + 1:] != new_shape[i + 2:] or new_shape[i] * new_shape[i + 1] != old[i]: return None
  if v.mask is not None and v.mask[i] != (0, old[i]): return None
  st = v.strides[i]
  mask = None if v.mask is None else v.mask[:i] + ((0, new_shape[i]), (0, new_shape[i + 1])) + v.mask[i + 1:]
  return _create(new_shape, v.strides[:i] + (st * new_shape[i + 1], st) + v.strides[i + 1:], v.offset, mask)


def _reshape_strided(v: View, new_shape: tuple[sint, ...]) -> Optional[View]:
  if (groups := _contract(v.shape, new_shape)) is None: return None
  strides: list[sint] = [0] * len(new_shape)
  mask: list[tuple[sint, sint]] = [(0, 1)] * len(new_shape)
  offset = v.offset
  for go, gn in groups:
    if len(go) == 1 and len(gn) == 1 and isinstance(v.shape[go[0]], UOp):  # a symbolic dim passes through unchanged
      strides[gn[0]] = v.strides[go[0]]
      mask[gn[0]] = v.mask[go[0]] if v.mask is not None else (0, new_shape[gn[0]])
      continue
    if (split := _split_group(v, go, [new_shape[j] for j in gn])) is None: return None
    for j, st, m in zip(gn, split[0], split[1]): strides[j], mask[j] = st, m
    offset = offset + split[2]
  return _create(new_shape, tuple(strides), ssimplify(offset), tuple(mask) if v.mask is not None else None)


# ***** composition of two int views *****

def _digits(shape: tuple[int, ...], flat: int) -> list[int]:
  return [int(x) for x in unravel(shape, flat)] if shape else []


def _affine_range(const: int, coefs: dict[int, int], shape: tuple[int, ...]) -> tuple[int, int]:
  """min and max of const + sum(c * i_d) over 0 <= i_d < shape_d."""
  lo = const + sum(min(0, c * (shape[d] - 1)) for d, c in coefs.items())
  hi = const + sum(max(0, c * (shape[d] - 1)) for d, c in coefs.items())
  return lo, hi


def _compose(inner: View, outer: View) -> Optional[View]:
  """inner + outer for int views with an unmasked outer. Each inner coordinate is an affine function of the outer
  coordinates exactly when it never carries, i.e. stays within its dim over the whole outer shape; inner dims that
  carry are merged (inner reshaped) until none does. The inner mask then has to become a box on outer dims."""
  if any(s == 0 for s in outer.shape): return View.create(outer.shape)
  lo, hi = _affine_range(outer.offset, dict(enumerate(outer.strides)), outer.shape)
  if lo < 0 or hi >= prod(inner.shape): return None  # outer reads past inner: not a window of it
  origin = _digits(inner.shape, outer.offset)
  # coefs[k][d]: how inner coordinate k moves per step of outer dim d (the only affine candidate: steps from origin)
  coefs: list[dict[int, int]] = [{} for _ in inner.shape]
  for d, st in enumerate(outer.strides):
    if st == 0: continue
    for k, (a, o) in enumerate(zip(_digits(inner.shape, outer.offset + st), origin)):
      if a != o: coefs[k][d] = a - o
  # merge inner dims, innermost first, until each merged coordinate stays within its merged size
  extents, msize, mconst, mcoef, closed = [], 1, 0, Counter(), True
  for k in reversed(range(len(inner.shape))):
    mconst += origin[k] * msize
    for d, c in coefs[k].items(): mcoef[d] += c * msize
    msize *= inner.shape[k]
    lo, hi = _affine_range(mconst, mcoef, outer.shape)
    if closed := 0 <= lo and hi < msize: extents.append(msize); msize, mconst, mcoef = 1, 0, Counter()
  if not closed: return None
  if (merged_shape := tuple(extents[::-1])) != inner.shape:
    if (reshaped := inner.reshape(merged_shape)) is None or reshaped.shape == inner.shape: return None
    return reshaped + outer
  if inner.mask is not None:
    # each inner dim whose mask cuts its coordinate's range must depend on one outer dim: that becomes its mask
    new_mask, bad = [[0, s] for s in outer.shape], False
    for (b, e), o, co in zip(inner.mask, origin, coefs):
      lo, hi = _affine_range(o, co, outer.shape)
      if b <= lo and hi < e: continue
      # a constant coordinate outside the mask: nothing is valid (a 0-d view cannot say so: the pair stays two views)
      if not co: return View.void(outer.shape) if len(outer.shape) else None
      if len(co) > 1: bad = True; continue
      (d, c), = co.items()
      first, last = (ceildiv(b - o, c), (e - 1 - o) // c) if c > 0 else (ceildiv(e - 1 - o, c), (b - o) // c)
      new_mask[d] = [max(new_mask[d][0], first), min(new_mask[d][1], last + 1)]
    if any((b, e) != (0, s) for (b, e), s in zip(new_mask, outer.shape)):
      mask = tuple((b, max(b, e)) for b, e in new_mask)
      return inner + _create(outer.shape, outer.strides, outer.offset, mask)
    if bad: return None
  strides = [0] * len(outer.shape)
  for k, co in enumerate(coefs):
    for d, c in co.items(): strides[d] += c * inner.strides[k]
  return _create(outer.shape, tuple(strides), inner.offset + sum(o * st for o, st in zip(origin, inner.strides)), None)
