"""What ran in torch instead of kc, and why: the fallback report (`kc_torch.fallbacks()`; options={"report": True}
prints each graph's lines as it is compiled)."""
from __future__ import annotations
import sys
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class Fallback:
  graph: str    # "forward", "backward" or "inference", and the graph's number in this process
  op: str       # the ATen op (or "region of N ops" for a kc region that failed to compile as a whole)
  reason: str


_lock = threading.Lock()
_fallbacks: list[Fallback] = []


def record(fallback: Fallback, echo: bool) -> None:
  with _lock: _fallbacks.append(fallback)
  if echo: print(f"kc_torch: {fallback.graph}: {fallback.op} runs in torch: {fallback.reason}", file=sys.stderr)


def fallbacks() -> list[Fallback]:
  """Every fallback recorded in this process so far, in order."""
  with _lock: return list(_fallbacks)


def clear() -> None:
  """Forget the recorded fallbacks (a test or a benchmark reads the report of one model at a time)."""
  with _lock: _fallbacks.clear()
