"""The hand-coded optimizations: what a Kernel gets when nobody searches. Each step is tried in order and a
refused opt simply skips that step. The knobs KC_MV_BLOCKSIZE, KC_MV_THREADS_PER_ROW, KC_MV_ROWS_PER_THREAD, KC_MV=0 and
KC_NOLOCALS=1 are read through kc.config."""
from __future__ import annotations
import itertools
from typing import Any, Callable, Optional
from kc.ir.dtype import ImageDType
from kc.errors import KernelOptError
from kc.config import read
from kc.helpers import all_int, prod, vector_registers
from kc.kernel.opt import Opt, OptOps
from kc.kernel.protocol import OptimizingKernel
from kc.ir.symbolic import resolve
from kc.ir.uop import Ops, UOp
from kc.shape import ShapeTracker



def _knob(name: str) -> int: return read(name)


def required_optimizations(k: OptimizingKernel) -> None:
  """Images are read and written 4 channels at a time, so their unit-stride axis is always upcast by 4."""
  if isinstance(k.membufs[0].dtype, ImageDType):
    axes = [i for i in k.sts[0].unit_stride_axes(ignore_valid=True) if k.sts[0].shape[i] % 4 == 0]
    if not axes: raise KernelOptError(f"an image output needs a unit-stride axis divisible by 4, shape {k.sts[0].shape}")
    if all(x < k.first_upcast for x in axes) and axes[0] not in k.upcast_in_mid_reduce_axes:
      k.apply_opt(Opt(OptOps.UPCAST, axes[0], 4))


def _try(k: OptimizingKernel, opt: Opt) -> bool:
  try: k.apply_opt(opt)
  except KernelOptError: return False
  return True


def _step(k: OptimizingKernel, step: Callable[[OptimizingKernel], Any]) -> bool:
  """Run one step of the heuristics as a whole: where the kernel refuses an opt the step applies, the kernel is left
  as the step found it and the step counts as not taken. A step's opts make sense together (the matvec's GROUP,
  LOCAL and UPCAST), and a step that checks only some of what the kernel checks (the matvec's GROUP on a kernel of
  two reduces over one axis, a layer norm's backward) must skip, not fail the kernel."""
  saved = k.state.copy()
  try: return bool(step(k))
  except KernelOptError:
    k.state = saved
    return False


def hand_coded_optimizations(k: OptimizingKernel) -> None:
  required_optimizations(k)  # not a step: an image output that cannot have its vector axis cannot be compiled at all
  if any(isinstance(s, int) and s == 0 for s in k.full_shape): return  # no work (or an empty reduce): nothing to speed up
  if _step(k, _matvec): return
  if k.renderer.has_local and k.renderer.has_shared and all_int(k.sts[0].shape[:k.first_reduce]):
    _step(k, _group_small_output_reduce)
    _step(k, _upcast_mid_reduce_for_images)
  _step(k, _upcast_image_inputs)
  if k.group_for_reduces:  # nothing more once the reduce is grouped, but its own loop's vector step
    _step(k, _unroll_grouped_reduce)
    return
  _step(k, _upcast_masked_axes)
  if not any(_step(k, tile) for tile in (_reduce_vector_tile, _vector_register_tile, _transpose_tile)): _step(k, _upcast_expanded_axes)
  _step(k, _unroll_reduce)
  _step(k, _upcast_last_axis)
  _step(k, _locals)


def _matvec(k: OptimizingKernel) -> bool:
  """A reduce of LOAD*LOAD whose first input is contiguous along the reduce: threads per row, rows per block."""
  block, threads, rows = _knob("KC_MV_BLOCKSIZE"), _knob("KC_MV_THREADS_PER_ROW"), _knob("KC_MV_ROWS_PER_THREAD")
  r = k.reduceop
  if not (k.renderer.has_local and _knob("KC_MV") != 0 and (block > 1 or threads > 1 or rows > 1) and r is not None and r.arg[0] is Ops.ADD
          and len(k.full_shape) >= 2 and k.first_reduce < k.first_upcast and k.renderer.has_shared and (mul := r.src[0]).op is Ops.MUL
          and mul.src[0].op is Ops.LOAD and mul.src[1].op is Ops.LOAD):
    return False
  st0, st1 = k.sts[k.bufs.index(mul.src[0])], k.sts[k.bufs.index(mul.src[1])]
  strides0, strides1 = st0.real_strides(), st1.real_strides()
  def has_expanded_axis(shape, strides): return any(resolve(s > 1) and not resolve(st != 0) for s, st in zip(shape, strides))
  if strides0[k.first_reduce] == 1 and not (has_expanded_axis(st0.shape, strides0) and has_expanded_axis(st1.shape, strides1)):
    for global_idx in range(k.global_dims):
      if k.full_shape[k.first_reduce] % threads == 0 and k.full_shape[global_idx] % (block * rows) == 0:
        if threads > 1: k.apply_opt(Opt(OptOps.GROUP, 0, threads))
        if block > 1: k.apply_opt(Opt(OptOps.LOCAL, global_idx, block))
        if rows > 1: k.apply_opt(Opt(OptOps.UPCAST, global_idx, rows))
        return True
  return False


