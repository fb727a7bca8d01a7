"""numpy arguments on OPENCL: on a device whose memory is the host's (PoCL's CPU device) an array whose address suits the
kernel is wrapped in place (CL_MEM_USE_HOST_PTR) and an output is mapped after the kernel, so that nothing is copied;
everything else (non-contiguous or misaligned arrays, an output sharing memory with an input, a device with memory of
its own) is copied in and back as before. Either way the numbers are numpy's. Also the kc.Buffer call's launch:
arguments set only when they change, Variables and launch shapes per call."""
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
import kc
from kc import Buffer, Variable, dtypes
from kc import ast as A
from kc.errors import KcError
import kc_opencl

REASON = kc_opencl.unavailable_reason()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=f"OPENCL cannot open here: {REASON}"), pytest.mark.usefixtures("cache_dir")]

if REASON is None:
  import pyopencl as cl
  from kc_opencl.runtime import OpenCLAllocator, OpenCLProgram

N = 37  # not a multiple of any vector width: the kernels' tails are exercised too


def add_kernel(dt=dtypes.float32, n=N, opts=None):
  x, y = A.arg(1, dt, (n,)), A.arg(2, dt, (n,))
  # float16 is added in float32 (a device without cl_khr_fp16 still loads and stores it), as numpy adds it
  total = (x.cast(dtypes.float32) + y.cast(dtypes.float32)).cast(dt) if dt == dtypes.float16 else x + y
  return kc.compile(A.sink(A.store(0, total)), device="OPENCL", opts=opts)


def values(n: int, dt, seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  return rng.integers(-50, 50, n).astype(dt.np) if dtypes.is_int(dt) else rng.standard_normal(n).astype(dt.np)


def at_offset(arr: np.ndarray, offset: int) -> np.ndarray:
  """A copy of `arr` placed `offset` bytes past a 64-byte boundary: misaligned for its elements where offset is not a
  multiple of their size."""
  raw = np.zeros(arr.nbytes + 64 + offset, np.uint8)
  start = -raw.ctypes.data % 64 + offset
  out = raw[start:start + arr.nbytes].view(arr.dtype)
  out[...] = arr
  return out


@pytest.fixture
def copies(monkeypatch):
  """Counts copies between host memory and OPENCL buffers, and maps of buffers."""
  count = {"in": 0, "out": 0, "map": 0}
  real_in, real_out, real_map = OpenCLAllocator.copyin, OpenCLAllocator.copyout, cl.enqueue_map_buffer
  monkeypatch.setattr(OpenCLAllocator, "copyin", lambda self, d, s: count.__setitem__("in", count["in"] + 1) or real_in(self, d, s))
  monkeypatch.setattr(OpenCLAllocator, "copyout", lambda self, d, s: count.__setitem__("out", count["out"] + 1) or real_out(self, d, s))
  monkeypatch.setattr(cl, "enqueue_map_buffer", lambda *a, **kw: count.__setitem__("map", count["map"] + 1) or real_map(*a, **kw))
  return count


def launched(monkeypatch, k) -> list:
  """Every launch's buffers, as the program got them."""
  launches, real = [], k._handle
  monkeypatch.setattr(k, "_handle", lambda *a, **kw: launches.append(a) or real(*a, **kw))
  return launches


def host_pointer(buf) -> int:
  """The host memory a buffer wraps (CL_MEM_USE_HOST_PTR), 0 for one of the device's own memory (a kc.Buffer: a copy)."""
  if isinstance(buf, Buffer): return 0
  if not buf.get_info(cl.mem_info.FLAGS) & cl.mem_flags.USE_HOST_PTR: return 0
  return buf.get_host_array((1,), np.uint8).ctypes.data


def test_pocl_cpu_device_shares_the_hosts_memory():
  assert kc.Device["OPENCL"].allocator.host_memory  # the rest of this file's zero-copy checks assume it


def test_numpy_arguments_are_used_in_place_and_outputs_mapped(monkeypatch, copies):
  k = add_kernel()
  launches = launched(monkeypatch, k)
  x, y, out = values(N, dtypes.float32, 1), values(N, dtypes.float32, 2), np.zeros(N, np.float32)
  k(out, x, y)
  np.testing.assert_array_equal(out, x + y)
  assert (copies["in"], copies["out"], copies["map"]) == (0, 0, 1)  # the output is mapped once, nothing is copied
  assert [host_pointer(b) for b in launches[0]] == [a.ctypes.data for a in (out, x, y)]  # the arrays' own memory
  assert not kc.Device["OPENCL"].allocator._mapped  # and unmapped again


def test_read_only_inputs_are_used_in_place(monkeypatch, copies):
  k = add_kernel()
  launches = launched(monkeypatch, k)
  x, y, out = values(N, dtypes.float32, 1), values(N, dtypes.float32, 2), np.zeros(N, np.float32)
  x.flags.writeable = False
  k(out, x, y)
  np.testing.assert_array_equal(out, x + y)
  assert copies["in"] == 0 and host_pointer(launches[0][1]) == x.ctypes.data
  assert launches[0][1].get_info(cl.mem_info.FLAGS) & cl.mem_flags.READ_ONLY


def test_results_match_kc_buffers_and_numpy_over_many_calls():
  k = add_kernel()
  bo, bx, by = (Buffer("OPENCL", N, dtypes.float32).allocate() for _ in range(3))
  for seed in range(5):
    x, y, out = values(N, dtypes.float32, seed), values(N, dtypes.float32, seed + 10), np.full(N, np.nan, np.float32)
    k(out, x, y)
    k(bo, bx.copyin(x), by.copyin(y))
    np.testing.assert_array_equal(out, x + y)
    np.testing.assert_array_equal(bo.numpy(), out)


def test_an_output_sharing_an_input_is_written_to_a_copy(copies):
  # the output reversed from the input: written in place, the kernel would read elements it already overwrote
  k = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (N,)).flip(0))), device="OPENCL")
  x = values(N, dtypes.float32)
  want = x[::-1].copy()
  k(x, x)
  np.testing.assert_array_equal(x, want)
  assert copies["out"] == 1  # the general path's copy back


