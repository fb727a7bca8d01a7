"""The CUDA device at run time, through the driver API (cuda.bindings.driver): the device's primary context, one
stream that every copy and launch goes through in order, device memory from cuMemAlloc, and kernels loaded from the
cubins NVRTC builds. This module is imported when the device opens, never before.

kc may call in from several threads, and a CUDA context is current per thread, so every public entry point makes
the device's context current first. The primary context is the one torch and cupy use too, so buffers and kernels
can be shared with them in one process."""
from __future__ import annotations
import functools, sys, threading, weakref
from typing import Hashable, Optional, Sequence
import numpy as np
from cuda.bindings import driver as cu
from kc import ArgumentError
from kc.backend import CompiledDevice, KcError, LRUAllocator, int32_values, raw_buffers
from kc_cuda.compiler import NVRTCCompiler, unpack_library
from kc_cuda.driver import (STATIC_SHARED_LIMIT, CUDADeviceLost, CUDAError, CUDAOutOfMemory, KernelParams, check, device_props,
                            dynamic_shared_bytes, init_driver, launch_config, selected_ordinal)
from kc_cuda.renderer import CUDARenderer


class CUDAMemory:
  """A range of device memory: `ptr` is its CUdeviceptr as an int. A view shares its base's allocation and keeps the
  base alive; only a base (`base` None) is ever freed. Memory another framework allocated (from_pointer) holds its
  `owner`, which keeps it allocated, and is never freed by kc."""
  __slots__ = ("ptr", "nbytes", "device", "base", "owner")

  def __init__(self, ptr: int, nbytes: int, device: CUDADevice, base: Optional[CUDAMemory] = None, owner: object = None):
    self.ptr, self.nbytes, self.device, self.base, self.owner = ptr, nbytes, device, base, owner

  def __repr__(self): return f"<CUDAMemory {self.nbytes} bytes at {self.ptr:#x} on {self.device.props.name}>"


def _host_address(mv: memoryview) -> int:
  """The address of a contiguous memoryview's first byte (read-only ones included)."""
  return int(np.frombuffer(mv, dtype=np.uint8).ctypes.data)