def _group_small_output_reduce(k: OptimizingKernel) -> None:
  """Few outputs and a long reduce: split the reduce across a work-group (GROUPTOP) when shared memory allows."""
  out_size = prod(k.sts[0].shape[:k.first_reduce])
  if not k.float4_axis(0) and k.first_reduce <= 2 and k.first_reduce + 1 <= k.shape_len and out_size <= 2048:
    for sz in ([256, 16] if out_size <= 32 else [16]):
      if all(st.shape[k.first_reduce] % sz == 0 or st.shape[k.first_reduce] == 1 for st in k.sts):
        if _try(k, Opt(OptOps.GROUPTOP, 0, sz)): break


def _unroll_grouped_reduce(k: OptimizingKernel) -> None:
  """A grouped reduce's own loop (the innermost reduce axis the group left) that a load walks contiguously steps 4
  elements at a time: one vector load, and the work on it as vector ops. A CPU device that runs a work-group as
  loops vectorizes nothing across the group's barrier, and did each element's exp of a softmax's sum alone (PoCL:
  4.0 ms -> 0.37 ms for 256 rows of 1024)."""
  axis = k.first_upcast - 1
  if axis < k.first_reduce + k.group_for_reduces or not isinstance(n := k.full_shape[axis], int) or n % 4 or n <= 4: return
  if any(st.views[-1].strides[axis] == 1 and not st.axis_is_masked(axis) for st in k.sts[1:]):
    _try(k, Opt(OptOps.UNROLL, axis - k.first_reduce, 4))


def _upcast_mid_reduce_for_images(k: OptimizingKernel) -> None:
  if k.bufs[0].src[0].dtype.name.startswith("image") and not k.float4_axis(0) and k.group_for_reduces and k.first_reduce <= 2 \
     and prod(k.sts[0].shape) > 1:
    axes = k.sts[0].unit_stride_axes()
    if len(axes) == 1 and k.sts[0].shape[axes[0]] % 4 == 0:
      k.apply_opt(Opt(OptOps.UPCASTMID, axes[0], 4))


def _upcast_image_inputs(k: OptimizingKernel) -> None:
  for i, buf in enumerate(k.bufs):
    if not isinstance(buf.src[0].dtype, ImageDType): continue  # (the stride analysis only for images)
    axes = [a for a in k.sts[i].unit_stride_axes(ignore_valid=True) if k.sts[i].shape[a] % 4 == 0]
    if axes and all(x < k.first_upcast for x in axes) and axes[0] not in k.upcast_in_mid_reduce_axes:
      if axes[0] < k.first_reduce: k.apply_opt(Opt(OptOps.UPCAST, axes[0], 4))
      else: k.apply_opt(Opt(OptOps.UNROLL, axes[0] - k.first_reduce, 4))


def _upcast_masked_axes(k: OptimizingKernel) -> None:
  """Small axes with validity masks (from stacks and pads) are unrolled entirely, leading axes first."""
  to_upcast: list[int] = []
  for axis in range(k.first_reduce):
    s = k.full_shape[axis]
    if isinstance(s, int) and s <= 7 and any(st.axis_is_masked(axis) for st in k.sts) and \
       prod(k.full_shape[k.first_upcast:]) * prod(k.full_shape[j] for j in to_upcast) * s <= 7 * 7:
      to_upcast.append(axis)
  for axis in reversed(to_upcast): k.apply_opt(Opt(OptOps.UPCAST, axis, 0))


