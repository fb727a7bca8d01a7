"""Packing a large matmul's second operand into panels first, on a host CPU: a kernel that copies it, and the matmul
reading the copy.

A hand-coded matmul on a CPU keeps a register tile of rows x W output columns (W: two of the widest float vectors)
and walks the whole reduce axis K for it, reading a W-wide row of B at every step. In B's own layout those rows lie
a whole row of B apart (8 KB for N = 2048 floats): each step lands in a new page and, with a power-of-two stride, in
the same few cache sets, so a panel of B the tile reuses for every block of rows does not stay in the cache. BLAS
libraries copy B into panels first, and so does this rule: a *pack* kernel writes P[p, k, w] = B[k, p*W + w] into a
temporary buffer, and the *product* kernel is the original one reading P, its N axis split into (N/W, W) so that each
view stays one strided view. A panel's K rows are then contiguous. (One AVX-512 core, float32 2048 x 2048: 58 ->
98-105 GFLOP/s; 1024: 103 -> 106-109; the copy costs a few percent of the product.)

It applies to a kernel that stores one float32 ADD reduce over one axis of the product of two loads, in three axes
(M, K, N in any order), or an elementwise function of it and other loads (a bias, an activation), where the second
operand (the one broadcast along M) is read unmasked and contiguously along N, and M, K and N are large enough for
the copy to pay. The
decision depends on the AST and the renderer alone, like kc.schedule.split_reduce's."""
from __future__ import annotations
from typing import Optional
from kc.ir.dtype import ImageDType, dtypes
from kc.ir.uop import GroupOp, Ops, UOp
from kc.renderer import Renderer
from kc.schedule.movement import Move, move, shape_of
from kc.schedule.split_reduce import TEMP, KernelPair, renumber
from kc.shape import ShapeTracker

# the smallest M, K and N packed, and the fewest elements of B: below, the copy and the second launch cost about what
# the packed reads save, or more (one AVX-512 core, GFLOP/s one kernel -> packed: M, K, N = 64, 512, 1024: 98 -> 88;
# 128, 256, 1024: 93 -> 102; 256, 256, 256: 108 -> 107; 512, 512, 512: 93 -> 107)
MIN_ROWS, MIN_REDUCE, MIN_COLUMNS, MIN_PACKED = 128, 256, 256, 1 << 17


class PackedOperand(KernelPair):
  """A matmul as the pack kernel (`first`), which writes B's panels, and the product (`second`), which reads them."""


def panel_width(renderer: Optional[Renderer]) -> Optional[int]:
  """W, the columns of one panel: two of the widest float32 vectors of a host CPU dialect that computes on vectors
  (the hand-coded register tile's width); None on a device with work-groups or without vector arithmetic."""
  if renderer is None or renderer.has_local or not renderer.vector_alu: return None
  widths = renderer.vector_widths(dtypes.float32)
  return 2 * widths[0] if widths else None


