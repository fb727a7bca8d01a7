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
