"""The plain call's fast path (CompiledKernel._plain_call, kc.api.plain_arrays): a kernel without Variables on a
program that takes numpy arrays itself (CLANG) goes straight to the program when every argument is exactly a numpy
array of its buffer's dtype and shape, C-contiguous, aligned, and (outputs) writeable and unshared. Every other
argument takes the general path: the fast path must answer every call exactly as the general path does, the same
results and the same errors."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import kc
from kc import ast as A, dtypes
from kc.api import plain_arrays

M, K = 6, 4


@pytest.fixture(scope="module")
def scale():
  """out (M, K) = 2 * a (M, K) + b (K,) broadcast over rows."""
  return kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (M, K)) * 2.0 + A.arg(2, dtypes.float32, (K,)).reshape(1, K).expand(M, K))),
                    device="CLANG")


def test_clang_kernels_without_variables_take_the_fast_path(scale):
  assert scale._fast is not None
  out, a, b = np.zeros((M, K), np.float32), np.ones((M, K), np.float32), np.arange(K, dtype=np.float32)
  assert plain_arrays((out, a, b), scale._fast[1])
  launched = []
  take = scale._fast[0]
  scale._fast = (lambda arrays: launched.append(arrays) or take(arrays), scale._fast[1])
  try: scale(out, a, b)
  finally: scale._fast = (take, scale._fast[1])
  assert len(launched) == 1 and launched[0][0] is out  # the caller's arrays themselves, no copies
  np.testing.assert_array_equal(out, a * 2 + b)


def test_kernels_with_variables_or_on_other_devices_take_the_general_path():
  n = kc.Variable("n", 1, 16)
  sym = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (n,)) + 1)), device="CLANG")
  emu = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (4,)) + 1)), device="EMU")
  assert sym._fast is None and emu._fast is None


def variants(draw_kind: str, base: np.ndarray) -> object:
  """An argument derived from the right array `base` in one of the ways a caller may pass it."""
  if draw_kind == "exact": return base.copy()
  if draw_kind == "float64": return base.astype(np.float64)
  if draw_kind == "int32": return base.astype(np.int32)
  if draw_kind == "flat": return base.copy().reshape(-1)
  if draw_kind == "unit_dim": return base.copy().reshape(1, *base.shape)
  if draw_kind == "transposed": return np.ascontiguousarray(base.T).T  # the same values, Fortran order
  if draw_kind == "strided": return np.repeat(base, 2, axis=-1)[..., ::2]
  if draw_kind == "read_only":
    r = base.copy()
    r.setflags(write=False)
    return r
  if draw_kind == "misaligned":
    raw = np.zeros(base.nbytes + 1, np.uint8)[1:]
    arr = raw.view(np.float32).reshape(base.shape) if base.dtype == np.float32 else None
    if arr is None: return base.copy()
    arr[...] = base
    return arr
  if draw_kind == "buffer": return kc.Buffer("CLANG", base.size, dtypes.float32).copyin(np.ascontiguousarray(base, np.float32))
  if draw_kind == "list": return base.tolist()
  if draw_kind == "too_big": return np.zeros((base.shape[0] + 1, *base.shape[1:]), base.dtype)
  raise AssertionError(draw_kind)


KINDS = ["exact", "float64", "int32", "flat", "unit_dim", "transposed", "strided", "read_only", "misaligned", "buffer", "list", "too_big"]


def outcome(kernel, args):
  """What a call gives: ("ok", the outputs' values) or ("error", its type and message)."""
  try: kernel(*args)
  except kc.KcError as e: return ("error", type(e).__name__, str(e))
  out = args[0]
  if isinstance(out, kc.Buffer):
    host = np.empty(out.size, np.float32)
    out.copyout(memoryview(host).cast("B"))
    return ("ok", host.reshape(M, K).tolist())
  return ("ok", np.asarray(out).tolist())


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(KINDS), st.sampled_from(KINDS), st.sampled_from(KINDS), st.sampled_from(["none", "out_is_a", "a_is_b"]))
def test_the_fast_path_answers_every_call_as_the_general_path(scale, out_kind, a_kind, b_kind, alias):
  rng = np.random.default_rng(0)
  bases = [np.zeros((M, K), np.float32), rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal(K).astype(np.float32)]
  answers = []
  for fast in (True, False):
    args = [variants(kind, base) for kind, base in zip((out_kind, a_kind, b_kind), bases)]
    if alias == "out_is_a" and isinstance(args[0], np.ndarray) and args[0].shape == (M, K): args[1] = args[0]
    if alias == "a_is_b": args[2] = args[1]
    saved = scale._fast
    if not fast: scale._fast = None
    try: answers.append(outcome(scale, args))
    finally: scale._fast = saved
  assert answers[0] == answers[1]


def test_an_output_sharing_memory_with_an_input_is_right_on_the_fast_kernel(scale):
  a = np.random.default_rng(1).standard_normal((M, K)).astype(np.float32)
  b = np.arange(K, dtype=np.float32)
  want = a * 2 + b
  scale(a, a, b)  # out is a: the general path writes a copy and copies it back
  np.testing.assert_array_equal(a, want)


def test_an_output_that_is_also_an_input_is_not_written_in_place():
  # a transpose in place would read elements it already overwrote: the output must go to a copy on either path
  t = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (8, 8)).permute(1, 0))), device="CLANG")
  assert t._fast is not None
  a = np.arange(64, dtype=np.float32).reshape(8, 8)
  want = a.T.copy()
  t(a, a)
  np.testing.assert_array_equal(a, want)
  b = np.arange(64, dtype=np.float32).reshape(8, 8)
  t(b, b[:, :].view())  # a view of the same memory, not the same object
  np.testing.assert_array_equal(b, want)
