"""DLPack both ways on the host devices: torch and numpy tensors in and out of compiled kernels on CLANG and EMU
without copies, kc.Buffer read by np.from_dlpack and torch.from_dlpack, kc.from_dlpack over other frameworks'
memory, and the typed errors for what cannot be used as given (strides, devices, dtypes, shapes, streams)."""
import ctypes, gc, weakref
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import kc
from kc import ast as A, dtypes
from kc.runtime import dlpack

torch = pytest.importorskip("torch")

DEVICES = ["CLANG", "EMU"]
TORCH = {dtypes.float32: torch.float32, dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16,
         dtypes.int8: torch.int8, dtypes.bool: torch.bool}


def _available(device: str) -> str:
  if device not in kc.Device.available(): pytest.skip(f"{device} cannot open here")
  return device


_KERNELS: dict = {}


def _doubling(device: str, dt, shape: tuple[int, ...]):
  """out = x + x (x | x for bool) as one compiled kernel, cached per device, dtype and shape."""
  key = (device, dt, shape)
  if key not in _KERNELS:
    x = A.arg(1, dt, shape)
    _KERNELS[key] = kc.compile(A.sink(A.store(0, (x | x) if dt == dtypes.bool else x + x)), device=device)
  return _KERNELS[key]


def _random(dt, shape, seed: int):
  g = torch.Generator().manual_seed(seed)
  if dt == dtypes.bool: return torch.rand(shape, generator=g) > 0.5
  if dt == dtypes.int8: return torch.randint(-60, 60, shape, generator=g, dtype=torch.int8)
  return (torch.rand(shape, generator=g) * 8 - 4).to(TORCH[dt])


# ---------------------------------------------------------------------------------------------------------- kernels

@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=20, deadline=None)
@given(dt=st.sampled_from(list(TORCH)), shape=st.sampled_from([(7,), (4, 8), (3, 5, 2), (1, 16)]), seed=st.integers(0, 2**16))
def test_torch_tensors_in_and_out_without_copies(device, dt, shape, seed):
  k = _doubling(_available(device), dt, shape)
  x, out = _random(dt, shape, seed), torch.zeros(shape, dtype=TORCH[dt])
  where = out.data_ptr()
  k(out, x)
  assert out.data_ptr() == where
  assert torch.equal(out, (x | x) if dt == dtypes.bool else x + x)
  # the input is lent too: the handle the kernel gets is the tensor's own memory
  handle, back = k.specs[1].handle(k.specs[1].adopt(x, device, kc.Device[device].allocator, None), {}, device, kc.Device[device].allocator)
  assert handle.addr == x.data_ptr() and back is None


@pytest.mark.parametrize("device", DEVICES)
def test_an_output_written_in_place_is_the_callers_storage(device):
  # the kernel writes into torch's storage: a view of the output sees the result, and nothing else was allocated
  k = _doubling(_available(device), dtypes.float32, (64,))
  storage = torch.zeros(64)
  alias = storage.view(8, 8)
  k(storage, torch.ones(64))
  assert torch.equal(alias, torch.full((8, 8), 2.0))


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=25, deadline=None)
@given(step=st.integers(1, 3), transpose=st.booleans(), flip=st.booleans(), seed=st.integers(0, 2**16))
def test_non_contiguous_inputs_are_copied(device, step, transpose, flip, seed):
  k = _doubling(_available(device), dtypes.float32, (6, 5))
  base = _random(dtypes.float32, (6 * step, 5) if not transpose else (5, 6 * step), seed)
  x = base.T[::step] if transpose else base[::step]
  if flip: x = x.numpy()[::-1]  # numpy exports negative strides
  out = torch.zeros(6, 5)
  k(out, x)
  np.testing.assert_array_equal(out.numpy(), np.asarray(x) * 2)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_outputs_are_errors(device):
  k = _doubling(_available(device), dtypes.float32, (4, 4))
  for out in (torch.zeros(4, 8)[:, ::2], torch.zeros(4, 4).T):
    with pytest.raises(kc.ArgumentError, match=r"output 0 .* torch.Tensor of float32, shape \(4, 4\).* not C-contiguous"):
      k(out, torch.ones(4, 4))


