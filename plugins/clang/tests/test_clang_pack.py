"""CLANG packs a large matmul's row-major second operand into panels first (kc.schedule.pack_operand): the
hand-coded program is the pack and the product, and computes numpy's product; a transposed one stays one kernel."""
import numpy as np
import pytest
import kc
from kc import ast as A, dtypes


@pytest.mark.parametrize("transposed", [False, True])
def test_a_hand_coded_matmul_is_packed_and_matches_numpy(transposed, cache_dir):
  M, K, N = 160, 320, 512
  rng = np.random.default_rng(5)
  x = rng.standard_normal((M, K)).astype(np.float32)
  y = rng.standard_normal((N, K) if transposed else (K, N)).astype(np.float32)
  b = A.arg(2, dtypes.float32, y.shape)
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (M, K)) @ (b.T if transposed else b)))
  ck = kc.compile(sink, device="CLANG", opts="hand")
  if transposed: assert not hasattr(ck, "kernels")  # K-contiguous on both sides: vector dot products, no pack
  else: assert len(ck.kernels) == 2  # the pack, then the product
  out = np.empty((M, N), np.float32)
  ck(out, x, y)
  want = x.astype(np.float64) @ (y.T if transposed else y).astype(np.float64)
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)
  assert not hasattr(kc.compile(sink, device="CLANG", opts="none"), "kernels")
