"""Movement ops of kc.ast, pushed down a value's graph to its leaf views (one kernel: views live at the loads).

Elementwise ops commute with movement, so a move goes through them unchanged. A reduce is crossed by moving its
input instead, where the move acts on axes the reduce keeps (an expand of a kept size-1 axis becomes an expand of the
input, so a reduce result broadcast along a kept axis is computed per row); on the reduced (size-1) axes only a
broadcast (a VIEW above the reduce) or an identity is possible. A pad of a computed value is masked at the place it is
applied: pushed to the leaves alone it would pad the inputs, and f(0) is not 0 for every f (exp2(0) is 1)."""
from __future__ import annotations
from dataclasses import dataclass
from typing import Any, Optional
from kc.ir.dtype import dtypes
from kc.errors import InvalidASTError, KcError
from kc.shape import ShapeTracker
from kc.shape.view import fmt_shape
from kc.ir.uop import GroupOp, Ops, UOp, sint

Shape = tuple[sint, ...]


@dataclass(frozen=True)
class Move:
  """One movement op. kind: a ShapeTracker method name, or "insert": arg lists the new axes, each an old axis index
  (all of them, in order) or None for a new size-1 axis."""
  kind: str
  arg: Any

  def apply(self, st: ShapeTracker) -> ShapeTracker:
    if self.kind == "insert": return st.reshape(tuple(1 if a is None else st.shape[a] for a in self.arg))
    if self.kind == "windows":
      # numpy's sliding_window_view: the axis keeps its place with the n - size + 1 window starts, the window is last
      axis, size = self.arg
      st = st.windows(axis, size)
      return st.permute(tuple(a for a in range(st.ndim) if a != axis) + (axis,))
    return getattr(st, self.kind)(self.arg)


def shape_of(u: UOp, cache: Optional[dict] = None) -> Optional[Shape]:
  """The kernel shape of a value (None for shapeless constants and Variables)."""
  cache = {} if cache is None else cache
  for x in u.toposort:
    if x in cache: continue
    if x.op is Ops.LOAD: s = x.src[1].arg.shape
    elif x.op in GroupOp.FromView or (x.op is Ops.VIEW and not x.src): s = (x.src[0].arg if x.src else x.arg).shape
    elif x.op is Ops.VIEW: s = x.arg.shape
    elif x.op is Ops.REDUCE_AXIS:
      inner = cache[x.src[0]]
      s = tuple(1 if i in x.arg[1] else d for i, d in enumerate(inner))
    else: s = next((cache[y] for y in x.src if cache.get(y) is not None), None)
    cache[x] = s
  return cache[u]


def kernel_nodes(root: UOp) -> dict[UOp, None]:
  """The nodes of one kernel under `root`: its toposort without the graphs of the BUFFERs it reads (other kernels)."""
  out: dict[UOp, None] = {}
  stack: list[tuple[UOp, bool]] = [(root, False)]
  while stack:
    node, expanded = stack.pop()
    if node in out: continue
    if expanded or node.op is Ops.BUFFER: out[node] = None
    else:
      stack.append((node, True))
      stack.extend((s, False) for s in reversed(node.src) if s not in out)
  return out


def extents(u: UOp) -> Shape:
  """For each kernel axis of a value, the largest size any node under it has there (a reduced axis keeps the size it
  had before the reduce). Only this kernel's loads count: a materialised value (a BUFFER) is read through its own
  view, and the loops of the kernel that computed it are not this kernel's."""
  shapes = [x.src[1].arg.shape if x.op is Ops.LOAD else x.src[0].arg.shape
            for x in kernel_nodes(u) if x.op in (Ops.LOAD, Ops.VALID, Ops.POSITION)]
  if not shapes: return ()
  return tuple(next((d for d in dims if not (isinstance(d, int) and d == 1)), 1) for dims in zip(*shapes))


def move(u: UOp, mv: Move, shape: Shape) -> UOp:
  """`u` (of kernel shape `shape`) moved by `mv`. Raises InvalidASTError where one kernel cannot express it."""
  try:
    out = _Pusher(mv.kind).walk(u, mv)
  except InvalidASTError: raise
  except KcError as e: raise InvalidASTError(str(e)) from e
  if mv.kind == "pad" and u.op is not Ops.LOAD:
    valid = UOp(Ops.VALID, dtypes.bool, (ShapeTracker.from_shape(shape).pad(mv.arg).to_uop(),))
    out = valid.where(out, UOp.const(out.dtype, 0))
  return out


