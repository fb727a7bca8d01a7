"""Optimization operations and the Opt that names one application of them."""
from __future__ import annotations
from dataclasses import dataclass
from enum import Enum, auto
from typing import Optional
from kc.enums import plain_members
from kc.errors import KernelOptError

class OptOps(Enum):
  TC = auto(); UPCAST = auto(); UPCASTMID = auto(); UNROLL = auto(); LOCAL = auto()  # noqa: E702
  GROUP = auto(); GROUPTOP = auto(); NOLOCALS = auto(); PADTO = auto(); SWAP = auto()  # noqa: E702
  def __lt__(self, other: "OptOps") -> bool: return self.value < other.value
  def __repr__(self): return f"OptOps.{self.name}"


plain_members(OptOps)  # (kc.enums)


@dataclass(frozen=True, order=True)
class Opt:
  """One optimization: `op` on `axis` by `amt`. UNROLL counts its axis from the first reduce axis, GROUP and
  GROUPTOP from the first reduce axis that is not grouped yet; every other op counts from 0. amt 0 means the
  whole axis; for SWAP amt is the other axis."""
  op: OptOps
  axis: Optional[int] = None
  amt: Optional[int] = None

  def __repr__(self): return f"Opt(op={self.op!r}, axis={self.axis}, amt={self.amt})"


def check(cond: bool, msg: str) -> None:
  """Refuse an optimization: the Kernel's apply_opt turns this into an unchanged Kernel and a KernelOptError."""
  if not cond: raise KernelOptError(msg)
