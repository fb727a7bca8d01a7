"""The C dialect: plain C99 plus GCC/Clang vector extensions for float4-style accesses. No work-groups: the
global dims are loops. Transcendentals come from math.h; half is _Float16; bfloat16 is stored as its 16 bits
and converted to float for arithmetic with integer bit operations."""
from __future__ import annotations
import os, platform
from typing import Optional
from kc.backend import (CStyleLanguage, ConfigError, DType, Ops, PtrDType, UOp, dtypes, env_value,
                        estimate_ops)

# below this many operations a kernel runs on one thread: starting the others costs more than it saves
PARALLEL_MIN_OPS = 1 << 17


def threads() -> int:
  """KC_CLANG_THREADS, else every core: kernels split their outermost output loop across threads (OpenMP)."""
  n = env_value("KC_CLANG_THREADS", os.cpu_count() or 1)
  if n < 1: raise ConfigError(f"KC_CLANG_THREADS={n} is not a thread count: give an int >= 1, or unset it for every core")
  return n

_FLOAT_FUNCS = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt"}


def _math(name: str):
  """A math.h call in the precision of the dtype: f-suffixed for float, plain for double, via float for half."""
  def render(x: str, dt: DType) -> str:
    if dt.scalar() == dtypes.float64: return f"{name}({x})"
    if dt.scalar() == dtypes.float32: return f"{name}f({x})"
    return f"(({'_Float16'})({name}f((float)({x}))))"
  return render


class ClangRenderer(CStyleLanguage):
  device = "CLANG"
  arch = platform.machine()  # the host the C compiler builds for (no -march flags unless KC_CLANG_MARCH_NATIVE)
  has_local = False
  has_shared = False
  global_max = None
  local_max = None
  supports_float4 = True
  signed_overflow_wraps = True  # compiled with -fwrapv (compiler.compile_flags)
  buffer_suffix = " restrict"
  vector_index = "bracket"
  infinity = "__builtin_inff()"
  nan = '__builtin_nanf("")'
  type_map = {dtypes.bool: "_Bool", dtypes.float16: "_Float16"}
  bfloat16_as_bits = True  # C has no portable bfloat16: __kc_bf2f / __kc_f2bf are defined in render_kernel
  fp8_as_bits = True  # nor fp8: CStyleLanguage.render_kernel defines its conversions
  extra_matcher = CStyleLanguage.bfloat16_in_float  # bfloat16 and fp8 are held as bits and computed in float
  code_for_op = {**CStyleLanguage.code_for_op, **{op: _math(name) for op, name in _FLOAT_FUNCS.items()}}

  def loop_pragma(self, rng: UOp, uops: list[UOp], depth: int) -> Optional[str]:
    # the outermost loop over output elements: its iterations write disjoint outputs, so threads can share them
    if depth != 1 or rng.arg[1] != 0 or threads() == 1: return None
    work = estimate_ops(uops)
    if isinstance(work, int) and work < PARALLEL_MIN_OPS: return None
    return f"#pragma omp parallel for num_threads({threads()})"

  def render_vector(self, dt: DType, elements: list[str]) -> str: return f"(({self.render_dtype(dt)}){{{','.join(elements)}}})"

  def render_kernel(self, function_name, body, params, uops, prefix=None) -> str:
    lines = ["#include <math.h>", "#include <string.h>"]
    for dt in dict.fromkeys(u.dtype for u in uops if u.dtype.count > 1 and not isinstance(u.dtype, PtrDType)):
      scalar = self.render_dtype(dt.scalar())
      # aligned to the scalar: a vector access through a buffer view at any element offset stays legal
      lines.append(f"typedef {scalar} {self.render_dtype(dt)} __attribute__((vector_size({dt.itemsize}), aligned({dt.scalar().itemsize})));")
    if any(u.dtype.scalar() == dtypes.bfloat16 for u in uops if not isinstance(u.dtype, PtrDType)):
      lines += ["static inline float __kc_bf2f(unsigned short b) { unsigned int u = ((unsigned int)b) << 16; float f; memcpy(&f, &u, 4); return f; }",
                "static inline unsigned short __kc_f2bf(float f) { unsigned int u; memcpy(&u, &f, 4);"
                " if ((u & 0x7fffffff) > 0x7f800000) return (unsigned short)((u >> 16) | 64);"
                " u += 0x7fff + ((u >> 16) & 1); return (unsigned short)(u >> 16); }"]
    return super().render_kernel(function_name, body, params, uops, lines + (prefix or []))
