"""kc.search.beam_search on EMU with toy timing models: a fake device wraps EMU (its renderer, compiler and
allocator, and EMU's real programs, so every output is computed) and reports a run time that the test decides from
the program. The search must find the known-best opt, keep the hand-coded kernel when nothing beats it, drop a
wrong candidate, report its progress and stop when a round gains too little."""
import warnings
import pytest
from kc import ConfigError, KcError, Opt, OptOps, dtypes
from kc import ast as A
from kc.kernel import Kernel
from kc.search import CompileOutcome, SearchWarning, TimingPlan, beam_search

QUICK = TimingPlan(warmup=1, runs=2)


class InlineExecutor:
  """Compiles in the calling thread: the search's executor protocol without worker processes."""
  def compile_many(self, compiler, sources, timeout):
    for i, src in enumerate(sources): yield CompileOutcome(i, compiler.compile(src), None, 0.0)


class ToyDevice:
  """EMU with a run time chosen by `seconds(name, lib)`; `wrong` (a set of libs) are miscompiled: they write zeros."""
  def __init__(self, emu, seconds, wrong=frozenset()):
    self.name, self.renderer, self.compiler, self.allocator = "EMU", emu.renderer, emu.compiler, emu.allocator
    self.emu, self.seconds, self.wrong, self.launches = emu, seconds, wrong, 0

  def runtime(self, name, lib):
    prog, toy = self.emu.runtime(name, lib), self

    def launch(*bufs, global_size=(1, 1, 1), local_size=(1, 1, 1), vals=(), wait=False):
      toy.launches += 1
      if lib in toy.wrong: bufs[0].array[:] = 0  # the miscompiled program: its output is all zeros
      else: prog(*bufs, global_size=global_size, local_size=local_size, vals=vals, wait=True)
      return toy.seconds(name, lib)
    return launch


def lib_of(emu, sink, opts) -> bytes:
  k = Kernel(sink, emu.renderer)
  for o in opts: k.apply_opt(o)
  return emu.compiler.compile(k.to_program().src)


ADD = A.sink(A.store(0, A.arg(1, dtypes.float32, (16, 32)) + A.arg(2, dtypes.float32, (16, 32))))
MATMUL = A.sink(A.store(0, A.arg(1, dtypes.float32, (8, 16)) @ A.arg(2, dtypes.float32, (16, 8))))


def test_finds_the_known_best_opts(emu):
  # the toy device runs one kernel 10x faster than anything else and one opt further on 20x: two rounds reach it
  first = [Opt(OptOps.UPCAST, 0, 4)]
  best = first + [Opt(OptOps.LOCAL, 0, 2)]
  fast = {lib_of(emu, ADD, first): 0.1, lib_of(emu, ADD, best): 0.05}
  dev = ToyDevice(emu, lambda name, lib: fast.get(lib, 1.0))
  k = Kernel(ADD, emu.renderer)
  events = []
  res = beam_search(k, dev, width=2, executor=InlineExecutor(), progress=events.append, timing=QUICK)
  assert res.opts == best and res.kernel.applied_opts == best and res.seconds == 0.05 and res.hand_seconds == 1.0
  assert res.speedup == 20.0 and res.rejected == []
  assert not k.applied_opts  # the kernel given is not changed
  replay = Kernel(ADD, emu.renderer)
  for o in res.opts: replay.apply_opt(o)
  assert replay.to_program().src == res.kernel.to_program().src
  assert [r.round for r in res.rounds] == list(range(len(res.rounds))) and len(res.rounds) >= 3
  assert res.compiled == sum(r.compiled for r in res.rounds) and res.timed == sum(r.timed for r in res.rounds)
  assert res.rounds[-1].best_seconds == 0.05 and res.rounds[0].candidates == 2
  # progress: every kind, rounds in order, compiled counts up to each round's total, done last
  kinds = [e.kind for e in events]
  assert set(kinds) == {"round", "compiled", "timed", "round_done", "done"} and kinds[-1] == "done" and kinds[0] == "round"
  assert kinds.count("round") == kinds.count("round_done") == len(res.rounds)
  compiled = [e for e in events if e.kind == "compiled" and e.round == 1]
  assert [e.done for e in compiled] == list(range(1, len(compiled) + 1)) and all(e.total == len(compiled) for e in compiled)
  assert events[-1].best_seconds == 0.05 and events[-1].hand_seconds == 1.0


