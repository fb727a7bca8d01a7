"""The C dialect: plain C99 plus GCC/Clang vector extensions for vector accesses as wide as the host's registers.
No work-groups: the global dims are loops. Transcendentals come from math.h (exp2 and log2 of float vectors from
kc_exp2_<n> and kc_log2_<n>; WHERE of float vectors is kc_where_<n> on lane masks);
half is _Float16 where the compiler has it (else held as its bits, as bfloat16 always is); bfloat16 is stored as its
16 bits and converted to float for arithmetic with integer bit operations.

Threads: a kernel with enough work has its outermost output loop split into parts. Such a kernel takes two more
int arguments after its Variables, `kc_part` and `kc_parts`, and runs part kc_part of kc_parts of that loop's range
(equal contiguous slices, computed in C, so a range with Variable bounds splits too). It also defines the int
`kc_parts_<name>` (SPLIT_SYMBOL), by which the runtime (runtime.py) knows to call it once per part from its threads,
and an entry point of one signature for every split kernel, which those threads call (thread_pool.py)."""
from __future__ import annotations
import math, platform, re
from typing import Optional
from kc.backend import (CStyleLanguage, DType, KcError, Ops, PtrDType, UOp, dtypes, splits_loop, thread_count,
                        max_threads)  # noqa: F401  (max_threads: KC_CLANG_THREADS' bound, read here by its users)
from kc_clang.compiler import compile_flags, compiler_command, has_float16
from kc_clang.host import THREADS, chosen_isa, host_cpu, isa_level, native_code
from kc_clang.thread_pool import SPLIT_MIN_OPS, entry_source

# the two int arguments of a split kernel, after its Variables
PART_ARGS = ("kc_part", "kc_parts")
# the comment put before the split loop; render_kernel rewrites the loop after it to run one part
SPLIT_MARKER = "/* threads share this loop: each call runs part kc_part of kc_parts */"
_FOR = re.compile(r"^(?P<indent>\s*)for \((?P<type>[\w ]+?) (?P<idx>\w+) = (?P<start>.+); (?P=idx) < (?P<end>.+); (?P=idx)\+\+\) \{$")
# the first index of part `part` of `parts` of [lo, hi): q*part + r*part/parts neither overflows nor leaves a gap
PART_START = ("static inline long long __kc_part_start(long long lo, long long hi, int part, int parts) {"
              " long long n = hi - lo; return lo + (n / parts) * part + (n % parts) * part / parts; }")


def split_symbol(name: str) -> str:
  """The int a split kernel `name` defines, whose presence in the library tells the runtime to split calls."""
  return f"kc_parts_{name}"


def threads() -> int:
  """KC_CLANG_THREADS, else every core: kernels split their outermost output loop across this many threads (at most
  kc.backend.max_threads(): 4 per core, at least 256)."""
  return thread_count(THREADS.get(), "KC_CLANG_THREADS")


_FLOAT_FUNCS = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt"}


def _math(name: str):
  """A math.h call in the precision of the dtype: f-suffixed for float, plain for double, via float for half; on a
  float32 vector the vector function of VECTOR_FUNCTIONS."""
  def render(x: str, dt: DType) -> str:
    if dt.count > 1: return f"kc_{name}_{dt.count}({x})"
    if dt.scalar() == dtypes.float64: return f"{name}({x})"
    if dt.scalar() == dtypes.float32: return f"{name}f({x})"
    return f"(({'_Float16'})({name}f((float)({x}))))"
  return render


# exp2 of a float vector, for the vector widths the renderer declares: math.h has no vector functions (glibc's libmvec
# ones need -ffast-math, which changes NaN and infinity arithmetic everywhere). 2^x = 2^n * 2^f with n = round(x) and
# f in [-1/2, 1/2]: 2^f by its Taylor polynomial of degree 7 (truncation below 2^-27, within 2 ulp with the rounding
# of Horner's steps), 2^n in two factors built from exponent bits, so that results down to the smallest subnormal
# round once. x is clamped to [-150, 128] first (2^-150 rounds to 0, 2^128 is inf) and NaN passes through.
# (ln 2)^k / k!, k = 7 .. 1
_EXP2_TAYLOR = ("1.5252733804059841e-05f", "1.5403530393381606e-04f", "1.3333558146428443e-03f", "9.6181291076284772e-03f",
                "5.5504108664821580e-02f", "2.4022650695910071e-01f", "6.9314718055994531e-01f")


