"""The runtime API every backend implements: Buffer, Allocator, Compiler (with its disk cache), the program
handle protocol, CompiledDevice, and the device registry exposed as `kc.Device`. Backend authors import these
names from `kc.backend`.

The registry names no backend: which devices exist is decided by the plugins (`kc.runtime.plugins`), found lazily
the first time `kc.Device` is used, so `import kc` never pays for (or fails because of) a plugin. The core's own EMU
device is one of them, registered through the kc distribution's entry point like any other."""
from __future__ import annotations
from abc import ABC, abstractmethod
import hashlib, json, operator, threading, warnings
from collections import defaultdict
from typing import TYPE_CHECKING, Callable, Hashable, Optional, Protocol, Sequence, Union
import numpy as np
from kc.runtime.cache import cached, lookup, store
from kc.ir.dtype import DType, PtrDType
from kc.config import read, use_plugin_loader
from kc.helpers import distribution_version
from kc.errors import AllocationError, CompileError, DeviceUnavailable, DTypeError, KcError, UnknownDeviceError
from kc.errors import ArgumentError
from kc.runtime.dlpack import (HOST_READABLE, VERSION as DLPACK_VERSION, DLPackError, device_name, export_capsule, host_bytes,
                               import_tensor, kDLCPU, kDLCUDA, producer_device, readable_by)

if TYPE_CHECKING:
  from kc.runtime.plugins import BackendSpec, PluginTable
  from kc.renderer import Renderer


class InvalidBufferError(KcError, ValueError):
  """A buffer operation that would read or write outside a buffer, or with data of the wrong size."""


# ---------------------------------------------------------------------------------------------------------- allocators

class Allocator(ABC):
  """Owns a device's memory. Opaque handles go in and out; only the allocator knows what they are.

  Subclasses implement `_alloc`, `_free`, `copyin`, `copyout` and, where views are supported, `offset`, and set
  `max_alloc` where the device caps one allocation."""
  max_alloc: Optional[int] = None
  """The most bytes one allocation may hold (OpenCL's CL_DEVICE_MAX_MEM_ALLOC_SIZE, Metal's maxBufferLength); None: no
  cap but memory itself. A larger request is a kc.AllocationError before the device is asked."""
  max_alloc_source: str = ""
  """Where max_alloc comes from, for the error's message ("CL_DEVICE_MAX_MEM_ALLOC_SIZE of <device>")."""

  def alloc(self, nbytes: int, options: Optional[Hashable] = None):
    if not isinstance(nbytes, int) or nbytes < 0: raise InvalidBufferError(f"cannot allocate {nbytes!r} bytes: need an int >= 0")
    if self.max_alloc is not None and nbytes > self.max_alloc:
      source = f" ({self.max_alloc_source})" if self.max_alloc_source else ""
      raise AllocationError(f"cannot allocate a buffer of {nbytes} bytes: {type(self).__name__} allocates at most "
                            f"{self.max_alloc} bytes at once{source}. Split the data into smaller buffers, or use a "
                            "device that holds it")
    return self._alloc(nbytes, options)

  def free(self, opaque, nbytes: int, options: Optional[Hashable] = None): self._free(opaque, nbytes, options)

  @abstractmethod
  def _alloc(self, nbytes: int, options: Optional[Hashable]): """A new handle to nbytes of device memory."""
  def _free(self, opaque, nbytes: int, options: Optional[Hashable]):  # noqa: B027 (host memory relies on the no-op)
    """Give the memory back (default: leave it to the garbage collector). Not abstract: memory that Python owns, as
    HostAllocator's numpy arrays (CLANG, EMU, the host backends kc new-backend generates) are, is freed when its
    last handle goes, so those allocators have nothing to do here and rely on this no-op."""
  @abstractmethod
  def copyin(self, dest, src: memoryview): """Copy host bytes into device memory."""
  @abstractmethod
  def copyout(self, dest: memoryview, src): """Copy device memory into host bytes."""

  def offset(self, opaque, nbytes: int, offset: int):
    """A handle to `nbytes` bytes starting `offset` bytes into `opaque`, sharing its memory."""
    raise KcError(f"{type(self).__name__} does not support buffer views: copy the data into a buffer of its own instead")

  def from_numpy(self, arr: np.ndarray):
    """A handle that uses `arr`'s memory in place, or None when the device cannot (then callers copy).

    Only devices whose kernels read host memory can say yes; the default is no. A handle made here borrows the
    array: the caller keeps the array alive for as long as the handle is used."""
    return None

  def numpy_written(self, opaque) -> Optional[Callable[[], None]]:
    """Asked when a `from_numpy` handle is made for an output, before the launch: what makes the kernel's writes
    visible in the array, run once the launch finished; None where they already are (the default: the kernel writes
    the array's memory itself). OPENCL maps its CL_MEM_USE_HOST_PTR buffer, as OpenCL requires before the host reads
    what a kernel wrote."""
    return None

  # DLPack: a device whose memory other frameworks can address sets dlpack_device and implements pointer and
  # from_pointer; one with streams implements dlpack_stream and export_ready. The defaults share nothing.
  dlpack_device: Optional[tuple[int, int]] = None
  """Where this allocator's memory lives in DLPack's terms, (DLDeviceType, device id): (1, 0) for host memory, (2, n) for
  CUDA device n. None: its memory cannot be shared (kc.Buffer.__dlpack__ refuses, from_dlpack copies or refuses)."""

  view_alignment: int = 1
  """The byte multiple at which a view of a buffer (offset) may start on this device: 1 where any offset works; an
  OpenCL device's sub-buffers start at its CL_DEVICE_MEM_BASE_ADDR_ALIGN. A program's intermediates (views of its
  arena) are placed at multiples of it."""

  def pointer(self, opaque) -> int:
    """The address of the first byte of a handle's memory, as other frameworks address it."""
    raise DLPackError(f"{type(self).__name__} memory has no address other frameworks can use")

  def from_pointer(self, address: int, nbytes: int, owner: object):
    """A handle over `nbytes` of memory at `address` that another framework allocated on this device (in place, never
    freed by kc), keeping `owner` referenced for as long as the handle lives; None where the device cannot."""
    return None

  def dlpack_stream(self, stream=None) -> Optional[int]:
    """The stream handle (an int) that work on this device's memory is ordered on for a call given `stream=` (None: the
    device's own), passed to a producer's `__dlpack__(stream=...)`. Devices without streams take only None."""
    if stream is None: return None
    raise ArgumentError(f"stream={stream!r}: {type(self).__name__} has no streams (its kernels finish before the call "
                        "returns); pass stream=None")

  def export_ready(self, stream: int) -> None:
    """Make this device's pending work visible to a consumer that reads its memory on `stream` (DLPack's
    `__dlpack__(stream=...)`; -1: the consumer synchronizes itself). Devices without streams: only -1 or None."""
    if stream not in (None, -1):
      raise DLPackError(f"stream={stream!r}: {type(self).__name__} memory is host memory, which takes no stream")


