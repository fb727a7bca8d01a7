"""DLPack and streams on CUDA against the stand-in driver of test_cuda_runtime (host memory standing in for device
memory, so pointers are real addresses): a framework's CUDA tensors are used in place by kc's kernels and by
kc.from_dlpack, kc's buffers are exported as CUDA memory, `stream=` launches on the caller's stream and hands that
stream to the producers, and memory kc cannot use in place is copied or refused with a typed error."""
import ctypes, gc, sys
from types import SimpleNamespace
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
import kc
from kc import ast as A, dtypes
from kc.backend import PLUGIN_API_VERSION, BackendSpec, register, unregister
from kc.runtime import dlpack

pytest.importorskip("kc_cuda.compiler")
from test_cuda_runtime import H100, FakeDriver  # noqa: E402  (the stand-in driver and the GPU it describes)

NAME = "FAKECUDA"


class StreamDriver(FakeDriver):
  """FakeDriver whose streams are handles (ints, as CUstreams are) and whose launches run any kernel: each program
  runs `self.run(pointers)` on the addresses of its buffers and records the stream it was launched on."""

  def __init__(self):
    super().__init__()
    self.streams, self.waits, self.run = [], [], None

  def cuStreamCreate(self, flags): return self.ok(0x5000)
  def cuModuleGetFunction(self, module, name): return self.ok(name.decode())
  def cuStreamWaitEvent(self, stream, event, flags): self.waits.append(stream); return self.ok()

  def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
    assert self.current == "ctx" and extra == 0
    self.streams.append(stream)
    self.launches.append(((gx, gy, gz), (bx, by, bz), shared))
    self.run(params)
    return self.ok()


def _pointers(params: int, n: int) -> list[int]:
  slots = (ctypes.c_void_p * n).from_address(params)
  return [ctypes.c_uint64.from_address(slots[i]).value for i in range(n)]


@pytest.fixture
def gpu(monkeypatch):
  import kc_cuda.runtime as runtime
  drv = StreamDriver()
  monkeypatch.setattr(runtime, "cu", drv)
  monkeypatch.setattr(runtime, "init_driver", lambda: None)
  monkeypatch.setattr(runtime, "device_props", lambda ordinal: H100)
  dev = runtime.CUDADevice(NAME, 0, "kc-cuda test")
  register(BackendSpec(NAME, PLUGIN_API_VERSION, -2000, lambda: None, lambda: dev), replace=True)
  try: yield drv, dev
  finally: unregister(NAME)


class CudaTensor:
  """A framework's tensor in (stand-in) device memory, exported as DLPack device (kDLCUDA, `ordinal`): what a torch or
  cupy CUDA tensor is to kc. It records the streams consumers ask it to make its data ready on."""

  def __init__(self, dev, values: np.ndarray, dtype=None, strides=None, shape=None, offset: int = 0, ordinal: int = 0):
    self.memory = dev.allocator.alloc(values.nbytes + offset)
    dev.allocator.copyin(dev.allocator.offset(self.memory, values.nbytes, offset), memoryview(values.reshape(-1).view(np.uint8)))
    self.address, self.ordinal, self.streams = self.memory.ptr + offset, ordinal, []
    self.dtype = dtype or dtypes.from_numpy(values.dtype)
    self.shape, self.strides = shape or values.shape, strides

  def __dlpack_device__(self): return (dlpack.kDLCUDA, self.ordinal)

  def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
    self.streams.append(stream)
    return dlpack.export_capsule(self.address, self.shape, self.dtype, self.__dlpack_device__(), self,
                                 versioned=max_version is not None, strides=self.strides)

  def host(self, n: int, dtype) -> np.ndarray: return np.frombuffer(ctypes.string_at(self.address, n * np.dtype(dtype).itemsize), dtype)


def _doubling(drv, n: int):
  """The compiled kernel `out = x * 2` (float32, n elements), run by the stand-in as numpy on the buffers' addresses."""
  def run(params):
    out, x = drv.last_pointers = _pointers(params, 2)
    src = np.frombuffer((ctypes.c_float * n).from_address(x), np.float32)
    np.frombuffer((ctypes.c_float * n).from_address(out), np.float32)[:] = src * 2
  drv.run = run
  return kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (n,)) * 2)), device=NAME, opts="none")


