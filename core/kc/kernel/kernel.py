"""The Kernel: one AST, a ShapeTracker per buffer, and the optimizations applied to them.

Every optimization is a reshape and permute of all the kernel's ShapeTrackers at once, plus counters that say
which axes are what. The axes of full_shape are kept in this order (the colours of colored_shape):

  global (blue) | local (cyan) | grouped reduce (green; white for upcast-mid-reduce) | reduce loops (red) |
  upcast reduce (magenta) | upcast (yellow)

first_reduce is the first axis whose output size differs from the full size; first_upcast = shape_len - upcasted.
"""
from __future__ import annotations
import dataclasses, itertools
from operator import attrgetter
from typing import Any, Callable, Optional, Sequence
from kc.ir.dtype import ImageDType, dtypes
from kc.errors import ConfigError, InvalidOptError, KcError, KernelOptError
from kc.config import read
from kc.helpers import all_int, all_same, dedup, prod, round_up
from kc.kernel.heuristics import hand_coded_optimizations as run_hand_coded, required_optimizations as run_required
from kc.codegen.naming import ansilen, colored, to_function_name
from kc.codegen.program import check_argument_count, collector_paused, linearize_ast, render_program
from kc.kernel.opt import Opt, OptOps, check
from kc.kernel.optimized_ast import get_optimized_ast
from kc.codegen.verify import preorder, full_buffer, reduce_axes, st_arg, verify_ast
from kc.renderer import Program, Renderer, TensorCore
from kc.shape import ShapeTracker, strides_for_shape
from kc.shape.view import fmt_shape
from kc.ir.symbolic import resolve, ssimplify
from kc.ir.uop import GroupOp, Ops, UOp, sint



@dataclasses.dataclass
class TensorCoreOptions:
  axes: tuple[int, ...]              # where the original N and M axes are, while they still exist
  axes_exist: tuple[bool, ...]       # False once simplify_ones removed that axis
  axis_pads: tuple[tuple[int, int], ...]

  def fix_axes(self, removed_axis: int) -> None:
    """Follow the N and M axes when simplify_ones removes the axis `removed_axis`."""
    axes, exist = list(self.axes), list(self.axes_exist)
    for d in [i for i in range(2) if exist[i]]:
      if removed_axis < axes[d]: axes[d] -= 1
      elif removed_axis == axes[d]: exist[d] = False
    self.axes, self.axes_exist = tuple(axes), tuple(exist)


def get_contraction(old_shape: tuple[sint, ...], new_shape: tuple[sint, ...]) -> Optional[list[list[int]]]:
  """For each dim of new_shape, the dims of old_shape that multiply to it, or None if there is no such grouping."""
  acc_old, acc_new = list(itertools.accumulate(old_shape, lambda a, b: a * b)), list(itertools.accumulate(new_shape, lambda a, b: a * b))
  try: split = [acc_old.index(acc) + 1 if acc != 1 else 0 for acc in acc_new]
  except ValueError: return None
  return [list(range(st, ed)) for st, ed in zip([0] + split[:-1], split[:-1] + [len(old_shape)])]


@dataclasses.dataclass
class KernelState:
  """Everything an optimization changes in a Kernel, declared once: Kernel.copy and the rollback of an opt that fails
  half-way both take a KernelState.copy(). The Kernel reads and writes these fields as its own attributes."""
  sts: list[ShapeTracker]            # per buffer, then (output, input) per reduce, then per broadcast
  applied_opts: list[Opt] = dataclasses.field(default_factory=list)
  group_for_reduces: int = 0
  upcasted: int = 0
  local_dims: int = 0
  tensor_core: Optional["TensorCore"] = None
  tensor_core_opts: Optional[TensorCoreOptions] = None
  tc_level: int = 1                  # the tensor-core level a TC opt applies at (TC_LEVELS)
  bufs_for_tensor_core: dict[UOp, tuple[int, int]] = dataclasses.field(default_factory=dict)
  dont_use_locals: bool = False

  def copy(self) -> "KernelState":
    """A copy that shares nothing mutable with this one (trackers, opts and UOps are immutable values). Taken on
    every opt and heuristic step: the fields as they are, the containers and records the Kernel changes in place
    copied, without the dataclass's __init__."""
    new = object.__new__(KernelState)
    new.__dict__.update({name: _UNSHARED[type(v)](v) if type(v) in _UNSHARED else v for name, v in self.__dict__.items()})
    return new


# how a field's value of each type the Kernel changes in place is copied (every other value is shared)
_UNSHARED: dict[type, Callable[[Any], Any]] = {list: list, dict: dict, TensorCoreOptions: dataclasses.replace}


def _state_attribute(name: str) -> property:
  """Kernel.<name> reads and writes KernelState.<name> of the Kernel's current state."""
  def set_field(k: "Kernel", value: Any) -> None: setattr(k.state, name, value)
  return property(attrgetter(f"state.{name}"), set_field, doc=f"KernelState.{name} of this Kernel")



def _whole(x: Any) -> bool: return isinstance(x, int) and not isinstance(x, bool)