def test_the_sum_of_an_array_with_itself_in_place_is_right():
  k = add_kernel()
  x = values(N, dtypes.float32)
  want = x + x
  k(x, x, x)
  np.testing.assert_array_equal(x, want)


@pytest.mark.parametrize("make", [lambda a: np.repeat(a, 2)[::2], lambda a: at_offset(a, 1)], ids=["strided", "misaligned"])
def test_non_contiguous_and_misaligned_inputs_are_copied_and_right(monkeypatch, copies, make):
  k = add_kernel()
  launches = launched(monkeypatch, k)
  x, y, out = values(N, dtypes.float32, 1), values(N, dtypes.float32, 2), np.zeros(N, np.float32)
  given = make(x)
  assert not (given.flags.c_contiguous and given.flags.aligned)
  k(out, given, y)
  np.testing.assert_array_equal(out, x + y)
  assert copies["in"] == 1 and host_pointer(launches[0][1]) == 0 and host_pointer(launches[0][2]) == y.ctypes.data


def test_a_misaligned_output_is_copied_back():
  k = add_kernel()
  x, y = values(N, dtypes.float32, 1), values(N, dtypes.float32, 2)
  out = at_offset(np.zeros(N, np.float32), 2)
  k(out, x, y)
  np.testing.assert_array_equal(out, x + y)


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.int8], ids=lambda d: d.name)
def test_narrow_dtypes_in_place(monkeypatch, copies, dt):
  k = add_kernel(dt)
  x, y, out = values(N, dt, 1), values(N, dt, 2), np.zeros(N, dt.np)
  k(out, x, y)
  np.testing.assert_array_equal(out, x + y)
  assert copies["in"] == copies["out"] == 0


