"""The CUDA runtime: what can be checked anywhere (the unavailable reason, driver errors, launch arguments, kernel
parameters) and, on a machine with an NVIDIA GPU, memory, copies, launches, timing and large dynamic shared memory."""
import ctypes, subprocess, sys
import numpy as np
import pytest
import kc
from kc.backend import ConfigError, DeviceUnavailable, KcError
from kc_cuda import driver
from kc_cuda.driver import (CUDADeviceLost, CUDAError, CUDAOutOfMemory, DeviceProps, KernelParams, check, dynamic_shared_bytes, error_for,
                            launch_config, selected_ordinal, unavailable_reason)

cu = pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed")
REASON = unavailable_reason()
needs_gpu = pytest.mark.skipif(REASON is not None, reason=f"no CUDA GPU here: {REASON}")

H100 = DeviceProps(name="NVIDIA H100 80GB HBM3", ordinal=0, compute_capability=(9, 0), multiprocessor_count=132,
                   max_threads_per_block=1024, max_block_dims=(1024, 1024, 64), max_grid_dims=(2**31 - 1, 65535, 65535),
                   shared_per_block=48 * 1024, shared_per_block_optin=227 * 1024, total_memory=80 * 2**30,
                   driver_version=12040, memory_clock_rate_khz=2_619_000, memory_bus_width_bits=5120)


# ---------------------------------------------------------------------------------------------------------- availability

def test_unavailable_reason_is_a_sentence_or_none():
  reason = unavailable_reason()
  assert reason is None or (isinstance(reason, str) and len(reason) > 20 and "\n" not in reason)
  assert unavailable_reason() == reason  # asked once, the same answer after


def test_import_does_not_load_the_bindings():
  code = "import sys, kc_cuda.driver; print('cuda.bindings' in sys.modules)"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
  assert out.strip() == "False"


def test_missing_driver_library_says_how_to_get_one(monkeypatch):
  def refuse(name): raise OSError(f"{name}: cannot open shared object file")
  monkeypatch.setattr(driver.ctypes, "CDLL", refuse)
  monkeypatch.setattr(driver, "driver_library_name", lambda: "libcuda.so.1")
  why = driver._driver_library_reason()
  assert "libcuda.so.1" in why and "NVIDIA driver" in why


def test_missing_bindings_name_the_package(monkeypatch):
  driver._reason_for.cache_clear()
  monkeypatch.setattr(driver, "_bindings_missing", lambda: True)
  try: assert "pip install kc-cuda" in unavailable_reason()
  finally: driver._reason_for.cache_clear()


def test_no_device_and_failing_init_are_reasons(monkeypatch):
  driver._reason_for.cache_clear()
  monkeypatch.setattr(driver, "_bindings_missing", lambda: False)
  monkeypatch.setattr(driver, "_driver_library_reason", lambda: None)
  monkeypatch.setattr(driver, "init_driver", lambda: None)
  try:
    monkeypatch.setattr(driver, "device_count", lambda: 0)
    assert "no CUDA device" in unavailable_reason()
    driver._reason_for.cache_clear()
    monkeypatch.setattr(driver, "device_count", lambda: 2)
    monkeypatch.setenv("KC_CUDA_DEVICE", "5")
    assert "KC_CUDA_DEVICE=5" in unavailable_reason() and "0..1" in unavailable_reason()
    driver._reason_for.cache_clear()
    def no_init(): raise error_for(cu.CUresult.CUDA_ERROR_NO_DEVICE, "cuInit(0)", opening=True)
    monkeypatch.setattr(driver, "init_driver", no_init)
    assert "CUDA_ERROR_NO_DEVICE" in unavailable_reason()
  finally: driver._reason_for.cache_clear()


def test_device_choice_from_the_environment(monkeypatch):
  monkeypatch.delenv("KC_CUDA_DEVICE", raising=False)
  assert selected_ordinal() == 0
  monkeypatch.setenv("KC_CUDA_DEVICE", "1")
  assert selected_ordinal() == 1
  for bad in ("gpu1", "-1"):
    monkeypatch.setenv("KC_CUDA_DEVICE", bad)
    with pytest.raises(ConfigError, match="KC_CUDA_DEVICE"): selected_ordinal()
    assert "KC_CUDA_DEVICE" in unavailable_reason()  # a reason, never an exception