class CUDAAllocator(LRUAllocator):
  """cuMemAlloc'd device memory. Copies go through the device's stream and wait for it: the host memory they read or
  write belongs to the caller and may be gone right after the call, and a copy must see the kernels launched before."""
  oom_errors = (CUDAOutOfMemory,)

  def __init__(self, device: CUDADevice):
    super().__init__()
    self.device = device
    self.max_alloc = device.props.total_memory  # no single allocation can be larger than the GPU's memory
    self.max_alloc_source = f"the memory of {device.props.name}"

  def _alloc(self, nbytes: int, options: Optional[Hashable]) -> CUDAMemory:
    if options is not None: raise KcError(f"CUDA buffers take no options, got {options!r}")
    self.device.activate()
    # cuMemAlloc refuses 0 bytes: an empty buffer still gets a real (never read) address, as every kernel argument must
    ptr = check(cu.cuMemAlloc(max(nbytes, 1)), f"cuMemAlloc({nbytes} bytes) on {self.device.props.name}")
    return CUDAMemory(int(ptr), nbytes, self.device)

  def _free(self, opaque: CUDAMemory, nbytes: int, options: Optional[Hashable]):
    self.device.activate()
    check(cu.cuMemFree(opaque.ptr), f"cuMemFree({opaque.ptr:#x})")

  # DLPack: torch, cupy and jax tensors on this GPU are used in place, and kc's buffers by them. The DLPack device type
  # of CUDA memory is 2 (kDLCUDA); the id is the GPU's ordinal
  @property
  def dlpack_device(self) -> tuple[int, int]: return (2, self.device.ordinal)

  def pointer(self, opaque: CUDAMemory) -> int: return self._checked(opaque, 0, "pointer").ptr

  def from_pointer(self, address: int, nbytes: int, owner: object) -> CUDAMemory:
    return CUDAMemory(int(address), nbytes, self.device, owner=owner)

  def dlpack_stream(self, stream=None) -> int:
    """A call's `stream=` as a CUstream handle: None is kc's own stream; an int is a handle (0, the legacy default
    stream, is passed on as 1, DLPack's name for it); a torch.cuda.Stream (`cuda_stream`) or a cupy stream (`ptr`)
    gives its handle; "torch" is torch's current stream on this GPU."""
    if stream is None: return int(self.device.stream)
    if isinstance(stream, str) and stream == "torch":
      # torch's tensors are what make a caller ask for its stream, so torch is imported already; kc never imports it
      if (torch := sys.modules.get("torch")) is None: raise ArgumentError('stream="torch": torch is not imported')
      stream = torch.cuda.current_stream(self.device.ordinal)
    for attr in ("cuda_stream", "ptr"):
      if not isinstance(stream, int) and isinstance(getattr(stream, attr, None), int): stream = getattr(stream, attr)
    if isinstance(stream, bool) or not isinstance(stream, int) or stream < 0:
      raise ArgumentError(f"stream={stream!r} is no CUDA stream: pass a torch.cuda.Stream, a cupy stream, a CUstream handle "
                          '(an int), "torch" (torch\'s current stream) or None (kc\'s own)')
    return stream or 1

  def export_ready(self, stream: Optional[int]) -> None:
    """Order a consumer's `stream` after kc's work: an event on kc's stream that `stream` waits for. None (the legacy
    default stream, which waits for kc's blocking stream by itself) and -1 (the consumer synchronizes) need nothing."""
    if stream is None or stream == -1: return
    stream = self.dlpack_stream(stream)
    dev = self.device
    dev.activate()
    if stream == int(dev.stream): return
    event = dev.new_event()
    try:
      check(cu.cuEventRecord(event, dev.stream), "cuEventRecord for a DLPack consumer")
      check(cu.cuStreamWaitEvent(stream, event, 0), f"cuStreamWaitEvent({stream:#x}) for a DLPack consumer")
    finally: cu.cuEventDestroy(event)

  def _checked(self, mem, nbytes: int, what: str) -> CUDAMemory:
    if not isinstance(mem, CUDAMemory) or mem.device is not self.device:
      raise KcError(f"{what}: {mem!r} is not memory of {self.device!r}")
    if nbytes > mem.nbytes: raise KcError(f"{what}: {nbytes} bytes do not fit in a buffer of {mem.nbytes} bytes")
    return mem

  def copyin(self, dest: CUDAMemory, src: memoryview):
    if src.nbytes == 0: return
    dest = self._checked(dest, src.nbytes, "copyin")
    dev = self.device
    dev.activate()
    check(cu.cuMemcpyHtoDAsync(dest.ptr, _host_address(src), src.nbytes, dev.stream), f"cuMemcpyHtoDAsync({src.nbytes} bytes)")
    check(cu.cuStreamSynchronize(dev.stream), "cuStreamSynchronize after a copy to the device")

  def copyout(self, dest: memoryview, src: CUDAMemory):
    if dest.nbytes == 0: return
    src = self._checked(src, dest.nbytes, "copyout")
    dev = self.device
    dev.activate()
    check(cu.cuMemcpyDtoHAsync(_host_address(dest), src.ptr, dest.nbytes, dev.stream), f"cuMemcpyDtoHAsync({dest.nbytes} bytes)")
    check(cu.cuStreamSynchronize(dev.stream), "cuStreamSynchronize after a copy from the device")

  def copy_device(self, dest: CUDAMemory, src: CUDAMemory, nbytes: int, wait: bool = True):
    """Copy `nbytes` from one device buffer to another on the device's stream (cuMemcpyDtoDAsync)."""
    if nbytes == 0: return
    dest, src = self._checked(dest, nbytes, "copy_device"), self._checked(src, nbytes, "copy_device")
    self.device.activate()
    check(cu.cuMemcpyDtoDAsync(dest.ptr, src.ptr, nbytes, self.device.stream), f"cuMemcpyDtoDAsync({nbytes} bytes)")
    if wait: check(cu.cuStreamSynchronize(self.device.stream), "cuStreamSynchronize after a device copy")

  def offset(self, opaque: CUDAMemory, nbytes: int, offset: int) -> CUDAMemory:
    # device pointers are plain addresses: a view is the base's address plus the offset, with no alignment rule of
    # its own (a kernel's vector loads need an aligned address, which kc's own views keep)
    if offset < 0 or offset + nbytes > opaque.nbytes:
      raise KcError(f"a view of {nbytes} bytes at byte {offset} does not fit in a CUDA buffer of {opaque.nbytes} bytes")
    return CUDAMemory(opaque.ptr + offset, nbytes, self.device, opaque if opaque.base is None else opaque.base)


