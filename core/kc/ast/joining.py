"""numpy's concatenate and stack for kc.ast, in one kernel where the parts fit in one.

Each part is padded along the joining axis to the full length, at its offset, and a boolean constant padded the same
way (True over the part, False elsewhere: a pad of a constant is 0 outside) selects it with `where`. Selecting keeps
every value bit for bit, where adding the padded parts would not: -0.0 + 0.0 is 0.0. Parts may be any expressions
(loads, computed values, reduce results): a pad of a computed value is masked where it is applied, a pad of a reduce
result is pushed onto the reduce's input, and reduce results over different lengths, which one kernel's loop nest
cannot hold side by side, are split into kernels by the scheduler.

The dtype is numpy's result type of all parts (kc.ast.promotion), or `dtype`, which each part must reach under
numpy's `casting` rule (same_kind by default: float parts cannot be joined as int32, as numpy refuses)."""
from __future__ import annotations
import itertools, operator
import numpy as np
from kc.ast.builder import implements, NDARRAY_OPERAND, Expr, _dtype, _result_dtype, const, where
from kc.errors import DTypeError, InvalidASTError, ShapeError
from kc.ir.dtype import DType, dtypes, least_upper_dtype
from kc.shape.view import fmt_shape

CASTINGS = ("no", "equiv", "safe", "same_kind", "unsafe")


@implements(np.concatenate)
def concatenate(xs, axis=0, dtype=None, casting: str = "same_kind") -> Expr:
  """numpy.concatenate: the parts joined along an existing `axis` (None: each flattened, joined into one axis)."""
  parts = _parts("concatenate", xs)
  if axis is None: parts, a = [p.reshape(-1) for p in parts], 0
  else:
    if parts[0].ndim == 0:
      raise InvalidASTError("concatenate: zero-dimensional arrays cannot be concatenated (stack them, or pass "
                            "axis=None)")
    a = _axis("concatenate", axis, parts[0].ndim)
    _check_shapes(parts, a)
  return _join(parts, a, _join_dtype("concatenate", parts, dtype, casting))


@implements(np.stack)
def stack(xs, axis=0, dtype=None, casting: str = "same_kind") -> Expr:
  """numpy.stack: parts of one shape joined along a new `axis` of the result (whose length is the number of parts)."""
  parts = _parts("stack", xs)
  for i, p in enumerate(parts):
    if p.shape != parts[0].shape:  # a symbolic length matches the same Variable
      raise ShapeError(f"stack: all input arrays must have the same shape, but the array at index {i} has shape "
                       f"{fmt_shape(p.shape)} and the array at index 0 has shape {fmt_shape(parts[0].shape)}")
  a = _axis("stack", axis, parts[0].ndim + 1)
  dt = _join_dtype("stack", parts, dtype, casting)
  return _join([p.reshape(p.shape[:a] + (1,) + p.shape[a:]) for p in parts], a, dt)


def _parts(name: str, xs) -> list[Expr]:
  """The parts as a list of expressions. numpy iterates what it is given, so an expression is its rows, as there."""
  if isinstance(xs, np.ndarray): raise DTypeError(f"{name}: {NDARRAY_OPERAND}")
  try: parts = list(xs)
  except TypeError:
    raise DTypeError(f"{name} takes a sequence of kc.ast expressions, got {type(xs).__name__} {xs!r}") from None
  if not parts: raise InvalidASTError(f"{name}: need at least one array to {name.replace('enate', '')}")
  for i, p in enumerate(parts):
    if isinstance(p, np.ndarray): raise DTypeError(f"{name}: part {i}: {NDARRAY_OPERAND}")
    if not isinstance(p, Expr):
      raise DTypeError(f"{name}: part {i} is {type(p).__name__} {p!r}, not a kc.ast expression (use A.const for a "
                       "constant part)")
  return parts


