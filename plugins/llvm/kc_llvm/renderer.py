"""Linear UOps to LLVM IR text: one function per kernel, typed SSA, for the host's target.

The shape of the function: an entry block holding the accumulators (allocas, which mem2reg turns into phis) and the
constants that need computing (a half or fp8 constant is its float's conversion, folded by the optimizer), then the
body. A RANGE is a loop with its counter in a phi (head, body, latch, exit blocks); an IF and a gated load are
branches around the guarded code, so an address the gate rules out is never read. Values are placed as the
linearizer ordered them: a value's block encloses its uses, as C's scopes do for the C renderers.

Semantics: IEEE float arithmetic with no fast-math flags (and no contraction: MULACC is not spelled, so kc keeps an
elementwise a*b+c as two roundings; a float sum of products accumulates with llvm.fma, rounding each product once,
where the target has FMA instructions: kc.codegen.fma); integers wrap (no nsw/nuw flags); integer division and remainder by zero give 0 and
MIN // -1 wraps, the divisor replaced by 1 where kc's answer is chosen (LLVM's division by zero is undefined).
Transcendentals are LLVM's intrinsics, which call the C library's functions (CLANG's results), except exp2 of a float
vector, computed at once by a polynomial as CLANG's is (vector_exp2.py). half, bfloat16 and
fp8 are held as their bits (small_floats.py) and computed in float.

Threads: as CLANG, a kernel with enough work has its outermost output loop split into parts (kc.backend.splits_loop):
it takes `i32 %kc_part, i32 %kc_parts` after its Variables and runs its part of the loop's range. Every kernel
defines the i32 global kc_parts_<name> (split_symbol), 1 where it is split, by which the runtime knows to call it
once per part."""
from __future__ import annotations
from typing import Optional
from kc.backend import (CStyleLanguage, CompileError, DType, Ops, PtrDType, Renderer, UOp, dtypes, splits_loop,
                        thread_count)
from kc_llvm import small_floats, vector_exp2
from kc_llvm.small_floats import float_literal
from kc_llvm.target import THREADS, Target, chosen_target, data_layout


def threads() -> int:
  """KC_LLVM_THREADS, else every core: kernels split their outermost output loop across this many threads."""
  return thread_count(THREADS.get(), "KC_LLVM_THREADS")


def split_symbol(name: str) -> str:
  """The i32 global every kernel `name` defines: 1 where it is split, so that the runtime calls it once per part."""
  return f"kc_parts_{name}"


PART_ARGS = ("kc_part", "kc_parts")

# the dtypes held as their bits, by the integer type that holds them
_HELD = {dtypes.float16: "i16", dtypes.bfloat16: "i16", dtypes.fp8e4m3: "i8", dtypes.fp8e5m2: "i8"}
_SCALAR = {dtypes.bool: "i1", dtypes.int8: "i8", dtypes.uint8: "i8", dtypes.int16: "i16", dtypes.uint16: "i16",
           dtypes.int32: "i32", dtypes.uint32: "i32", dtypes.int64: "i64", dtypes.uint64: "i64",
           dtypes.float32: "float", dtypes.float64: "double", **_HELD}