class DeviceTensor:
  """A producer whose memory is on another device (a GPU's, as DLPack device type `kind`)."""
  def __init__(self, kind: int, ordinal: int = 0):
    self.kind, self.ordinal, self.memory = kind, ordinal, np.zeros(16, np.float32)
  def __dlpack_device__(self): return (self.kind, self.ordinal)
  def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
    if dl_device is not None: raise BufferError("this producer cannot copy to another device")
    return dlpack.export_capsule(self.memory.ctypes.data, (16,), dtypes.float32, (self.kind, self.ordinal), self.memory, True)


@pytest.mark.parametrize("device", DEVICES)
def test_memory_of_another_device_is_an_error(device):
  k = _doubling(_available(device), dtypes.float32, (16,))
  for kind, name in ((dlpack.kDLCUDA, "CUDA:0"), (dlpack.kDLOpenCL, "OpenCL:0"), (dlpack.kDLMetal, "Metal:0")):
    with pytest.raises(kc.ArgumentError, match=rf"input 1 of .* on {name}, which {device} kernels cannot read"):
      k(np.zeros(16, np.float32), DeviceTensor(kind))
    with pytest.raises(kc.ArgumentError, match=rf"output 0 of .* on {name}"):
      k(DeviceTensor(kind), np.zeros(16, np.float32))
  if torch.device("meta") is not None:  # torch's tensors without memory refuse to export: a typed error too
    with pytest.raises(kc.ArgumentError, match="input 1"): k(np.zeros(16, np.float32), torch.zeros(16, device="meta"))


def test_dtype_shape_and_non_producers_are_typed_errors():
  k = _doubling(_available("CLANG"), dtypes.bfloat16, (4, 4))
  with pytest.raises(kc.ArgumentError, match=r"input 1 .* must be bfloat16, or its raw bits as uint16, got a torch.Tensor of float16"):
    k(torch.zeros(4, 4, dtype=torch.bfloat16), torch.zeros(4, 4, dtype=torch.float16))
  with pytest.raises(kc.ArgumentError, match=r"must have shape \(4, 4\).* got a torch.Tensor of shape \(4, 5\)|got an array of shape \(4, 5\)"):
    k(torch.zeros(4, 4, dtype=torch.bfloat16), torch.zeros(4, 5, dtype=torch.bfloat16))
  out = torch.zeros(4, 4, dtype=torch.bfloat16)
  k(out, torch.full((4, 4), 0x3F80, dtype=torch.int16).view(torch.uint16))  # bfloat16 1.0 as raw bits, as numpy's uint16
  assert torch.equal(out, torch.full((4, 4), 2.0, dtype=torch.bfloat16))
  with pytest.raises(kc.ArgumentError, match="input 1 .* refused to export .*require gradient"):
    k(out, torch.zeros(4, 4, dtype=torch.bfloat16, requires_grad=True))
  with pytest.raises(kc.ArgumentError, match="must be a numpy array or a kc.Buffer, got list, which is no DLPack"): k(out, [1, 2])
  with pytest.raises(kc.ArgumentError, match="has no streams"): k(out, out.clone(), stream=1)


def test_an_output_sharing_memory_with_an_input_is_right():
  x = A.arg(1, dtypes.float32, (16,))
  k = kc.compile(A.sink(A.store(0, x.flip(0) + 1)), device=_available("CLANG"))
  t = torch.arange(16, dtype=torch.float32)
  want = t.flip(0) + 1
  k(t, t)
  assert torch.equal(t, want)


def test_a_misaligned_output_is_written_to_a_copy_and_copied_back():
  device = _available("CLANG")
  k = _doubling(device, dtypes.float32, (16,))
  k.specs[0].alignment = k.specs[1].alignment = 16  # as a kernel upcast to float4 on a device with aligned vectors
  base = torch.zeros(17)
  out, x = base[1:], torch.arange(17, dtype=torch.float32)[1:]
  assert out.data_ptr() % 16 and x.data_ptr() % 16
  k(out, x)
  assert torch.equal(out, x * 2) and base[0] == 0