# 0: tensor cores off (a TC opt is refused); 1: real WMMA; 2: the tensor core's shape opts without WMMA; 3: WMMA's
# thread addressing emulated through local memory
TC_LEVELS = (0, 1, 2, 3)


def checked_tc_level(level: Any) -> int:
  """`level` when it is one of TC_LEVELS, else a ConfigError saying what the levels are."""
  if not _whole(level) or level not in TC_LEVELS:
    raise ConfigError(f"the tensor-core level must be 0 (off), 1 (WMMA), 2 (the shape opts without WMMA) or 3 (WMMA's "
                      f"addressing through local memory), got {level!r}")
  return level


def malformed(opt: Any) -> Optional[str]:
  """Why `opt` is an Opt no kernel can take (not an Opt, an op that is not an OptOps, an axis or amount that is not an
  int >= 0), or None. NOLOCALS alone may leave its axis and amount None; SWAP's amount is the other axis."""
  if not isinstance(opt, Opt):
    return f"not an Opt: {opt!r} ({type(opt).__name__}); make one as kc.Opt(kc.OptOps.UPCAST, axis, amount)"
  if not isinstance(opt.op, OptOps):
    ops = ", ".join(o.name for o in OptOps)
    return f"{opt!r}: op must be a kc.OptOps ({ops}), got {opt.op!r} ({type(opt.op).__name__})"
  for field, value in (("axis", opt.axis), ("amount", opt.amt)):
    if (value is None and opt.op is OptOps.NOLOCALS) or (_whole(value) and value >= 0): continue
    if field == "axis" or opt.op is OptOps.TC: valid = "an int >= 0"
    elif opt.op is OptOps.SWAP: valid = "the other axis, an int >= 0"
    else: valid = "an int >= 0 (0: the whole axis)"
    return f"{opt!r}: {opt.op.name}'s {field} must be {valid}, got {value!r}"
  return None