_FLOAT_SUFFIX = {dtypes.float32: "f32", dtypes.float64: "f64"}
_INTRINSICS = {Ops.SQRT: "sqrt", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin"}
# the binary ops by (int, unsigned int, float) spelling
_BINARY = {Ops.ADD: ("add", "add", "fadd"), Ops.SUB: ("sub", "sub", "fsub"), Ops.MUL: ("mul", "mul", "fmul"),
           Ops.FDIV: (None, None, "fdiv"), Ops.AND: ("and", "and", None), Ops.OR: ("or", "or", None),
           Ops.XOR: ("xor", "xor", None), Ops.SHL: ("shl", "shl", None), Ops.SHR: ("ashr", "lshr", None),
           Ops.CMPLT: ("icmp slt", "icmp ult", "fcmp olt"), Ops.CMPNE: ("icmp ne", "icmp ne", "fcmp une")}


def ltype(dt: DType) -> str:
  """The LLVM type of a kc value (pointers are opaque `ptr`; bool is i1, half/bfloat16/fp8 their bits)."""
  if isinstance(dt, PtrDType): return "ptr"
  s = _SCALAR.get(dt.scalar())
  if s is None: raise CompileError(f"LLVM has no type for {dt}")
  return f"<{dt.count} x {s}>" if dt.count > 1 else s


def mtype(dt: DType) -> str:
  """The type of a value in memory: a bool is a byte there, as numpy stores it."""
  return ltype(dtypes.uint8.vec(dt.count)) if dt.scalar() == dtypes.bool else ltype(dt)


def _int_bits(dt: DType) -> int: return 1 if dt.scalar() == dtypes.bool else dt.scalar().itemsize * 8


def _unsigned(dt: DType) -> bool: return dtypes.is_unsigned(dt.scalar()) or dt.scalar() == dtypes.bool


def _is_float(dt: DType) -> bool: return dt.scalar() in (dtypes.float32, dtypes.float64)


class LLVMRenderer(Renderer):
  device = "LLVM"
  has_local = False
  has_shared = False
  global_max = None
  local_max = None
  supports_float4 = True
  aligned_vectors = False  # loads and stores say the scalar's alignment: any element address takes a vector access
  # the ops spelled directly (values: the LLVM spelling); MAX becomes a WHERE and MULACC is left out (no contraction:
  # only a sum's products are fused, by llvm.fma, where fuses_accumulation says so)
  code_for_op = {**{op: names[2] or names[0] for op, names in _BINARY.items()}, Ops.IDIV: "sdiv", Ops.MOD: "srem",
                 Ops.NEG: "fneg", Ops.RECIP: "fdiv", Ops.WHERE: "select", **{op: f"llvm.{n}" for op, n in _INTRINSICS.items()}}
  # half, bfloat16 and fp8 held as bits and computed in float (small_floats.py)
  extra_matcher = CStyleLanguage.all_narrow_in_float
  # LLVM computes on vector types lane by lane: upcast float lanes stay vectors through their arithmetic, and
  # through exp2 (vector_exp2.py: llvm.exp2 on a vector would be a C library call per lane)
  vector_alu = True
  vector_functions = frozenset({Ops.EXP2})

  def __init__(self, target: Optional[Target] = None):
    self.target = target or chosen_target()
    self.arch = " ".join(x for x in (self.target.triple.split("-")[0], self.target.cpu) if x)
    self.float_lanes = self.target.vector_bytes // 4
    # sums of products accumulate with llvm.fma (kc.codegen.fma) where it is an instruction
    self.fuses_accumulation = self.target.has_fma

  def fused_multiply_add(self, dt: DType) -> bool: return _is_float(dt)

  def render_env(self) -> tuple: return (threads(),)  # 1 thread: no split loop

  def vector_widths(self, dt: DType) -> tuple[int, ...]:
    if dt != dtypes.float32: return ()  # half is held as bits, computed in float: its accesses stay scalar
    widths, w = [], self.float_lanes
    while w >= 2: widths, w = widths + [w], w // 2
    return tuple(widths)

  def render(self, name: str, uops: list) -> str:
    return _Function(self, name, uops).render()


class _Function:
  """One kernel's walk over its linear UOps, emitting instructions into blocks."""

  def __init__(self, renderer: LLVMRenderer, name: str, uops: list[UOp]):
    self.r, self.name, self.uops = renderer, name, uops
    self.entry: list[str] = []            # allocas and computed constants
    self.body: list[str] = []
    self.names: dict[UOp, str] = {}       # a UOp's SSA value or constant
    self.accs: dict[UOp, str] = {}        # DEFINE_ACC -> its alloca
    self.declares: set[str] = set()
    self.small: set[str] = set()          # small floats whose conversions the kernel uses
    self.round_to_odd = False
    self.vector_exp2: set[int] = set()   # the widths of float vectors whose exp2 the kernel computes
    self.count = 0
    self.block = "body"                   # the block instructions go to now
    self.ifs: list[tuple[UOp, str]] = []  # the open IFs: gate, end label
    self.loops: list[tuple[UOp, str, str]] = []  # the open loops: RANGE, counter, label prefix
    self.split = False

  def fresh(self, prefix: str = "v") -> str:
    self.count += 1
    return f"%{prefix}{self.count}"

  def emit(self, line: str) -> None: self.body.append("  " + line)

  def label(self, name: str) -> None:
    self.body.append(f"{name}:")
    self.block = name

  def inst(self, text: str, prefix: str = "v") -> str:
    """Emit `<new> = text` and return the new value's name."""
    out = self.fresh(prefix)
    self.emit(f"{out} = {text}")
    return out

  def val(self, u: UOp) -> str:
    """The operand for `u` here: an accumulator is read from its alloca where it is used."""
    acc = u
    while acc.op is Ops.ASSIGN: acc = acc.src[0]
    if acc.op is Ops.DEFINE_ACC: return self.inst(f"load {ltype(acc.dtype)}, ptr {self.accs[acc]}")
    return self.names[u]

  # ***** constants *****

  def const(self, value, dt: DType) -> str:
    if dt.count > 1: return f"<{', '.join(f'{ltype(dt.scalar())} {self.const(value, dt.scalar())}' for _ in range(dt.count))}>"
    if dt in _HELD:  # the float's conversion, computed once in the entry block (and folded by the optimizer)
      self.small.add(dt.name)
      out = self.fresh("c")
      self.entry.append(f"  {out} = call {_HELD[dt]} {small_floats.from_f32(dt.name)}(float {float_literal(float(_as_float32(value)))})")
      return out
    if dt == dtypes.bool: return "true" if value else "false"
    if _is_float(dt): return float_literal(float(_as_float32(value)) if dt == dtypes.float32 else float(value))
    bits = _int_bits(dt)
    v = int(value) & ((1 << bits) - 1)
    return str(v - (1 << bits) if v >= 1 << (bits - 1) else v)  # LLVM reads integer literals as signed

  # ***** the walk *****

  def render(self) -> str:
    params: dict[UOp, str] = {}
    uops = self.uops
    for u in uops:
      op = u.op
      if op is Ops.DEFINE_GLOBAL:
        self.names[u] = f"%data{u.arg}"
        params[u] = f"ptr noalias {self.names[u]}"
      elif op is Ops.DEFINE_VAR:
        self.names[u] = f'%"var.{u.arg[0]}"'
        params[u] = f"i32 {self.names[u]}"
      elif op is Ops.CONST: self.names[u] = self.const(u.arg, u.dtype)
      elif op is Ops.RANGE: self.open_loop(u)
      elif op is Ops.ENDRANGE: self.close_loop()
      elif op is Ops.IF:
        end = f"endif{self.count + 1}"
        self.count += 1
        self.emit(f"br i1 {self.names[u.src[0]]}, label %then{self.count}, label %{end}")
        self.ifs.append((u.src[0], end))
        self.label(f"then{self.count}")
      elif op is Ops.ENDIF:
        _, end = self.ifs.pop()
        self.emit(f"br label %{end}")
        self.label(end)
      elif op is Ops.DEFINE_ACC:
        self.accs[u] = self.fresh("acc")
        self.entry.append(f"  {self.accs[u]} = alloca {ltype(u.dtype)}")
        self.emit(f"store {ltype(u.dtype)} {self.val(u.src[0])}, ptr {self.accs[u]}")
      elif op is Ops.ASSIGN:
        acc = u.src[0]
        while acc.op is Ops.ASSIGN: acc = acc.src[0]
        if acc.op is not Ops.DEFINE_ACC: raise CompileError(f"LLVM assigns only to accumulators, not to {acc.op}")
        self.emit(f"store {ltype(acc.dtype)} {self.val(u.src[1])}, ptr {self.accs[acc]}")
      elif op is Ops.INDEX:
        elem = mtype(u.src[0].dtype.base if isinstance(u.src[0].dtype, PtrDType) else u.dtype)
        off = u.src[1]
        self.names[u] = self.inst(f"getelementptr inbounds {elem}, ptr {self.names[u.src[0]]}, {ltype(off.dtype)} {self.val(off)}", "p")
      elif op is Ops.LOAD: self.names[u] = self.load(u)
      elif op is Ops.STORE: self.store(u)
      elif op in (Ops.SPECIAL, Ops.DEFINE_LOCAL, Ops.BARRIER, Ops.WMMA):
        raise CompileError(f"LLVM renders host loops only and declares no {op} (no launch dims, local memory or tensor cores)")
      else: self.names[u] = self.value(u)
    ordered = [p for p in params if p.op is Ops.DEFINE_GLOBAL] + sorted((p for p in params if p.op is Ops.DEFINE_VAR), key=lambda v: v.arg)
    args = [params[p] for p in ordered]
    if self.split:
      if any(p.arg[0] in PART_ARGS for p in ordered if p.op is Ops.DEFINE_VAR):
        raise CompileError(f"kernel {self.name} has a Variable named like LLVM's thread split arguments {PART_ARGS}: rename it")
      args += [f"i32 %{a}" for a in PART_ARGS]
    t = self.r.target
    head = [f'; kernel {self.name}', f'target datalayout = "{data_layout(t)}"', f'target triple = "{t.triple}"', ""]
    head.append(f"@{split_symbol(self.name)} = constant i32 {int(self.split)}")
    head += sorted(self.declares)
    head += small_floats.helpers(self.small, self.round_to_odd) + [vector_exp2.definition(n) for n in sorted(self.vector_exp2)]
    fn = [f"define void @{self.name}({', '.join(args)}) nounwind {{", "entry:", *self.entry, "  br label %body", "body:",
          *self.body, "  ret void", "}"]
    return "\n".join(head + fn) + "\n"

  # ***** blocks *****

  def open_loop(self, u: UOp) -> None:
    it = ltype(u.dtype)
    start, end = self.val(u.src[0]), self.val(u.src[1])
    n = self.count = self.count + 1
    if splits_loop(u, self.uops, not self.loops, threads()):
      self.split = True
      start, end = self.part_start(it, start, end, "%kc_part"), self.part_start(it, start, end, None)
    pre, counter = self.block, f"%ridx{n}"
    self.emit(f"br label %loop{n}")
    self.label(f"loop{n}")
    self.emit(f"{counter} = phi {it} [{start}, %{pre}], [{counter}.next, %latch{n}]")
    cond = self.inst(f"icmp slt {it} {counter}, {end}")
    self.emit(f"br i1 {cond}, label %inner{n}, label %exit{n}")
    self.label(f"inner{n}")
    self.names[u] = counter
    self.loops.append((u, counter, str(n)))

  def close_loop(self) -> None:
    u, counter, n = self.loops.pop()
    it = ltype(u.dtype)
    self.emit(f"br label %latch{n}")
    self.label(f"latch{n}")
    self.emit(f"{counter}.next = add {it} {counter}, 1")
    self.emit(f"br label %loop{n}")
    self.label(f"exit{n}")

  def part_start(self, it: str, lo: str, hi: str, part: Optional[str]) -> str:
    """The first index of part `part` (None: the next part, kc_part + 1) of kc_parts of [lo, hi), in i64:
    lo + (n/parts)*part + (n%parts)*part/parts, which neither overflows nor leaves a gap."""
    wide = (lambda x: x) if it == "i64" else (lambda x: self.inst(f"sext {it} {x} to i64"))
    lo64, hi64 = wide(lo), wide(hi)
    p = self.inst("sext i32 %kc_part to i64")
    if part is None: p = self.inst(f"add i64 {p}, 1")
    parts = self.inst("sext i32 %kc_parts to i64")
    n = self.inst(f"sub i64 {hi64}, {lo64}")
    q, r = self.inst(f"sdiv i64 {n}, {parts}"), self.inst(f"srem i64 {n}, {parts}")
    a, b = self.inst(f"mul i64 {q}, {p}"), self.inst(f"mul i64 {r}, {p}")
    c = self.inst(f"sdiv i64 {b}, {parts}")
    out = self.inst(f"add i64 {self.inst(f'add i64 {lo64}, {a}')}, {c}")
    return out if it == "i64" else self.inst(f"trunc i64 {out} to {it}")

  # ***** memory *****

  def gate_of(self, index: UOp) -> Optional[UOp]:
    gate = index.src[2] if len(index.src) == 3 else None
    return None if gate is None or any(g is gate for g, _ in self.ifs) else gate  # an open IF on it tested it

  def load(self, u: UOp) -> str:
    index = u.src[0]
    ptr, gate = self.names[index], self.gate_of(index)
    def read() -> str:
      raw = self.inst(f"load {mtype(u.dtype)}, ptr {ptr}, align {u.dtype.scalar().itemsize}")
      return self.inst(f"icmp ne {mtype(u.dtype)} {raw}, zeroinitializer") if u.dtype.scalar() == dtypes.bool else raw
    if gate is None: return read()
    n = self.count = self.count + 1
    before = self.block
    self.emit(f"br i1 {self.names[gate]}, label %load{n}, label %loaded{n}")
    self.label(f"load{n}")
    got = read()
    after = self.block
    self.emit(f"br label %loaded{n}")
    self.label(f"loaded{n}")
    return self.inst(f"phi {ltype(u.dtype)} [{got}, %{after}], [zeroinitializer, %{before}]")

  def store(self, u: UOp) -> None:
    index, value = u.src[0], u.src[1]
    ptr, gate, v = self.names[index], self.gate_of(index), self.val(value)
    if value.dtype.scalar() == dtypes.bool: v = self.inst(f"zext {ltype(value.dtype)} {v} to {mtype(value.dtype)}")
    n = None
    if gate is not None:
      n = self.count = self.count + 1
      self.emit(f"br i1 {self.names[gate]}, label %store{n}, label %stored{n}")
      self.label(f"store{n}")
    self.emit(f"store {mtype(value.dtype)} {v}, ptr {ptr}, align {value.dtype.scalar().itemsize}")
    if n is not None:
      self.emit(f"br label %stored{n}")
      self.label(f"stored{n}")

  # ***** values *****

  def value(self, u: UOp) -> str:
    op, dt = u.op, u.dtype
    if op is Ops.CAST: return self.cast(self.val(u.src[0]), u.src[0].dtype, dt)
    if op is Ops.BITCAST:
      src = u.src[0]
      if ltype(src.dtype) == ltype(dt): return self.val(src)
      return self.inst(f"bitcast {ltype(src.dtype)} {self.val(src)} to {ltype(dt)}")
    if op is Ops.GEP:
      return self.inst(f"extractelement {ltype(u.src[0].dtype)} {self.val(u.src[0])}, i32 {u.arg[0]}")
    if op is Ops.SHUFFLE:  # lanes of one vector or of two (of one type) concatenated: LLVM's own shufflevector
      t = ltype(u.src[0].dtype)
      second = self.val(u.src[1]) if len(u.src) == 2 else "poison"
      mask = ", ".join(f"i32 {i}" for i in u.arg)
      return self.inst(f"shufflevector {t} {self.val(u.src[0])}, {t} {second}, <{len(u.arg)} x i32> <{mask}>")
    if op is Ops.VECTORIZE:
      lanes = [self.val(s) for s in u.src]
      et = ltype(dt.scalar())
      if not any(x.startswith("%") for x in lanes): return f"<{', '.join(f'{et} {x}' for x in lanes)}>"
      if all(x == lanes[0] for x in lanes):  # a splat: one insert and a shuffle
        one = self.inst(f"insertelement <1 x {et}> poison, {et} {lanes[0]}, i32 0")
        return self.inst(f"shufflevector <1 x {et}> {one}, <1 x {et}> poison, <{dt.count} x i32> zeroinitializer")
      vec = "poison"
      for i, x in enumerate(lanes): vec = self.inst(f"insertelement {ltype(dt)} {vec}, {et} {x}, i32 {i}")
      return vec
    return self.alu(u)

  def alu(self, u: UOp) -> str:
    op, dt = u.op, u.dtype
    srcs = [self.val(s) for s in u.src]
    st = u.src[0].dtype
    t = ltype(st)
    if op is Ops.WHERE: return self.inst(f"select {ltype(u.src[0].dtype)} {srcs[0]}, {ltype(dt)} {srcs[1]}, {ltype(dt)} {srcs[2]}")
    if op is Ops.CMPNE and u.src[1].op is Ops.CONST and u.src[1].arg is True and st.scalar() == dtypes.bool:
      return self.inst(f"xor {t} {srcs[0]}, {self.const(True, st)}")  # logical not
    if op is Ops.NEG:
      return self.inst(f"fneg {t} {srcs[0]}") if _is_float(st) else self.inst(f"sub {t} {self.const(0, st)}, {srcs[0]}")
    if op is Ops.RECIP: return self.inst(f"fdiv {t} {self.const(1.0, st)}, {srcs[0]}")
    if op is Ops.EXP2 and st.count > 1 and st.scalar() == dtypes.float32:  # all lanes at once (vector_exp2.py)
      self.vector_exp2.add(st.count)
      return self.inst(f"call {t} {vector_exp2.name(st.count)}({t} {srcs[0]})")
    if op is Ops.MULACC:  # a*b+c rounded once: only where fused_multiply_add(dt) said so
      fn = f"@llvm.fma.{(f'v{st.count}' if st.count > 1 else '') + _FLOAT_SUFFIX[st.scalar()]}"
      self.declares.add(f"declare {t} {fn}({t}, {t}, {t})")
      return self.inst(f"call {t} {fn}({t} {srcs[0]}, {t} {srcs[1]}, {t} {srcs[2]})")
    if op in _INTRINSICS:
      if not _is_float(st): raise CompileError(f"LLVM computes {op} on float32 and float64, not {st}")
      suffix = (f"v{st.count}" if st.count > 1 else "") + _FLOAT_SUFFIX[st.scalar()]
      fn = f"@llvm.{_INTRINSICS[op]}.{suffix}"
      self.declares.add(f"declare {t} {fn}({t})")
      return self.inst(f"call {t} {fn}({t} {srcs[0]})")
    if op in (Ops.IDIV, Ops.MOD): return self.int_division(u, srcs)
    names = _BINARY.get(op)
    if names is None: raise CompileError(f"LLVMRenderer has no spelling for {op}")
    spelled = names[2] if _is_float(st) else names[1] if _unsigned(st) else names[0]
    if spelled is None: raise CompileError(f"LLVM has no {op} of {st}")
    b = srcs[1]
    if op in (Ops.SHL, Ops.SHR) and ltype(u.src[1].dtype) != t: b = self.cast(b, u.src[1].dtype, st)  # LLVM shifts by its own type
    return self.inst(f"{spelled} {t} {srcs[0]}, {b}")

  def int_division(self, u: UOp, srcs: list[str]) -> str:
    """IDIV/MOD with kc's answers where LLVM's are undefined: x // 0 == x % 0 == 0, MIN // -1 == MIN (wrapping),
    MIN % -1 == 0. Only a divisor whose range includes 0 (or -1, for a dividend that may be MIN) is guarded: index math
    divides by positive constants and keeps the plain instruction."""
    dt, divisor = u.dtype, u.src[1]
    t, signed = ltype(dt), not _unsigned(dt)
    spelled = ("sdiv" if signed else "udiv") if u.op is Ops.IDIV else ("srem" if signed else "urem")
    a, b = srcs
    may_be_zero = not (divisor.vmin > 0 or divisor.vmax < 0)
    may_overflow = signed and divisor.vmin <= -1 <= divisor.vmax and u.src[0].vmin <= dtypes.min(dt)
    if not may_be_zero and not may_overflow: return self.inst(f"{spelled} {t} {a}, {b}")
    bad = zero = self.inst(f"icmp eq {t} {b}, 0") if may_be_zero else None
    minus_one = self.inst(f"icmp eq {t} {b}, -1") if may_overflow else None
    if zero is None: bad = minus_one
    elif minus_one is not None: bad = self.inst(f"or i1 {zero}, {minus_one}")
    safe = self.inst(f"select i1 {bad}, {t} 1, {t} {b}")
    q = self.inst(f"{spelled} {t} {a}, {safe}")
    if u.op is Ops.MOD: return self.inst(f"select i1 {bad}, {t} 0, {t} {q}")
    if minus_one is not None: q = self.inst(f"select i1 {minus_one}, {t} {self.inst(f'sub {t} 0, {a}')}, {t} {q}")
    return self.inst(f"select i1 {zero}, {t} 0, {t} {q}") if zero is not None else q

  def cast(self, x: str, src: DType, dst: DType) -> str:
    """`x` of `src` converted to `dst` as C converts (float -> int truncates; anything -> bool is != 0); half,
    bfloat16 and fp8 through their float value (small_floats.py)."""
    s, d = src.scalar(), dst.scalar()
    if s == d: return x
    if s in _HELD:
      if src.count > 1: raise CompileError(f"LLVM converts {s} lane by lane only, not as {src}")
      self.small.add(s.name)
      return self.cast(self.inst(f"call float {small_floats.to_f32(s.name)}({_HELD[s]} {x})"), dtypes.float32, dst)
    if d in _HELD:
      if dst.count > 1: raise CompileError(f"LLVM converts to {d} lane by lane only, not as {dst}")
      self.small.add(d.name)
      # a double to half or fp8 rounds to odd first, so that double -> float -> small float rounds as one rounding
      # would (numpy's half rounds a double once); bfloat16 goes through float as ml_dtypes and kc's codec take it
      if s == dtypes.float64 and d != dtypes.bfloat16:
        self.round_to_odd = True
        f = self.inst(f"call float {small_floats.ROUND_TO_ODD}(double {x})")
      else: f = self.cast(x, src, dtypes.float32)
      return self.inst(f"call {_HELD[d]} {small_floats.from_f32(d.name)}(float {f})")
    ts, td = ltype(src), ltype(dst)
    if d == dtypes.bool:
      return self.inst(f"fcmp une {ts} {x}, zeroinitializer" if _is_float(src) else f"icmp ne {ts} {x}, zeroinitializer")
    if _is_float(src) and _is_float(dst):
      return self.inst(f"{'fpext' if d.itemsize > s.itemsize else 'fptrunc'} {ts} {x} to {td}")
    if _is_float(src): return self.inst(f"{'fptoui' if _unsigned(dst) else 'fptosi'} {ts} {x} to {td}")
    if _is_float(dst): return self.inst(f"{'uitofp' if _unsigned(src) else 'sitofp'} {ts} {x} to {td}")
    bs, bd = _int_bits(src), _int_bits(dst)
    if bs == bd: return x
    if bd < bs: return self.inst(f"trunc {ts} {x} to {td}")
    return self.inst(f"{'zext' if _unsigned(src) else 'sext'} {ts} {x} to {td}")


def _as_float32(v) -> float:
  """v rounded to the nearest float32 (an LLVM float constant must be exactly a float)."""
  import struct
  try: return struct.unpack("<f", struct.pack("<f", float(v)))[0]
  except OverflowError: return float("inf") if float(v) > 0 else float("-inf")