def _int_vector(n: int) -> str:
  """The C of kc_int<n>, the int vector of n lanes: a float vector's lane masks (what its comparisons give, and
  kc's bool vectors) and its bits."""
  return f"typedef int kc_int{n} __attribute__((vector_size({4 * n}), aligned(4)));"


def _sel(vec: str, n: int):
  """C that picks a's lanes where the mask m is set and b's elsewhere, on float vectors `vec` of n lanes."""
  return lambda m, a, b: f"(({vec})(((kc_int{n})({a}) & ({m})) | ((kc_int{n})({b}) & ~({m}))))"


def _vector_where(vec: str, n: int) -> list[str]:
  """The C of kc_where_<n>(mask, a, b), WHERE of float vectors: a C ?: takes no vector condition."""
  return [f"static inline {vec} kc_where_{n}(kc_int{n} m, {vec} a, {vec} b) {{ return {_sel(vec, n)('m', 'a', 'b')}; }}"]


def _mad(fma: Optional[str]):
  """C of a*b+c inside a vector function: the FMA builtin `fma` (a format of three operands) where the code may use
  one, else a multiply and an add. The functions' own Horner steps, not a kernel's arithmetic: fused, each step rounds
  once, and the polynomial is one instruction a step (kc_exp2_16: 35 instructions to 28)."""
  return (lambda a, b, c: fma.format(a, b, f"(zero + {c})")) if fma is not None else (lambda a, b, c: f"{a}*{b} + {c}")


def _vector_exp2(vec: str, n: int, fma: Optional[str] = None) -> list[str]:
  """The C of kc_exp2_<n> on the float vector type `vec` (with kc_int<n>, _int_vector); `fma`: _mad's."""
  iv, sel, mad = f"kc_int{n}", _sel(vec, n), _mad(fma)
  steps = " ".join(f"p = {mad('p', 'f', c)};" for c in (*_EXP2_TAYLOR[1:], "1.0f"))
  if n == 16 and fma is not None:
    # 16 lanes with FMA are AVX-512F's, which scales by 2^n in one instruction (vscalefps: p * 2^n rounded once,
    # to inf or a subnormal or 0 as the result needs): no exponent bits to build and no NaN lanes to carry past
    # them, since a NaN stays NaN through every step (the clamps' comparisons are false for it). 38 instructions
    # to 17 for 16 exps with gcc 12, the same results (a 256x1024 softmax's exp kernel 1.6x faster)
    return [f"static inline {vec} kc_exp2_{n}({vec} x) {{",
            f"  const {vec} zero = {{0}};",
            f"  {vec} c = {sel('x > 128.0f', 'zero + 128.0f', 'x')};",
            f"  c = {sel('c < -150.0f', 'zero - 150.0f', 'c')};",
            f"  {vec} n = (c + 12582912.0f) - 12582912.0f, f = c - n, p = zero + {_EXP2_TAYLOR[0]};",
            f"  {steps}",
            "  return __builtin_ia32_scalefps512_mask(p, n, p, (unsigned short)-1, 4);", "}"]
  return [f"static inline {vec} kc_exp2_{n}({vec} x) {{",
          f"  const {vec} zero = {{0}}; {iv} big = x > 128.0f, small = x < -150.0f, nan = x != x;",
          f"  {vec} c = {sel('big', 'zero + 128.0f', sel('small', 'zero - 150.0f', 'x'))};",
          "  c = " + sel("nan", "zero", "c") + ";",
          f"  {vec} n = (c + 12582912.0f) - 12582912.0f, f = c - n, p = zero + {_EXP2_TAYLOR[0]};",
          f"  {steps}",
          f"  {iv} e = __builtin_convertvector(n, {iv}), a = e >> 1, b = e - a;",
          f"  {vec} r = p * ({vec})((a + 127) << 23) * ({vec})((b + 127) << 23);",
          f"  return {sel('nan', 'x', 'r')};", "}"]


