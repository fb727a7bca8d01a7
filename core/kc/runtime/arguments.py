"""What a compiled kernel declares for each of its buffers, and the check of one call's arguments against it.

A buffer's declared shape is the shape its user wrote: the store's shape for an output, the `A.arg` shape for an
input. kc.ast records the latter as each LOAD's arg, so a reshaped, permuted or sliced input still takes the shape it
was declared with; for an AST built otherwise it is recovered from the loads' views (`declared_shape`). Where
neither says (a shrink, a reshape into several views, loads that disagree), only the element count the kernel
reaches is checked.

A numpy argument must have the declared shape, ignoring size-1 dims (a reduce keeps its axes as 1, so a (M, 1, N)
output takes an (M, N) array), or be 1-D with as many elements (frameworks that hold flat buffers). Its dtype must
be the buffer's; for the dtypes numpy lacks (bfloat16, fp8e4m3, fp8e5m2) either ml_dtypes' array type of that name or the
raw bits in the unsigned int of the same size (uint16, uint8). A non-contiguous input is copied, which is correct and only
slower; an output is written in place, so it must be C-contiguous and writeable.

Any other DLPack producer (a torch, cupy or jax array) is read through its capsule (`import_producers`) and follows the
same rules: host memory becomes a numpy array over the producer's memory (so CLANG and EMU use it in place, and a GPU
device copies it in and back, as it does numpy's), memory of the kernel's own device is wrapped in place, and memory
the device cannot read is an ArgumentError. A device-memory input that is not C-contiguous, or whose address does not
suit the kernel's vector accesses, is copied (through the host); such an output is written to an aligned copy and
copied back, and a non-contiguous or read-only output is an ArgumentError."""
from __future__ import annotations
from math import prod
from typing import Callable, Optional, Union
import numpy as np
from kc.runtime.device import Allocator, Buffer, Device
from kc.runtime.dlpack import HOST_READABLE, DLPackError, ForeignTensor, device_name, import_tensor, producer_device, readable_by
from kc.ir.dtype import DType, dtypes
from kc.errors import ArgumentError, KcError
from kc.codegen.verify import st_arg
from kc.shape import ShapeTracker
from kc.shape.view import fmt_shape
from kc.ir.symbolic import sym_infer
from kc.ir.uop import Ops, UOp, sint


# The dtypes numpy has no type for, each with ml_dtypes' name for it (recognized by name: kc never imports ml_dtypes,
# a user who has it passes its arrays) and the unsigned int its bits are passed in otherwise.
_WITHOUT_NUMPY: dict[DType, tuple[str, np.dtype]] = {
  dtypes.bfloat16: ("bfloat16", np.dtype(np.uint16)),
  dtypes.fp8e4m3: ("float8_e4m3fn", np.dtype(np.uint8)),
  dtypes.fp8e5m2: ("float8_e5m2", np.dtype(np.uint8)),
}


def bits_dtype(dt: DType) -> Optional[np.dtype]:
  """The numpy dtype an array of raw `dt` bits has, for the dtypes numpy lacks; None for the others."""
  return None if (entry := _WITHOUT_NUMPY.get(dt)) is None else entry[1]


def array_fits(dt: DType, arr_dtype: np.dtype) -> bool:
  """Whether an array of `arr_dtype` holds `dt` values: numpy's own type, or ml_dtypes' type or the raw bits for
  the dtypes numpy lacks."""
  if (entry := _WITHOUT_NUMPY.get(dt)) is None: return arr_dtype == dt.np
  name, bits = entry
  return arr_dtype == bits or (arr_dtype.name == name and arr_dtype.itemsize == bits.itemsize)


def as_bits(arr: np.ndarray, dt: DType) -> np.ndarray:
  """`arr` seen as its raw bits (a view: the memory is shared) for the dtypes numpy lacks, else `arr` itself."""
  bits = bits_dtype(dt)
  return arr if bits is None or arr.dtype == bits else arr.view(bits)


