"""The OpenCL C dialect over kc's CStyleLanguage: work-groups, local memory and barriers, as_type bitcasts,
images, and limits that come from the device the kernels will run on.

Without a device (no platform here) the renderer still renders, with conservative limits every OpenCL 1.2 full
profile device meets, so the render and compile tiers work on any machine."""
from __future__ import annotations
import threading
from typing import Optional
from kc import CompileError, DType, GroupOp, ImageDType, Ops, PatternMatcher, PtrDType, UOp, UPat, dtypes
from kc.renderer.cstyle import CStyleLanguage
from kc_opencl.platform import DeviceInfo

INT32_MAX = 2**31 - 1
# the smallest limits an OpenCL 1.2 full-profile device may report (the spec's minimums are lower for work-group
# sizes, but every real device reaches these): used when no device can be asked
DEFAULT_LOCAL_MAX = (256, 256, 64)
DEFAULT_WORK_GROUP_SIZE = 256
DEFAULT_LOCAL_MEM = 32768

_SAMPLER = "const sampler_t smp = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP | CLK_FILTER_NEAREST;"
# bfloat16 has no OpenCL type: it is kept as its 16 bits (ushort) and computed in float, rounding to nearest even
_BF16_HELPERS = [
  "static inline float __kc_bf2f(ushort b) { return as_float(((uint)b) << 16); }",
  "static inline ushort __kc_f2bf(float f) { uint u = as_uint(f); if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 64u);"
  " u += 0x7fffu + ((u >> 16) & 1u); return (ushort)(u >> 16); }",
]
# OpenCL vectors cannot be indexed by a runtime int: a scalar read from an image texel picks its lane with this
_LANE_HELPER = "static inline float __kc_lane(float4 v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }"


def _bf16_in_float(x: UOp) -> Optional[UOp]:
  """bfloat16 arithmetic has no OpenCL spelling: do it in float and round the result back."""
  if x.dtype.scalar() != dtypes.bfloat16: return None
  f = dtypes.float32.vec(x.dtype.count)
  return UOp(x.op, f, tuple(s.cast(f) if s.dtype.scalar() == dtypes.bfloat16 else s for s in x.src), x.arg).cast(x.dtype)


def _bf16_compare_in_float(x: UOp) -> Optional[UOp]:
  if x.src[0].dtype.scalar() != dtypes.bfloat16: return None
  f = dtypes.float32.vec(x.src[0].dtype.count)
  return x.replace(src=tuple(s.cast(f) for s in x.src))


