"""verify_ast: the rules a kernel AST must follow, and the ShapeTracker of every node that has a shape.

A kernel AST is SINK(STORE(DEFINE_GLOBAL, VIEW, value), ...). Movement ops live in the VIEWs at the leaves
(LOAD, STORE, VALID); only REDUCE_AXIS (and WMMA, its tensor-core form) changes a shape, from n to 1 on its
axes. One VIEW may sit above a computed value: the keepdim-expand of a reduce result back along its reduced
axes (a fused reduce chain such as x - max(x) feeding a sum), which broadcasts the value and moves nothing."""
from __future__ import annotations
from kc.ir.dtype import ImageDType, PtrDType
from kc.errors import InvalidASTError, KcError
from kc.helpers import all_same, dedup
from kc.shape import ShapeTracker
from kc.shape.view import fmt_shape
from kc.ir.uop import GroupOp, Ops, UOp

REDUCE_OPS = (Ops.ADD, Ops.MUL, Ops.MAX)
SHAPELESS = {Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL, Ops.DEFINE_VAR, Ops.CONST, Ops.BIND}


def view_arg(u: UOp, i: int) -> ShapeTracker:
  """The ShapeTracker of the VIEW at src[i] of a buffer op."""
  if len(u.src) <= i or u.src[i].op is not Ops.VIEW or u.src[i].src or not isinstance(u.src[i].arg, ShapeTracker):
    raise InvalidASTError(f"{u.op} needs a VIEW(ShapeTracker) with no sources at src[{i}], got {[s.op for s in u.src]}")
  return u.src[i].arg


def st_arg(u: UOp) -> ShapeTracker:
  """The ShapeTracker a LOAD, STORE or VALID addresses its buffer with."""
  return view_arg(u, 0 if u.op in GroupOp.FromView else 1)


def reduce_axes(u: UOp) -> tuple[int, ...]:
  """The axes a REDUCE_AXIS or WMMA reduces."""
  return u.arg[1] if u.op is Ops.REDUCE_AXIS else u.arg.reduce_axes


def _shape_error(u: UOp, msg: str) -> InvalidASTError: return InvalidASTError(f"{u.op}: {msg}")


def _check_buffer(u: UOp) -> None:
  buf = u.src[0] if u.src else None
  if buf is None or buf.op not in (Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL) or not isinstance(buf.dtype, PtrDType):
    raise _shape_error(u, f"src[0] must be a DEFINE_GLOBAL or DEFINE_LOCAL pointer, got {buf.op if buf else None}")
  base = buf.dtype.base
  if isinstance(buf.dtype, ImageDType): return
  value_dtype = u.dtype if u.op is Ops.LOAD else u.src[2].dtype
  if value_dtype != base:
    raise _shape_error(u, f"{'loads' if u.op is Ops.LOAD else 'stores'} {value_dtype} through a pointer to {base}; cast the value first")


def _is_broadcast(src: ShapeTracker, view: ShapeTracker, optimized: bool) -> bool:
  """`view` only expands size-1 dims of `src`'s shape and keeps every other dim where it is. In a user's AST
  that is exactly the keepdim-expand of src's shape; after optimization the same reshapes and permutes were
  applied to both sides, so only the shapes and the zero strides are left to compare."""
  if len(src.shape) != len(view.shape): return False
  if not optimized:
    try: return view == ShapeTracker.from_shape(src.shape).expand(view.shape)
    except KcError: return False
  strides = view.real_strides(ignore_valid=True)  # padded axes (PADTO) keep the broadcast; the padding is never stored
  return all(s == v or (s == 1 and strides[i] == 0) for i, (s, v) in enumerate(zip(src.shape, view.shape)))


def _count(ptr) -> str: return "an unknown number of" if ptr.size == -1 else str(ptr.size)


def _check_buffers(ast: UOp, optimized: bool) -> None:
  """One dtype per buffer index; a buffer that is written is read (if at all) through the view it is written with,
  so each element is read by the lane that writes it, before it writes it (any other view races with the stores)."""
  dtypes_of: dict[int, object] = {}
  for u in ast.toposort:
    if u.op is Ops.DEFINE_GLOBAL:
      if (seen := dtypes_of.setdefault(u.arg, u.dtype)) != u.dtype:
        if seen.base != u.dtype.base:
          raise InvalidASTError(f"DEFINE_GLOBAL: buffer {u.arg} is used as {seen.base.name} and as {u.dtype.base.name}; one buffer has one dtype")
        raise InvalidASTError(f"DEFINE_GLOBAL: buffer {u.arg} is declared with {_count(seen)} and with {_count(u.dtype)} elements; "
                              "one buffer has one size")
  if optimized: return  # the Kernel moves every view together: what held before it still holds
  stored = {x.src[0].arg: st_arg(x) for x in ast.src if x.src[0].op is Ops.DEFINE_GLOBAL}
  for u in ast.toposort:
    if u.op is Ops.LOAD and u.src[0].op is Ops.DEFINE_GLOBAL and (st := stored.get(u.src[0].arg)) is not None:
      ld = st_arg(u)
      if ld != st and ld.simplify() != st.simplify():
        raise InvalidASTError(f"LOAD: buffer {u.src[0].arg} is written through the view {fmt_shape(st.shape)} and read through a different one "
                              f"{fmt_shape(ld.shape)}; threads would race on its elements "
                              "(read it through the view it is stored with, or use another buffer)")


