"""Reproducers that kc fuzz found in programs of several kernels (kc.schedule), minimised, for code outside the fuzzer.

A reproducer is one member of a class, so each test walks the class (shapes, axes, amounts), not one case.
"""
import numpy as np
import pytest
import kc
from kc import Opt, OptOps, ast as A, dtypes
from kc.errors import KernelOptError


def _half_matmul(m: int, k: int, n: int):
  return A.sink(A.store(0, A.arg(1, dtypes.float16, (m, k)) @ A.arg(2, dtypes.float16, (k, n))))


def test_padto_after_a_tensor_core_opt_is_refused_or_runs():
  """kc fuzz --device CLANG --device EMU --n 60 --seed 7, case 52: a PADTO of a tensor core's thread axis was accepted,
  and the EMU launch then failed (a work-group of 6 threads is not whole warps of 4)."""
  # float16 matmuls with a tensor-core opt, then a PADTO of each axis by each amount: the kernel refuses the opt
  # (KernelOptError) or gives numpy's answer (small integers: the products and sums are exact)
  rng = np.random.default_rng(0)
  failures = []
  for m, k, n in ((4, 4, 4), (8, 8, 8), (14, 8, 7)):
    a, b = (rng.integers(-3, 4, s).astype(np.float16) for s in ((m, k), (k, n)))
    want = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    for tc_axis in (0, 1):
      for axis in range(6):
        for amt in (2, 3, 4, 8):
          opts = [Opt(OptOps.TC, tc_axis, 2), Opt(OptOps.PADTO, axis, amt)]
          try: got = kc.run(_half_matmul(m, k, n), {1: a, 2: b}, device="EMU", opts=opts)[0]
          except KernelOptError: continue
          except kc.KcError as e:
            failures.append(((m, k, n), opts, f"{type(e).__name__}: {e}"))
            continue
          if not np.array_equal(got, want): failures.append(((m, k, n), opts, "wrong"))
  assert not failures, failures[:4]


def _prefix_cases():
  """Values that hold a reduce (x * x.sum(...), x - x.max(...)), read through a view that starts at their first element
  and is contiguous but shorter (a prefix slice, the first rows), alone or after a reshape or broadcast."""
  for shape in ((5,), (3, 4), (2, 3, 2)):
    for combine in ("mul_sum", "sub_max"):
      for view in ("prefix", "first_rows", "broadcast_first_row"):
        yield shape, combine, view


def _build(x, combine: str, view: str):
  """The same program for kc.ast (x an Expr) and numpy (x an array)."""
  v = x * x.sum(axis=0, keepdims=True) if combine == "mul_sum" else x - x.max(axis=0, keepdims=True)
  flat = v.reshape((-1,))
  n = flat.shape[0]
  if view == "prefix": return flat[:n - 1]
  if view == "first_rows": return v[:1] if v.shape[0] > 1 else flat[:n - 1]
  wide = flat.reshape((1, n))
  return (wide.expand((2, n)) if hasattr(wide, "expand") else np.broadcast_to(wide, (2, n)))[:1, :n - 1]


@pytest.mark.parametrize("device", ["CLANG", "EMU"])
def test_a_contiguous_part_of_a_materialised_value_is_stored_as_that_part(device):
  # kc fuzz --device CLANG --device EMU --n 300 --seed 11, case 70, at fed18d9: (x * x.sum(0, keepdims=True))
  # .reshape((1, 5)).expand((2, 5))[:1, :4] stored all 10 elements of the intermediate, shape (10,), for numpy's (1, 4):
  # a view of an intermediate that is contiguous from its first element was stored as the whole intermediate
  rng = np.random.default_rng(0)
  failures = []
  for shape, combine, view in _prefix_cases():
    x = rng.integers(-5, 6, shape).astype(np.int32)
    want = _build(x, combine, view)
    got = kc.run(A.sink(A.store(0, _build(A.arg(1, dtypes.int32, shape), combine, view))), {1: x}, device=device)[0]
    if got.shape != want.shape or not np.array_equal(got, want): failures.append((shape, combine, view, got.shape))
  assert not failures, failures


@pytest.mark.parametrize("device", ["EMU", "CLANG"])
def test_outputs_differing_by_size_one_axes_are_one_kernel_and_take_random_opts(device):
  """kc fuzz --device CLANG --device EMU --seed 4411, case 7: outputs stored through (2, 2, 3) and (1, 2, 2, 3) merge
  into one kernel through the wider shape (scheduler rule 4), and the fuzzer drew its random opts on the program as
  given, not on that kernel's AST (an internal error: 'SINK: all outputs must have one shape'). The class: size-1
  axes inserted before, between and after the axes, each side wider, opts drawn from many seeds."""
  from kc.schedule import schedule
  from kc.tools.fuzz.worker import opts_from_spec, random_opts
  rng = np.random.default_rng(1)
  x = rng.integers(-8, 8, (2, 2, 3)).astype(np.float32)
  for wide in ((1, 2, 2, 3), (2, 1, 2, 3), (2, 2, 3, 1), (1, 2, 1, 2, 3, 1)):
    for wide_first in (False, True):
      a = A.arg(2, dtypes.float32, (2, 2, 3))
      stores = [A.store(0, a.reshape(wide)), A.store(1, (a * 2.0).exp2())]
      sink = A.sink(*(stores[::-1] if wide_first else stores))
      assert schedule(sink).single  # one loop nest for both
      for seed in range(6):
        got = kc.run(sink, {2: x}, device=device, opts=opts_from_spec(random_opts(sink, device, seed)))
        np.testing.assert_array_equal(got[0].reshape(wide), x.reshape(wide))
        np.testing.assert_allclose(got[1].reshape(x.shape), np.exp2(x * 2.0), rtol=1e-6)