def pack_operand(ast: UOp, renderer: Optional[Renderer]) -> Optional[PackedOperand]:
  """The pack and product kernels for `ast` on `renderer`'s device, or None where it stays one kernel (see the
  module docstring for which kernels qualify)."""
  if (W := panel_width(renderer)) is None or (found := _matmul(ast)) is None: return None
  store, red, loads = found
  full = shape_of(red.src[0])
  # three axes besides size-1 ones (a Linear layer's kernel from kc-torch keeps some)
  if full is None or not all(isinstance(d, int) for d in full) or sum(d != 1 for d in full) != 3: return None
  (k,) = red.arg[1]
  if (found_axes := _operands_and_axes(store, loads, k)) is None: return None
  a, b, m, n = found_axes
  M, K, N = full[m], full[k], full[n]
  # only a B read along N contiguously: one read across N (x @ W.T) has K-contiguous loads on both sides, which the
  # hand-coded opts already run as vector dot products, and its pack would be a transpose, slow as a copy kernel
  # (kc-torch's MLP, 64 rows: the packs of its weights cost more than the products saved)
  if N % W or b.src[1].arg.views[0].strides[n] != 1: return None
  if M < MIN_ROWS or K < MIN_REDUCE or N < MIN_COLUMNS or K * N < MIN_PACKED: return None
  temp_shape = (N // W, K, W)
  temp = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(size=N * K), (), TEMP)
  # pack: B at M = 0 with its axes as (N, K), split into (N/W, W, K) and stored as (N/W, K, W), panels contiguous
  one = tuple(1 if x == m else d for x, d in enumerate(full))
  panels = move(b, Move("shrink", tuple((0, d) for d in one)), full)
  panels = move(panels, Move("reshape", (N, K) if n < k else (K, N)), one)
  if n > k: panels = move(panels, Move("permute", (1, 0)), (K, N))
  panels = move(panels, Move("reshape", (N // W, W, K)), (N, K))
  panels = move(panels, Move("permute", (0, 2, 1)), (N // W, W, K))
  pack = UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (temp, ShapeTracker.from_shape(temp_shape).to_uop(), panels)),))
  # product: N split into (N/W, W) in its place; B's load replaced by a view of the panels in those axes
  split = full[:n] + (N // W, W) + full[n + 1:]
  names = [{m: "m", k: "k", n: "p"}.get(x, "1") for x in range(len(full))]
  names.insert(names.index("p") + 1, "w")
  size = {"m": M, "k": K, "p": N // W, "w": W, "1": 1}
  st = ShapeTracker.from_shape(temp_shape).permute(tuple("pkw".index(x) for x in names if x in "pkw"))
  st = st.reshape(tuple(1 if x == "m" else size[x] for x in names)).expand(tuple(size[x] for x in names))
  mul = red.src[0]
  operands = tuple(move(a, Move("reshape", split), full) if s is a else UOp(Ops.LOAD, b.dtype, (temp, st.to_uop())) for s in mul.src)
  reduced = names.index("k")
  new_red = UOp(Ops.REDUCE_AXIS, red.dtype, (mul.replace(src=operands),), (Ops.ADD, (reduced,)))
  out_split = tuple(1 if i == reduced else d for i, d in enumerate(split))
  out_st = store.src[1].arg.reshape(out_split)
  value = _split_epilogue(store.src[2], red, new_red, out_split, tuple(1 if i == k else d for i, d in enumerate(full)))
  product = UOp(Ops.SINK, dtypes.void, (store.replace(src=(store.src[0], out_st.to_uop(), value)),))
  pack, pack_buffers = renumber(pack)
  product, product_buffers = renumber(product)
  return PackedOperand(pack, product, pack_buffers, product_buffers, dtypes.float32, N * K)


def _operands_and_axes(store: UOp, loads: tuple[UOp, UOp], k: int) -> Optional[tuple[UOp, UOp, int, int]]:
  """(A, B, M, N): N is the output's contiguous axis (the one the hand-coded tile's vectors run along), B the load
  that walks it and A the other, M the other output axis, along which B is broadcast and A is not; None where the
  loads are not a matmul's over reduce axis k."""
  out = store.src[1].arg.views[0].strides
  full = store.src[1].arg.shape
  if (n := next((x for x in range(len(full)) if x != k and full[x] != 1 and out[x] == 1), None)) is None: return None
  m = next(x for x in range(len(full)) if x not in (k, n) and full[x] != 1)
  a, b = loads if loads[1].src[1].arg.views[0].strides[n] != 0 else loads[::-1]
  sa, sb = a.src[1].arg.views[0].strides, b.src[1].arg.views[0].strides
  ok = sb[m] == 0 and sa[m] != 0 and sa[n] == 0 and sb[n] != 0 and sa[k] != 0 and sb[k] != 0
  return (a, b, m, n) if ok else None


def _matmul(ast: UOp) -> Optional[tuple[UOp, UOp, tuple[UOp, UOp]]]:
  """(store, reduce, the two loads) of an AST that is one store of a value computed elementwise (an epilogue: a bias,
  an activation) from one float32 ADD reduce over one axis of the product of two plain loads, and from other plain
  loads and constants; None for anything else."""
  if ast.op is not Ops.SINK or len(ast.src) != 1 or (store := ast.src[0]).op is not Ops.STORE: return None
  if len(store.src[1].arg.views) != 1 or store.src[1].arg.views[0].mask is not None: return None
  reduces = [u for u in store.src[2].toposort if u.op is Ops.REDUCE_AXIS]
  if len(reduces) != 1 or not _elementwise_above(store.src[2], red := reduces[0]): return None
  if red.arg[0] is not Ops.ADD or len(red.arg[1]) != 1 or red.dtype != dtypes.float32: return None
  mul = red.src[0]
  if mul.op is not Ops.MUL or len(mul.src) != 2 or not all(_plain_load(x) for x in mul.src): return None
  return store, red, (mul.src[0], mul.src[1])


def _elementwise_above(u: UOp, red: UOp) -> bool:
  """Whether `u` is `red`, or elementwise ops of it, plain loads and constants."""
  if u is red or u.op is Ops.CONST or _plain_load(u): return True
  return u.op in GroupOp.ALU | {Ops.CAST} and all(_elementwise_above(s, red) for s in u.src)


def _split_epilogue(u: UOp, red: UOp, new_red: UOp, split: tuple, full: tuple) -> UOp:
  """The epilogue `u` (of the output's shape `full`) with N split as in `split` and `red` replaced by `new_red`."""
  if u is red: return new_red
  if u.op is Ops.LOAD: return move(u, Move("reshape", split), full)
  if u.op is Ops.CONST: return u
  return u.replace(src=tuple(_split_epilogue(s, red, new_red, split, full) for s in u.src))


def _plain_load(u: UOp) -> bool:
  if u.op is not Ops.LOAD or u.dtype != dtypes.float32 or len(u.src) != 2 or u.src[0].op is not Ops.DEFINE_GLOBAL: return False
  if isinstance(u.src[0].dtype, ImageDType): return False
  views = u.src[1].arg.views
  return len(views) == 1 and views[0].mask is None