class OpenCLRenderer(CStyleLanguage):
  device = "OPENCL"
  has_local = True
  has_shared = True
  supports_float4 = True
  global_max = (INT32_MAX,) * 3
  local_max = DEFAULT_LOCAL_MAX
  shared_max = DEFAULT_LOCAL_MEM
  kernel_prefix = "__kernel "
  buffer_prefix = "__global "
  smem_prefix = "__local "
  smem_align = "__attribute__((aligned(16))) "
  barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
  float4 = "(float4)"
  code_for_workitem = {"g": lambda d: f"get_group_id({d})", "l": lambda d: f"get_local_id({d})", "i": lambda d: f"get_global_id({d})"}
  type_map = {dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.uint16: "ushort", dtypes.uint32: "uint", dtypes.int64: "long",
              dtypes.uint64: "ulong", dtypes.bfloat16: "ushort"}
  extra_matcher = PatternMatcher([
    (UPat(GroupOp.ALU - {Ops.CMPLT, Ops.CMPNE}, name="x"), _bf16_in_float),
    (UPat((Ops.CMPLT, Ops.CMPNE), name="x"), _bf16_compare_in_float),
  ], memoize=True)  # pure rules: results are remembered on the UOps

  def __init__(self, info: Optional[DeviceInfo] = None):
    self.info = info
    self._state = threading.local()  # per-render facts for the render_* hooks; renders may run in several threads
    self.max_work_group_size = DEFAULT_WORK_GROUP_SIZE
    self.has_fp16, self.has_fp64, self.has_images = False, True, False
    self.supported_dtypes = self._dtypes_declared()
    if info is None: return
    # kernels compute their launch indices in int, so no axis goes past int32 even where size_t is wider
    self.global_max = (min(INT32_MAX, 2**info.address_bits - 1),) * 3
    self.max_work_group_size = info.max_work_group_size
    self.local_max = tuple(min(s, info.max_work_group_size) for s in (tuple(info.max_work_item_sizes) + (1, 1, 1))[:3])
    self.shared_max = info.local_mem_size
    self.has_shared = info.local_mem_size > 0
    self.has_fp16, self.has_fp64, self.has_images = info.has_fp16, info.has_fp64, info.image_support
    self.supported_dtypes = self._dtypes_declared()
    self.arch = info.name

  def _dtypes_declared(self) -> frozenset[DType]:
    # half and double are optional extensions (cl_khr_fp16 / cl_khr_fp64); everything else is core OpenCL C
    # (bfloat16 is computed in float)
    return frozenset(dt for dt in dtypes.all if not (dt == dtypes.half and not self.has_fp16) and not (dt == dtypes.float64 and not self.has_fp64))

  def __repr__(self):
    return f"<OpenCLRenderer {self.info.name if self.info else 'default limits'} local_max={self.local_max} shared_max={self.shared_max}>"

  # ***** launch indices *****

  def render(self, name: str, uops: list[UOp]) -> str:
    # A kernel with group ids but no local ids gets no local_size from Program, and the runtime then lets the driver
    # choose the work-group: its group ids are only the intended indices when read as global ids (equal to the
    # group id for work-groups of one item, which is what such a kernel means).
    self._state.groups_are_global = not any(u.op is Ops.SPECIAL and u.arg[0].startswith("lidx") for u in uops)
    try: return super().render(name, uops)
    finally: self._state.groups_are_global = False

  def render_special(self, name: str, size) -> str:
    if name.startswith("gidx") and getattr(self._state, "groups_are_global", False): name = "i" + name[1:]
    return super().render_special(name, size)

  # ***** types and values *****

  def render_dtype(self, dt: DType, mutable: bool = True) -> str:
    # OpenCL leaves sizeof(bool) to the device: a bool buffer is read and written as the bytes numpy stores
    if isinstance(dt, PtrDType) and not isinstance(dt, ImageDType) and dt.base == dtypes.bool:
      return (self.smem_prefix if dt.local else self.buffer_prefix) + "uchar*"
    return super().render_dtype(dt, mutable)

  def render_const(self, value, dt: DType) -> str:
    if dt.count == 1 and dt in (dtypes.int64, dtypes.uint64):
      if dt == dtypes.int64 and value == dtypes.min(dt): return f"({value + 1}l-1l)"  # 2**63 itself is no literal
      return f"{value}{'ul' if dt == dtypes.uint64 else 'l'}"
    return super().render_const(value, dt)

  def render_cast(self, dt: DType, val: str) -> str:
    if dt.scalar() == dtypes.bfloat16: return f"__kc_f2bf((float)({val}))"
    return super().render_cast(dt, val)

  def render_cast_uop(self, u: UOp, val: str) -> str:
    if u.src[0].dtype.scalar() == dtypes.bfloat16 and u.dtype.scalar() != dtypes.bfloat16:
      return f"({self.render_dtype(u.dtype)})(__kc_bf2f({val}))"
    return self.render_cast(u.dtype, val)

  def render_bitcast(self, dt: DType, src_dt: DType, val: str) -> str: return f"as_{self.render_dtype(dt)}({val})"

  def render_lane(self, vec: str, dt: DType, lane: int) -> str: return f"{vec}.s{lane:x}"

  # ***** images *****

  def _texel(self, img: ImageDType, offset: UOp, rendered: str) -> str:
    """The int2 (x, y) texel of an image access: given by the index as an int2, or from the element offset into
    the image's (height, width, 4) layout."""
    if offset.dtype.count == 2: return rendered
    w = img.shape[1]
    return f"(int2)((({rendered})/4)%{w}, ({rendered})/{4 * w})"

  def render_load(self, dt: DType, index: UOp, buf: str, offset: str, gate: Optional[str]) -> str:
    if not isinstance(img := index.src[0].dtype, ImageDType): return super().render_load(dt, index, buf, offset, gate)
    read = f"read_image{'h' if img.base == dtypes.half else 'f'}({buf}, smp, {self._texel(img, index.src[1], offset)})"
    if dt.count == 1:
      if index.src[1].dtype.count == 2: raise CompileError(f"a scalar read of image {buf} needs an element offset, not (x, y) coordinates")
      read = f"__kc_lane({read}, ({offset})%4)"
    elif dt.count != 4: raise CompileError(f"an image is read a texel (4 values) or one value at a time, not {dt}")
    return read if gate is None else f"({gate}?{read}:{self.render_const(0, dt)})"

  def render_store(self, dt: DType, index: UOp, buf: str, offset: str, value: str) -> str:
    if not isinstance(img := index.src[0].dtype, ImageDType): return super().render_store(dt, index, buf, offset, value)
    if dt.count != 4: raise CompileError(f"an image is written a whole texel (4 values) at a time; kernel writes {dt} to {buf}")
    return f"write_image{'h' if img.base == dtypes.half else 'f'}({buf}, {self._texel(img, index.src[1], offset)}, {value});"

  # ***** the kernel *****

  def render_kernel(self, function_name, body, params, uops, prefix=None) -> str:
    used = {u.dtype.scalar() for u in uops if not isinstance(u.dtype, PtrDType)} | {u.dtype.base.scalar() for u in uops if isinstance(u.dtype, PtrDType)}
    images = [u for u in uops if isinstance(u.dtype, ImageDType)]
    lines: list[str] = []
    if dtypes.half in used:
      if not self.has_fp16:
        raise CompileError(f"kernel {function_name} computes in half, but {self._who()} does not report cl_khr_fp16: use float32 there")
      lines.append("#pragma OPENCL EXTENSION cl_khr_fp16 : enable")
    if dtypes.float64 in used:
      if not self.has_fp64:
        raise CompileError(f"kernel {function_name} computes in double, but {self._who()} does not report cl_khr_fp64: use float32 there")
      lines.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
    if images:
      if not self.has_images: raise CompileError(f"kernel {function_name} uses images, but {self._who()} has no image support")
      lines.append(_SAMPLER)
      if any(u.op is Ops.LOAD and u.dtype.count == 1 and isinstance(u.src[0].src[0].dtype, ImageDType) for u in uops): lines.append(_LANE_HELPER)
    if dtypes.bfloat16 in used: lines += _BF16_HELPERS
    return super().render_kernel(function_name, body, params, uops, lines + (prefix or []))

  def _who(self) -> str: return f"the OpenCL device {self.info.name!r}" if self.info else "a device of unknown capabilities (none was opened)"