class LRUAllocator(Allocator):
  """Keeps freed buffers and hands them back for the next allocation of the same size and options, because
  device allocations are slow and kernels allocate the same shapes again and again.

  `oom_errors` are the exceptions by which a backend says it is out of memory: on one, the cache is freed and
  the allocation is tried once more."""
  oom_errors: tuple[type[BaseException], ...] = (MemoryError,)

  def __init__(self):
    self.cache: dict[tuple[int, Hashable], list] = defaultdict(list)

  def alloc(self, nbytes: int, options: Optional[Hashable] = None):
    if len(cached := self.cache.get((nbytes, options), ())): return cached.pop()
    try: return super().alloc(nbytes, options)
    except AllocationError: raise  # over the device's cap: freeing the cache cannot help
    except self.oom_errors as e: error: BaseException = e
    if self.cache:
      self.free_cache()
      try: return super().alloc(nbytes, options)
      except self.oom_errors as e: error = e
    # still out of memory with nothing cached: a backend's own typed error as it is (kc_cuda's CUDAOutOfMemory), else
    # kc's (a MemoryError too) with the backend's as its cause
    if isinstance(error, KcError): raise error
    raise AllocationError(f"out of memory: cannot allocate a buffer of {nbytes} bytes on {type(self).__name__} "
                          f"({type(error).__name__}: {error}). Free buffers, or split the data into smaller ones") from error

  def free(self, opaque, nbytes: int, options: Optional[Hashable] = None):
    self.cache[(nbytes, options)].append(opaque)

  def free_cache(self):
    """Give every cached buffer back to the device."""
    for (nbytes, options), opaques in self.cache.items():
      for opaque in opaques: self._free(opaque, nbytes, options)
    self.cache.clear()


