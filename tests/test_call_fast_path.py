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
from kc.api import plain_arrays, plain_buffers

M, K = 6, 4


@pytest.fixture(scope="module", params=["CLANG", "LLVM"])
def scale(request):
  """out (M, K) = 2 * a (M, K) + b (K,) broadcast over rows, on each device whose programs take numpy arrays (each
  reads the arrays' addresses its own way: LLVM's differs for read-only arrays)."""
  if (why := kc.Device.unavailable_reason(request.param)) is not None: pytest.skip(why)
  return kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (M, K)) * 2.0 + A.arg(2, dtypes.float32, (K,)).reshape(1, K).expand(M, K))),
                    device=request.param)


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


# ***** kc.Buffers (plain_buffers): every device, kernels and programs of several kernels *****

BUFFER_KINDS = ["exact", "larger", "smaller", "float64", "other_device", "view_aligned", "view_odd", "unallocated", "foreign", "numpy"]


def buffer_variant(kind: str, base: np.ndarray, device: str):
  """A kc.Buffer (or not) derived from the right array `base`, in one of the ways a caller may pass one."""
  flat = np.ascontiguousarray(base, np.float32).reshape(-1)
  def filled(dev, n, dt=dtypes.float32, values=flat):
    return kc.Buffer(dev, n, dt).allocate().copyin(np.resize(values, n).astype(dt.np))
  if kind == "exact": return filled(device, flat.size)
  if kind == "larger": return filled(device, flat.size + 3)
  if kind == "smaller": return filled(device, flat.size - 1)
  if kind == "float64": return filled(device, flat.size, dtypes.float64)
  if kind == "other_device": return filled("EMU" if device != "EMU" else "CLANG", flat.size)
  if kind in ("view_aligned", "view_odd"):  # a view of a larger Buffer, 16 floats or 1 float in
    skip = 16 if kind == "view_aligned" else 1
    raw = filled(device, flat.size + skip, values=np.concatenate([np.zeros(skip, np.float32), flat]))
    return raw.view(flat.size, dtypes.float32, 4 * skip).allocate()
  if kind == "unallocated": return kc.Buffer(device, flat.size, dtypes.float32)
  if kind == "foreign": return kc.from_dlpack(flat.copy(), device=device) if device in ("CLANG", "EMU") else filled(device, flat.size)
  if kind == "numpy": return flat.reshape(base.shape).copy()
  raise AssertionError(kind)


def buffer_outcome(kernel, args):
  try: kernel(*args)
  except kc.KcError as e: return ("error", type(e).__name__, str(e))
  out = args[0]
  if isinstance(out, kc.Buffer):
    if not out.is_allocated(): return ("ok", "unallocated")
    host = np.empty(out.size, out.dtype.np)
    out.copyout(memoryview(host).cast("B"))
    return ("ok", host.tolist())
  return ("ok", np.asarray(out).tolist())


@pytest.fixture(scope="module", params=["CLANG", "EMU", "program"])
def buffer_kernel(request):
  if request.param == "program":  # several kernels: a row's softmax-like normalisation
    x = A.arg(1, dtypes.float32, (M, K)) * 2.0 + A.arg(2, dtypes.float32, (K,)).reshape(1, K).expand(M, K)
    return kc.compile(A.sink(A.store(0, x / x.sum(axis=1, keepdims=True))), device="CLANG")
  return kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (M, K)) * 2.0 + A.arg(2, dtypes.float32, (K,)).reshape(1, K).expand(M, K))),
                    device=request.param)


# an unallocated Buffer as an input holds whatever its memory held: only outputs are drawn unallocated
INPUT_KINDS = [k for k in BUFFER_KINDS if k != "unallocated"]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(BUFFER_KINDS), st.sampled_from(INPUT_KINDS), st.sampled_from(INPUT_KINDS))
def test_the_buffer_fast_path_answers_every_call_as_the_general_path(buffer_kernel, out_kind, a_kind, b_kind):
  exact = [buffer_variant("exact", np.zeros(shape, np.float32), buffer_kernel.device) for shape in ((M, K), (M, K), (K,))]
  assert plain_buffers(tuple(exact), buffer_kernel._fast_buffers, buffer_kernel.device)  # the fast path is there to take
  rng = np.random.default_rng(0)
  bases = [np.zeros((M, K), np.float32), rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal(K).astype(np.float32) + 5]
  answers = []
  for fast in (True, False):
    args = [buffer_variant(kind, base, buffer_kernel.device) for kind, base in zip((out_kind, a_kind, b_kind), bases)]
    saved = buffer_kernel._fast_buffers
    if not fast: buffer_kernel._fast_buffers = None
    try: answers.append(buffer_outcome(buffer_kernel, args))
    finally: buffer_kernel._fast_buffers = saved
  assert answers[0] == answers[1]