def declared_shape(st: ShapeTracker) -> Optional[tuple[sint, ...]]:
  """The contiguous shape a load's view was moved from, or None when the view does not determine it.

  An unmoved view is that shape itself. A permuted, flipped, padded or expanded one still covers its whole
  buffer with one stride per dim: sorting the dims it reads by stride gives the buffer back (its size-1 dims
  aside). A shrink that keeps the layout cannot be told from a smaller declaration: it yields the smaller shape."""
  if len(st.views) != 1: return None
  v = st.views[0]
  if v.contiguous: return v.shape
  if not all(isinstance(x, int) for x in (*v.shape, *v.strides, v.offset)) or v.is_void: return None
  if v.mask is not None:
    if not all(isinstance(x, int) for m in v.mask for x in m): return None
    v = v.shrink(v.mask)  # padding reads nothing: the valid window is what covers the buffer
  dims = sorted(((abs(stride), size) for size, stride in zip(v.shape, v.strides) if stride != 0 and size != 1), reverse=True)
  step = 1
  for stride, size in reversed(dims):
    if stride != step: return None  # a gap or an overlap: not one whole contiguous buffer
    step *= size
  lowest = v.offset + sum((size - 1) * stride for size, stride in zip(v.shape, v.strides) if stride < 0)
  return tuple(size for _, size in dims) if lowest == 0 else None


def _squeezed(shape) -> tuple: return tuple(d for d in shape if d != 1)


def _at(shape: tuple[sint, ...], vals: dict[str, int]) -> tuple[int, ...]:
  return tuple(int(sym_infer(d, vals)) if isinstance(d, UOp) else d for d in shape)


def _reached(views: tuple[ShapeTracker, ...], vals: dict[str, int]) -> int:
  """The elements a buffer must hold: the most any of its views reaches with the Variables at their values."""
  most = 0
  for st in views:
    if st.vars():
      subst = {v: UOp.const(v.dtype, vals[v.arg[0]]) for v in st.vars()}
      st = ShapeTracker(tuple(view.substitute(subst) for view in st.views))
    most = max(most, int(st.real_size()))
  return most