def _upcast_expanded_axes(k: OptimizingKernel) -> None:
  """While there are many outputs, upcast (by 3 or 4) a global axis some buffer is expanded along (stride 0),
  preferring axes few buffers walk: each upcast lane then reuses the loaded value."""
  done: set[int] = set()
  while resolve(prod(k.sts[0].shape[:k.first_reduce]) >= 1024):
    choices = []
    for axis, amt in itertools.product(range(k.first_reduce), [3, 4]):
      if axis in done or not isinstance(k.full_shape[axis], int) or k.full_shape[axis] % amt != 0: continue
      if any(st.views[-1].strides[axis] == 0 and not any(x[1] == 0 for x in k.upcasted_axis(i)) for i, st in enumerate(k.sts)):
        choices.append((sum(_positive(st.views[-1].strides[axis]) for st in k.sts),
                        sum(_stride_weight(st.views[-1].strides[axis]) for st in k.sts), axis, amt))
    if not choices: break
    _, _, axis, amt = sorted(choices)[0]
    if axis in k.sts[0].unit_stride_axes() and (width := _widest_vector(k)) and k.full_shape[axis] % width == 0: amt = width
    k.apply_opt(Opt(OptOps.UPCAST, axis, amt))
    done.add(axis)


def _widest_vector(k: OptimizingKernel) -> int:
  """The widest vector of the output's dtype on a renderer that computes on vectors (vector_alu), else 0."""
  out_dt = k.bufs[0].src[2].dtype if len(k.bufs[0].src) > 2 else None
  if not k.renderer.vector_alu or out_dt is None or out_dt.count != 1: return 0
  return max(k.renderer.vector_widths(out_dt), default=0)


def _vector_register_tile(k: OptimizingKernel) -> bool:
  """On a renderer that computes on vectors (vector_alu), a reduce whose output is contiguous along an axis and
  whose inputs are broadcast along another (a matmul's N and M) gets a register tile: `cols` vectors of the widest
  width along the contiguous axis times `rows` along the broadcast one, one vector accumulator each. It fits the
  vector registers with the `cols` vectors loaded per step of the reduce and one splat: rows*cols + cols + 1 <= the
  registers. Each step of the reduce loop then loads `cols` contiguous vectors and does rows*cols vector FMAs.

  The rows are an axis along which every input read along the contiguous axis is broadcast, so each row reuses
  the vectors loaded for the cols (a matmul's M; a conv's output channels, not its image rows). Where such an
  input is padded along the contiguous axis (a conv's window), its lanes are loaded one by one and packed: then a
  single col with as many rows as fit shares each packed vector most. Returns whether it applied the tile."""
  if k.reduceop is None or k.upcasted or k.first_reduce == 0 or not (width := _widest_vector(k)): return False
  regs = vector_registers(width * k.bufs[0].src[2].dtype.itemsize)
  unit = [a for a in k.sts[0].unit_stride_axes() if a < k.first_reduce and isinstance(k.full_shape[a], int)]
  if not unit: return False
  vn = unit[-1]
  # a reduce result broadcast back along the output's rows (a softmax's max and sum): a tile there would repeat the
  # row's reduces for every block of columns
  if vn in (broadcast := _reduce_broadcast_axes(k)): return False
  loads = _loads(k)
  # the vectors run along an axis every input reads contiguously (or not at all): the output's own where it is one,
  # else another (an output stored transposed, as a gradient's g.T @ x can be): its vectors are then stored lane by
  # lane once, after the reduce, instead of loaded lane by lane at every step of it
  def walking(a: int) -> list: return [st for _, st in loads if st.views[-1].strides[a] != 0]
  def contiguous(a: int) -> bool: return bool(walk := walking(a)) and all(st.views[-1].strides[a] == 1 and not st.axis_is_masked(a) for st in walk)
  if any(st.views[-1].strides[vn] != 1 for st in walking(vn)) and \
     (others := [a for a in range(k.first_reduce) if a not in broadcast and isinstance(k.full_shape[a], int) and contiguous(a)]):
    vn = others[-1]
  if not _rows_axes(k, vn, loads)[1] and contiguous(vn): return _column_tile(k, vn, width, regs)
  if k.full_shape[vn] % width: return _padded_tile(k, vn, width)
  return _tile_along(k, vn, width)


def _loads(k: OptimizingKernel) -> list[tuple[UOp, ShapeTracker]]:
  """(LOAD, its view) of every input of the kernel."""
  return [(b, k.sts[i]) for i, b in enumerate(k.bufs) if b.op is Ops.LOAD]


