"""DLPack, the tensor exchange protocol of numpy, torch, cupy and jax, in ctypes: the C structures (the versioned
DLManagedTensorVersioned of DLPack 1.x and the legacy DLManagedTensor), the dtype codes, capsules kc hands out for its
buffers (`export_capsule`) and the reading of any producer's capsule (`import_tensor`).

This module knows no device and no Buffer: kc.Buffer's `__dlpack__` and `from_dlpack` (kc.runtime.device) and the
kernel argument checks (kc.runtime.arguments) are built on it, and an allocator says where its memory lives in
DLPack's terms (`Allocator.dlpack_device`).

Lifetime. An exported capsule is numpy's, over an array whose base holds the object that keeps the memory alive (a
kc.Buffer): numpy's deleter, called by whoever consumed the capsule, or its capsule destructor when nobody did, lets
go of it. An imported tensor is kept alive by the producer's capsule itself: kc never renames it to
`used_dltensor`, so when the last reference to the capsule goes, the producer's own capsule destructor calls the
producer's deleter (what the protocol asks of an unconsumed capsule)."""
from __future__ import annotations
import ctypes
from dataclasses import dataclass
from math import prod
from typing import Optional
import numpy as np
from kc.ir.dtype import DType, dtypes
from kc.errors import ArgumentError


class DLPackError(ArgumentError, BufferError):
  """An object that cannot be exchanged through DLPack as asked: not a producer, a dtype or device DLPack or kc cannot
  express, memory on another device where no copy was allowed. A BufferError too, which the protocol asks of a
  producer that cannot export."""


# ---------------------------------------------------------------------------------------------------------- the ABI

class DLDevice(ctypes.Structure):
  _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
  _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
  _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
              ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
              ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void (*deleter)(DLManagedTensor[Versioned]* self)


class DLManagedTensor(ctypes.Structure):
  """The legacy (pre-1.0) capsule's contents: capsule name `dltensor`."""
  _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
  _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
  """DLPack 1.x's capsule contents: capsule name `dltensor_versioned`."""
  _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
              ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


FLAG_READ_ONLY, FLAG_IS_COPIED = 1 << 0, 1 << 1
VERSION = (1, 1)  # the newest layout kc reads and writes: 1.1 added the fp8 type codes, the ABI is 1.0's

# DLDeviceType: the ones kc meets. Host-readable memory is what a host-memory device (CLANG, EMU) can use in place.
kDLCPU, kDLCUDA, kDLCUDAHost, kDLOpenCL, kDLMetal, kDLROCM, kDLROCMHost, kDLCUDAManaged = 1, 2, 3, 4, 8, 10, 11, 13
HOST_READABLE = frozenset({kDLCPU, kDLCUDAHost, kDLROCMHost, kDLCUDAManaged})
DEVICE_NAMES = {kDLCPU: "CPU", kDLCUDA: "CUDA", kDLCUDAHost: "CUDA host (pinned)", kDLOpenCL: "OpenCL", 7: "Vulkan",
                kDLMetal: "Metal", kDLROCM: "ROCm", kDLROCMHost: "ROCm host", 12: "an extension device",
                kDLCUDAManaged: "CUDA managed", 14: "oneAPI", 15: "WebGPU", 16: "Hexagon", 17: "MAIA"}

# DLDataTypeCode
kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLBool, kDLFloat8_e4m3fn, kDLFloat8_e5m2 = 0, 1, 2, 4, 6, 10, 12
_CODES: dict[DType, tuple[int, int]] = {
  dtypes.bool: (kDLBool, 8),
  **{dt: (kDLInt, 8 * dt.itemsize) for dt in dtypes.sints},
  **{dt: (kDLUInt, 8 * dt.itemsize) for dt in dtypes.uints},
  **{dt: (kDLFloat, 8 * dt.itemsize) for dt in (dtypes.float16, dtypes.float32, dtypes.float64)},
  dtypes.bfloat16: (kDLBfloat, 16), dtypes.fp8e4m3: (kDLFloat8_e4m3fn, 8), dtypes.fp8e5m2: (kDLFloat8_e5m2, 8),
}
_DTYPES: dict[tuple[int, int], DType] = {code: dt for dt, code in _CODES.items()}


def device_name(device: tuple[int, int]) -> str:
  """`(2, 0)` -> 'CUDA:0', for messages."""
  return f"{DEVICE_NAMES.get(device[0], f'DLPack device type {device[0]}')}:{device[1]}"


def readable_by(memory: tuple[int, int], device: Optional[tuple[int, int]]) -> bool:
  """Whether kernels of a device whose memory is `device` (its allocator's dlpack_device) can use `memory` in place."""
  if device is None: return False
  if device[0] == kDLCPU: return memory[0] in HOST_READABLE
  return memory == device or (device[0] == kDLCUDA and memory == (kDLCUDAManaged, device[1]))


def dtype_code(dt: DType) -> tuple[int, int]:
  if (code := _CODES.get(dt)) is None:
    raise DLPackError(f"{dt} has no DLPack type code: DLPack exchanges {', '.join(d.name for d in _CODES)}")
  return code


