"""ShapeTracker against numpy: the same chain of movement ops on a tracker and on a numpy view of an arange (padding
marked -1) must agree at every coordinate, through offset_of, simplify, the index expression and real_strides."""
import itertools
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import kc
from kc import ShapeTracker, View, Variable, ShapeError, sym_infer
from kc.uop import Ops, UOp

# ***** the numpy oracle and random chains *****


def _divisors(n): return [d for d in range(1, n + 1) if n % d == 0]


def draw_op(data, shape):
  """One random movement op applicable to `shape`, as (name, arg)."""
  n, size = len(shape), int(np.prod(shape))
  choices = ["reshape", "permute", "pad", "shrink", "flip", "stride", "split", "merge", "expand", "unsqueeze"]
  kind = data.draw(st.sampled_from(choices))
  if kind == "reshape":
    dims, rest = [], size
    for _ in range(data.draw(st.integers(0, 3))):
      d = data.draw(st.sampled_from(_divisors(rest))) if rest else 0
      dims.append(d); rest = rest // d if d else 0
    return "reshape", tuple(data.draw(st.permutations(dims + [rest])))
  if kind == "split" and n and shape[(ax := data.draw(st.integers(0, n - 1)))] > 1:
    a = data.draw(st.sampled_from(_divisors(shape[ax])))
    return "reshape", shape[:ax] + (a, shape[ax] // a) + shape[ax + 1:]
  if kind == "merge" and n >= 2:
    ax = data.draw(st.integers(0, n - 2))
    return "reshape", shape[:ax] + (shape[ax] * shape[ax + 1],) + shape[ax + 2:]
  if kind == "unsqueeze":
    ax = data.draw(st.integers(0, n))
    return "reshape", shape[:ax] + (1,) + shape[ax:]
  if kind == "permute": return "permute", tuple(data.draw(st.permutations(range(n))))
  if kind == "pad" and size * 4 < 400: return "pad", tuple((data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))) for _ in shape)
  if kind == "shrink":
    arg = []
    for s in shape:
      b = data.draw(st.integers(0, s))
      arg.append((b, data.draw(st.integers(min(b + 1, s), s))))
    return "shrink", tuple(arg)
  if kind == "flip" and n: return "flip", tuple(data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n)))
  if kind == "stride": return "stride", tuple(data.draw(st.sampled_from([1, -1, 2, -2, 3])) for _ in shape)
  if kind == "expand" and 1 in shape and size * 3 < 400:
    return "expand", tuple(data.draw(st.integers(1, 3)) if s == 1 else s for s in shape)
  return "permute", tuple(range(n))


def apply_np(a, op, arg):
  if op == "reshape": return a.reshape(arg)
  if op == "permute": return a.transpose(arg)
  if op == "pad": return np.pad(a, arg, constant_values=-1)
  if op == "shrink": return a[tuple(slice(b, e) for b, e in arg)]
  if op == "flip": return np.flip(a, arg)
  if op == "stride": return a[tuple(slice(None, None, m) for m in arg)]
  if op == "expand": return np.broadcast_to(a, arg)
  raise AssertionError(op)


def apply_st(t, op, arg): return getattr(t, op)(arg)


@st.composite
def chains(draw, max_ops=6):
  shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
  ops, cur = [], shape
  for _ in range(draw(st.integers(1, max_ops))):
    op, arg = draw_op(draw(st.data()), cur)
    ops.append((op, arg))
    cur = apply_np(np.zeros(cur), op, arg).shape
  return shape, ops


def build(shape, ops):
  a, t = np.arange(int(np.prod(shape))).reshape(shape), ShapeTracker.from_shape(shape)
  for op, arg in ops: a, t = apply_np(a, op, arg), apply_st(t, op, arg)
  return a, t


def expected(a, c): return None if a[c] == -1 else int(a[c])


def coords(shape): return itertools.product(*(range(s) for s in shape))


# ***** the property tests *****

@settings(max_examples=250, deadline=None)
@given(chains())
def test_offset_of_matches_numpy(chain):
  a, t = build(*chain)
  assert t.shape == a.shape
  simple = t.simplify()
  assert simple.shape == t.shape and len(simple.views) <= len(t.views)
  for c in coords(a.shape):
    assert t.offset_of(c) == expected(a, c), (c, t)
    assert simple.offset_of(c) == expected(a, c), (c, simple)


@settings(max_examples=150, deadline=None)
@given(chains())
def test_index_expression_matches_offset_of(chain):
  a, t = build(*chain)
  if 0 in a.shape: return
  vs = [Variable(f"i{d}", 0, s - 1) for d, s in enumerate(a.shape)]
  for tracker in (t, t.simplify()):
    idx, valid = tracker.to_indexed_uops(vs)
    assert idx.dtype == kc.dtypes.int32 and valid.dtype == kc.dtypes.bool
    for c in coords(a.shape):
      env = dict(zip(vs, c))
      want = expected(a, c)
      assert bool(sym_infer(valid, env)) == (want is not None), (c, valid.render())
      if want is not None: assert sym_infer(idx, env) == want, (c, idx.render())


@settings(max_examples=150, deadline=None)
@given(chains())
def test_real_strides_are_exact(chain):
  a, t = build(*chain)
  for ignore_valid in (False, True):
    strides = t.real_strides(ignore_valid)
    assert len(strides) == a.ndim
    for ax, stride in enumerate(strides):
      if stride is None: continue
      if not ignore_valid: assert not t.axis_is_masked(ax)
      for c in coords(a.shape):
        if c[ax] + 1 >= a.shape[ax]: continue
        n = c[:ax] + (c[ax] + 1,) + c[ax + 1:]
        if expected(a, c) is not None and expected(a, n) is not None:
          assert expected(a, n) - expected(a, c) == stride, (ax, c, strides, t)
    assert t.unit_stride_axes(ignore_valid) == [i for i, s in enumerate(strides) if s == 1]


@settings(max_examples=100, deadline=None)
@given(chains())
def test_real_size_covers_every_valid_offset(chain):
  a, t = build(*chain)
  valid = a[a != -1]
  need = int(valid.max()) + 1 if valid.size else 0
  # exact for one view; with more, views[0] may be read only in part, so it is an upper bound
  assert t.real_size() == need if len(t.views) == 1 else t.real_size() >= need