# log2 of a float vector, as kc.codegen.transcendental.log2 computes it: x = m * 2^e with m in [sqrt(1/2), sqrt(2)),
# log2(m) = 2 atanh(t) / ln 2 with t = (m-1)/(m+1), |t| < 0.172, by its odd series to t^11 (truncation below 2^-36,
# 1/ln 2 folded into the coefficients: one rounding fewer);
# subnormals are scaled by 2^64 first; x < 0 gives NaN, 0 gives -inf, inf and NaN pass through. Within 3 ulp (near 1,
# where t's own rounding shows; libm's log2f is within 1).
_LOG2_SERIES = tuple(f"{2.0 / ((2 * k + 1) * math.log(2))!r}f" for k in range(6))  # 2/((2k+1) ln 2), k = 0 .. 5
_NAN = '__builtin_nanf("")'


def _vector_log2(vec: str, n: int, fma: Optional[str] = None) -> list[str]:
  """The C of kc_log2_<n> on the float vector type `vec` (with kc_int<n>, _int_vector); `fma`: _mad's."""
  iv, sel, mad = f"kc_int{n}", _sel(vec, n), _mad(fma)
  steps = " ".join(f"p = {mad('p', 't2', c)};" for c in reversed(_LOG2_SERIES[:-1]))
  return [f"static inline {vec} kc_log2_{n}({vec} x) {{",
          f"  const {vec} zero = {{0}}; {iv} sub = x < 1.17549435e-38f;",
          f"  {iv} bits = ({iv})({sel('sub', 'x * 18446744073709551616.0f', 'x')});",
          f"  {iv} e = ((bits >> 23) & 0xff) - 127 - (sub & 64);",
          f"  {vec} m = ({vec})((bits & 0x7fffff) | (127 << 23));",
          f"  {iv} big = m > 1.41421356237309515f;",
          f"  m = {sel('big', 'm * 0.5f', 'm')}; e = e - big;",
          f"  {vec} t = (m - 1.0f) / (m + 1.0f), t2 = t * t, p = zero + {_LOG2_SERIES[-1]};",
          f"  {steps}",
          f"  {vec} r = __builtin_convertvector(e, {vec}) + t * p;",
          f"  r = {sel('x < 0.0f', 'zero + ' + _NAN, 'r')};",
          f"  r = {sel('x == 0.0f', 'zero - __builtin_inff()', 'r')};",
          f"  r = {sel('x == __builtin_inff()', 'x', 'r')};",
          f"  return {sel('x != x', 'x', 'r')};", "}"]


def _vector_max(vec: str, n: int, fma: Optional[str] = None) -> list[str]:
  """The C of kc_max_<n>, MAX of float vectors as kc computes max (see _max): NaN in either operand wins."""
  return [f"static inline {vec} kc_max_{n}({vec} a, {vec} b) {{ return kc_where_{n}((b < a) | (a != a), a, b); }}"]


def _max_name(dt: DType, kind: str = "max") -> str:
  """The C name of a scalar max function of `dt`: kc_max_<t> (_scalar_max) or kc_selmax_<t> (_select_scalar_max)."""
  return f"kc_{kind}_" + re.sub(r"\W", "_", dt.name)


def _max(a: str, b: str, dt: DType) -> str:
  """MAX by a function (its operands are named once: an expression written twice into a chain of maxes would double
  at each step): kc_max_<n> of float vectors, _scalar_max's of scalars. Spelled here rather than rewritten into a
  WHERE (kc.codegen.graph), so that a max reduce keeps MAX for the vector accumulators of kc.codegen.vectorize."""
  return f"kc_max_{dt.count}({a}, {b})" if dt.count > 1 else f"{_max_name(dt)}({a}, {b})"


def _scalar_max(ctype: str, dt: DType) -> str:
  """The C of the max of scalars of `dt` (C type `ctype`): b < a ? a : b, numpy's maximum, which gives the second of two
  equal operands (-0.0 and 0.0), as the WHERE of kc.codegen.graph does; for floats a NaN in either operand wins."""
  take_a = "(b < a) | (a != a)" if dtypes.is_float(dt) else "b < a"
  return f"static inline {ctype} {_max_name(dt)}({ctype} a, {ctype} b) {{ return ({take_a}) ? a : b; }}"