class BufferSpec:
  """One buffer of a kernel: its index, dtype, whether the kernel writes it, its declared shape (None where the
  AST does not say) and the views it is reached through. What does not depend on Variables is computed once here,
  so that a call only compares."""
  __slots__ = ("index", "dtype", "np_dtype", "output", "shape", "views", "symbolic", "elements", "squeezed", "kernel", "declared",
               "alignment")

  def __init__(self, kernel: str, index: int, dtype: DType, output: bool, shape: Optional[tuple[sint, ...]],
               views: tuple[ShapeTracker, ...], declared: int = -1):
    self.declared = declared  # the element count the buffer's pointer declares, -1 when it does not
    self.kernel, self.index, self.dtype, self.np_dtype, self.output = kernel, index, dtype, dtype.np, output
    self.shape, self.views = shape, views
    self.symbolic = any(st.vars() for st in views) or any(isinstance(d, UOp) for d in shape or ())
    # static: the element count and the squeezed shape once; symbolic: per call, from the Variables' values
    self.elements = None if self.symbolic else (prod(shape) if shape is not None else _reached(views, {}))
    self.squeezed = None if self.symbolic or shape is None else _squeezed(shape)
    self.alignment = 1  # the byte multiple its address must be: the widest vector access, where the device needs that

  def aligned(self, address: int) -> bool: return address % self.alignment == 0

  def __repr__(self):
    return f"<BufferSpec {self.index} {self.dtype.name} {'?' if self.shape is None else fmt_shape(self.shape)}{' out' if self.output else ''}>"

  def _name(self) -> str: return f"{'output' if self.output else 'input'} {self.index} of {self.kernel}"

  def shape_at(self, vals: dict[str, int]) -> Optional[tuple[int, ...]]:
    """The declared shape with the Variables at their values (None where the AST does not say)."""
    if self.shape is None: return None
    return _at(self.shape, vals) if self.symbolic else self.shape

  def elements_at(self, vals: dict[str, int]) -> int:
    """How many elements the buffer holds (a declared shape) or the kernel reaches in it (no declared shape)."""
    if not self.symbolic: return self.elements
    return prod(_at(self.shape, vals)) if self.shape is not None else _reached(self.views, vals)

  def check_array(self, arr: np.ndarray, vals: dict[str, int]) -> None:
    """Raise ArgumentError unless `arr` has this buffer's dtype and shape, and can be written if it is an output."""
    if not array_fits(self.dtype, arr.dtype):
      if (bits := bits_dtype(self.dtype)) is not None:
        raise ArgumentError(f"{self._name()} is {self.dtype.name}, which numpy has no dtype for: pass an array of ml_dtypes."
                            f"{_WITHOUT_NUMPY[self.dtype][0]}, its raw bits as np.{bits}, or a kc.Buffer; got an array of {arr.dtype}")
      if self.np_dtype is None:
        raise ArgumentError(f"{self._name()} is {self.dtype.name}, which numpy has no dtype for: pass a kc.Buffer")
      raise ArgumentError(f"{self._name()} must be {self.np_dtype}, got an array of {arr.dtype}; convert it with .astype(np.{self.np_dtype})")
    self._check_extent(arr.shape, arr.size, vals, "an array")
    if self.output:
      flags = arr.flags
      if not flags.writeable: raise ArgumentError(f"{self._name()} is written in place, but the array given is read-only")
      if not flags.c_contiguous:
        raise ArgumentError(f"{self._name()} is written in place, but the array given is not C-contiguous (strides {arr.strides}): "
                            "pass a contiguous array (np.ascontiguousarray) and copy it back")

  def _check_extent(self, given: tuple[int, ...], size: int, vals: dict[str, int], what: str) -> None:
    """Raise ArgumentError unless an argument of shape `given` (`what` it is, for the message) fits the declared shape."""
    if self.shape is None:
      if self.declared != -1 and size != self.declared:
        raise ArgumentError(f"{self._name()} is declared with {self.declared} elements, got {what} of shape {given} ({size} elements)")
      if size < (n := self.elements_at(vals)):
        raise ArgumentError(f"{self._name()} needs {n} elements, got {what} of shape {given} ({size} elements)")
    else:
      want = self.shape if not self.symbolic else _at(self.shape, vals)
      if given != want and _squeezed(given) != (self.squeezed if not self.symbolic else _squeezed(want)) and \
         not (len(given) == 1 and given[0] == prod(want)):
        raise ArgumentError(f"{self._name()} must have shape {want} (size-1 dims aside, or 1-D with {prod(want)} elements), "
                            f"got {what} of shape {given}")

  def adopt(self, arg, device: str, allocator: Allocator, stream: Optional[int]) -> Union[np.ndarray, ForeignTensor]:
    """A DLPack producer's tensor as this buffer takes it: a numpy array over host memory, or the ForeignTensor of memory
    the device reads in place. Its device and dtype are checked here, and, for an output, that it can be written in
    place; its shape by `check`. `stream`: the stream the call runs on (None: the device's own)."""
    if not hasattr(arg, "__dlpack__"):
      raise ArgumentError(f"{self._name()} must be a numpy array or a kc.Buffer, got {type(arg).__name__}, which is no DLPack "
                          "producer (a torch, cupy or jax array) either")
    try:
      where = producer_device(arg)
      host = where[0] in HOST_READABLE
      if not host and not readable_by(where, allocator.dlpack_device):
        raise ArgumentError(f"{self._name()} is a {type(arg).__name__} on {device_name(where)}, which {device} kernels cannot "
                            f"read: move it to {device}'s memory (for torch: tensor.to(...)), or to the host, first")
      tensor = import_tensor(arg, stream=None if host else allocator.dlpack_stream(stream))
    except DLPackError as e: raise DLPackError(f"{self._name()}: {e}") from e.__cause__
    bits = bits_dtype(self.dtype)
    if tensor.dtype != self.dtype and (bits is None or tensor.dtype.np != bits):
      raw = f", or its raw bits as {np.dtype(bits).name}" if bits is not None else ""
      raise ArgumentError(f"{self._name()} must be {self.dtype.name}{raw}, got {tensor.describe()}")
    if self.output and tensor.size:
      if tensor.readonly: raise ArgumentError(f"{self._name()} is written in place, but {tensor.describe()} is read-only")
      if not tensor.contiguous:
        raise ArgumentError(f"{self._name()} is written in place, but {tensor.describe()} is not C-contiguous (strides "
                            f"{tensor.strides} elements): pass a contiguous one (tensor.contiguous()) and copy the result back")
    return tensor.numpy() if host else tensor

  def check_foreign(self, tensor: ForeignTensor, vals: dict[str, int]) -> None:
    self._check_extent(tensor.shape, tensor.size, vals, f"a {tensor.producer}")

  def check_buffer(self, buf: Buffer, device: str, vals: dict[str, int]) -> None:
    if buf.dtype != self.dtype: raise ArgumentError(f"{self._name()} must be {self.dtype.name}, got a Buffer of {buf.dtype.name}")
    if buf.device != device: raise ArgumentError(f"{self._name()} is on {buf.device}, the kernel runs on {device}")
    if buf.size < (n := self.elements_at(vals)): raise ArgumentError(f"{self._name()} needs {n} elements, the Buffer has {buf.size}")
    # device allocations start aligned for any vector: a view's byte offset decides (a GPU faults on a misaligned float4);
    # memory wrapped by kc.from_dlpack starts where its producer put it
    if buf.base._foreign and not self.aligned(address := buf.allocator.pointer(buf.allocate()._buf)):
      raise ArgumentError(f"{self._name()} is a Buffer over another framework's memory at address {address:#x}, but the kernel "
                          f"accesses it as {self.alignment}-byte vectors, which {device} needs at a multiple of {self.alignment} "
                          "bytes: pass the tensor itself (kc copies it), or a copy (kc.from_dlpack(x, copy=True))")
    if not self.aligned(buf.offset):
      raise ArgumentError(f"{self._name()} is a view at byte offset {buf.offset}, but the kernel accesses it as {self.alignment}-byte "
                          f"vectors, which {device} needs at a multiple of {self.alignment} bytes: use a view at such an offset, "
                          "or compile the kernel without upcasting this buffer's contiguous axis (opts='none')")

  def check(self, arg, device: str, vals: dict[str, int]) -> None:
    """Raise ArgumentError unless `arg` (a numpy array, a kc.Buffer, or what `adopt` made of a DLPack producer) fits
    this buffer."""
    if isinstance(arg, np.ndarray): self.check_array(arg, vals)
    elif isinstance(arg, Buffer): self.check_buffer(arg, device, vals)
    elif isinstance(arg, ForeignTensor): self.check_foreign(arg, vals)
    else: self.check(self.adopt(arg, device, Device[device].allocator, None), device, vals)

  def handle(self, arg: Union[np.ndarray, Buffer, ForeignTensor], vals: dict[str, int], device: str, allocator: Allocator,
             in_place: bool = True) -> tuple[object, Optional[Callable[[], None]]]:
    """Check `arg` and return what the program is launched with, and what copies the result back into `arg` (or makes
    it visible there: Allocator.numpy_written) after the launch (None when the memory is used in place or is only
    read). `in_place=False` copies even where the device could use the memory itself."""
    self.check(arg, device, vals)
    if isinstance(arg, Buffer): return arg.allocate(), None
    if isinstance(arg, ForeignTensor): return self._foreign_handle(arg, device, allocator, in_place)
    arg = as_bits(arg, self.dtype)  # ml_dtypes' types are opaque to the allocators: they move the bits
    # a host device lends the array itself, where its address suits the kernel's vector accesses; else it is copied
    if in_place and self.aligned(arg.ctypes.data) and (opaque := allocator.from_numpy(arg)) is not None:
      return opaque, (allocator.numpy_written(opaque) if self.output else None)
    data = np.ascontiguousarray(arg)
    buf = Buffer(device, arg.size, self.dtype).allocate().copyin(data if self.np_dtype is not None else memoryview(data.reshape(-1).view(np.uint8)))
    return buf, (_copy_back(buf, arg) if self.output else None)

  def _foreign_handle(self, tensor: ForeignTensor, device: str, allocator: Allocator, in_place: bool):
    """Device memory of the kernel's device: wrapped in place where it is contiguous and suitably aligned, else copied
    by way of the host (after waiting for the device, whose streams may still be writing it)."""
    if in_place and tensor.contiguous and self.aligned(tensor.address) and \
       (opaque := allocator.from_pointer(tensor.address, tensor.nbytes, tensor.capsule)) is not None: return opaque, None
    Device[device].synchronize()
    low, high = tensor.span()
    raw = np.empty(high - low, np.uint8)
    if high > low: allocator.copyout(memoryview(raw), allocator.from_pointer(tensor.address + low, high - low, tensor.capsule))
    item = tensor.dtype.itemsize
    elements = np.lib.stride_tricks.as_strided(raw[-low:], tensor.shape + (item,), tuple(s * item for s in tensor.strides) + (1,))
    buf = Buffer(device, tensor.size, self.dtype).copyin(memoryview(np.ascontiguousarray(elements).reshape(-1)))
    if not self.output: return buf, None
    # only contiguous outputs get here (adopt refused the others): the whole span is the output, written back at once
    return buf, lambda: allocator.copyin(allocator.from_pointer(tensor.address, tensor.nbytes, tensor.capsule),
                                         memoryview(buf._host_bytes()))


