"""The EMU device: runs the exact linear UOps a Renderer receives with numpy, so that the lowering for any backend
(a GPU dialect, any plugin) can be checked numerically on a CPU.

The "source" EMU compiles is the UOp list itself (serialized by EmuRenderer.render); its runtime interprets it.
All threads of a batch of work-groups run in lock-step: each UOp's value is a numpy array over the lanes
(shape (lanes,), or (lanes, n) for an n-wide vector; a value every lane shares may stay a 0-d array). RANGE
loops repeat their body, IF blocks and per-lane loop bounds narrow the mask of active lanes, DEFINE_LOCAL memory
is kept per work-group, and BARRIER checks that every thread of a group reaches it. A CPU-style lowering (no
launch indices) has its output axes as loops instead; their iterations are independent, so EMU runs those as
lanes too.

EMU doubles as a checker. Where real hardware would silently misbehave it raises an EmulatorError naming the
kernel and the UOp: out-of-bounds or misaligned accesses, a thread that skips a barrier its group reaches, a
local read of an element another thread wrote since the last barrier (or that nobody wrote), two threads
storing different values to one element, launch sizes beyond the renderer's limits, an op it does not know.

`KC_EMULATE=NAME` or `kc.Device["EMU"].impersonate(NAME)` makes EMU lower kernels with the registered device
NAME's Renderer (its limits, locals, float4, tensor cores and dialect rewrites); only the final rendering step
is EMU's. Without it EMU uses EmuRenderer, a generic GPU-like target with locals."""
from __future__ import annotations
import base64, functools, io, pickle, time, zlib
from dataclasses import dataclass
from typing import Callable, Optional, Sequence
import numpy as np
from kc.runtime.device import CompiledDevice, Compiler, HostAllocator, raw_buffers
from kc.runtime.plugins import PLUGIN_API_VERSION, BackendSpec, hookimpl
from kc.ir.codec import decode, encode, round_to, storage_np, value_np
from kc.ir.dtype import DType, ImageDType, dtypes
from kc.errors import CompileError, KcError, UnknownDeviceError
from kc.config import read
from kc.helpers import distribution_version, prod
from kc.renderer import Renderer, TensorCore
from kc.renderer.cstyle import CStyleLanguage
from kc.ir.symbolic import sym_infer
from kc.ir.uop import GroupOp, Ops, UOp

DEVICE = "EMU"
PRIORITY = -1000  # below every real device: EMU is never the default while anything else can run
FORMAT = "kc-emu-1"  # the tag of the serialized program line; bump when the payload changes shape
LANES_PER_BATCH = 1 << 14  # whole work-groups are batched up to this many threads, to bound memory
_INDEX_NP = np.dtype(np.int32)  # a launch index's dtype, unless the kernel has wide (int64) indices


# ---------------------------------------------------------------------------------------------------------- errors

class EmulatorError(KcError, RuntimeError):
  """The emulated kernel did something a real device would get wrong; the message names the kernel and the UOp."""


class OutOfBoundsError(EmulatorError, IndexError):
  """A load or store outside its buffer (or a local buffer beyond its declared size), or a misaligned vector access."""


class BarrierError(EmulatorError):
  """Some threads of a work-group reach a BARRIER that others of the same group skip."""


class MisalignedAccessError(EmulatorError):
  """A vector access at an address that is not a multiple of its size, on an impersonated device whose vector loads
  need that (a GPU's misaligned-address fault): a kc.Buffer view at an odd byte offset, loaded as float4."""


class DataRaceError(EmulatorError):
  """Threads that read or write the same element without a barrier between them (or read what nobody wrote)."""


class LaunchError(EmulatorError, ValueError):
  """Launch sizes, buffers or variable values that do not fit the kernel or the renderer's limits."""


class UnsupportedOpError(EmulatorError, CompileError):
  """A UOp (or dtype) the interpreter does not run. It is a CompileError too: EMU's compiler rejects the program,
  as a backend compiler rejects source it cannot build."""


# ---------------------------------------------------------------------------------------------------------- serialization

_ALLOWED_GLOBALS = {("kc.ir.uop", "UOp"), ("kc.ir.uop", "Ops"), ("kc.ir.dtype", "_intern"), ("kc.ir.dtype", "DType"),
                    ("kc.ir.dtype", "PtrDType"), ("kc.ir.dtype", "ImageDType"), ("kc.renderer", "WMMAArg")}


class _UOpUnpickler(pickle.Unpickler):
  """Unpickles UOp lists only: a program is data, and loading one must never import or call anything else."""

  def find_class(self, module, name):
    if (module, name) in _ALLOWED_GLOBALS: return super().find_class(module, name)
    raise pickle.UnpicklingError(f"a serialized EMU program may only hold UOps and dtypes, not {module}.{name}")


def describe(pc: int, u: UOp, pos: dict) -> str:
  """One line of the listing: position, op, dtype, source positions, arg."""
  srcs = ",".join(str(pos.get(s, "?")) for s in u.src)
  arg = u.arg.render() if isinstance(u.arg, UOp) else repr(u.arg)
  return f"{pc:4d} {u.op.name:<14s} {str(u.dtype):<28s} [{srcs}] {arg}"


def serialize(name: str, uops: list[UOp]) -> str:
  """The EMU 'source': a readable listing in comments (for DEBUG and `kc render`) and one line holding the
  program itself, which is all the compiler reads."""
  listing, pos = [f"# EMU program {name}: {len(uops)} uops"], {}
  for i, u in enumerate(uops):
    listing.append("# " + describe(i, u, pos))
    pos.setdefault(u, i)
  payload = base64.b64encode(zlib.compress(pickle.dumps((name, list(uops)), protocol=pickle.HIGHEST_PROTOCOL))).decode()
  return "\n".join(listing + [f"{FORMAT} {payload}"]) + "\n"


def load_program(data: bytes) -> tuple[str, list[UOp]]:
  """(name, uops) from the bytes EmuCompiler made."""
  name, uops = _UOpUnpickler(io.BytesIO(zlib.decompress(data))).load()
  if not isinstance(name, str) or not isinstance(uops, list) or not all(isinstance(u, UOp) for u in uops):
    raise pickle.UnpicklingError("the payload is not a (name, [UOp, ...]) pair")
  return name, uops


