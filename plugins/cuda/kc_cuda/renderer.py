"""CUDA C over kc's CStyleLanguage: blocks and threads, __shared__ memory and __syncthreads(), CUDA's vector types
(float4 with make_float4; kc-defined structs for half, bfloat16 and other vectors CUDA has none of), half and
nv_bfloat16 from cuda_fp16.h / cuda_bf16.h, __launch_bounds__ from the block size, and tensor cores as small
inline-PTX mma.sync helpers (tensor_cores.py).

The limits are the device's where one is open, else those every GPU of compute capability 5.0+ meets, with the
tensor cores of KC_CUDA_ARCH (default sm_90). Work-group memory above the 48 KiB a kernel may declare statically is
dynamic shared memory (extern __shared__): the kernel's source says how much in a comment the compiler reads into
the library's metadata, and the runtime raises the kernel's limit (cuFuncSetAttribute) up to the device's opt-in
maximum."""
from __future__ import annotations
import math, threading
from typing import TYPE_CHECKING, Optional
from kc.backend import CStyleLanguage, CompileError, DType, Ops, PtrDType, UOp, dtypes
from kc_cuda.arch import capability
from kc_cuda.tensor_cores import MMA, mmas_for

if TYPE_CHECKING: from kc_cuda.driver import DeviceProps

STATIC_SHARED_MAX = 49152  # bytes of __shared__ a kernel may declare statically; more is dynamic shared memory
DYNAMIC_SHARED_MARKER = "kc-dynamic-shared-bytes:"
_XYZ = "xyz"

# vector types CUDA defines (with make_<type> constructors and .x .y .z .w lanes); other vectors are kc's structs
_BUILTIN_VECTORS = {(dtypes.float32, 2), (dtypes.float32, 4), (dtypes.int32, 2), (dtypes.int32, 4), (dtypes.uint32, 2), (dtypes.uint32, 4),
                    (dtypes.float64, 2), (dtypes.int8, 4), (dtypes.uint8, 4), (dtypes.int16, 2), (dtypes.int16, 4), (dtypes.uint16, 2),
                    (dtypes.uint16, 4)}
_BUILTIN_NAMES = {dtypes.float32: "float", dtypes.int32: "int", dtypes.uint32: "uint", dtypes.float64: "double", dtypes.int8: "char",
                  dtypes.uint8: "uchar", dtypes.int16: "short", dtypes.uint16: "ushort"}
