"""beam_search: the kernel autotuner. Keeps the `width` fastest kernels, tries every legal next opt on each, compiles
the new sources in parallel, times them on the device and keeps the `width` fastest again, until a round gains less
than `min_gain`. A kernel clearly slower than the best (TimingPlan.give_up times) is not expanded: its children
cost a run as slow as it just to be found slower. The hand-coded kernel is a candidate from the start and meets the winner again head to head at the
end, and the winner's output is checked against the hand-coded kernel's before it is returned.

A search interrupted by Ctrl-C stops its compile workers and raises SearchInterrupted (a KeyboardInterrupt) carrying the
fastest kernel timed so far."""
from __future__ import annotations
import math, statistics, time, warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional
from kc.kernel import Kernel
from kc.errors import ConfigError, KcError
from kc.config import debug_level
from kc.kernel.opt import Opt
from kc.renderer import Program
from kc.search import interrupt
from kc.search.actions import DEFAULT_LIMITS, SearchLimits, action_list, expand
from kc.search.check import mismatch
from kc.search.executor import shared_pool
from kc.search.result import RoundStats, SearchEvent, SearchInterrupted, SearchResult
from kc.search.timing import Launcher, SearchBuffers, TimingPlan, time_launcher

FINAL_RUNS = 5  # runs of each side in the final head-to-head (interleaved, after one warm-up each)
DEFAULT_TIMING = TimingPlan()  # TimingPlan is frozen, so every search can share one default


class SearchWarning(UserWarning):
  """A search dropped a winner whose output differs from the hand-coded kernel's."""


@dataclass
class _Source:
  """One distinct source: compiled and timed at most once, whichever candidates render to it (`kernel` is the first
  of them)."""
  src: str
  program: Program
  kernel: Kernel
  launcher: Optional[Launcher] = None
  seconds: float = math.inf
  error: Optional[str] = None
  compiled: bool = False


@dataclass
class _Candidate:
  kernel: Kernel
  source: _Source
  order: int  # the tie-break: earlier candidates win ties

  @property
  def key(self) -> tuple[float, int]: return (self.source.seconds, self.order)

  @property
  def opts(self) -> list[Opt]: return list(self.kernel.applied_opts)


@dataclass
class _Counters:
  compiled: int = 0
  timed: int = 0
  rounds: list[RoundStats] = field(default_factory=list)


