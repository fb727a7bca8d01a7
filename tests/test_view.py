"""View: canonical construction, each movement op, in-view reshape (merging and splitting dims and masks),
composition of two views, minify, index expressions."""
import itertools
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from kc import View, Variable, ShapeError, sym_infer
from kc.shape import strides_for_shape
from kc.shape.view import unravel


def offsets(v: View) -> np.ndarray:
  """Every element of v as a buffer offset, -1 where masked (numpy's picture of the window)."""
  out = np.empty(v.shape, dtype=np.int64)
  for c in itertools.product(*(range(s) for s in v.shape)):
    o = v.offset_of(c, int)
    out[c] = -1 if o is None else o
  return out


def same_window(a: View, b: View) -> bool: return a.shape == b.shape and np.array_equal(offsets(a), offsets(b))


def compose(inner: View, outer: View) -> np.ndarray:
  """outer read through inner, element by element: the oracle for inner + outer."""
  base = offsets(inner).reshape(-1)
  out = offsets(outer)
  return np.where(out >= 0, base[np.clip(out, 0, None)], -1)


def draw_padded_view(data, max_dims: int) -> View:
  """A random permuted and padded view of up to max_dims dims of 1..4."""
  shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=max_dims)))
  v = View.create(shape).permute(tuple(data.draw(st.permutations(range(len(shape))))))
  return v.pad(tuple((data.draw(st.integers(0, 1)), data.draw(st.integers(0, 1))) for _ in shape))


def draw_factorization(data, size: int, max_dims: int) -> tuple[int, ...]:
  """A random shape of up to max_dims dims holding `size` elements."""
  dims: list[int] = []
  while size > 1 and len(dims) < max_dims - 1:
    d = data.draw(st.sampled_from([x for x in range(1, size + 1) if size % x == 0]))
    dims.append(d); size //= d
  return tuple(dims + [size])


# ***** canonical construction *****

def test_strides_for_shape_is_row_major_with_zero_for_size_one():
  assert strides_for_shape((2, 3, 4)) == (12, 4, 1)
  assert strides_for_shape((2, 1, 4)) == (4, 0, 1)
  assert strides_for_shape(()) == ()


def test_create_canonicalizes():
  v = View.create((2, 1, 3), (3, 7, 1))
  assert v.strides == (3, 0, 1) and v.contiguous
  assert View.create((2, 3), mask=((0, 2), (0, 3))).mask is None  # a mask that covers everything is dropped
  # a dim with one valid index gets stride 0 and moves that index into the offset
  v = View.create((4, 3), (3, 1), 0, ((2, 3), (0, 3)))
  assert v.strides == (0, 1) and v.offset == 6 and v.mask == ((2, 3), (0, 3))
  assert offsets(v)[2].tolist() == [6, 7, 8]
  # nothing valid: the one void view of the shape
  assert View.create((4, 3), (3, 1), 5, ((1, 1), (0, 3))) == View.void((4, 3))
  # a zero dim: an empty, contiguous view
  z = View.create((2, 0, 3), (9, 9, 9), 4)
  assert z.contiguous and z.strides == (0, 0, 0) and z.offset == 0


def test_equal_windows_compare_and_hash_equal():
  a = View.create((4, 3), (3, 1), 0, ((2, 3), (0, 3)))
  b = View.create((4, 3), (99, 1), 6 - 2 * 99, ((2, 3), (0, 3)))  # another stride for the single-index dim: same window
  assert a == b and hash(a) == hash(b)


@pytest.mark.parametrize("shape, needle", [((2, -1), "negative"), ((2, 1.5), "neither an int"), ((True, 2), "neither an int"),
                                           (("a",), "neither an int")])
def test_create_rejects_bad_shapes(shape, needle):
  with pytest.raises(ShapeError, match=needle): View.create(shape)


def test_create_rejects_bad_strides_and_masks():
  with pytest.raises(ShapeError, match="strides"): View.create((2, 3), (1,))
  with pytest.raises(ShapeError, match="outside shape"): View.create((2, 3), mask=((0, 2), (0, 4)))
  with pytest.raises(ShapeError, match="pairs"): View.create((2, 3), mask=((0, 2),))