def _unload_module(device: CUDADevice, module) -> None:
  # runs when a program is collected: a BEAM search loads many kernels, and each module holds device memory
  try:
    device.activate()
    cu.cuModuleUnload(module)
  except Exception:  # interpreter shutdown or a dead context: the driver frees everything with the process
    pass


class CUDAProgram:
  """One kernel of a cubin. Launch sizes follow kc: global_size counts blocks per axis and local_size is the block
  (None: global_size counts threads and the block is picked, see driver.launch_config). The parameters are the buffers, then the int32 values."""

  def __init__(self, device: CUDADevice, name: str, lib: bytes):
    self.device, self.name = device, name
    self._configs: dict[tuple, tuple] = {}  # (global_size, local_size) -> (grid, block), checked once
    meta, cubin = unpack_library(lib)
    self.dynamic_shared = dynamic_shared_bytes(meta, device.props, name)
    device.activate()
    image = np.frombuffer(cubin, dtype=np.uint8)  # an explicit address: the driver copies the image while loading
    try: self.module = check(cu.cuModuleLoadData(int(image.ctypes.data)), f"cuModuleLoadData({name})")
    except CUDAError as e:
      if isinstance(e, CUDADeviceLost): raise  # an earlier kernel's fault, not this cubin's: it must reach the worker unwrapped
      driver = f"{device.props.name} (driver {device.props.driver_version_text})"
      if (built := meta.get("cuda")) is not None and built > device.props.driver_version // 1000:
        raise KcError(f"{driver} refused the cubin of {name}: {e}. It was built by CUDA {built}'s NVRTC, newer than the "
                      f"driver: update the NVIDIA driver, or install kc-cuda[cu{device.props.driver_version // 1000}]") from None
      raise KcError(f"{driver} refused the cubin of {name}: {e}. A stale compile cache entry can cause this: clear "
                    "KC_CACHE_DIR") from None
    weakref.finalize(self, _unload_module, device, self.module)
    # a kernel built in a batch has its own name in the batch's cubin; one built alone (or an older cache entry) has the program's
    entry = meta.get("entry", name)
    try: self.function = check(cu.cuModuleGetFunction(self.module, entry.encode()), f"cuModuleGetFunction({entry})")
    except CUDAError as e:
      if isinstance(e, CUDADeviceLost): raise
      raise KcError(f"the cubin has no kernel named {entry!r} ({e}): the kernel must be declared extern \"C\" __global__") from None
    if self.dynamic_shared > STATIC_SHARED_LIMIT:
      # above 48 KiB a kernel must opt in before its first launch, or the launch fails with CUDA_ERROR_INVALID_VALUE
      attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
      check(cu.cuFuncSetAttribute(self.function, attr, self.dynamic_shared),
            f"cuFuncSetAttribute({name}, MAX_DYNAMIC_SHARED_SIZE_BYTES={self.dynamic_shared})")

  def __call__(self, *bufs, global_size: Optional[Sequence[int]] = (1, 1, 1), local_size: Optional[Sequence[int]] = (1, 1, 1),
               vals: Sequence[int] = (), wait: bool = False, stream: Optional[int] = None) -> Optional[float]:
    """Launch on `stream` (a CUstream handle: a framework's, see CUDAAllocator.dlpack_stream), default the device's."""
    key = (None if global_size is None else tuple(global_size), None if local_size is None else tuple(local_size))
    if (config := self._configs.get(key)) is None:  # a kernel launches with the same sizes call after call
      config = self._configs[key] = launch_config(self.name, global_size, local_size, self.device.props)
    grid, block = config
    pointers = []
    for i, b in enumerate(raw_buffers(bufs)):
      if not isinstance(b, CUDAMemory) or b.device is not self.device:
        raise KcError(f"buffer {i} of kernel {self.name} is {b!r}, not memory of {self.device!r}")
      pointers.append(b.ptr)
    params = KernelParams(pointers, int32_values(vals, self.name))
    if 0 in grid or 0 in block: return 0.0 if wait else None  # an empty launch runs nothing; CUDA would reject it
    dev = self.device
    dev.activate()
    on = dev.stream if stream is None else stream
    what = f"cuLaunchKernel({self.name}, grid {list(grid)}, block {list(block)}, {self.dynamic_shared} bytes of dynamic shared memory)"
    if not wait:
      check(cu.cuLaunchKernel(self.function, *grid, *block, self.dynamic_shared, on, params.address, 0), what)
      return None
    start, end = dev.timing_events()
    check(cu.cuEventRecord(start, on), "cuEventRecord")
    check(cu.cuLaunchKernel(self.function, *grid, *block, self.dynamic_shared, on, params.address, 0), what)
    check(cu.cuEventRecord(end, on), "cuEventRecord")
    check(cu.cuEventSynchronize(end), f"running {self.name} (cuEventSynchronize)")
    return float(check(cu.cuEventElapsedTime(start, end), "cuEventElapsedTime")) * 1e-3

  def __repr__(self): return f"<CUDAProgram {self.name} on {self.device.props.name}>"