@pytest.mark.skipif(REASON is None, reason="a CUDA GPU is available here")
def test_devices_command_shows_the_reason():
  if "CUDA" not in kc.Device.names(): pytest.skip("the CUDA device is not registered (kc-cuda not installed)")
  out = subprocess.run([sys.executable, "-m", "kc.tools.cli", "devices"], capture_output=True, text=True, timeout=120).stdout
  assert "CUDA" in out and REASON[:40] in out


# ---------------------------------------------------------------------------------------------------------- check()

def test_check_returns_the_outputs():
  ok = cu.CUresult.CUDA_SUCCESS
  assert check((ok,), "cuInit(0)") is None
  assert check((ok, 7), "cuDeviceGetCount()") == 7
  assert check((ok, 1, 2), "x") == (1, 2)


def test_check_names_the_call_and_the_result():
  with pytest.raises(CUDAError) as e: check((cu.CUresult.CUDA_ERROR_INVALID_VALUE, None), "cuMemcpyHtoDAsync(16 bytes)")
  msg = str(e.value)
  assert "cuMemcpyHtoDAsync(16 bytes)" in msg and "CUDA_ERROR_INVALID_VALUE" in msg
  assert e.value.call == "cuMemcpyHtoDAsync(16 bytes)" and e.value.result == "CUDA_ERROR_INVALID_VALUE"
  assert isinstance(e.value, KcError)


def test_check_uses_the_drivers_description(monkeypatch):
  monkeypatch.setattr(cu, "cuGetErrorString", lambda r: (cu.CUresult.CUDA_SUCCESS, b"invalid argument"))
  with pytest.raises(CUDAError, match="invalid argument"): check((cu.CUresult.CUDA_ERROR_INVALID_VALUE, None), "cuLaunchKernel")


def test_check_error_kinds():
  with pytest.raises(CUDAOutOfMemory) as e: check((cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None), "cuMemAlloc(1 bytes)")
  assert isinstance(e.value, MemoryError)  # what the LRU allocator catches to free its cache and retry
  with pytest.raises(DeviceUnavailable, match="cuDevicePrimaryCtxRetain"):
    check((cu.CUresult.CUDA_ERROR_NO_DEVICE, None), "cuDevicePrimaryCtxRetain(0)", opening=True)
  with pytest.raises(CUDADeviceLost, match="compute-sanitizer") as lost: check((cu.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,), "cuCtxSynchronize")
  assert isinstance(lost.value, kc.DeviceLostError)  # what ends a conformance or fuzz worker
  for name in driver.STICKY_ERRORS:  # sticky while opening too: the context is gone either way
    assert isinstance(error_for(getattr(cu.CUresult, name), "cuCtxSynchronize", opening=True), CUDADeviceLost), name
  with pytest.raises(KcError, match="tuple"): check(None, "cuInit(0)")


def test_result_names_of_ints():
  assert driver.result_name(2) == "CUDA_ERROR_OUT_OF_MEMORY"
  assert driver.result_name(123456) == "CUresult 123456"


# ---------------------------------------------------------------------------------------------------------- launches

def test_launch_config_pads_to_three_axes():
  assert launch_config("k", [4], [32], H100) == ((4, 1, 1), (32, 1, 1))
  assert launch_config("k", (2, 3, 4), (8, 4, 2), H100) == ((2, 3, 4), (8, 4, 2))


def test_no_local_size_picks_blocks_that_divide_the_global_size():
  # global ids are blockIdx*blockDim+threadIdx with no bounds check: grid * block must be the global size exactly
  assert launch_config("k", [1000, 7], None, H100) == ((125, 7, 1), (8, 1, 1))
  assert launch_config("k", [4096, 64, 3], None, H100) == ((16, 64, 3), (256, 1, 1))
  assert launch_config("k", [2, 64, 1], None, H100) == ((1, 1, 1), (2, 64, 1))
  assert launch_config("k", [7, 9], None, H100) == ((7, 9, 1), (1, 1, 1))


