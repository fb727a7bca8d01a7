"""ShapeTracker against numpy: the same chain of movement ops on a tracker and on a numpy view of an arange (padding
marked -1) must agree at every coordinate, through offset_of, simplify, the index expression and real_strides."""
import itertools
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import kc
from kc import ShapeTracker, View, Variable, ShapeError, sym_infer
from kc.ir.uop import Ops, UOp

# ***** the numpy oracle and random chains *****


def _divisors(n): return [d for d in range(1, n + 1) if n % d == 0]


def draw_op(data, shape):
  """One random movement op applicable to `shape`, as (name, arg)."""
  n, size = len(shape), int(np.prod(shape))
  choices = ["reshape", "permute", "pad", "shrink", "flip", "stride", "split", "merge", "expand", "unsqueeze", "flatten"]
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
  if kind == "flatten": return "reshape", (size,)  # after a permute or pad this usually stacks a second view
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
def chains(draw, max_ops=8):
  shape = tuple(draw(st.lists(st.integers(2, 5), min_size=1, max_size=3)))  # size-1 dims come from unsqueeze
  ops, cur = [], shape
  for _ in range(draw(st.integers(2, max_ops))):
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


@st.composite
def stacked_chains(draw):
  """A chain, then a reversed permute and a flatten (which stacks a view whenever two dims are not 1), then more."""
  shape, ops = draw(chains(max_ops=4))
  cur = build(shape, ops)[0].shape
  ops += [("permute", tuple(reversed(range(len(cur))))), ("reshape", (int(np.prod(cur)),))]
  cur = (int(np.prod(cur)),)
  for _ in range(draw(st.integers(1, 4))):
    op, arg = draw_op(draw(st.data()), cur)
    ops.append((op, arg))
    cur = apply_np(np.zeros(cur), op, arg).shape
  return shape, ops


# ***** the property tests *****

def check_offsets(a, t):
  assert t.shape == a.shape
  simple = t.simplify()
  assert simple.shape == t.shape and len(simple.views) <= len(t.views)
  for c in coords(a.shape):
    assert t.offset_of(c) == expected(a, c), (c, t)
    assert simple.offset_of(c) == expected(a, c), (c, simple)


def check_index(a, t):
  if 0 in a.shape: return
  vs = [Variable(f"i{d}", 0, s - 1) for d, s in enumerate(a.shape)]
  idx, valid = t.to_indexed_uops(vs)
  assert idx.dtype == kc.dtypes.int32 and valid.dtype == kc.dtypes.bool
  for c in coords(a.shape):
    env = dict(zip(vs, c))
    want = expected(a, c)
    assert bool(sym_infer(valid, env)) == (want is not None), (c, valid.render())
    if want is not None: assert sym_infer(idx, env) == want, (c, idx.render())


def check_strides(a, t):
  """Every stride real_strides reports is exact: one step along the axis moves the offset by it, wherever both
  elements are valid; a masked axis has None unless ignore_valid."""
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


def check_masked_axes(a, t):
  """axis_is_masked names exactly the axes the validity expression reads, and validity never changes along another."""
  reads = {u.arg for u in t.to_indexed_uops()[1].toposort if u.op is Ops.RANGE}
  for ax in range(a.ndim):
    assert t.axis_is_masked(ax) == (ax in reads), (ax, reads, t)
    if t.axis_is_masked(ax): continue
    for c in coords(a.shape):
      if c[ax] + 1 < a.shape[ax]:
        assert (expected(a, c) is None) == (expected(a, c[:ax] + (c[ax] + 1,) + c[ax + 1:]) is None), (ax, c, t)


def check_real_size(a, t):
  valid = a[a != -1]
  need = int(valid.max()) + 1 if valid.size else 0
  # exact for one view; with more, views[0] may be read only in part, so it is an upper bound
  assert t.real_size() == need if len(t.views) == 1 else t.real_size() >= need


CHECKS = [check_offsets, check_index, check_strides, check_masked_axes, check_real_size]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@settings(max_examples=150, deadline=None)
@given(chain=chains())
def test_movement_chains_match_numpy(check, chain): check(*build(*chain))