def test_a_device_with_memory_of_its_own_keeps_copying(monkeypatch, copies):
  allocator = kc.Device["OPENCL"].allocator
  monkeypatch.setattr(allocator, "host_memory", False)
  k = add_kernel()
  x, y, out = values(N, dtypes.float32, 1), values(N, dtypes.float32, 2), np.zeros(N, np.float32)
  k(out, x, y)
  np.testing.assert_array_equal(out, x + y)
  assert (copies["in"], copies["out"], copies["map"]) == (3, 1, 0)


def test_from_numpy_wraps_only_what_a_buffer_can():
  allocator = kc.Device["OPENCL"].allocator
  x = np.arange(8, dtype=np.float32)
  assert host_pointer(allocator.from_numpy(x)) == x.ctypes.data
  assert allocator.from_numpy(x[::2]) is None  # not contiguous
  assert allocator.from_numpy(at_offset(x, 1)) is None  # not aligned for its elements
  assert allocator.from_numpy(np.zeros(0, np.float32)) is None  # OpenCL has no empty buffers


def test_a_call_whose_later_argument_is_refused_leaves_no_map_behind():
  k = add_kernel()
  allocator = kc.Device["OPENCL"].allocator
  out = np.zeros(N, np.float32)
  with pytest.raises(kc.KcError, match="input 2"): k(out, values(N, dtypes.float32), np.zeros(N, np.int32))
  k(np.zeros(N, np.float32), values(N, dtypes.float32), values(N, dtypes.float32))
  assert not allocator._maps_due.buffers and not allocator._mapped


def test_threads_calling_one_kernel_with_their_own_arrays_each_get_their_sums():
  k = add_kernel()
  def work(seed: int) -> bool:
    ok = True
    for i in range(40):
      x, y, out = values(N, dtypes.float32, seed * 100 + i), values(N, dtypes.float32, seed), np.zeros(N, np.float32)
      k(out, x, y)
      ok &= np.array_equal(out, x + y)
    return ok
  with ThreadPoolExecutor(4) as pool: assert all(pool.map(work, range(4)))
  assert not kc.Device["OPENCL"].allocator._mapped


ALL_DTYPES = [dtypes.float32, dtypes.int32, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.float16]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dt=st.sampled_from(ALL_DTYPES), n=st.integers(1, 70), offsets=st.tuples(*[st.integers(0, 16)] * 3),
       opts=st.sampled_from([None, "none"]))
def test_numpy_arguments_at_any_offset_match_numpy(copies, dt, n, offsets, opts):
  """Every array at some byte offset: wrapped in place exactly where its address suits its elements and the kernel's
  vector accesses, copied elsewhere, and the sum numpy's either way."""
  k = add_kernel(dt, n, opts)
  x, y = values(n, dt, 1), values(n, dt, 2)
  out, xs, ys = (at_offset(a, off) for a, off in zip((np.zeros(n, dt.np), x, y), offsets))
  before = dict(copies)
  k(out, xs, ys)
  np.testing.assert_array_equal(out, x + y)
  in_place = [a.ctypes.data % max(dt.itemsize, spec.alignment) == 0 for a, spec in zip((out, xs, ys), k.specs)]
  assert copies["in"] - before["in"] == (not in_place[0]) + (not in_place[1]) + (not in_place[2])
  assert copies["out"] - before["out"] == (not in_place[0])
  assert copies["map"] - before["map"] == in_place[0]


# ---------------------------------------------------------------------------------------------------------- kc.Buffers

