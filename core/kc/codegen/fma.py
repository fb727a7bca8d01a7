"""Sums of products accumulated with fused multiply-adds: on a renderer whose MULACC of a dtype is one fused
multiply-add (Renderer.fused_multiply_add), a float sum reduce's update `acc = acc + (p0 + ... + pk)` whose terms
include products becomes `acc = fma(a_k, b_k, ... fma(a_0, b_0, acc + others))`: one instruction per product instead
of a multiply and an add, and one rounding of each product instead of two, as BLAS computes a matmul.

Only the accumulation is fused: an elementwise a*b+c anywhere else keeps numpy's two roundings. The update's float
ADDs are taken as one sum of terms, whose order kc chooses as it chooses a reduce's order (pairwise, interleaved);
nothing else changes."""
from __future__ import annotations
from typing import Callable
from kc.ir.dtype import DType, dtypes
from kc.codegen.vectorize import passing_toposort, replaced
from kc.ir.uop import Ops, UOp


def _terms(u: UOp, dt: DType) -> list[UOp]:
  """The terms of a sum: the leaves of the float ADDs of dtype `dt` under u, left to right."""
  return [t for s in u.src for t in _terms(s, dt)] if u.op is Ops.ADD and u.dtype == dt else [u]


def _fused_update(fuses: Callable[[DType], bool]):
  def rule(u: UOp, acc: UOp, v: UOp):
    if not dtypes.is_float(u.dtype) or not fuses(u.dtype) or acc not in v.src: return None
    # acc + x (or x + acc): x's terms; acc + acc is no sum of products
    terms = [t for s in v.src if s is not acc for t in _terms(s, u.dtype)] if v.src.count(acc) == 1 else None
    if terms is None or not (products := [t for t in terms if t.op is Ops.MUL]): return None
    value = acc
    for t in terms:
      if t.op is not Ops.MUL: value = UOp(Ops.ADD, u.dtype, (value, t))
    for p in products: value = UOp(Ops.MULACC, u.dtype, (p.src[0], p.src[1], value))
    return UOp(Ops.ASSIGN, u.dtype, (acc, value))
  return rule


def fuse_accumulations(sink: UOp, fuses: Callable[[DType], bool]) -> UOp:
  """`sink` with every float sum's update whose terms include products of its dtype fused (module docstring), where
  `fuses(dtype)` says the renderer's MULACC of that dtype is one fused multiply-add."""
  # one walk: the updates are found in the graph as it is (a fused update is an ASSIGN of no ADD, so nothing fused is
  # fused again) and replaced, the graph above each rebuilt on it
  rule, topo = _fused_update(fuses), passing_toposort(sink)
  found = {u: new for u in topo if u.op is Ops.ASSIGN and len(u.src) == 2 and u.src[0].op is Ops.DEFINE_ACC and u.src[1].op is Ops.ADD
           and (new := rule(u, u.src[0], u.src[1])) is not None}
  return replaced(topo, found) if found else sink