# ---------------------------------------------------------------------------------------------------------- kc.Buffer out

@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=15, deadline=None)
@given(dt=st.sampled_from([dtypes.float32, dtypes.float16, dtypes.int8, dtypes.bool, dtypes.int64, dtypes.uint16]),
       n=st.integers(0, 40), seed=st.integers(0, 2**16))
def test_numpy_and_torch_read_a_buffer_in_place(device, dt, n, seed):
  data = np.random.default_rng(seed).integers(0, 2, n).astype(dt.np)
  buf = kc.Buffer(_available(device), n, dt).copyin(data)
  arr, ten = np.from_dlpack(buf), torch.from_dlpack(buf)
  np.testing.assert_array_equal(arr, data)
  np.testing.assert_array_equal(ten.numpy(), data)
  if n:
    assert arr.ctypes.data == ten.data_ptr() == buf.allocator.pointer(buf._buf)
    arr[0] = not data[0] if dt == dtypes.bool else data[0] + 1
    assert buf.numpy()[0] == arr[0] == ten[0].item()  # one memory, seen by all three


@pytest.mark.parametrize("dt, torch_dt", [(dtypes.bfloat16, "bfloat16"), (dtypes.fp8e4m3, "float8_e4m3fn"),
                                          (dtypes.fp8e5m2, "float8_e5m2")])
def test_torch_reads_the_dtypes_numpy_lacks(dt, torch_dt):
  values = torch.tensor([1.0, -2.0, 0.5, 448.0 if dt == dtypes.fp8e4m3 else 3.0]).to(getattr(torch, torch_dt))
  bits = values.view(torch.uint8 if dt.itemsize == 1 else torch.int16).numpy()
  buf = kc.Buffer("CLANG", 4, dt).copyin(memoryview(bits.view(np.uint8)))
  back = torch.from_dlpack(buf)
  assert back.dtype == values.dtype and torch.equal(back, values)
  wrapped = kc.from_dlpack(values, device="CLANG")  # and back into kc, in place
  assert wrapped.dtype == dt and wrapped.allocator.pointer(wrapped._buf) == values.data_ptr()


def test_capsules_legacy_and_versioned():
  buf = kc.Buffer("CLANG", 3, dtypes.int32).copyin(np.arange(3, dtype=np.int32))
  assert 'dltensor"' in repr(buf.__dlpack__())
  for max_version, version in (((1, 0), (1, 0)), ((1, 1), (1, 1)), ((1, 7), dlpack.VERSION)):
    capsule = buf.__dlpack__(max_version=max_version)
    assert "dltensor_versioned" in repr(capsule)
    t = dlpack._read_capsule(capsule, "kc.Buffer")
    managed = dlpack.DLManagedTensorVersioned.from_address(dlpack._api.PyCapsule_GetPointer(capsule, b"dltensor_versioned"))
    assert (managed.version.major, managed.version.minor) == version and t.address == buf._buf.addr and t.device == (1, 0)
  copied = dlpack._read_capsule(buf.__dlpack__(max_version=(1, 0), copy=True), "kc.Buffer")
  assert copied.address != buf._buf.addr and np.array_equal(copied.numpy(), np.arange(3))
  with pytest.raises(dlpack.DLPackError, match="CUDA:0"): buf.__dlpack__(max_version=(1, 0), dl_device=(2, 0))
  with pytest.raises(BufferError, match="takes no stream"): buf.__dlpack__(stream=7)


def test_a_consumer_keeps_the_buffer_alive():
  buf = kc.Buffer("CLANG", 1000, dtypes.float32).copyin(np.full(1000, 3.0, np.float32))
  alive = weakref.ref(buf)
  t = torch.from_dlpack(buf)
  capsule = buf.__dlpack__()  # never consumed: dropping it lets go of the buffer too
  del buf
  gc.collect()
  assert alive() is not None and float(t.sum()) == 3000.0
  del t, capsule
  gc.collect()
  assert alive() is None


