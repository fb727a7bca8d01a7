"""The Metal Shading Language dialect over kc's CStyleLanguage.

Kernels are `kernel void` functions whose buffers live in the `device` address space and whose local memory is
`threadgroup` memory. Launch indices are kernel parameters with Metal's attributes (Metal has no get_group_id()):
kc's gidx/lidx/idx SPECIALs read lanes of the threadgroup id, the thread id within the threadgroup and the thread
id in the grid, declared only when the kernel uses them. Bitcasts are as_type<T>(), vectors are MSL's 2-4 wide
vector types built with their constructors, half is native and bfloat is MSL 3.1's `bfloat` (its arithmetic is
done in float and rounded back, as kc's bfloat16 semantics say).

Tensor cores are simdgroup matrices (see tensor_cores.py): each WMMA is a call of a small helper per tensor core
that puts the thread's fragment into the simdgroup matrices through thread_elements(), multiplies and accumulates,
and returns the thread's elements of D."""
from __future__ import annotations
from typing import Optional
from kc.backend import CStyleLanguage, DType, Ops, PtrDType, TensorCore, WMMAArg, dtypes
from kc_metal.family import GPUFamily, family_from_env
from kc_metal.msl import BFLOAT_MSL, NEWEST_MSL, SIMDGROUP_MATRIX_MSL, MSLVersion
from kc_metal.tensor_cores import BASE_PAIRS, BFLOAT_PAIRS, simdgroup_tensor_core

INT32_MAX = 2**31 - 1
# Metal's limits on every Apple GPU: 1024 threads per threadgroup (in any shape), 32 KiB of threadgroup memory
LOCAL_MAX = (1024, 1024, 1024)
MAX_THREADS_PER_THREADGROUP = 1024
THREADGROUP_MEMORY = 32768
# a compute function's buffer argument table has 31 entries ([[buffer(0)]] .. [[buffer(30)]]): kc's buffers and its
# Variables (each a `constant int&`) share them
BUFFER_ARGUMENT_ENTRIES = 31
# Named one by one, so a dtype kc adds later is not claimed before MSL is known to have it. Metal has no 64-bit floats
# at all (no double in MSL); 64-bit ints (long, ulong) are MSL types on every GPU; bfloat is MSL 3.1's type (macOS 14),
# declared only where the language version has it.
SUPPORTED_DTYPES = frozenset({dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
                              dtypes.int64, dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32})


def metal_dtypes(language: MSLVersion) -> frozenset:
  """The dtypes kernels compile in under MSL `language`: bfloat16 from MSL 3.1 on."""
  return SUPPORTED_DTYPES if language >= BFLOAT_MSL else SUPPORTED_DTYPES - {dtypes.bfloat16}

# the kernel parameter that holds each kind of launch index, with the attribute Metal fills it from
_INDEX_PARAMS = {"g": ("__kc_gid", "threadgroup_position_in_grid"), "l": ("__kc_lid", "thread_position_in_threadgroup"),
                 "i": ("__kc_tid", "thread_position_in_grid")}


def _index_reader(kind: str):
  name = _INDEX_PARAMS[kind][0]
  # the ids are uint; kc's index arithmetic is int (launch dims stay below 2**31, global_max says so)
  return lambda dim: f"(int){name}.{'xyz'[dim]}"


def metal_tensor_cores(family: GPUFamily, language: MSLVersion = NEWEST_MSL) -> list[TensorCore]:
  """The simdgroup-matrix tensor cores a GPU family has under MSL `language` (none before Apple7 or MSL 2.3; bfloat
  ones from Apple9 and MSL 3.1 on)."""
  if not family.has_simdgroup_matrix or language < SIMDGROUP_MATRIX_MSL: return []
  pairs = BASE_PAIRS + (BFLOAT_PAIRS if family.has_bfloat_simdgroup_matrix and language >= BFLOAT_MSL else ())
  return [simdgroup_tensor_core(di, do) for di, do in pairs]