def test_arguments_are_set_only_when_they_change(monkeypatch):
  k = add_kernel()
  sets = []
  real = OpenCLProgram._set_args
  monkeypatch.setattr(OpenCLProgram, "_set_args", lambda self, h, v: sets.append(tuple(h)) or real(self, h, v))
  x, y = values(N, dtypes.float32, 1), values(N, dtypes.float32, 2)
  bo, bo2, bx, by = (Buffer("OPENCL", N, dtypes.float32).allocate() for _ in range(4))
  bx.copyin(x), by.copyin(y)
  k(bo, bx, by)
  k(bo, bx, by)
  assert len(sets) <= 1  # the second call binds nothing (the first may not either: an earlier test bound these)
  k(bo2, by, bx)
  assert len(sets) == len(set(sets)) and sets[-1][0] is bo2._buf
  k(bo, bx, by)
  np.testing.assert_array_equal(bo.numpy(), x + y)
  np.testing.assert_array_equal(bo2.numpy(), x + y)
  assert sets[-1][0] is bo._buf


def test_variable_values_and_launch_shapes_change_per_call():
  n = Variable("n", 1, 64)
  k = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (n,)) * 2.0)), device="OPENCL")
  for size in (5, 64, 1, 5, 33):
    x = values(size, dtypes.float32, size)
    out = np.full(size, np.nan, np.float32)
    k(out, x, n=size)
    np.testing.assert_array_equal(out, x * 2)


def test_the_call_reports_the_kernels_time():
  k = add_kernel()
  bo, bx, by = (Buffer("OPENCL", N, dtypes.float32).allocate() for _ in range(3))
  seconds = k(bo, bx, by)
  assert isinstance(seconds, float) and 0 < seconds < 1


def test_an_empty_launch_still_refuses_foreign_handles():
  k = add_kernel()
  with pytest.raises(KcError, match="not OPENCL memory"): k._handle(np.zeros(N, np.float32), 1, 2, global_size=(0, 1, 1), wait=True)


def test_a_kernel_does_not_keep_a_callers_array_alive():
  import gc, weakref
  k = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (64,)) * 2)), device="OPENCL")
  x, out = np.ones(64, np.float32), np.zeros(64, np.float32)
  k(out, x)
  np.testing.assert_array_equal(out, 2 * x)
  gone = weakref.ref(x)
  del x
  gc.collect()
  assert gone() is None  # the wrapped buffer bound to the kernel's argument did not outlive the call


def test_no_kernel_runs_on_an_output_an_earlier_launch_of_the_call_mapped(monkeypatch):
  # kc's programs write each output in one kernel today; the allocator's protocol must not rely on it: a wrapped output
  # a first launch mapped behind itself is unmapped before a second launch of the same call uses it, and read after
  first = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (64,)) * 2)), device="OPENCL")
  second = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (64,)) * 3)), device="OPENCL")
  allocator = kc.Device["OPENCL"].allocator
  real_launch, current, on_mapped = cl.enqueue_nd_range_kernel, [], []
  def launch(queue, kernel, *rest, **kw):  # which of the launch's buffers are mapped as the kernel is queued
    on_mapped.extend(buf for buf, _ in allocator._mapped.values() if any(buf is h for h in current))
    return real_launch(queue, kernel, *rest, **kw)
  monkeypatch.setattr(cl, "enqueue_nd_range_kernel", launch)
  out, a, b = np.zeros(64, np.float32), np.arange(64, dtype=np.float32), np.full(64, 5, np.float32)
  wrapped = allocator.from_numpy(out)
  done = allocator.numpy_written(wrapped)  # the call's callback, as kc.api gets it for an output
  ins = [kc.Buffer("OPENCL", 64, dtypes.float32).allocate().copyin(x) for x in (a, b)]
  for k, x in ((first, ins[0]), (second, ins[1])):
    current[:] = [wrapped, x._buf]
    k._handle(wrapped, x, global_size=k.launch_dims({})[0], local_size=k.launch_dims({})[1], wait=True)
  done()
  assert on_mapped == [] and not allocator._mapped
  np.testing.assert_array_equal(out, b * 3)