def _select_scalar_max(ctype: str, dt: DType) -> str:
  """The C of the same max of float scalars as _scalar_max, written so that compilers select without a branch (a
  compare-and-max instruction, then a blend for a NaN first operand): for a max whose operands are not a reduce's
  running value. gcc branches on _scalar_max's test, which costs a misprediction where the larger operand is a coin
  toss (a 2x2 max pool's windows: 396 against 37 us in C alone, gcc 12, a Zen 5), and is the faster form where it is
  not: a running max over a row, whose branch is almost never taken (91 against 641 us), keeps _scalar_max."""
  return f"static inline {ctype} {_max_name(dt, 'selmax')}({ctype} a, {ctype} b) {{ {ctype} m = (a > b) ? a : b; return (a != a) ? a : m; }}"


def _selects_max(u: UOp) -> bool:
  """Whether a MAX is rendered with _select_scalar_max: a float scalar max that updates no accumulator."""
  return u.op is Ops.MAX and u.dtype.count == 1 and dtypes.is_float(u.dtype) and not any(x.op is Ops.DEFINE_ACC for x in u.src)


# a*b+c of float vectors of n lanes, rounded once: the FMA3/AVX-512F builtins of gcc and clang (intrinsics without
# immintrin.h, whose parse costs every build); n is at most the vector width the renderer builds for
_FMA_BUILTINS = {4: "__builtin_ia32_vfmaddps({}, {}, {})", 8: "__builtin_ia32_vfmaddps256({}, {}, {})",
                 16: "__builtin_ia32_vfmaddps512_mask({}, {}, {}, (unsigned short)-1, 4)"}  # all lanes, current rounding


# the C of kc_<op>_<n> for float32 vectors (MAX's needs kc_where_<n>)
VECTOR_FUNCTIONS = {Ops.EXP2: _vector_exp2, Ops.LOG2: _vector_log2, Ops.MAX: _vector_max}


