"""What a backend's Renderer declares (its dialect's limits and tensor cores) and the TensorCore description.

The Kernel reads these declarations to decide which optimizations are legal; it never imports this module
(the kernel layer sits below the renderer layer), it only reads the attributes of the renderer it is given."""
from __future__ import annotations
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import NamedTuple, Optional
from kc.ir.dtype import DType, dtypes
from kc.errors import KcError
from kc.helpers import dedup, prod
from kc.ir.symbolic import ssimplify, sym_infer
from kc.ir.uop import GroupOp, Ops, UOp, sint

Axes = tuple[tuple[int, int], ...]  # (TC dim, amount) pairs: dim 0 is N, 1 is M, 2+ index the upcast axes


@dataclass(frozen=True)
class TensorCore:
  """D = A*B + C on one warp/simdgroup, A is (M x K), B is (K x N), C and D are (M x N).

  dims: (N, M, K). threads: the (TC dim, amount) splits whose product is the warp's threads, in local-axis
  order. reduce_axes: the (TC dim, amount) splits of K that each thread unrolls. upcast_axes: for A, B and C,
  the upcast axes (relative to the first upcast axis) that make up each thread's fragment. st1_pattern /
  st2_pattern: how A's / B's views are permuted so each thread reads the elements the instruction expects.
  expanded_shape: the shape the upcast axes are split into for those permutations. opts_seq: the order in
  which the Kernel upcasts ("UP") and locals ("LC") the tensor-core axes."""
  dims: tuple[int, int, int]
  dtype_in: DType
  dtype_out: DType
  threads: Axes
  reduce_axes: Axes
  upcast_axes: tuple[Axes, Axes, Axes]
  st1_pattern: Optional[tuple[Axes, Axes]] = None
  st2_pattern: Optional[tuple[Axes, Axes]] = None
  expanded_shape: Optional[tuple[int, ...]] = None
  opts_seq: tuple[str, str] = ("UP", "LC")

  def __post_init__(self):
    # accept lists for convenience, store tuples so the TensorCore stays hashable
    for name in ("threads", "reduce_axes"): object.__setattr__(self, name, tuple(tuple(x) for x in getattr(self, name)))
    object.__setattr__(self, "upcast_axes", tuple(tuple(tuple(x) for x in ax) for ax in self.upcast_axes))
    object.__setattr__(self, "dims", tuple(self.dims))
    if len(self.dims) != 3 or not all(isinstance(d, int) and d > 0 for d in self.dims):
      raise KcError(f"TensorCore dims are (N, M, K) positive ints, got {self.dims}")
    if prod(a for _, a in self.reduce_axes) != self.dims[2]:
      raise KcError(f"TensorCore reduce_axes {self.reduce_axes} must multiply to K={self.dims[2]}")
    if len(self.upcast_axes) != 3: raise KcError(f"TensorCore upcast_axes is (A, B, C), got {self.upcast_axes}")
    if set(self.opts_seq) != {"UP", "LC"}: raise KcError(f"TensorCore opts_seq is an order of 'UP' and 'LC', got {self.opts_seq}")

  @property
  def early_upcast_axes(self) -> Axes:
    """For N and M, the part of the dim the threads do not cover, upcast before the thread locals."""
    out = []
    for dim in range(2):
      covered = prod(a for d, a in self.threads if d == dim)
      if self.dims[dim] > covered: out.append((dim, self.dims[dim] // covered))
    return tuple(out)

  @property
  def num_threads(self) -> int: return prod(a for _, a in self.threads)

  def __str__(self): return "_".join(["WMMA", *map(str, self.dims), self.dtype_in.name, self.dtype_out.name])


class WMMAArg(NamedTuple):
  """The arg of an Ops.WMMA UOp: which tensor core it runs and how its fragments sit on the kernel's axes.

  A NamedTuple so that the arg stays a plain value: it hashes and compares like the tuple of its fields (UOps are
  hash-consed on their args) and pickles by value (the EMU program is a pickle of UOps)."""
  name: str                               # str(TensorCore): the instruction a renderer spells
  dims: tuple[int, int, int]              # (N, M, K)
  dtype_in: DType
  dtype_out: DType
  device: str                             # the renderer's device the kernel was optimized for
  num_threads: int                        # threads of one warp that run the instruction together
  upcast_axes: tuple[Axes, Axes, Axes]    # for A, B and C: the (kernel axis, size) pairs of each thread's fragment
  reduce_axes: tuple[int, ...]            # the kernel axes the instruction reduces (K)

  @classmethod
  def of(cls, tc: TensorCore, device: str, upcast_axes: tuple[Axes, Axes, Axes], reduce_axes: tuple[int, ...]) -> "WMMAArg":
    """The arg of a WMMA that runs `tc` with its fragments on the given kernel axes."""
    return cls(str(tc), tc.dims, tc.dtype_in, tc.dtype_out, device, tc.num_threads, upcast_axes, reduce_axes)


class Renderer(ABC):
  """A backend's dialect: its limits, its tensor cores, and render(name, uops) -> source.

  global_max / local_max are in (x, y, z) order; None means no limit (loops instead of launch dims)."""
  device: str = ""
  supports_float4: bool = True
  # aligned_vectors: a vector load or store needs an address that is a multiple of its size (CUDA's float4, OpenCL's
  # and Metal's vector types; a misaligned one faults). kc then refuses a kc.Buffer view at another byte offset for a
  # kernel that accesses it as vectors, and copies a numpy array that is not aligned so (kc.runtime.arguments).
  # False where the dialect aligns its vector types to their scalar (CLANG).
  aligned_vectors: bool = True
  has_local: bool = True
  has_shared: bool = True
  global_max: Optional[tuple[int, ...]] = (0x7FFFFFFF,) * 3  # SPECIAL indices are int32
  local_max: Optional[tuple[int, ...]] = (0x7FFFFFFF,) * 3
  shared_max: int = 32768
  max_work_group_size: Optional[int] = None  # the most threads one work-group may have (all local dims together); None: no limit
  # the most arguments one kernel may take, its buffers and Variables together (Metal's 31-entry buffer argument
  # table); the Kernel refuses an AST with more. None: no limit
  max_kernel_args: Optional[int] = None
  tensor_cores: list[TensorCore] = []
  # What a conformance run (and any caller) may rely on; neither changes how the Kernel optimizes. supported_dtypes:
  # the dtypes kernels may compute in (None: all of kc's). has_images: image buffers are read and written. arch: the
  # hardware/target the renderer generates for, as its plugin names it (empty when it does not say).
  supported_dtypes: Optional[frozenset[DType]] = None
  has_images: bool = False
  arch: str = ""
  # vector_alu: the dialect computes on the vectors vector_widths declares (GCC/Clang vector extensions: `a*b+c` of
  # float16 values). The lowering then keeps lanes that line up as one vector value through their arithmetic and in
  # vector accumulators (kc.codegen.vectorize says which lanes do); the dialect must render ADD SUB MUL MULACC NEG
  # FDIV RECIP of float32/float64 vectors, a VECTORIZE of one value (a splat), DEFINE_ACC/ASSIGN of a vector dtype and
  # SHUFFLE (lanes of one or two vectors: the butterflies that combine vector accumulators, docs/IR.md; the C-style
  # base renders it). False: every value is computed lane by lane, only loads and stores are vectors.
  vector_alu: bool = False
  # vector_functions: with vector_alu, the unary ops of float32 (EXP2, ...) the dialect also computes on those
  # vectors; its code_for_op renders them for a vector dtype (a vector function of its own). Others stay per lane.
  vector_functions: frozenset = frozenset()
  # vector_select: with vector_alu, comparisons (CMPLT, CMPNE) of float32 vectors give a vector of lane masks (bool
  # vectors: AND OR XOR and logical not of them, and bool lanes packed one by one, render as masks too) and WHERE of a
  # mask selects float32 lanes: a ReLU, a clamp or a sign after vector arithmetic stays one vector computation.
  vector_select: bool = False
  # fuses_accumulation: a float sum reduce whose terms include products accumulates with MULACC, one fused
  # multiply-add per product (kc.codegen.fma), in the dtypes fused_multiply_add accepts. Only the accumulation: the
  # dialect need not spell MULACC in code_for_op (which would fuse every a*b+c, numpy rounds those twice)
  fuses_accumulation: bool = False
  code_for_op: dict = {}          # the ops the dialect spells; the rest are rewritten into these before rendering
  extra_matcher = None            # a PatternMatcher of dialect rewrites applied to the lowered graph before linearizing

  @abstractmethod
  def render(self, name: str, uops: list) -> str:
    """The source of one kernel named `name` from its linearized UOps."""

  def render_env(self) -> tuple:
    """What besides a kernel and its opts decides this renderer's source, as read from the environment now (CLANG:
    its thread count, which decides whether the outer loop is split). kc.compile's in-process memo of compiled
    kernels keys on it, so a changed setting renders anew."""
    return ()

  def vector_widths(self, dt: DType) -> tuple[int, ...]:
    """The vector widths, widest first, in which this dialect loads and stores the scalar dtype `dt`: runs of
    neighbouring scalar accesses at an aligned offset fold into one access of the widest width that fits; () keeps
    every access of `dt` scalar. The default is float4/float2 and half4/half2 where supports_float4 is set; a dialect
    with wider vectors (8 halves, 16 floats) or vector accesses of other dtypes overrides this."""
    return (4, 2) if self.supports_float4 and dt in (dtypes.float32, dtypes.float16) else ()

  def fused_multiply_add(self, dt: DType) -> bool:
    """Whether the dialect renders MULACC of `dt` (a scalar or vector dtype) as one fused multiply-add, rounding
    once; asked where fuses_accumulation is set."""
    return False

  def supports_dtype(self, dt: DType) -> bool:
    """Whether kernels may compute in `dt` (a vector or pointer counts as its scalar)."""
    return self.supported_dtypes is None or dt.base.scalar() in self.supported_dtypes

  def __repr__(self): return f"<{type(self).__name__} device={self.device!r}>"


@dataclass
class Program:
  """One rendered kernel: its source and everything needed to launch it. global_size/local_size are in (x, y, z)
  order (None where the renderer uses loops instead of launch dims); vars are the DEFINE_VARs in argument order;
  globals the buffer indices it takes; outs the ones it writes."""
  name: str
  src: str
  device: str
  uops: list[UOp] = field(default_factory=list, repr=False)
  global_size: Optional[list[sint]] = None
  local_size: Optional[list[sint]] = None
  vars: list[UOp] = field(default_factory=list)
  globals: list[int] = field(default_factory=list)
  outs: list[int] = field(default_factory=list)
  mem_estimate: sint = 0

  def __post_init__(self):
    if not self.uops: return
    specials = [u for u in self.uops if u.op is Ops.SPECIAL]
    if specials and self.global_size is None: self.global_size = [1, 1, 1]
    # work-group ids (gidx) mean a work-group size, [1, 1, 1] unless there are thread ids (lidx); global ids alone
    # (idx, NOLOCALS) leave the work-group size to the runtime: local_size None
    if any(u.arg[0].startswith(("gidx", "lidx")) for u in specials) and self.local_size is None: self.local_size = [1, 1, 1]
    for u in specials:
      target = self.local_size if u.arg[0].startswith("lidx") else self.global_size
      target[int(u.arg[0][-1])] = u.arg[1]
    self.vars = sorted(dedup(u for u in self.uops if u.op is Ops.DEFINE_VAR), key=lambda v: v.arg)
    self.globals = [u.arg for u in self.uops if u.op is Ops.DEFINE_GLOBAL]
    self.outs = sorted(dedup(b.arg for u in self.uops if u.op is Ops.STORE and (b := _stored_buffer(u)) is not None))

  def vector_bytes(self) -> dict[int, int]:
    """The widest vector access (load or store) of each global buffer that has one, in bytes: {buffer index: bytes}."""
    out: dict[int, int] = {}
    for u in self.uops:
      if u.op is Ops.LOAD and u.dtype.count > 1: target, vec = u.src[0], u.dtype
      elif u.op is Ops.STORE and len(u.src) > 1 and u.src[1].dtype.count > 1: target, vec = u.src[0], u.src[1].dtype
      else: continue
      buf = target.src[0] if target.op is Ops.INDEX else target
      if buf.op is Ops.DEFINE_GLOBAL: out[buf.arg] = max(out.get(buf.arg, 0), vec.scalar().itemsize * vec.count)
    return out

  @property
  def op_estimate(self) -> sint:
    """Arithmetic operations one launch performs (index arithmetic not counted), loops and launch dims multiplied in."""
    return estimate_ops(self.uops)

  def launch_dims(self, var_vals: dict) -> tuple[Optional[list[int]], Optional[list[int]]]:
    """global_size and local_size with the Variables given their values."""
    g = [int(sym_infer(s, var_vals)) for s in self.global_size] if self.global_size is not None else None
    l = [int(sym_infer(s, var_vals)) for s in self.local_size] if self.local_size is not None else None
    return g, l


def _stored_buffer(store: UOp) -> Optional[UOp]:
  """The global buffer a STORE writes: the one its INDEX addresses (or its target itself), None for local memory."""
  target = store.src[0]
  buf = target.src[0] if target.op is Ops.INDEX else target
  return buf if buf.op is Ops.DEFINE_GLOBAL else None


def _smul(a: sint, b: sint) -> sint:
  if isinstance(a, int) and isinstance(b, int): return a * b
  return ssimplify((a if isinstance(a, UOp) else UOp.const(b.dtype, a)) * b)


def estimate_ops(uops: list[UOp]) -> sint:
  """Arithmetic operations of linear UOps (index arithmetic not counted), loops and launch dims multiplied in."""
  indexing: set[UOp] = set()
  stack = [s for u in uops if u.op is Ops.INDEX for s in u.src[1:]] + [u.src[0] for u in uops if u.op is Ops.IF]
  while stack:  # everything the offsets and gates are computed from
    if (x := stack.pop()) not in indexing:
      indexing.add(x)
      stack.extend(x.src)
  flops: sint = 0
  mult: sint = 1
  stack: list[sint] = []
  for u in uops:
    if u.op is Ops.RANGE:
      stack.append(mult)
      lo, hi = u.src
      # most loops run between constants: their count needs no symbolic simplification
      mult = _smul(mult, hi.arg - lo.arg if lo.op is Ops.CONST and hi.op is Ops.CONST else ssimplify(hi - lo))
    elif u.op is Ops.ENDRANGE: mult = stack.pop()
    elif u.op is Ops.SPECIAL: mult = _smul(mult, u.arg[1])
    elif u.op in GroupOp.ALU and u not in indexing: flops = flops + _smul(mult, (2 if u.op is Ops.MULACC else 1) * u.dtype.count)
    elif u.op is Ops.WMMA: flops = flops + _smul(mult, 2 * prod(u.arg.dims) // u.arg.num_threads)
  return ssimplify(flops)
