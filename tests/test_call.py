"""Calling a compiled kernel: every argument checked against the declared shape, dtype and layout; numpy arrays
used in place on host-memory devices (CLANG, EMU); a single Opt as opts; calls that write nothing launch nothing."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import kc
from kc import ast as A, dtypes, Variable, KcError
from kc.errors import ArgumentError
from kc.runtime.arguments import buffer_specs, declared_shape
from kc.runtime.device import Allocator, HostAllocator, HostMemory
from kc.shape import ShapeTracker

M, K = 6, 4
HOST = ["CLANG", "EMU"]


def F(i, *shape): return A.arg(i, dtypes.float32, shape)


def rand(*shape, dtype=np.float32): return np.random.default_rng(0).standard_normal(shape).astype(dtype)


@pytest.fixture(scope="module")
def scale():
  """out (M, K) = 2 * a (M, K) + b (K,) broadcast over rows."""
  return kc.compile(A.sink(A.store(0, F(1, M, K) * 2.0 + F(2, K).reshape(1, K).expand(M, K))), device="CLANG")


def expected(a, b): return a * 2 + b[None, :]


@pytest.mark.parametrize("bad,given", [((M + 5, K), r"\(11, 4\)"), ((K, M), r"\(4, 6\)"), ((M * K + 1,), r"\(25,\)"), ((M, K, 2), r"\(6, 4, 2\)")])
def test_wrong_input_shape_names_index_expected_and_given(scale, bad, given):
  with pytest.raises(ArgumentError, match=rf"input 1 of .* must have shape \(6, 4\).*got an array of shape {given}"):
    scale(np.zeros((M, K), np.float32), np.zeros(bad, np.float32), rand(K))


def test_wrong_output_shape_and_dtype(scale):
  with pytest.raises(ArgumentError, match=r"output 0 .* shape \(6, 4\).*\(7, 4\)"):
    scale(np.zeros((M + 1, K), np.float32), rand(M, K), rand(K))
  with pytest.raises(ArgumentError, match=r"input 2 of .* must be float32, got an array of float64"):
    scale(np.zeros((M, K), np.float32), rand(M, K), rand(K, dtype=np.float64))
  with pytest.raises(ArgumentError, match=r"output 0 .* must be float32, got an array of int32"):
    scale(np.zeros((M, K), np.int32), rand(M, K), rand(K))
  with pytest.raises(ArgumentError, match="must be a numpy array or a kc.Buffer, got list"):
    scale(np.zeros((M, K), np.float32), rand(M, K), [0.0] * K)
  with pytest.raises(ArgumentError, match="takes 3 buffers"):
    scale(np.zeros((M, K), np.float32), rand(M, K))


def test_exact_unit_dims_aside_and_flat_shapes_are_accepted(scale):
  a, b = rand(M, K), rand(K)
  for out_shape, a_view, b_view in [((M, K), a, b), ((M * K,), a.reshape(-1), b), ((M, 1, K), a.reshape(1, M, K), b.reshape(1, K))]:
    out = np.zeros(out_shape, np.float32)
    scale(out, a_view, b_view)
    assert np.allclose(out.reshape(M, K), expected(a, b))


def test_non_contiguous_input_is_copied_and_right(scale):
  at = rand(K, M).T  # an (M, K) view with strides of the transpose: not C-contiguous
  b = rand(2 * K)[::2]
  assert not at.flags.c_contiguous and not b.flags.c_contiguous
  out = np.zeros((M, K), np.float32)
  scale(out, at, b)
  assert np.allclose(out, expected(at, b))


def test_outputs_that_cannot_be_written_in_place_raise(scale):
  strided = np.zeros((M, 2 * K), np.float32)[:, ::2]
  with pytest.raises(ArgumentError, match=r"output 0 .* not C-contiguous"): scale(strided, rand(M, K), rand(K))
  frozen = np.zeros((M, K), np.float32)
  frozen.flags.writeable = False
  with pytest.raises(ArgumentError, match=r"output 0 .* read-only"): scale(frozen, rand(M, K), rand(K))
  assert not frozen.any()


def test_a_read_only_input_is_fine(scale):
  a, b = rand(M, K), rand(K)
  a.flags.writeable = False
  out = np.zeros((M, K), np.float32)
  scale(out, a, b)
  assert np.allclose(out, expected(a, b))


def test_buffers_are_checked_by_size_dtype_and_device(scale):
  ok = kc.Buffer("CLANG", M * K, dtypes.float32).allocate()
  with pytest.raises(ArgumentError, match=r"input 1 .* needs 24 elements, the Buffer has 23"):
    scale(ok, kc.Buffer("CLANG", M * K - 1, dtypes.float32).allocate(), rand(K))
  with pytest.raises(ArgumentError, match=r"input 2 .* must be float32, got a Buffer of int32"):
    scale(ok, rand(M, K), kc.Buffer("CLANG", K, dtypes.int32).allocate())
  with pytest.raises(ArgumentError, match=r"is on EMU, the kernel runs on CLANG"):
    scale(ok, rand(M, K), kc.Buffer("EMU", K, dtypes.float32).allocate())


def test_permuted_declaration_checks_the_declared_shape():
  # the AST only keeps the transposed view of arg 1: its declared (M, K) is recovered from the strides
  k = kc.compile(A.sink(A.store(0, F(1, M, K).permute(1, 0) + 1.0)), device="CLANG")
  x = rand(M, K)
  out = np.zeros((K, M), np.float32)
  k(out, x)
  assert np.array_equal(out, x.T + 1)
  with pytest.raises(ArgumentError, match=r"input 1 .* shape \(6, 4\).*\(4, 6\)"): k(out, np.ascontiguousarray(x.T))


def test_matmul_declarations_survive_reshape_and_expand():
  N = 5
  sink = A.sink(A.store(0, (F(1, M, K).reshape(M, K, 1) * F(2, K, N).reshape(1, K, N)).sum(axis=1)))
  k = kc.compile(sink, device="CLANG")
  assert [s.shape for s in k.specs] == [(M, N), (M, K), (K, N)]  # the output's numpy shape, as kc.ast records it
  a, b = rand(M, K), rand(K, N)
  out = np.zeros((M, N), np.float32)
  k(out, a, b)
  assert np.allclose(out, a @ b, atol=1e-5)
  with pytest.raises(ArgumentError, match=r"input 2 .* \(4, 5\).*\(5, 4\)"): k(out, a, np.ascontiguousarray(b.T))


def test_declared_shape_unknown_falls_back_to_the_element_count():
  # a shrink that cuts rows short says nothing in its view; kc.ast records the A.arg shape on the load, which does
  # (tests/test_ast_ops.py covers the element-count fallback of an AST whose loads record nothing)
  sink = A.sink(A.store(0, F(1, M, K + 2).shrink(((0, M), (1, K + 1))) + 0.0))
  k = kc.compile(sink, device="CLANG")
  assert k.specs[1].shape == (M, K + 2) and k.specs[1].elements == M * (K + 2)
  x = rand(M, K + 2)
  out = np.zeros((M, K), np.float32)
  k(out, x)
  assert np.array_equal(out, x[:, 1:K + 1])
  with pytest.raises(ArgumentError, match=r"input 1 .* must have shape \(6, 6\) .* got an array of shape \(34,\)"): k(out, x.reshape(-1)[:34])


def test_a_slice_from_zero_is_not_the_declared_shape():
  # x[0] and x[:M] read like smaller declarations; the shape recorded on the load (and the pointer's count) tell them apart
  x = F(1, M + 5, K)
  k = kc.compile(A.sink(A.store(0, x[:M] * 2.0)), device="CLANG")
  assert k.specs[1].shape == (M + 5, K) and k.specs[1].declared == (M + 5) * K
  a = rand(M + 5, K)
  out = np.zeros((M, K), np.float32)
  k(out, a)
  assert np.array_equal(out, a[:M] * 2)
  with pytest.raises(ArgumentError, match=r"input 1 .* must have shape \(11, 4\) .* got an array of shape \(6, 4\)"): k(out, rand(M, K))
  one = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (2,))[0] + 1.0)), device="CLANG")
  res = np.zeros((), np.float32)
  one(res, np.array([3, 4], np.float32))
  assert res == 4.0


_moves = st.sampled_from(["permute", "flip", "pad", "expand"])


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), moves=st.lists(st.tuples(_moves, st.randoms(use_true_random=False)), max_size=4))
def test_declared_shape_is_recovered_through_movement(shape, moves):
  t = ShapeTracker.from_shape(tuple(shape))
  for move, rng in moves:
    nd = len(t.shape)
    if move == "permute": t = t.permute(tuple(rng.sample(range(nd), nd)))
    elif move == "flip": t = t.flip(tuple(i for i in range(nd) if rng.random() < 0.5))
    elif move == "pad": t = t.pad(tuple((rng.randint(0, 2), rng.randint(0, 2)) for _ in range(nd)))
    else: t = t.reshape(t.shape + (1,)).expand(t.shape + (rng.randint(1, 3),))
  got = declared_shape(t)
  assert got is not None and tuple(d for d in got if d != 1) == tuple(d for d in shape if d != 1)
  assert np.prod(got) == t.real_size()


def test_symbolic_shapes_are_checked_at_the_variables_values():
  n = Variable("n", 1, 16)
  k = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (n, K)).sum(1))), device="CLANG")
  x = rand(5, K)
  out = np.zeros((5, 1), np.float32)
  k(out, x, n=5)
  assert np.allclose(out[:, 0], x.sum(1), atol=1e-6)
  with pytest.raises(ArgumentError, match=r"input 1 .* shape \(4, 4\).*\(5, 4\)"): k(np.zeros((4, 1), np.float32), x, n=4)
  with pytest.raises(ArgumentError, match=r"output 0 .* shape \(5,\).*\(4, 1\)"): k(np.zeros((4, 1), np.float32), x, n=5)
  outs = kc.run(A.sink(A.store(0, A.arg(1, dtypes.float32, (n, K)).sum(1))), {1: x[:3]}, device="CLANG", n=3)
  assert outs[0].shape == (3,) and np.allclose(outs[0], x[:3].sum(1), atol=1e-6)


def test_single_opt_is_accepted_like_a_list():
  sink = A.sink(A.store(0, F(1, 16, 16).sum(1)))
  opt = kc.Opt(kc.OptOps.UNROLL, 0, 4)
  k = kc.compile(sink, device="CLANG", opts=opt)
  assert k.kernel.applied_opts == [opt] == kc.compile(sink, device="CLANG", opts=(opt,)).kernel.applied_opts
  x = rand(16, 16)
  assert np.allclose(kc.run(sink, {1: x}, device="CLANG", opts=opt)[0], x.sum(1), atol=1e-5)


@pytest.mark.parametrize("opts", [3, {"UNROLL": 4}, [kc.Opt(kc.OptOps.UNROLL, 0, 4), "hand"], (kc.OptOps.UNROLL, 0, 4), b"hand"])
def test_bad_opts_type_is_a_typed_error(opts):
  with pytest.raises(KcError, match=r"opts must be 'hand', 'none', 'beam', a kc.Opt or a list of kc.Opt"):
    kc.compile(A.sink(A.store(0, F(1, 16) + 1.0)), device="CLANG", opts=opts)


def _count_launches(monkeypatch, k) -> list:
  """Every launch's buffers, as the program got them: through its handle, or (a plain call's fast path, where the kernel
  has one) the arrays themselves, recorded as HostMemory over them."""
  launches = []
  real = k._handle
  monkeypatch.setattr(k, "_handle", lambda *a, **kw: launches.append(a) or real(*a, **kw))
  if k._fast is not None:
    take, wants = k._fast
    monkeypatch.setattr(k, "_fast", (lambda arrays: launches.append(tuple(HostMemory(x) for x in arrays)) or take(arrays), wants))
  return launches


@pytest.mark.parametrize("device", HOST)
def test_a_call_that_writes_nothing_launches_nothing(monkeypatch, device):
  n = Variable("n", 0, 8)
  k = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (n, K)) + 1.0)), device=device)
  launches = _count_launches(monkeypatch, k)
  assert k(np.zeros((0, K), np.float32), np.zeros((0, K), np.float32), n=0) == 0.0 and launches == []
  with pytest.raises(ArgumentError, match=r"shape \(0, 4\)"): k(np.zeros((1, K), np.float32), np.zeros((0, K), np.float32), n=0)
  out = np.zeros((2, K), np.float32)
  assert k(out, np.ones((2, K), np.float32), n=2) >= 0 and len(launches) == 1 and (out == 2).all()
  static = kc.compile(A.sink(A.store(0, F(1, 0, K) + 1.0)), device=device, opts="none")
  launches = _count_launches(monkeypatch, static)
  assert static(np.zeros((0, K), np.float32), np.zeros((0, K), np.float32)) == 0.0 and launches == []
  assert kc.run(A.sink(A.store(0, F(1, 0, K) + 1.0)), {1: np.zeros((0, K), np.float32)}, device=device, opts="none")[0].shape == (0, K)


@pytest.mark.parametrize("device", HOST)
def test_an_empty_reduce_still_writes_its_identity(device):
  n = Variable("n", 0, 8)
  k = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (K, n)).sum(1))), device=device)
  out = np.full((K, 1), 7, np.float32)
  k(out, np.zeros((K, 0), np.float32), n=0)
  assert (out == 0).all()


@pytest.fixture
def copies(monkeypatch):
  """Counts host copies in and out of device memory."""
  count = {"in": 0, "out": 0}
  real_in, real_out = HostAllocator.copyin, HostAllocator.copyout
  monkeypatch.setattr(HostAllocator, "copyin", lambda self, d, s: count.__setitem__("in", count["in"] + 1) or real_in(self, d, s))
  monkeypatch.setattr(HostAllocator, "copyout", lambda self, d, s: count.__setitem__("out", count["out"] + 1) or real_out(self, d, s))
  return count


@pytest.mark.parametrize("device", HOST)
def test_host_devices_use_numpy_arrays_in_place(monkeypatch, copies, device):
  k = kc.compile(A.sink(A.store(0, F(1, M, K) + F(2, M, K))), device=device)
  launches = _count_launches(monkeypatch, k)
  a, b = rand(M, K), rand(M, K)
  out = np.zeros((M, K), np.float32)
  k(out, a, b)
  assert np.array_equal(out, a + b) and copies == {"in": 0, "out": 0}
  handles = dict(zip(k.program.globals, launches[0]))
  assert all(isinstance(h, HostMemory) for h in handles.values())
  assert handles[0].data is out and handles[1].data is a and handles[2].data is b  # the arrays themselves, not copies


@pytest.mark.parametrize("device", HOST)
def test_misaligned_arrays_are_copied_and_right(copies, device):
  k = kc.compile(A.sink(A.store(0, F(1, M, K) * 3.0)), device=device)
  raw_in, raw_out = np.zeros(M * K * 4 + 1, np.uint8), np.zeros(M * K * 4 + 1, np.uint8)
  a = np.frombuffer(raw_in.data, np.float32, M * K, offset=1).reshape(M, K)  # an odd byte address
  a.flags.writeable = True
  out = np.frombuffer(raw_out.data, np.float32, M * K, offset=1).reshape(M, K)
  assert not a.flags.aligned and not out.flags.aligned and a.flags.c_contiguous
  a[:] = rand(M, K)
  k(out, a)
  assert np.array_equal(out, a * 3) and copies == {"in": 2, "out": 1}


def test_device_memory_is_not_host_memory_by_default():
  class DeviceOnly(Allocator):
    def _alloc(self, nbytes, options): return bytearray(nbytes)
    def copyin(self, dest, src): dest[:] = src
    def copyout(self, dest, src): dest[:] = src
  assert DeviceOnly().from_numpy(np.zeros(4, np.float32)) is None
  assert isinstance(HostAllocator().from_numpy(np.zeros(4, np.float32)), HostMemory)
  assert HostAllocator().from_numpy(np.zeros(8, np.float32)[::2]) is None


def test_specs_record_declared_shapes_and_outputs():
  specs = buffer_specs(A.sink(A.store(0, F(1, 3, 4).permute(1, 0).flip(0) + F(2, 4, 3))), "k")
  assert [(s.index, s.output, s.shape, s.elements) for s in specs] == [(0, True, (4, 3), 12), (1, False, (3, 4), 12), (2, False, (4, 3), 12)]


@pytest.mark.parametrize("device", HOST)
def test_an_output_that_overlaps_an_input_is_right(device):
  # in place, the transpose would read elements it already overwrote; the output is written to a copy instead
  k = kc.compile(A.sink(A.store(0, F(1, M, M).permute(1, 0) + 0.0)), device=device)
  x = rand(M, M)
  keep = x.copy()
  k(x, x)
  assert np.array_equal(x, keep.T)