class _Search:
  """The state of one search: every source seen, the device buffers, the best time so far."""

  def __init__(self, device: Any, buffers: SearchBuffers, executor: Any, timeout: float, progress: Optional[Callable[[SearchEvent], None]],
               plan: TimingPlan):
    self.device, self.buffers, self.executor, self.timeout, self.progress, self.plan = device, buffers, executor, timeout, progress, plan
    self.sources: dict[str, _Source] = {}
    self.best: Optional[float] = None
    self.hand_seconds: Optional[float] = None
    self.hand_opts: list[Opt] = []
    self.counters = _Counters()
    self.order = 0
    self.start = time.perf_counter()

  def emit(self, kind: str, rnd: int, done: int, total: int, message: str = "") -> None:
    if self.progress is not None: self.progress(SearchEvent(kind, rnd, done, total, self.best, self.hand_seconds, message))

  def candidate(self, kernel: Kernel, program: Program) -> _Candidate:
    source = self.sources.setdefault(program.src, _Source(program.src, program, kernel))
    self.order += 1
    return _Candidate(kernel, source, self.order)

  def evaluate(self, cands: list[_Candidate], rnd: int) -> tuple[int, int, int]:
    """Compile and time the candidates' sources that are new; (compiled, compile_failed, timed) of this call."""
    new = [s for s in dict.fromkeys(c.source.src for c in cands) if not self.sources[s].compiled]
    todo = [self.sources[s] for s in new]
    self.emit("round", rnd, 0, len(todo), f"round {rnd}: {len(todo)} new sources of {len(cands)} candidates")
    failed = 0
    libs: dict[int, bytes] = {}
    outcomes = self.executor.compile_many(self.device.compiler, [s.src for s in todo], self.timeout)
    try:
      for n, outcome in enumerate(outcomes, 1):
        s = todo[outcome.index]
        s.compiled = True
        if outcome.lib is None:
          s.error, failed = outcome.error or "the compile failed", failed + 1
        else: libs[outcome.index] = outcome.lib
        self.emit("compiled", rnd, n, len(todo))
    finally:
      # closed now, whatever stopped the loop (a Ctrl-C in a progress display): the executor stops what is in flight
      if (close := getattr(outcomes, "close", None)) is not None: close()
    self.counters.compiled += len(todo)
    timed = 0
    for i, s in enumerate(todo):  # in candidate order, whatever order the compiles finished in: the same runs every time
      if i not in libs: continue
      try:
        s.launcher = Launcher(s.program, self.device.runtime(s.program.name, libs[i]), self.buffers)
        s.seconds, _ = time_launcher(s.launcher, self.plan, self.best)
      except Exception as e:  # noqa: BLE001  (a candidate the device cannot load or run costs that candidate, whatever the backend raises)
        s.launcher, s.error, s.seconds = None, f"{type(e).__name__}: {e}", math.inf
        continue
      timed += 1
      if debug_level() >= 3: print(f"  {s.seconds * 1e6:12.1f} us  {s.program.name}")
      if self.best is None or s.seconds < self.best: self.best = s.seconds
      self.emit("timed", rnd, timed, len(libs))
    self.counters.timed += timed
    return len(todo), failed, timed

  def best_so_far(self) -> Optional[SearchResult]:
    """The fastest kernel timed so far, with the search's own timing of it (not the final head-to-head; its output
    not checked), or None when nothing was timed yet."""
    timed = [s for s in self.sources.values() if s.launcher is not None and math.isfinite(s.seconds)]
    if not timed: return None
    best = min(timed, key=lambda s: s.seconds)  # the first of equals: the earliest candidate, as the beam keeps
    hand = self.hand_seconds if self.hand_seconds is not None else math.inf
    return SearchResult(opts=list(best.kernel.applied_opts), kernel=best.kernel, seconds=best.seconds,
                        hand_opts=list(self.hand_opts), hand_seconds=hand, rounds=list(self.counters.rounds),
                        compiled=self.counters.compiled, timed=self.counters.timed,
                        elapsed=time.perf_counter() - self.start)


def _validate(kernel: Any, device: Any, width: Any, min_gain: Any, max_rounds: Any, timeout: Any, seed: Any) -> None:
  if not isinstance(kernel, Kernel): raise KcError(f"beam_search takes a kc.Kernel, got {type(kernel).__name__}")
  if kernel.applied_opts: raise KcError(f"beam_search starts from a kernel with no opts applied; this one has {kernel.applied_opts}")
  missing = [a for a in ("name", "compiler", "runtime", "allocator") if not hasattr(device, a)]
  if missing:
    raise KcError(f"beam_search needs a device (kc.Device[name]) with .name .compiler .runtime .allocator; {device!r} lacks {', '.join(missing)}")
  def whole(x): return isinstance(x, int) and not isinstance(x, bool)
  if not whole(width) or width < 1: raise ConfigError(f"beam width is an int >= 1, got {width!r}")
  if not isinstance(min_gain, (int, float)) or isinstance(min_gain, bool) or not 0 <= min_gain < 1:
    raise ConfigError(f"min_gain is a fraction in [0, 1), got {min_gain!r}")
  if max_rounds is not None and (not whole(max_rounds) or max_rounds < 0):
    raise ConfigError(f"max_rounds is None or an int >= 0, got {max_rounds!r}")
  if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
    raise ConfigError(f"timeout is seconds > 0, got {timeout!r}")
  if not whole(seed): raise ConfigError(f"seed is an int, got {seed!r}")