def test_empty_launches_are_not_checked_against_limits():
  grid, block = launch_config("k", [0, 10**6, 1], [2048, 1, 1], H100)
  assert 0 in grid


@pytest.mark.parametrize("local, match", [((2048, 1, 1), "x 2048 > 1024"), ((1, 1, 128), "z 128 > 64"),
                                          ((64, 32, 1), "2048 threads > 1024")])
def test_block_limits(local, match):
  with pytest.raises(KcError, match=match): launch_config("r_4_4", (1, 1, 1), local, H100)


def test_grid_limits():
  with pytest.raises(KcError, match="y 70000 > 65535"): launch_config("E_big", (1, 70000, 1), (1, 1, 1), H100)
  assert launch_config("E_big", (2**31 - 1, 1, 1), (1, 1, 1), H100)[0][0] == 2**31 - 1


@pytest.mark.parametrize("dims", [(1, 2, 3, 4), (-1,), ("a",)])
def test_bad_launch_dims(dims):
  with pytest.raises(KcError): launch_config("k", dims, (1, 1, 1), H100)


def test_dynamic_shared_memory():
  assert dynamic_shared_bytes({}, H100, "k") == 0
  assert dynamic_shared_bytes({"dynamic_shared": 96 * 1024}, H100, "k") == 96 * 1024
  with pytest.raises(KcError, match="232448"): dynamic_shared_bytes({"dynamic_shared": 228 * 1024}, H100, "k")
  with pytest.raises(KcError, match="KC_CACHE_DIR"): dynamic_shared_bytes({"dynamic_shared": "lots"}, H100, "k")


def test_kernel_params_point_at_the_values():
  params = KernelParams([0x7F0000001000, 0x7F0000002000], [-5, 2**31 - 1])
  assert len(params) == 4
  slots = (ctypes.c_void_p * 4).from_address(params.address)
  assert [ctypes.c_uint64.from_address(slots[i]).value for i in range(2)] == [0x7F0000001000, 0x7F0000002000]
  assert [ctypes.c_int32.from_address(slots[i]).value for i in range(2, 4)] == [-5, 2**31 - 1]
  assert KernelParams([], []).address == 0


def test_device_props_derived_figures():
  assert H100.arch == "sm_90" and H100.driver_version_text == "12.4"
  assert H100.memory_bandwidth == pytest.approx(3.35e12, rel=0.01)
  assert DeviceProps(**{**H100.__dict__, "memory_bus_width_bits": None}).memory_bandwidth is None


def test_library_round_trip():
  compiler = pytest.importorskip("kc_cuda.compiler", reason="kc_cuda.compiler is not there yet")
  lib = compiler.pack_library({"dynamic_shared": 65536}, b"\x7fELF cubin bytes")
  meta, cubin = compiler.unpack_library(lib)
  assert meta["dynamic_shared"] == 65536 and cubin == b"\x7fELF cubin bytes"
  assert dynamic_shared_bytes(meta, H100, "k") == 65536


# ---------------------------------------------------------------------------------------------------------- on a GPU

@pytest.fixture(scope="module")
def gpu():
  if REASON is not None: pytest.skip(f"no CUDA GPU here: {REASON}")
  return kc.Device["CUDA"]


@needs_gpu
def test_props_of_the_gpu(gpu):
  p = gpu.props
  assert p.compute_capability >= (5, 0) and p.max_threads_per_block >= 1024 and p.shared_per_block == 48 * 1024
  assert p.shared_per_block_optin >= p.shared_per_block and p.total_memory > 2**30