# ***** movement ops against numpy *****

def test_permute_expand_pad_shrink_stride_flip_match_numpy():
  base = View.create((2, 3, 4))
  a = np.arange(24).reshape(2, 3, 4)
  assert np.array_equal(offsets(base.permute((2, 0, 1))), a.transpose(2, 0, 1))
  assert np.array_equal(offsets(base.pad(((1, 0), (0, 2), (1, 1)))), np.pad(a, ((1, 0), (0, 2), (1, 1)), constant_values=-1))
  assert np.array_equal(offsets(base.shrink(((1, 2), (0, 3), (1, 3)))), a[1:2, 0:3, 1:3])
  assert np.array_equal(offsets(base.stride((1, -2, 3))), a[:, ::-2, ::3])
  assert np.array_equal(offsets(base.flip((0, 2))), np.flip(a, (0, 2)))
  assert np.array_equal(offsets(base.flip((-1,))), np.flip(a, -1))
  one = View.create((2, 1, 4))
  assert np.array_equal(offsets(one.expand((2, 5, 4))), np.broadcast_to(np.arange(8).reshape(2, 1, 4), (2, 5, 4)))


def test_pad_then_shrink_back_is_the_original_view():
  v = View.create((3, 4)).permute((1, 0))
  assert v.pad(((1, 2), (0, 3))).shrink(((1, 5), (0, 3))) == v


def test_shrink_of_padding_only_is_void():
  assert View.create((3,)).pad(((2, 0),)).shrink(((0, 2),)).is_void


def test_expand_of_a_void_view_stays_void():
  v = View.create((1,)).pad(((1, 0),)).shrink(((0, 1),))
  assert v.is_void and v.expand((3,)).is_void


def test_movement_ops_accept_lists():
  v = View.create([2, 3])
  assert v.pad([[1, 1], [0, 0]]) == v.pad(((1, 1), (0, 0)))
  assert v.permute([1, 0]) == v.permute((1, 0))


# ***** reshape *****

def test_reshape_contiguous_is_contiguous():
  assert View.create((2, 3, 4)).reshape((6, 4)) == View.create((6, 4))


def test_reshape_merges_dims_that_step_linearly():
  v = View.create((2, 3, 4)).permute((2, 0, 1))  # strides (1, 12, 4): dims 1 and 2 step as one
  r = v.reshape((4, 6))
  assert r is not None and r.strides == (1, 4)
  assert same_window(r.reshape((4, 2, 3)), v)


def test_reshape_splits_a_strided_dim():
  v = View.create((6, 4)).permute((1, 0))  # strides (1, 4)
  r = v.reshape((4, 2, 3))
  assert r is not None and r.strides == (1, 12, 4)
  assert np.array_equal(offsets(r), offsets(v).reshape(4, 2, 3))


def test_reshape_returns_none_where_one_view_cannot_express_it():
  assert View.create((4, 6)).permute((1, 0)).reshape((24,)) is None
  assert View.create((4, 6)).permute((1, 0)).reshape((3, 8)) is None
  assert View.create((2, 1)).expand((2, 3)).pad(((0, 0), (1, 0))).reshape((8,)) is None


def test_reshape_splits_and_merges_masks():
  v = View.create((8,)).shrink(((2, 6),)).pad(((2, 2),))  # valid [2, 6) of 8
  r = v.reshape((4, 2))
  assert r is not None and r.mask == ((1, 3), (0, 2))
  assert np.array_equal(offsets(r), offsets(v).reshape(4, 2))
  assert v.reshape((2, 4)) is None  # [2, 6) cuts across blocks of 4
  back = r.reshape((8,))
  assert back is not None and back == v
  # a dim masked to one index merges with the dim to its right: the valid part is one interval
  m = View.create((3, 4)).pad(((1, 1), (0, 0))).shrink(((1, 2), (0, 4))).pad(((1, 1), (0, 0)))
  flat = m.reshape((12,))
  assert flat is not None and flat.mask == ((4, 8),)
  assert np.array_equal(offsets(flat), offsets(m).reshape(12))