class CUDADevice(CompiledDevice):
  """Device `ordinal`'s primary context and a stream on it."""

  def __init__(self, name: str, ordinal: int, plugin_version: str = ""):
    init_driver()
    self.ordinal, self.props = ordinal, device_props(ordinal)
    self.cu_device = check(cu.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})", opening=True)
    self.context = check(cu.cuDevicePrimaryCtxRetain(self.cu_device), f"cuDevicePrimaryCtxRetain({ordinal})", opening=True)
    self._closed = False
    self._timing = threading.local()
    self.activate()
    # a blocking stream: it orders itself with the legacy default stream, which other libraries in the process may use
    self.stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_DEFAULT), "cuStreamCreate", opening=True)
    arch = self.props.arch
    super().__init__(name, CUDAAllocator(self), CUDARenderer(arch, self.props), NVRTCCompiler(arch, plugin_version),
                     functools.partial(CUDAProgram, self))

  def activate(self):
    """Make this device's context current on the calling thread."""
    if self._closed: raise KcError(f"{self!r} was closed: open it again through kc.Device")
    check(cu.cuCtxSetCurrent(self.context), f"cuCtxSetCurrent (device {self.ordinal})")

  def new_event(self):
    return check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")

  def timing_events(self) -> tuple:
    """The calling thread's (start, end) events that time a launch, made on its first timed launch and kept: an
    event's creation and destruction cost a launch as much as its recording. Per thread, as two threads' launches
    may be timed at once; they go with the context."""
    if (pair := getattr(self._timing, "events", None)) is None: pair = self._timing.events = (self.new_event(), self.new_event())
    return pair

  def synchronize(self):
    self.activate()
    check(cu.cuCtxSynchronize(), f"cuCtxSynchronize on {self.props.name}")

  def close(self):
    """Wait for the device, give cached buffers and the stream back, and release the primary context. Optional: the
    driver frees everything when the process ends; after close the device object cannot be used again."""
    if self._closed: return
    self.synchronize()
    if isinstance(self.allocator, CUDAAllocator): self.allocator.free_cache()
    check(cu.cuStreamDestroy(self.stream), "cuStreamDestroy")
    self._closed = True
    check(cu.cuDevicePrimaryCtxRelease(self.cu_device), f"cuDevicePrimaryCtxRelease({self.ordinal})")

  def __repr__(self): return f"<CUDADevice {self.name}: {self.props.name} ({self.props.arch}, device {self.ordinal})>"


def open_device(name: str = "CUDA", plugin_version: str = "") -> CUDADevice:
  """The selected GPU (KC_CUDA_DEVICE, default 0) as a kc device."""
  return CUDADevice(name, selected_ordinal(), plugin_version)


__all__ = ["CUDAMemory", "CUDAAllocator", "CUDAProgram", "CUDADevice", "open_device"]