def test_an_exception_unwinding_past_a_dropped_capsule_survives():
  # a capsule dropped while an error propagates must leave the error as it was (a Python destructor would replace it)
  buf = kc.Buffer("CLANG", 4, dtypes.float32).copyin(np.zeros(4, np.float32))
  def fail():
    _capsule = buf.__dlpack__(max_version=(1, 0))  # noqa: F841  (freed while the error unwinds)
    raise KeyError("the error")
  with pytest.raises(KeyError, match="the error"): fail()
  with pytest.raises(kc.ArgumentError, match="not C-contiguous"):
    _doubling(_available("CLANG"), dtypes.float32, (4,))(kc.from_dlpack(buf), np.zeros(8, np.float32)[::2]) and \
      _doubling("CLANG", dtypes.float32, (4,))(np.zeros(8, np.float32)[::2], buf)


# ---------------------------------------------------------------------------------------------------------- from_dlpack

@pytest.mark.parametrize("device", DEVICES)
def test_from_dlpack_wraps_host_memory(device):
  t = torch.arange(10, dtype=torch.float32)
  buf = kc.from_dlpack(t, device=_available(device))
  assert buf.device == device and buf.size == 10 and buf.allocator.pointer(buf._buf) == t.data_ptr()
  t[3] = 42
  assert buf.numpy()[3] == 42
  k = _doubling(device, dtypes.float32, (10,))
  out = torch.zeros(10)
  k(kc.from_dlpack(out, device=device), buf)  # Buffers over torch memory are kernel arguments like any
  assert torch.equal(out, t * 2)
  del t
  gc.collect()
  assert buf.numpy()[3] == 42  # the Buffer keeps torch's memory alive
  assert kc.from_dlpack(buf, device=device) is buf


def test_from_dlpack_copies_only_when_asked():
  strided = torch.arange(20, dtype=torch.float32)[::2]
  with pytest.raises(dlpack.DLPackError, match=r"not C-contiguous \(strides \(2,\)\); pass copy=None"):
    kc.from_dlpack(strided, device="CLANG")
  np.testing.assert_array_equal(kc.from_dlpack(strided, device="CLANG", copy=None).numpy(), strided.numpy())
  readonly = np.arange(4.0)
  readonly.flags.writeable = False
  with pytest.raises(dlpack.DLPackError, match="read-only"): kc.from_dlpack(readonly, device="CLANG")
  copied = kc.from_dlpack(np.arange(4.0), device="CLANG", copy=True)
  assert copied.numpy().tolist() == [0, 1, 2, 3]
  with pytest.raises(dlpack.DLPackError, match="CUDA:0 is not memory CLANG kernels read in place"):
    kc.from_dlpack(DeviceTensor(dlpack.kDLCUDA), device="CLANG")
  with pytest.raises(dlpack.DLPackError, match="refused to export"):
    kc.from_dlpack(DeviceTensor(dlpack.kDLCUDA), device="CLANG", copy=None)  # it cannot copy to the host itself
  with pytest.raises(dlpack.DLPackError, match="no __dlpack_device__"): kc.from_dlpack([1, 2, 3], device="CLANG")
  assert kc.from_dlpack(torch.zeros(0, 3), device="CLANG").size == 0


def test_dtype_codes_round_trip():
  for dt in dtypes.all:
    assert dlpack.dtype_of(*dlpack.dtype_code(dt), 1) == dt
  with pytest.raises(dlpack.DLPackError, match="type code 5 with 64 bits"): dlpack.dtype_of(5, 64, 1)  # complex64
  with pytest.raises(dlpack.DLPackError, match="4-lane"): dlpack.dtype_of(2, 32, 4)
  with pytest.raises(dlpack.DLPackError, match="no DLPack type code"): dlpack.dtype_code(dtypes.void)
  assert ctypes.sizeof(dlpack.DLTensor) == 48 and ctypes.sizeof(dlpack.DLManagedTensor) == 64  # dlpack.h on 64-bit
  assert ctypes.sizeof(dlpack.DLManagedTensorVersioned) == 80
