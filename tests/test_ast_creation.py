"""kc.ast.arange against numpy's arange: values, dtype and length for int and float bounds, on EMU."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import kc
from kc import ast as A


def _run(expr):
  return kc.run(A.sink(A.store(0, expr)), {}, device="EMU")[0]


@settings(max_examples=40, deadline=None)
@given(start=st.integers(-50, 50), length=st.integers(-3, 70), step=st.integers(-7, 7).filter(bool),
       dtype=st.sampled_from([None, np.int32, np.int8, np.float32, np.float64, np.uint16]))
def test_int_bounds_match_numpy(start, length, step, dtype):
  stop = start + length * step
  if dtype in (np.int8, np.uint16) and not all(np.can_cast(np.min_scalar_type(v), dtype) for v in (start, stop - step)):
    return  # numpy wraps or refuses out-of-range values of a narrow dtype
  ref = np.arange(start, stop, step, dtype=dtype)
  out = _run(A.arange(start, stop, step, dtype=dtype))
  assert out.dtype == ref.dtype and out.shape == ref.shape
  np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("bounds", [(0.5, 3.0, 0.25), (1.0, -2.0, -0.5), (0, 1, 0.125), (3.0,), (2, 7.5)])
def test_float_bounds_match_numpy(bounds):
  ref, out = np.arange(*bounds), _run(A.arange(*bounds))
  assert out.dtype == ref.dtype == np.float64 and out.shape == ref.shape
  np.testing.assert_array_equal(out, ref)


def test_one_kernel_and_a_long_range():
  n = 5000
  assert isinstance(kc.compile(A.sink(A.store(0, A.arange(n))), device="EMU"), kc.CompiledKernel)
  assert not isinstance(kc.compile(A.sink(A.store(0, A.arange(n))), device="EMU"), kc.CompiledProgram)
  np.testing.assert_array_equal(_run(A.arange(n) * 2), np.arange(n) * 2)


@pytest.mark.parametrize("bad", [(0, 5, 0), (0, float("inf")), (True, 3), ("3",)])
def test_bad_bounds_are_typed_errors(bad):
  with pytest.raises(kc.InvalidASTError):
    A.arange(*bad)


def test_bool_is_refused():
  with pytest.raises(kc.InvalidASTError, match="bool"):
    A.arange(3, dtype=np.bool_)


@st.composite
def _moved(draw):
  """An arange reshaped to 2-3 axes, then a few of: permute, pad, shrink, flip, expand, a slice with a step; each
  applied to numpy's arange the same way."""
  shape = draw(st.lists(st.integers(1, 5), min_size=2, max_size=3))
  n = int(np.prod(shape))
  e, a = A.arange(n).reshape(*shape), np.arange(n).reshape(shape)
  for _ in range(draw(st.integers(1, 4))):
    kind = draw(st.sampled_from(["permute", "pad", "shrink", "flip", "expand", "step"]))
    if kind == "permute":
      order = draw(st.permutations(range(a.ndim)))
      e, a = e.transpose(order), a.transpose(order)
    elif kind == "pad":
      pads = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(a.ndim))
      e, a = e.pad(pads), np.pad(a, pads)
    elif kind == "shrink":
      box = [(lo, draw(st.integers(lo + 1, d))) for d in a.shape for lo in [draw(st.integers(0, d - 1))]]
      e, a = e.shrink(tuple(box)), a[tuple(slice(lo, hi) for lo, hi in box)]
    elif kind == "flip":
      axis = draw(st.integers(0, a.ndim - 1))
      e, a = e.flip(axis), np.flip(a, axis)
    elif kind == "expand":
      e, a = e.reshape(1, *a.shape).expand(3, *a.shape), np.broadcast_to(a, (3, *a.shape))
    else:
      axis = draw(st.integers(0, a.ndim - 1))
      index = tuple(slice(None, None, 2) if i == axis else slice(None) for i in range(a.ndim))
      e, a = e[index], a[index]
  return e, a


@settings(max_examples=40, deadline=None)
@given(case=_moved(), device_opts=st.sampled_from([("EMU", "none"), ("CLANG", "hand"), ("CLANG", "none")]))
def test_an_arange_moved_like_a_load_matches_numpy(case, device_opts):
  """arange is a POSITION leaf: every movement moves its view as a load's, and the kernel computes each element from
  its loop indices (opts upcast and split them) reading nothing."""
  if device_opts[0] not in kc.Device.names(): pytest.skip(f"{device_opts[0]} is not installed")
  e, want = case
  k = kc.compile(A.sink(A.store(0, e * 3 + 1)), device=device_opts[0], opts=device_opts[1])
  out = np.empty(want.shape, np.int64)
  k(out)
  np.testing.assert_array_equal(out, want * 3 + 1)


def test_an_arange_is_the_loop_index_and_reads_nothing():
  # an arange broadcast along an axis is that axis's index: no select, no buffer but the output
  k = kc.compile(A.sink(A.store(0, A.arange(64).reshape(1, 64).expand(8, 64) + A.arange(8).reshape(8, 1) * 100)),
                 device="EMU", opts="none")
  ops = {u.op for u in k.program.uops}
  assert kc.Ops.WHERE not in ops and kc.Ops.LOAD not in ops and len(k.specs) == 1
  out = np.empty((8, 64), np.int64)
  k(out)
  np.testing.assert_array_equal(out, np.arange(64)[None, :] + np.arange(8)[:, None] * 100)
