"""The call by device address (CompiledKernel.call_device): (address, nbytes) pairs in the memory of the kernel's
device, through the same checks as call_host, launched as a call's kc.Buffers are. Here on the host-memory devices
(CLANG, LLVM and EMU, whose memory is host memory); kc-cuda's GPU tests run it on device pointers."""
import numpy as np
import pytest
import kc
from kc import ast as A, dtypes

M, K = 6, 4


def pairs(*arrays: np.ndarray) -> list[tuple[int, int]]:
  return [(a.ctypes.data, a.nbytes) for a in arrays]


@pytest.fixture(scope="module", params=["CLANG", "LLVM", "EMU"])
def device(request):
  if (why := kc.Device.unavailable_reason(request.param)) is not None: pytest.skip(why)
  return request.param


def test_a_call_by_device_address_computes_what_the_plain_call_does(device):
  k = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (M, K)) * 2.0 + A.arg(2, dtypes.float32, (K,)).reshape(1, K).expand(M, K))),
                 device=device)
  assert k.device_callable and k.dlpack_device == (1, 0)
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal(K).astype(np.float32)
  out, plain = np.full((M, K), np.nan, np.float32), np.full((M, K), np.nan, np.float32)
  assert k.call_device(*pairs(out, a, b)) >= 0
  k(plain, a, b)
  np.testing.assert_array_equal(out, plain)
  np.testing.assert_allclose(out, a * 2 + b, rtol=1e-6)


@pytest.mark.parametrize("case, message", [
  ("count", "takes 3 buffers"), ("small", "needs 96 bytes, got a buffer of 92"), ("null", "non-zero address"),
  ("out_is_input", "output 0 of .* shares memory with buffer 1"), ("float", "must be ints"),
  ("no_stream", "pass stream= too"),
])
def test_every_refused_call_is_an_argument_error_before_anything_runs(device, case, message):
  k = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (M, K)) + A.arg(2, dtypes.float32, (K,)).reshape(1, K).expand(M, K))),
                 device=device)
  out, a, b = np.zeros((M, K), np.float32), np.ones((M, K), np.float32), np.ones(K, np.float32)
  args: list = pairs(out, a, b)
  kw = {}
  if case == "count": args = args[:2]
  elif case == "small": args[0] = (out.ctypes.data, out.nbytes - 4)
  elif case == "null": args[2] = (0, b.nbytes)
  elif case == "out_is_input": args[1] = args[0]
  elif case == "float": args[2] = (float(b.ctypes.data), b.nbytes)
  elif case == "no_stream": kw = {"wait": False}
  with pytest.raises(kc.ArgumentError, match=message): k.call_device(*args, **kw)
  assert not out.any()  # nothing ran


def test_a_program_runs_by_device_address_over_its_intermediates(device):
  """Kernels over an intermediate in the program's arena, on EMU too (which has no call_host): the program's own
  launch order and intermediates, the caller's buffers by address."""
  a, b = A.arg(2, dtypes.float32, (M, K)), A.arg(3, dtypes.float32, (K,)).reshape(1, K).expand(M, K)
  t = (a * 2.0 + b).realize()
  program = kc.compile(A.sink(A.store(0, t.sum(1)), A.store(1, t.flip(0) * a)), device=device)
  assert isinstance(program, kc.CompiledProgram) and program._temps and program.device_callable
  rng = np.random.default_rng(1)
  av, bv = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal(K).astype(np.float32)
  out0, out1 = np.zeros(M, np.float32), np.zeros((M, K), np.float32)
  program.call_device(*pairs(out0, out1, av, bv))
  tv = av * 2 + bv
  np.testing.assert_allclose(out0, tv.sum(1), rtol=1e-5)
  np.testing.assert_allclose(out1, tv[::-1] * av, rtol=1e-6)


def test_kernels_with_variables_are_not_device_callable():
  n = kc.Variable("n", 1, 16)
  sym = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (n,)) + 1)), device="CLANG")
  assert not sym.device_callable
  with pytest.raises(kc.KcError, match="cannot be called by device address"): sym.call_device((64, 64), (64, 64))
