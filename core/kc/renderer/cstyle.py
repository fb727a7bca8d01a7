"""CStyleLanguage: the one C-style renderer base. Every C-like backend (C, OpenCL C, CUDA C, Metal) subclasses it
and overrides only its dialect: qualifiers, type names, work-item functions, barriers and a few op spellings.

render() walks the linearized UOps once. Expressions used once are inlined into their user; everything else
becomes a named local (val0, alu1, acc0, ...). Loops and gated stores are blocks."""
from __future__ import annotations
import itertools, math, re, struct, threading
from collections import Counter
from typing import Callable, Optional
from kc.ir.dtype import FP8_FORMATS, DType, FP8Format, ImageDType, PtrDType, dtypes
from kc.errors import CompileError
from kc.renderer import Renderer
from kc.ir.rewrite import PatternMatcher, UPat
from kc.ir.uop import GroupOp, Ops, UOp, shuffle_lanes


def _negated_comparison(rendered: str) -> str:
  """The negation of a rendered `a!=b`, as `a==b`: it reads better flipped than wrapped in !()."""
  body = _strip_parens(rendered)
  return body.replace("!=", "==", 1) if body.count("!=") == 1 else f"!({body})"


_PARENS = re.compile(r"[()]")


# the ops the walk renders as statements and names of their own; every other op is a value (_expression)
_STRUCTURE = frozenset({Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.CONST, Ops.SPECIAL, Ops.DEFINE_LOCAL, Ops.RANGE, Ops.ENDRANGE,
                        Ops.ENDIF, Ops.IF, Ops.BARRIER, Ops.DEFINE_ACC, Ops.ASSIGN, Ops.INDEX, Ops.LOAD, Ops.STORE})
# the values written inline into the one expression that uses them (a lane is always inline)
_INLINED = frozenset({*GroupOp.ALU, Ops.CAST, Ops.BITCAST, Ops.VECTORIZE, Ops.SHUFFLE})
# the values held in a `cast` variable where they are not inlined
_CASTS = frozenset({Ops.CAST, Ops.BITCAST, Ops.VECTORIZE, Ops.SHUFFLE})


def _strip_parens(s: str) -> str:
  """`(a+b)` -> `a+b` when the outer parentheses enclose the whole expression."""
  if not (s.startswith("(") and s.endswith(")")): return s
  # most are one pair "(a+b)", or two groups "(a)*(b)": told by where the first inner parenthesis of each kind is
  first_close, first_open = s.find(")", 1), s.find("(", 1)
  if first_open == -1 or first_close < first_open: return s[1:-1] if first_close == len(s) - 1 else s
  depth, last = 0, len(s) - 1
  for m in _PARENS.finditer(s):  # only the parentheses: expressions are long, and most of their characters are not
    depth += 1 if m.group() == "(" else -1
    if depth == 0: return s[1:-1] if m.start() == last else s
  return s[1:-1]


def _operand(x: str) -> str:
  """A right operand of '-': a negative literal gets parentheses, since '--' is C's decrement."""
  return f"({x})" if x.startswith("-") else x


def _arithmetic_in_float(held: frozenset[DType]):
  """A rule computing arithmetic on the `held` dtypes in float and rounding back: a dialect holding them as bits has
  no ops on them."""
  def rule(x: UOp) -> Optional[UOp]:
    if x.dtype.scalar() not in held: return None
    f = dtypes.float32.vec(x.dtype.count)
    return UOp(x.op, f, tuple(s.cast(f) if s.dtype.scalar() in held else s for s in x.src), x.arg).cast(x.dtype)
  return rule


def _compare_in_float(held: frozenset[DType]):
  """A rule comparing values of the `held` dtypes on their float values (comparing the bits would order negatives wrongly)."""
  def rule(x: UOp) -> Optional[UOp]:
    if x.src[0].dtype.scalar() not in held: return None
    f = dtypes.float32.vec(x.src[0].dtype.count)
    return x.replace(src=tuple(s.cast(f) for s in x.src))
  return rule


def _in_float(held: frozenset[DType]) -> PatternMatcher:
  return PatternMatcher([
    # the dtype in the pattern: every float32 and int op of a kernel is turned away by the matcher, not a call
    (UPat(GroupOp.ALU - {Ops.CMPLT, Ops.CMPNE}, dtype=tuple(held), name="x"), _arithmetic_in_float(held)),
    (UPat((Ops.CMPLT, Ops.CMPNE), name="x"), _compare_in_float(held)),
  ], memoize=True)  # pure rules: results are remembered on the UOps


def _float_bits(x: float) -> int: return struct.unpack("<I", struct.pack("<f", x))[0]


# the formats a C-style dialect may hold as bits and convert with generated helpers (CStyleLanguage.bits_helpers):
# the fp8s, and half where the C compiler has no half type (clang before 15 on x86 without AVX512-FP16)
_BITS_FORMATS = {**FP8_FORMATS, dtypes.float16: FP8Format(5, 10, 65504.0, True)}