class _Pusher:
  def __init__(self, kind: str):
    self.kind, self.memo, self.shapes = kind, {}, {}

  def walk(self, x: UOp, mv: Move) -> UOp:
    key = (x, mv)
    if key in self.memo: return self.memo[key]
    if x.op is Ops.LOAD: ret = x.replace(src=(x.src[0], mv.apply(x.src[1].arg).to_uop()))
    elif x.op in GroupOp.FromView: ret = x.replace(src=(mv.apply(x.src[0].arg).to_uop(),))
    elif x.op in (Ops.CONST, Ops.DEFINE_VAR, Ops.BIND): ret = x
    elif x.op is Ops.REDUCE_AXIS: ret = self.reduce(x, mv)
    elif x.op is Ops.VIEW: ret = self.view(x, mv)
    else: ret = x.replace(src=tuple(self.walk(s, mv) for s in x.src))
    self.memo[key] = ret
    return ret

  def shape(self, u: UOp) -> Shape: return shape_of(u, self.shapes)

  def refuse(self, x: UOp, mv: Move, why: str):
    return InvalidASTError(f"{mv.kind} {mv.arg!r} of a reduce result of shape {fmt_shape(self.shape(x))}: {why}")

  def reduce(self, x: UOp, mv: Move) -> UOp:
    op, axes = x.arg
    src, ins, out = x.src[0], self.shape(x.src[0]), self.shape(x)
    new = mv.apply(ShapeTracker.from_shape(out)).shape  # validates the move on the result's shape
    rebuild = lambda inner, ax=axes: UOp(Ops.REDUCE_AXIS, x.dtype, (inner,), (op, tuple(sorted(ax))))
    if mv.kind == "permute": return rebuild(self.walk(src, mv), [list(mv.arg).index(a) for a in axes])
    if mv.kind == "flip": return rebuild(self.walk(src, Move("flip", tuple(a for a in mv.arg if a not in axes))))
    if mv.kind == "shrink": return rebuild(self.walk(src, Move("shrink", tuple((0, ins[i]) if i in axes else a for i, a in enumerate(mv.arg)))))
    if mv.kind == "insert": return rebuild(self.walk(src, mv), [mv.arg.index(a) for a in axes])
    if mv.kind in ("pad", "expand"):
      # a reduced axis is the reduce's loop in the one kernel: the result may grow back to exactly that loop's size
      # (the softmax pattern), to no other
      if bad := [i for i in axes if new[i] not in (1, ins[i])]:
        raise self.refuse(x, mv, f"axis {bad[0]} was reduced over {ins[bad[0]]} elements, so one kernel can broadcast it back to "
                                 f"1 or {ins[bad[0]]} elements, not {new[bad[0]]}; store the reduce result and {mv.kind} it in a second kernel")
      if mv.kind == "pad": inner_mv = Move("pad", tuple((0, 0) if i in axes else a for i, a in enumerate(mv.arg)))
      else: inner_mv = Move("expand", tuple(ins[i] if i in axes else s for i, s in enumerate(mv.arg)))
      moved = rebuild(self.walk(src, inner_mv))
      return broadcast(moved, self.shape(moved), new)
    raise self.refuse(x, mv, "only adding or removing size-1 axes, permutes, flips, shrinks, pads and expands can follow a "
                             "reduce in the same kernel; move the reduce's input instead, or store the result")

  def view(self, x: UOp, mv: Move) -> UOp:
    """A broadcast VIEW above a value: move the value on the axes the view does not broadcast."""
    base, bshape, vshape = x.src[0], self.shape(x.src[0]), x.arg.shape
    bc = {i for i, (b, v) in enumerate(zip(bshape, vshape)) if b != v}
    new = mv.apply(ShapeTracker.from_shape(vshape)).shape
    if mv.kind == "expand": return self.walk(base, Move("expand", tuple(mv.arg)))
    if mv.kind == "permute": inner = Move("permute", mv.arg)
    elif mv.kind == "insert": inner = mv
    elif mv.kind == "flip": inner = Move("flip", tuple(a for a in mv.arg if a not in bc))
    elif mv.kind == "shrink": inner = Move("shrink", tuple((0, 1) if i in bc else a for i, a in enumerate(mv.arg)))
    elif mv.kind == "pad": inner = Move("pad", tuple((0, 0) if i in bc else a for i, a in enumerate(mv.arg)))
    else: raise self.refuse(x, mv, "a broadcast reduce result can only be permuted, flipped, shrunk, padded or expanded in the same "
                                   "kernel; store the result and move it in a second kernel")
    # a broadcast axis is a reduce's loop in the one kernel (see reduce): it keeps that size, or 1
    if bad := [i for i in bc if new[i] not in (1, vshape[i])]:
      raise self.refuse(x, mv, f"axis {bad[0]} is a reduce result broadcast to the reduce's {vshape[bad[0]]} elements, and one kernel "
                               f"cannot make it {new[bad[0]]}; store the result and {mv.kind} it in a second kernel")
    moved = self.walk(base, inner)
    return broadcast(moved, self.shape(moved), new)


def broadcast(u: UOp, shape: Shape, new: Shape) -> UOp:
  """`u` of `shape` broadcast along its size-1 axes to `new` (one VIEW above the value, never a VIEW of a VIEW)."""
  if tuple(shape) == tuple(new): return u
  if u.op is Ops.VIEW and u.src: u, shape = u.src[0], shape_of(u.src[0])
  return UOp(Ops.VIEW, u.dtype, (u,), ShapeTracker.from_shape(shape).expand(new))
