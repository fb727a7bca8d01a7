"""Reproducers that kc fuzz found in programs of several kernels (kc.schedule), minimised, for code outside the fuzzer.

Each is a strict xfail while kc still fails it: fixing the bug turns it into an unexpected pass, and the xfail mark
goes then. A reproducer is one member of a class, so each test walks the class (shapes, axes, amounts), not one case.
"""
import numpy as np
import pytest
import kc
from kc import Opt, OptOps, ast as A, dtypes
from kc.errors import KernelOptError


def _half_matmul(m: int, k: int, n: int):
  return A.sink(A.store(0, A.arg(1, dtypes.float16, (m, k)) @ A.arg(2, dtypes.float16, (k, n))))


@pytest.mark.xfail(strict=True, reason="a PADTO of a tensor core's thread axis to a length that is not a whole number "
                   "of warps is accepted, and the EMU launch then fails (LaunchError: a work-group of 6 threads is not "
                   "whole warps of 4); kc fuzz --device CLANG --device EMU --n 60 --seed 7, case 52, EMU random opts")
def test_padto_after_a_tensor_core_opt_is_refused_or_runs():
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
