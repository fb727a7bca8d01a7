"""The runtime API: Buffer, allocators, the device registry (the Compiler's disk cache is in test_cache.py). Runs on
an in-process host device, so the core is tested without any plugin."""
import numpy as np
import pytest
import kc
import kc.backend
from kc import dtypes
# the device API as a backend sees it: through the contract module
from kc.backend import (PLUGIN_API_VERSION, Allocator, BackendSpec, Compiler, CompiledDevice, HostAllocator, InvalidBufferError,
                        LRUAllocator)
from kc.runtime.device import Buffer
from kc.errors import DTypeError, KcError


class EchoCompiler(Compiler):
  """A compiler whose binary is the source: enough for devices whose tests never run a kernel."""
  def compile_uncached(self, src): return src.encode()


class BytesAllocator(Allocator):
  """The smallest concrete allocator: bytearrays, no views."""
  def _alloc(self, nbytes, options): return bytearray(nbytes)
  def copyin(self, dest, src): dest[:] = bytes(src)
  def copyout(self, dest, src): dest[:] = src

DEV = "HOSTTEST"


class CountingHostAllocator(HostAllocator):
  def __init__(self):
    super().__init__()
    self.allocs = 0
  def _alloc(self, nbytes, options):
    self.allocs += 1
    return super()._alloc(nbytes, options)


@pytest.fixture
def host():
  allocator = CountingHostAllocator()
  dev = CompiledDevice(DEV, allocator, None, EchoCompiler(), lambda name, lib: None)
  kc.backend.register(BackendSpec(DEV, PLUGIN_API_VERSION, -100, lambda: None, lambda: dev), replace=True)
  yield dev
  kc.backend.unregister(DEV)


# ------------------------------------------------------------------------------------------------------------ Buffer

@pytest.mark.parametrize("dt", [dtypes.bool, dtypes.int8, dtypes.uint16, dtypes.int32, dtypes.int64, dtypes.float16,
                                dtypes.float32, dtypes.float64])
def test_round_trip_matches_numpy(host, dt):
  data = (np.arange(37) * 7 - 50).astype(dt.np)
  buf = Buffer(DEV, 37, dt).allocate().copyin(data)
  out = buf.numpy()
  assert out.dtype == dt.np and np.array_equal(out, data)
  assert buf.nbytes == 37 * dt.itemsize


def test_copyin_bytes_and_copyout_memoryview(host):
  data = np.linspace(0, 1, 10, dtype=np.float32)
  buf = Buffer(DEV, 10, dtypes.float32).copyin(data.tobytes())  # copyin allocates when needed
  out = np.zeros(10, np.float32)
  buf.copyout(memoryview(out))
  assert np.array_equal(out, data)
  raw = bytearray(40)
  buf.copyout(memoryview(raw))
  assert bytes(raw) == data.tobytes()


def test_host_memory_is_64_byte_aligned(host):
  for n in (1, 3, 100, 4097):
    assert Buffer(DEV, n, dtypes.uint8).allocate()._buf.addr % 64 == 0


def test_views_share_memory_at_byte_offsets(host):
  base = Buffer(DEV, 16, dtypes.float32).copyin(np.arange(16, dtype=np.float32))
  v = base.view(4, dtypes.float32, offset=8 * 4)
  assert np.array_equal(v.numpy(), [8, 9, 10, 11])
  v.copyin(np.full(4, -1, np.float32))
  expect = np.arange(16, dtype=np.float32)
  expect[8:12] = -1
  assert np.array_equal(base.numpy(), expect)
  # a view of a view adds the offsets and still shares the root's memory
  vv = v.view(2, dtypes.float32, offset=4)
  assert vv.base is base and vv.offset == 36 and np.array_equal(vv.numpy(), [-1, -1])
  # a view may reinterpret the bytes as another dtype
  as_int = base.view(2, dtypes.int32, offset=0)
  assert np.array_equal(as_int.numpy(), expect[:2].view(np.int32))


@pytest.mark.parametrize("size,offset", [(5, 0), (1, 16), (4, -4), (2, 12)])
def test_out_of_range_views_raise(host, size, offset):
  base = Buffer(DEV, 4, dtypes.float32)
  with pytest.raises(InvalidBufferError, match="does not fit"):
    base.view(size, dtypes.float32, offset=offset)


def test_view_of_view_is_bounded_by_its_parent_not_only_the_root(host):
  base = Buffer(DEV, 16, dtypes.float32)
  v = base.view(4, dtypes.float32, offset=0)
  with pytest.raises(InvalidBufferError):
    v.view(5, dtypes.float32)  # fits in the root, not in the view


def test_copyin_checks_size_and_dtype_and_never_writes_outside(host):
  base = Buffer(DEV, 8, dtypes.float32).copyin(np.zeros(8, np.float32))
  v = base.view(4, dtypes.float32, offset=8)
  with pytest.raises(InvalidBufferError, match="5 elements into a buffer of 4"):
    v.copyin(np.ones(5, np.float32))
  with pytest.raises(InvalidBufferError, match="20 bytes into a buffer of 16"):
    v.copyin(np.ones(5, np.float32).tobytes())
  with pytest.raises(DTypeError, match="float64.*astype"):
    v.copyin(np.ones(4, np.float64))
  with pytest.raises(DTypeError, match="format 'i'"):
    v.copyin(memoryview(np.ones(4, np.int32)))
  assert np.array_equal(base.numpy(), np.zeros(8, np.float32))
  with pytest.raises(InvalidBufferError, match="into 12 bytes"):
    base.copyout(memoryview(bytearray(12)))
  with pytest.raises(InvalidBufferError, match="writable"):
    base.copyout(memoryview(bytes(32)))