# ---------------------------------------------------------------------------------------------------------- renderer

# The generic renderer's tensor cores: small enough to read in a test, with fragments that cover the matrices.
# 4 threads per warp; N=M=K=4 with the rest of N and M upcast (half in, float out), and a 2x2x2 float one.
BUILTIN_TENSOR_CORES = [
  TensorCore(dims=(4, 4, 4), dtype_in=dtypes.half, dtype_out=dtypes.float, threads=[(0, 2), (1, 2)], reduce_axes=[(0, 4)],
             upcast_axes=([(0, 4), (2, 2)], [(0, 4), (1, 2)], [(1, 2), (2, 2)])),
  TensorCore(dims=(2, 2, 2), dtype_in=dtypes.float, dtype_out=dtypes.float, threads=[(0, 2), (1, 2)], reduce_axes=[(0, 2)],
             upcast_axes=([(0, 2)], [(0, 2)], []), opts_seq=("LC", "UP")),
]


@functools.lru_cache(maxsize=None)
def fragment_layout(tc: TensorCore):
  from kc.kernel.tc_layout import derive_fragment_layout
  return derive_fragment_layout(tc)


class EmuRenderer(Renderer):
  """The generic target EMU lowers for when it impersonates no device: GPU-like, with locals and float4. Every op
  that the C-style backends spell, the interpreter runs natively (transcendentals through numpy)."""
  device = DEVICE
  impersonates: Optional[str] = None
  has_local = True
  has_shared = True
  supports_float4 = True
  aligned_vectors = False  # impersonating a device, EMU checks that device's rule (Limits.aligned_vectors)
  global_max = (65535, 65535, 65535)
  local_max = (256, 256, 64)
  shared_max = 32768
  tensor_cores = BUILTIN_TENSOR_CORES
  code_for_op = dict(CStyleLanguage.code_for_op)

  def render(self, name: str, uops: list) -> str: return serialize(name, uops)


def _render_for_emu(self, name: str, uops: list) -> str: return serialize(name, uops)


@functools.lru_cache(maxsize=None)
def _impersonating_class(cls: type) -> type:
  # a subclass keeps every declaration and dialect rewrite of the impersonated renderer (class attributes and
  # methods alike); only the last step, rendering, is EMU's
  return type(f"Emu{cls.__name__}", (cls,), {"render": _render_for_emu, "device": DEVICE, "__module__": __name__,
                                            "__doc__": f"{cls.__name__} lowering, EMU rendering."})


def impersonating(target: Renderer) -> Renderer:
  """A renderer that lowers exactly like `target` (limits set on the instance included) but renders for EMU."""
  r = object.__new__(_impersonating_class(type(target)))
  r.__dict__.update(vars(target))
  r.impersonates = target.device
  r.device = DEVICE
  r.has_images = False  # EMU does not emulate images: kernels lowered for it must not use them
  return r


# ---------------------------------------------------------------------------------------------------------- compiler

class EmuCompiler(Compiler):
  """Checks the serialized program and returns its payload. Nothing is cached on disk: decoding the payload is
  cheaper than reading a cache entry, and an entry would only store the source a second time."""

  def compile(self, src: str) -> bytes:
    if not isinstance(src, str): raise CompileError(f"source must be a str, got {type(src).__name__}", src=str(src))
    return self.compile_uncached(src)

  def compile_uncached(self, src: str) -> bytes:
    line = next((ln for ln in reversed(src.splitlines()) if ln.startswith(FORMAT + " ")), None)
    if line is None: raise CompileError(f"not an EMU program: no '{FORMAT} ...' line (render it with EMU's renderer)", src=src)
    try:
      data = base64.b64decode(line[len(FORMAT) + 1:], validate=True)
      name, uops = load_program(data)
    except Exception as e:
      raise CompileError(f"the EMU program is damaged: {type(e).__name__}: {e}", src=src) from e
    _Plan(name, uops)  # unknown ops fail here, at compile time, like a compiler rejecting source
    return data


# ---------------------------------------------------------------------------------------------------------- values

# the types numpy lacks, computed in float32 and rounded to their precision after every op that produces one
# (kc.ir.codec.round_to: bfloat16 goes through float32 first, fp8 rounds a float64 once)
_IN_FLOAT32 = frozenset({dtypes.bfloat16, *dtypes.fp8s})


def _fix(dt: DType, fn: Callable) -> Callable:
  """`fn` with its result held in `dt` exactly: the numpy type, and bfloat16 / fp8 rounding."""
  vnp = value_np(dt)
  if dt.scalar() in _IN_FLOAT32: return lambda *a: round_to(np.asarray(fn(*a), dtype=np.float32), dt)
  return lambda *a: np.asarray(fn(*a)).astype(vnp, copy=False)


def _c_idiv(a, b):
  # C truncates toward zero; a - fmod(a, b) is an exact multiple of b, so floor division of it is exact
  return (a - np.fmod(a, b)) // np.where(b == 0, 1, b) * (b != 0)


def _shift(fn):
  return lambda a, b: fn(a, np.asarray(b).astype(np.asarray(a).dtype))


def _neg(a):
  a = np.asarray(a)
  return np.logical_not(a) if a.dtype == np.bool_ else np.negative(a)


def _where(c, a, b):
  c = np.asarray(c)
  if np.ndim(a) == 2 or np.ndim(b) == 2: c = c[..., None] if c.ndim < 2 else c  # a scalar condition picks whole vectors
  return np.where(c, a, b)


# MAX: a NaN in either operand wins, as kc's rewrite of MAX for the renderers that do not spell it defines it
_ALU: dict[Ops, Callable] = {
  Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.MAX: np.maximum, Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal,
  Ops.AND: np.bitwise_and, Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor, Ops.SHL: _shift(np.left_shift),
  Ops.SHR: _shift(np.right_shift), Ops.FDIV: np.divide, Ops.POW: np.power, Ops.NEG: _neg, Ops.RECIP: np.reciprocal,
  Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin, Ops.SQRT: np.sqrt, Ops.WHERE: _where,
  Ops.MULACC: lambda a, b, c: np.add(np.multiply(a, b), c),
}


