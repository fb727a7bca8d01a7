"""The moves of the BEAM search: every Opt worth trying on a renderer (action_list), and the kernels one more opt
away from a kernel (next_kernels), without those that break a limit before anything is compiled.

A limit is checked here, in the parent, because a candidate that breaks it would only fail later (a launch the
device refuses, a compile that never ends on a huge unrolled body) or waste a compile slot."""
from __future__ import annotations
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence
from kc.errors import KcError, KernelOptError
from kc.helpers import prod
from kc.ir.dtype import dtypes
from kc.ir.uop import Ops, UOp
from kc.kernel.opt import Opt, OptOps

if TYPE_CHECKING:
  from kc.kernel import Kernel
  from kc.renderer import Program, Renderer

# axes an action names: enough for the kernels kc builds (after merging, a kernel rarely has more than six axes;
# an axis that does not exist is refused by the Kernel, which costs nothing)
_AXES, _REDUCE_AXES, _GROUP_AXES, _TC_CHOICES = 6, 4, 3, 9
_UPCAST_AMTS = (0, 2, 3, 4, 5, 7, 8, 16)      # the Kernel refuses more than 16 upcast lanes
_UNROLL_AMTS = (0, 2, 3, 4, 7, 8, 16, 32)     # and more than 32 unrolled steps
_LOCAL_AMTS = (0, 2, 3, 4, 8, 16, 32)
_GROUP_AMTS = (0, 4, 8, 16)
_GROUPTOP_AMTS = (16, 32, 64, 128, 256)
_PAD_AMTS = (32,)


@dataclass(frozen=True)
class SearchLimits:
  """What a candidate may not exceed to be compiled at all. upcast_max: lanes of all upcast axes together (registers
  and code size grow with it), counted in float4s: a renderer that computes on wider vectors (vector_alu) holds
  that many more lanes in the same registers, and its cap grows by the same factor (upcast_cap); uops_max: linear UOps
  of the rendered kernel (a body that large compiles for long and runs no faster). The local product and shared
  memory limits are the renderer's own."""
  upcast_max: int = 256
  uops_max: int = 3000


DEFAULT_LIMITS = SearchLimits()


def _widest(renderer: "Renderer") -> int:
  """The widest vector the renderer loads float32 in (1 without vectors)."""
  return max(renderer.vector_widths(dtypes.float32), default=1)


def action_list(renderer: "Renderer") -> list[Opt]:
  """Every Opt the search tries on kernels for `renderer`: each OptOp with the amounts that make sense under the
  renderer's limits. Most actions do not apply to a given kernel; the Kernel refuses those (KernelOptError)."""
  widest = _widest(renderer)
  upcasts = sorted({a for a in _UPCAST_AMTS if a <= max(widest, 8)} | ({widest} if 1 < widest <= 16 else set()))
  unrolls = sorted({a for a in _UNROLL_AMTS if a <= max(2 * widest, 8)})
  acts: list[Opt] = []
  acts += [Opt(OptOps.UPCAST, ax, amt) for ax in range(_AXES) for amt in upcasts]
  acts += [Opt(OptOps.UNROLL, ax, amt) for ax in range(_REDUCE_AXES) for amt in unrolls]
  if renderer.has_local:
    # a work-group can hold at most this many threads: larger locals are refused by every kernel
    threads = _work_group_threads(renderer)
    acts += [Opt(OptOps.LOCAL, ax, amt) for ax in range(_AXES) for amt in _LOCAL_AMTS if amt <= threads]
    if renderer.has_shared:
      acts += [Opt(OptOps.GROUP, ax, amt) for ax in range(_GROUP_AXES) for amt in _GROUP_AMTS if amt <= threads]
      acts += [Opt(OptOps.GROUPTOP, ax, amt) for ax in range(_GROUP_AXES) for amt in _GROUPTOP_AMTS if amt <= threads]
      # image outputs only (the Kernel checks): the unit-stride axis upcast by 4 inside a grouped reduce
      acts += [Opt(OptOps.UPCASTMID, ax, 4) for ax in range(_GROUP_AXES)]
    acts.append(Opt(OptOps.NOLOCALS))
  acts += [Opt(OptOps.PADTO, ax, amt) for ax in range(_AXES) for amt in _PAD_AMTS]
  acts += [Opt(OptOps.SWAP, ax, other) for ax in range(_AXES - 1) for other in range(ax + 1, _AXES - 1)]
  if renderer.tensor_cores:
    # axis picks the (N, M, K) choice; amt is the qualifying level, 2 being the widest (it also pads M/N/K that do
    # not divide): a kernel that qualifies at level 0 or 1 gets the same tensor core at 2
    acts += [Opt(OptOps.TC, choice, 2) for choice in range(_TC_CHOICES)]
  return acts


