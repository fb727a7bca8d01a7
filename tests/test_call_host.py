"""The call by host address (CompiledKernel.call_host, kc.runtime.host_call): (address, nbytes) pairs straight to a
host program's launch_addresses, after the checks integers allow. The answers must be the plain call's, and every
pair the checks refuse an ArgumentError that names the buffer, before anything runs."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import kc
from kc import ast as A, dtypes
from kc.runtime.host_call import HostSlot, host_addresses

M, K = 6, 4


def pairs(*arrays: np.ndarray) -> list[tuple[int, int]]:
  return [(a.ctypes.data, a.nbytes) for a in arrays]


@pytest.fixture(scope="module", params=["CLANG", "LLVM"])
def scale(request):
  """out (M, K) = 2 * a (M, K) + b (K,) broadcast over rows."""
  if (why := kc.Device.unavailable_reason(request.param)) is not None: pytest.skip(why)
  return kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (M, K)) * 2.0 + A.arg(2, dtypes.float32, (K,)).reshape(1, K).expand(M, K))),
                    device=request.param)


def test_a_call_by_address_computes_what_the_plain_call_does(scale):
  assert scale.host_callable
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal(K).astype(np.float32)
  out, plain = np.full((M, K), np.nan, np.float32), np.full((M, K), np.nan, np.float32)
  seconds = scale.call_host(*pairs(out, a, b))
  scale(plain, a, b)
  assert seconds >= 0
  np.testing.assert_array_equal(out, plain)
  np.testing.assert_allclose(out, a * 2 + b, rtol=1e-6)


@pytest.mark.parametrize("case, message", [
  ("count", "takes 3 buffers"), ("not_pair", r"must be an \(address, nbytes\) pair"), ("float", "must be ints"),
  ("small", "needs 96 bytes, got a buffer of 92"), ("null", "non-zero address"), ("misaligned", "multiple of 4 bytes"),
  ("out_is_input", "output 0 of .* shares memory with buffer 1"), ("input_overlaps_out", "shares memory"),
])
def test_every_refused_pair_is_an_argument_error_before_anything_runs(scale, case, message):
  out, a, b = np.zeros((M, K), np.float32), np.ones((M, K), np.float32), np.ones(K, np.float32)
  args: list = pairs(out, a, b)
  if case == "count": args = args[:2]
  elif case == "not_pair": args[1] = a.ctypes.data
  elif case == "float": args[2] = (float(b.ctypes.data), b.nbytes)
  elif case == "small": args[0] = (out.ctypes.data, out.nbytes - 4)
  elif case == "null": args[2] = (0, b.nbytes)
  elif case == "misaligned": args[1] = (a.ctypes.data + 2, a.nbytes)
  elif case == "out_is_input": args[1] = args[0]
  elif case == "input_overlaps_out": args[2] = (out.ctypes.data + 8, b.nbytes)
  with pytest.raises(kc.ArgumentError, match=message): scale.call_host(*args)
  assert not out.any()  # nothing ran


def test_kernels_with_variables_or_on_devices_without_addresses_are_not_host_callable():
  n = kc.Variable("n", 1, 16)
  sym = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (n,)) + 1)), device="CLANG")
  emu = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (4,)) + 1)), device="EMU")
  for ck in (sym, emu):
    assert not ck.host_callable
    with pytest.raises(kc.KcError, match="cannot be called by host address"): ck.call_host((1, 64), (1, 64))


def test_a_program_runs_by_address_over_its_intermediates():
  """Three kernels over an intermediate in the program's arena (the last kernel's parameters in another order than
  the program's buffer indices), and a bfloat16 output, which numpy cannot view: addresses need no numpy dtype."""
  a, b = A.arg(2, dtypes.float32, (M, K)), A.arg(3, dtypes.float32, (K,)).reshape(1, K).expand(M, K)
  t = (a * 2.0 + b).realize()
  program = kc.compile(A.sink(A.store(0, t.sum(1)), A.store(1, (t.flip(0) * a).astype(dtypes.bfloat16))), device="CLANG")
  assert isinstance(program, kc.CompiledProgram) and program._temps and program.host_callable
  rng = np.random.default_rng(1)
  av, bv = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal(K).astype(np.float32)
  out0, out1 = np.zeros(M, np.float32), np.zeros((M, K), np.uint16)  # bfloat16's bits
  program.call_host(*pairs(out0, out1, av, bv))
  tv = av * 2 + bv
  np.testing.assert_allclose(out0, tv.sum(1), rtol=1e-5)
  got1 = (out1.astype(np.uint32) << 16).view(np.float32)
  np.testing.assert_allclose(got1, tv[::-1] * av, rtol=2 ** -7)


def test_an_empty_buffer_may_be_at_any_address():
  slots = (HostSlot(16, 4, True), HostSlot(0, 4, False))
  assert host_addresses("k", [(64, 16), (0, 0)], slots) == [64, 0]
  assert host_addresses("k", [(64, 16), (66, 0)], slots) == [64, 66]  # inside the output, but no bytes to share


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 12), st.booleans()), min_size=1, max_size=6))
def test_overlaps_are_refused_exactly_where_an_output_shares_a_byte(buffers):
  """Against the byte sets themselves: an output (or anything touching one) that shares a byte is refused, inputs
  may overlap each other, and nothing else is refused."""
  slots = tuple(HostSlot(n, 1, out) for _, n, out in buffers)
  args = [(addr, n) for addr, n, _ in buffers]
  spans = [set(range(addr, addr + n)) for addr, n, _ in buffers]
  shared = any(i != j and (buffers[i][2] or buffers[j][2]) and spans[i] & spans[j]
               for i in range(len(buffers)) for j in range(len(buffers)))
  if shared:
    with pytest.raises(kc.ArgumentError, match="shares memory"): host_addresses("k", args, slots)
  else: assert host_addresses("k", args, slots) == [a for a, _ in args]