class HostMemory:
  """Host memory. `data` is a C-contiguous numpy array over exactly these bytes (any dtype and shape); `array` is
  the same bytes as a flat uint8 array and `addr` the address of the first byte. `array` and `addr` are made on
  first use, because a wrapped array (`HostAllocator.from_numpy`) is made on every kernel call and most runtimes
  read only one of them."""
  __slots__ = ("data", "_array", "_addr")

  def __init__(self, data: np.ndarray, addr: Optional[int] = None):
    self.data, self._array, self._addr = data, None, addr

  @property
  def array(self) -> np.ndarray:
    if self._array is None:
      data = self.data
      self._array = data if data.dtype == np.uint8 and data.ndim == 1 else np.frombuffer(data, dtype=np.uint8) if data.size else np.empty(0, np.uint8)
    return self._array

  @property
  def addr(self) -> int:
    if self._addr is None: self._addr = self.data.ctypes.data
    return self._addr

  @property
  def nbytes(self) -> int: return self.data.nbytes

  def __repr__(self): return f"<HostMemory {self.nbytes} bytes at {self.addr:#x}>"


class HostAllocator(LRUAllocator):
  """Aligned host memory (numpy-owned, so Python frees it), for devices that run on the CPU."""
  alignment = 64  # a cache line, and enough for any vector load

  def _alloc(self, nbytes: int, options: Optional[Hashable]) -> HostMemory:
    try: raw = np.empty(nbytes + self.alignment, dtype=np.uint8)
    except ValueError as e:  # more bytes than numpy can index: no memory could ever hold it
      raise AllocationError(f"cannot allocate a buffer of {nbytes} bytes on the host: {e}") from e
    start = -raw.ctypes.data % self.alignment
    arr = raw[start:start + nbytes]
    return HostMemory(arr, raw.ctypes.data + start)

  def copyin(self, dest: HostMemory, src: memoryview): dest.array[:] = np.frombuffer(src, dtype=np.uint8)
  def copyout(self, dest: memoryview, src: HostMemory): np.frombuffer(dest, dtype=np.uint8)[:] = src.array

  def offset(self, opaque: HostMemory, nbytes: int, offset: int) -> HostMemory:
    return HostMemory(opaque.array[offset:offset + nbytes], opaque.addr + offset)

  dlpack_device = (kDLCPU, 0)
  def pointer(self, opaque: HostMemory) -> int: return opaque.addr
  def from_pointer(self, address: int, nbytes: int, owner: object) -> HostMemory:
    return HostMemory(host_bytes(address, nbytes, owner), address)

  def from_numpy(self, arr: np.ndarray) -> Optional[HostMemory]:
    # kernels address host memory directly, so any C-contiguous array works whose address suits its element type
    # (the C renderers align vector types to their scalar); anything else is copied by the caller
    flags = arr.flags
    return HostMemory(arr) if flags.c_contiguous and flags.aligned else None


# ---------------------------------------------------------------------------------------------------------- buffers

def _as_bytes(mv: memoryview) -> memoryview:
  return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