def _rows_axes(k: OptimizingKernel, vn: int, loads: list) -> tuple[list, list[int]]:
  """(the inputs read along `vn`, the axes a tile's rows may take: every such input broadcast along them, else
  some input broadcast along them)."""
  along = [(b, st) for b, st in loads if st.views[-1].strides[vn] != 0]
  candidates = [a for a in range(k.first_reduce) if a != vn and isinstance(k.full_shape[a], int)]
  return along, [a for a in candidates if along and all(st.views[-1].strides[a] == 0 for _, st in along)] or \
                [a for a in candidates if any(st.views[-1].strides[a] == 0 for _, st in loads)]


def _tile_along(k: OptimizingKernel, vn: int, width: int, packed: Optional[bool] = None, padded: bool = False) -> bool:
  """_vector_register_tile's tile once its vector axis `vn` is chosen: the largest that fits, or none. `packed`:
  whether an input read along vn is masked there (its lanes then loaded one by one), where the mask of a PADTO
  hides the inputs' own. A `padded` axis keeps one col: two would make a masked vector of every tile's second col
  (conv_net's first convolution, 30 columns padded to 32: 900 us with two cols, 330 with one, one thread)."""
  regs = vector_registers(width * k.bufs[0].src[2].dtype.itemsize)
  loads = _loads(k)
  along, rows_axes = _rows_axes(k, vn, loads)
  if packed is None: packed = any(st.axis_is_masked(vn) for _, st in along)
  tiles = [(1, rows) for rows in (16, 12, 8, 6, 4, 3, 2)] if packed else \
          [(cols, rows) for cols in ((1,) if padded else (2, 1)) for rows in (8, 6, 4, 3, 2)]
  for cols, rows in tiles:
    # each reduce of the kernel (the outputs of one loop nest: an attention backward's three products) keeps its own
    # accumulators and loads its own cols: spilled accumulators cost more than a smaller tile
    if k.full_shape[vn] % (width * cols) or len(k.reduceops) * (rows * cols + cols) + 1 > regs: continue
    vm = next((a for a in reversed(rows_axes) if k.full_shape[a] % rows == 0), None)
    if vm is None: continue
    # the cols as two upcasts (width, then cols of those: an upcast takes at most 16 lanes); an axis upcast whole
    # moves to the upcast axes entirely, and the axes after it move down by one
    # the panels: every output axis but the rows' that the vector inputs walk and the others do not (the columns'
    # own, and the panel axis of an input kc.schedule.pack_operand packed, whose columns within a panel are vn)
    across = [(b, st) for b, st in loads if st.views[-1].strides[vn] == 0]
    panel_axes = [a for a in range(k.first_reduce) if a != vm and all(st.views[-1].strides[a] != 0 for _, st in along)
                  and all(st.views[-1].strides[a] == 0 for _, st in across)]
    swap = _panel_outermost_reads_less(k, along, across, vm, panel_axes, rows, width * cols)
    before = k.shape_len
    if not _try(k, Opt(OptOps.UPCAST, vn, width)): return False
    vn_kept = k.shape_len > before
    if not vn_kept and vm > vn: vm -= 1
    if cols > 1 and vn_kept:
      before = k.shape_len
      _try(k, Opt(OptOps.UPCAST, vn, cols))
      if k.shape_len == before:
        vn_kept = False
        if vm > vn: vm -= 1
    before = k.shape_len
    vm_kept = not _try(k, Opt(OptOps.UPCAST, vm, rows)) or k.shape_len > before  # refused: the cols alone are a tile
    # the loop over panels outside the rows' loop: vn's, or where vn was upcast whole, the next panel axis
    outer = vn if vn_kept else next((a - (a > vn) for a in panel_axes if a != vn), None)
    if swap and vm_kept and outer is not None and vm < outer: _try(k, Opt(OptOps.SWAP, vm, outer))
    _unroll_window(k)
    return True
  return False