def beam_search(kernel: Kernel, device: Any, width: int = 2, *, min_gain: float = 0.01, max_rounds: Optional[int] = None,
                timeout: float = 30.0, executor: Any = None, progress: Optional[Callable[[SearchEvent], None]] = None,
                seed: int = 0, limits: SearchLimits = DEFAULT_LIMITS, timing: TimingPlan = DEFAULT_TIMING) -> SearchResult:
  """The fastest opts found for `kernel` (a kc.Kernel with no opts applied; it is not changed) on `device` (an
  object with .name .renderer .compiler .runtime .allocator, as kc.Device[name] is).

  width: kernels kept per round. min_gain: the search stops after a round that improves the best time by less than
  this fraction. max_rounds: at most this many rounds after round 0 (None: no limit). timeout: seconds one compile
  may take. executor: what compiles (compile_many); None is the process's shared LocalCompilePool. progress: called
  with each SearchEvent. seed: the random inputs. limits / timing: candidates' limits and how each is timed."""
  _validate(kernel, device, width, min_gain, max_rounds, timeout, seed)
  executor = executor if executor is not None else shared_pool()
  actions = action_list(kernel.renderer)
  buffers = SearchBuffers(kernel.ast, device, seed)
  search = _Search(device, buffers, executor, float(timeout), progress, timing)
  try:
    with interrupt.watched():
      result = _run(search, kernel, width, min_gain, max_rounds, limits, timing, actions)
      interrupt.raise_if_interrupted()  # a Ctrl-C that a finalizer swallowed after the last compile wait
      return result
  except KeyboardInterrupt:
    interrupt.consume()
    _stop_workers(executor)
    raise SearchInterrupted(search.best_so_far()) from None
  finally: buffers.free()


def _stop_workers(executor: Any) -> None:
  """After a Ctrl-C: the executor's workers go now (LocalCompilePool.terminate), not when the process exits. An
  executor without terminate() stopped its work when its compile_many was closed."""
  if callable(terminate := getattr(executor, "terminate", None)): terminate()


def _run(search: _Search, kernel: Kernel, width: int, min_gain: float, max_rounds: Optional[int], limits: SearchLimits,
         timing: TimingPlan, actions: list[Opt]) -> SearchResult:
  """The search's rounds, the check of the winner and the final head-to-head (beam_search without its set-up)."""
  # round 0: the hand-coded kernel first (it wins a tie) and the unoptimized one
  hand_k, base_k = kernel.copy().hand_coded_optimizations(), kernel.copy().required_optimizations()
  search.hand_opts = list(hand_k.applied_opts)
  starts = []
  for k in (hand_k, base_k):
    # the starting kernels are candidates whatever their size (no limits): only a render failure keeps one out
    try: starts.append(search.candidate(k, k.to_program()))
    except KcError as e:
      which = "hand-coded" if k is hand_k else "unoptimized"
      warnings.warn(f"beam_search: the {which} kernel does not render: {e}", SearchWarning, stacklevel=3)
  if not starts: raise KcError("beam_search: neither the hand-coded nor the unoptimized kernel renders")
  hand = starts[0] if starts[0].kernel is hand_k else None
  t0 = time.perf_counter()
  compiled, failed, timed = search.evaluate(starts, 0)
  if hand is not None and hand.source.launcher is not None: search.hand_seconds = hand.source.seconds
  _finish_round(search, 0, len(starts), compiled, failed, timed, t0)
  seen: dict[str, _Candidate] = {}
  for c in starts: seen.setdefault(c.source.src, c)
  beam = _beam(list(seen.values()), width, timing.give_up)
  rnd = 0
  while beam and (max_rounds is None or rnd < max_rounds):
    rnd += 1
    t0 = time.perf_counter()
    before = beam[0].source.seconds
    children: list[_Candidate] = []
    for parent in beam:
      children += [search.candidate(child.kernel, child.program) for child in expand(parent.kernel, actions, limits)[0]]
    compiled, failed, timed = search.evaluate(children, rnd)
    for c in children: seen.setdefault(c.source.src, c)
    pool = {c.source.src: c for c in beam}
    for c in children: pool.setdefault(c.source.src, c)
    beam = _beam(list(pool.values()), width, timing.give_up)
    _finish_round(search, rnd, len(children), compiled, failed, timed, t0, beam)
    if not children or not beam or not (before - beam[0].source.seconds > min_gain * before): break
  winner, rejected = _checked_winner(search, list(seen.values()), hand if hand is not None else starts[0])
  seconds, hand_seconds = _head_to_head(winner, hand, timing)
  if hand is not None and winner is not hand and hand_seconds <= seconds: winner, seconds = hand, hand_seconds
  search.best = seconds
  speedup = hand_seconds / seconds if seconds > 0 else 1.0
  search.emit("done", rnd, 1, 1, f"{len(winner.opts)} opts, {speedup:.2f}x the hand-coded kernel")
  return SearchResult(opts=winner.opts, kernel=winner.kernel, seconds=seconds, hand_opts=search.hand_opts,
                      hand_seconds=hand_seconds, rounds=search.counters.rounds, compiled=search.counters.compiled,
                      timed=search.counters.timed, elapsed=time.perf_counter() - search.start, rejected=rejected)


