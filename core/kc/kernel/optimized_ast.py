"""get_optimized_ast: a Kernel's applied opts folded back into its AST, ready for lowering.

Each buffer's VIEW becomes its optimized ShapeTracker; each REDUCE_AXIS gets the axes it reduces in the
optimized shape; a grouped reduce goes through local memory (reduce per thread, STORE to a DEFINE_LOCAL, LOAD
back, reduce across the group); a tensor-core reduce becomes WMMA over CONTRACTed fragments (level 1) or a
plain reduce over inputs staged through local memory in the warp's layout (level 3)."""
from __future__ import annotations
from typing import Callable
from kc.ir.dtype import dtypes
from kc.errors import KcError
from kc.helpers import prod
from kc.codegen.lower import KernelInfo
from kc.codegen.verify import st_arg
from kc.kernel.protocol import OptimizingKernel
from kc.renderer import TensorCore, WMMAArg
from kc.shape import ShapeTracker
from kc.ir.symbolic import resolve
from kc.ir.uop import GroupOp, Ops, UOp



def _with_view(src: UOp, fix: Callable[[ShapeTracker], ShapeTracker]) -> UOp:
  """A tensor-core input (a LOAD, or a CAST of one) with its load's view rewritten by `fix`."""
  if src.op is Ops.CAST: return src.replace(src=(_with_view(src.src[0], fix),))
  return src.replace(src=(src.src[0], fix(st_arg(src)).to_uop(), *src.src[2:]))


def _widened(x: UOp, tc: TensorCore) -> bool:
  """x is an input of the tensor core's dtype_in cast to its dtype_out (the multiply happens in dtype_out)."""
  return tc.dtype_in != tc.dtype_out and x.op is Ops.CAST and x.dtype == tc.dtype_out and x.src[0].dtype == tc.dtype_in


def get_optimized_ast(k: OptimizingKernel) -> UOp:
  memo: dict[UOp, UOp] = {}
  for op in k.ast.toposort:
    ret = op.replace(src=tuple(memo[s] for s in op.src))
    if op.op in GroupOp.Buffer and op in k.bufs:
      st_uop = k.sts[k.bufs.index(op)].to_uop()
      ret = ret.replace(src=(st_uop,)) if op.op in GroupOp.FromView else ret.replace(src=(ret.src[0], st_uop, *ret.src[2:]))
    elif op.op is Ops.VIEW and op in k.broadcasts:
      ret = ret.replace(arg=k.sts[len(k.bufs) + 2 * len(k.reduceops) + k.broadcasts.index(op)])
    elif op.op is Ops.SINK:
      ret = ret.replace(arg=KernelInfo(k.local_dims, k.upcasted, k.dont_use_locals))
    elif op.op is Ops.REDUCE_AXIS:
      ret = _optimized_reduce(k, op, ret)
    memo[op] = ret
  return memo[k.ast]


def _optimized_reduce(k: OptimizingKernel, op: UOp, ret: UOp) -> UOp:
  idx = len(k.bufs) + k.reduceops.index(op) * 2
  out_st, in_st = k.sts[idx], k.sts[idx + 1]
  def reduced(start: int, stop: int) -> tuple[int, ...]:
    return tuple(i for i in range(start, stop) if resolve(out_st.shape[i] != in_st.shape[i]))
  # a reduce of a fused chain may also reduce an axis the output keeps (softmax's x / sum(x)): those are global axes
  axes = reduced(0, k.first_reduce) + reduced(k.first_reduce + k.group_for_reduces, k.shape_len)
  grouped_axes = reduced(k.first_reduce, k.first_reduce + k.group_for_reduces)

  if (tc := k.tensor_core) is not None and k.use_tensor_cores in (1, 3):
    return _tensor_core_reduce(k, tc, ret, axes)

  ret = ret.replace(arg=(op.arg[0], axes))
  if not (k.group_for_reduces and grouped_axes): return ret
  # each thread reduces its part, the parts meet in local memory, and one more reduce combines them
  local_shape = (1,) * k.global_dims + k.full_shape[k.global_dims:k.global_dims + k.local_dims] + \
    tuple(k.full_shape[i] if resolve(out_st.shape[i] != in_st.shape[i]) else 1
          for i in range(k.first_reduce, k.first_reduce + k.group_for_reduces)) + \
    (1,) * (k.shape_len - k.upcasted - k.group_for_reduces - k.first_reduce) + tuple(x[0] for x in k.upcasted_axis(0))
  local_st = ShapeTracker.from_shape(local_shape)
  local_buffer = UOp(Ops.DEFINE_LOCAL, op.dtype.ptr(local=True, size=local_st.real_size()), (),
                     (f"temp{k.reduceops.index(op) + 1}", local_st.real_size()))
  local_load = UOp(Ops.LOAD, op.dtype, (local_buffer, local_st.to_uop(), UOp(Ops.STORE, dtypes.void, (local_buffer, local_st.to_uop(), ret))))
  grouped = UOp(Ops.REDUCE_AXIS, op.dtype, (local_load,), (op.arg[0], grouped_axes))
  if op is k.reduceops[-1]: return grouped
  # an earlier reduce: its combined result goes back through local memory to every thread of the group
  shared_st = ShapeTracker.from_shape(tuple(1 if i in grouped_axes else a for i, a in enumerate(local_shape)))
  return UOp(Ops.LOAD, op.dtype, (local_buffer, shared_st.to_uop(), UOp(Ops.STORE, dtypes.void, (local_buffer, shared_st.to_uop(), grouped))))