def verify_ast(ast: UOp, optimized: bool = False) -> dict[UOp, ShapeTracker]:
  """Check the kernel AST rules and return the ShapeTracker of every node with a shape. Every violation is an
  InvalidASTError naming the op and the shapes involved. `optimized`: the AST came from get_optimized_ast."""
  if not isinstance(ast, UOp) or ast.op is not Ops.SINK: raise InvalidASTError(f"a kernel AST is a SINK of STOREs, got {getattr(ast, 'op', ast)!r}")
  if not ast.src or any(x.op is not Ops.STORE for x in ast.src):
    raise InvalidASTError(f"SINK: every source must be a STORE, got {[x.op for x in ast.src]}")
  if any(u.op is Ops.BUFFER for u in ast.toposort):
    raise InvalidASTError("this is a program of several kernels (it materialises intermediates): compile it with kc.compile, "
                          "or take its kernels from kc.schedule.schedule(sink).kernels; a Kernel is one of them")
  out_sizes = [st_arg(x).size for x in ast.src]
  if not all_same(out_sizes):
    raise InvalidASTError(f"SINK: all outputs must have one size, got {[fmt_shape(st_arg(x).shape) for x in ast.src]}")
  # the Kernel maps every output onto one full shape: outputs that keep different axes (x.sum(1) and x.sum(0)) are two kernels
  if not all_same([st_arg(x).shape for x in ast.src]):
    raise InvalidASTError(f"SINK: all outputs must have one shape (outputs that reduce different axes are separate kernels), "
                          f"got {', '.join(fmt_shape(st_arg(x).shape) for x in ast.src)}")
  _check_buffers(ast, optimized)
  sts: dict[UOp, ShapeTracker] = {}
  reduced: dict[UOp, frozenset[int]] = {}  # the dims a value is 1 in because a reduce below it reduced them
  for u in ast.toposort:
    if u.op in SHAPELESS or u.op is Ops.SINK or u.op is Ops.NOOP: continue
    if u.op is Ops.VIEW and not u.src:
      if not isinstance(u.arg, ShapeTracker): raise _shape_error(u, f"arg must be a ShapeTracker, got {type(u.arg).__name__}")
      sts[u] = u.arg
      continue
    if u.op in GroupOp.Buffer:
      st = st_arg(u)
      if u.op not in GroupOp.FromView: _check_buffer(u)
      if u.op is Ops.LOAD and u.src[0].op is Ops.DEFINE_LOCAL and len(u.src) > 2:
        # a load back from local memory after a grouped reduce: it has the stored reduce's shape
        stored = u.src[2]
        if stored.op is not Ops.STORE or stored not in sts: raise _shape_error(u, "a LOAD from local memory must follow the STORE it reads")
        sts[u] = sts[stored.src[2]] if stored.src[2] in sts else st
        continue
      if u.op is Ops.STORE:
        if len(u.src) != 3: raise _shape_error(u, f"STORE is (buffer, VIEW, value), got {len(u.src)} sources")
        value = u.src[2]
        # a store to local memory addresses the work-group's tile, not the kernel's shape: its view may drop axes
        # that the loop around it walks (a tensor-core input staged per reduce step, a grouped partial result)
        if u.src[0].op is Ops.DEFINE_GLOBAL and value in sts and sts[value].shape != st.shape:
          raise _shape_error(u, f"the view {fmt_shape(st.shape)} does not match the value's shape {fmt_shape(sts[value].shape)}")
      sts[u] = st
      continue
    if u.op in (Ops.REDUCE_AXIS, Ops.WMMA):
      if u.op is Ops.REDUCE_AXIS and (not isinstance(u.arg, tuple) or len(u.arg) != 2 or u.arg[0] not in REDUCE_OPS):
        raise _shape_error(u, f"arg is (one of {[o.name for o in REDUCE_OPS]}, axes), got {u.arg!r}")
      src = next((s for s in u.src if s in sts), None)
      if src is None: raise _shape_error(u, "needs a source with a shape")
      axes = reduce_axes(u)
      if not all(isinstance(a, int) and 0 <= a < len(sts[src].shape) for a in axes) or len(set(axes)) != len(axes):
        raise _shape_error(u, f"axes {axes} are not distinct axes of the shape {fmt_shape(sts[src].shape)}")
      sts[u] = ShapeTracker.from_shape(sts[src].reduce(axes))
      reduced[u] = frozenset(axes) | reduced.get(src, frozenset())
      continue
    if u.op is Ops.VIEW:
      # the keepdim-expand of a computed value (a reduce result) broadcast back along its size-1 dims
      if len(u.src) != 1 or u.src[0] not in sts: raise _shape_error(u, "a VIEW above a value needs exactly one source with a shape")
      src_st = sts[u.src[0]]
      if not isinstance(u.arg, ShapeTracker) or not _is_broadcast(src_st, u.arg, optimized):
        raise _shape_error(u, f"a VIEW of a computed value may only expand its size-1 dims: {fmt_shape(src_st.shape)} -> "
                              f"{fmt_shape(u.arg.shape) if isinstance(u.arg, ShapeTracker) else u.arg!r}; other movement belongs at the loads")
      if not optimized:
        # a reduce's inputs span the kernel's full shape: a dim that is 1 there because the input is 1 (not because
        # it was reduced) cannot be broadcast afterwards; that expand belongs below the reduce, at its loads
        grown = [i for i, (s, v) in enumerate(zip(src_st.shape, u.arg.shape)) if s != v and i not in reduced.get(u.src[0], ())]
        if grown:
          raise _shape_error(u, f"expands {fmt_shape(src_st.shape)} -> {fmt_shape(u.arg.shape)} along dims {grown} that no reduce below "
                                "it reduced; expand the reduce's input instead")
      sts[u] = u.arg
      continue
    # everything else (ALU, CAST, BITCAST, ASSIGN, CONTRACT, EXPAND, ...) keeps its sources' common shape
    src_sts = [sts[s] for s in u.src if s in sts]
    if not src_sts: continue
    shapes = [s.shape for s in src_sts]
    if not all_same(shapes):
      kind = "an implicit reshape" if all_same([s.size for s in src_sts]) else "an implicit expand"
      raise _shape_error(u, f"sources have the shapes {', '.join(fmt_shape(s) for s in shapes)} ({kind}); make them equal with views at the loads")
    sts[u] = src_sts[0]
    # the dims every shaped source has reduced (a loaded size-1 dim was never reduced)
    reduced[u] = frozenset.intersection(*[reduced.get(s, frozenset()) for s in u.src if s in sts])
  # in each dim, every shape is 1 or the same n
  for i, dims in enumerate(zip(*[st.shape for st in sts.values()])):
    distinct = [d for d in dedup(dims) if not (isinstance(d, int) and d == 1)]
    if len(distinct) > 1: raise InvalidASTError(f"dim {i} must be 1 or one size n across the kernel, got sizes {distinct}")
  if len({len(st.shape) for st in sts.values()}) > 1:
    raise InvalidASTError(f"every shape in a kernel has the same number of dims, got {sorted({fmt_shape(st.shape) for st in sts.values()})}")
  if not optimized and full_buffer(ast, sts) is None:
    full = kernel_full_shape(sts)
    raise InvalidASTError(f"no buffer read under a reduce spans the kernel's full shape {fmt_shape(full)}: reduces nest over axes that "
                          "no one load covers (x - x.max(1) broadcasts the row maxima along the other axis, so a sum of it nests "
                          "one reduce per element of another); one kernel cannot run that, split it into kernels or keepdims=True")
  return sts