@settings(max_examples=150, deadline=None)
@given(stacked_chains())
def test_stacked_trackers_match_numpy(chain):
  a, t = build(*chain)
  for check in CHECKS: check(a, t)


# ***** view merging the Kernel relies on *****

def test_reshape_permute_round_trips_stay_one_view():
  t = ShapeTracker.from_shape((2, 3, 4, 5))
  for order in itertools.permutations(range(4)):
    p = t.permute(order)
    flat = p.reshape((p.shape[0] * p.shape[1], p.shape[2] * p.shape[3]))
    back = flat.reshape(p.shape).permute(tuple(np.argsort(order)))
    assert len(back.views) == 1 and back.contiguous, (order, back)
  # a reshape one view cannot express stacks a view, and reshaping back drops it again
  u = t.permute((3, 2, 1, 0))
  stacked = u.reshape((120,))
  assert len(stacked.views) == 2
  assert stacked.reshape(u.shape) == u


def test_kernel_style_upcast_splits_keep_one_view():
  # the Kernel pads an axis (PADTO), splits axes (upcast, local) and moves the pieces; each step must stay one view
  t = ShapeTracker.from_shape((64, 32)).permute((1, 0)).pad(((0, 0), (0, 8)))  # PADTO 64 -> 72 on a strided axis
  s = t.reshape((8, 4, 18, 4)).permute((0, 2, 1, 3))
  assert len(s.views) == 1 and s.views[0].mask == ((0, 8), (0, 16), (0, 4), (0, 4))
  assert s.real_strides(ignore_valid=True) == (4, 128, 1, 32) and s.real_strides() == (4, None, 1, 32)
  a = np.pad(np.arange(64 * 32).reshape(64, 32).T, ((0, 0), (0, 8)), constant_values=-1).reshape(8, 4, 18, 4).transpose(0, 2, 1, 3)
  assert all(s.offset_of(c) == expected(a, c) for c in coords(a.shape))
  assert s.permute((0, 2, 1, 3)).reshape((32, 72)) == t  # and back


def test_simplify_collapses_composable_views():
  # a non-mergeable reshape of an expanded view stacks a view, and a later shrink makes it composable
  t = ShapeTracker.from_shape((3, 1)).expand((3, 4)).reshape((12,))
  assert len(t.views) == 2
  s = t.reshape((3, 4)).shrink(((0, 3), (1, 2)))
  assert len(s.simplify().views) == 1
  # sliding windows without padding (conv2d's input) collapse into one view
  w = ShapeTracker.from_shape((6, 6)).reshape((1, 6, 1, 6)).expand((4, 6, 4, 6)).reshape((24, 24))
  w = w.shrink(((0, 21), (0, 21))).reshape((3, 7, 3, 7)).shrink(((0, 3), (0, 4), (0, 3), (0, 4))).permute((1, 3, 0, 2))
  assert len(w.simplify().views) == 1 and w.simplify().real_strides() == (6, 1, 6, 1)


def test_simplified_tracker_matches_original():
  t = ShapeTracker.from_shape((4, 6)).permute((1, 0)).reshape((3, 8)).reshape((24,)).reshape((4, 6))
  assert len(t.simplify().views) <= len(t.views)
  assert all(t.offset_of(c) == t.simplify().offset_of(c) for c in coords((4, 6)))


# ***** real_strides, unit_stride_axes, axis_is_masked *****

def test_real_strides_of_one_view():
  t = ShapeTracker.from_shape((2, 3, 4)).permute((2, 0, 1))
  assert t.real_strides() == (1, 12, 4)
  assert t.unit_stride_axes() == [0]
  assert ShapeTracker.from_shape((3, 1)).expand((3, 5)).real_strides() == (1, 0)