def _tensor_core_reduce(k: OptimizingKernel, tc: TensorCore, ret: UOp, axes: tuple[int, ...]) -> UOp:
  def fix_st(st: ShapeTracker, wd_pattern, tcd_pattern) -> ShapeTracker:
    """Permute the warp (local) and upcast dims so each thread addresses the fragment elements the instruction expects."""
    wd, warp_dims = k.global_dims, tuple(sz for _, sz in tc.threads)
    tcd, tcd_dims = k.first_upcast, tuple(sz for _, sz in tc.reduce_axes + tc.early_upcast_axes)
    if st.shape[wd:wd + len(warp_dims)] != warp_dims or st.shape[tcd:tcd + len(tcd_dims)] != tcd_dims or tc.expanded_shape is None:
      raise KcError(f"tensor core layout does not match the kernel shape {st.shape}: warp {warp_dims}, upcast {tcd_dims}")
    new_shape = st.shape[:tcd] + tc.expanded_shape + st.shape[tcd + len(tcd_dims):]
    permaxis = list(range(wd)) + [y + (wd if x == 0 else tcd) for x, y in wd_pattern] + list(range(wd + len(warp_dims), tcd)) + \
      [y + (wd if x == 0 else tcd) for x, y in tcd_pattern] + list(range(tcd + len(tc.expanded_shape), len(new_shape)))
    return st.reshape(new_shape).permute(tuple(permaxis)).reshape(st.shape).simplify()

  mul = ret.src[0] if ret.src[0].op is not Ops.CAST else ret.src[0].src[0]
  srcs = list(mul.src)
  # inputs widened to dtype_out before the multiply (products exact in dtype_out, as the instruction computes them):
  # the instruction takes the narrow values
  widened = [_widened(x, tc) for x in srcs]
  for i, pattern in enumerate([tc.st1_pattern, tc.st2_pattern]):
    if pattern: srcs[i] = _with_view(srcs[i], lambda st, p=pattern: fix_st(st, *p))
    if k.use_tensor_cores == 3:  # emulate the warp's addressing: stage the input through local memory in its layout
      local_shape = tuple(1 if k.first_reduce <= j < k.first_upcast else s for j, s in enumerate(k.full_shape))
      st = store_st = ShapeTracker.from_shape(local_shape)
      local_buffer = UOp(Ops.DEFINE_LOCAL, tc.dtype_in.ptr(local=True, size=st.real_size()), (), (f"temp{i + 1}", st.real_size()))
      if pattern: store_st = fix_st(store_st, *pattern)
      local_store = UOp(Ops.STORE, dtypes.void, (local_buffer, store_st.to_uop(), srcs[i].src[0] if widened[i] else srcs[i]))
      srcs[i] = UOp(Ops.LOAD, tc.dtype_in, (local_buffer, st.to_uop(), local_store))
      if widened[i]: srcs[i] = srcs[i].cast(tc.dtype_out)

  tc_reduce_axes = tuple(k.first_upcast + ax for ax, _ in tc.reduce_axes)
  if k.use_tensor_cores == 1:  # real WMMA: CONTRACT gathers each thread's fragment, EXPAND spreads the result back
    upcast_axes = tuple(tuple((k.first_upcast + ax, sz) for ax, sz in up) for up in tc.upcast_axes)
    wmma_arg = WMMAArg.of(tc, k.renderer.device, upcast_axes, tc_reduce_axes)
    sz = [prod(x[1] for x in ax) for ax in upcast_axes]
    wmma = UOp(Ops.WMMA, tc.dtype_out.vec(sz[2]), (
      *(UOp(Ops.CONTRACT, tc.dtype_in.vec(sz[i]), (srcs[i].src[0] if widened[i] else srcs[i],), upcast_axes[i]) for i in range(2)),
      UOp.const(tc.dtype_out.vec(sz[2]), 0.0)), wmma_arg)
    tc_uop = UOp(Ops.EXPAND, tc.dtype_out, (wmma,), upcast_axes[2])
  else:
    tc_uop = UOp(Ops.REDUCE_AXIS, tc.dtype_out, ((srcs[0] * srcs[1]).cast(tc.dtype_out),), (Ops.ADD, tc_reduce_axes))
  rest = tuple(i for i in axes if i not in tc_reduce_axes)
  return ret.replace(src=(tc_uop,), arg=(Ops.ADD, rest)) if rest else tc_uop