def kernel_full_shape(sts: dict[UOp, ShapeTracker]) -> tuple:
  """Per dim, the size that is not 1 (verify_ast makes it unique), else 1."""
  return tuple(next((d for d in dims if not (isinstance(d, int) and d == 1)), 1) for dims in zip(*[st.shape for st in sts.values()]))


def full_buffer(ast: UOp, sts: dict[UOp, ShapeTracker]) -> UOp | None:
  """The buffer whose view the Kernel takes as its full shape: the first one read under a reduce that spans every
  dim of the kernel (the first output where there is no reduce), None where no read spans it."""
  under = [x for r in ast.toposort if r.op is Ops.REDUCE_AXIS for x in preorder(r) if x.op in GroupOp.Buffer]
  if not under: return ast.src[0]
  full = kernel_full_shape(sts)
  return next((x for x in under if sts[x].shape == full), None)


def preorder(root: UOp, stop: frozenset = frozenset()) -> list[UOp]:
  """Every node under root once, parents before children, sources left to right: the order buffers are read in. A
  node whose op is in `stop` is listed, and what is under it is not (unless reached another way)."""
  seen: dict[UOp, None] = {}
  stack = [root]
  while stack:
    u = stack.pop()
    if u in seen: continue
    seen[u] = None
    if u.op not in stop: stack.extend(reversed(u.src))
  return list(seen)