@needs_gpu
def test_alloc_copies_and_views(gpu):
  a = gpu.allocator
  data = np.arange(1000, dtype=np.float32)
  mem = a.alloc(data.nbytes)
  a.copyin(mem, memoryview(data).cast("B"))
  out = np.zeros_like(data)
  a.copyout(memoryview(out).cast("B"), mem)
  np.testing.assert_array_equal(out, data)
  part = np.zeros(10, np.float32)
  a.copyout(memoryview(part).cast("B"), a.offset(mem, 40, 400))
  np.testing.assert_array_equal(part, data[100:110])
  empty = a.alloc(0)
  a.copyin(empty, memoryview(b""))
  a.free(mem, data.nbytes)
  assert a.alloc(data.nbytes) is mem  # recycled by the LRU cache


@needs_gpu
def test_compiled_kernel_runs_and_is_timed(gpu):
  from kc import ast as A
  n = 1 << 20
  x, y = np.random.rand(n).astype(np.float32), np.random.rand(n).astype(np.float32)
  k = kc.compile(A.sink(A.store(0, A.arg(1, kc.dtypes.float32, (n,)) + A.arg(2, kc.dtypes.float32, (n,)))), device="CUDA")
  out = np.empty(n, np.float32)
  seconds = k(out, x, y)
  np.testing.assert_array_equal(out, x + y)
  assert 0 < seconds < 1


@needs_gpu
def test_matmul_with_tensor_cores(gpu):
  from kc import ast as A
  M = K = N = 256
  a, b = np.random.rand(M, K).astype(np.float16), np.random.rand(K, N).astype(np.float16)
  x, y = A.arg(1, kc.dtypes.float16, (M, K)).reshape(M, K, 1), A.arg(2, kc.dtypes.float16, (K, N)).reshape(1, K, N)
  sink = A.sink(A.store(0, (x.cast(kc.dtypes.float32) * y.cast(kc.dtypes.float32)).sum(1)))
  out = np.empty((M, 1, N), np.float32)
  kc.compile(sink, device="CUDA")(out, a, b)
  np.testing.assert_allclose(out.reshape(M, N), a.astype(np.float32) @ b.astype(np.float32), rtol=1e-2, atol=1e-2)


@needs_gpu
def test_launch_errors_before_the_driver(gpu):
  from kc import ast as A
  k = kc.compile(A.sink(A.store(0, A.arg(1, kc.dtypes.float32, (16,)) * 2.0)), device="CUDA")
  out, x = gpu.allocator.alloc(64), gpu.allocator.alloc(64)
  with pytest.raises(KcError, match="block"): k._handle(out, x, global_size=(1, 1, 1), local_size=(4096, 1, 1), wait=True)
  with pytest.raises(KcError, match="buffer 1"): k._handle(out, object(), global_size=(1, 1, 1), local_size=(1, 1, 1))
  assert k._handle(out, x, global_size=(0, 1, 1), local_size=(1, 1, 1), wait=True) == 0.0


@needs_gpu
def test_views_for_vector_loads_are_refused_only_where_misaligned(gpu):
  from kc import ArgumentError, Opt, OptOps, ast as A
  k = kc.compile(A.sink(A.store(0, A.arg(1, kc.dtypes.float32, (64,)) * 2.0)), device="CUDA", opts=[Opt(OptOps.UPCAST, 0, 4)])
  assert k.program.vector_bytes() == {0: 16, 1: 16}
  base = kc.Buffer("CUDA", 80, kc.dtypes.float32).allocate().copyin(np.arange(80, dtype=np.float32))
  out = np.zeros(64, np.float32)
  with pytest.raises(ArgumentError, match="byte offset 4"): k(out, base.view(64, kc.dtypes.float32, offset=4))
  k(out, base.view(64, kc.dtypes.float32, offset=16))
  np.testing.assert_array_equal(out, np.arange(4, 68, dtype=np.float32) * 2)
  src = np.arange(65, dtype=np.float32)
  k(out, src[1:])  # a numpy array at any address is copied to an aligned allocation
  np.testing.assert_array_equal(out, src[1:] * 2)


