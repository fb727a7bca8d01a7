"""What a compiled kernel declares for each of its buffers, and the check of one call's arguments against it.

A buffer's declared shape is the shape its user wrote: the store's shape for an output, the `A.arg` shape for an
input. kc.ast records the latter as each LOAD's arg, so a reshaped, permuted or sliced input still takes the shape it
was declared with; for an AST built otherwise it is recovered from the loads' views (`declared_shape`). Where
neither says (a shrink, a reshape into several views, loads that disagree), only the element count the kernel
reaches is checked.

A numpy argument must have the declared shape, ignoring size-1 dims (a reduce keeps its axes as 1, so a (M, 1, N)
output takes an (M, N) array), or be 1-D with as many elements (frameworks that hold flat buffers). Its dtype must
be the buffer's; for the dtypes numpy lacks (bfloat16, fp8e4m3, fp8e5m2) either ml_dtypes' array type of that name or the
raw bits in the unsigned int of the same size (uint16, uint8). A non-contiguous input is copied, which is correct and only slower; an output is written in
place, so it must be C-contiguous and writeable."""
from __future__ import annotations
from math import prod
from typing import Optional, Union
import numpy as np
from kc.runtime.device import Allocator, Buffer
from kc.ir.dtype import DType, dtypes
from kc.errors import ArgumentError, KcError
from kc.kernel.verify import st_arg
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
    if self.shape is None:
      if self.declared != -1 and arr.size != self.declared:
        raise ArgumentError(f"{self._name()} is declared with {self.declared} elements, got an array of shape {arr.shape} ({arr.size} elements)")
      if arr.size < (n := self.elements_at(vals)):
        raise ArgumentError(f"{self._name()} needs {n} elements, got an array of shape {arr.shape} ({arr.size} elements)")
    else:
      want = self.shape if not self.symbolic else _at(self.shape, vals)
      given = arr.shape
      if given != want and _squeezed(given) != (self.squeezed if not self.symbolic else _squeezed(want)) and \
         not (len(given) == 1 and given[0] == prod(want)):
        raise ArgumentError(f"{self._name()} must have shape {want} (size-1 dims aside, or 1-D with {prod(want)} elements), "
                            f"got an array of shape {given}")
    if self.output:
      flags = arr.flags
      if not flags.writeable: raise ArgumentError(f"{self._name()} is written in place, but the array given is read-only")
      if not flags.c_contiguous:
        raise ArgumentError(f"{self._name()} is written in place, but the array given is not C-contiguous (strides {arr.strides}): "
                            "pass a contiguous array (np.ascontiguousarray) and copy it back")

  def check_buffer(self, buf: Buffer, device: str, vals: dict[str, int]) -> None:
    if buf.dtype != self.dtype: raise ArgumentError(f"{self._name()} must be {self.dtype.name}, got a Buffer of {buf.dtype.name}")
    if buf.device != device: raise ArgumentError(f"{self._name()} is on {buf.device}, the kernel runs on {device}")
    if buf.size < (n := self.elements_at(vals)): raise ArgumentError(f"{self._name()} needs {n} elements, the Buffer has {buf.size}")
    # device allocations start aligned for any vector: a view's byte offset decides (a GPU faults on a misaligned float4)
    if not self.aligned(buf.offset):
      raise ArgumentError(f"{self._name()} is a view at byte offset {buf.offset}, but the kernel accesses it as {self.alignment}-byte "
                          f"vectors, which {device} needs at a multiple of {self.alignment} bytes: use a view at such an offset, "
                          "or compile the kernel without upcasting this buffer's contiguous axis (opts='none')")

  def check(self, arg, device: str, vals: dict[str, int]) -> None:
    """Raise ArgumentError unless `arg` is a numpy array or a kc.Buffer that fits this buffer."""
    if isinstance(arg, np.ndarray): self.check_array(arg, vals)
    elif isinstance(arg, Buffer): self.check_buffer(arg, device, vals)
    else: raise ArgumentError(f"{self._name()} must be a numpy array or a kc.Buffer, got {type(arg).__name__}")

  def handle(self, arg: Union[np.ndarray, Buffer], vals: dict[str, int], device: str, allocator: Allocator, in_place: bool = True):
    """Check `arg` and return what the program is launched with, and the Buffer to copy back into `arg` (None
    when the array is used in place or is only read). `in_place=False` copies even where the device could use
    the array itself."""
    self.check(arg, device, vals)
    if isinstance(arg, Buffer): return arg.allocate(), None
    arg = as_bits(arg, self.dtype)  # ml_dtypes' types are opaque to the allocators: they move the bits
    # a host device lends the array itself, where its address suits the kernel's vector accesses; else it is copied
    if in_place and self.aligned(arg.ctypes.data) and (opaque := allocator.from_numpy(arg)) is not None: return opaque, None
    data = np.ascontiguousarray(arg)
    buf = Buffer(device, arg.size, self.dtype).allocate().copyin(data if self.np_dtype is not None else memoryview(data.reshape(-1).view(np.uint8)))
    return buf, (buf if self.output else None)


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