_FUNCS = {Ops.SQRT: "sqrt", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin"}


def _math(name: str):
  """A CUDA math call in the dtype's precision: f-suffixed for float, plain for double, through float for half and
  bfloat16 (their h* intrinsics are approximations)."""
  def render(x: str, dt: DType) -> str:
    if dt == dtypes.float64: return f"{name}({x})"
    if dt == dtypes.float32: return f"{name}f({x})"
    t = "half" if dt == dtypes.float16 else "nv_bfloat16"
    return f"(({t})({name}f((float)({x}))))"
  return render


def _recip(x: str, dt: DType) -> str:
  # 1/x with an int 1 is ambiguous for half and bfloat16 (both have converting constructors)
  if dt in (dtypes.float16, dtypes.bfloat16): return f"(({'half' if dt == dtypes.float16 else 'nv_bfloat16'})1.0f/{x})"
  return f"(1/{x})" if dt != dtypes.float32 else f"(1.0f/{x})"


class CUDARenderer(CStyleLanguage):
  device = "CUDA"
  has_local = True
  has_shared = True
  supports_float4 = True
  global_max = (2**31 - 1, 65535, 65535)
  local_max = (1024, 1024, 64)
  max_work_group_size = 1024
  shared_max = STATIC_SHARED_MAX
  kernel_prefix = 'extern "C" __global__ '
  smem_prefix = "__shared__ "
  smem_align = "__align__(16) "
  smem_prefix_for_cast = False  # a pointer into shared memory is a generic pointer in CUDA C
  barrier = "__syncthreads();"
  code_for_workitem = {"g": lambda d: f"blockIdx.{_XYZ[d]}", "l": lambda d: f"threadIdx.{_XYZ[d]}",
                       "i": lambda d: f"(blockIdx.{_XYZ[d]}*blockDim.{_XYZ[d]}+threadIdx.{_XYZ[d]})"}
  type_map = {dtypes.int64: "long long", dtypes.uint64: "unsigned long long", dtypes.float16: "half", dtypes.bfloat16: "nv_bfloat16",
              dtypes.int8: "signed char", dtypes.uint8: "unsigned char", dtypes.uint16: "unsigned short", dtypes.uint32: "unsigned int"}
  # NVRTC has no math.h: infinity and NaN from their bits
  infinity = "__int_as_float(0x7f800000)"
  nan = "__int_as_float(0x7fc00000)"
  code_for_op = {**CStyleLanguage.code_for_op, Ops.RECIP: _recip, **{op: _math(name) for op, name in _FUNCS.items()}}
  # fp8 is held as its bits (the core's fp8_as_bits) and computed in float; half and bfloat16 have CUDA arithmetic
  extra_matcher = CStyleLanguage.fp8_in_float

  def __init__(self, arch: str, props: Optional["DeviceProps"] = None):
    self.arch, self.props = arch, props
    self._state = threading.local()
    self.mmas: list[MMA] = mmas_for(capability(arch))
    self.tensor_cores = [m.tc for m in self.mmas]
    if props is not None:
      self.local_max = tuple(props.max_block_dims)
      self.max_work_group_size = props.max_threads_per_block
      self.global_max = tuple(min(g, 2**31 - 1) for g in props.max_grid_dims)
      self.shared_max = max(STATIC_SHARED_MAX, props.shared_per_block_optin)

  def __repr__(self):
    return f"<CUDARenderer {self.arch}{' ' + self.props.name if self.props else ' (no device)'} shared_max={self.shared_max}>"

  def vector_widths(self, dt: DType) -> tuple[int, ...]:
    if dt == dtypes.float32: return (4, 2)
    if dt in (dtypes.float16, dtypes.bfloat16): return (8, 4, 2)
    return ()

  # ***** types and values *****

  def render_dtype(self, dt: DType, mutable: bool = True) -> str:
    if isinstance(dt, PtrDType) or dt.count == 1: return super().render_dtype(dt, mutable)
    if (dt.scalar(), dt.count) in _BUILTIN_VECTORS: return f"{_BUILTIN_NAMES[dt.scalar()]}{dt.count}"
    return f"kc_{super().render_dtype(dt.scalar()).replace(' ', '_')}{dt.count}"

  def render_vector(self, dt: DType, elements: list[str]) -> str: return f"make_{self.render_dtype(dt)}({','.join(elements)})"

  def render_lane(self, vec: str, dt: DType, lane: int) -> str:
    return f"{vec}.{_XYZ[lane] if lane < 3 else 'w'}" if dt.count <= 4 else f"{vec}.v[{lane}]"

  def render_bitcast(self, dt: DType, src_dt: DType, val: str) -> str:
    return f"(*(({self.render_dtype(dt)}*)&{val}))"

  # ***** the kernel *****

  def render(self, name: str, uops: list[UOp]) -> str:
    # locals over the static limit live in one dynamic block: their byte offsets, for render_local, per render (renders
    # may run in several threads)
    locals_ = [u for u in uops if u.op is Ops.DEFINE_LOCAL]
    offsets, total = {}, 0
    for u in locals_:
      offsets[u.arg[0]] = total = _align16(total)
      total += u.dtype.size * u.dtype.base.itemsize
    # each __align__(16) array may start 16-aligned wherever ptxas places it: padded sizes bound the static total
    padded = sum(_align16(u.dtype.size * u.dtype.base.itemsize) for u in locals_)
    self._state.dynamic = offsets if padded > STATIC_SHARED_MAX else {}
    self._state.dynamic_bytes = total
    try: return super().render(name, uops)
    finally: self._state.dynamic = {}

  def render_local(self, name: str, dt: DType, size: int) -> str:
    if (offset := getattr(self._state, "dynamic", {}).get(name)) is None: return super().render_local(name, dt, size)
    t = self.render_dtype(dt)
    return f"{t}* {name} = ({t}*)(__kc_smem + {offset});"

  def render_kernel_prefix(self, uops: list[UOp]) -> str:
    # the block is exactly the kernel's local size: the compiler may then give each thread more registers
    if not any(u.op is Ops.SPECIAL and u.arg[0].startswith(("gidx", "lidx")) for u in uops): return self.kernel_prefix
    return f"{self.kernel_prefix}__launch_bounds__({math.prod(int(u.arg[1]) for u in uops if u.op is Ops.SPECIAL and u.arg[0].startswith('lidx'))}) "

  def render_kernel(self, function_name, body, params, uops, prefix=None) -> str:
    values = [u.dtype for u in uops if not isinstance(u.dtype, PtrDType)] + [u.dtype.base for u in uops if isinstance(u.dtype, PtrDType)]
    scalars = {dt.scalar() for dt in values}
    lines: list[str] = []
    if dtypes.float16 in scalars: lines.append("#include <cuda_fp16.h>")
    if dtypes.bfloat16 in scalars: lines.append("#include <cuda_bf16.h>")
    for dt in dict.fromkeys(dt for dt in values if dt.count > 1 and (dt.scalar(), dt.count) not in _BUILTIN_VECTORS):
      lines += self._vector_struct(dt)
    for name in dict.fromkeys(u.arg.name for u in uops if u.op is Ops.WMMA): lines.append(self._mma_helper(name))
    if getattr(self._state, "dynamic", {}):
      body = ["  extern __shared__ __align__(16) unsigned char __kc_smem[];", *body,
              f"  /* {DYNAMIC_SHARED_MARKER} {self._state.dynamic_bytes} */"]
    return super().render_kernel(function_name, body, params, uops, lines + (prefix or []))

  def _vector_struct(self, dt: DType) -> list[str]:
    """A vector CUDA has no type for: a struct with lanes x, y, z, w (or v[n] when wider) and its make_ constructor,
    aligned to its size (a power of two) so a vector load is one instruction."""
    name, scalar, n = self.render_dtype(dt), self.render_dtype(dt.scalar()), dt.count
    align = 1 << (dt.itemsize - 1).bit_length()
    args = ", ".join(f"{scalar} a{i}" for i in range(n))
    if n <= 4:
      fields = ", ".join("xyzw"[:n])
      return [f"struct __align__({align}) {name} {{ {scalar} {fields}; }};",
              f"__device__ __forceinline__ {name} make_{name}({args}) {{ {name} r; "
              f"{' '.join(f'r.{c} = a{i};' for i, c in enumerate('xyzw'[:n]))} return r; }}"]
    return [f"struct __align__({align}) {name} {{ {scalar} v[{n}]; }};",
            f"__device__ __forceinline__ {name} make_{name}({args}) {{ {name} r; {' '.join(f'r.v[{i}] = a{i};' for i in range(n))} return r; }}"]

  def _mma_helper(self, name: str) -> str:
    """__WMMA_...(a, b, c): one warp-wide mma.sync. Each lane's fragments are its registers in slot order (the
    TensorCore's layout is the instruction's), reinterpreted as the 32-bit registers PTX takes."""
    mma = next((m for m in self.mmas if str(m.tc) == name), None)
    if mma is None:
      raise CompileError(f"{name} is not a tensor core of the CUDA renderer for {self.arch}: the kernel was optimized for another renderer")
    tc = mma.tc
    fragments = ((tc.dtype_in, _slots(tc, 0)), (tc.dtype_in, _slots(tc, 1)), (tc.dtype_out, _slots(tc, 2)))
    va, vb, vc = (self.render_dtype(dt.vec(n)) for dt, n in fragments)
    ra, rb, rc = mma.a_regs, mma.b_regs, mma.c_regs
    c_float = tc.dtype_out == dtypes.float32
    operands = [f"%{i}" for i in range(rc + ra + rb)]
    asm = (f"{mma.ptx} {{{','.join(operands[:rc])}}}, {{{','.join(operands[rc:rc + ra])}}}, {{{','.join(operands[rc + ra:])}}}, "
           f"{{{','.join(operands[:rc])}}};")
    outs = ", ".join(f'"+{"f" if c_float else "r"}"(c_r[{i}])' for i in range(rc))
    ins = ", ".join([f'"r"(a_r[{i}])' for i in range(ra)] + [f'"r"(b_r[{i}])' for i in range(rb)])
    lines = [f"__device__ __forceinline__ {vc} __{name}({va} a, {vb} b, {vc} c) {{"]
    if mma.tf32_inputs:  # round each float to tf32 (to nearest, ties away) as the instruction expects
      lines += [f"  unsigned a_r[{ra}], b_r[{rb}]; const float *a_f = (const float*)&a, *b_f = (const float*)&b;",
                f"  for (int i = 0; i < {ra}; i++) asm(\"cvt.rna.tf32.f32 %0, %1;\" : \"=r\"(a_r[i]) : \"f\"(a_f[i]));",
                f"  for (int i = 0; i < {rb}; i++) asm(\"cvt.rna.tf32.f32 %0, %1;\" : \"=r\"(b_r[i]) : \"f\"(b_f[i]));"]
    else: lines.append("  const unsigned *a_r = (const unsigned*)&a, *b_r = (const unsigned*)&b;")
    lines += [f"  {'float' if c_float else 'unsigned'} *c_r = ({'float' if c_float else 'unsigned'}*)&c;",
              f"  asm volatile(\"{asm}\" : {outs} : {ins});", "  return c;", "}"]
    return "\n".join(lines)


def _align16(n: int) -> int: return (n + 15) // 16 * 16


def _slots(tc, operand: int) -> int:
  """Register slots of one operand's fragment: the product of its upcast axes."""
  return math.prod(sz for _, sz in tc.upcast_axes[operand])