@pytest.fixture(scope="module")
def program():
  """A program of three kernels over an intermediate: t = 2a + b stored once, then out0 = t.sum(1) and out1 = t * a (the
  last kernel's parameters come in another order than the program's buffer indices)."""
  a, b = A.arg(2, dtypes.float32, (M, K)), A.arg(3, dtypes.float32, (K,)).reshape(1, K).expand(M, K)
  t = (a * 2.0 + b).realize()
  return kc.compile(A.sink(A.store(0, t.sum(1)), A.store(1, t.flip(0) * a)), device="CLANG")


def _program_want(a, b):
  t = a * 2 + b
  return [t.sum(1), t[::-1] * a]


def test_a_program_in_host_memory_takes_the_fast_path_over_its_intermediates(program):
  assert isinstance(program, kc.CompiledProgram) and len(program.kernels) >= 2 and program._temps
  assert program._fast is not None and any(ck._order is not None for ck in program.kernels)
  rng = np.random.default_rng(2)
  a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal(K).astype(np.float32)
  outs = [np.zeros(M, np.float32), np.zeros((M, K), np.float32)]
  launched = []
  original = kc.api.CompiledKernel._launch
  kc.api.CompiledKernel._launch = lambda self, *x, **k: launched.append(self) or original(self, *x, **k)
  try: program(*outs, a, b)
  finally: kc.api.CompiledKernel._launch = original
  assert launched == []  # no kernel went through the general path's launch
  for got, want in zip(outs, _program_want(a, b)): np.testing.assert_allclose(got, want, rtol=1e-6)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(KINDS), st.sampled_from(KINDS), st.sampled_from(["none", "out_is_a"]))
def test_the_program_fast_path_answers_every_call_as_the_general_path(program, out_kind, a_kind, alias):
  rng = np.random.default_rng(3)
  a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal(K).astype(np.float32)
  answers = []
  for fast in (True, False):
    args = [np.zeros(M, np.float32), variants(out_kind, np.zeros((M, K), np.float32)), variants(a_kind, a), b.copy()]
    if alias == "out_is_a" and isinstance(args[1], np.ndarray) and args[1].shape == (M, K): args[2] = args[1]
    saved = program._fast
    if not fast: program._fast = None
    try:
      program(*args)
      out1 = args[1]
      if isinstance(out1, kc.Buffer):
        host = np.empty(out1.size, np.float32)
        out1.copyout(memoryview(host).cast("B"))
        out1 = host.reshape(M, K)
      answers.append(("ok", args[0].tolist(), np.asarray(out1).tolist()))
    except kc.KcError as e: answers.append(("error", type(e).__name__, str(e)))
    finally: program._fast = saved
  assert answers[0] == answers[1]


def test_a_kernel_taking_its_buffers_in_another_order_gets_kc_buffers_in_index_order():
  # a kernel of a program whose parameters come in another order than its buffer indices, called on its own with
  # kc.Buffers on a device whose programs take device handles (EMU): the fast path reorders them as the general path
  a, b = A.arg(2, dtypes.float32, (M, K)), A.arg(3, dtypes.float32, (K,)).reshape(1, K).expand(M, K)
  t = (a * 2.0 + b).realize()
  prog = kc.compile(A.sink(A.store(0, t.sum(1)), A.store(1, t.flip(0) * a)), device="EMU")
  kernel = next(ck for ck in prog.kernels if ck._order is not None)
  assert kernel._buffer_launch is not None and kernel._host is None
  rng = np.random.default_rng(4)
  hosts = [rng.standard_normal(s.elements).astype(np.float32) for s in kernel.specs]
  answers = []
  for fast in (True, False):
    bufs = [kc.Buffer("EMU", h.size, dtypes.float32).allocate().copyin(memoryview(h.copy()).cast("B")) for h in hosts]
    saved = kernel._fast_buffers
    if not fast: kernel._fast_buffers = None
    try: kernel(*bufs)
    finally: kernel._fast_buffers = saved
    answers.append([b.numpy().tolist() for b in bufs])
  assert answers[0] == answers[1]
  assert answers[0] != [h.tolist() for h in hosts]  # the kernel wrote something