def test_real_strides_of_masked_views():
  t = ShapeTracker.from_shape((3, 4)).pad(((1, 1), (0, 0)))
  assert t.real_strides() == (None, 1) and t.real_strides(ignore_valid=True) == (4, 1)
  assert t.axis_is_masked(0) and not t.axis_is_masked(1)
  assert t.unit_stride_axes() == [1] and t.unit_stride_axes(ignore_valid=True) == [1]
  q = ShapeTracker.from_shape((3, 4)).pad(((0, 0), (2, 0)))
  assert q.real_strides() == (4, None) and q.real_strides(True) == (4, 1) and q.unit_stride_axes() == []
  assert q.unit_stride_axes(ignore_valid=True) == [1]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_real_strides_of_one_view_are_those_its_index_has(data):
  # a tracker that simplifies to one view (padded, flipped, expanded...) answers from the view's strides; its index
  # over a RANGE per axis, simplified, must give the same
  from kc.shape.shapetracker import _real_strides, _strides_from_index
  shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
  t = ShapeTracker.from_shape(shape)
  for _ in range(data.draw(st.integers(1, 4))):
    op, arg = draw_op(data, t.shape)
    t = apply_st(t, op, arg)
  if len(t.simplify().views) != 1: return
  for ignore_valid in (False, True): assert _real_strides(t.views, ignore_valid) == _strides_from_index(t.views, ignore_valid), t


def test_real_strides_of_merged_views_are_exact():
  t = ShapeTracker.from_shape((4, 6)).permute((1, 0)).reshape((3, 8))  # two views: axis 1 unravels through // and %
  assert len(t.views) == 2
  assert t.real_strides() == (2, None)
  a = np.arange(24).reshape(4, 6).T.reshape(3, 8)
  assert (a[1:] - a[:-1] == 2).all() and not (a[:, 1:] - a[:, :-1] == a[0, 1] - a[0, 0]).all()


def test_axis_is_masked_rejects_bad_axes():
  with pytest.raises(ShapeError, match="out of range"): ShapeTracker.from_shape((2, 3)).axis_is_masked(2)


# ***** typed errors that name the shapes *****

@pytest.mark.parametrize("make, needle", [
  (lambda t: t.permute((0, 0, 1)), r"permute: \(0, 0, 1\) is not a permutation of the 3 dims of shape \(2, 3, 4\)"),
  (lambda t: t.permute((0, 1)), r"permute: \(0, 1\) has 2 entries for the 3 dims of shape \(2, 3, 4\)"),
  (lambda t: t.reshape((5, 5)), r"reshape from \(2, 3, 4\) to \(5, 5\) changes the size 24 -> 25"),
  (lambda t: t.reshape((-2, -12)), r"negative dimension"),
  (lambda t: t.reshape((2, 3.0, 4)), r"neither an int"),
  (lambda t: t.shrink(((0, 2), (0, 4), (0, 4))), r"shrink: .* is out of bounds for shape \(2, 3, 4\)"),
  (lambda t: t.shrink(((1, 0), (0, 3), (0, 4))), r"shrink: .* is out of bounds for shape \(2, 3, 4\)"),
  (lambda t: t.shrink(((-1, 1), (0, 3), (0, 4))), r"shrink: .* is out of bounds"),
  (lambda t: t.expand((2, 6, 4)), r"expand: shape \(2, 3, 4\) cannot expand to \(2, 6, 4\): only size-1 dims expand, 3 is not 1"),
  (lambda t: t.expand((2, 3)), r"expand: shape \(2, 3, 4\) cannot expand to \(2, 3\)"),
  (lambda t: t.pad(((0, 0), (-1, 0), (0, 0))), r"pad: .* of shape \(2, 3, 4\) has a negative amount"),
  (lambda t: t.pad(((0, 0),)), r"pad: .* has 1 entries for the 3 dims"),
  (lambda t: t.flip((3,)), r"flip: axis 3 is out of range for shape \(2, 3, 4\)"),
  (lambda t: t.flip((0, -3)), r"flip: axes .* repeat an axis"),
  (lambda t: t.stride((0, 1, 1)), r"stride: .* must be non-zero ints"),
  (lambda t: t.offset_of((2, 0, 0)), r"offset_of: \(2, 0, 0\) is not a position in shape \(2, 3, 4\)"),
  (lambda t: t.offset_of((0, 0)), r"not a position"),
  (lambda t: t.to_indexed_uops([Variable("i", 0, 1)]), r"one integer UOp per dim of shape \(2, 3, 4\)"),
  (lambda t: t.reduce((5,)), r"out of range"),
])
def test_invalid_movement_raises_shape_error(make, needle):
  with pytest.raises(ShapeError, match=needle): make(ShapeTracker.from_shape((2, 3, 4)))