def test_the_hand_coded_kernel_wins_when_nothing_beats_it(emu):
  hand = Kernel(ADD, emu.renderer).hand_coded_optimizations()
  hand_lib = emu.compiler.compile(hand.to_program().src)
  dev = ToyDevice(emu, lambda name, lib: 0.5 if lib == hand_lib else 1.0)
  res = beam_search(Kernel(ADD, emu.renderer), dev, width=3, executor=InlineExecutor(), timing=QUICK)
  assert res.opts == hand.applied_opts == res.hand_opts and res.seconds == res.hand_seconds == 0.5 and res.speedup == 1.0


def test_a_tie_goes_to_the_hand_coded_kernel(emu):
  # every kernel is as fast as every other: the hand-coded one came first and stays
  res = beam_search(Kernel(ADD, emu.renderer), ToyDevice(emu, lambda name, lib: 1.0), executor=InlineExecutor(), timing=QUICK)
  assert res.opts == res.hand_opts and len(res.rounds) == 2  # round 1 gained nothing: the search stopped


def test_a_wrong_candidate_is_rejected(emu):
  # the fastest kernel is miscompiled (writes zeros): the correctness check drops it, the next best wins
  bad, good = [Opt(OptOps.UPCAST, 1, 4)], [Opt(OptOps.UPCAST, 0, 2)]
  bad_lib, good_lib = lib_of(emu, MATMUL, bad), lib_of(emu, MATMUL, good)
  times = {bad_lib: 0.01, good_lib: 0.1}
  dev = ToyDevice(emu, lambda name, lib: times.get(lib, 1.0), wrong={bad_lib})
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    res = beam_search(Kernel(MATMUL, emu.renderer), dev, width=2, max_rounds=1, executor=InlineExecutor(), timing=QUICK)
  assert res.opts == good and res.seconds == 0.1
  assert len(res.rejected) == 1 and str(bad) in res.rejected[0] and "elements outside" in res.rejected[0]
  assert any(issubclass(w.category, SearchWarning) and "wrong result" in str(w.message) for w in caught)


def test_min_gain_stops_the_rounds(emu):
  # every axis split makes a kernel 0.5% faster: a round gains about that much
  def seconds(name, lib): return 1.0 / (1 + 0.005 * name.count("_"))
  def rounds(**kw): return beam_search(Kernel(ADD, emu.renderer), ToyDevice(emu, seconds), executor=InlineExecutor(), timing=QUICK, **kw).rounds
  assert len(rounds(min_gain=0.01)) == 2  # round 1 gained less than 1%: no round 2
  assert len(rounds(min_gain=0.001, max_rounds=3)) == 4  # it gains more than 0.1%: rounds go on up to max_rounds
  assert len(rounds(max_rounds=0)) == 1


def test_slow_candidates_stop_early(emu):
  # a candidate 10x slower than the best is run once (its warm-up), not warm-up plus every timed run
  hand = Kernel(ADD, emu.renderer).hand_coded_optimizations()
  hand_lib = emu.compiler.compile(hand.to_program().src)
  dev = ToyDevice(emu, lambda name, lib: 0.1 if lib == hand_lib else 1.0)
  res = beam_search(Kernel(ADD, emu.renderer), dev, max_rounds=1, executor=InlineExecutor(), timing=TimingPlan(warmup=1, runs=5))
  full = 6 * res.timed  # what timing every candidate fully would launch
  assert dev.launches < full / 2 and res.opts == hand.applied_opts


def test_the_default_executor_and_the_same_result_twice(emu):
  fast_lib = lib_of(emu, ADD, [Opt(OptOps.UPCAST, 0, 4)])
  def run(): return beam_search(Kernel(ADD, emu.renderer), ToyDevice(emu, lambda n, lib: 0.1 if lib == fast_lib else 1.0), timing=QUICK, seed=3)
  a, b = run(), run()
  assert a.opts == b.opts == [Opt(OptOps.UPCAST, 0, 4)] and a.compiled == b.compiled


def test_bad_arguments_are_kc_errors(emu):
  dev = ToyDevice(emu, lambda n, lib: 1.0)
  k = Kernel(ADD, emu.renderer)
  for kw in ({"width": 0}, {"min_gain": -0.1}, {"max_rounds": -1}, {"timeout": 0}, {"seed": "x"}):
    name, value = next(iter(kw.items()))
    with pytest.raises(ConfigError, match=f"{name if name != 'width' else 'beam width'} .*{value!r}"):
      beam_search(k, dev, executor=InlineExecutor(), **kw)
  with pytest.raises(KcError, match="no opts applied"): beam_search(k.copy().hand_coded_optimizations(), dev)
  with pytest.raises(KcError, match="lacks"): beam_search(k, object())
  with pytest.raises(KcError, match="kc.Kernel"): beam_search(ADD, dev)