def _axis(name: str, axis, ndim: int) -> int:
  """One axis in -ndim..ndim-1 (numpy's AxisError, an InvalidASTError; numpy's TypeError, a DTypeError, for a
  non-int)."""
  if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
    raise DTypeError(f"{name}: the axis is an int, got {type(axis).__name__} {axis!r}")
  if not -ndim <= axis < ndim:
    raise InvalidASTError(f"{name}: axis {axis} is out of bounds for the {ndim} dimensions of the result")
  return operator.index(axis) % ndim


def _check_shapes(parts: list[Expr], a: int) -> None:
  """numpy's rule: one number of dimensions, and the same length on every axis but the joining one."""
  first = parts[0].shape
  for i, p in enumerate(parts[1:], 1):
    if p.ndim != len(first):
      raise ShapeError(f"concatenate: all the input arrays must have same number of dimensions, but the array at index "
                       f"0 has {len(first)} dimension(s) and the array at index {i} has {p.ndim} dimension(s)")
    if bad := [d for d in range(p.ndim) if d != a and p.shape[d] != first[d]]:
      d = bad[0]
      raise ShapeError(f"concatenate: all the input array dimensions except for the concatenation axis must match "
                       f"exactly, but along dimension {d}, the array at index 0 has size {fmt_shape(first[d])} and the "
                       f"array at index {i} has size {fmt_shape(p.shape[d])}")


def _join_dtype(name: str, parts: list[Expr], dtype, casting: str) -> DType:
  if casting not in CASTINGS:
    raise InvalidASTError(f"{name}: casting must be one of {', '.join(CASTINGS)}, got {casting!r}")
  if dtype is None: return _result_dtype(parts)
  out = _dtype(dtype)
  for p in parts:
    if not can_cast(p.dtype, out, casting):
      raise DTypeError(f"{name}: cannot cast array data from {p.dtype.name} to {out.name} according to the rule "
                       f"{casting!r}; pass casting='unsafe' to convert anyway")
  return out


def _kind_order(dt: DType) -> int:
  """numpy's order of kinds for same_kind casting: bool < unsigned < signed < float."""
  return 0 if dtypes.is_bool(dt) else 1 if dtypes.is_unsigned(dt) else 2 if dtypes.is_int(dt) else 3


def can_cast(src: DType, dst: DType, casting: str) -> bool:
  """numpy.can_cast for kc's dtypes: safe where promotion gives `dst`, same_kind where that or the kind does not go
  down (int64 to int8 is same_kind, int8 to uint8 or float32 to int32 is not)."""
  if casting == "unsafe": return True
  if casting in ("no", "equiv"): return src == dst
  if least_upper_dtype(src, dst) == dst: return True
  return casting == "same_kind" and _kind_order(src) <= _kind_order(dst)


def _join(parts: list[Expr], a: int, dt: DType) -> Expr:
  """The parts, each cast to `dt`, joined along their axis `a`: each padded to the full length at its offset and
  selected there by a padded mask. The first part needs no mask: every later one overwrites the rest. A part of
  length 0 adds no element, but it stays in the program (masked everywhere), so its buffer is still one the program
  takes, as numpy's concatenate takes it."""
  lengths = [p.shape[a] for p in parts]
  if bad := [i for i, n in enumerate(lengths) if not isinstance(n, int)]:
    raise InvalidASTError(f"joining parts along the symbolic axis {a} of part {bad[0]} "
                          f"({fmt_shape(parts[bad[0]].shape)}): each part's offset must be known when building")
  offsets = itertools.accumulate(lengths[:-1], initial=0)
  placed = list(zip(offsets, lengths, parts))
  total, ndim = sum(lengths), parts[0].ndim
  around = lambda offset, n: tuple((offset, total - offset - n) if i == a else (0, 0) for i in range(ndim))
  offset, n, first = placed[0]
  out = first.cast(dt) if n == total else first.cast(dt).pad(around(offset, n))
  for offset, n, p in placed[1:]:
    inside = const(True, dtypes.bool, tuple(n if i == a else 1 for i in range(ndim))).pad(around(offset, n))
    out = where(inside, p.cast(dt).pad(around(offset, n)), out)
  return out