def test_reshape_keeps_size_one_dims_and_padding():
  v = View.create((3, 4)).pad(((1, 1), (0, 0)))
  r = v.reshape((1, 5, 1, 4, 1))
  assert r is not None and np.array_equal(offsets(r), offsets(v).reshape(1, 5, 1, 4, 1))
  assert r.reshape((5, 4)) == v


def test_reshape_errors_name_the_shapes():
  with pytest.raises(ShapeError, match=r"reshape from \(2, 3\) to \(4, 2\) changes the size 6 -> 8"):
    View.create((2, 3)).reshape((4, 2))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_reshape_is_exact_or_none(data):
  """Random strided, masked views reshaped to random shapes: the result is the numpy reshape or None."""
  v = draw_padded_view(data, max_dims=4)
  v = v.shrink(tuple((b := data.draw(st.integers(0, s - 1)), data.draw(st.integers(b + 1, s))) for s in v.shape))
  new_shape = draw_factorization(data, int(np.prod(v.shape)), max_dims=5)
  r = v.reshape(new_shape)
  if r is not None: assert np.array_equal(offsets(r), offsets(v).reshape(new_shape)), (v, new_shape, r)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_split_of_one_dim_takes_the_short_path_to_the_same_view(data):
  """The Kernel's reshapes split one dim in two: _split_one gives exactly _reshape_strided's view, wherever that dim
  is unmasked (and it is taken there)."""
  from kc.shape.view import _reshape_strided, _split_one
  v = draw_padded_view(data, max_dims=4)
  v = v.shrink(tuple((b := data.draw(st.integers(0, s - 1)), data.draw(st.integers(b + 1, s))) for s in v.shape))
  i = data.draw(st.integers(0, len(v.shape) - 1))
  k = data.draw(st.sampled_from([x for x in range(1, v.shape[i] + 1) if v.shape[i] % x == 0]))
  new_shape = v.shape[:i] + (v.shape[i] // k, k) + v.shape[i + 1:]
  fast = _split_one(v, new_shape)
  # (a split by 1 or into 1s is also a split of a neighbouring dim: the first one that differs is taken)
  if 1 < k < v.shape[i]: assert (fast is not None) == (v.mask is None or v.mask[i] == (0, v.shape[i]))
  if fast is not None: assert fast == _reshape_strided(v, new_shape)
  if v.reshape(new_shape) is not None: assert np.array_equal(offsets(v.reshape(new_shape)), offsets(v).reshape(new_shape))


# ***** composition and minify *****

def test_compose_with_a_contiguous_side_is_the_other_side():
  v = View.create((3, 4)).permute((1, 0))
  assert View.create((4, 3)) + v == v
  assert v + View.create((4, 3)) == v


def test_compose_collapses_a_reshape_of_a_permute():
  inner = View.create((2, 3, 4)).permute((2, 0, 1))     # (4, 2, 3), strides (1, 12, 4)
  outer = View.create((4, 6)).permute((1, 0))           # (6, 4), reading inner flattened as (4, 6)
  merged = inner + outer
  assert merged is not None and merged.strides == (4, 1)
  assert np.array_equal(offsets(merged), compose(inner, outer))


def test_compose_projects_the_inner_mask_onto_the_outer_dims():
  inner = View.create((4, 4)).pad(((1, 1), (1, 1)))     # (6, 6), valid [1, 5) x [1, 5)
  outer = View.create((6, 6)).shrink(((0, 6), (1, 4))).permute((1, 0))
  merged = inner + outer
  assert merged is not None and merged.mask is not None
  assert np.array_equal(offsets(merged), compose(inner, outer))


def test_compose_refuses_a_mask_on_a_sum_of_outer_dims():
  # sliding windows over a padded row: validity depends on ox + kx, which no box over (ox, kx) can say
  inner = View.create((4,)).pad(((1, 1),))              # (6,)
  outer = View.create((4, 3), (1, 1), 0)                # windows: element ox + kx
  assert inner + outer is None
  assert (View.create((6,)) + outer) == outer


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_compose_is_exact_or_none(data):
  inner = draw_padded_view(data, max_dims=3)
  # outer reads inner through another factorization of its size: carries happen
  outer = View.create(draw_factorization(data, int(np.prod(inner.shape)), max_dims=4))
  for _ in range(data.draw(st.integers(1, 3))):
    kind = data.draw(st.sampled_from(["permute", "shrink", "flip", "pad", "stride"]))
    if kind == "permute": outer = outer.permute(tuple(data.draw(st.permutations(range(len(outer.shape))))))
    if kind == "shrink": outer = outer.shrink(tuple((b := data.draw(st.integers(0, s - 1)), data.draw(st.integers(b + 1, s))) for s in outer.shape))
    if kind == "flip": outer = outer.flip(tuple(i for i in range(len(outer.shape)) if data.draw(st.booleans())))
    if kind == "pad": outer = outer.pad(tuple((data.draw(st.integers(0, 1)), data.draw(st.integers(0, 1))) for _ in outer.shape))
    if kind == "stride": outer = outer.stride(tuple(data.draw(st.sampled_from([1, 2, -1])) for _ in outer.shape))
  merged = inner + outer
  if merged is not None: assert np.array_equal(offsets(merged), compose(inner, outer)), (inner, outer, merged)


def test_minify_merges_what_steps_as_one():
  assert View.create((2, 3, 4)).minify().shape == (24,)
  v = View.create((2, 3, 4)).permute((1, 2, 0))         # strides (4, 1, 12): dims 0 and 1 merge
  assert v.minify().shape == (12, 2) and same_window(v.minify().reshape(v.shape), v)
  p = View.create((2, 3, 4)).pad(((0, 0), (0, 0), (1, 1)))  # the padded dim cannot merge with the one above it
  assert p.minify().shape == (6, 6)
  assert np.array_equal(offsets(p.minify()), offsets(p).reshape(6, 6))


# ***** index expressions *****

def test_to_indexed_uops_matches_offset_of():
  v = View.create((3, 4)).permute((1, 0)).pad(((1, 0), (0, 2))).flip((1,))
  i, j = Variable("i", 0, v.shape[0] - 1), Variable("j", 0, v.shape[1] - 1)
  idx, valid = v.to_indexed_uops([i, j])
  for a, b in itertools.product(range(v.shape[0]), range(v.shape[1])):
    want = v.offset_of((a, b), int)
    assert bool(sym_infer(valid, {i: a, j: b})) == (want is not None)
    if want is not None: assert sym_infer(idx, {i: a, j: b}) == want


def test_unravel_takes_no_modulo_on_the_outermost_dim():
  x = Variable("x", 0, 23)
  outer, mid, inner = unravel((2, 3, 4), x)
  assert [sym_infer(u, {x: 17}) for u in (outer, mid, inner)] == [1, 1, 1]
  assert outer.op.name == "IDIV"


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_0d_view_of_one_element_composes_exactly_or_not_at_all(data):
  """A masked view read at one flat position by a 0-d view (a shrink to one element, reshaped to ()): where that
  element is padding, the pair must stay padding. A 0-d view has no dim to hold an empty mask, so composing it into
  one view that says "all padding" is impossible, and it once came out as a view reading the buffer (kc.ast gave
  x[0] where numpy's answer was the pad's 0)."""
  from kc import ShapeTracker
  inner = draw_padded_view(data, max_dims=3)
  flat = offsets(inner).reshape(-1)
  for p in range(flat.size):
    outer = View.create((), (), p)
    want = compose(inner, outer)
    if (merged := inner + outer) is not None: assert np.array_equal(offsets(merged), want), (inner, p, merged)
    for t in (ShapeTracker((inner, outer)), ShapeTracker((inner, outer)).simplify()):
      o = t.offset_of(())
      assert (-1 if o is None else o) == int(want), (inner, p, t)