STICKY_FAULT = r"""
import numpy as np, kc
from kc_cuda.driver import CUDADeviceLost
from kc_cuda.compiler import pack_library, unpack_library
from kc_cuda.runtime import CUDAProgram
gpu = kc.Device["CUDA"]
src = 'extern "C" __global__ void misaligned(float* out) { *(float4*)((char*)out + 4) = make_float4(1, 2, 3, 4); }'
prg = CUDAProgram(gpu, "misaligned", pack_library({"dynamic_shared": 0}, unpack_library(gpu.compiler.compile_uncached(src))[1]))
buf = gpu.allocator.alloc(64)
try: prg(buf, global_size=(1, 1, 1), local_size=(1, 1, 1), wait=True)
except CUDADeviceLost as e: print("lost:", e.result, isinstance(e, kc.DeviceLostError))
try: gpu.allocator.copyout(memoryview(np.zeros(16, np.float32)).cast("B"), buf)
except CUDADeviceLost as e: print("after:", e.result)
"""


@needs_gpu
def test_a_misaligned_vector_store_is_a_sticky_lost_device(gpu):
  # in a process of its own: the fault leaves that process's context unusable
  r = subprocess.run([sys.executable, "-c", STICKY_FAULT], capture_output=True, text=True, timeout=300)
  assert "lost: CUDA_ERROR_MISALIGNED_ADDRESS True" in r.stdout and "after: CUDA_ERROR_MISALIGNED_ADDRESS" in r.stdout, r.stdout + r.stderr


DYNAMIC_SHARED_SRC = r"""
extern "C" __global__ void big_shared(float* out, const float* in, int n) {
  extern __shared__ float tile[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) tile[i] = in[i] * 2.0f;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = tile[n - 1 - i];
}
"""


@needs_gpu
def test_dynamic_shared_memory_above_48k(gpu):
  from kc_cuda.compiler import pack_library, unpack_library
  from kc_cuda.runtime import CUDAProgram
  n = 24 * 1024  # 96 KiB of floats: needs the opt-in
  if gpu.props.shared_per_block_optin < 4 * n: pytest.skip(f"{gpu.props.name} gives a block only {gpu.props.shared_per_block_optin} bytes")
  _, cubin = unpack_library(gpu.compiler.compile_uncached(DYNAMIC_SHARED_SRC))
  prg = CUDAProgram(gpu, "big_shared", pack_library({"dynamic_shared": 4 * n}, cubin))
  data = np.random.rand(n).astype(np.float32)
  src, dst = gpu.allocator.alloc(data.nbytes), gpu.allocator.alloc(data.nbytes)
  gpu.allocator.copyin(src, memoryview(data).cast("B"))
  assert prg(dst, src, global_size=(1, 1, 1), local_size=(256, 1, 1), vals=(n,), wait=True) > 0
  out = np.empty_like(data)
  gpu.allocator.copyout(memoryview(out).cast("B"), dst)
  np.testing.assert_array_equal(out, (data * 2)[::-1])
  with pytest.raises(KcError, match="shared memory"):
    CUDAProgram(gpu, "big_shared", pack_library({"dynamic_shared": gpu.props.shared_per_block_optin + 1}, cubin))


# ---------------------------------------------------------------------------------------------------------- a stand-in driver
# Without a GPU the runtime's calls go to FakeDriver: host memory stands in for device memory (so pointers, offsets and
# copies are real addresses), and a launch records its arguments and runs a Python version of the kernel. This checks
# the runtime's use of the driver API (argument order, handles, params, events) where no driver exists.