class Buffer:
  """`size` elements of `dtype` on `device`. A view (`base` given) shares its base's memory from byte `offset` on."""
  _foreign = False  # a buffer over another framework's memory (from_dlpack) sets it: a call checks its address

  def __init__(self, device: str, size: int, dtype: DType, base: Optional[Buffer] = None, offset: int = 0,
               options: Optional[Hashable] = None):
    if not isinstance(dtype, DType) or isinstance(dtype, PtrDType):
      raise DTypeError(f"a Buffer holds values of a DType like kc.dtypes.float32, got {dtype!r}")
    if not isinstance(size, int) or size < 0: raise InvalidBufferError(f"a Buffer's size is an element count >= 0, got {size!r}")
    self.device, self.size, self.dtype, self.options = DeviceRegistry.canonical(device), size, dtype, options
    if not isinstance(offset, int): raise InvalidBufferError(f"a view's offset is a byte count, got {offset!r}")
    if base is not None and not isinstance(base, Buffer): raise InvalidBufferError(f"a view's base is a kc.Buffer, got {type(base).__name__}")
    self.offset = offset
    if base is not None:
      if base.device != self.device: raise InvalidBufferError(f"a view on {self.device} of a buffer on {base.device}")
      if offset < 0 or offset + self.nbytes > base.nbytes:
        raise InvalidBufferError(f"a view of {self.nbytes} bytes at byte offset {offset} does not fit in the buffer of "
                                 f"{base.nbytes} bytes ({base.size} x {base.dtype}): use a smaller size or offset")
      if base._base is not None: base, self.offset = base._base, base.offset + offset  # views of views share the root
    elif offset != 0: raise InvalidBufferError("only a view (base=...) has an offset")
    self._base: Optional[Buffer] = base

  @property
  def nbytes(self) -> int: return self.size * self.dtype.itemsize
  @property
  def base(self) -> Buffer: return self if self._base is None else self._base
  @property
  def allocator(self) -> Allocator: return Device[self.device].allocator
  def is_allocated(self) -> bool: return hasattr(self, "_buf")

  def __repr__(self):
    return f"<Buffer {self.device} {self.size} x {self.dtype}{f' view at {self.offset}' if self._base is not None else ''}>"

  def allocate(self, opaque=None) -> Buffer:
    """Get the memory (or adopt `opaque`, a handle the device's allocator made). Allocating twice is a no-op."""
    if self.is_allocated(): return self
    if self._base is not None:
      self._base.allocate()
      self._buf = opaque if opaque is not None else self.allocator.offset(self._base._buf, self.nbytes, self.offset)
    else:
      self._owned = opaque is None  # adopted memory belongs to whoever made it: never recycle it
      self._buf = self.allocator.alloc(self.nbytes, self.options) if opaque is None else opaque
      self._allocator = self.allocator  # keep it so __del__ need not look the device up during shutdown
    return self

  def __del__(self):
    if getattr(self, "_owned", False) and hasattr(self, "_buf"):
      try: self._allocator.free(self._buf, self.nbytes, self.options)
      except Exception: pass  # interpreter shutdown: the process frees everything anyway

  def view(self, size: int, dtype: DType, offset: int = 0) -> Buffer:
    """`size` elements of `dtype` from byte `offset` of this buffer, sharing its memory."""
    return Buffer(self.device, size, dtype, base=self, offset=offset)

  def copyin(self, data: Union[np.ndarray, memoryview, bytes, bytearray]) -> Buffer:
    """Copy `data` (a numpy array of this buffer's dtype and size, or exactly nbytes of raw bytes) into the buffer."""
    if isinstance(data, np.ndarray):
      if self.dtype.np is None:
        raise DTypeError(f"{self.dtype} has no numpy dtype: copy raw bytes in (arr.view(np.uint8) or a memoryview)")
      if data.dtype != self.dtype.np:
        raise DTypeError(f"cannot copy a {data.dtype} array into a {self.dtype} buffer: convert it first (arr.astype(np.{self.dtype.np}))")
      if data.size != self.size:
        raise InvalidBufferError(f"cannot copy {data.size} elements into a buffer of {self.size} elements")
      mv = memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))  # flat first: a cast refuses shapes with a 0
    elif isinstance(data, (memoryview, bytes, bytearray)):
      mv = memoryview(data)
      if mv.format not in ("B", "b", "c") and self.dtype.fmt is not None and mv.format.lstrip("@=<") != self.dtype.fmt:
        raise DTypeError(f"cannot copy a memoryview of format {mv.format!r} into a {self.dtype} buffer "
                         f"(format {self.dtype.fmt!r}): pass raw bytes or matching data")
      if not mv.c_contiguous: raise InvalidBufferError("cannot copy a non-contiguous memoryview: make it contiguous first")
      mv = _as_bytes(mv)
      if mv.nbytes != self.nbytes:
        raise InvalidBufferError(f"cannot copy {mv.nbytes} bytes into a buffer of {self.nbytes} bytes ({self.size} x {self.dtype})")
    else:
      raise InvalidBufferError(f"copyin takes a numpy array, memoryview, bytes or bytearray, got {type(data).__name__}")
    self.allocate()
    self.allocator.copyin(self._buf, mv)
    return self

  def copyout(self, mv: memoryview) -> memoryview:
    """Copy the buffer's bytes into `mv`, a writable memoryview of exactly nbytes bytes."""
    try: mv = memoryview(mv)
    except TypeError: raise InvalidBufferError(f"copyout copies into a writable memoryview (or bytearray, array), got {type(mv).__name__}") from None
    if mv.readonly: raise InvalidBufferError("copyout needs a writable memoryview")
    if not mv.c_contiguous: raise InvalidBufferError("copyout needs a contiguous memoryview")
    if (raw := _as_bytes(mv)).nbytes != self.nbytes:
      raise InvalidBufferError(f"cannot copy a buffer of {self.nbytes} bytes ({self.size} x {self.dtype}) into {raw.nbytes} bytes")
    if not self.is_allocated():
      if self._base is None or not self._base.is_allocated():
        raise InvalidBufferError(f"{self!r} was never allocated or written: there is nothing to copy out")
      self.allocate()  # a view of memory that exists
    self.allocator.copyout(raw, self._buf)
    return mv

  def numpy(self) -> np.ndarray:
    """A fresh 1-D numpy array holding a copy of the buffer."""
    if self.dtype.np is None: raise DTypeError(f"{self.dtype} has no numpy dtype: copy the raw bytes out with copyout")
    out = np.empty(self.size, dtype=self.dtype.np)
    self.copyout(memoryview(out))
    return out

  # ---- DLPack (kc.runtime.dlpack): numpy, torch, cupy and jax read and write a Buffer's memory in place, and wrap theirs

  def __dlpack_device__(self) -> tuple[int, int]:
    if (where := self.allocator.dlpack_device) is None:
      raise DLPackError(f"{self.device} memory cannot be shared through DLPack: copy it out with .numpy() instead")
    return where

  def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
    """A DLPack capsule of the buffer as a 1-D tensor: the versioned (1.x) one when `max_version` allows it, else the
    legacy one. The consumer shares the memory (copy=True: a copy of it; dl_device=(1, 0) for a device buffer: a host
    copy), and the capsule keeps this Buffer, so its memory, alive until the consumer lets go. `stream` is the
    consumer's (CUDA): kc's pending work is made visible on it."""
    if stream is not None and (isinstance(stream, bool) or not isinstance(stream, (int, np.integer))):
      raise DLPackError(f"stream={stream!r:.60}: a DLPack stream is an int (a CUDA stream handle, or -1) or None")
    where = self.__dlpack_device__()
    versioned = max_version is not None and tuple(max_version)[0] >= 1
    version = DLPACK_VERSION if versioned and tuple(max_version) >= DLPACK_VERSION else (1, 0)
    if dl_device is not None and tuple(dl_device) != where:
      if tuple(dl_device) != (kDLCPU, 0) or copy is False:
        raise DLPackError(f"cannot export {self!r} to {device_name(tuple(dl_device))}: it lives on {device_name(where)}"
                          f"{', and copy=False forbids the copy to the host' if tuple(dl_device) == (kDLCPU, 0) else ''}")
      host = self._host_bytes()
      return export_capsule(host.ctypes.data, (self.size,), self.dtype, (kDLCPU, 0), host, versioned, copied=True, version=version)
    self.allocator.export_ready(stream)
    src = self.allocate()
    if copy: src = Buffer(self.device, self.size, self.dtype).copyin(memoryview(self._host_bytes()))
    return export_capsule(self.allocator.pointer(src._buf), (self.size,), self.dtype, where, src, versioned, copied=bool(copy),
                          version=version)

  @property
  def __cuda_array_interface__(self) -> dict:
    """Version 3 of the CUDA Array Interface (cupy, numba and torch read it), for buffers in CUDA memory; other
    buffers have none (an AttributeError, so that hasattr says no). `stream` is kc's, which consumers order after."""
    allocator = self.allocator
    if allocator.dlpack_device is None or allocator.dlpack_device[0] != kDLCUDA:
      raise AttributeError(f"{self.device} buffers are not CUDA memory: they have no __cuda_array_interface__")
    typestr = self.dtype.np.str if self.dtype.np is not None else f"|V{self.dtype.itemsize}"  # bfloat16, fp8: opaque
    data = allocator.pointer(self.allocate()._buf) if self.size else 0
    return {"version": 3, "shape": (self.size,), "typestr": typestr, "data": (data, False), "strides": None,
            "descr": [("", typestr)], "stream": allocator.dlpack_stream(None)}

  def _host_bytes(self) -> np.ndarray:
    host = np.empty(self.nbytes, np.uint8)
    if self.nbytes: self.copyout(memoryview(host))
    return host

  @classmethod
  def from_dlpack(cls, obj, device: Optional[str] = None, copy: Optional[bool] = False) -> Buffer:
    """A Buffer over a DLPack producer's tensor (a numpy, torch, cupy or jax array, a kc.Buffer), flat in C order, on
    `device` (default kc.Device.DEFAULT). copy=False (the default) never copies: the memory must be C-contiguous, writable
    and readable in place by `device`'s kernels (host memory for CLANG and EMU, the same GPU's memory for CUDA), else a
    DLPackError says why and that copy=None would copy. copy=None copies only where it must; copy=True always does. A
    shared Buffer keeps the producer's memory alive, and writes through either side are seen by the other."""
    if copy not in (None, True, False): raise DLPackError(f"copy must be None, True or False, got {copy!r}")
    name = Device.canonical(device) if device is not None else Device.DEFAULT
    if isinstance(obj, Buffer) and obj.device == name and copy is not True: return obj
    allocator = Device[name].allocator
    where = producer_device(obj)
    in_place = readable_by(where, allocator.dlpack_device)
    hint = f"pass copy=None to copy it into {name} memory" + ("" if device is not None else ", or device= a device that reads it")
    if not in_place and copy is False:
      raise DLPackError(f"a {type(obj).__name__} on {device_name(where)} is not memory {name} kernels read in place: {hint}")
    # memory the device cannot read and the host cannot either (a GPU's, for CLANG): the producer copies it to the host
    host_copy = {"dl_device": (kDLCPU, 0), "copy": True} if not in_place and where[0] not in HOST_READABLE else {}
    tensor = import_tensor(obj, stream=allocator.dlpack_stream(None) if in_place else None, **host_copy)
    if tensor.size == 0: return cls(name, 0, tensor.dtype).allocate()  # no memory to share
    if in_place and copy is not True and tensor.contiguous and not tensor.readonly:
      if (handle := allocator.from_pointer(tensor.address, tensor.nbytes, tensor.capsule)) is not None:
        buf = cls(name, tensor.size, tensor.dtype).allocate(handle)
        buf._foreign = True  # its address is the producer's: a kernel call checks its alignment
        return buf
    why = ("copy=True" if copy else f"it is not C-contiguous (strides {tensor.strides})" if not tensor.contiguous else
           "it is read-only" if tensor.readonly else f"{type(allocator).__name__} cannot wrap foreign memory")
    if copy is False: raise DLPackError(f"cannot use {tensor.describe()} in place on {name}: {why}; {hint}")
    if tensor.device[0] not in HOST_READABLE:  # device memory that must be rearranged: by way of a host copy
      tensor = import_tensor(obj, dl_device=(kDLCPU, 0), copy=True)
    host = np.ascontiguousarray(tensor.numpy()).reshape(-1)
    return cls(name, tensor.size, tensor.dtype).copyin(memoryview(host.view(np.uint8)))


