"""How a reduce's values combine: the order of a combine (pairwise) and the value a reduce starts from."""
from __future__ import annotations
from typing import Any
from kc.errors import KcError
from kc.ir.dtype import dtypes
from kc.ir.uop import Ops, UOp


def pairwise(op: Ops, values: list[UOp]) -> UOp:
  """values combined pairwise: a balanced tree has the shortest dependency chain (and sums round better)."""
  while len(values) > 1:
    values = [values[i].alu(op, values[i + 1]) if i + 1 < len(values) else values[i] for i in range(0, len(values), 2)]
  return values[0]


def identity_element(op: Ops, dt) -> Any:
  """The value a reduce starts from: 0 for sums, 1 for products, the dtype's minimum for max."""
  if op is Ops.ADD: return 0
  if op is Ops.MUL: return 1
  if op is Ops.MAX: return dtypes.min(dt)
  raise KcError(f"no identity for the reduce {op}")
