"""The METAL device at run time, through pyobjc's Metal bindings (macOS only; imported when the device opens).

One MTLDevice (MTLCreateSystemDefaultDevice) and one command queue. Buffers use shared storage: on Apple GPUs host
and GPU share memory, so copies are memcpys into the buffer's contents once the GPU is done with it. Each launch is
one command buffer with one compute encoder; its GPUStartTime/GPUEndTime time the kernel.

Memory: what Metal's `new…` methods return is owned through pyobjc's selector metadata (kc_metal.retained), so the
last Python reference frees it on every pyobjc; launches and waits run in an autorelease pool, since a plain Python
process never drains one and each command buffer and encoder is autoreleased."""
from __future__ import annotations
import functools, struct
from dataclasses import dataclass
from typing import Hashable, Optional, Sequence
import Metal, objc
from kc.backend import CompiledDevice, KcError, LRUAllocator, int32_values, raw_buffers
from kc_metal.compiler import MetalCompiler, settings_here
from kc_metal.family import newest_supported
from kc_metal.launch import (PendingWork, argument_alignments, argument_slots, check_alignment, check_arguments, describe,
                             plan_dispatch)
from kc_metal.renderer import LOCAL_MAX, MetalRenderer
from kc_metal.retained import register_new_selectors

register_new_selectors(objc)  # before any `new…` call: see kc_metal.retained
MTL_GPU_FAMILY_METAL3 = 5001  # MTLGPUFamilyMetal3 (MTLDevice.h)


def metal_unavailable_reason() -> Optional[str]:
  with objc.autorelease_pool():
    if Metal.MTLCreateSystemDefaultDevice() is None:
      return "macOS reports no Metal device (MTLCreateSystemDefaultDevice returned nil)"
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
    # a kernel in flight may still use it; pyobjc releases it with the last reference. A kernel's failure is kept for
    # the next synchronize: raised here it would surface in whichever buffer is collected first (or be swallowed)
    with objc.autorelease_pool(): self.device.pending.wait()

  def _contents(self, b: MetalBuffer) -> memoryview:
    self.device.synchronize()  # shared memory: the GPU must be done with it before the host reads or writes it
    return b.buf.contents().as_buffer(b.buf.length())[b.offset:b.offset + b.nbytes]

  def copyin(self, dest: MetalBuffer, src: memoryview):
    if src.nbytes: self._contents(dest)[:src.nbytes] = src.cast("B")

  def copyout(self, dest: memoryview, src: MetalBuffer):
    if dest.nbytes: dest.cast("B")[:] = self._contents(src)[:dest.nbytes]

  def offset(self, opaque: MetalBuffer, nbytes: int, offset: int) -> MetalBuffer:
    # any byte: what a view's offset must be a multiple of depends on what a kernel reads there, checked at launch
    # (kc_metal.launch.argument_alignments)
    return MetalBuffer(opaque.buf, opaque.offset + offset, nbytes)


class MetalProgram:
  """One kernel's compute pipeline. kc's global_size counts threadgroups and local_size is the threadgroup."""

  def __init__(self, device: MetalDevice, name: str, lib: bytes):
    self.device, self.name = device, name
    src = lib.decode()
    self.slots = argument_slots(src, name)
    self.alignments = argument_alignments(src, name)
    library = device.compiler.build(src)
    with objc.autorelease_pool():
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
    check_alignment(self.name, self.alignments, [b.offset for b in handles])
    values = int32_values(vals, self.name)
    dispatch = plan_dispatch(self.name, global_size, local_size, self.max_threads, LOCAL_MAX)
    if dispatch is None: return 0.0 if wait else None  # an empty launch runs nothing; Metal would reject it
    with objc.autorelease_pool():  # the command buffer and its encoder are autoreleased: drained per launch
      command_buffer = self.device.queue.commandBuffer()
      encoder = command_buffer.computeCommandEncoder()
      encoder.setComputePipelineState_(self.pipeline)
      for slot, b in enumerate(handles): encoder.setBuffer_offset_atIndex_(b.buf, b.offset, slot)
      for slot, v in enumerate(values, start=len(handles)):
        encoder.setBytes_length_atIndex_(struct.pack("<i", v), 4, slot)
      grid, group = Metal.MTLSizeMake(*dispatch.grid), Metal.MTLSizeMake(*dispatch.threadgroup)
      if dispatch.per_thread: encoder.dispatchThreads_threadsPerThreadgroup_(grid, group)
      else: encoder.dispatchThreadgroups_threadsPerThreadgroup_(grid, group)
      encoder.endEncoding()
      command_buffer.commit()
      self.device.pending.add(self.name, command_buffer)  # pyobjc's reference keeps it alive past the pool
    if not wait: return None
    self.device.synchronize()
    return float(command_buffer.GPUEndTime() - command_buffer.GPUStartTime())

  def __repr__(self): return f"<MetalProgram {self.name} on {self.device.mtl.name()}>"


class MetalDevice(CompiledDevice):
  """The system's default Metal device and one command queue; renders for the GPU family it reports, in the newest
  MSL its macOS and GPU compile."""

  def __init__(self, name: str, plugin_version: str = ""):
    self.mtl = Metal.MTLCreateSystemDefaultDevice()
    if self.mtl is None: raise KcError("macOS reports no Metal device (MTLCreateSystemDefaultDevice returned nil)")
    self.queue = self.mtl.newCommandQueue()
    self.family = newest_supported(lambda value: bool(self.mtl.supportsFamily_(value)))
    self.settings = settings_here(metal3=bool(self.mtl.supportsFamily_(MTL_GPU_FAMILY_METAL3)))
    self.pending = PendingWork()
    super().__init__(name, MetalAllocator(self), MetalRenderer(self.family, self.settings.language),
                     MetalCompiler(self.mtl, self.settings, plugin_version), functools.partial(MetalProgram, self))

  def synchronize(self):
    """Wait for every committed command buffer, then raise the first kernel that failed on the GPU (kc_metal.launch's
    PendingWork), in an autorelease pool."""
    with objc.autorelease_pool(): self.pending.synchronize()

  def __repr__(self):
    return f"<MetalDevice {self.name}: {self.mtl.name()} ({self.family.name}, MSL {self.settings.language})>"