def test_shape_error_is_an_invalid_ast_error():
  with pytest.raises(kc.InvalidASTError): ShapeTracker.from_shape((2, -3))
  with pytest.raises(ShapeError): ShapeTracker.from_shape(("x",))
  with pytest.raises(ShapeError): ShapeTracker(())


# ***** symbolic shapes *****

N = Variable("N", 1, 10)


def test_symbolic_shapes_move_and_index():
  t = ShapeTracker.from_shape((N, 4))
  assert t.shape == (N, 4) and t.real_strides() == (4, 1) and t.contiguous
  assert t.reshape((N * 4,)).contiguous                         # a symbolic elementwise length
  assert t.reduce((0,)) == (1, 4)                               # a symbolic reduce axis
  split = t.permute((1, 0)).reshape((2, 2, N))                  # splitting the int axis of a strided tracker
  assert len(split.views) == 1
  for tracker, np_view in [(split, lambda a: a.T.reshape(2, 2, -1)), (t.permute((1, 0)).reshape((4 * N,)), lambda a: a.T.reshape(-1)),
                           (ShapeTracker.from_shape((1, 4)).expand((N, 4)), lambda a: np.broadcast_to(a[:1, :4] * 0 + np.arange(4), a.shape)),
                           (t.pad(((1, 2), (0, 0))), lambda a: np.pad(a, ((1, 2), (0, 0)), constant_values=-1)),
                           (t.flip((0,)), lambda a: np.flip(a, 0))]:
    for n in (1, 3, 7):
      a = np_view(np.arange(n * 4).reshape(n, 4))
      shape = tuple(int(sym_infer(s, {N: n})) if isinstance(s, UOp) else s for s in tracker.shape)
      assert shape == a.shape
      vs = [Variable(f"i{d}", 0, (s.vmax if isinstance(s, UOp) else s) - 1) for d, s in enumerate(tracker.shape)]
      idx, valid = tracker.to_indexed_uops(vs)
      for c in coords(a.shape):
        assert tracker.offset_of(c, {N: n}) == expected(a, c)
        env = {**dict(zip(vs, c)), N: n}
        assert bool(sym_infer(valid, env)) == (expected(a, c) is not None)
        if expected(a, c) is not None: assert sym_infer(idx, env) == expected(a, c)


def test_symbolic_shrink_and_bound_variables():
  t = ShapeTracker.from_shape((10, 4)).shrink(((0, N), (0, 4)))
  assert t.shape == (N, 4) and t.real_strides() == (4, 1)
  b = ShapeTracker.from_shape((N.bind(3), 4))
  assert b.var_vals == {N: 3} and b.vars() == {N}
  assert b.offset_of((2, 1)) == 9                                # a bound variable needs no var_vals
  assert b.unbind()[0] == ShapeTracker.from_shape((N, 4)) and b.unbind()[1] == {N: 3}
  assert b.size == 40 and ShapeTracker.from_shape((N, 4)).real_size() == 40  # symbolic dims count at their maximum


@pytest.mark.parametrize("make, needle", [
  (lambda t: t.reshape((N, 5)), r"reshape from \(N, 4\) to \(N, 5\) changes the size"),
  (lambda t: t.reshape((Variable("M", 1, 10), 4)), r"or kc cannot prove the sizes equal"),
  (lambda t: t.expand((Variable("M", 1, 10), 4)), r"only size-1 dims expand, N is not 1"),
  (lambda t: t.stride((2, 1)), r"stride: .* needs concrete sizes, shape \(N, 4\) is symbolic"),
  (lambda t: t.offset_of((0, 0)), r"offset_of on shape \(N, 4\) needs concrete values: no value for Variable 'N'"),
  (lambda t: t.shrink(((0, Variable("M", 1, 20)), (0, 4))), r"shrink: .* is out of bounds for shape \(N, 4\)"),
  (lambda t: t.reshape((Variable("K", -1, 3), 4)), r"negative dimension K \(its range is -1..3\)"),
])
def test_symbolic_movement_that_needs_a_concrete_value_raises(make, needle):
  with pytest.raises(ShapeError, match=needle): make(ShapeTracker.from_shape((N, 4)))


