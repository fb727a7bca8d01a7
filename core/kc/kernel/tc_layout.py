"""Where each element of a tensor core's fragments lives in the matrices, as kc's optimizer lays it out.

A TensorCore description (threads, reduce_axes, upcast_axes, st patterns) decides which thread of a warp loads
which elements of A and B into which slots of its fragments, and where each slot of its result lands in D. This
module reads that layout back from the optimizer itself: it optimizes a matmul of exactly the tensor core's
dims with the tensor core, and evaluates the views of the WMMA's operands for every lane and slot.

The emulator uses the layout to run WMMA on its numpy threads. A backend's tests compare it with the fragment
layout its hardware documents: if they differ, the TensorCore description is wrong for that hardware."""
from __future__ import annotations
import itertools
from dataclasses import dataclass
from kc.ir.dtype import dtypes
from kc.errors import KcError
from kc.kernel.kernel import Kernel
from kc.codegen.verify import st_arg
from kc.renderer import Renderer, TensorCore
from kc.shape import ShapeTracker
from kc.ir.uop import Ops, UOp

Coord = tuple[int, int]


@dataclass(frozen=True)
class FragmentLayout:
  """a[lane][slot] = (m, k) of A; b[lane][slot] = (k, n) of B; c[lane][slot] = (m, n) of C and D. Lane numbers
  count the tensor core's thread dims with the first one fastest (its threads are a warp's consecutive ids)."""
  a: tuple[tuple[Coord, ...], ...]
  b: tuple[tuple[Coord, ...], ...]
  c: tuple[tuple[Coord, ...], ...]


class _Limits(Renderer):
  """The least a Kernel needs to apply one tensor core: locals, shared memory, that tensor core. It never renders:
  derive_fragment_layout reads the optimized AST."""
  global_max = local_max = None
  shared_max = 1 << 30
  device = "LAYOUT"
  def __init__(self, tc): self.tensor_cores = [tc]
  def render(self, name: str, uops: list) -> str:
    raise KcError(f"the tensor-core layout probe renders no source (asked for {name}): it reads the optimized AST")


def _matmul_ast(tc: TensorCore) -> UOp:
  """D = A @ B of exactly the tensor core's dims, in its dtypes: A (M, K) and B (K, N) broadcast to (M, K, N)."""
  N, M, K = tc.dims
  def load(i: int, st: ShapeTracker) -> UOp:
    return UOp(Ops.LOAD, tc.dtype_in, (UOp(Ops.DEFINE_GLOBAL, tc.dtype_in.ptr(), (), i), st.to_uop()))
  a = load(1, ShapeTracker.from_shape((M, K, 1)).expand((M, K, N)))
  b = load(2, ShapeTracker.from_shape((1, K, N)).expand((M, K, N)))
  mul = a * b
  if tc.dtype_in != tc.dtype_out: mul = mul.cast(tc.dtype_out)
  red = UOp(Ops.REDUCE_AXIS, tc.dtype_out, (mul,), (Ops.ADD, (1,)))
  out = UOp(Ops.STORE, dtypes.void, (UOp(Ops.DEFINE_GLOBAL, tc.dtype_out.ptr(), (), 0), ShapeTracker.from_shape((M, 1, N)).to_uop(), red))
  return UOp(Ops.SINK, dtypes.void, (out,))