def test_a_cuda_buffer_exports_cuda_memory(gpu):
  drv, dev = gpu
  buf = kc.Buffer(NAME, 16, dtypes.float32).copyin(np.arange(16, dtype=np.float32))
  assert buf.__dlpack_device__() == (dlpack.kDLCUDA, 0)
  t = dlpack.import_tensor(buf, stream=0x9000)
  assert t.address == buf._buf.ptr and t.shape == (16,) and t.device == (2, 0) and t.dtype == dtypes.float32
  assert drv.waits == [0x9000]  # the consumer's stream waits for kc's work
  cai = buf.__cuda_array_interface__
  assert cai["version"] == 3 and cai["data"] == (buf._buf.ptr, False) and cai["typestr"] == "<f4" and cai["shape"] == (16,)
  assert cai["stream"] == 0x5000
  assert kc.Buffer(NAME, 2, dtypes.bfloat16).__cuda_array_interface__["typestr"] == "|V2"
  assert not hasattr(kc.Buffer("EMU", 4, dtypes.float32), "__cuda_array_interface__")


def test_dl_device_cpu_gives_a_host_copy(gpu):
  drv, dev = gpu
  data = np.arange(8, dtype=np.int32)
  buf = kc.Buffer(NAME, 8, dtypes.int32).copyin(data)
  t = dlpack.import_tensor(buf, dl_device=(dlpack.kDLCPU, 0), copy=True)
  assert t.device == (dlpack.kDLCPU, 0) and t.address != buf._buf.ptr
  np.testing.assert_array_equal(t.numpy(), data)
  with pytest.raises(dlpack.DLPackError, match="copy=False"): buf.__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=False)


def test_from_dlpack_wraps_cuda_memory_in_place(gpu):
  drv, dev = gpu
  data = np.arange(32, dtype=np.float32)
  producer = CudaTensor(dev, data)
  buf = kc.from_dlpack(producer, device=NAME)
  assert buf._buf.ptr == producer.address and buf.size == 32 and buf.dtype == dtypes.float32
  assert producer.streams == [0x5000]  # the producer makes its data ready on kc's stream
  np.testing.assert_array_equal(buf.numpy(), data)
  ref = producer.memory
  del producer
  gc.collect()
  assert buf._buf.owner is not None and ref.ptr in drv.memory  # the capsule, so the producer, lives with the Buffer
  with pytest.raises(dlpack.DLPackError, match="EMU"): kc.from_dlpack(CudaTensor(dev, data), device="EMU")
  with pytest.raises(dlpack.DLPackError, match="CUDA:1"): kc.from_dlpack(CudaTensor(dev, data, ordinal=1), device=NAME)


def test_kernel_uses_cuda_tensors_in_place(gpu):
  drv, dev = gpu
  k = _doubling(drv, 64)
  x, out = CudaTensor(dev, np.arange(64, dtype=np.float32)), CudaTensor(dev, np.zeros(64, np.float32))
  k(out, x)
  assert drv.last_pointers == [out.address, x.address]  # no copy: the kernel ran on the producers' memory
  np.testing.assert_array_equal(out.host(64, np.float32), np.arange(64, dtype=np.float32) * 2)
  assert drv.streams[-1] == 0x5000 and x.streams == [0x5000] and out.streams == [0x5000]