def test_bad_buffers_raise_typed_errors(host):
  with pytest.raises(InvalidBufferError): Buffer(DEV, -1, dtypes.float32)
  with pytest.raises(DTypeError): Buffer(DEV, 4, np.float32)
  with pytest.raises(DTypeError, match="no numpy dtype"): Buffer(DEV, 4, dtypes.bfloat16).allocate().numpy()
  with pytest.raises(InvalidBufferError, match="never allocated"): Buffer(DEV, 4, dtypes.int32).numpy()
  with pytest.raises(KcError, match="unknown device 'NOPE'"): Buffer("nope", 4, dtypes.int32).allocate()


def test_freed_buffer_memory_is_reused(host):
  b = Buffer(DEV, 256, dtypes.float32).allocate()
  handle = b._buf
  del b
  assert Buffer(DEV, 256, dtypes.float32).allocate()._buf is handle
  assert host.allocator.allocs == 1


def test_adopted_memory_is_not_recycled(host):
  mine = host.allocator.alloc(64)
  b = Buffer(DEV, 16, dtypes.float32).allocate(opaque=mine)
  assert b._buf is mine
  del b
  assert not host.allocator.cache.get((64, None))


# ------------------------------------------------------------------------------------------------------------ allocators

class FakeDeviceMemory(LRUAllocator):
  """A device with `capacity` bytes; every live or cached buffer counts against it."""
  def __init__(self, capacity):
    super().__init__()
    self.capacity, self.used, self.freed, self.next_id = capacity, 0, [], 0
  def _alloc(self, nbytes, options):
    if self.used + nbytes > self.capacity: raise MemoryError(f"out of device memory: {self.used}+{nbytes} > {self.capacity}")
    self.used += nbytes
    self.next_id += 1
    return ("handle", self.next_id)
  def _free(self, opaque, nbytes, options):
    self.used -= nbytes
    self.freed.append(opaque)
  def copyin(self, dest, src): pass  # the out-of-memory tests never move data
  def copyout(self, dest, src): pass


def test_lru_reuses_only_same_size_and_options():
  a = FakeDeviceMemory(1000)
  h = a.alloc(100)
  a.free(h, 100)
  assert a.alloc(100) is h
  a.free(h, 100)
  assert a.alloc(100, options="uncached") is not h
  assert a.alloc(50) is not h
  assert a.alloc(100) is h


def test_free_cache_returns_memory_to_the_device():
  a = FakeDeviceMemory(1000)
  hs = [a.alloc(100) for _ in range(3)]
  for h in hs: a.free(h, 100)
  assert a.used == 300
  a.free_cache()
  assert a.used == 0 and sorted(a.freed) == sorted(hs) and not a.cache


def test_oom_frees_the_cache_and_retries_once():
  a = FakeDeviceMemory(300)
  for h in [a.alloc(100), a.alloc(100)]: a.free(h, 100)   # 200 bytes sit in the cache
  h = a.alloc(250)                                          # fits only once the cache is freed
  assert h is not None and len(a.freed) == 2 and a.used == 250
  with pytest.raises(kc.AllocationError, match="out of memory.*100 bytes") as info:  # nothing cached left to free
    a.alloc(100)
  assert isinstance(info.value, MemoryError) and "out of device memory" in str(info.value.__cause__)


def test_a_backends_own_typed_oom_error_reaches_the_caller_as_it_is():
  class DeviceOOM(KcError, MemoryError): pass
  class Typed(FakeDeviceMemory):
    def _alloc(self, nbytes, options):
      try: return super()._alloc(nbytes, options)
      except MemoryError as e: raise DeviceOOM(str(e)) from None
  with pytest.raises(DeviceOOM): Typed(100).alloc(200)


def test_oom_after_freeing_the_cache_is_an_allocation_error():
  a = FakeDeviceMemory(300)
  a.free(a.alloc(100), 100)
  with pytest.raises(kc.AllocationError, match="400 bytes"): a.alloc(400)
  assert a.used == 0 and not a.cache  # the cache was given back before the second try


@pytest.mark.parametrize("size", [2 ** 61, 2 ** 70])
def test_a_host_buffer_larger_than_memory_is_an_allocation_error(size):
  with pytest.raises(kc.AllocationError, match="cannot allocate"): kc.Buffer("CLANG", size, kc.dtypes.float32).allocate()


def test_backend_oom_errors_are_declared_by_the_allocator():
  class DeviceOOM(Exception): pass
  class Picky(FakeDeviceMemory):
    oom_errors = (DeviceOOM,)
    def _alloc(self, nbytes, options):
      try: return super()._alloc(nbytes, options)
      except MemoryError as e: raise DeviceOOM(str(e)) from None
  a = Picky(100)
  a.free(a.alloc(100), 100)
  assert a.alloc(60) is not None and a.freed


def test_allocator_without_views_says_so():
  with pytest.raises(KcError, match="does not support buffer views"):
    BytesAllocator().offset(object(), 4, 0)