# ---------------------------------------------------------------------------------------------------------- compilers

class Compiler(ABC):
  """Turns source into a device's binary. `compile` consults the disk cache (kc.runtime.cache); subclasses implement
  `compile_uncached` and `identity` (what besides the source decides the output: compiler, version, flags).

  `plugin_version` names the plugin distribution and its version, so a new plugin release never reuses
  binaries an older one built."""

  def __init__(self, plugin_version: str = ""):
    self.plugin_version = plugin_version

  def identity(self) -> str: return type(self).__qualname__
  @abstractmethod
  def compile_uncached(self, src: str) -> bytes: """The binary of `src`; raises kc.CompileError with the compiler's log."""

  def cache_key(self, src: str) -> str:
    parts = {"src": src, "compiler": self.identity(), "kc": distribution_version("kc-core"), "plugin": self.plugin_version}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

  max_batch = 32
  """The most sources compile_batch_uncached builds in one compiler run: a batch that fails is built again source by
  source, so a larger one costs more when a source in it is bad."""

  def compile(self, src: str) -> bytes:
    if not isinstance(src, str): raise CompileError(f"source must be a str, got {type(src).__name__}", src=str(src))
    return cached(self.cache_key(src), lambda: self.compile_uncached(src))

  def compile_batch_uncached(self, srcs: Sequence[str]) -> list[bytes]:
    """The binaries of several sources, built together where the backend can (one C compiler run for many kernels):
    each behaves as compile_uncached's would, and the list is in the sources' order. Raises CompileError when the
    batch does not build; compile_many then builds its sources one by one, which names the bad source. The default
    builds them one by one."""
    return [self.compile_uncached(src) for src in srcs]

  def builds_batches(self) -> bool:
    """Whether this compiler builds several sources in one compiler run (it has its own compile_batch_uncached)."""
    return type(self).compile_batch_uncached is not Compiler.compile_batch_uncached

  def compile_many(self, srcs: Sequence[str]) -> list[Union[bytes, CompileError]]:
    """compile() of every source, with the ones the disk cache lacks built in batches of up to max_batch
    (compile_batch_uncached). Each source gets its binary, or in its place the CompileError compile() would raise:
    one bad source costs its batch a second build, source by source, and never fails the others. A Compiler that
    overrides compile() (its own caching rules, as EMU's) is asked source by source."""
    if type(self).compile is not Compiler.compile or any(not isinstance(src, str) for src in srcs):
      return [_compile_or_error(self.compile, src) for src in srcs]
    keys = [self.cache_key(src) for src in srcs]
    got: dict[str, Union[bytes, CompileError]] = {}
    for key in dict.fromkeys(keys):
      if (hit := lookup(key)) is not None: got[key] = hit
    todo = list({key: src for key, src in zip(keys, srcs) if key not in got}.items())
    for start in range(0, len(todo), max(1, self.max_batch)):
      batch = todo[start:start + max(1, self.max_batch)]
      built: list[Union[bytes, CompileError]]
      try: built = list(self.compile_batch_uncached([src for _, src in batch])) if len(batch) > 1 else []
      except CompileError: built = []
      if len(built) != len(batch): built = [_compile_or_error(self.compile_uncached, src) for _, src in batch]
      for (key, _), out in zip(batch, built):
        got[key] = out
        if isinstance(out, bytes): store(key, out)
    return [got[key] for key in keys]


