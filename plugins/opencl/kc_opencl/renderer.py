"""The OpenCL C dialect over kc's CStyleLanguage: work-groups, local memory and barriers, as_type bitcasts,
images, and limits that come from the device the kernels will run on.

Without a device (no platform here) the renderer still renders, with conservative limits every OpenCL 1.2 full
profile device meets, so the render and compile tiers work on any machine.

half: native where the device reports cl_khr_fp16. Elsewhere (`half_in_float`, PoCL on CPUs) half buffers stay half
in memory and are read and written with vload_half/vstore_half (core OpenCL C, rounding to nearest even), and every
half value in between is a float. What differs from native half: arithmetic keeps float intermediates (a product or
sum is not rounded to half until it is stored, or cast to half), so results can be more precise than native half,
an intermediate beyond half's range (65504) stays finite until the store, where it becomes inf, and the bits of a
signalling NaN bitcast to half come back as the quiet NaN."""
from __future__ import annotations
import threading
from typing import Optional
from kc.backend import CStyleLanguage, CompileError, DType, ImageDType, Ops, PtrDType, UOp, dtypes
from kc_opencl.platform import DeviceInfo

INT32_MAX = 2**31 - 1
# the smallest limits an OpenCL 1.2 full-profile device may report (the spec's minimums are lower for work-group
# sizes, but every real device reaches these): used when no device can be asked
DEFAULT_LOCAL_MAX = (256, 256, 64)
DEFAULT_WORK_GROUP_SIZE = 256
DEFAULT_LOCAL_MEM = 32768

_SAMPLER = "const sampler_t smp = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP | CLK_FILTER_NEAREST;"
# bfloat16 has no OpenCL type: it is kept as its 16 bits (ushort) and computed in float (CStyleLanguage.bfloat16_as_bits);
# these are its conversions, rounding to nearest even
_BF16_HELPERS = [
  "static inline float __kc_bf2f(ushort b) { return as_float(((uint)b) << 16); }",
  "static inline ushort __kc_f2bf(float f) { uint u = as_uint(f); if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 64u);"
  " u += 0x7fffu + ((u >> 16) & 1u); return (ushort)(u >> 16); }",
]
# OpenCL vectors cannot be indexed by a runtime int: a scalar read from an image texel picks its lane with this
_LANE_HELPER = "static inline float __kc_lane(float4 v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }"
# half held in float (no cl_khr_fp16): a cast to half rounds through half's 16 bits, which only vstore_half can produce
# (a private ushort seen as half: declaring a pointer to half needs no extension)
_HALF_ROUND = "static inline float __kc_rh(float x) { ushort b; vstore_half(x, 0, (half*)&b); return vload_half(0, (half*)&b); }"
_HALF_ROUND_DOUBLE = "static inline float __kc_rhd(double x) { ushort b; vstore_half(x, 0, (half*)&b); return vload_half(0, (half*)&b); }"
_HALF_BITS = ["static inline ushort __kc_h2u(float x) { ushort b; vstore_half(x, 0, (half*)&b); return b; }",
              "static inline float __kc_u2h(ushort b) { return vload_half(0, (half*)&b); }"]