# ***** the rest of the contract *****

def test_to_uop_is_a_hash_consed_view():
  t = ShapeTracker.from_shape((2, 3)).permute((1, 0))
  u = t.to_uop()
  assert u.op is Ops.VIEW and u.dtype == kc.dtypes.void and u.src == () and u.arg == t  # an equal tracker built earlier may be the one it holds
  assert ShapeTracker.from_shape((2, 3)).permute((1, 0)).to_uop() is u  # equal trackers: the same UOp
  with pytest.raises(Exception): t.views = ()  # frozen


def test_default_indices_are_ranges_and_no_mask_means_true():
  idx, valid = ShapeTracker.from_shape((2, 3)).to_indexed_uops()
  assert valid.op is Ops.CONST and valid.arg is True
  assert {u.op for u in idx.toposort} >= {Ops.RANGE}
  idx, valid = ShapeTracker.from_shape((2, 3)).pad(((1, 0), (0, 0))).to_indexed_uops()
  assert valid.op is not Ops.CONST


def test_flip_takes_axis_indices_like_numpy():
  a = np.arange(24).reshape(2, 3, 4)
  t = ShapeTracker.from_shape((2, 3, 4))
  for axes in [(0,), (1, 2), (-1,), (), None]:
    want = np.flip(a, axes) if axes is not None else np.flip(a)
    assert all(t.flip(axes).offset_of(c) == want[c] for c in coords(a.shape))


def test_shape_size_contiguous_and_views():
  t = ShapeTracker.from_shape((2, 3))
  assert (t.shape, t.size, t.contiguous, len(t.views)) == ((2, 3), 6, True, 1)
  assert not t.permute((1, 0)).contiguous and t.permute((1, 0)).size == 6
  assert ShapeTracker.from_shape((3, 4)).shrink(((1, 2), (0, 4))).real_size() == 8
  assert ShapeTracker.from_shape((2, 0)).real_size() == 0 and ShapeTracker.from_shape((2, 0)).size == 0
  assert isinstance(t.views[0], View) and View.create((2, 3)) == t.views[0]


def test_windows_against_numpy_sliding_windows():
  import numpy as np
  from kc import ShapeError
  base = np.arange(4 * 7).reshape(4, 7)
  padded = np.pad(base, ((0, 0), (1, 1)), constant_values=-1)
  st = ShapeTracker.from_shape((4, 7)).pad(((0, 0), (1, 1))).windows(1, 3)
  want = np.lib.stride_tricks.sliding_window_view(padded, 3, axis=1).transpose(0, 2, 1)  # (4, 3 taps, 7 positions)
  assert st.shape == want.shape and len(st.views) <= 2
  for i in range(4):
    for k in range(3):
      for j in range(7):
        off = st.offset_of((i, k, j))
        assert (-1 if off is None else base.reshape(-1)[off]) == want[i, k, j]
  assert len(ShapeTracker.from_shape((9,)).windows(0, 3).views) == 1  # an unpadded window is one strided view
  with pytest.raises(ShapeError, match="do not fit"): ShapeTracker.from_shape((4, 7)).windows(1, 8)


def test_an_all_padding_view_reshaped_to_0d_stays_all_padding():
  # a 0-d view has no dim for the empty mask: the void view is kept under the 0-d one (and simplify keeps it)
  void = ShapeTracker.from_shape((1,)).pad(((1, 0),)).shrink(((0, 1),))
  assert void.offset_of((0,)) is None
  for t in (void.reshape(()), void.reshape(()).simplify(), void.reshape((1, 1)).reshape(())):
    assert t.shape == () and t.offset_of(()) is None, t