# ---------------------------------------------------------------------------------------------------------- programs

class ProgramHandle(Protocol):
  """A loaded kernel. Buffers are allocator handles (or kc.Buffers), vals the int32 variable values in the
  kernel's order. Returns the kernel's run time in seconds when wait=True, else None (it may still run). A host-memory
  program may also have `launch_arrays(arrays) -> seconds`, which kc.api uses for plain calls, and
  `launch_addresses(addresses) -> seconds`, which CompiledKernel.call_host uses (docs/BACKENDS.md)."""
  def __call__(self, *bufs, global_size: Sequence[int] = (1, 1, 1), local_size: Optional[Sequence[int]] = (1, 1, 1),
               vals: Sequence[int] = (), wait: bool = False) -> Optional[float]: ...


def _compile_or_error(compile_fn: Callable, src) -> Union[bytes, CompileError]:
  try: return compile_fn(src)
  except CompileError as e: return e


def int32_values(vals: Sequence, kernel: str) -> list[int]:
  """A launch's variable values as ints checked to fit the int32 kernel arguments (a float would truncate
  silently, a wider int would wrap): every runtime passes them through this."""
  out = []
  for i, v in enumerate(vals):
    try: v = operator.index(v)  # ints and numpy integers
    except TypeError: raise KcError(f"variable value {i} of kernel {kernel} is {v!r}: kernel variables are int32") from None
    if not -2**31 <= v < 2**31: raise KcError(f"variable value {i} of kernel {kernel} is {v}, outside int32")
    out.append(v)
  return out