class CStyleLanguage(Renderer):
  """The C-style renderer base. A backend subclass sets the attributes below and overrides the render_* methods
  where its dialect differs; render() (the walk over the linear UOps) stays as it is. Besides these, a backend
  declares Renderer's facts: device, limits, tensor_cores, supports_float4 / vector_widths, supported_dtypes."""

  kernel_prefix: str = ""
  """Written before `void` in the kernel's signature: "__kernel ", 'extern "C" __global__ ', "kernel "."""
  buffer_prefix: str = ""
  """The address space of buffer arguments and of pointer casts into them: "__global ", "device "."""
  buffer_suffix: str = ""
  """Written after a buffer argument's type: " restrict" where buffers never alias."""
  smem_prefix: str = ""
  """The address space of local (shared) memory: "__local ", "__shared__ ", "threadgroup "."""
  smem_align: str = ""
  """Written before a local-memory array's declaration, e.g. an alignment attribute that makes its vector accesses legal."""
  smem_prefix_for_cast: bool = True
  """Whether a pointer into local memory is spelled with smem_prefix (False where local pointers carry no qualifier)."""
  arg_int_prefix: str = "const int"
  """The type of a kernel's int arguments (its Variables)."""
  barrier: str = ""
  """The statement that waits for every thread of a work-group and makes its local-memory writes visible."""
  signed_overflow_wraps: bool = False
  """True where the compiler defines signed overflow as wrapping (C with -fwrapv): int32/int64 arithmetic is then
  rendered plainly. Elsewhere values that may overflow are computed in the unsigned type, since C leaves a signed
  overflow undefined while kc (like numpy) wraps."""
  code_for_workitem: dict[str, Callable[[int], str]] = {}
  """The launch indices, by kind: "g" the work-group id, "l" the id within the work-group, "i" the global id; each
  maps a dimension (0, 1, 2) to its expression."""
  extra_args: list[str] = []
  """Parameters appended to every kernel's signature (a dialect's implicit arguments)."""
  float4: Optional[str] = None
  """How a vector is built: "(float4)" becomes "(float4)(a,b,c,d)", with float4 replaced by the vector's type name.
  None: a C cast, "(float4)(a,b,c,d)". A dialect with another syntax overrides render_vector instead."""
  type_map: dict[DType, str] = {}
  """The dialect's names of scalar dtypes where they differ from C's (uint32 -> "uint"); a vector appends its width."""
  infinity: str = "INFINITY"
  """The expression of positive infinity (negative infinity is its negation, cast to the dtype)."""
  nan: str = "NAN"
  """The expression of a quiet NaN."""
  code_for_op: dict[Ops, Callable[..., str]] = {
    Ops.SQRT: lambda x, dt: f"sqrt({x})", Ops.RECIP: lambda x, dt: f"(1/{x})", Ops.NEG: lambda x, dt: f"(-{_operand(x)})",
    Ops.EXP2: lambda x, dt: f"exp2({x})", Ops.LOG2: lambda x, dt: f"log2({x})", Ops.SIN: lambda x, dt: f"sin({x})",
    Ops.AND: lambda a, b, dt: f"({a}&{b})", Ops.XOR: lambda a, b, dt: f"({a}^{b})", Ops.OR: lambda a, b, dt: f"({a}|{b})",
    Ops.ADD: lambda a, b, dt: f"({a}+{b})", Ops.SUB: lambda a, b, dt: f"({a}-{_operand(b)})", Ops.MUL: lambda a, b, dt: f"({a}*{b})",
    Ops.MOD: lambda a, b, dt: f"({a}%{b})", Ops.IDIV: lambda a, b, dt: f"({a}/{b})", Ops.FDIV: lambda a, b, dt: f"({a}/{b})",
    Ops.CMPNE: lambda a, b, dt: f"({a}!={b})", Ops.CMPLT: lambda a, b, dt: f"({a}<{b})",
    Ops.SHR: lambda a, b, dt: f"({a}>>{b})", Ops.SHL: lambda a, b, dt: f"({a}<<{b})",
    Ops.WHERE: lambda a, b, c, dt: f"({a}?{b}:{c})",
  }
  """The spelling of each ALU op: a function of the rendered operands and the result dtype. The ops a dialect leaves
  out are rewritten into ones it has before rendering (MAX as a WHERE, EXP2/LOG2/SIN as polynomials); adding MULACC
  (a fused multiply-add) makes float a*b+c one op. Extend it with {**CStyleLanguage.code_for_op, ...}."""
  vector_index: str = "dot"
  """How a vector lane is read: "dot" v.x to v.w (v[i] in vectors wider than four), "bracket" v[i]. A dialect with
  another syntax overrides render_lane instead."""
  bfloat16_as_bits: bool = False
  """True where the dialect has no bfloat16 type: a bfloat16 is held as its 16 bits in the dialect's uint16 type,
  converted with __kc_bf2f (bits to float) and __kc_f2bf (float to bits, rounding to nearest even), which the dialect
  defines in its kernel prelude (render_kernel); its arithmetic and comparisons run in float when the dialect's
  extra_matcher includes bfloat16_in_float."""
  bfloat16_in_float = _in_float(frozenset({dtypes.bfloat16, *dtypes.fp8s}))
  """The rules that compute bfloat16 and fp8 arithmetic and comparisons in float (and round back): the extra_matcher
  (or a part of it) of a dialect with bfloat16_as_bits or fp8_as_bits. fp8 has no arithmetic in any dialect (CUDA's
  native fp8 types convert and nothing more), so these rules suit a dialect with native fp8 types too."""
  fp8_as_bits: bool = True
  """True (the default) where the dialect has no fp8 types, as C and OpenCL C have none: an fp8e4m3 or fp8e5m2 is held
  as its 8 bits in the dialect's uint8 type and converted with __kc_<fp8 name>_to_f (bits to float, exact) and
  __kc_f_to_<fp8 name> (float to bits: round to nearest even; past the largest finite value e4m3 becomes NaN and e5m2
  inf), which render_kernel defines from fp8_helpers in every kernel that uses fp8; its arithmetic and comparisons run
  in float when the dialect's extra_matcher includes bfloat16_in_float or fp8_in_float. A dialect with native fp8 types (CUDA's
  __nv_fp8_e4m3) sets it False and renders them itself."""
  fp8_in_float = _in_float(frozenset(dtypes.fp8s))
  """The fp8 rules alone: the extra_matcher of a dialect that computes bfloat16 natively (or has none) and fp8 in float."""
  half_as_bits: bool = False
  """True where the dialect's compiler has no half type: a half is held as its 16 bits in the dialect's uint16 type and
  converted with __kc_float16_to_f and __kc_f_to_float16 (round to nearest even; from bits_helpers, as fp8's are), and
  its arithmetic and comparisons run in float when the dialect's extra_matcher includes all_narrow_in_float."""
  all_narrow_in_float = _in_float(frozenset({dtypes.float16, dtypes.bfloat16, *dtypes.fp8s}))
  """The rules that compute half, bfloat16 and fp8 in float: the extra_matcher of a dialect with half_as_bits."""

  # ***** dialect pieces a backend may override *****

  def render_dtype(self, dt: DType, mutable: bool = True) -> str:
    """The dialect's name of a dtype: scalars from type_map (else C's name), vectors with their width appended,
    pointers with their address space. `mutable` (image arguments) tells an image the kernel writes from one it reads."""
    if isinstance(dt, ImageDType): return f"{'write_only' if mutable else 'read_only'} image2d_t"
    if isinstance(dt, PtrDType):
      prefix = self.smem_prefix if dt.local and self.smem_prefix_for_cast else self.buffer_prefix
      return prefix + self.render_dtype(dt.base) + "*"
    scalar = dt.scalar()
    if scalar == dtypes.bfloat16 and self.bfloat16_as_bits: scalar = dtypes.uint16  # held as its bits
    if scalar in dtypes.fp8s and self.fp8_as_bits: scalar = dtypes.uint8
    if scalar == dtypes.float16 and self.half_as_bits: scalar = dtypes.uint16
    name = self.type_map.get(scalar, _C_NAMES.get(scalar, scalar.name))
    return name + (str(dt.count) if dt.count > 1 else "")

  def render_cast(self, dt: DType, val: str) -> str:
    """`val` converted to `dt` whatever its type: a C cast, or the conversion of its float value to the bits of a
    bfloat16 (__kc_f2bf) or fp8 (__kc_f_to_fp8e4m3, ...) held as bits."""
    if dt.scalar() == dtypes.bfloat16 and self.bfloat16_as_bits: return f"__kc_f2bf((float)({val}))"
    if self._fp8_bits(dt): return f"__kc_f_to_{dt.scalar().name}((float)({val}))"
    return f"({self.render_dtype(dt)})({val})"

  def render_cast_uop(self, u: UOp, val: str) -> str:
    """A CAST UOp: render_cast, except that a bfloat16 or fp8 held as bits is read through its float value (__kc_bf2f,
    __kc_fp8e4m3_to_f, ...). A dialect whose conversions depend on the source type in other ways overrides this."""
    src = u.src[0].dtype.scalar()
    if self.bfloat16_as_bits and src == dtypes.bfloat16 and u.dtype.scalar() != dtypes.bfloat16:
      return self.render_cast(u.dtype, f"__kc_bf2f({val})")
    if self._fp8_bits(src):
      if u.dtype.scalar() == src: return val  # the same bits
      return self.render_cast(u.dtype, f"__kc_{src.name}_to_f({val})")
    # double -> float -> fp8 would round twice; rounding to float "to odd" first keeps the result that of one rounding
    if self._fp8_bits(u.dtype) and src == dtypes.float64: return self.render_cast(u.dtype, f"__kc_d2f_odd({val})")
    return self.render_cast(u.dtype, val)

  def _fp8_bits(self, dt: DType) -> bool:
    """Whether `dt` is a small float held as bits and converted through bits_helpers: fp8 (fp8_as_bits) or half
    (half_as_bits)."""
    return (self.fp8_as_bits and dt.scalar() in dtypes.fp8s) or (self.half_as_bits and dt.scalar() == dtypes.float16)

  def fp8_helpers(self, dt: DType) -> list[str]:
    """The dialect's C of __kc_<dt>_to_f and __kc_f_to_<dt> for the fp8 type `dt` held as bits (bits_helpers)."""
    return self.bits_helpers(dt)

  def bits_helpers(self, dt: DType) -> list[str]:
    """The dialect's C of __kc_<dt>_to_f and __kc_f_to_<dt> for a small float `dt` held as bits (an fp8, or half with
    half_as_bits), in uint32 bit arithmetic on the float's bits (read with render_bitcast), so that every C-style
    dialect can use them."""
    f = _BITS_FORMATS[dt]
    width = 1 + f.exp_bits + f.man_bits  # 8 or 16 bits: the sign is the top one
    sign = 1 << (width - 1)
    u8, u32, f32 = (self.render_dtype(t) for t in (dtypes.uint8 if width == 8 else dtypes.uint16, dtypes.uint32, dtypes.float32))
    to_bits, from_bits = self.render_bitcast(dtypes.uint32, dtypes.float32, "f"), self.render_bitcast(dtypes.float32, dtypes.uint32, "u")
    top, man_mask, drop, rebias = (1 << f.exp_bits) - 1, (1 << f.man_bits) - 1, 23 - f.man_bits, 127 - f.bias
    # the largest finite value's mantissa decides a tie at the midpoint to the next binade value: an even one keeps it
    mid = _float_bits(f.max_value + 2.0 ** (math.frexp(f.max_value)[1] - 1 - f.man_bits) / 2)
    overflow_at = mid + 1 if (_float_bits(f.max_value) >> drop) & 1 == 0 else mid
    # a quiet NaN: the all-ones exponent with the top mantissa bit (e4m3 has one NaN, S.1111.111)
    nan_code, overflow_code = (top << f.man_bits | 1 << (f.man_bits - 1), top << f.man_bits) if f.has_inf else (sign - 1, sign - 1)
    # decode: e5m2's all-ones exponent is inf or NaN; e4m3's only NaN is S.1111.111; subnormals are m * 2^(1-bias-man_bits)
    special = f"e == {top}u" if f.has_inf else f"e == {top}u && m == {man_mask}u"
    special_bits = "s | 0x7f800000u | (m ? 0x400000u : 0u)" if f.has_inf else "s | 0x7fc00000u"
    decode = (f"static inline {f32} __kc_{dt.name}_to_f({u8} b) {{ "
              f"{u32} s = (({u32})(b & {sign:#x}u)) << {32 - width}, e = (b >> {f.man_bits}) & {top}u, "
              f"m = b & {man_mask}u, u; if ({special}) u = {special_bits}; "
              f"else if (e == 0u) {{ {f32} v = ({f32})m * {2.0 ** (1 - f.bias - f.man_bits)!r}f; return s ? -v : v; }} "
              f"else u = s | ((e + {rebias}u) << 23) | (m << {drop}); return {from_bits}; }}")
    # encode: NaN and overflow first; a normal result rounds the float's bits to nearest even on the dropped bits and
    # rebiases the exponent (a carry into it is right); a subnormal one rounds the full mantissa shifted to its quantum
    encode = (f"static inline {u8} __kc_f_to_{dt.name}({f32} f) {{ {u32} u = {to_bits}, s = (u >> {32 - width}) & {sign:#x}u, a = u & 0x7fffffffu; "
              f"if (a > 0x7f800000u) return ({u8})(s | {nan_code}u); if (a >= {overflow_at}u) return ({u8})(s | {overflow_code}u); "
              f"int e = (int)(a >> 23) - 127; if (e >= {1 - f.bias}) {{ a += {(1 << (drop - 1)) - 1}u + ((a >> {drop}) & 1u); "
              f"return ({u8})(s | ((a >> {drop}) - {rebias << f.man_bits}u)); }} "
              f"int shift = {23 + 1 - f.bias - f.man_bits} - e; if (shift > 24) return ({u8})s; "
              f"{u32} mant = (a & 0x7fffffu) | 0x800000u, n = mant >> shift, rem = mant & ((1u << shift) - 1u), tie = 1u << (shift - 1); "
              f"if (rem > tie || (rem == tie && (n & 1u))) n++; return ({u8})(s | n); }}")
    return [decode, encode]

  def round_to_odd_helper(self) -> str:
    """The dialect's C of __kc_d2f_odd: a double to the float next to it whose last bit is odd where the conversion
    is inexact ("round to odd"), so that a second rounding to a type with fewer bits (fp8) rounds as one would."""
    u32, f32, f64 = (self.render_dtype(t) for t in (dtypes.uint32, dtypes.float32, dtypes.float64))
    to_bits, from_bits = self.render_bitcast(dtypes.uint32, dtypes.float32, "f"), self.render_bitcast(dtypes.float32, dtypes.uint32, "u")
    # d - (double)f is exact; an inexact f with an even last bit moves one step toward d, to the odd neighbour (f takes
    # d's sign, so a positive e means a larger magnitude exactly when f is positive)
    return (f"static inline {f32} __kc_d2f_odd({f64} d) {{ {f32} f = ({f32})d; {u32} u = {to_bits}; {f64} e = d - ({f64})f; "
            f"if (e != 0.0 && e == e && !(u & 1u)) u = ((e > 0.0) == !(u >> 31)) ? u + 1u : u - 1u; return {from_bits}; }}")

  def render_bitcast(self, dt: DType, src_dt: DType, val: str) -> str:
    """`val` (an lvalue of `src_dt`: the walk names it first) with its bits read as `dt`, by default through a pointer
    cast; a dialect with a bit-reinterpreting builtin (as_type, __builtin_bit_cast) overrides this."""
    return f"(*(({self.buffer_prefix}{self.render_dtype(dt)}*)&{val}))"

  def render_const(self, value, dt: DType) -> str:
    """A literal of `dt`: C suffixes (f, u, ll, ull), infinity and nan from the attributes, the int32 minimum as an
    expression (its magnitude is no int literal), other types through render_cast, vectors lane by lane."""
    if dt.count > 1: return self.render_vector(dt, [self.render_const(value, dt.scalar())] * dt.count)
    if dtypes.is_float(dt):
      if math.isnan(value): return self.render_cast(dt, self.nan)
      if math.isinf(value): return self.render_cast(dt, ("-" if value < 0 else "") + self.infinity)
      if dt == dtypes.float64: return repr(float(value))
      if dt == dtypes.float32: return f"{float(value)!r}f"
      return self.render_cast(dt, f"{float(value)!r}f")
    if dt == dtypes.bool: return "1" if value else "0"
    if dt == dtypes.int64: return f"{value}ll"
    if dt == dtypes.uint64: return f"{value}ull"
    if dt == dtypes.uint32: return f"{value}u"
    if dt == dtypes.int32: return str(value) if value != dtypes.min(dt) else f"({value + 1}-1)"
    return self.render_cast(dt, str(value))

  def render_vector(self, dt: DType, elements: list[str]) -> str:
    """A vector of `dt` built from its rendered lanes (see the float4 attribute)."""
    ctor = (self.float4 or f"({self.render_dtype(dt)})").replace("float4", self.render_dtype(dt))
    return f"{ctor}({','.join(elements)})"

  def render_lane(self, vec: str, dt: DType, lane: int) -> str:
    """Lane `lane` of the vector `vec` of `dt` (see the vector_index attribute)."""
    if self.vector_index == "bracket" or dt.count > 4: return f"{vec}[{lane}]"
    return f"{vec}.{'xyzw'[lane]}"

  def _lanes_of(self, vec: str, dt: DType) -> tuple[str, ...]:
    """Every lane of the vector `vec` of `dt` as render_lane spells it (a function of its arguments), remembered per
    renderer and thread: the SHUFFLEs of a kernel's butterflies read the lanes of a few names (acc0, alu3) of a few
    dtypes, the same from one kernel to the next. (Kept in a threading.local, which is scratch, not a setting: the
    Program cache's key leaves it out.)"""
    if (local := self.__dict__.get("_lane_spellings")) is None: local = self.__dict__.setdefault("_lane_spellings", threading.local())
    if (memo := getattr(local, "names", None)) is None: memo = local.names = {}
    if (ret := memo.get(key := (vec, dt))) is None:
      if len(memo) >= 4096: memo.clear()  # names are numbered per kernel: a bound, not an eviction policy
      ret = memo[key] = tuple([self.render_lane(vec, dt, i) for i in range(dt.count)])
    return ret

  def render_special(self, name: str, size) -> str:
    """The initializer of a launch index (gidx0, lidx1, idx2: the kind is the first letter, the dimension the last
    digit), from code_for_workitem, with the dimension's size as a comment."""
    return f"{self.code_for_workitem[name[0]](int(name[-1]))}; /* {size if isinstance(size, int) else size.render()} */"

  def render_kernel(self, function_name: str, body: list[str], params: list[tuple[str, DType, bool]], uops: list[UOp],
                    prefix: Optional[list[str]] = None) -> str:
    """The whole kernel: the signature from `params` (name, dtype, whether the kernel writes it), in argument order,
    then `body`. A dialect adds what its kernels need before the function (includes, pragmas, typedefs, helper
    functions) by overriding this and passing those lines on as `prefix`."""
    args = []
    for name, dt, mutable in params:
      if isinstance(dt, PtrDType): args.append(f"{self.render_dtype(dt, mutable)}{self.buffer_suffix} {name}")
      else: args.append(f"{self.arg_int_prefix} {name}")
    src = f"{self.render_kernel_prefix(uops)}void {function_name}({', '.join(args + self.extra_args)}) {{\n" + "\n".join(body) + "\n}"
    if self.fp8_as_bits or self.half_as_bits:  # after the dialect's own lines (includes, typedefs): the helpers use only its basic types
      used = {(dt.base if isinstance(dt, PtrDType) else dt).scalar() for dt in {u.dtype for u in uops}}
      held = [dt for dt in (*dtypes.fp8s, dtypes.float16) if dt in used and self._fp8_bits(dt)]
      prefix = (prefix or []) + [line for dt in held for line in self.bits_helpers(dt)]
      if any(u.op is Ops.CAST and self._fp8_bits(u.dtype) and u.src[0].dtype.scalar() == dtypes.float64 for u in uops):
        prefix.append(self.round_to_odd_helper())
    return "\n".join(prefix) + "\n" + src if prefix else src

  def render_local(self, name: str, dt: DType, size: int) -> str:
    """The declaration of a local-memory array of `size` elements of `dt` (a dialect whose large work-group memory is
    one dynamic block, as CUDA's above 48 KiB, declares a pointer into it instead)."""
    return f"{self.smem_align}{self.smem_prefix}{self.render_dtype(dt)} {name}[{size}];"

  def render_kernel_prefix(self, uops: list[UOp]) -> str:
    """What goes before `void` in the kernel's signature: kernel_prefix, or more where it depends on the kernel
    (CUDA's __launch_bounds__ of the block size)."""
    return self.kernel_prefix

  def render_wmma(self, uop: UOp, a: str, b: str, c: str) -> str:
    """A tensor-core op: by default a call of a function named after the TensorCore, which the dialect defines in its
    prelude (render_kernel)."""
    return f"__{uop.arg.name}({a}, {b}, {c})"

  def loop_pragma(self, rng: UOp, uops: list[UOp], depth: int) -> Optional[str]:
    """A line to put before a loop (a dialect that parallelizes or unrolls loops says so here); none by default."""
    return None

  def render_load(self, dt: DType, index: UOp, buf: str, offset: str, gate: Optional[str]) -> str:
    """The expression reading a `dt` at element `offset` of `buf`; a gated load reads 0 where `gate` is false.
    A dialect whose buffers are not pointers everywhere (OpenCL images) overrides this."""
    ptr = self._pointer(index, f"({buf}+{_strip_parens(offset)})", dt)
    return f"(*{ptr})" if gate is None else f"({gate}?(*{ptr}):{self.render_const(0, dt)})"

  def render_store(self, dt: DType, index: UOp, buf: str, offset: str, value: str) -> str:
    """The statement writing `value` (a `dt`) at element `offset` of `buf`; the walk adds the gate."""
    return f"*{self._pointer(index, f'({buf}+{_strip_parens(offset)})', dt)} = {_strip_parens(value)};"

  # ***** the walk *****

  def render(self, name: str, uops: list[UOp]) -> str:
    """The walk: one pass over the linear UOps, calling the render_* methods above. Backends override those, not this
    (a dialect may wrap it to set per-kernel state, as OpenCL's renderer does)."""
    names: dict[UOp, str] = {}
    # a SHUFFLE reads its sources once per lane it takes, as a VECTORIZE of GEPs would: a source read for several lanes
    # is held in a variable, not written into each lane
    uses = Counter(itertools.chain.from_iterable([u.src if u.op is not Ops.SHUFFLE else [x for x, _ in shuffle_lanes(u)] for u in uops]))
    params: dict[UOp, list] = {}
    counters: Counter = Counter()
    body: list[str] = []
    gates: list[UOp] = []  # the conditions of the open IF blocks
    named: set[UOp] = set()  # values held in a variable (not inlined expressions)
    bitcast_sources = {x for u in uops if u.op is Ops.BITCAST for x in u.src}
    depth = 1

    type_names: dict[DType, str] = {}

    def type_name(dt: DType) -> str:  # the dialect's name of a value's dtype, asked for most lines of the body
      if (name := type_names.get(dt)) is None: name = type_names[dt] = self.render_dtype(dt)
      return name

    def fresh(prefix: str) -> str:
      counters[prefix] += 1
      return f"{prefix}{counters[prefix] - 1}"

    def emit(line: str) -> None: body.append("  " * depth + line)

    for u in uops:
      s = [names.get(x, "") for x in u.src]
      op = u.op
      if op not in _STRUCTURE:  # values (arithmetic, casts, vectors, lanes): most of a kernel, tested first
        if op is Ops.BITCAST and u.src[0] not in named:  # reinterpreting bits needs an lvalue to take the address of
          tmp = fresh("cast")
          emit(f"{type_name(u.src[0].dtype)} {tmp} = {_strip_parens(s[0])};")
          s = [tmp]
        expr = self._expression(u, s)
        if op is Ops.GEP or (uses[u] == 1 and u not in bitcast_sources and op in _INLINED):
          names[u] = expr
        else:
          names[u] = fresh("wmma" if op is Ops.WMMA else "cast" if op in _CASTS else "alu")
          emit(f"{type_name(u.dtype)} {names[u]} = {_strip_parens(expr)};")
          named.add(u)
      elif op is Ops.DEFINE_GLOBAL:
        names[u] = f"data{u.arg}"
        params[u] = [names[u], u.dtype, False]
      elif op is Ops.DEFINE_VAR:
        names[u] = u.arg[0]
        params[u] = [names[u], u.dtype, False]
      elif op is Ops.CONST: names[u] = self.render_const(u.arg, u.dtype)
      elif op is Ops.SPECIAL:
        names[u] = u.arg[0]
        # int, or the dialect's int64 in a kernel with wide indices (kc.codegen.lower.index_dtype)
        emit(f"{type_name(u.dtype)} {names[u]} = {self.render_special(u.arg[0], u.arg[1])}")
      elif op is Ops.DEFINE_LOCAL:
        names[u] = u.arg[0]
        emit(self.render_local(names[u], u.dtype.base, u.arg[1]))
      elif op is Ops.RANGE:
        names[u] = fresh("ridx")
        if (pragma := self.loop_pragma(u, uops, depth)) is not None: emit(pragma)
        emit(f"for ({type_name(u.dtype)} {names[u]} = {s[0]}; {names[u]} < {s[1]}; {names[u]}++) {{")
        depth += 1
      elif op in (Ops.ENDRANGE, Ops.ENDIF):
        if op is Ops.ENDIF: gates.pop()
        depth -= 1
        emit("}")
      elif op is Ops.IF:
        emit(f"if ({_strip_parens(s[0])}) {{")
        gates.append(u.src[0])
        depth += 1
      elif op is Ops.BARRIER: emit(self.barrier)
      elif op is Ops.DEFINE_ACC:
        names[u] = fresh("acc")
        emit(f"{type_name(u.dtype)} {names[u]} = {s[0]};")
      elif op is Ops.ASSIGN:
        names[u] = s[0]
        emit(f"{s[0]} = {_strip_parens(s[1])};")
      elif op is Ops.INDEX:
        names[u] = f"({s[0]}+{_strip_parens(s[1])})"
      elif op is Ops.LOAD:
        index = u.src[0]
        val = self.render_load(u.dtype, index, names[index.src[0]], names[index.src[1]], names[index.src[2]] if len(index.src) == 3 else None)
        names[u] = fresh("val")
        emit(f"{type_name(u.dtype)} {names[u]} = {_strip_parens(val)};")
      elif op is Ops.STORE:
        index = u.src[0]
        if index.src[0] in params: params[index.src[0]][2] = True  # a buffer written to is not const
        line = self.render_store(u.src[1].dtype, index, names[index.src[0]], names[index.src[1]], s[1])
        gated = len(u.src[0].src) == 3 and u.src[0].src[2] not in gates  # inside an IF on its gate it needs no test of its own
        emit(f"if ({_strip_parens(names[u.src[0].src[2]])}) {line}" if gated else line)
    # buffers in the order they appear, then Variables by name: the order Program.globals and Program.vars give them
    ordered = [p for p in params if p.op is Ops.DEFINE_GLOBAL] + sorted((p for p in params if p.op is Ops.DEFINE_VAR), key=lambda v: v.arg)
    return self.render_kernel(name, body, [tuple(params[p]) for p in ordered], uops)

  def _int_division(self, u: UOp, a: str, b: str) -> str:
    """IDIV or MOD of ints with kc's answers where C has none: x // 0 == x % 0 == 0 (numpy's answer; C traps), and
    MIN // -1 wraps to MIN with MIN % -1 == 0 (numpy's answer; C traps). A divisor whose range excludes 0 (and -1)
    gets the plain C operator: index math divides by positive constants."""
    divisor, dt = u.src[1], u.dtype
    plain = self.code_for_op[u.op](a, b, dt)
    may_be_zero = not (divisor.vmin > 0 or divisor.vmax < 0)
    # narrow ints are promoted to int first, where MIN / -1 is no overflow (the wrap cast of the caller handles it)
    may_overflow = dt in _WIDE_SIGNED and divisor.vmin <= -1 <= divisor.vmax and u.src[0].vmin <= dtypes.min(dt)
    if not may_be_zero and not may_overflow: return plain
    if u.op is Ops.MOD:
      zero = f"{b}==0||{b}==-1" if may_overflow else f"{b}==0"
      return f"(({zero})?0:{plain})"
    if may_overflow:  # a / -1 is -a, negated in the unsigned type where it wraps instead of trapping
      plain = f"({b}==-1?({self.render_dtype(dt)})(-({self.render_dtype(_WIDE_SIGNED[dt])})({a})):{plain})"
    return f"({b}==0?0:{plain})" if may_be_zero else plain

  def _pointer(self, index: UOp, rendered: str, value_dtype: DType) -> str:
    """The pointer expression of an INDEX, cast to a vector pointer when the access is a vector."""
    if value_dtype.count > 1:
      ptr_dt = index.src[0].dtype
      space = self.smem_prefix if isinstance(ptr_dt, PtrDType) and ptr_dt.local and self.smem_prefix_for_cast else self.buffer_prefix
      return f"(({space}{self.render_dtype(value_dtype)}*){rendered})"
    return rendered

  def _wrapping(self, u: UOp, args: list[str]) -> str:
    """Signed int32/int64 arithmetic that may overflow, done in the unsigned type (which wraps) and converted back: a
    signed overflow is undefined in C, and compilers use that (a product widened to 64 bits before it wrapped), while
    numpy wraps. Index arithmetic, whose bounds are known to fit, never comes here."""
    unsigned = _WIDE_SIGNED[u.dtype]
    a = [self.render_cast(unsigned, x) for x in args]
    if u.op is Ops.NEG: a = [self.render_cast(unsigned, "0"), a[0]]
    return self.render_cast(u.dtype, self.code_for_op[Ops.SUB if u.op is Ops.NEG else u.op](*a, unsigned))

  def _expression(self, u: UOp, s: list[str]) -> str:
    op = u.op
    if op is Ops.GEP: return self.render_lane(s[0], u.src[0].dtype, u.arg[0])
    if op is Ops.CMPNE and u.src[1].op is Ops.CONST and u.src[1].arg is True:  # kc spells logical not as x != true
      inner = u.src[0]
      if inner.op is Ops.CMPNE: return f"({_negated_comparison(s[0])})"
      return f"(!{s[0]})"
    if op in GroupOp.ALU:
      if op not in self.code_for_op: raise CompileError(f"{type(self).__name__} has no spelling for {op}")
      # a left operand of the same op needs no parentheses: C groups a+b+c as (a+b)+c (a right one keeps them,
      # float addition is not associative)
      args = [_strip_parens(x) if i == 0 and v.op is op and op in (Ops.ADD, Ops.MUL, Ops.XOR) else x for i, (x, v) in enumerate(zip(s, u.src))]
      # a vector's a*b+c in operators (fma() takes scalars); -ffp-contract fuses it into one vector FMA
      if op is Ops.MULACC and u.dtype.count > 1: return f"(({args[0]}*{args[1]})+{args[2]})"
      if op in _WRAPPING_OPS and u.dtype in _WIDE_SIGNED and not self.signed_overflow_wraps and _may_overflow(u): return self._wrapping(u, args)
      expr = self._int_division(u, *args) if op in (Ops.IDIV, Ops.MOD) and dtypes.is_int(u.dtype) else self.code_for_op[op](*args, u.dtype)
      # C computes a narrow int's arithmetic in int: the cast wraps the result to the dtype, as numpy does, before a
      # comparison or a wider use reads it (vectors are not promoted, and a C-style cast between vectors is no conversion)
      if op in _WIDENING_OPS and u.dtype in _NARROW_INTS: return self.render_cast(u.dtype, _strip_parens(expr))
      return expr
    if op is Ops.CAST: return self.render_cast_uop(u, s[0])
    if op is Ops.BITCAST: return self.render_bitcast(u.dtype, u.src[0].dtype, s[0])
    if op is Ops.VECTORIZE: return self.render_vector(u.dtype, s)
    if op is Ops.SHUFFLE:  # a vector of the lanes (the dialect's vector literal; a C compiler makes it one permute)
      lanes = {x: self._lanes_of(name, x.dtype) for x, name in zip(u.src, s)}
      return self.render_vector(u.dtype, [lanes[x][i] for x, i in shuffle_lanes(u)])
    if op is Ops.WMMA: return self.render_wmma(u, *s)
    raise CompileError(f"{type(self).__name__} cannot render {op}")