def alu_function(op: Ops, dt: DType, src_dt: DType) -> Callable:
  """The numpy function of an ALU UOp of result dtype `dt` whose (first) operand has dtype `src_dt`."""
  is_int, is_bool = dtypes.is_int(dt), dtypes.is_bool(dt)
  # x // 0 and x % 0 are 0 for ints (numpy's answer, which every backend renders), MIN // -1 wraps to MIN
  if op is Ops.IDIV: fn = (lambda a, b: a // np.where(b == 0, 1, b) * (b != 0)) if dtypes.is_unsigned(dt) else _c_idiv
  elif op is Ops.MOD: fn = np.fmod  # C: the remainder has the dividend's sign; np.fmod gives 0 for a 0 divisor
  elif op is Ops.SUB: fn = np.bitwise_xor if is_bool else np.subtract  # bool - bool, read back as bool, is xor
  elif op in _ALU: fn = _ALU[op]
  else: raise UnsupportedOpError(f"EMU does not know the ALU op {op.name}")
  if op in GroupOp.Comparison:
    if src_dt.scalar() in _IN_FLOAT32: return fn  # compared as the float32 values they are
    return lambda a, b: np.asarray(fn(a, b))
  if op in (Ops.IDIV, Ops.MOD) and not is_int: raise UnsupportedOpError(f"EMU runs {op.name} on ints only, got {dt}")
  return _fix(dt, fn)


def cast_function(src: DType, dt: DType) -> Callable:
  """A value conversion with C's rules: floats to ints truncate, anything to bool is `!= 0`."""
  if dt.scalar() in _IN_FLOAT32: return lambda x: round_to(x, dt)
  vnp = value_np(dt)
  return lambda x: np.asarray(x).astype(vnp)


def bitcast_function(src: DType, dt: DType) -> Callable:
  """Reinterpretation of the bits; the lane counts may differ (float -> half2) when the sizes match."""
  if src.itemsize != dt.itemsize: raise UnsupportedOpError(f"BITCAST from {src} to {dt} changes the size")
  def bitcast(x):
    bits = encode(x, src)
    if src.count == 1: bits = bits[..., None]
    out = np.ascontiguousarray(bits).view(storage_np(dt))
    if dt.count == 1: out = out[..., 0]
    elif out.ndim == 1: out = out[None]
    return decode(out, dt)
  return bitcast


def const_value(u: UOp) -> np.ndarray:
  v = np.asarray(u.arg, dtype=np.float64 if isinstance(u.arg, float) else None)
  v = round_to(v, u.dtype) if u.dtype.scalar() in _IN_FLOAT32 else v.astype(value_np(u.dtype))
  return np.full((1, u.dtype.count), v) if u.dtype.count > 1 else v


def vectorize(*xs):
  out = np.stack(np.broadcast_arrays(*xs), axis=-1)
  return out[None] if out.ndim == 1 else out


def gep_function(lanes: tuple) -> Callable:
  if len(lanes) == 1: return lambda x: np.asarray(x)[..., lanes[0]]
  return lambda x: np.asarray(x)[..., list(lanes)]


# ---------------------------------------------------------------------------------------------------------- the plan


_DEFINITIONS = {Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.DEFINE_LOCAL, Ops.CONST, Ops.SPECIAL}
_VALUE_OPS = GroupOp.ALU | {Ops.CAST, Ops.BITCAST, Ops.VECTORIZE, Ops.GEP}
_KNOWN = _VALUE_OPS | {Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.DEFINE_LOCAL, Ops.CONST, Ops.SPECIAL, Ops.RANGE, Ops.ENDRANGE,
                       Ops.DEFINE_ACC, Ops.ASSIGN, Ops.INDEX, Ops.LOAD, Ops.STORE, Ops.IF, Ops.ENDIF, Ops.BARRIER, Ops.NOOP, Ops.WMMA}


class _Plan:
  """A program prepared for interpretation: source positions (uses of an ASSIGN read its accumulator), matching
  block starts and ends, the numpy function of each value op, and the kernel's buffers, variables and indices."""

  def __init__(self, name: str, uops: list[UOp]):
    self.name, self.uops = name, uops
    self.srcs: list[tuple[int, ...]] = []
    self.jump: dict[int, int] = {}
    seen: dict[UOp, int] = {}  # where each UOp's value lives: a UOp may appear more than once (an IF per gated store)
    opened: list[int] = []
    for pc, u in enumerate(uops):
      if u.op not in _KNOWN:
        raise UnsupportedOpError(self.where(pc, f"EMU cannot run {u.op.name}: it interprets {', '.join(sorted(o.name for o in _KNOWN))}"))
      if isinstance(u.dtype, ImageDType): raise UnsupportedOpError(self.where(pc, "EMU does not emulate images"))
      self.srcs.append(self._sources(pc, u, seen))
      if u.op in (Ops.RANGE, Ops.IF): opened.append(pc)
      elif u.op in (Ops.ENDRANGE, Ops.ENDIF):
        if not opened or not u.src or uops[opened[-1]] is not u.src[0]:
          raise UnsupportedOpError(self.where(pc, f"{u.op.name} does not close the innermost open block"))
        start = opened.pop()
        self.jump[start], self.jump[pc] = pc, start
      if u.op not in _DEFINITIONS or u not in seen: seen[u] = pc  # a definition keeps its first place (one buffer, one value)
    if opened: raise UnsupportedOpError(self.where(opened[-1], f"{uops[opened[-1]].op.name} is never closed"))
    firsts = set(seen.values())
    self.fns: dict[int, Callable] = {pc: self._function(pc, u) for pc, u in enumerate(uops) if u.op in _VALUE_OPS}
    self.consts = {pc: const_value(u) for pc, u in enumerate(uops) if u.op is Ops.CONST}
    self.globals = [pc for pc, u in enumerate(uops) if u.op is Ops.DEFINE_GLOBAL and pc in firsts]
    self.vars = sorted((pc for pc, u in enumerate(uops) if u.op is Ops.DEFINE_VAR and pc in firsts), key=lambda pc: uops[pc].arg)
    self.locals = [pc for pc, u in enumerate(uops) if u.op is Ops.DEFINE_LOCAL and pc in firsts]
    self.specials = [pc for pc, u in enumerate(uops) if u.op is Ops.SPECIAL and pc in firsts]
    self.local_bytes = sum(uops[pc].arg[1] * uops[pc].dtype.base.itemsize for pc in self.locals)
    self.parallel_loops = self._parallel_loops()

  def _parallel_loops(self) -> list[int]:
    """The outermost RANGEs over output axes of a program without launch indices (a CPU-style lowering). Their
    iterations are independent by construction (a GPU lowering launches them as threads), so EMU runs them as
    lanes in lock-step rather than one after another. Only loops from 0 to a constant or a Variable qualify, and
    only while nothing with a lasting effect (an accumulator, a store, a block) comes before them."""
    if self.specials: return []
    loops: list[int] = []
    for pc, u in enumerate(self.uops):
      if u.op is Ops.RANGE:
        start, end = (self.uops[s] for s in self.srcs[pc])
        if not (isinstance(u.arg, tuple) and len(u.arg) == 2 and u.arg[1] == 0): break  # kind 0: an output axis
        if start.op is not Ops.CONST or start.arg != 0: break
        if end.op is not Ops.CONST and _loop_variable(end) is None: break
        loops.append(pc)
      elif u.op in (Ops.DEFINE_ACC, Ops.ASSIGN, Ops.STORE, Ops.IF, Ops.ENDIF, Ops.ENDRANGE, Ops.BARRIER, Ops.DEFINE_LOCAL): break
    return loops

  def _sources(self, pc: int, u: UOp, seen: dict[UOp, int]) -> tuple[int, ...]:
    """Where the values of u's sources live. A use of an ASSIGN reads its accumulator; a DEFINE_ACC lists the loops
    it accumulates over, which come later, but only its identity value is read."""
    srcs = u.src[:1] if u.op is Ops.DEFINE_ACC else u.src
    out = []
    for s in srcs:
      target = s.src[0] if s.op is Ops.ASSIGN else s
      if target not in seen: raise UnsupportedOpError(self.where(pc, f"uses a {s.op.name} that does not come earlier in the program"))
      out.append(seen[target])
    return tuple(out)

  def where(self, pc: int, msg: str) -> str:
    """`msg` prefixed with the kernel and the UOp it is about."""
    u = self.uops[pc]
    return f"kernel {self.name}: uop {pc} ({u.op.name} {u.dtype}): {msg}"

  def _function(self, pc: int, u: UOp) -> Callable:
    try:
      if u.op in GroupOp.ALU: return alu_function(u.op, u.dtype, u.src[0].dtype)
      if u.op is Ops.CAST: return cast_function(u.src[0].dtype, u.dtype)
      if u.op is Ops.BITCAST: return bitcast_function(u.src[0].dtype, u.dtype)
      if u.op is Ops.VECTORIZE: return vectorize
      return gep_function(tuple(u.arg))
    except UnsupportedOpError as e: raise UnsupportedOpError(self.where(pc, str(e))) from None


# ---------------------------------------------------------------------------------------------------------- launch geometry

@dataclass(frozen=True)
class Limits:
  """What the renderer a program was lowered for promised about launches."""
  renderer: str
  global_max: Optional[tuple[int, ...]]
  local_max: Optional[tuple[int, ...]]
  shared_max: int
  tensor_cores: tuple = ()  # the renderer's TensorCores: WMMA runs with their fragment layouts
  aligned_vectors: bool = False  # a vector access needs an address that is a multiple of its size (CUDA's float4)


def _dims(x: Optional[Sequence[int]], what: str, name: str) -> tuple[int, int, int]:
  if x is None: return (1, 1, 1)
  dims = tuple(int(v) for v in x) + (1,) * (3 - len(x))
  if len(dims) != 3 or any(d < 1 for d in dims): raise LaunchError(f"kernel {name}: {what} size {list(x)} must be 1 to 3 positive ints")
  return dims  # type: ignore[return-value]


class _Batch:
  """A run of whole work-groups in lock-step: lanes are group-major, x fastest within a group."""

  def __init__(self, groups: np.ndarray, local: tuple[int, int, int], iterations: Optional[np.ndarray] = None):
    self.groups, self.local = groups, local                  # groups: (G, 3) work-group coordinates
    self.iterations = iterations                             # (G, loops): the parallel-loop indices each group runs
    self.threads = prod(local)
    self.num_groups = len(groups)
    self.lanes = self.num_groups * self.threads
    tid = np.arange(self.threads)
    self.thread_coords = np.stack([tid % local[0], tid // local[0] % local[1], tid // (local[0] * local[1])], axis=1)
    self.group_of_lane = np.repeat(np.arange(self.num_groups), self.threads)
    self.thread_of_lane = np.tile(tid, self.num_groups)

  def special(self, name: str, dtype: np.dtype = _INDEX_NP) -> np.ndarray:
    """The launch index `name` of every lane, in the SPECIAL's dtype (int32, or int64 in a kernel with wide indices)."""
    axis = int(name[-1])
    gid = np.repeat(self.groups[:, axis], self.threads).astype(dtype)
    lid = np.tile(self.thread_coords[:, axis], self.num_groups).astype(dtype)
    if name.startswith("gidx"): return gid
    if name.startswith("lidx"): return lid
    return (gid * self.local[axis] + lid).astype(dtype)

  def lane_name(self, lane: int) -> str:
    if self.iterations is not None: return f"loop iteration ({','.join(str(int(i)) for i in self.iterations[lane // self.threads])})"
    g, t = self.groups[lane // self.threads], self.thread_coords[lane % self.threads]
    return f"work-group ({g[0]},{g[1]},{g[2]}) thread ({t[0]},{t[1]},{t[2]})"


# ---------------------------------------------------------------------------------------------------------- memory

class _Memory:
  """One buffer the kernel addresses: its elements (in storage dtype) and, for local memory, one row per
  work-group plus who wrote each element since the last barrier (-2 nobody yet, -1 published by a barrier)."""

  def __init__(self, label: str, data: np.ndarray, dtype: DType, size: int, local: bool, batch: _Batch):
    self.label, self.data, self.dtype, self.size, self.local = label, data, dtype, size, local
    self.writer = np.full(data.shape, -2, dtype=np.int32) if local else None
    self.batch = batch

  def flat(self, lanes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    return self.batch.group_of_lane[lanes][:, None] * self.size + offsets if self.local else offsets

  def publish(self, groups: np.ndarray):
    """A barrier the threads of `groups` passed: what they wrote is now everyone's to read."""
    rows = self.writer.reshape(self.batch.num_groups, self.size)[groups]
    rows[rows >= 0] = -1
    self.writer.reshape(self.batch.num_groups, self.size)[groups] = rows


# ---------------------------------------------------------------------------------------------------------- the interpreter

class _Run:
  """One batch of work-groups executing the plan."""

  def __init__(self, plan: _Plan, batch: _Batch, buffers: list[tuple[np.ndarray, DType]], var_vals: list[int], limits: Optional[Limits] = None):
    self.plan, self.batch = plan, batch
    self.tensor_cores = limits.tensor_cores if limits is not None else ()
    self.aligned_vectors = limits is not None and limits.aligned_vectors
    self.vals: list = [None] * len(plan.uops)
    self.memory: dict[int, _Memory] = {}
    for i, (pc, (data, dt)) in enumerate(zip(plan.globals, buffers)):
      self.memory[pc] = _Memory(f"data{plan.uops[pc].arg} (argument {i}, {len(data)} x {dt.name})", data, dt, len(data), False, batch)
    for pc in plan.locals:
      u = plan.uops[pc]
      size = u.arg[1]
      data = np.zeros(batch.num_groups * size, dtype=storage_np(u.dtype.base))
      self.memory[pc] = _Memory(f"local {u.arg[0]} ({size} x {u.dtype.base.name})", data, u.dtype.base, size, True, batch)
    for pc, v in zip(plan.vars, var_vals): self.vals[pc] = np.asarray(v, dtype=np.int32)
    for pc, v in plan.consts.items(): self.vals[pc] = v
    for pc in plan.specials: self.vals[pc] = batch.special(plan.uops[pc].arg[0], value_np(plan.uops[pc].dtype))
    self.lane_loop_blocks: set[int] = set()  # the RANGE/ENDRANGE of parallel loops run as lanes: nothing to do there
    if batch.iterations is not None:
      for k, pc in enumerate(plan.parallel_loops):
        self.vals[pc] = np.repeat(batch.iterations[:, k], batch.threads).astype(value_np(plan.uops[pc].dtype))
        self.lane_loop_blocks.update((pc, plan.jump[pc]))

  def error(self, cls: type, pc: int, msg: str, lane: Optional[int] = None) -> EmulatorError:
    who = f" ({self.batch.lane_name(lane)})" if lane is not None else ""
    return cls(self.plan.where(pc, msg + who))

  def run(self):
    plan, vals, uops, srcs, fns = self.plan, self.vals, self.plan.uops, self.plan.srcs, self.plan.fns
    mask: Optional[np.ndarray] = None   # the active lanes, None when all are
    frames: list = []                   # per open block: (kind, pc, mask before it, loop end)
    pc, n = 0, len(uops)
    skip = self.lane_loop_blocks
    while pc < n:
      op = uops[pc].op
      if pc in skip: pass
      elif pc in fns:
        vals[pc] = fns[pc](*[vals[s] for s in srcs[pc]])
      elif op is Ops.INDEX:
        s = srcs[pc]
        vals[pc] = (s[0], vals[s[1]], vals[s[2]] if len(s) > 2 else None)
      elif op is Ops.LOAD: vals[pc] = self.load(pc, mask)
      elif op is Ops.STORE: self.store(pc, mask)
      elif op is Ops.DEFINE_ACC: vals[pc] = vals[srcs[pc][0]]
      elif op is Ops.ASSIGN:
        acc, new = srcs[pc]
        vals[acc] = new_val = vals[new] if mask is None else _where(mask, vals[new], vals[acc])
        vals[pc] = new_val
      elif op is Ops.RANGE:
        start, end = vals[srcs[pc][0]], vals[srcs[pc][1]]
        counter_np = value_np(uops[pc].dtype)  # int32, or int64 in a kernel with wide indices
        if np.size(start) == 1 and np.size(end) == 1:  # bounds every lane shares: one counter
          counter, end = np.asarray(start, dtype=counter_np).reshape(()), int(np.asarray(end).reshape(()))
          if int(counter) >= end:
            pc = plan.jump[pc] + 1
            continue
          frames.append(("range", pc, mask, end))
        else:  # bounds that differ per lane: lanes leave the loop as they reach their end
          counter = np.broadcast_to(np.asarray(start, dtype=counter_np), (self.batch.lanes,)).copy()
          active = counter < end if mask is None else mask & (counter < end)
          if not active.any():
            pc = plan.jump[pc] + 1
            continue
          frames.append(("range", pc, mask, end))
          mask = active
        vals[pc] = counter
      elif op is Ops.ENDRANGE:
        _, start_pc, outer, end = frames[-1]
        counter = (vals[start_pc] + 1).astype(vals[start_pc].dtype)
        if isinstance(end, int):
          if int(counter) < end:
            vals[start_pc], pc = counter, start_pc + 1
            continue
        else:
          active = counter < end if outer is None else outer & (counter < end)
          if active.any():
            vals[start_pc], mask, pc = counter, active, start_pc + 1
            continue
        frames.pop()
        mask = outer
      elif op is Ops.IF:
        gate = np.asarray(vals[srcs[pc][0]], dtype=bool)
        active = gate if mask is None else mask & gate
        frames.append(("if", pc, mask, None))
        if not active.any():
          pc = plan.jump[pc]  # to the ENDIF, which closes the block
          continue
        mask = None if active.all() and np.size(active) in (1, self.batch.lanes) else np.broadcast_to(active, (self.batch.lanes,))
      elif op is Ops.ENDIF: mask = frames.pop()[2]
      elif op is Ops.BARRIER: self.barrier(pc, mask)
      elif op is Ops.WMMA: vals[pc] = self.wmma(pc, mask)
      # DEFINE_GLOBAL / DEFINE_VAR / DEFINE_LOCAL / CONST / SPECIAL were set up front; NOOP does nothing
      pc += 1

  def wmma(self, pc: int, mask: Optional[np.ndarray]) -> np.ndarray:
    """D = A*B + C for every warp: each warp's lanes put their fragments into the matrices where the tensor core's
    layout says, the warp multiplies, and each lane takes its slots of D back. Where a layout gives one element to
    several lanes (hardware never does; the small built-in tensor cores do), the lowest lane's copy is the one used:
    the others may differ in padding a PADTO added. A warp that runs with only some of its threads is an error."""
    u = self.plan.uops[pc]
    name, (N, M, K), dt_out, threads = u.arg.name, u.arg.dims, u.arg.dtype_out, u.arg.num_threads
    tc = next((t for t in self.tensor_cores if str(t) == name), None)
    if tc is None: raise self.error(UnsupportedOpError, pc, f"{name} is not a tensor core of the renderer this program was lowered for")
    lay = fragment_layout(tc)
    if self.batch.threads % threads:
      raise self.error(LaunchError, pc, f"a work-group of {self.batch.threads} threads is not whole warps of {threads}")
    if mask is not None and not np.all(np.asarray(mask).reshape(-1, threads).all(1) | ~np.asarray(mask).reshape(-1, threads).any(1)):
      raise self.error(BarrierError, pc, "WMMA runs with only some threads of a warp")
    lanes = self.batch.lanes
    a, b, c = (np.broadcast_to(np.asarray(self.vals[s]), (lanes, self.plan.uops[s].dtype.count)) for s in self.plan.srcs[pc])
    acc_np = np.float64 if dt_out == dtypes.float64 else np.float32
    warps = lanes // threads
    def matrix(frag, where, rows, cols):
      out = np.zeros((warps, rows, cols), dtype=acc_np)
      vals = frag.astype(acc_np).reshape(warps, threads, -1)
      for lane, slots in reversed(list(enumerate(where))):  # lower lanes last: their copy stays
        for slot, (r, q) in enumerate(slots): out[:, r, q] = vals[:, lane, slot]
      return out
    d = matrix(a, lay.a, M, K) @ matrix(b, lay.b, K, N) + matrix(c, lay.c, M, N)
    res = np.empty((warps, threads, len(lay.c[0])), dtype=acc_np)
    for lane, slots in enumerate(lay.c):
      for slot, (r, q) in enumerate(slots): res[:, lane, slot] = d[:, r, q]
    out = res.reshape(lanes, -1)
    return round_to(out.astype(np.float32), dt_out) if dt_out in _IN_FLOAT32 else out.astype(value_np(dt_out))

  # -- memory ---------------------------------------------------------------------------------------------------------

  def _active_lanes(self, mask: Optional[np.ndarray], gate) -> Optional[np.ndarray]:
    """Indices of the lanes that perform an access, None when all of them do."""
    if gate is not None:
      g = np.broadcast_to(np.asarray(gate, dtype=bool), (self.batch.lanes,))
      mask = g if mask is None else mask & g
    if mask is None: return None
    return np.flatnonzero(mask)

  def _addresses(self, pc: int, mem: _Memory, offsets, lanes: Optional[np.ndarray], width: int, verb: str) -> tuple[np.ndarray, np.ndarray]:
    """(lanes, element offsets of shape (k, width)) of an access, checked against the buffer's bounds."""
    all_offsets = np.broadcast_to(np.asarray(offsets, dtype=np.int64), (self.batch.lanes,))
    if lanes is None: lanes = np.arange(self.batch.lanes)
    off = all_offsets[lanes]
    bad = (off < 0) | (off + width > mem.size)
    if bad.any():
      i = int(np.argmax(bad))
      span = f"elements {off[i]}..{off[i] + width - 1}" if width > 1 else f"element {off[i]}"
      raise self.error(OutOfBoundsError, pc, f"{verb} {span} of {mem.label}, which has elements 0..{mem.size - 1}", int(lanes[i]))
    if width > 1 and (misaligned := off % width != 0).any():
      i = int(np.argmax(misaligned))
      raise self.error(OutOfBoundsError, pc, f"a {width}-wide vector access at element {off[i]} of {mem.label} is not {width}-aligned", int(lanes[i]))
    if width > 1 and self.aligned_vectors and not mem.local:
      size = width * mem.data.itemsize
      if (start := mem.data.ctypes.data % size) != 0:  # element offsets are width-aligned: the buffer's start decides
        raise self.error(MisalignedAccessError, pc, f"a {size}-byte vector access of {mem.label}, which starts {start} bytes "
                         f"past a multiple of {size} (a view at an odd byte offset): the impersonated device faults here", int(lanes[0]))
    return lanes, off[:, None] + np.arange(width)

  def load(self, pc: int, mask: Optional[np.ndarray]) -> np.ndarray:
    u = self.plan.uops[pc]
    buf_pc, offsets, gate = self.vals[self.plan.srcs[pc][0]]
    mem, width = self.memory[buf_pc], u.dtype.count
    lanes = self._active_lanes(mask, gate)
    shape = (self.batch.lanes, width) if width > 1 else (self.batch.lanes,)
    out = np.zeros(shape, dtype=value_np(u.dtype))  # gated-off lanes read 0
    if lanes is not None and len(lanes) == 0: return out
    lanes, addr = self._addresses(pc, mem, offsets, lanes, width, "reads")
    flat = mem.flat(lanes, addr)
    if mem.local: self._check_local_read(pc, mem, lanes, flat)
    data = decode(mem.data[flat], mem.dtype)
    out[lanes] = data if width > 1 else data[:, 0]
    return out

  def store(self, pc: int, mask: Optional[np.ndarray]):
    u = self.plan.uops[pc]
    buf_pc, offsets, gate = self.vals[self.plan.srcs[pc][0]]
    mem, width = self.memory[buf_pc], u.src[1].dtype.count
    lanes = self._active_lanes(mask, gate)
    if lanes is not None and len(lanes) == 0: return
    lanes, addr = self._addresses(pc, mem, offsets, lanes, width, "writes")
    shape = (self.batch.lanes, width) if width > 1 else (self.batch.lanes,)
    value = encode(np.broadcast_to(self.vals[self.plan.srcs[pc][1]], shape)[lanes], mem.dtype).reshape(len(lanes), width)
    flat = mem.flat(lanes, addr)
    self._check_store_conflicts(pc, mem, lanes, flat, value)
    if mem.local:
      self._check_local_write(pc, mem, lanes, flat)
      mem.writer[flat] = self.batch.thread_of_lane[lanes][:, None]
    mem.data[flat] = value

  def _check_store_conflicts(self, pc: int, mem: _Memory, lanes, flat, value):
    """Two threads storing different values to one element at the same store: on a real device either may win."""
    f, v = flat.reshape(-1), value.reshape(-1)
    if len(f) < 2: return
    order = np.argsort(f, kind="stable")
    fs, bits = f[order], np.ascontiguousarray(v[order]).view(f"u{v.dtype.itemsize}") if v.dtype != np.bool_ else v[order]
    clash = (fs[1:] == fs[:-1]) & (bits[1:] != bits[:-1])
    if clash.any():
      i = int(np.argmax(clash))
      a, b = (int(lanes[order[j] // flat.shape[1]]) for j in (i, i + 1))
      raise self.error(DataRaceError, pc, f"{self.batch.lane_name(a)} and {self.batch.lane_name(b)} store different values to "
                                          f"element {self._element(mem, fs[i])} of {mem.label} at the same time", None)

  def _element(self, mem: _Memory, flat: int) -> int: return int(flat) % mem.size if mem.local and mem.size else int(flat)

  def _check_local_read(self, pc: int, mem: _Memory, lanes, flat):
    writer, me = mem.writer[flat], self.batch.thread_of_lane[lanes][:, None]
    if (never := writer == -2).any():
      i = int(np.argmax(never.any(axis=1)))
      raise self.error(DataRaceError, pc, f"reads element {self._element(mem, flat[i][never[i]][0])} of {mem.label}, which no thread "
                                          "of the work-group wrote", int(lanes[i]))
    if (race := (writer >= 0) & (writer != me)).any():
      i = int(np.argmax(race.any(axis=1)))
      j = int(np.argmax(race[i]))
      raise self.error(DataRaceError, pc, f"reads element {self._element(mem, flat[i, j])} of {mem.label} that thread "
                                          f"{self._thread_name(int(writer[i, j]))} wrote with no BARRIER in between", int(lanes[i]))

  def _check_local_write(self, pc: int, mem: _Memory, lanes, flat):
    writer, me = mem.writer[flat], self.batch.thread_of_lane[lanes][:, None]
    if (race := (writer >= 0) & (writer != me)).any():
      i = int(np.argmax(race.any(axis=1)))
      j = int(np.argmax(race[i]))
      raise self.error(DataRaceError, pc, f"overwrites element {self._element(mem, flat[i, j])} of {mem.label} that thread "
                                          f"{self._thread_name(int(writer[i, j]))} wrote with no BARRIER in between", int(lanes[i]))

  def _thread_name(self, t: int) -> str:
    c = self.batch.thread_coords[t]
    return f"({c[0]},{c[1]},{c[2]})"

  def barrier(self, pc: int, mask: Optional[np.ndarray]):
    b = self.batch
    if mask is None: reached = np.ones(b.num_groups, dtype=bool)
    else:
      per_group = np.broadcast_to(mask, (b.lanes,)).reshape(b.num_groups, b.threads)
      reached, partial = per_group.all(axis=1), per_group.any(axis=1) & ~per_group.all(axis=1)
      if partial.any():
        g = int(np.argmax(partial))
        row = per_group[g]
        there, away = int(np.argmax(row)), int(np.argmax(~row))
        raise self.error(BarrierError, pc, f"{b.lane_name(g * b.threads + there)} reaches the BARRIER but "
                                           f"{b.lane_name(g * b.threads + away)} of the same work-group skips it")
    for pcl in self.plan.locals: self.memory[pcl].publish(reached)


# ---------------------------------------------------------------------------------------------------------- program handle

def _loop_variable(end: UOp) -> Optional[UOp]:
  """The Variable a loop bound is: itself, or converted to int64 indices (a CAST); None for any other bound."""
  if end.op is Ops.CAST and end.src[0].op is Ops.DEFINE_VAR: end = end.src[0]
  return end if end.op is Ops.DEFINE_VAR else None


def _grid(gdims) -> np.ndarray:
  """Every work-group's coordinates, x fastest."""
  return np.stack(np.meshgrid(*[np.arange(d) for d in gdims], indexing="ij"), axis=-1).transpose(2, 1, 0, 3).reshape(-1, 3)


class EmuProgram:
  """A loaded EMU program; calling it launches the kernel (the kc program-handle protocol)."""

  def __init__(self, name: str, lib: bytes, limits: Optional[Limits] = None):
    try: prog_name, uops = load_program(lib)
    except Exception as e: raise LaunchError(f"kernel {name}: the EMU binary does not load: {type(e).__name__}: {e}") from e
    self.name, self.plan = name, _Plan(prog_name, uops)
    self.limits = limits
    if limits is not None and self.plan.local_bytes > limits.shared_max:
      raise LaunchError(f"kernel {name} declares {self.plan.local_bytes} bytes of local memory, more than the shared_max "
                        f"{limits.shared_max} of the {limits.renderer} renderer")

  def __call__(self, *bufs, global_size: Optional[Sequence[int]] = (1, 1, 1), local_size: Optional[Sequence[int]] = (1, 1, 1),
               vals: Sequence[int] = (), wait: bool = False) -> Optional[float]:
    plan = self.plan
    start = time.perf_counter()
    buffers = self._buffers(bufs)
    var_vals = self._var_values(vals)
    gdims, ldims = _dims(global_size, "global", self.name), _dims(local_size, "local", self.name)
    self._check_launch(gdims, ldims, global_size, local_size, var_vals)
    groups, iterations = _grid(gdims), self._loop_iterations(gdims, ldims, var_vals)
    if iterations is not None: groups = np.zeros((len(iterations), 3), dtype=np.int64)
    per_batch = max(1, LANES_PER_BATCH // prod(ldims))
    with np.errstate(all="ignore"):  # wrap-around, inf and nan are the semantics here, not accidents
      for first in range(0, len(groups), per_batch):
        its = iterations[first:first + per_batch] if iterations is not None else None
        _Run(plan, _Batch(groups[first:first + per_batch], ldims, its), buffers, var_vals, self.limits).run()
    return time.perf_counter() - start if wait else None

  def _loop_iterations(self, gdims, ldims, var_vals: list[int]) -> Optional[np.ndarray]:
    """Every index tuple of the parallel loops, in loop order (the innermost fastest), or None to run them as
    loops: when there are none, when the launch has more than one thread, or when one has no iteration at all."""
    plan = self.plan
    if not plan.parallel_loops or prod(gdims) * prod(ldims) != 1: return None
    by_var = {plan.uops[pc]: v for pc, v in zip(plan.vars, var_vals)}
    sizes = []
    for pc in plan.parallel_loops:
      end = plan.uops[plan.srcs[pc][1]]
      sizes.append(end.arg if end.op is Ops.CONST else by_var[_loop_variable(end)])
    if any(s <= 0 for s in sizes): return None
    return np.stack(np.meshgrid(*[np.arange(s) for s in sizes], indexing="ij"), axis=-1).reshape(-1, len(sizes))

  def _buffers(self, bufs) -> list[tuple[np.ndarray, DType]]:
    plan = self.plan
    if len(bufs) != len(plan.globals):
      raise LaunchError(f"kernel {self.name} takes {len(plan.globals)} buffers, got {len(bufs)}")
    out = []
    for i, (pc, raw) in enumerate(zip(plan.globals, raw_buffers(bufs))):
      dt = plan.uops[pc].dtype.base
      arr = getattr(raw, "array", None)
      if not isinstance(arr, np.ndarray): raise LaunchError(f"kernel {self.name}: buffer {i} is not EMU (host) memory: {type(raw).__name__}")
      itemsize = storage_np(dt).itemsize
      usable = arr[:len(arr) - len(arr) % itemsize]
      out.append((usable.view(storage_np(dt)), dt))
    return out

  def _var_values(self, vals: Sequence[int]) -> list[int]:
    plan = self.plan
    if len(vals) != len(plan.vars):
      raise LaunchError(f"kernel {self.name} takes {len(plan.vars)} variable values "
                        f"({', '.join(plan.uops[pc].arg[0] for pc in plan.vars)}), got {len(vals)}")
    for pc, v in zip(plan.vars, vals):
      name, lo, hi = plan.uops[pc].arg
      if not lo <= int(v) <= hi: raise LaunchError(f"kernel {self.name}: variable {name}={v} is outside its range {lo}..{hi}")
    return [int(v) for v in vals]

  def _check_launch(self, gdims, ldims, global_size, local_size, var_vals: list[int]):
    """The launch matches the sizes the kernel's SPECIALs declare and the limits its renderer promised."""
    plan = self.plan
    by_name = {plan.uops[pc].arg[0]: v for pc, v in zip(plan.vars, var_vals)}
    for pc in plan.specials:
      name, size = plan.uops[pc].arg
      if isinstance(size, UOp) and any(v.arg[0] not in by_name for v in size.variables()):
        continue  # a launch dim set by a Variable the kernel does not take: only the launch knows its value
      want, axis = int(sym_infer(size, by_name)), int(name[-1])
      got = gdims[axis] if name.startswith("gidx") else ldims[axis] if name.startswith("lidx") else gdims[axis] * ldims[axis]
      if got != want:
        raise LaunchError(plan.where(pc, f"{name} counts {want}, but the launch (global {list(gdims)}, local {list(ldims)}) gives {got}"))
    if self.limits is None: return
    for dims, given, limit, what in ((gdims, global_size, self.limits.global_max, "global"), (ldims, local_size, self.limits.local_max, "local")):
      if given is None or limit is None: continue
      if any(d > m for d, m in zip(dims, limit)):
        raise LaunchError(f"kernel {self.name}: {what} size {list(dims)} exceeds the {what}_max {tuple(limit)} "
                          f"of the {self.limits.renderer} renderer")


# ---------------------------------------------------------------------------------------------------------- the device

class EmuDevice(CompiledDevice):
  """The EMU device. `impersonate(name)` swaps in the lowering of another registered device's renderer."""

  def __init__(self, impersonate: Optional[str] = None):
    super().__init__(DEVICE, HostAllocator(), EmuRenderer(), EmuCompiler(f"kc {distribution_version('kc-core')}"), self._load)
    self.impersonate(impersonate)

  @property
  def impersonating(self) -> Optional[str]:
    """The device whose renderer EMU lowers with, None for its generic renderer."""
    return getattr(self.renderer, "impersonates", None)

  def impersonate(self, name: Optional[str]) -> "EmuDevice":
    """Lower kernels with the Renderer of registered device `name` (limits, locals, float4, tensor cores, dialect
    rewrites); None (or "") goes back to EMU's generic renderer."""
    if not name:
      self.renderer = EmuRenderer()
      return self
    from kc.runtime.device import Device
    if Device.canonical(name) == DEVICE: raise KcError("EMU cannot impersonate itself: impersonate(None) gives its generic renderer")
    if name not in Device:
      raise UnknownDeviceError(f"EMU cannot impersonate {name!r}: no such device is registered (registered: {', '.join(Device.names())})")
    self.renderer = impersonating(Device.renderer(name))
    return self

  def _load(self, name: str, lib: bytes) -> EmuProgram:
    r = self.renderer
    limits = Limits(self.impersonating or DEVICE, r.global_max, r.local_max if r.has_local else None, r.shared_max, tuple(r.tensor_cores),
                    r.aligned_vectors)
    return EmuProgram(name, lib, limits)

  def __repr__(self): return f"<EmuDevice impersonating {self.impersonating or 'nothing (generic renderer)'}>"


def open_device() -> EmuDevice: return EmuDevice(read("KC_EMULATE") or None)


def backend_spec() -> BackendSpec:
  """The BackendSpec kc registers EMU with: always available, the lowest priority."""
  from kc.runtime.device import Device
  return BackendSpec(name=DEVICE, api_version=PLUGIN_API_VERSION, priority=PRIORITY, available=lambda: None, open=open_device,
                     renderer=lambda: Device[DEVICE].renderer, distribution="kc-core", version=distribution_version("kc-core"))


# EMU is registered like any backend: the kc distribution's own `kc.backends` entry point (pyproject.toml) names
# this module, so every installed kc has it whatever plugins are installed
@hookimpl
def kc_backends() -> list[BackendSpec]: return [backend_spec()]


__all__ = ["EmuDevice", "EmuRenderer", "EmuCompiler", "EmuProgram", "EmulatorError", "OutOfBoundsError", "BarrierError",
           "DataRaceError", "MisalignedAccessError", "LaunchError", "UnsupportedOpError", "impersonating", "serialize", "load_program",
           "DEVICE", "PRIORITY"]