def _copy_back(buf: Buffer, arr: np.ndarray) -> Callable[[], None]:
  return lambda: buf.copyout(arr.reshape(-1).view(np.uint8).data)


def import_producers(args: tuple, specs: list[BufferSpec], device: str, allocator: Allocator, stream: Optional[int]) -> tuple:
  """A call's arguments with every DLPack producer other than numpy arrays and kc.Buffers read through its capsule
  (BufferSpec.adopt): numpy arrays over host memory, ForeignTensors of the device's own memory. `args` itself when
  there is none, which is the common case and costs one pass."""
  if all(isinstance(a, (np.ndarray, Buffer)) for a in args): return args
  return tuple(a if isinstance(a, (np.ndarray, Buffer)) else spec.adopt(a, device, allocator, stream) for spec, a in zip(specs, args))


def overlaps(i: int, args: tuple) -> bool:
  """Whether the memory given for output `i` is shared with another argument (the same array included). Such an output
  is written to a copy and copied back after the launch: written in place, the kernel could read what it already
  overwrote."""
  out = args[i]
  if isinstance(out, np.ndarray):
    return any(j != i and isinstance(a, np.ndarray) and np.may_share_memory(a, out) for j, a in enumerate(args))
  if isinstance(out, ForeignTensor):
    low, high = out.span()
    return any(j != i and isinstance(a, ForeignTensor) and a.device == out.device and a.size and
               a.address + a.span()[0] < out.address + high and out.address + low < a.address + a.span()[1]
               for j, a in enumerate(args))
  return False