class ClangRenderer(CStyleLanguage):
  device = "CLANG"
  arch = platform.machine()  # the class says the architecture; an instance adds the ISA it builds for (__init__)
  has_local = False
  has_shared = False
  global_max = None
  local_max = None
  supports_float4 = True
  aligned_vectors = False  # its vector types are declared aligned(scalar): any element address loads
  signed_overflow_wraps = True  # compiled with -fwrapv (compiler.compile_flags)
  buffer_suffix = " restrict"
  vector_index = "bracket"
  infinity = "__builtin_inff()"
  nan = '__builtin_nanf("")'
  type_map = {dtypes.bool: "_Bool", dtypes.float16: "_Float16"}
  bfloat16_as_bits = True  # C has no portable bfloat16: __kc_bf2f / __kc_f2bf are defined in render_kernel
  fp8_as_bits = True  # nor fp8: CStyleLanguage.render_kernel defines its conversions
  extra_matcher = CStyleLanguage.bfloat16_in_float  # bfloat16 and fp8 are held as bits and computed in float
  code_for_op = {**CStyleLanguage.code_for_op, **{op: _math(name) for op, name in _FLOAT_FUNCS.items()}, Ops.MAX: _max}
  # GCC/Clang vector extensions compute on the vector typedefs lane by lane: upcast lanes stay vectors through their
  # arithmetic and in vector accumulators (kc.codegen.vectorize), and the heuristics tile for the registers
  vector_alu = True
  vector_functions = frozenset(VECTOR_FUNCTIONS)
  vector_select = True  # bool vectors are kc_int<n> lane masks; WHERE of float vectors is kc_where_<n>

  def __init__(self, native: Optional[bool] = None, isa: Optional[str] = None):
    # the same choice as the compiler's flags (compiler.compile_flags): an x86 ISA level (`isa`, else KC_CLANG_ISA
    # when `native` is not given either), else this CPU (host.native_code()) or portable code
    level = isa_level(isa) if isa is not None else chosen_isa() if native is None else None
    self.native = level is None and (native_code() if native is None else native)
    cpu = host_cpu()
    # the arch names the ISA the vectors are sized for: the opt cache keys searched opts on it (Renderer.arch)
    self.arch = f"{cpu.machine} {level.name}" if level else f"{cpu.machine} {cpu.isa}".strip() if self.native else cpu.machine
    # floats per vector register: 16 with AVX-512, 8 with AVX2, 4 with SSE or NEON; portable code keeps float4. The
    # heuristics count the registers from the width: 32 of AVX-512's, 16 of AVX2's or SSE's
    self.float_lanes = (level.vector_bytes if level else cpu.vector_bytes if self.native else 16) // 4
    # half is _Float16 where the compiler has it; elsewhere (clang 14 on x86 without AVX512-FP16) half is held as its
    # bits and computed in float, with the conversions CStyleLanguage.bits_helpers writes
    # fused multiply-adds for sums of products (kc.codegen.fma) where the code may use FMA3: -march=native on a CPU
    # that has it, or a level that includes it (avx2, avx512f)
    self.fuses_accumulation = ("fma",) in level.needs if level else self.native and cpu.x86 and "fma" in cpu.features
    flags = compile_flags(native=self.native, isa=level.name if level else None)
    if not has_float16(tuple(compiler_command()), tuple(flags)):
      self.half_as_bits, self.extra_matcher = True, CStyleLanguage.all_narrow_in_float

  def render_env(self) -> tuple: return (threads(),)  # 1 thread: no split loop

  def fused_multiply_add(self, dt: DType) -> bool:
    # float and double scalars by fmaf/fma (one instruction with FMA3); float vectors by the x86 builtin of their width
    # (a vector's a*b+c in operators is never fused: kernels are built with -ffp-contract=off, compiler.compile_flags)
    if dt.count == 1: return dt in (dtypes.float32, dtypes.float64)
    return dt.scalar() == dtypes.float32 and dt.count in _FMA_BUILTINS and dt.count <= self.float_lanes

  def vector_fma(self, dt: DType) -> Optional[str]:
    """The FMA builtin (a format of its three operands) of float vectors `dt`, where the code may use FMA3; else None."""
    return _FMA_BUILTINS[dt.count] if self.fuses_accumulation and self.fused_multiply_add(dt) else None

  def vector_widths(self, dt: DType) -> tuple[int, ...]:
    # float and half (computed in float on most CPUs) in registers of float_lanes floats, then each narrower width
    if dt not in (dtypes.float32, dtypes.float16) or (dt == dtypes.float16 and self.half_as_bits): return ()
    widths, w = [], self.float_lanes
    while w >= 2: widths, w = widths + [w], w // 2
    return tuple(widths)

  def loop_pragma(self, rng: UOp, uops: list[UOp], depth: int) -> Optional[str]:
    # the loop every host backend splits (kc.backend.splits_loop): the outermost one over output elements, around all
    # the work, when there is enough of it
    return SPLIT_MARKER if splits_loop(rng, uops, depth == 1, threads(), SPLIT_MIN_OPS) else None

  def render_dtype(self, dt: DType, mutable: bool = True) -> str:
    # a bool vector is a vector of lane masks: what a comparison of float vectors gives (int lanes of -1 and 0)
    if not isinstance(dt, PtrDType) and dt.count > 1 and dt.scalar() == dtypes.bool: return f"kc_int{dt.count}"
    return super().render_dtype(dt, mutable)

  def render_vector(self, dt: DType, elements: list[str]) -> str:
    if dt.scalar() == dtypes.bool: elements = [f"-(int)({e})" for e in elements]  # true: every bit of the lane set
    return f"(({self.render_dtype(dt)}){{{','.join(elements)}}})"

  def render_lane(self, vec: str, dt: DType, lane: int) -> str:
    if dt.scalar() == dtypes.bool: return f"((_Bool)({vec})[{lane}])"  # a mask's lane as the bool it stands for
    return super().render_lane(vec, dt, lane)

  def _expression(self, u: UOp, s: list[str]) -> str:
    if u.op is Ops.MULACC:  # only where fused_multiply_add(u.dtype) said so
      if u.dtype.count > 1: return _FMA_BUILTINS[u.dtype.count].format(*s)
      return f"__builtin_fma{'f' if u.dtype == dtypes.float32 else ''}({', '.join(s)})"
    if u.op is Ops.WHERE and u.dtype.count > 1: return f"kc_where_{u.dtype.count}({', '.join(s)})"
    if _selects_max(u): return f"{_max_name(u.dtype, 'selmax')}({s[0]}, {s[1]})"
    return super()._expression(u, s)

  def render_kernel(self, function_name, body, params, uops, prefix=None) -> str:
    lines = ["#include <math.h>", "#include <string.h>"]
    # what the prelude depends on, asked of each distinct (op, dtype) in the order of first use (the lines' order)
    kinds = dict.fromkeys([(u.op, u.dtype) for u in uops])
    vectors = [(op, dt) for op, dt in kinds if dt.count > 1 and not isinstance(dt, PtrDType)]
    # kc_int<n>: the masks of bool vectors, and the bits of float vectors in their functions
    lines += [_int_vector(n) for n in dict.fromkeys(dt.count for op, dt in vectors if dt.scalar() == dtypes.bool
                                                     or op in VECTOR_FUNCTIONS or op is Ops.WHERE)]
    for dt in dict.fromkeys(dt for _, dt in vectors if dt.scalar() != dtypes.bool):
      scalar = self.render_dtype(dt.scalar())
      # aligned to the scalar: a vector access through a buffer view at any element offset stays legal
      lines.append(f"typedef {scalar} {self.render_dtype(dt)} __attribute__((vector_size({dt.itemsize}), aligned({dt.scalar().itemsize})));")
    functions = [(op, dt) for op, dt in vectors if op in VECTOR_FUNCTIONS or op is Ops.WHERE]
    for dt in dict.fromkeys(dt for op, dt in functions if op in (Ops.WHERE, Ops.MAX)): lines += _vector_where(self.render_dtype(dt), dt.count)
    for op, dt in functions:
      if op is not Ops.WHERE: lines += VECTOR_FUNCTIONS[op](self.render_dtype(dt), dt.count, self.vector_fma(dt))
    if any(op is Ops.MAX and dt.count == 1 for op, dt in kinds):
      scalar_maxes = [u for u in uops if u.op is Ops.MAX and u.dtype.count == 1]
      lines += [_scalar_max(self.render_dtype(dt), dt) for dt in dict.fromkeys(u.dtype for u in scalar_maxes if not _selects_max(u))]
      lines += [_select_scalar_max(self.render_dtype(dt), dt) for dt in dict.fromkeys(u.dtype for u in scalar_maxes if _selects_max(u))]
    if any(dt.scalar() == dtypes.bfloat16 and not isinstance(dt, PtrDType) for _, dt in kinds):
      lines += ["static inline float __kc_bf2f(unsigned short b) { unsigned int u = ((unsigned int)b) << 16; float f; memcpy(&f, &u, 4); return f; }",
                "static inline unsigned short __kc_f2bf(float f) { unsigned int u; memcpy(&u, &f, 4);"
                " if ((u & 0x7fffffff) > 0x7f800000) return (unsigned short)((u >> 16) | 64);"
                " u += 0x7fff + ((u >> 16) & 1); return (unsigned short)(u >> 16); }"]
    if any(line.strip() == SPLIT_MARKER for line in body):
      if clash := [name for name, _, _ in params if name in PART_ARGS]:
        raise KcError(f"kernel {function_name} has a Variable named {clash[0]!r}, a name CLANG keeps for its thread split: rename it")
      body = _split_loop(body)
      buffers = [isinstance(dt, PtrDType) for _, dt, _ in params]
      params = [*params, *((name, dtypes.int32, False) for name in PART_ARGS)]
      lines += [PART_START, f"const int {split_symbol(function_name)} = 1;"]
      # the entry point the runtime's kernel threads call (thread_pool.py)
      return super().render_kernel(function_name, body, params, uops, lines + (prefix or [])) + "\n" + entry_source(function_name, buffers)
    return super().render_kernel(function_name, body, params, uops, lines + (prefix or []))


def _split_loop(body: list[str]) -> list[str]:
  """The body with the loop after SPLIT_MARKER running from part kc_part's first index to part kc_part+1's."""
  i = next(i for i, line in enumerate(body) if line.strip() == SPLIT_MARKER)
  if (m := _FOR.match(body[i + 1])) is None: raise KcError(f"CLANG cannot split the loop {body[i + 1].strip()!r} across threads")
  ind, ty, idx, lo, hi = m["indent"], m["type"], m["idx"], m["start"], m["end"]
  bounds = [f"{ind}{ty} {idx}_lo = ({ty})__kc_part_start({lo}, {hi}, kc_part, kc_parts);",
            f"{ind}{ty} {idx}_hi = ({ty})__kc_part_start({lo}, {hi}, kc_part + 1, kc_parts);"]
  return body[:i + 1] + bounds + [f"{ind}for ({ty} {idx} = {idx}_lo; {idx} < {idx}_hi; {idx}++) {{"] + body[i + 2:]