class FakeDriver:
  def __init__(self):
    self.CUresult, self.CUstream_flags, self.CUevent_flags = cu.CUresult, cu.CUstream_flags, cu.CUevent_flags
    self.CUfunction_attribute = cu.CUfunction_attribute
    self.memory, self.launches, self.attributes, self.current, self.unloaded = {}, [], {}, None, []
    self.kernels = {}  # name -> python function(params address, grid, block)
    self.fail_alloc = 0
    self.lost = None  # the sticky CUresult once a kernel faulted: every later call that can see it fails with it

  def ok(self, *values): return (cu.CUresult.CUDA_SUCCESS, *values)
  def cuDeviceGet(self, ordinal): return self.ok(ordinal)
  def cuDevicePrimaryCtxRetain(self, dev): return self.ok("ctx")
  def cuDevicePrimaryCtxRelease(self, dev): return self.ok()
  def cuCtxSetCurrent(self, ctx): self.current = ctx; return self.ok()
  def cuCtxSynchronize(self): return self.ok()
  def cuStreamCreate(self, flags): return self.ok("stream")
  def cuStreamDestroy(self, stream): return self.ok()
  def cuStreamSynchronize(self, stream): return self.ok()

  def cuMemAlloc(self, n):
    assert self.current == "ctx" and n > 0
    if self.fail_alloc: self.fail_alloc -= 1; return (cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)
    buf = ctypes.create_string_buffer(n)
    self.memory[ctypes.addressof(buf)] = buf
    return self.ok(cu.CUdeviceptr(ctypes.addressof(buf)))

  def cuMemFree(self, ptr): del self.memory[int(ptr)]; return self.ok()
  def cuMemcpyHtoDAsync(self, dst, src, n, stream): ctypes.memmove(dst, src, n); return self.ok()
  def cuMemcpyDtoHAsync(self, dst, src, n, stream): ctypes.memmove(dst, src, n); return self.ok()
  def cuMemcpyDtoDAsync(self, dst, src, n, stream): ctypes.memmove(dst, src, n); return self.ok()

  def cuModuleLoadData(self, image):
    if self.lost is not None: return (self.lost, None)
    assert isinstance(image, int) and ctypes.string_at(image, 4) == b"\x7fELF"
    return self.ok("module")
  def cuModuleUnload(self, module): self.unloaded.append(module); return self.ok()
  def cuModuleGetFunction(self, module, name):
    return self.ok(name.decode()) if name.decode() in self.kernels else (cu.CUresult.CUDA_ERROR_NOT_FOUND, None)
  def cuFuncSetAttribute(self, fn, attr, value): self.attributes[(fn, attr)] = value; return self.ok()

  def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
    assert self.current == "ctx" and stream == "stream" and extra == 0
    self.launches.append(((gx, gy, gz), (bx, by, bz), shared))
    self.kernels[fn](params, (gx, gy, gz), (bx, by, bz))
    return self.ok()

  def cuEventCreate(self, flags): return self.ok(object())
  def cuEventRecord(self, event, stream): return self.ok()
  def cuEventSynchronize(self, event): return self.ok() if self.lost is None else (self.lost,)
  def cuEventElapsedTime(self, start, end): return self.ok(0.25)
  def cuEventDestroy(self, event): return self.ok()


def _scale_kernel(params, grid, block):
  """out[i] = in[i] * k for the n = grid*block floats: params are (out, in, k)."""
  slots = (ctypes.c_void_p * 3).from_address(params)
  out, src = (ctypes.c_uint64.from_address(slots[i]).value for i in range(2))
  k = ctypes.c_int32.from_address(slots[2]).value
  n = grid[0] * block[0]
  x = np.frombuffer((ctypes.c_float * n).from_address(src), np.float32)
  np.frombuffer((ctypes.c_float * n).from_address(out), np.float32)[:] = x * k


@pytest.fixture
def fake(monkeypatch):
  pytest.importorskip("kc_cuda.compiler")
  import kc_cuda.runtime as runtime
  drv = FakeDriver()
  drv.kernels["scale"] = _scale_kernel
  monkeypatch.setattr(runtime, "cu", drv)
  monkeypatch.setattr(runtime, "init_driver", lambda: None)
  monkeypatch.setattr(runtime, "device_props", lambda ordinal: H100)
  return drv, runtime.CUDADevice("CUDA", 0, "kc-cuda test")


def test_fake_device_memory_and_copies(fake):
  drv, dev = fake
  a = dev.allocator
  data = np.arange(64, dtype=np.float32)
  mem = a.alloc(data.nbytes)
  a.copyin(mem, memoryview(data).cast("B"))
  out = np.zeros(8, np.float32)
  a.copyout(memoryview(out).cast("B"), a.offset(mem, 32, 64))
  np.testing.assert_array_equal(out, data[16:24])
  other = a.alloc(data.nbytes)
  a.copy_device(other, mem, data.nbytes)
  assert ctypes.string_at(other.ptr, data.nbytes) == data.tobytes()
  assert a.alloc(0).nbytes == 0
  with pytest.raises(KcError, match="do not fit"): a.copyin(a.alloc(4), memoryview(data).cast("B"))


