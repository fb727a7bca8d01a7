"""The METAL device at run time, through pyobjc's Metal bindings (macOS only; imported when the device opens).

One MTLDevice (MTLCreateSystemDefaultDevice) and one command queue. Buffers use shared storage: on Apple GPUs host
and GPU share memory, so copies are memcpys into the buffer's contents once the GPU is done with it. Each launch is
one command buffer with one compute encoder; its GPUStartTime/GPUEndTime time the kernel."""
from __future__ import annotations
import functools, struct, threading
from dataclasses import dataclass
from typing import Hashable, Optional, Sequence
import Metal
from kc.backend import CompiledDevice, KcError, LRUAllocator, int32_values, raw_buffers
from kc_metal.compiler import MetalCompiler, describe
from kc_metal.family import newest_supported
from kc_metal.launch import argument_slots, check_arguments, plan_dispatch
from kc_metal.renderer import LOCAL_MAX, MetalRenderer


def metal_unavailable_reason() -> Optional[str]:
  if Metal.MTLCreateSystemDefaultDevice() is None: return "macOS reports no Metal device (MTLCreateSystemDefaultDevice returned nil)"
  return None


@dataclass(frozen=True)
class MetalBuffer:
  """A shared-storage MTLBuffer, or a view of one: `offset` bytes in, `nbytes` long."""
  buf: object
  offset: int
  nbytes: int


class MetalAllocator(LRUAllocator):
  def __init__(self, device: MetalDevice):
    super().__init__()
    self.device = device
    # newBufferWithLength returns nil above it, which would read as running out of memory
    self.max_alloc = int(device.mtl.maxBufferLength())
    self.max_alloc_source = f"maxBufferLength of {device.mtl.name()}"

  def _alloc(self, nbytes: int, options: Optional[Hashable]) -> MetalBuffer:
    if options is not None: raise KcError(f"METAL buffers take no options, got {options!r}")
    # Metal has no empty buffers; nil is how it says it is out of memory (LRUAllocator then frees its cache and retries)
    buf = self.device.mtl.newBufferWithLength_options_(max(nbytes, 1), Metal.MTLResourceStorageModeShared)
    if buf is None: raise MemoryError(f"Metal could not allocate {nbytes} bytes on {self.device.mtl.name()}")
    return MetalBuffer(buf, 0, nbytes)

  def _free(self, opaque: MetalBuffer, nbytes: int, options: Optional[Hashable]):
    self.device.synchronize()  # a kernel in flight may still use it; pyobjc releases it with the last reference

  def _contents(self, b: MetalBuffer) -> memoryview:
    self.device.synchronize()  # shared memory: the GPU must be done with it before the host reads or writes it
    return b.buf.contents().as_buffer(b.buf.length())[b.offset:b.offset + b.nbytes]

  def copyin(self, dest: MetalBuffer, src: memoryview):
    if src.nbytes: self._contents(dest)[:src.nbytes] = src.cast("B")

  def copyout(self, dest: memoryview, src: MetalBuffer):
    if dest.nbytes: dest.cast("B")[:] = self._contents(src)[:dest.nbytes]

  def offset(self, opaque: MetalBuffer, nbytes: int, offset: int) -> MetalBuffer:
    if offset % 4: raise KcError(f"a METAL buffer view must start at a multiple of 4 bytes (got byte {offset})")
    return MetalBuffer(opaque.buf, opaque.offset + offset, nbytes)


class MetalProgram:
  """One kernel's compute pipeline. kc's global_size counts threadgroups and local_size is the threadgroup."""

  def __init__(self, device: MetalDevice, name: str, lib: bytes):
    self.device, self.name = device, name
    src = lib.decode()
    self.slots = argument_slots(src, name)
    library = device.compiler.build(src)
    function = library.newFunctionWithName_(name)
    if function is None: raise KcError(f"the Metal library has no kernel named {name!r}")
    self.pipeline, error = device.mtl.newComputePipelineStateWithFunction_error_(function, None)
    if self.pipeline is None: raise KcError(f"Metal could not make a compute pipeline for {name}: {describe(error)}")
    self.max_threads = int(self.pipeline.maxTotalThreadsPerThreadgroup())

  def __call__(self, *bufs, global_size: Optional[Sequence[int]] = (1, 1, 1), local_size: Optional[Sequence[int]] = (1, 1, 1),
               vals: Sequence[int] = (), wait: bool = False) -> Optional[float]:
    check_arguments(self.name, self.slots, len(bufs), len(vals))
    handles = raw_buffers(bufs)
    for i, b in enumerate(handles):
      if not isinstance(b, MetalBuffer): raise KcError(f"buffer {i} of kernel {self.name} is {type(b).__name__}, not METAL memory")
    values = int32_values(vals, self.name)
    dispatch = plan_dispatch(self.name, global_size, local_size, self.max_threads, LOCAL_MAX)
    if dispatch is None: return 0.0 if wait else None  # an empty launch runs nothing; Metal would reject it
    command_buffer = self.device.queue.commandBuffer()
    encoder = command_buffer.computeCommandEncoder()
    encoder.setComputePipelineState_(self.pipeline)
    for slot, b in enumerate(handles): encoder.setBuffer_offset_atIndex_(b.buf, b.offset, slot)
    for slot, v in enumerate(values, start=len(handles)): encoder.setBytes_length_atIndex_(struct.pack("<i", v), 4, slot)
    grid, group = Metal.MTLSizeMake(*dispatch.grid), Metal.MTLSizeMake(*dispatch.threadgroup)
    if dispatch.per_thread: encoder.dispatchThreads_threadsPerThreadgroup_(grid, group)
    else: encoder.dispatchThreadgroups_threadsPerThreadgroup_(grid, group)
    encoder.endEncoding()
    command_buffer.commit()
    self.device.in_flight(command_buffer)
    if not wait: return None
    self.device.synchronize()
    return float(command_buffer.GPUEndTime() - command_buffer.GPUStartTime())

  def __repr__(self): return f"<MetalProgram {self.name} on {self.device.mtl.name()}>"


class MetalDevice(CompiledDevice):
  """The system's default Metal device and one command queue; renders for the GPU family it reports."""

  def __init__(self, name: str, plugin_version: str = ""):
    self.mtl = Metal.MTLCreateSystemDefaultDevice()
    if self.mtl is None: raise KcError("macOS reports no Metal device (MTLCreateSystemDefaultDevice returned nil)")
    self.queue = self.mtl.newCommandQueue()
    self.family = newest_supported(lambda value: bool(self.mtl.supportsFamily_(value)))
    self._pending: list = []
    self._lock = threading.Lock()
    super().__init__(name, MetalAllocator(self), MetalRenderer(self.family), MetalCompiler(self.mtl, plugin_version),
                     functools.partial(MetalProgram, self))

  def in_flight(self, command_buffer) -> None:
    with self._lock: self._pending.append(command_buffer)

  def synchronize(self):
    """Wait for every committed command buffer; a kernel that failed on the GPU raises here with Metal's error."""
    with self._lock: pending, self._pending = self._pending, []
    for cb in pending:
      cb.waitUntilCompleted()
      if (error := cb.error()) is not None: raise KcError(f"a METAL kernel failed on the GPU: {describe(error)}")

  def __repr__(self): return f"<MetalDevice {self.name}: {self.mtl.name()} ({self.family.name})>"