def _load_shape(load: UOp, st: ShapeTracker) -> Optional[tuple[sint, ...]]:
  """The shape a load says its input was declared with: kc.ast records the `A.arg` shape as the LOAD's arg (a reshape
  of the input cannot hide it then); other ASTs are read from the view."""
  if not isinstance(load.arg, tuple): return declared_shape(st)
  return ShapeTracker.from_shape(load.arg).unbind()[0].shape if any(isinstance(d, UOp) for d in load.arg) else load.arg


def buffer_specs(ast: UOp, kernel: str, alignment: Optional[dict[int, int]] = None) -> list[BufferSpec]:
  """One BufferSpec per buffer index of a kernel AST, in index order. `alignment`: the byte multiple a buffer's
  address must be ({index: bytes}, Program.vector_bytes() where the renderer has aligned_vectors)."""
  found: dict[int, tuple[DType, list[ShapeTracker], list[ShapeTracker]]] = {}  # index: dtype, load views, store views
  sizes: dict[int, int] = {}  # index: the element count its pointer declares
  suggested: dict[int, list] = {}  # index: the shape each load suggests for an input
  logical = {u.src[0].arg: u.arg for u in ast.src if u.op is Ops.STORE and isinstance(u.arg, tuple)}
  for u in ast.toposort:
    if u.op in (Ops.LOAD, Ops.STORE) and u.src[0].op is Ops.DEFINE_GLOBAL:
      i, dt = u.src[0].arg, u.src[0].dtype.base
      if i in found and found[i][0] != dt: raise KcError(f"buffer {i} is used as {found[i][0].name} and as {dt.name}")
      st = st_arg(u).unbind()[0]
      found.setdefault(i, (dt, [], []))[1 if u.op is Ops.LOAD else 2].append(st)
      if u.op is Ops.LOAD: suggested.setdefault(i, []).append(_load_shape(u, st))
      if u.src[0].dtype.size != -1: sizes[i] = u.src[0].dtype.size
  if sorted(found) != list(range(len(found))):
    raise KcError(f"buffer indices must be 0..{len(found) - 1} with none missing, got {sorted(found)}")
  specs = []
  for i in range(len(found)):
    dt, loads, stores = found[i]
    # a store's shape is the output's shape; the loads of an input each suggest one, and only agreement counts
    # kc.ast records an output's numpy shape on its STORE: that is the shape a caller's array has
    if stores: suggestions = [logical[i] if i in logical else st.shape for st in stores if st.contiguous]
    else: suggestions = suggested[i]
    known = [s for s in suggestions if s is not None]
    shape = known[0] if len({_squeezed(s) for s in known}) == 1 else None
    # the pointer says how many elements were declared (kc.ast records it): a view that covers fewer (an index, a
    # slice from 0) is not the declared shape, and the count is all that can be checked
    declared = sizes.get(i, -1)
    if shape is not None and declared != -1 and all(isinstance(d, int) for d in shape) and prod(shape) != declared: shape = None
    views = tuple(stores + loads)
    if shape is not None and all(isinstance(d, int) for d in shape) and not any(st.vars() for st in views) and prod(shape) < _reached(views, {}):
      shape = None  # another view reaches past it: the shape said too little
    specs.append(spec := BufferSpec(kernel, i, dt, bool(stores), shape, views, declared))
    spec.alignment = (alignment or {}).get(i, 1)
  return specs