def test_fake_out_of_memory_frees_the_cache_and_retries(fake):
  drv, dev = fake
  a = dev.allocator
  a.free(a.alloc(128), 128)
  drv.fail_alloc = 1
  assert a.alloc(256).nbytes == 256 and not a.cache
  drv.fail_alloc = 1
  with pytest.raises(CUDAOutOfMemory, match="CUDA_ERROR_OUT_OF_MEMORY"): a.alloc(256)


def test_fake_launch_packs_params_and_times(fake):
  from kc_cuda.compiler import pack_library
  drv, dev = fake
  prg = dev.runtime("scale", pack_library({"dynamic_shared": 0}, b"\x7fELF fake cubin"))
  data = np.arange(512, dtype=np.float32)
  src, dst = dev.allocator.alloc(data.nbytes), dev.allocator.alloc(data.nbytes)
  dev.allocator.copyin(src, memoryview(data).cast("B"))
  assert prg(dst, src, global_size=(4, 1, 1), local_size=(128, 1, 1), vals=(3,), wait=True) == pytest.approx(0.25e-3)
  assert drv.launches[-1] == ((4, 1, 1), (128, 1, 1), 0)
  out = np.empty_like(data)
  dev.allocator.copyout(memoryview(out).cast("B"), dst)
  np.testing.assert_array_equal(out, data * 3)
  assert prg(dst, src, global_size=(512,), local_size=None, vals=(1,)) is None  # no wait: nothing to time
  assert drv.launches[-1][:2] == ((2, 1, 1), (256, 1, 1))
  n = len(drv.launches)
  assert prg(dst, src, global_size=(0, 1, 1), local_size=(128, 1, 1), vals=(1,), wait=True) == 0.0 and len(drv.launches) == n
  with pytest.raises(KcError, match="buffer 1"): prg(dst, np.zeros(4), global_size=(1,), local_size=(1,), vals=(1,))
  with pytest.raises(KcError, match="int32"): prg(dst, src, global_size=(1,), local_size=(1,), vals=(2**40,))


def test_fake_program_loading(fake):
  from kc_cuda.compiler import pack_library
  drv, dev = fake
  drv.kernels["big"] = _scale_kernel
  prg = dev.runtime("big", pack_library({"dynamic_shared": 100_000}, b"\x7fELF"))
  attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
  assert drv.attributes[("big", attr)] == 100_000 and prg.dynamic_shared == 100_000
  with pytest.raises(KcError, match='extern "C"'): dev.runtime("missing", pack_library({}, b"\x7fELF"))
  del prg
  import gc; gc.collect()
  assert "module" in drv.unloaded  # the module goes when its program does


def test_fake_sticky_fault_is_a_lost_device_and_stays_unwrapped(fake):
  from kc_cuda.compiler import pack_library
  drv, dev = fake
  def faults(params, grid, block): drv.lost = cu.CUresult.CUDA_ERROR_MISALIGNED_ADDRESS
  drv.kernels["bad"] = faults
  prg = dev.runtime("bad", pack_library({"dynamic_shared": 0}, b"\x7fELF"))
  buf = dev.allocator.alloc(16)
  with pytest.raises(CUDADeviceLost, match="running bad .*CUDA_ERROR_MISALIGNED_ADDRESS"):
    prg(buf, global_size=(1,), local_size=(1,), wait=True)
  # the next cubin's load fails with the same sticky error: it says so, not "a stale compile cache entry"
  with pytest.raises(CUDADeviceLost, match="cuModuleLoadData.*MISALIGNED") as e:
    dev.runtime("scale", pack_library({"dynamic_shared": 0}, b"\x7fELF"))
  assert "stale" not in str(e.value)


def test_fake_close(fake):
  drv, dev = fake
  dev.close()
  with pytest.raises(KcError, match="closed"): dev.allocator.alloc(4)