class OpenCLRenderer(CStyleLanguage):
  device = "OPENCL"  # work-groups, local memory and float4: the Renderer's defaults
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
              dtypes.uint64: "ulong"}
  bfloat16_as_bits = True
  fp8_as_bits = True  # OpenCL C has no fp8: CStyleLanguage.render_kernel defines its conversions
  extra_matcher = CStyleLanguage.bfloat16_in_float  # bfloat16 and fp8 are held as bits and computed in float

  def __init__(self, info: Optional[DeviceInfo] = None):
    self.info = info
    self._state = threading.local()  # per-render facts for the render_* hooks; renders may run in several threads
    self.max_work_group_size = DEFAULT_WORK_GROUP_SIZE
    self.has_fp16, self.has_fp64, self.has_images = False, True, False
    self.half_in_float = True
    self.supported_dtypes = self._dtypes_declared()
    if info is None: return
    # kernels compute their launch indices in int, so no axis goes past int32 even where size_t is wider
    self.global_max = (min(INT32_MAX, 2**info.address_bits - 1),) * 3
    self.max_work_group_size = info.max_work_group_size
    self.local_max = tuple(min(s, info.max_work_group_size) for s in (tuple(info.max_work_item_sizes) + (1, 1, 1))[:3])
    self.shared_max = info.local_mem_size
    self.has_shared = info.local_mem_size > 0
    self.has_fp16, self.has_fp64, self.has_images = info.has_fp16, info.has_fp64, info.image_support
    self.half_in_float = not info.has_fp16
    self.supported_dtypes = self._dtypes_declared()
    self.arch = info.name
    # a CPU device (PoCL) compiles each work-item's float4 arithmetic to vector instructions: the lowering keeps
    # upcast lanes as float4 values and accumulators and the heuristics tile for them, as on CLANG (matmul 1024 on
    # PoCL: 19.7 -> 40.4 GFLOP/s). exp2 of a float4 is an OpenCL builtin. GPUs compute lane by lane: unchanged
    self.vector_alu = info.is_cpu
    self.vector_functions = frozenset({Ops.EXP2}) if info.is_cpu else frozenset()

  def bits_helpers(self, dt: DType) -> list[str]:
    # PoCL builds a kernel for its work-group size at the first launch, and with every lane's fp8 conversion inlined
    # that build grows with the upcast: 24 lanes of an fp8 minimum took 7.9 s there (60 s on a busy machine, which kc
    # fuzz took for a hang), 0.4 s with the conversions called. A GPU driver decides inlining itself: unchanged there
    helpers = super().bits_helpers(dt)
    if self.info is None or not self.info.is_cpu: return helpers
    return [h.replace("static inline ", "__attribute__((noinline)) static ", 1) for h in helpers]

  def _dtypes_declared(self) -> frozenset[DType]:
    # double is an optional extension (cl_khr_fp64); everything else is core OpenCL C (bfloat16 is computed in float,
    # and so is half where the device lacks cl_khr_fp16)
    return frozenset(dt for dt in dtypes.all if not (dt == dtypes.float64 and not self.has_fp64))

  def __repr__(self):
    half = " half in float" if self.half_in_float else ""
    return f"<OpenCLRenderer {self.info.name if self.info else 'default limits'} local_max={self.local_max} shared_max={self.shared_max}{half}>"

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

  def _half_as_float(self, dt: DType) -> bool:
    """A half value (not a buffer) this renderer holds in a float."""
    return self.half_in_float and not isinstance(dt, PtrDType) and dt.scalar() == dtypes.half

  def render_dtype(self, dt: DType, mutable: bool = True) -> str:
    # OpenCL leaves sizeof(bool) to the device: a bool buffer is read and written as the bytes numpy stores
    if isinstance(dt, PtrDType) and not isinstance(dt, ImageDType) and dt.base == dtypes.bool:
      return (self.smem_prefix if dt.local else self.buffer_prefix) + "uchar*"
    if self._half_as_float(dt): return super().render_dtype(dtypes.float32.vec(dt.count), mutable)
    if self.half_in_float and isinstance(dt, PtrDType) and not isinstance(dt, ImageDType) and dt.base.scalar() == dtypes.half:
      # a global buffer stays half in memory (a pointer to half needs no extension); local memory holds floats:
      # without cl_khr_fp16 there are no half variables or arrays
      if not dt.local: return self.buffer_prefix + "half*"
      return self.smem_prefix + super().render_dtype(dtypes.float32.vec(dt.base.count)) + "*"
    return super().render_dtype(dt, mutable)

  def render_const(self, value, dt: DType) -> str:
    if dt.count == 1 and dt in (dtypes.int64, dtypes.uint64):
      if dt == dtypes.int64 and value == dtypes.min(dt): return f"({value + 1}l-1l)"  # 2**63 itself is no literal
      return f"{value}{'ul' if dt == dtypes.uint64 else 'l'}"
    if self._half_as_float(dt): return super().render_const(value, dtypes.float32.vec(dt.count))  # values are half-exact
    return super().render_const(value, dt)

  def render_cast(self, dt: DType, val: str) -> str:
    if self._half_as_float(dt): return self._round_to_half(dt, f"(float)({val})" if dt.count == 1 else val, "__kc_rh")
    return super().render_cast(dt, val)

  def _round_to_half(self, dt: DType, val: str, helper: str) -> str:
    """`val` (a float, or a float vector of dt's width) rounded to half's precision, as a cast to half must."""
    if dt.count == 1: return f"{helper}({val})"
    return self.render_vector(dt, [f"{helper}({self.render_lane(val, dt, i)})" for i in range(dt.count)])

  def render_cast_uop(self, u: UOp, val: str) -> str:
    if self._half_as_float(u.dtype):  # a cast to half held in float: a rounding to half's precision, in float
      src = u.src[0].dtype.scalar()
      if src == dtypes.bfloat16: return self._round_to_half(u.dtype, f"__kc_bf2f({val})", "__kc_rh")  # exact: bf16 -> float
      if src == dtypes.half: return val
      if src == dtypes.float64: return self._round_to_half(u.dtype, val, "__kc_rhd")  # one rounding, not via float
      if src == dtypes.float32: return self._round_to_half(u.dtype, val, "__kc_rh")
    return super().render_cast_uop(u, val)

  def render_bitcast(self, dt: DType, src_dt: DType, val: str) -> str:
    if self.half_in_float and dtypes.half in (dt.scalar(), src_dt.scalar()):
      # a half held in float has no 16 bits until vstore_half makes them
      if dt.count != 1 or src_dt.count != 1:
        raise CompileError(f"a bitcast between {src_dt} and {dt} needs native half; this device has no cl_khr_fp16")
      if dt == dtypes.half: return f"__kc_u2h(as_ushort({val}))"
      return f"as_{self.render_dtype(dt)}(__kc_h2u({val}))"
    return f"as_{self.render_dtype(dt)}({val})"

  def render_lane(self, vec: str, dt: DType, lane: int) -> str: return f"{vec}.s{lane:x}"

  # ***** images *****

  def _texel(self, img: ImageDType, offset: UOp, rendered: str) -> str:
    """The int2 (x, y) texel of an image access: given by the index as an int2, or from the element offset into
    the image's (height, width, 4) layout."""
    if offset.dtype.count == 2: return rendered
    w = img.shape[1]
    return f"(int2)((({rendered})/4)%{w}, ({rendered})/{4 * w})"

  def _half_buffer(self, index: UOp) -> bool:
    """A global half buffer read and written as floats with vload_half/vstore_half."""
    ptr = index.src[0].dtype
    return self.half_in_float and isinstance(ptr, PtrDType) and not isinstance(ptr, ImageDType) and not ptr.local and ptr.base == dtypes.half

  def render_load(self, dt: DType, index: UOp, buf: str, offset: str, gate: Optional[str]) -> str:
    if self._half_buffer(index):
      # a vector access is at an n-aligned offset (vload_halfn itself only needs the halves aligned)
      read = f"vload_half({offset}, {buf})" if dt.count == 1 else f"vload_half{dt.count}(0, {buf}+{offset})"
      return read if gate is None else f"({gate}?{read}:{self.render_const(0, dt)})"
    if not isinstance(img := index.src[0].dtype, ImageDType): return super().render_load(dt, index, buf, offset, gate)
    read = f"read_image{'h' if img.base == dtypes.half and not self.half_in_float else 'f'}({buf}, smp, {self._texel(img, index.src[1], offset)})"
    if dt.count == 1:
      if index.src[1].dtype.count == 2: raise CompileError(f"a scalar read of image {buf} needs an element offset, not (x, y) coordinates")
      read = f"__kc_lane({read}, ({offset})%4)"
    elif dt.count != 4: raise CompileError(f"an image is read a texel (4 values) or one value at a time, not {dt}")
    return read if gate is None else f"({gate}?{read}:{self.render_const(0, dt)})"

  def render_store(self, dt: DType, index: UOp, buf: str, offset: str, value: str) -> str:
    if self._half_buffer(index):  # rounds to nearest even: the one rounding a half result gets in this mode
      if dt.count == 1: return f"vstore_half({value}, {offset}, {buf});"
      return f"vstore_half{dt.count}({value}, 0, {buf}+{offset});"
    if not isinstance(img := index.src[0].dtype, ImageDType): return super().render_store(dt, index, buf, offset, value)
    if dt.count != 4:
      raise CompileError(f"an image is written a whole texel (4 values) at a time; kernel writes {dt} to {buf}")
    return (f"write_image{'h' if img.base == dtypes.half and not self.half_in_float else 'f'}"
            f"({buf}, {self._texel(img, index.src[1], offset)}, {value});")

  # ***** the kernel *****

  def render_kernel(self, function_name, body, params, uops, prefix=None) -> str:
    used = {u.dtype.scalar() for u in uops if not isinstance(u.dtype, PtrDType)} | \
           {u.dtype.base.scalar() for u in uops if isinstance(u.dtype, PtrDType)}
    images = [u for u in uops if isinstance(u.dtype, ImageDType)]
    lines: list[str] = []
    if dtypes.half in used and not self.half_in_float: lines.append("#pragma OPENCL EXTENSION cl_khr_fp16 : enable")
    if dtypes.float64 in used:
      if not self.has_fp64:
        raise CompileError(f"kernel {function_name} computes in double, but {self._who()} does not report cl_khr_fp64: use float32 there")
      lines.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
    if images:
      if not self.has_images: raise CompileError(f"kernel {function_name} uses images, but {self._who()} has no image support")
      lines.append(_SAMPLER)
      if any(u.op is Ops.LOAD and u.dtype.count == 1 and isinstance(u.src[0].src[0].dtype, ImageDType) for u in uops): lines.append(_LANE_HELPER)
    if dtypes.bfloat16 in used: lines += _BF16_HELPERS
    if self.half_in_float and dtypes.half in used:
      casts = {u.src[0].dtype.scalar() for u in uops if u.op is Ops.CAST and u.dtype.scalar() == dtypes.half}
      if casts - {dtypes.half, dtypes.float64}: lines.append(_HALF_ROUND)
      if dtypes.float64 in casts: lines.append(_HALF_ROUND_DOUBLE)
      if any(u.op is Ops.BITCAST and dtypes.half in (u.dtype.scalar(), u.src[0].dtype.scalar()) for u in uops): lines += _HALF_BITS
    return super().render_kernel(function_name, body, params, uops, lines + (prefix or []))

  def _who(self) -> str: return f"the OpenCL device {self.info.name!r}" if self.info else "a device of unknown capabilities (none was opened)"