_C_NAMES = {dtypes.bool: "bool", dtypes.int8: "signed char", dtypes.uint8: "unsigned char", dtypes.int16: "short", dtypes.uint16: "unsigned short",
            dtypes.int32: "int", dtypes.uint32: "unsigned int", dtypes.int64: "long", dtypes.uint64: "unsigned long", dtypes.float16: "half",
            dtypes.bfloat16: "__bf16", dtypes.float32: "float", dtypes.float64: "double"}
# the ops whose exact result can leave a narrow int's range (IDIV: MIN / -1); AND OR XOR SHR MAX MOD WHERE of in-range
# values stay in range, so they need no wrap cast
_WIDENING_OPS = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG, Ops.SHL, Ops.IDIV})
_NARROW_INTS = frozenset({dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16})
_WRAPPING_OPS = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG})


def _may_overflow(u: UOp) -> bool:
  """The exact result of ADD/SUB/MUL/NEG over its sources' ranges can leave the dtype's range."""
  (lo, hi), *rest = [(int(x.vmin), int(x.vmax)) for x in u.src]
  if u.op is Ops.NEG: lo, hi = -hi, -lo
  elif u.op is Ops.MUL: ends = [a * b for a in (lo, hi) for b in rest[0]]; lo, hi = min(ends), max(ends)
  elif u.op is Ops.ADD: lo, hi = lo + rest[0][0], hi + rest[0][1]
  else: lo, hi = lo - rest[0][1], hi - rest[0][0]
  return lo < dtypes.min(u.dtype) or hi > dtypes.max(u.dtype)
# the signed ints C divides without promoting, each with the unsigned type its negation wraps in
_WIDE_SIGNED = {dtypes.int32: dtypes.uint32, dtypes.int64: dtypes.uint64}