def _best(cands: list[_Candidate], width: int) -> list[_Candidate]:
  """The `width` fastest candidates that ran (ties: the earlier candidate first)."""
  return sorted((c for c in cands if c.source.launcher is not None and math.isfinite(c.source.seconds)), key=lambda c: c.key)[:width]


def _beam(cands: list[_Candidate], width: int, prune: float) -> list[_Candidate]:
  """The kernels the next round expands: the `width` fastest, less those more than `prune` times slower than the
  fastest. Such a kernel is not worth its round: its children run about as slowly as it does (each costs a run that
  long just to be found slower), and one opt rarely makes up that much."""
  best = _best(cands, width)
  return [c for c in best if c.source.seconds <= prune * best[0].source.seconds] if best else []


def _finish_round(search: _Search, rnd: int, candidates: int, compiled: int, failed: int, timed: int, t0: float,
                  beam: Optional[list[_Candidate]] = None) -> None:
  best = search.best if search.best is not None else math.inf
  stats = RoundStats(rnd, candidates, compiled, failed, timed, best, time.perf_counter() - t0)
  search.counters.rounds.append(stats)
  search.emit("round_done", rnd, timed, compiled, f"round {rnd}: best {best * 1e6:.1f} us")
  if debug_level() >= 2:
    opts = beam[0].opts if beam else []
    print(f"beam round {rnd}: {candidates} candidates, {compiled} compiled ({failed} failed), {timed} timed, "
          f"best {best * 1e6:.1f} us in {stats.seconds:.2f} s {opts}")


def _checked_winner(search: _Search, cands: list[_Candidate], reference: _Candidate) -> tuple[_Candidate, list[str]]:
  """The fastest candidate whose outputs match the reference's (the hand-coded kernel's) on the search's inputs;
  each faster one that does not is reported (returned and warned) and skipped."""
  ranked = _best(cands, len(cands))
  if reference.source.launcher is None:
    # the hand-coded kernel did not compile or run: the unoptimized kernel is the reference, if it ran
    if not ranked: raise KcError(f"beam_search: no candidate compiled and ran; the hand-coded kernel: {reference.source.error}")
    reference = next((c for c in ranked if not c.kernel.applied_opts), ranked[-1])
  buffers = search.buffers
  buffers.reset()
  reference.source.launcher()
  want = buffers.outputs()
  layout = {b.index: b for b in buffers.layout}
  rejected: list[str] = []
  for c in ranked:
    if c.source is reference.source: return c, rejected
    buffers.reset()
    c.source.launcher()
    got = buffers.outputs()
    problems = [p for i in want if (p := mismatch(layout[i], got[i], want[i])) is not None]
    if not problems: return c, rejected
    report = f"opts {c.opts} ({c.source.seconds * 1e6:.1f} us) give a wrong result: " + "; ".join(problems)
    rejected.append(report)
    warnings.warn(f"beam_search dropped a candidate: {report}", SearchWarning, stacklevel=4)
  return reference, rejected


def _head_to_head(winner: _Candidate, hand: Optional[_Candidate], plan: TimingPlan) -> tuple[float, float]:
  """(winner's, hand-coded's) median seconds, timed interleaved so that both see the same machine state."""
  w = winner.source.launcher
  h = hand.source.launcher if hand is not None else None
  if h is None or winner.source is hand.source:
    sides = [w] if h is None else [h]
    for _ in range(plan.warmup): sides[0]()
    t = statistics.median(sides[0]() for _ in range(FINAL_RUNS))
    return t, (t if h is not None else math.inf)
  for _ in range(plan.warmup): w(); h()
  ws, hs = [], []
  for _ in range(FINAL_RUNS):
    ws.append(w())
    hs.append(h())
  return statistics.median(ws), statistics.median(hs)