def test_stream_argument_launches_there_and_tells_the_producers(gpu):
  drv, dev = gpu
  k = _doubling(drv, 8)
  torch_like, cupy_like = SimpleNamespace(cuda_stream=0x7100), SimpleNamespace(ptr=0x7200)
  for stream, handle in ((0x7000, 0x7000), (torch_like, 0x7100), (cupy_like, 0x7200), (0, 1)):
    x, out = CudaTensor(dev, np.ones(8, np.float32)), CudaTensor(dev, np.zeros(8, np.float32))
    k(out, x, stream=stream)
    assert drv.streams[-1] == handle and x.streams == [handle] and out.streams == [handle]
  fake_torch = SimpleNamespace(cuda=SimpleNamespace(current_stream=lambda ordinal: SimpleNamespace(cuda_stream=0x7300 + ordinal)))
  with pytest.MonkeyPatch.context() as mp:
    mp.setitem(sys.modules, "torch", fake_torch)
    x, out = CudaTensor(dev, np.ones(8, np.float32)), CudaTensor(dev, np.zeros(8, np.float32))
    k(out, x, stream="torch")  # torch's current stream on the kernel's GPU
    assert drv.streams[-1] == 0x7300 and x.streams == [0x7300]
  for bad in ("default", -3, 1.5, True):
    with pytest.raises(kc.ArgumentError, match="no CUDA stream"): k(out, x, stream=bad)
  host = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (8,)) * 2)), device="EMU")  # in the core: kc-cuda's CI venv has no CLANG
  with pytest.raises(kc.ArgumentError, match="has no streams"): host(np.zeros(8, np.float32), np.ones(8, np.float32), stream=0x7000)


def test_cuda_memory_of_another_gpu_or_on_a_host_device_is_refused(gpu):
  drv, dev = gpu
  k = _doubling(drv, 8)
  with pytest.raises(kc.ArgumentError, match=r"input 1 .* on CUDA:1, which FAKECUDA kernels cannot read"):
    k(CudaTensor(dev, np.zeros(8, np.float32)), CudaTensor(dev, np.ones(8, np.float32), ordinal=1))
  host = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (8,)) * 2)), device="EMU")
  with pytest.raises(kc.ArgumentError, match="on CUDA:0, which EMU kernels cannot read"):
    host(np.zeros(8, np.float32), CudaTensor(dev, np.ones(8, np.float32)))


def test_host_tensors_are_copied_to_the_gpu_and_back(gpu):
  drv, dev = gpu
  torch = pytest.importorskip("torch")
  k = _doubling(drv, 16)
  x, out = torch.arange(16, dtype=torch.float32), torch.zeros(16)
  k(out, x)
  assert torch.equal(out, x * 2)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step=st.integers(1, 3), offset=st.sampled_from([0, 4, 8, 16]))
def test_strided_or_misaligned_cuda_inputs_are_copied(gpu, step, offset):
  """A view of device memory that is not contiguous, or not where the kernel's float4 loads may start, is copied into a
  fresh buffer by way of the host; a misaligned output is written to a copy and copied back."""
  drv, dev = gpu
  n = 16
  k = _doubling(drv, n)
  k.specs[1].alignment = k.specs[0].alignment = 16  # as a kernel upcast to float4 declares
  data = np.arange(n * step, dtype=np.float32)
  x = CudaTensor(dev, data, shape=(n,), strides=(step,), offset=offset)
  out = CudaTensor(dev, np.zeros(n, np.float32), offset=offset)
  k(out, x)
  np.testing.assert_array_equal(out.host(n, np.float32), data[::step] * 2)
  in_place = step == 1 and offset % 16 == 0
  assert (drv.last_pointers[1] == x.address) == in_place and (drv.last_pointers[0] == out.address) == (offset % 16 == 0)


def test_non_contiguous_or_read_only_cuda_outputs_are_errors(gpu):
  drv, dev = gpu
  k = _doubling(drv, 8)
  out = CudaTensor(dev, np.zeros(16, np.float32), shape=(8,), strides=(2,))
  with pytest.raises(kc.ArgumentError, match=r"output 0 .* not C-contiguous \(strides \(2,\)"): k(out, CudaTensor(dev, np.ones(8, np.float32)))
  with pytest.raises(kc.ArgumentError, match="float32"):
    k(CudaTensor(dev, np.zeros(8, np.float32)), CudaTensor(dev, np.ones(8, np.int32)))
  with pytest.raises(kc.ArgumentError, match=r"shape \(8,\)"):
    k(CudaTensor(dev, np.zeros(8, np.float32)), CudaTensor(dev, np.ones((2, 4), np.float32)))