def derive_fragment_layout(tc: TensorCore) -> FragmentLayout:
  N, M, K = tc.dims
  k = Kernel(_matmul_ast(tc), _Limits(tc))
  if not k.apply_tensor_cores(1, extra_opts=[]): raise KcError(f"{tc} does not apply to a {M}x{K} @ {K}x{N} matmul: its description is inconsistent")
  ast = k.get_optimized_ast()
  wmma = next(u for u in ast.toposort if u.op is Ops.WMMA)
  store = ast.src[0]
  thread_axes = list(range(k.global_dims, k.global_dims + len(tc.threads)))
  lanes = list(itertools.product(*[range(k.full_shape[ax]) for ax in reversed(thread_axes)]))  # the first thread axis fastest

  def load_of(x: UOp) -> UOp:
    while x.op is not Ops.LOAD: x = x.src[0]
    return x

  def coords(view_of, slot_axes, width: int, lane) -> tuple[Coord, ...]:
    out = []
    for slot in itertools.product(*[range(sz) for _, sz in slot_axes]):
      at = [0] * k.shape_len
      for ax, v in zip(reversed(thread_axes), lane): at[ax] = v
      for (ax, _), v in zip(slot_axes, slot): at[ax] = v
      off = view_of.offset_of(at)
      if off is None: raise KcError(f"{tc}: fragment slot {slot} of lane {lane} reads padding")
      out.append(divmod(off, width))
    return tuple(out)

  ups = wmma.arg.upcast_axes
  a_st, b_st = st_arg(load_of(wmma.src[0].src[0])), st_arg(load_of(wmma.src[1].src[0]))
  layout = FragmentLayout(
    a=tuple(coords(a_st, ups[0], K, lane) for lane in lanes),
    b=tuple(coords(b_st, ups[1], N, lane) for lane in lanes),
    c=tuple(coords(st_arg(store), ups[2], N, lane) for lane in lanes))
  _check_covers(tc, layout)
  return layout


def _check_covers(tc: TensorCore, layout: FragmentLayout) -> None:
  """The lanes' slots together hold every element of A, B and D (hardware holds each exactly once; a layout where
  two lanes hold the same element is still a layout, and the emulator checks that they agree)."""
  N, M, K = tc.dims
  for name, frag, size in (("A", layout.a, M * K), ("B", layout.b, K * N), ("D", layout.c, M * N)):
    if len({c for lane in frag for c in lane}) != size:
      raise KcError(f"{tc}: the fragments of {name} hold {len({c for lane in frag for c in lane})} of its {size} elements")


def layout_mismatch(tc: TensorCore, hardware: FragmentLayout) -> "str | None":
  """None when kc lays out `tc`'s fragments as the hardware does, else what differs.

  `hardware` is the instruction's documented layout: for each lane and register slot, the (row, col) of A, B and D
  it holds. kc's layout may number M, N and K differently from the documentation and still be right: D = A @ B holds
  under any renumbering of the rows of M (in A and D together), of N (in B and D) and of K (in A and B). So the check
  is that one such renumbering exists: every (lane, slot) of kc's layout, renumbered, is the hardware's (lane, slot).
  Lane numbers are the warp's lane ids and slots are register order, so the renderer packs fragments as they come."""
  derived = derive_fragment_layout(tc)
  maps: dict[str, dict[int, int]] = {"M": {}, "N": {}, "K": {}}
  for name, ours, theirs, (row, col) in (("A", derived.a, hardware.a, ("M", "K")), ("B", derived.b, hardware.b, ("K", "N")),
                                         ("D", derived.c, hardware.c, ("M", "N"))):
    if len(ours) != len(theirs) or any(len(o) != len(t) for o, t in zip(ours, theirs)):
      return (f"{tc}: the fragments of {name} are {len(ours)} lanes x {len(ours[0]) if ours else 0} slots in kc, {len(theirs)} x "
              f"{len(theirs[0]) if theirs else 0} in the hardware")
    for lane, (o_slots, t_slots) in enumerate(zip(ours, theirs)):
      for slot, (o, t) in enumerate(zip(o_slots, t_slots)):
        for dim, mine, hw in ((row, o[0], t[0]), (col, o[1], t[1])):
          if maps[dim].setdefault(mine, hw) != hw:
            return (f"{tc}: lane {lane} slot {slot} of {name} holds {dim} index {mine} in kc, which elsewhere stands for the hardware's "
                    f"{maps[dim][mine]}, but here for {hw}")
  for dim, m in maps.items():
    if len(set(m.values())) != len(m): return f"{tc}: two of kc's {dim} indices stand for the same hardware index ({m})"
  return None