def raw_buffers(bufs: Sequence) -> list:
  """The allocator handles of `bufs`, accepting kc.Buffers (allocated on the way) as well as raw handles."""
  return [b.allocate()._buf if isinstance(b, Buffer) else b for b in bufs]


class CompiledDevice:
  """A device a plugin opened: its renderer, allocator, compiler and runtime (`runtime(name, lib)` loads a
  compiled program and returns its ProgramHandle)."""

  def __init__(self, name: str, allocator: Allocator, renderer: Optional[Renderer], compiler: Compiler,
               runtime: Callable[[str, bytes], ProgramHandle]):
    self.name, self.allocator, self.renderer, self.compiler, self.runtime = name.upper(), allocator, renderer, compiler, runtime

  def synchronize(self):
    """Wait until every launched kernel finished. Devices whose launches are synchronous need not override it."""

  def __repr__(self): return f"<CompiledDevice {self.name}>"


# ---------------------------------------------------------------------------------------------------------- registry

class DeviceRegistry:
  """`kc.Device`: the registered devices, opened lazily and once. Names are case-insensitive."""

  def __init__(self, table: Optional[PluginTable] = None):
    self._given_table, self._opened, self._lock = table, {}, threading.RLock()
    self._device_free_compilers: dict = {}  # name -> (spec, Compiler) for devices that cannot open here
    self._default: Optional[str] = None
    self._fallbacks_warned: set[str] = set()  # broken devices DEFAULT has warned about passing over (once each)

  @property
  def table(self) -> PluginTable:
    if self._given_table is not None: return self._given_table
    # imported on first use so that `import kc` does not import pluggy; plugins imports nothing from this module
    from kc.runtime.plugins import BACKENDS
    return BACKENDS

  def names(self) -> list[str]:
    """Every registered device, highest priority first, whether or not it can open here."""
    specs = self.table.specs()
    return sorted(specs, key=lambda n: (-specs[n].priority, n))

  def spec(self, name: str) -> BackendSpec:
    specs = self.table.specs()
    if (key := self.canonical(name)) not in specs:
      known = ", ".join(self.names()) or "none"
      hint = f"; plugins that failed to load: {', '.join(self.table.errors())}" if self.table.errors() else ""
      raise UnknownDeviceError(f"unknown device {name!r}: the registered devices are {known}{hint}. "
                               "Install its plugin (e.g. pip install kc-<device>)")
    return specs[key]

  @staticmethod
  def canonical(name: str) -> str:
    if not isinstance(name, str): raise KcError(f"a device name is a str, got {name!r}")
    return name.upper()

  def unavailable_reason(self, name: str) -> Optional[str]:
    """None when `name` can open here, else why not."""
    self.spec(name)
    return self.table.unavailable_reason(self.canonical(name))

  def available(self) -> list[str]:
    return [n for n in self.names() if self.table.unavailable_reason(n) is None]

  def errors(self) -> dict[str, str]:
    """Plugins (or single devices of a plugin) that failed to load, and why."""
    return self.table.errors()

  def renderer(self, name: str) -> Renderer:
    """The device's Renderer, also when the device cannot open here (for the render and compile tiers)."""
    spec = self.spec(name)
    if spec.renderer is not None: return spec.renderer()
    if (reason := self.table.unavailable_reason(spec.name)) is not None:
      raise DeviceUnavailable(f"device {spec.name} cannot open here ({reason}) and {spec.origin} gives no renderer without "
                              "opening it: the plugin needs a BackendSpec.renderer factory for that")
    if (r := self[spec.name].renderer) is None: raise KcError(f"device {spec.name} from {spec.origin} has no renderer")
    return r

  def compiler(self, name: str) -> Compiler:
    """The device's Compiler: the opened device's where it can open here, else the plugin's device-free one
    (BackendSpec.compiler, made once); DeviceUnavailable names why when neither exists here."""
    spec = self.spec(name)
    if (reason := self.table.unavailable_reason(spec.name)) is None: return self[spec.name].compiler
    if spec.compiler is None:
      raise DeviceUnavailable(f"device {spec.name} cannot open here ({reason}) and {spec.origin} gives no compiler without "
                              "opening it (BackendSpec.compiler)")
    with self._lock:
      if (hit := self._device_free_compilers.get(spec.name)) is None or hit[0] is not spec:
        hit = self._device_free_compilers[spec.name] = (spec, spec.compiler())
    return hit[1]

  def __getitem__(self, name: str) -> CompiledDevice:
    spec = self.spec(name)
    with self._lock:
      if (hit := self._opened.get(spec.name)) is not None and hit[0] is spec: return hit[1]
      if (reason := self.table.unavailable_reason(spec.name)) is not None:
        raise DeviceUnavailable(f"device {spec.name} cannot open here: {reason}")
      try: dev = spec.open()
      except KcError: raise
      except Exception as e:
        raise DeviceUnavailable(f"device {spec.name} ({spec.distribution or 'in-process'} {spec.version}) failed to open: "
                                f"{type(e).__name__}: {e}") from e
      self._opened[spec.name] = (spec, dev)
      return dev

  def __contains__(self, name: str) -> bool: return self.canonical(name) in self.table.specs()

  @property
  def DEFAULT(self) -> str:
    """$KC_DEVICE if set (or a name assigned here), else the highest-priority available device."""
    if (chosen := self._default or read("KC_DEVICE")):
      return self.spec(chosen).name
    if avail := self.available():
      self._warn_fallback(avail[0])
      return avail[0]
    reasons = "; ".join(f"{n}: {self.table.unavailable_reason(n)}" for n in self.names()) or "no device is registered"
    raise DeviceUnavailable(f"no device can open here ({reasons}). Install kc-clang and a C compiler, or set KC_DEVICE")

  @DEFAULT.setter
  def DEFAULT(self, name: Optional[str]): self._default = None if name is None else self.spec(name).name

  def broken(self) -> dict[str, str]:
    """Devices that should open on any machine (BackendSpec.expected_everywhere) and cannot here, and why: a broken
    installation or setting (KC_CC naming no compiler), not a machine without the hardware."""
    specs = self.table.specs()
    return {n: reason for n in self.names()
            if specs[n].expected_everywhere and (reason := self.table.unavailable_reason(n)) is not None}

  def _warn_fallback(self, default: str):
    """Say once per device that DEFAULT is `default` because a higher-priority device that should open here cannot:
    otherwise kernels silently move to another device (a C backend whose compiler is missing made the next device the
    default without a word)."""
    from kc.runtime.plugins import PluginWarning  # imported here, as in `table`: `import kc` does not import pluggy
    names = self.names()
    for name, reason in self.broken().items():
      if names.index(name) > names.index(default) or name in self._fallbacks_warned: continue
      self._fallbacks_warned.add(name)
      warnings.warn(f"device {name} ({self.spec(name).origin}) is installed but cannot open here: {reason}. The "
                    f"default device is {default} instead; fix {name} or set KC_DEVICE={default} to choose it (kc "
                    "doctor checks the devices)", PluginWarning, stacklevel=3)


Device = DeviceRegistry()
# a knob a plugin declares exists once the plugin's module is imported: reading or overriding one before kc.Device was
# first used loads the plugins (the core names no backend, so it cannot import the declaring module itself)
use_plugin_loader(lambda: Device.table.load())
