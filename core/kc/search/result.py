"""What a BEAM search reports: SearchEvent (progress, as it happens), RoundStats (one round), SearchResult, and
SearchInterrupted when Ctrl-C stopped it."""
from __future__ import annotations
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional
from kc.kernel.opt import Opt

if TYPE_CHECKING: from kc.kernel import Kernel

EVENT_KINDS = ("round", "compiled", "timed", "round_done", "done")


@dataclass(frozen=True)
class SearchEvent:
  """One step of a search, for a progress display. kind: "round" (a round starts: `total` candidates to compile),
  "compiled" / "timed" (`done` of `total` of this round so far), "round_done", "done" (the search ended).
  best_seconds is the best time so far, hand_seconds the hand-coded kernel's (None until timed)."""
  kind: str
  round: int
  done: int
  total: int
  best_seconds: Optional[float]
  hand_seconds: Optional[float]
  message: str = ""


@dataclass
class RoundStats:
  """One round: candidates (new kernels proposed, duplicates of a source already seen included), compiled (new sources
  compiled), compile_failed (of those, failed or timed out), timed (candidates run on the device), best_seconds
  (the best time after the round) and seconds (wall time the round took)."""
  round: int
  candidates: int
  compiled: int
  compile_failed: int
  timed: int
  best_seconds: float
  seconds: float


@dataclass
class SearchResult:
  """The winner of a search. opts replay on a fresh Kernel with apply_opt; seconds and hand_seconds are the medians
  of the final head-to-head timing; rejected says which winners were dropped for a wrong output, and why."""
  opts: list[Opt]
  kernel: "Kernel"
  seconds: float
  hand_opts: list[Opt]
  hand_seconds: float
  rounds: list[RoundStats] = field(default_factory=list)
  compiled: int = 0
  timed: int = 0
  elapsed: float = 0.0
  rejected: list[str] = field(default_factory=list)

  @property
  def speedup(self) -> float:
    """How many times faster than the hand-coded kernel (1.0 when the hand-coded kernel won)."""
    if self.seconds > 0: return self.hand_seconds / self.seconds
    return 1.0 if self.hand_seconds == 0 else math.inf


class SearchInterrupted(KeyboardInterrupt):
  """A search stopped by Ctrl-C (KeyboardInterrupt), after its compile workers were stopped; code that catches
  KeyboardInterrupt catches it. `best` is the fastest kernel timed so far as a SearchResult, or None when nothing was
  timed: its times are the search's own measurements (there was no final head-to-head), its output was not checked
  against the hand-coded kernel's, and it was not stored in the opt cache."""

  def __init__(self, best: Optional[SearchResult]):
    rounds = len(best.rounds) if best is not None else 0
    super().__init__(f"the BEAM search was interrupted after {rounds} finished round{'s' if rounds != 1 else ''}")
    self.best = best