def dtype_of(code: int, bits: int, lanes: int) -> DType:
  if lanes != 1: raise DLPackError(f"a DLPack tensor of {lanes}-lane vectors (type code {code}, {bits} bits): kc takes 1 lane")
  if (dt := _DTYPES.get((code, bits))) is None:
    known = ", ".join(f"{dt.name} ({c}, {b} bits)" for dt, (c, b) in _CODES.items())
    raise DLPackError(f"DLPack type code {code} with {bits} bits has no kc dtype; kc exchanges {known}")
  return dt


def storage_np(dt: DType) -> np.dtype:
  """numpy's dtype for `dt`, or the unsigned int of its size holding its raw bits (bfloat16, fp8)."""
  return dt.np if dt.np is not None else np.dtype(f"u{dt.itemsize}")


# ---------------------------------------------------------------------------------------------------------- capsules

_VERSIONED_NAME, _LEGACY_NAME = b"dltensor_versioned", b"dltensor"
_api = ctypes.pythonapi
_api.PyCapsule_GetPointer.restype, _api.PyCapsule_GetPointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetName.restype, _api.PyCapsule_GetName.argtypes = ctypes.c_char_p, [ctypes.py_object]


def export_capsule(address: int, shape: tuple[int, ...], dt: DType, device: tuple[int, int], owner: object,
                   versioned: bool, strides: Optional[tuple[int, ...]] = None, copied: bool = False,
                   version: tuple[int, int] = VERSION):
  """A capsule for the `dt` tensor of `shape` (strides in elements; None: C-contiguous) at `address` on `device`.
  `owner` stays referenced until the consumer calls the deleter (or the capsule is dropped unconsumed).

  numpy makes the capsule, over an array of raw bits at `address` whose base holds `owner`, and kc then writes the
  dtype, the device and the version into it: numpy's deleter and capsule destructor are C, which keep a pending
  exception intact (a Python destructor cannot: a capsule dropped while an exception unwinds would lose it). The
  array is never read on the host, so `address` may be device memory."""
  code, bits = dtype_code(dt)
  strides = strides if strides is not None else _c_strides(shape)
  if prod(shape) == 0: arr = np.empty(shape, storage_np(dt))  # nothing to keep alive
  else:
    item = dt.itemsize
    low = sum((d - 1) * s for d, s in zip(shape, strides) if s < 0) * item
    high = sum((d - 1) * s for d, s in zip(shape, strides) if s > 0) * item + item
    raw = host_bytes(address + low, high - low, owner)[-low:].view(storage_np(dt))
    arr = np.lib.stride_tricks.as_strided(raw, shape, tuple(s * item for s in strides))
  try: capsule = arr.__dlpack__(max_version=version) if versioned else arr.__dlpack__()
  except TypeError: capsule = arr.__dlpack__()  # numpy before 2.1 makes only the legacy capsule, which DLPack allows
  name = _api.PyCapsule_GetName(capsule)
  if name == _VERSIONED_NAME:
    managed = DLManagedTensorVersioned.from_address(_api.PyCapsule_GetPointer(capsule, name))
    managed.version = DLPackVersion(*version)
    if copied: managed.flags |= FLAG_IS_COPIED
  else: managed = DLManagedTensor.from_address(_api.PyCapsule_GetPointer(capsule, name))
  managed.dl_tensor.dtype, managed.dl_tensor.device = DLDataType(code, bits, 1), DLDevice(*device)
  return capsule


def _c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
  out, step = [], 1
  for d in reversed(shape):
    out.append(step)
    step *= d
  return tuple(reversed(out))


# ---------------------------------------------------------------------------------------------------------- importing

@dataclass(frozen=True)
class ForeignTensor:
  """A producer's tensor as its capsule describes it. `address` is its first element's (data + byte_offset), `strides`
  are in elements (C-contiguous filled in where the producer gave none), `device` is (DLDeviceType, device_id), and
  `capsule` keeps the producer's memory alive for as long as this object (or anything made from it) lives."""
  address: int
  shape: tuple[int, ...]
  strides: tuple[int, ...]
  dtype: DType
  device: tuple[int, int]
  readonly: bool
  capsule: object
  producer: str

  @property
  def size(self) -> int: return prod(self.shape)
  @property
  def nbytes(self) -> int: return self.size * self.dtype.itemsize

  @property
  def contiguous(self) -> bool:
    """C-contiguous: what kc's flat buffers are (strides of size-1 dims do not matter)."""
    return all(s == c for d, s, c in zip(self.shape, self.strides, _c_strides(self.shape)) if d != 1)

  def span(self) -> tuple[int, int]:
    """The byte range [low, high) relative to `address` that the tensor's elements cover (negative strides reach below)."""
    if self.size == 0: return 0, 0
    item = self.dtype.itemsize
    low = sum((d - 1) * s for d, s in zip(self.shape, self.strides) if s < 0) * item
    high = sum((d - 1) * s for d, s in zip(self.shape, self.strides) if s > 0) * item + item
    return low, high

  def describe(self) -> str: return f"a {self.producer} of {self.dtype.name}, shape {self.shape}, on {device_name(self.device)}"

  def numpy(self) -> np.ndarray:
    """The tensor as a numpy array over the same memory (host-readable memory only; raw bits for the dtypes numpy
    lacks), read-only where the producer said so. The array keeps the capsule, and so the memory, alive."""
    if self.device[0] not in HOST_READABLE:
      raise DLPackError(f"{self.describe()} is not in host memory: numpy cannot read it")
    npdt = storage_np(self.dtype)
    if self.size == 0: return np.empty(self.shape, npdt)
    low, high = self.span()
    flat = host_bytes(self.address + low, high - low, self.capsule)
    item = self.dtype.itemsize
    return np.lib.stride_tricks.as_strided(flat[-low:].view(npdt), self.shape, tuple(s * item for s in self.strides),
                                           writeable=not self.readonly)