class Kernel:
  """One kernel AST under optimization for one `renderer`. The AST and what is read off it are fixed; what
  the optimizations change is `state` (a KernelState), whose fields are also attributes of the Kernel. `tc_level` is
  the tensor-core level its TC opts apply at (TC_LEVELS; kc.compile passes the configured one)."""
  state: KernelState
  # KernelState's fields, which the loop after the class makes properties of the Kernel that read and write `state`
  sts: list[ShapeTracker]
  applied_opts: list[Opt]
  group_for_reduces: int
  upcasted: int
  local_dims: int
  tensor_core: Optional[TensorCore]
  tensor_core_opts: Optional[TensorCoreOptions]
  tc_level: int
  bufs_for_tensor_core: dict[UOp, tuple[int, int]]
  dont_use_locals: bool

  def __init__(self, ast: UOp, renderer: Optional[Renderer] = None, tc_level: int = 1, opts: Optional[Renderer] = None):
    # opts= is the renderer's older keyword (the seeds' name): accepted, never both
    if opts is not None:
      if renderer is not None: raise KcError("Kernel takes one renderer: pass renderer= (opts= is its older name), not both")
      renderer = opts
    # the kernel layer sits below the devices: it cannot look up a default device's renderer by itself
    if renderer is None: raise KcError("Kernel needs a renderer: pass kc.Device[name].renderer")
    self.renderer, self.ast = renderer, ast
    uop_sts = verify_ast(ast)

    order = list(ast.toposort)
    self.reduceops: list[UOp] = [x for x in order if x.op is Ops.REDUCE_AXIS]
    # keepdim-expands of reduce results (fused reduce chains): their views move with every opt like a buffer's
    self.broadcasts: list[UOp] = [x for x in order if x.op is Ops.VIEW and x.src]
    self.bufs: list[UOp] = list(ast.src) + dedup(x for x in preorder(ast) if x.op in (Ops.LOAD, Ops.VALID, Ops.POSITION))
    self.vars: list[UOp] = sorted({v for u in self.bufs for v in st_arg(u).vars()} |
                                  {v for b in self.broadcasts for v in b.arg.vars()} | set(ast.variables()), key=lambda v: v.arg)
    # every buffer is an argument (Variables are too where the kernel reads them: render_program counts those)
    check_argument_count(len(self.membufs), 0, renderer)

    # the buffer whose view is the full shape: the first read under a reduce that spans every dim (verify_ast refused
    # the AST if there is none), else the first output
    self.full_buf_index: int = self.bufs.index(full_buffer(ast, uop_sts))

    sts = [st_arg(x) for x in self.bufs]
    for r in self.reduceops: sts += [uop_sts[r], uop_sts[r.src[0]]]  # which axes each reduce reduces
    for b in self.broadcasts: sts.append(b.arg)
    self.state = KernelState(sts, tc_level=checked_tc_level(tc_level))

    # reduce axes go last
    pairs = list(enumerate(zip(self.full_shape, self.output_shape)))
    self.reshape_and_permute(None, [i for i, (s, n) in pairs if not resolve(s != n)] + [i for i, (s, n) in pairs if resolve(s != n)])
    self.simplify_ones()
    self.simplify_merge_adjacent()

  def copy(self) -> "Kernel":
    """An independent Kernel of the same class with the same AST, renderer and optimizations (and a name of its own)."""
    ret = type(self).__new__(type(self))
    ret.__dict__.update(self.__dict__)
    ret.__dict__.pop("name", None)
    ret.state = self.state.copy()
    return ret

  # ***** what the axes are *****

  @property
  def membufs(self) -> list[UOp]: return dedup(x.src[0] for x in self.bufs if x.op in (Ops.LOAD, Ops.STORE))

  @property
  def shape_len(self) -> int: return len(self.sts[0].shape)

  @property
  def output_shape(self) -> tuple[sint, ...]: return self.sts[0].shape

  @property
  def full_shape(self) -> tuple[sint, ...]: return self.sts[self.full_buf_index].shape

  @property
  def first_upcast(self) -> int: return self.shape_len - self.upcasted

  @property
  def full_unupcasted_shape(self) -> tuple[sint, ...]: return self.full_shape[:self.first_upcast]

  @property
  def first_reduce(self) -> int:
    """The first axis before the upcast ones where the output's shape differs from the full shape (a reduce), else
    first_upcast."""
    out, full, upcast = self.sts[0].shape, self.full_shape, self.first_upcast
    for i in range(upcast):
      if out[i] is not full[i] and (out[i] != full[i] if type(out[i]) is int and type(full[i]) is int else resolve(out[i] != full[i])):
        return i
    return upcast

  @property
  def reduceop(self) -> Optional[UOp]: return self.reduceops[0] if self.reduceops else None

  @property
  def global_dims(self) -> int: return self.first_reduce - self.local_dims

  @property
  def upcast_in_mid_reduce_axes(self) -> list[int]:
    return [j for j in range(self.first_reduce, self.first_reduce + self.group_for_reduces) if self.full_shape[j] == self.sts[0].shape[j]]

  def float4_axis(self, i: int) -> list[int]:
    """Upcast axes (relative to first_upcast) where buffer i is contiguous in groups of 4."""
    return [x - self.first_upcast for x in self.sts[i].unit_stride_axes() if x >= self.first_upcast and self.sts[i].shape[x] % 4 == 0]

  def upcasted_axis(self, i: int) -> list[tuple[int, Optional[sint], bool]]:
    """(size, stride in buffer i, is a reduce axis) of each upcast axis."""
    shape, strides = self.sts[i].shape[self.first_upcast:], self.sts[i].real_strides()[self.first_upcast:]
    if not all_int(shape): raise KernelOptError(f"cannot upcast a symbolic amount {shape}")
    return list(zip(shape, strides, self.upcast_reduces()))

  def upcast_reduces(self) -> list[bool]:
    """Whether each upcast axis is a reduce axis (the output keeps size 1 there): upcasted_axis's third field, without
    the stride analysis (which unravels a padded view's index)."""
    return [x != y for x, y in zip(self.sts[0].shape[self.first_upcast:], self.full_shape[self.first_upcast:])]

  def colors(self) -> list[str]:
    colors = ["BLUE" if self.dont_use_locals else "blue"] * self.global_dims + ["cyan"] * self.local_dims
    mid = self.upcast_in_mid_reduce_axes
    colors += ["white" if i in mid else "green" for i in range(self.first_reduce, self.first_reduce + self.group_for_reduces)]
    colors += ["red"] * (self.first_upcast - (self.first_reduce + self.group_for_reduces))
    colors += ["magenta" if self.full_shape[i] != self.sts[0].shape[i] else "yellow" for i in range(self.first_upcast, self.shape_len)]
    return colors

  def colored_shape(self, pad: Optional[int] = None, dense: bool = False) -> str:
    if pad is not None and (isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad <= 1 << 16):
      raise KcError(f"colored_shape pads to a width in columns (an int, 0 to 65536), got {pad!r:.60}")
    strs = [(str(s) if dense else f"{s:4d}") if isinstance(s, int) else s.render() for s in self.full_shape]
    ret = " ".join(colored(s, c) for s, c in zip(strs, self.colors()))
    return ret + " " * (pad - ansilen(ret)) if pad else ret

  # ***** moving axes *****

  def reshape_and_permute(self, new_shape_fxn: Optional[Callable[[tuple[sint, ...]], Sequence[sint]]], axis: Optional[Sequence[int]]) -> None:
    """Apply one reshape (a function of each tracker's shape) and one permute to every ShapeTracker."""
    def move(st: ShapeTracker) -> ShapeTracker:
      if new_shape_fxn is not None: st = st.reshape(tuple(new_shape_fxn(st.shape)))
      return st.permute(tuple(axis)) if axis is not None else st
    # trackers repeat (a reduce's input is its buffer's view, its output the output's): each moved once
    moved: dict[ShapeTracker, ShapeTracker] = {}
    self.sts = [moved[st] if st in moved else moved.setdefault(st, move(st)) for st in self.sts]

  def upcast(self) -> None:
    check(self.full_shape[-1] != 1, "can't upcast a dimension with size 1")
    self.upcasted += 1

  def shift_to(self, axis: int, amount: int, top: bool = False, insert_before: Optional[int] = None) -> None:
    """Split `amount` off axis (from its top or bottom) and move that new axis to just before `insert_before`."""
    if insert_before is None: insert_before = self.shape_len
    move_axis = axis if top else axis + 1
    if move_axis < insert_before: insert_before += 1
    def split(x):
      parts = ((amount, x[axis] // amount) if top else (x[axis] // amount, amount)) if x[axis] > 1 else (1, 1)
      return x[:axis] + parts + x[axis + 1:]
    self.reshape_and_permute(split, [i for i in range(insert_before) if i != move_axis] + [move_axis] +
                             [i for i in range(insert_before, self.shape_len + 1) if i != move_axis])

  def simplify_ones(self) -> bool:
    """Drop axes that are 1 in every tracker. True if any was dropped."""
    if self.shape_len == 0: return False
    ones = [s == 1 for s in self.full_shape]
    if not any(ones): return False  # (a reshape to the same shape: every tracker as it is)
    self.local_dims -= sum(ones[self.first_reduce - self.local_dims:self.first_reduce])
    self.upcasted -= sum(ones[self.first_upcast:])
    self.reshape_and_permute(lambda shape: [x for i, x in enumerate(shape) if not ones[i]], None)
    return any(ones)

  def simplify_merge_adjacent(self) -> None:
    """Merge neighbouring axes that every tracker can merge (never across first_reduce, never across image axes)."""
    if self.shape_len == 0: return
    shapes, strides = [x.shape for x in self.sts], [x.real_strides() for x in self.sts]
    if isinstance(img := self.membufs[0].dtype, ImageDType):
      # fake strides that stop merges across the image's (height, width, 4) axes
      if groups := get_contraction(self.output_shape, img.shape):
        special: tuple = ()
        for g in groups:
          piece = tuple(self.output_shape[x] for x in g)
          special += strides_for_shape(piece)
        shapes.append(self.output_shape)
        strides.append(special)
    # the kernel's size of each axis: the one size above 1 its trackers have there (verify_ast), else 1
    full = [next((d for d in dims if not (isinstance(d, int) and d == 1)), 1) for dims in zip(*shapes)]
    rets = [[(s[0], st[0])] for s, st in zip(shapes, strides)]
    merged = full[0]
    for i in range(1, len(shapes[0])):
      can_merge = []
      for s, st, ret in zip(shapes, strides, rets):
        si, sti, last = s[i], st[i], ret[-1][1]
        # a tracker with size 1 in one of the two axes and the kernel's size in the other would merge to a size that is
        # neither 1 nor the kernel's (a reduce over (3, 3) beside one over (3, 1) in one kernel: 9 and 3)
        sizes_agree = (_same(ret[-1][0], merged) and _same(si, full[i])) or (_same(ret[-1][0], 1) and _same(si, 1))
        can_merge.append(sizes_agree and sti is not None and ((not _is_zero(sti) and _same(last, si * sti)) or (_is_zero(sti) and _is_zero(last))))
      mergeable = all(can_merge) and i != self.first_reduce
      merged = merged * full[i] if mergeable else full[i]
      for j, (s, st) in enumerate(zip(shapes, strides)):
        if mergeable: rets[j][-1] = (rets[j][-1][0] * s[i], st[i])
        else: rets[j].append((s[i], st[i]))
    for i, x in enumerate(rets[:len(self.sts)]): self.sts[i] = self.sts[i].reshape(tuple(y[0] for y in x))

  # ***** applying optimizations *****

  def apply_opt(self, opt: Opt, append_opt: bool = True) -> None:
    """Apply one optimization, or raise KernelOptError saying why not and leave the Kernel as it was."""
    if (why := malformed(opt)) is not None: raise InvalidOptError(why)
    saved = self.state.copy()
    try:
      self._apply_checked(opt, append_opt)
      if self.use_tensor_cores == 3: self._check_tc_staging()
    except KernelOptError:
      self.state = saved
      raise
    except ConfigError:  # a bad environment variable is the user's setting, not this opt's fault: say so as it is
      self.state = saved
      raise
    except KcError as e:  # a movement the trackers refuse is a refused opt too
      self.state = saved
      raise KernelOptError(f"{opt} cannot be applied: {e}") from e

  @property
  def use_tensor_cores(self) -> int:
    """The tensor-core level of the applied tensor core (tc_level), 0 while none is applied."""
    return self.tc_level if self.tensor_core is not None else 0

  def _apply_checked(self, opt: Opt, append_opt: bool) -> None:
    if self.dont_use_locals: check(opt.op not in (OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.UPCASTMID), "not using locals")
    if opt.op is OptOps.TC:
      check(len(self.applied_opts) == 0, "tensor core opts must be first")
      check(self.tc_level != 0, "tensor cores are off (tc_level 0)")
      check(len(self.renderer.tensor_cores) > 0, "the renderer has no tensor cores")
      check(self._apply_tc_opt(opt.axis, opt.amt), "no tensor core available")
      self.applied_opts.append(opt)
      return
    axis = self.real_axis(opt)
    if axis >= len(self.full_shape): raise KernelOptError(self._axis_out_of_range(opt))
    if opt.op is OptOps.SWAP: amt: Any = opt.amt  # the other axis
    elif opt.amt is not None:  # an int >= 0 (malformed() refused anything else)
      size = self.full_shape[axis]
      check(not (isinstance(size, int) and size == 0), f"axis {axis} has size 0 (the kernel does no work): nothing to {opt.op.name}")
      amt = opt.amt if opt.amt != 0 else size
      check(isinstance(amt, int) and amt != 1,
            f"{opt.op.name} by {amt if isinstance(amt, int) else amt.render()} is meaningless (1 or a symbolic amount)")
      if opt.op is not OptOps.PADTO:
        check(resolve(size % amt == 0, False), f"{amt} does not divide {size if isinstance(size, int) else size.render()} (axis {axis})")
    else: amt = -1

    if self.reduceop is not None and (opt.op in (OptOps.GROUP, OptOps.GROUPTOP) or
                                      (self.group_for_reduces and opt.op not in (OptOps.NOLOCALS, OptOps.PADTO))):
      acc_sz = self.reduceop.dtype.itemsize
      upcast_sz = prod(a for a, b in zip(self.full_shape[self.first_upcast:], self.sts[0].shape[self.first_upcast:]) if a == b)
      local_sz = prod(self.full_shape[self.first_reduce - self.local_dims:self.first_reduce + self.group_for_reduces])
      smem_sz = amt * acc_sz * upcast_sz * local_sz
      check(resolve(smem_sz <= self.renderer.shared_max, False),
            f"exceeds maximum shared memory size: needs {smem_sz}, max {self.renderer.shared_max}")

    if opt.op is OptOps.LOCAL:
      check(self.renderer.has_local, "target does not support local")
      check(axis < self.global_dims, "local is for globals")
      self.shift_to(axis, amt, insert_before=self.first_reduce)
      self.local_dims += 1
    elif opt.op in (OptOps.GROUP, OptOps.GROUPTOP):
      check(self.renderer.has_local and self.renderer.has_shared, "target does not support local or shared mem")
      check(self.first_reduce + self.group_for_reduces <= axis < self.first_upcast, "must be reduce axis to group")
      check(not self.tensor_core, "can't group with tensor cores")
      all_axes = [i for r in self.reduceops for i in reduce_axes(r)]
      check(len(all_axes) == len(set(all_axes)), "can't group with parallel reduces")
      # a chain of reduces over different axes (x.sum(0).sum(1)) would combine a group's partial results inside
      # another reduce's loop, where only some threads run each step
      check(len(self.reduceops) == 1, f"can't group a kernel with {len(self.reduceops)} reduces (a chain of reduces over different axes); "
                                      "only a single reduce is grouped")
      self.shift_to(axis, amt, top=opt.op is OptOps.GROUPTOP, insert_before=self.first_reduce + self.group_for_reduces)
      self.group_for_reduces += 1
    elif opt.op is OptOps.UNROLL:
      check(axis < self.first_upcast, "can't upcasted already upcasted")
      check(amt <= 32, "don't unroll more than 32")
      # a whole axis moves: first_reduce shifts by one, which simplify_ones takes back from local_dims
      if self.full_shape[axis] == amt and axis == self.first_reduce: self.local_dims += 1
      if self.full_shape[axis] == amt and axis < self.first_reduce + self.group_for_reduces: self.group_for_reduces -= 1  # a whole GROUP
      self.shift_to(axis, amt, insert_before=None)
      self.upcast()
    elif opt.op is OptOps.UPCAST:
      check(axis < self.first_reduce, "upcast is for non-reduce")
      check(not (self.tensor_core and self.global_dims <= axis < self.global_dims + len(self.tensor_core.threads)), "can't upcast TC locals")
      check(amt <= 16, "don't upcast more than 16")
      self.shift_to(axis, amt, insert_before=None)
      self.upcast()
    elif opt.op is OptOps.UPCASTMID:
      check(self.bufs[0].src[0].dtype.name.startswith("image") and not self.float4_axis(0) and self.group_for_reduces != 0 and
            self.first_reduce <= 2 and prod(self.sts[0].shape) > 1, "invalid upcast mid reduce")
      axes = self.sts[0].unit_stride_axes()
      check(len(axes) == 1, f"wrong number of stride 1 axis : {axes}")
      check(axes[0] == axis, "wrong axis")
      check(amt == 4, "don't upcast mid anything but 4")
      self.shift_to(axis, amt, insert_before=self.first_reduce + self.group_for_reduces)
      self.group_for_reduces += 1
    elif opt.op is OptOps.NOLOCALS:
      check(self.renderer.has_local and not self.dont_use_locals,
            "NOLOCALS is meaningless if target does not support local or already not using locals")
      check(self.local_dims == 0 and self.group_for_reduces == 0, "can't have no locals with locals")
      self.dont_use_locals = True
    elif opt.op is OptOps.SWAP:
      check(axis < amt < self.global_dims,
            f"swap is only for globals with axis < amt, getting amt={amt}, axis={axis}, global_dims={self.global_dims}")
      permute = list(range(self.shape_len))
      permute[axis], permute[amt] = permute[amt], permute[axis]
      self.reshape_and_permute(None, permute)
    elif opt.op is OptOps.PADTO:
      check(not self.vars, "does not work with symbolic shape")
      check(axis < self.first_upcast, "cannot pad upcasted")
      # a tensor core's thread axes are whole warps: padded, a work-group would hold a part of one
      check(not (self.tensor_core and self.global_dims <= axis < self.global_dims + len(self.tensor_core.threads)),
            "cannot pad a tensor core's thread axes (TC locals): their threads are whole warps")
      # every reduce that walks this axis would also sum the padding: only a sum of values that are 0 there is safe
      for j, r in enumerate(self.reduceops):
        out_st, in_st = self.sts[len(self.bufs) + 2 * j], self.sts[len(self.bufs) + 2 * j + 1]
        if out_st.shape[axis] != in_st.shape[axis]:
          check(r.arg[0] is Ops.ADD and can_pad(r), f"cannot pad the reduce {r.arg[0]}: its input is not 0 where the inputs are padded")
      # the padding reads 0: a division by a value that is read from a buffer would divide by zero there
      for u in self.ast.toposort:
        if u.op in (Ops.IDIV, Ops.MOD) and u.src[1].op is not Ops.CONST:
          check(False, f"cannot pad: {u.op} by a loaded value would divide by zero in the padding")
      padded = False
      for i, st in enumerate(self.sts):
        if (s := st.shape[axis]) == 1: continue  # reduced here
        check(s > amt // 4, f"pad adds more than quadruple the work: size {s} padded to a multiple of {amt}")
        if ru := round_up(s, amt) - s:
          self.sts[i] = st.pad(((0, 0),) * axis + ((0, ru),) + ((0, 0),) * (len(st.shape) - axis - 1))
          padded = True
      check(padded, "nothing was padded")

    if opt.op in (OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.UPCASTMID): self._check_work_group()
    if append_opt: self.applied_opts.append(opt)
    if self.simplify_ones() and self.tensor_core_opts: self.tensor_core_opts.fix_axes(axis)

  def _axis_start(self, opt: Opt) -> int:
    """The kernel axis that opt's axis 0 names: UNROLL counts from the first reduce axis, GROUP and GROUPTOP from the
    first reduce axis not grouped yet, every other op from 0."""
    if opt.op is OptOps.UNROLL: return self.first_reduce
    return self.first_reduce + self.group_for_reduces if opt.op in (OptOps.GROUP, OptOps.GROUPTOP) else 0

  def real_axis(self, opt: Opt) -> int:
    """The kernel axis `opt` applies to (-1 for none)."""
    return -1 if opt.axis is None else self._axis_start(opt) + opt.axis

  def _axis_out_of_range(self, opt: Opt) -> str:
    """Why opt.axis names no axis of this kernel: the op, the axis, the axes it could name and the shape."""
    shape, head = f"shape {fmt_shape(self.full_shape)}", f"{opt.op.name} axis {opt.axis} is out of range"
    first = self._axis_start(opt)
    if opt.op is OptOps.UNROLL: counts, kind = "UNROLL's axis counts from the first reduce axis", "reduce axis"
    elif opt.op in (OptOps.GROUP, OptOps.GROUPTOP):
      counts, kind = f"{opt.op.name}'s axis counts from the first reduce axis not grouped yet", "reduce axis left to group"
    else: counts, kind = "", "axis"
    n = self.shape_len - first
    valid = "axis 0" if n == 1 else f"axes 0..{n - 1}"
    if n <= 0: return f"{head}: {counts + ', and ' if counts else ''}this kernel has no {kind} ({shape})"
    if not counts: return f"{head}: this kernel has {'only ' if n == 1 else ''}{valid} ({shape})"
    return f"{head}: {counts} (axis {first} of {shape}), so {valid} {'is' if n == 1 else 'are'} valid"

  def _check_work_group(self) -> None:
    """The local dims (and grouped reduce dims) are one work-group's threads: all of them together within what the
    launch axes hold (the product of local_max; a dim may be split across axes) and within the renderer's
    max_work_group_size, or the launch fails on the device."""
    dims = self.full_shape[self.first_reduce - self.local_dims:self.first_reduce + self.group_for_reduces]
    if not all_int(dims): return
    if (limits := self.renderer.local_max) is not None:
      check(prod(dims) <= prod(limits),
            f"a work-group of {prod(dims)} threads (local dims {dims}) exceeds the renderer's local_max {limits} ({prod(limits)} threads)")
    if (most := self.renderer.max_work_group_size) is not None:
      check(prod(dims) <= most, f"a work-group of {prod(dims)} threads (local dims {dims}) exceeds the device's max work-group size {most}")

  # ***** tensor cores *****

  def _check_tc_staging(self) -> None:
    """Tensor-core level 3 stages both inputs through local memory in the warp's layout (optimized_ast): those
    buffers, one element per position outside the reduce's unrolled axes, must fit the renderer's shared memory."""
    tc = self.tensor_core
    staged = prod(1 if self.first_reduce <= j < self.first_upcast else s for j, s in enumerate(self.full_shape))
    need = 2 * staged * tc.dtype_in.itemsize
    check(resolve(need <= self.renderer.shared_max, False),
          f"tensor-core level 3 stages {need} bytes of inputs in local memory, more than shared_max {self.renderer.shared_max}")

  def _create_tc_opts(self, reduceop: UOp, tc: "TensorCore", axis: int, opt_level: int) -> Optional[TensorCoreOptions]:
    has_cast = tc.dtype_in != tc.dtype_out
    src = reduceop.src[0]
    # the product in dtype_in accumulated in dtype_out, or the inputs widened to dtype_out first (kc.ast's half and
    # bfloat16 matmul): products of dtype_in values are exact in dtype_out, as the instruction computes them
    widened = has_cast and src.op is Ops.MUL and src.dtype == tc.dtype_out and \
      all(s.op is Ops.CAST and s.src[0].dtype == tc.dtype_in and s.src[0] in self.bufs for s in src.src)
    if has_cast and not widened and not (src.op is Ops.CAST and src.dtype == tc.dtype_out): return None
    mul_op = src.src[0] if has_cast and not widened else src
    if mul_op.op is not Ops.MUL: return None

    def buf_index(src: UOp) -> Optional[int]:
      if src.op is Ops.LOAD and src.dtype == tc.dtype_in and src in self.bufs: return self.bufs.index(src)
      if widened: return self.bufs.index(src.src[0])
      # (tc_opt >= 1) inputs cast to dtype_in, but not a float widened to it that another tensor core takes as it is
      if opt_level >= 1 and src.op is Ops.CAST and src.dtype == tc.dtype_in and src.src[0] in self.bufs and \
         not (dtypes.is_float(src.src[0].dtype) and any(t.dtype_in == src.src[0].dtype for t in self.renderer.tensor_cores)):
        return self.bufs.index(src.src[0])
      return None
    if (buf0 := buf_index(mul_op.src[0])) is None or (buf1 := buf_index(mul_op.src[1])) is None: return None

    strides0, strides1 = self.sts[buf0].real_strides(), self.sts[buf1].real_strides()
    axis_buf0 = [(i, self.full_shape[i], strides1[i]) for i, s in enumerate(strides0[:self.first_reduce]) if s == 0]
    axis_buf1 = [(i, self.full_shape[i], strides0[i]) for i, s in enumerate(strides1[:self.first_reduce]) if s == 0]
    if not (axis_buf0 and axis_buf1 and ((self.shape_len - self.first_reduce) == 1 or opt_level >= 1)): return None
    # N and M are two different axes: an axis that neither operand walks (a broadcast of the whole product) is a
    # candidate for both, and taking it as both made one axis do the work of two (the output's lanes repeated)
    choices = [c for c in itertools.product(axis_buf0, axis_buf1, range(self.first_reduce, self.shape_len)) if c[0][0] != c[1][0]]
    if not axis < len(choices): return None
    s0, s1, s2 = choices[-(axis + 1)][0][0], choices[-(axis + 1)][1][0], choices[-(axis + 1)][2]  # N, M, K
    axis_pads = tuple((x, tc.dims[i]) for i, x in enumerate([s0, s1, s2]) if resolve(self.full_shape[x] % tc.dims[i] != 0))
    if axis_pads and opt_level < 2: return None
    self.bufs_for_tensor_core[reduceop] = (buf0, buf1)
    return TensorCoreOptions(axes=(s0, s1, s2), axes_exist=(True, True), axis_pads=axis_pads)

  def _apply_tc_opt(self, axis: int, opt_level: int) -> bool:
    if not (self.reduceop is not None and self.reduceop.arg[0] is Ops.ADD): return False
    for tc in self.renderer.tensor_cores:
      options = [self._create_tc_opts(r, tc, axis, opt_level) for r in self.reduceops]
      if not all_same(options) or options[0] is None: continue  # reduces can share a tensor core only with the same options
      self.tensor_core_opts = tc_opts = options[0]
      try:
        for ax, dim in tc_opts.axis_pads: self.apply_opt(Opt(OptOps.PADTO, ax, dim), False)
      except KernelOptError: continue
      for _, amt in tc.reduce_axes: self.apply_opt(Opt(OptOps.UNROLL, tc_opts.axes[2] - self.first_reduce, amt), False)
      for step in tc.opts_seq:
        if step == "UP":
          for d, amt in tc.early_upcast_axes: self.apply_opt(Opt(OptOps.UPCAST, tc_opts.axes[d], amt), False)
        else:
          for d, amt in tc.threads: self.apply_opt(Opt(OptOps.LOCAL, tc_opts.axes[d], amt), False)
      self.tensor_core = tc
      return True
    return False

  def apply_tensor_cores(self, tc_level: Optional[int] = None, extra_opts: Optional[list[Opt]] = None, axis: int = 0,
                         tc_opt: Optional[int] = None, *, use_tensor_cores: Optional[int] = None) -> bool:
    """Apply a tensor core (D = A*B + C across a warp) if one fits; True if it did.

    tc_level (also accepted as use_tensor_cores=, its older name): 0 off, 1 real WMMA, 2 the tensor core's shape opts
    without WMMA, 3 WMMA's thread addressing emulated through local memory; default: the Kernel's own tc_level.
    extra_opts: opts to apply afterwards instead of the hand-coded follow-ups. tc_opt (the TC opt's amount): which
    kernels qualify; 0 one reduce axis over LOADs multiplied directly, 1 also CAST inputs and more reduce axes, 2 also
    M/N/K that need padding to the tensor core's dims (default: KC_TC_OPT, else 0)."""
    if use_tensor_cores is not None:
      if tc_level is not None and tc_level != use_tensor_cores:
        raise ConfigError(f"apply_tensor_cores got tc_level={tc_level!r} and use_tensor_cores={use_tensor_cores!r}, two "
                          "names of one setting: pass tc_level only")
      tc_level = use_tensor_cores
    level = self.tc_level if tc_level is None else checked_tc_level(tc_level)
    if tc_opt is None: tc_opt = read("KC_TC_OPT")
    if not level or not self.renderer.tensor_cores: return False
    saved = self.state.copy()
    try:
      self.tc_level = level
      self.apply_opt(Opt(OptOps.TC, axis, tc_opt))
      if (tc_opts := self.tensor_core_opts) is not None:
        if extra_opts is not None:
          for opt in extra_opts: self.apply_opt(opt)
        else:
          for d in [d for d in (1, 0) if tc_opts.axes_exist[d]]:  # upcast M, then N
            if szs := [sz for sz in (5, 4, 3, 2) if self.full_shape[tc_opts.axes[d]] % sz == 0]:
              self.apply_opt(Opt(OptOps.UPCAST, tc_opts.axes[d], szs[0]))
          if tc_opts.axes_exist[0] and (szs := [sz for sz in (4, 2) if self.full_shape[tc_opts.axes[0]] % sz == 0]):
            self.apply_opt(Opt(OptOps.LOCAL, tc_opts.axes[0], szs[0]))
      return True
    except KernelOptError:
      self.state = saved
      return False

  # ***** heuristics *****

  def required_optimizations(self) -> "Kernel":
    run_required(self)
    return self

  def hand_coded_optimizations(self) -> "Kernel":
    with collector_paused(): run_hand_coded(self)  # (kc.codegen.program.collector_paused: what codegen keeps alive)
    return self

  # ***** outputs *****

  @property
  def name(self) -> str:
    """r_ (reduce), E_ (elementwise) or C_ (copy) and the full shape coloured by axis kind. Two kernels of one shape
    share a name: the name is part of the source, and a source that depended on what the process compiled before
    (a per-process counter) would miss the compile cache in every other process."""
    if "name" not in self.__dict__:
      kind = "r" if self.reduceop is not None else \
        ("C" if all(x.op in GroupOp.Buffer or x.op in (Ops.VIEW, Ops.DEFINE_GLOBAL) for x in self.ast.parents) else "E")
      suffix = colored("_", "BLACK").join(colored(x.render() if isinstance(x, UOp) else str(x), c) for x, c in zip(self.full_shape, self.colors()))
      name = kind + (f"{len(self.ast.src)}" if len(self.ast.src) > 1 else "") + "_" + suffix
      self.__dict__["name"] = name
    return self.__dict__["name"]

  def get_optimized_ast(self) -> UOp:
    """The AST with every applied opt folded in (views, reduce axes, local-memory reduces, WMMA)."""
    return get_optimized_ast(self)

  def linearize(self) -> list[UOp]:
    """The linear UOps of this kernel with its applied opts, as the renderer receives them."""
    return linearize_ast(self.get_optimized_ast(), self.renderer)

  def to_program(self, name_override: Optional[str] = None) -> Program:
    """The kc.Program of this kernel with its applied opts: lowered, linearized and rendered by its renderer."""
    name = to_function_name(name_override if name_override is not None else self.name)
    with collector_paused(): return render_program(self.get_optimized_ast(), self.renderer, name, self.ast)


for _field in dataclasses.fields(KernelState): setattr(Kernel, _field.name, _state_attribute(_field.name))


def can_pad(u: UOp) -> bool:
  """A reduce's input is 0 wherever its inputs are padding (every LOAD reads 0, every VALID is false), so padding
  its axes leaves the result unchanged. Decided by evaluating the input there: exp2, recip, log2, a constant
  added, or a broadcast of another reduce all make padding count."""
  zeros: dict[UOp, UOp] = {}
  for x in u.src[0].toposort:
    if x.op is Ops.LOAD: zeros[x] = UOp.const(x.dtype, 0)
    elif x.op is Ops.VALID: zeros[x] = UOp.const(dtypes.bool, False)
    elif x.op in (Ops.REDUCE_AXIS, Ops.VIEW) and x.src: return False  # another reduce's value is not 0 in the padding
  at_padding = u.src[0].substitute(zeros).simplify()
  return at_padding.op is Ops.CONST and at_padding.arg == 0


def _is_zero(x) -> bool: return isinstance(x, int) and x == 0


def _same(a, b) -> bool:
  """a == b for sints, decided on the simplified forms (hash-consing makes equal expressions identical)."""
  if a is None or b is None: return False
  return ssimplify(a) == ssimplify(b)