def _work_group_threads(renderer: "Renderer") -> int:
  most = prod(renderer.local_max) if renderer.local_max is not None else 1 << 31
  if (cap := renderer.max_work_group_size) is not None: most = min(most, cap)
  return most


def upcast_cap(renderer: "Renderer", limits: SearchLimits = DEFAULT_LIMITS) -> int:
  """The most upcast lanes a kernel for `renderer` may have (see SearchLimits)."""
  return limits.upcast_max * (max(1, _widest(renderer) // 4) if renderer.vector_alu else 1)


def kernel_limit_violation(k: "Kernel", limits: SearchLimits = DEFAULT_LIMITS) -> Optional[str]:
  """Why the optimized kernel `k` breaks a limit that is known before rendering, or None: its upcast lanes over
  upcast_cap, or its work-group (local and grouped dims) over what the renderer launches."""
  upcast = k.full_shape[k.first_upcast:]
  if all(isinstance(s, int) for s in upcast) and prod(upcast) > (cap := upcast_cap(k.renderer, limits)):
    return f"{prod(upcast)} upcast lanes, more than {cap}"
  group = k.full_shape[k.first_reduce - k.local_dims:k.first_reduce + k.group_for_reduces]
  if all(isinstance(s, int) for s in group) and prod(group) > _work_group_threads(k.renderer):
    return f"a work-group of {prod(group)} threads, more than the renderer's {_work_group_threads(k.renderer)}"
  return None


def local_bytes(uops: Sequence[UOp]) -> int:
  """Bytes of local (shared) memory the linear UOps declare."""
  return sum(u.dtype.size * u.dtype.base.itemsize for u in uops if u.op is Ops.DEFINE_LOCAL)


def program_limit_violation(prg: "Program", renderer: "Renderer", limits: SearchLimits = DEFAULT_LIMITS) -> Optional[str]:
  """Why a rendered candidate breaks a limit, or None: more linear UOps than limits.uops_max, or more local memory
  than the renderer's shared_max."""
  if len(prg.uops) > limits.uops_max: return f"{len(prg.uops)} UOps, more than {limits.uops_max}"
  if (smem := local_bytes(prg.uops)) > renderer.shared_max: return f"{smem} bytes of local memory, more than shared_max {renderer.shared_max}"
  return None


@dataclass
class Child:
  """A kernel one opt away from its parent, rendered (program) or dropped (reason)."""
  opt: Opt
  kernel: "Kernel"
  program: Optional["Program"] = None
  reason: Optional[str] = None


def expand(kernel: "Kernel", actions: Sequence[Opt], limits: SearchLimits = DEFAULT_LIMITS, render: bool = True) -> tuple[list[Child], list[Child]]:
  """The children of `kernel` (copies with one more action each) as (kept, dropped). A child the Kernel refuses
  is left out; one that breaks a limit is dropped with its reason. With render=True each kept child carries its
  Program (rendered once here, which the UOp and shared memory limits need anyway); a render the Kernel refuses
  (KernelOptError: launch dims over the renderer's limits) or that fails with a kc error drops the child too.
  Anything but a KernelOptError out of apply_opt is a bug in the Kernel and propagates."""
  kept: list[Child] = []
  dropped: list[Child] = []
  for opt in actions:
    child = kernel.copy()
    try: child.apply_opt(opt)
    except KernelOptError: continue
    c = Child(opt, child)
    if (why := kernel_limit_violation(child, limits)) is None and render:
      try:
        c.program = child.to_program()
        why = program_limit_violation(c.program, child.renderer, limits)
      except KcError as e: why = f"cannot be rendered: {type(e).__name__}: {e}"
    if why is not None:
      c.reason = why
      dropped.append(c)
    else: kept.append(c)
  return kept, dropped


def next_kernels(kernel: "Kernel", actions: Sequence[Opt], limits: SearchLimits = DEFAULT_LIMITS) -> list[tuple[Opt, "Kernel"]]:
  """Copies of `kernel` with one more action each, for the actions that apply and break no limit, in action order."""
  return [(c.opt, c.kernel) for c in expand(kernel, actions, limits)[0]]