def host_bytes(address: int, nbytes: int, owner: object) -> np.ndarray:
  """A writeable uint8 array over `nbytes` of host memory at `address`; its base holds `owner`, which keeps that memory
  alive for as long as the array (or any view of it) lives."""
  if nbytes == 0: return np.empty(0, np.uint8)
  raw = (ctypes.c_char * nbytes).from_address(address)
  raw._kc_keeps_alive = owner
  return np.frombuffer(raw, dtype=np.uint8)


def producer_device(obj) -> tuple[int, int]:
  """`obj.__dlpack_device__()` as (device type, device id), or a DLPackError saying why not."""
  try: kind, index = obj.__dlpack_device__()
  except AttributeError: raise DLPackError(f"a {type(obj).__name__} is not a DLPack producer (it has no __dlpack_device__)") from None
  except Exception as e: raise DLPackError(f"{type(obj).__name__}.__dlpack_device__() failed: {type(e).__name__}: {e}") from e
  return int(kind), int(index)


def import_tensor(obj, stream: Optional[int] = None, dl_device: Optional[tuple[int, int]] = None,
                  copy: Optional[bool] = None) -> ForeignTensor:
  """Read a DLPack producer's tensor. `stream` is the consumer's stream (the producer makes its pending work visible
  there; None for host memory); `dl_device` and `copy` are passed on when given (DLPack 1.0 producers honour them)."""
  if not hasattr(obj, "__dlpack__"): raise DLPackError(f"a {type(obj).__name__} is not a DLPack producer (it has no __dlpack__)")
  producer = f"{type(obj).__module__.split('.')[0]}.{type(obj).__name__}"
  extra = {k: v for k, v in (("stream", stream), ("dl_device", dl_device), ("copy", copy)) if v is not None}
  try:
    try: capsule = obj.__dlpack__(max_version=VERSION, **extra)
    except TypeError:  # a producer from before DLPack 1.0 knows none of the new keywords
      if dl_device is not None or copy is not None: raise
      capsule = obj.__dlpack__(**({"stream": stream} if stream is not None else {}))
  except DLPackError: raise
  except Exception as e:
    raise DLPackError(f"{producer}.__dlpack__ refused to export ({type(e).__name__}: {e})") from e
  return _read_capsule(capsule, producer)


def _read_capsule(capsule, producer: str) -> ForeignTensor:
  try: name = _api.PyCapsule_GetName(capsule)
  except Exception: raise DLPackError(f"{producer}.__dlpack__ returned a {type(capsule).__name__}, not a capsule") from None
  if name == _VERSIONED_NAME:
    managed = DLManagedTensorVersioned.from_address(_api.PyCapsule_GetPointer(capsule, name))
    if managed.version.major != VERSION[0]:
      raise DLPackError(f"{producer} exported DLPack {managed.version.major}.{managed.version.minor}; kc reads version {VERSION[0]}.x")
    readonly = bool(managed.flags & FLAG_READ_ONLY)
  elif name == _LEGACY_NAME:
    managed, readonly = DLManagedTensor.from_address(_api.PyCapsule_GetPointer(capsule, name)), False
  else: raise DLPackError(f"{producer}.__dlpack__ returned a capsule named {name!r}, not an unconsumed DLPack tensor")
  t = managed.dl_tensor
  dt = dtype_of(t.dtype.code, t.dtype.bits, t.dtype.lanes)
  shape = tuple(t.shape[i] for i in range(t.ndim))
  strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else _c_strides(shape)
  return ForeignTensor((t.data or 0) + t.byte_offset, shape, strides, dt, (t.device.device_type, t.device.device_id),
                       readonly, capsule, producer)


__all__ = ["DLPackError", "DLDevice", "DLDataType", "DLTensor", "DLManagedTensor", "DLManagedTensorVersioned", "DLPackVersion",
           "VERSION", "HOST_READABLE", "kDLCPU", "kDLCUDA", "readable_by", "device_name", "dtype_code", "dtype_of", "storage_np",
           "export_capsule", "ForeignTensor", "host_bytes", "producer_device", "import_tensor"]