class MetalRenderer(CStyleLanguage):
  device = "METAL"  # work-groups, local memory and float4: the Renderer's defaults
  global_max = (INT32_MAX,) * 3
  local_max = LOCAL_MAX
  max_work_group_size = MAX_THREADS_PER_THREADGROUP
  shared_max = THREADGROUP_MEMORY
  max_kernel_args = BUFFER_ARGUMENT_ENTRIES
  supported_dtypes = SUPPORTED_DTYPES
  kernel_prefix = "kernel "
  buffer_prefix = "device "
  smem_prefix = "threadgroup "
  smem_align = "__attribute__((aligned(16))) "  # float4 reads of threadgroup arrays need 16-byte alignment
  arg_int_prefix = "constant int&"  # Metal takes a scalar argument by reference into an address space
  barrier = "threadgroup_barrier(mem_flags::mem_threadgroup);"
  float4 = "float4"  # MSL builds vectors with constructors: float4(a,b,c,d), half2(a,b)
  code_for_workitem = {kind: _index_reader(kind) for kind in _INDEX_PARAMS}
  type_map = {dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int16: "short", dtypes.uint16: "ushort", dtypes.uint32: "uint",
              dtypes.int64: "long", dtypes.uint64: "ulong", dtypes.float16: "half", dtypes.bfloat16: "bfloat"}
  # bfloat arithmetic and comparisons run in float, rounded back to bfloat: the same numbers as kc's other backends
  extra_matcher = CStyleLanguage.bfloat16_in_float

  def __init__(self, family: Optional[GPUFamily] = None, language: Optional[MSLVersion] = None):
    """Renders for `family` (default KC_METAL_FAMILY) under MSL `language`: an open device passes what its OS and GPU
    compile; without one, the newest MSL kc knows."""
    self.family = family if family is not None else family_from_env()
    self.language = language if language is not None else NEWEST_MSL
    self.arch = self.family.name
    self.supported_dtypes = metal_dtypes(self.language)
    self.tensor_cores = metal_tensor_cores(self.family, self.language)

  def __repr__(self):
    return f"<MetalRenderer {self.family.name} MSL {self.language} tensor_cores={len(self.tensor_cores)}>"

  def vector_widths(self, dt: DType) -> tuple[int, ...]:
    # MSL vectors are 2, 3 or 4 wide; float and half are the ones kernels load and store as vectors
    return (4, 2) if dt in (dtypes.float32, dtypes.float16) else ()

  # ***** types and values *****

  def render_bitcast(self, dt: DType, src_dt: DType, val: str) -> str: return f"as_type<{self.render_dtype(dt)}>({val})"

  def render_const(self, value, dt: DType) -> str:
    if dt.count == 1 and dt == dtypes.int64 and value == dtypes.min(dt): return f"({value + 1}l-1l)"  # 2**63 is no literal
    if dt.count == 1 and dt in (dtypes.int64, dtypes.uint64): return f"{value}{'ul' if dt == dtypes.uint64 else 'l'}"
    return super().render_const(value, dt)

  # ***** the kernel *****

  def render_kernel(self, function_name, body, params, uops, prefix=None) -> str:
    """The kernel with every argument bound to its Metal argument slot in kc's order ([[buffer(i)]]: buffers, then
    Variables as `constant int&`, since Metal takes scalars only by reference into an address space), then the
    launch indices it reads, then the helpers its WMMAs call."""
    args = [self._param(name, dt, slot) for slot, (name, dt, _) in enumerate(params)]
    kinds = sorted({u.arg[0][0] for u in uops if u.op is Ops.SPECIAL}, key="gli".index)
    args += [f"uint3 {_INDEX_PARAMS[k][0]} [[{_INDEX_PARAMS[k][1]}]]" for k in kinds]
    helpers = [wmma_helper(arg, self.render_dtype) for arg in dict.fromkeys(u.arg for u in uops if u.op is Ops.WMMA)]
    lines = ["#include <metal_stdlib>", "using namespace metal;", *helpers, *(prefix or [])]
    signature = f"{self.kernel_prefix}void {function_name}({', '.join(args)}) {{"
    return "\n".join([*lines, signature, *body, "}"])

  def _param(self, name: str, dt: DType, slot: int) -> str:
    if isinstance(dt, PtrDType): return f"{self.render_dtype(dt)} {name} [[buffer({slot})]]"
    return f"{self.arg_int_prefix} {name} [[buffer({slot})]]"

def wmma_helper(arg: WMMAArg, type_name) -> str:
  """The MSL function a WMMA of `arg` calls: it loads the thread's two elements of A, B and C into simdgroup
  matrices (thread_elements() order is the fragment slot order), runs simdgroup_multiply_accumulate, and returns the
  thread's two elements of D."""
  n, m, k = arg.dims
  t_in, t_out = type_name(arg.dtype_in), type_name(arg.dtype_out)
  vin, vout = type_name(arg.dtype_in.vec(2)), type_name(arg.dtype_out.vec(2))
  return "\n".join([
    f"{vout} __{arg.name}({vin} a, {vin} b, {vout} c) {{",
    f"  simdgroup_matrix<{t_in}, {k}, {m}> mat_a; simdgroup_matrix<{t_in}, {n}, {k}> mat_b; simdgroup_matrix<{t_out}, {n}, {m}> mat_c;",
    "  mat_a.thread_elements()[0] = a[0]; mat_a.thread_elements()[1] = a[1];",
    "  mat_b.thread_elements()[0] = b[0]; mat_b.thread_elements()[1] = b[1];",
    "  mat_c.thread_elements()[0] = c[0]; mat_c.thread_elements()[1] = c[1];",
    "  simdgroup_multiply_accumulate(mat_c, mat_a, mat_b, mat_c);",
    f"  return {vout}(mat_c.thread_elements()[0], mat_c.thread_elements()[1]);",
    "}"])