def _padded_tile(k: OptimizingKernel, vn: int, width: int) -> bool:
  """The register tile of an output axis that is no multiple of the vector width (a convolution's 30 or 13 output
  columns, a matmul's N of 1000): the axis padded to a multiple (PADTO: the padding's lanes are masked, their loads
  read 0 and their stores are skipped), where that adds at most a third of the work, and tiled as any other. Scalar
  accumulators were the alternative: a second convolution's 12 output columns (of 32 channels, 16 in, 3x3, batch 8)
  750 -> 222 us, x @ w of 2048x128x1000 35 -> 124 GFLOP/s (CLANG, one thread, AVX-512 Zen 5). A padded axis that
  gets no tile is left as it was (the kernel's state put back, as _step does)."""
  size = k.full_shape[vn]
  if not isinstance(size, int) or 3 * -(-size // width) * width > 4 * size: return False
  # the padding's mask is the tail of the axis, not a window's edge: the inputs are packed only where they were before
  packed = any(st.axis_is_masked(vn) for _, st in _rows_axes(k, vn, _loads(k))[0])
  saved = k.state.copy()
  if _try(k, Opt(OptOps.PADTO, vn, width)) and k.full_shape[vn] % width == 0 and _tile_along(k, vn, width, packed, padded=True):
    return True
  k.state = saved
  return False


def _column_tile(k: OptimizingKernel, vn: int, width: int, regs: int) -> bool:
  """The register tile of a reduce that no input is broadcast in (no rows to reuse a loaded vector across) and whose
  output is contiguous along an axis every input walks contiguously while the reduce walks another: a column sum, a
  bias's gradient (the sum of g over the batch). Up to 4 vectors of that axis, one accumulator each, so each step of
  the reduce loads a few whole vectors of every input's row. Unvectorized, every step loaded one float of a row and
  the next output walked every row again (a 64x1024 column sum on CLANG: 350 us, 16 us for numpy)."""
  for cols in (4, 2, 1):
    if k.full_shape[vn] % (width * cols) or 2 * cols + 1 > regs: continue
    before = k.shape_len
    if not _try(k, Opt(OptOps.UPCAST, vn, width)): return False
    if cols > 1 and k.shape_len > before: _try(k, Opt(OptOps.UPCAST, vn, cols))
    return True
  return False


def _reduce_vector_tile(k: OptimizingKernel) -> bool:
  """On a renderer that computes on vectors (vector_alu), a sum or max whose every input is contiguous along its last
  reduce axis (or constant along it) is vectorized along that axis: the axis unrolled by the widest vector, one
  vector accumulator per output of a register tile (kc.codegen.lower keeps an accumulator per unrolled lane where the
  lanes load as vectors), its lanes combined once after the loop. A matmul with K-contiguous operands (`x @ w.T`, torch's
  Linear) and a row sum are such reduces; the output-axis register tile would load them lane by lane.

  The tile spans up to two output axes along which some input is broadcast (a matmul's M and N), so each loaded
  vector is reused across the other axis: rows*cols accumulators plus the rows+cols vectors loaded per step fit the
  vector registers (for each of several reduces side by side). The axis along which the larger input varies runs
  outermost, so that input streams once while the smaller one is re-read from cache."""
  reduces = k.reduceops
  if k.reduceop is None or k.upcasted or any(x.arg[0] not in (Ops.ADD, Ops.MAX) for x in reduces) or not (width := _widest_vector(k)):
    return False
  # several reduces side by side (the outputs of one loop nest: an attention backward's two products) share the tile,
  # each with its own accumulators; a reduce inside another's input (a softmax's max in its sum) is not such a kernel
  if len(reduces) > 1 and any(o in x.src[0].toposort for x in reduces for o in reduces if o is not x): return False
  r = k.first_upcast - 1
  if r < k.first_reduce or not isinstance(k.full_shape[r], int) or k.full_shape[r] % width: return False
  loads = [(b, st) for b, st in zip(k.bufs, k.sts) if b.op is Ops.LOAD]
  strides = [st.real_strides() for _, st in loads]
  if not any(s[r] == 1 for s in strides) or not all(s[r] in (0, 1) for s in strides): return False
  # output axes along which an input that walks the reduce is broadcast (its vectors reused there), most reuse first
  broadcast = _reduce_broadcast_axes(k)
  reuse = {a: sum(s[a] == 0 for s in strides if s[r] == 1) for a in range(k.first_reduce) if isinstance(k.full_shape[a], int) and a not in broadcast}
  axes = sorted((a for a, n in reuse.items() if n), key=lambda a: (-reuse[a], -a))[:2] or [a for a in reversed(reuse)][:1]
  regs = vector_registers(width * k.bufs[0].src[2].dtype.itemsize)
  tiles = [(4, 4), (4, 3), (3, 4), (4, 2), (2, 4), (3, 3), (2, 3), (3, 2), (2, 2), (4, 1), (2, 1)] if len(axes) == 2 else [(4,), (2,)]
  for tile in tiles:
    if len(tile) == 2 and len(reduces) * (tile[0] * tile[1] + tile[0] + tile[1]) > regs: continue
    if any(k.full_shape[a] % t for a, t in zip(axes, tile)): continue
    # both axes keep a loop (neither is upcast whole, which would move it and renumber the axes after it)
    both_loop = len(axes) == 2 and all(k.full_shape[a] > t for a, t in zip(axes, tile))
    if not _try(k, Opt(OptOps.UNROLL, r - k.first_reduce, width)): return False
    for a, t in sorted(zip(axes, tile), reverse=True):  # the later axis first: the earlier one keeps its number
      if t > 1: _try(k, Opt(OptOps.UPCAST, a, t))
    if both_loop:
      outer, inner = sorted(axes)
      def walked(a: int) -> int: return max((_buffer_bytes(b) for (b, _), s in zip(loads, strides) if s[a] != 0), default=0)
      if walked(inner) > walked(outer): _try(k, Opt(OptOps.SWAP, outer, inner))
    return True
  return False


def _transpose_tile(k: OptimizingKernel) -> bool:
  """A kernel without a reduce on a renderer without work-groups whose output is contiguous along one axis and an
  input along another (a transpose, a permuted copy) gets a square tile of both axes: each step loads a few whole
  rows of the input and stores a few whole rows of the output, where upcasting the output's axis alone loads every
  lane from another row of the input (a 1024x512 float transpose: 0.21 ms with 8x8, 1.7 with the output's axis by 16).
  The input's axis is upcast first, so the output's lanes are innermost. Returns whether it applied the tile."""
  if k.reduceop is not None or k.upcasted or k.renderer.has_local: return False
  out_axes = [a for a in k.sts[0].unit_stride_axes() if a < k.first_reduce and isinstance(k.full_shape[a], int)]
  if not out_axes: return False
  o = out_axes[-1]
  inputs = [st for b, st in zip(k.bufs, k.sts) if b.op is Ops.LOAD and st.views[-1].strides[o] not in (0, 1)]
  across = [a for st in inputs for a in st.unit_stride_axes() if a != o and a < k.first_reduce and isinstance(k.full_shape[a], int)]
  for t in (8, 4):
    i = next((a for a in across if k.full_shape[a] > t and k.full_shape[a] % t == 0), None)
    # both axes keep a loop (neither upcast whole, which would renumber the axes after it)
    if i is None or k.full_shape[o] <= t or k.full_shape[o] % t: continue
    return _try(k, Opt(OptOps.UPCAST, i, t)) and _try(k, Opt(OptOps.UPCAST, o, t))
  return False


def _reduce_broadcast_axes(k: OptimizingKernel) -> set[int]:
  """The output axes along which some reduce's value is the same: every output axis where the reduces run inside the
  kernel's loops (a row softmax's max and sum, broadcast back along the row they reduce: the kernel's shape is the
  output's), else those along which every input a reduce loads is broadcast. Such an axis must stay inside the loops the
  reduce depends on, or each of its blocks computes the reduce again."""
  # no reduce axis among the kernel's: its reduces run inside the loops over the output
  if k.reduceops and k.first_reduce >= k.shape_len: return set(range(k.first_reduce))
  axes: set[int] = set()
  for r in k.reduceops:
    sts = [k.sts[k.bufs.index(x)] for x in r.toposort if x.op is Ops.LOAD]
    axes |= {a for a in range(k.first_reduce) if sts and all(st.views[-1].strides[a] == 0 for st in sts) and k.full_shape[a] != 1}
  return axes


# the streamed input of a tile's loops stays in a core's cache (L2) below this; above it the loop order decides how
# often it comes from further out
_CACHED_BYTES = 1 << 20


def _panel_outermost_reads_less(k: OptimizingKernel, along: list, across: list, vm: int, panel_axes: list, rows: int, cols: int) -> bool:
  """Whether the tile's loops should run the contiguous axis outermost. In the axes' order the rows' loop is outer:
  for each block of rows, the whole input read as vectors (`along`, a matmul's B) streams through once, and the
  block's rows of the other input (`across`, A) stay in cache. Swapped, each panel of `along` stays in cache and
  `across` streams once per panel. Swap where that moves fewer bytes and `along` does not fit in the cache anyway
  (matmul 2048 on one thread: 26 GFLOP/s in the axes' order, 65 swapped)."""
  def nbytes(loads) -> int: return sum(_buffer_bytes(b) for b, _ in loads)
  if not panel_axes or vm > min(panel_axes) or not all_int(k.full_shape) or (streamed := nbytes(along)) <= _CACHED_BYTES: return False
  return (prod(k.full_shape[a] for a in panel_axes) // cols) * nbytes(across) < (k.full_shape[vm] // rows) * streamed


def _unroll_window(k: OptimizingKernel) -> None:
  """Under a register tile, the innermost reduce axes of at most 4 (a conv's window) are unrolled whole: the loads
  of neighbouring window positions overlap, and the loop of 3 would cost as much as its body."""
  for _ in range(2):
    if k.first_reduce >= k.first_upcast or not isinstance(s := k.full_unupcasted_shape[-1], int) or s > 4: return
    if not _try(k, Opt(OptOps.UNROLL, len(k.full_unupcasted_shape) - 1 - k.first_reduce, 0)): return


def _unroll_reduce(k: OptimizingKernel) -> None:
  """Unroll a small last reduce axis entirely (and a second one if both are tiny), else by 4."""
  if not (k.first_reduce < k.first_upcast
          and (prod(k.full_shape[k.first_upcast:]) <= 4 or not any(k.upcast_reduces()))
          and (k.upcasted == 0 or prod(k.full_shape[-k.upcasted:]) < 64)):
    return
  if isinstance(s := k.full_unupcasted_shape[-1], int) and s <= 32:
    k.apply_opt(Opt(OptOps.UNROLL, len(k.full_unupcasted_shape) - 1 - k.first_reduce, 0))
    if k.first_reduce < k.first_upcast and s <= 3 and isinstance(s2 := k.full_unupcasted_shape[-1], int) and s2 <= 3:
      k.apply_opt(Opt(OptOps.UNROLL, len(k.full_unupcasted_shape) - 1 - k.first_reduce, 0))
  elif resolve(k.full_unupcasted_shape[-1] % 4 == 0, False):
    k.apply_opt(Opt(OptOps.UNROLL, len(k.full_unupcasted_shape) - 1 - k.first_reduce, 4))


def _upcast_last_axis(k: OptimizingKernel) -> None:
  """Nothing upcast yet and the last axis divides by 4: upcast it by 4, or on a renderer that computes on vectors
  (vector_alu) by its widest vector of the output's dtype where that divides it (one vector op per 16 floats)."""
  if k.upcasted or not k.full_unupcasted_shape: return
  for amt in ([width] if (width := _widest_vector(k)) > 4 else []) + [4]:
    if resolve(k.full_unupcasted_shape[-1] % amt == 0, False) and _try(k, Opt(OptOps.UPCAST, len(k.full_unupcasted_shape) - 1, amt)): return


def _locals(k: OptimizingKernel) -> None:
  """Up to three global axes become local (at most 128 threads), expanded axes first: their loads are shared."""
  if not k.renderer.has_local: return
  if _knob("KC_NOLOCALS") and k.local_dims == 0 and not k.group_for_reduces:
    k.apply_opt(Opt(OptOps.NOLOCALS))
    return
  ranking = [(any(k.sts[i].views[-1].strides[axis] == 0 for i in range(len(k.sts))), axis) for axis in range(len(k.full_shape[:k.first_reduce]))]
  to_local: list[tuple[int, int]] = []
  for _, axis in sorted(ranking, key=lambda x: (-x[0], -x[1])):
    local_size = prod(sz for _, sz in to_local)
    pick: Optional[int] = next((x for x in ([32] * (axis == 0) + [16, 8, 4, 3, 2])
                                if resolve(k.full_shape[axis] % x == 0, False) and local_size * x <= 128), None)
    if pick is not None: to_local.append((axis, pick))
  deleted = 0
  for axis, sz in sorted(to_local[:3]):
    axis -= deleted
    whole = sz == k.full_shape[axis]
    if _try(k, Opt(OptOps.LOCAL, axis, sz)) and whole: deleted += 1  # refused: the work-group would be too large


def _buffer_bytes(load: UOp) -> int: return load.src[0].dtype.size * load.src[0].dtype.base.itemsize


def _positive(stride) -> int: return int(isinstance(stride, int) and stride > 0 or not isinstance(stride, int))
def _stride_weight(stride) -> int: return stride if isinstance(stride, int) else 0
