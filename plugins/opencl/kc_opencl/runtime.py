"""The OPENCL device at run time: one context and one in-order, profiling queue on the selected device; buffers
(and images) as pyopencl memory objects; programs loaded from their binaries once; kernels launched on an NDRange."""
from __future__ import annotations
import functools, hashlib, operator, threading
from collections import OrderedDict
from typing import Callable, Hashable, Optional, Sequence
import numpy as np
import pyopencl as cl
from kc.backend import CompiledDevice, ImageDType, KcError, LRUAllocator, dtypes, int32_values, raw_buffers
from kc_opencl.compiler import OpenCLCompiler, build_log, payload_entry, payload_source
from kc_opencl.platform import DeviceInfo
from kc_opencl.renderer import OpenCLRenderer

PROGRAMS_KEPT = 256  # loaded programs kept per device: a BEAM search loads many kernels, most used once
SHAPES_KEPT = 64  # launch shapes remembered per kernel: a kernel with Variables may launch with a new one every call
_START, _END = cl.profiling_info.START, cl.profiling_info.END


class OpenCLAllocator(LRUAllocator):
  """cl.Buffers (or cl.Images when the options are an ImageDType). Copies are blocking: the host memory they read
  or write belongs to the caller and may be gone right after the call."""
  oom_errors = (cl.MemoryError,)

  def __init__(self, device: OpenCLDevice):
    super().__init__()
    self.device = device
    # the driver refuses a larger buffer with an untyped INVALID_BUFFER_SIZE (or fails later): Allocator.alloc
    # refuses it first with a kc.AllocationError naming both sizes
    self.max_alloc = int(device.cl_device.max_mem_alloc_size)
    self.max_alloc_source = f"CL_DEVICE_MAX_MEM_ALLOC_SIZE of {device.info.name}"
    # kernels address host memory (CL_DEVICE_HOST_UNIFIED_MEMORY): numpy arguments are wrapped in place (from_numpy)
    self.host_memory = bool(device.cl_device.host_unified_memory)
    self._maps_due = threading.local()  # per thread: the wrapped outputs its next launch maps (numpy_written)
    self._mapped: dict[int, tuple] = {}  # id of a wrapped output: (it, its mapping), until the callback unmaps it

  def _alloc(self, nbytes: int, options: Optional[Hashable]):
    ctx = self.device.context
    if isinstance(options, ImageDType):
      h, w = options.shape[0], options.shape[1]
      channel = cl.channel_type.HALF_FLOAT if options.base == dtypes.half else cl.channel_type.FLOAT
      if h * w * 4 * options.base.itemsize != nbytes:
        raise KcError(f"an image {options} holds {h * w * 4} values of {options.base}, not a buffer of {nbytes} bytes")
      make = getattr(cl, "create_image", cl.Image)  # newer pyopencl deprecates constructing Image directly
      return make(ctx, cl.mem_flags.READ_WRITE, cl.ImageFormat(cl.channel_order.RGBA, channel), shape=(w, h))
    if options is not None: raise KcError(f"OPENCL buffers take no options but an ImageDType, got {options!r}")
    return cl.Buffer(ctx, cl.mem_flags.READ_WRITE, max(nbytes, 1))  # OpenCL has no empty buffers

  def _free(self, opaque, nbytes: int, options: Optional[Hashable]): opaque.release()

  def from_numpy(self, arr: np.ndarray) -> Optional[cl.Buffer]:
    """A cl.Buffer over `arr`'s own memory (CL_MEM_USE_HOST_PTR) on a device whose memory is the host's
    (CL_DEVICE_HOST_UNIFIED_MEMORY: PoCL's CPU device), so that a numpy argument is neither copied in nor back; None
    elsewhere, and for what a buffer cannot wrap (empty, not C-contiguous, an address not a multiple of its elements),
    which the caller copies. PoCL runs kernels on the host pointer itself at any such address; a driver that cannot
    copies behind the buffer, and the map after the launch (numpy_written) copies back: correct either way."""
    if not self.host_memory or not 0 < arr.nbytes <= self.max_alloc: return None
    flags = arr.flags
    if not (flags.c_contiguous and flags.aligned): return None
    # a read-only array is only ever an input
    access = cl.mem_flags.READ_WRITE if flags.writeable else cl.mem_flags.READ_ONLY
    return cl.Buffer(self.device.context, access | cl.mem_flags.USE_HOST_PTR, hostbuf=arr)

  def numpy_written(self, opaque: cl.Buffer) -> Callable[[], None]:
    """OpenCL makes a kernel's writes into a CL_MEM_USE_HOST_PTR buffer visible in the host memory only once the buffer
    is mapped (on a unified-memory device the map returns the host pointer and copies nothing). The launch that
    writes it enqueues the map right after the kernel and waits for both at once (take_maps); the callback returned
    unmaps it then, or maps it first where no launch did."""
    self._pending().append(opaque)
    def synchronize():
      buf, mapped = self._mapped.pop(id(opaque), (None, None))
      if buf is not opaque: mapped = self._map(opaque, blocking=True)[0]  # no launch mapped it
      mapped.base.release()  # the unmap: the memory object's release waits for it
    return synchronize

  def _pending(self) -> list:
    """This thread's buffers that numpy_written registered for the next launch to map."""
    if (pending := getattr(self._maps_due, "buffers", None)) is None: pending = self._maps_due.buffers = []
    return pending

  def _map(self, buf: cl.Buffer, blocking: bool) -> tuple[np.ndarray, cl.Event]:
    queue, whole = self.device.queue, (buf.size,)
    return cl.enqueue_map_buffer(queue, buf, cl.map_flags.READ, 0, whole, np.uint8, is_blocking=blocking)

  def unmap_for_launch(self, handles: list) -> None:
    """Unmap the wrapped outputs among `handles` that an earlier kernel of the same call mapped (a program of several
    kernels): no kernel may run on a mapped buffer, and where the driver copied for the map, the copy would miss this
    kernel's writes. The call's callback (numpy_written) maps them again once every kernel ran."""
    if not self._mapped: return
    for h in handles:
      got = self._mapped.get(id(h))
      if got is not None and got[0] is h:
        del self._mapped[id(h)]
        got[1].base.release()  # the unmap, queued before the kernel

  def take_maps(self, handles: list) -> list[cl.Buffer]:
    """The buffers among `handles` that numpy_written registered, which the launch maps after its kernel. The
    registrations of this thread are cleared either way: a call that failed before its launch leaves none behind."""
    if not (pending := getattr(self._maps_due, "buffers", None)): return []
    due = [h for h in handles if any(h is p for p in pending)]
    pending.clear()
    return due

  def enqueue_maps(self, bufs: list[cl.Buffer]) -> cl.Event:
    """Map `bufs` after what is queued (the kernel); the last map's event, done once all of them are."""
    event = None
    for buf in bufs:
      mapped, event = self._map(buf, blocking=False)
      self._mapped[id(buf)] = (buf, mapped)
    return event

  def _image_region(self, img) -> dict:
    return {"origin": (0, 0), "region": (img.get_image_info(cl.image_info.WIDTH), img.get_image_info(cl.image_info.HEIGHT))}

  def copyin(self, dest, src: memoryview):
    if src.nbytes == 0: return
    extra = self._image_region(dest) if isinstance(dest, cl.Image) else {}
    cl.enqueue_copy(self.device.queue, dest, src, is_blocking=True, **extra)

  def copyout(self, dest: memoryview, src):
    if dest.nbytes == 0: return
    extra = self._image_region(src) if isinstance(src, cl.Image) else {}
    cl.enqueue_copy(self.device.queue, dest, src, is_blocking=True, **extra)

  @property
  def view_alignment(self) -> int:
    """A view is an OpenCL sub-buffer, which must start on the device's base address alignment (given in bits)."""
    return max(1, self.device.info.mem_base_addr_align // 8)

  def offset(self, opaque, nbytes: int, offset: int):
    align = self.view_alignment
    if isinstance(opaque, cl.Image) or offset % align:
      raise KcError(f"an OPENCL buffer view must start at a multiple of {align} bytes on {self.device.info.name} (got byte "
                    f"{offset}{', of an image' if isinstance(opaque, cl.Image) else ''}): copy the data into a buffer of its own instead")
    return opaque.get_sub_region(offset, max(nbytes, 1))


class OpenCLProgram:
  """One kernel of a loaded program. Launch sizes follow kc: global_size counts work-groups per axis and local_size
  is the work-group, so the NDRange is their product; local_size None lets the driver choose the work-group."""

  def __init__(self, device: OpenCLDevice, name: str, lib: bytes):
    self.device, self.name = device, name
    entry, lib = payload_entry(lib)  # a batched compile's kernel lives in its batch's program under another name
    program = device.load_program(lib)
    try: self.kernel = cl.Kernel(program, entry or name)
    except cl.Error as e: raise KcError(f"the OpenCL program has no kernel named {entry or name!r}: {e}") from None
    self.num_args = int(self.kernel.get_info(cl.kernel_info.NUM_ARGS))
    self._lock = threading.Lock()  # set_args and enqueue must not interleave between threads
    self._allocator: OpenCLAllocator = device.allocator
    self._bound: tuple = ()  # the memory objects the kernel's arguments are set to, in order
    self._values: list[int] = []  # and the variable values after them
    self._shapes: dict[tuple, tuple] = {}  # (global_size, local_size) as given: (NDRange, work-group), see _shape

  def __call__(self, *bufs, global_size: Optional[Sequence[int]] = (1, 1, 1), local_size: Optional[Sequence[int]] = (1, 1, 1),
               vals: Sequence[int] = (), wait: bool = False) -> Optional[float]:
    if len(bufs) + len(vals) != self.num_args:
      raise KcError(f"kernel {self.name} takes {self.num_args} arguments, called with {len(bufs)} buffers and {len(vals)} variable values")
    handles = raw_buffers(bufs)
    ndrange, local = self._shape(global_size, local_size)
    if ndrange is None:  # an empty launch runs nothing; OpenCL would reject it
      self._check_handles(handles)
      return 0.0 if wait else None
    values = int32_values(vals, self.name) if vals else []
    with self._lock:
      # a kernel keeps its arguments between launches: only changed ones are set again (a call with the same
      # kc.Buffers sets none); the handles bound are held, so that identity cannot be a reused id
      bound = self._bound
      if len(handles) != len(bound) or not all(map(operator.is_, handles, bound)) or values != self._values:
        self._set_args(handles, values)
      self._allocator.unmap_for_launch(handles)
      try: event = cl.enqueue_nd_range_kernel(self.device.queue, self.kernel, ndrange, local)
      except cl.Error as e:
        raise KcError(f"launching {self.name} with {len(ndrange)}-d NDRange {ndrange} and work-group {local} failed: {e}") from None
      # numpy outputs wrapped in place are mapped behind the kernel: one wait for both, not a second round trip
      maps = self._allocator.take_maps(handles) if wait else []
      done = self._allocator.enqueue_maps(maps) if maps else event
    if not wait: return None
    done.wait()
    # get_profiling_info directly: event.profile's attribute lookup costs as much as the launch's own Python work
    return (event.get_profiling_info(_END) - event.get_profiling_info(_START)) * 1e-9

  def _check_handles(self, handles: list):
    for i, b in enumerate(handles):
      if not isinstance(b, cl.MemoryObject): raise KcError(f"buffer {i} of kernel {self.name} is {type(b).__name__}, not OPENCL memory")

  def _set_args(self, handles: list, values: list[int]):
    self._check_handles(handles)
    self._bound, self._values = (), []  # what is bound is unknown until set_args succeeded
    self.kernel.set_args(*handles, *(np.int32(v) for v in values))
    # a caller's numpy array wrapped in place (CL_MEM_USE_HOST_PTR) is not held past its call: the next call sets
    # the arguments again rather than keep the caller's memory alive until then
    wraps = any(isinstance(h, cl.Buffer) and h.get_info(cl.mem_info.FLAGS) & cl.mem_flags.USE_HOST_PTR for h in handles)
    self._bound, self._values = (() if wraps else tuple(handles)), values

  def _shape(self, global_size, local_size) -> tuple[Optional[list[int]], Optional[list[int]]]:
    """The NDRange and work-group of a launch (NDRange None: empty), checked and converted once per distinct pair."""
    # sizes given as tuples (kc's own calls) are their own key; lists are converted
    g, loc = global_size, local_size
    key = (g if g is None or type(g) is tuple else tuple(g), loc if loc is None or type(loc) is tuple else tuple(loc))
    if (hit := self._shapes.get(key)) is not None: return hit
    groups = [int(g) for g in (global_size or (1, 1, 1))]
    local = None if local_size is None else [int(s) for s in local_size]
    if local is not None: self._check_work_group(local)
    ndrange = groups if local is None else [g * s for g, s in zip(groups, local)]
    shape = (None if 0 in ndrange else ndrange, local)
    if len(self._shapes) < SHAPES_KEPT: self._shapes[key] = shape
    return shape

  def _check_work_group(self, local: list[int]):
    info = self.device.info
    too_big = [f"axis {i}: {s} > {m}" for i, (s, m) in enumerate(zip(local, info.max_work_item_sizes)) if s > m]
    if too_big or (n := int(np.prod(local))) > info.max_work_group_size:
      why = "; ".join(too_big) or f"{n} work-items > the device's {info.max_work_group_size}"
      raise KcError(f"kernel {self.name} asks for a work-group {local} that {info.name} cannot run ({why}): use smaller LOCAL/GROUP opts")

  def __repr__(self): return f"<OpenCLProgram {self.name} on {self.device.info.name}>"



class OpenCLDevice(CompiledDevice):
  """A context and a profiling command queue on one OpenCL device."""

  def __init__(self, name: str, cl_device, plugin_version: str = ""):
    self.cl_device, self.info = cl_device, DeviceInfo.of(cl_device)
    self.context = cl.Context([cl_device])
    self.queue = cl.CommandQueue(self.context, cl_device, properties=cl.command_queue_properties.PROFILING_ENABLE)
    self._programs: OrderedDict[str, cl.Program] = OrderedDict()
    self._programs_lock = threading.Lock()
    super().__init__(name, OpenCLAllocator(self), OpenCLRenderer(self.info), OpenCLCompiler(self.context, cl_device, self.info, plugin_version),
                     functools.partial(OpenCLProgram, self))

  def load_program(self, lib: bytes):
    """The program built from `lib` (a binary from this device's compiler, or the source it kept: keeps_source), built
    once and kept for the next kernel."""
    key = hashlib.sha256(lib).hexdigest()
    with self._programs_lock:
      if (hit := self._programs.get(key)) is not None:
        self._programs.move_to_end(key)
        return hit
    if (src := payload_source(lib)) is not None: program = self.compiler.build(src)
    else: program = self._from_binary(lib)
    with self._programs_lock:
      self._programs[key] = program
      while len(self._programs) > PROGRAMS_KEPT: self._programs.popitem(last=False)
    return program

  def _from_binary(self, lib: bytes):
    program = cl.Program(self.context, [self.cl_device], [lib])
    try: program.build(devices=[self.cl_device])
    except cl.Error as e:
      raise KcError(f"{self.info.name} rejected a program binary ({e}); {build_log(program, self.cl_device)}. A stale compile cache "
                    "entry can cause this: clear KC_CACHE_DIR") from None
    return program

  def synchronize(self): self.queue.finish()

  def __repr__(self): return f"<OpenCLDevice {self.name}: {self.info.name} ({self.info.platform})>"
