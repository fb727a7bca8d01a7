"""The kernel threads that run a split kernel's parts (kc.runtime.host_parts, exported by kc.backend): every part once and at the same time, the call
returning only after every part ended (also when a part fails, or the caller is interrupted), errors raised to the
caller, calls from several Python threads taking turns, more threads made when more parts are asked for, and a forked
child making its own; and SplitChoice, which times a split kernel's own calls both ways and keeps the faster."""
import os, threading, time
import pytest
from hypothesis import given, settings, strategies as st
from kc.backend import KernelThreads, SplitChoice, kernel_threads, run_parts


def recorder():
  seen, lock = [], threading.Lock()
  def part(tag, i, n):
    with lock: seen.append((tag, i, n, threading.get_ident()))
  return seen, part


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=6))
def test_every_part_runs_once_on_its_own_thread(counts):
  crew = KernelThreads()
  for parts in counts:
    seen, part = recorder()
    crew.run(part, ("t",), parts)
    assert sorted(s[:3] for s in seen) == [("t", i, parts) for i in range(parts)]
    assert len({s[3] for s in seen}) == parts  # part 0 on the caller, each other part on a thread of its own
  assert crew.size == max(counts) - 1  # threads are kept and made only when more parts are asked for


def test_the_parts_run_at_once():
  # each part waits for all the others: run in turn, they would never meet
  parts = 4
  barrier = threading.Barrier(parts, timeout=10)
  KernelThreads().run(lambda i, n: barrier.wait(), (), parts)


def test_a_call_returns_after_every_part_and_raises_a_parts_error():
  ended = []
  def part(i, n):
    if i == 1: raise ValueError("part 1 failed")
    time.sleep(0.05)
    ended.append(i)
  crew = KernelThreads()
  with pytest.raises(ValueError, match="part 1 failed"): crew.run(part, (), 3)
  assert sorted(ended) == [0, 2]  # the slow parts had ended before the error reached the caller
  seen, rec = recorder()
  crew.run(rec, ("again",), 3)  # the threads serve the next call as before
  assert len(seen) == 3


def test_calls_from_several_threads_take_turns():
  crew, running, most = KernelThreads(), [0], [0]
  lock = threading.Lock()
  def part(i, n):
    with lock:
      running[0] += 1
      most[0] = max(most[0], running[0])
    time.sleep(0.002)
    with lock: running[0] -= 1
  callers = [threading.Thread(target=lambda: [crew.run(part, (), 2) for _ in range(20)]) for _ in range(3)]
  for t in callers: t.start()
  for t in callers: t.join(30)
  assert most[0] <= 2  # never two calls' parts at once: the job slots are shared


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_makes_its_own_threads():
  seen, part = recorder()
  run_parts(part, ("parent",), 3)
  parent = kernel_threads()
  r, w = os.pipe()
  pid = os.fork()
  if pid == 0:  # the child: its parent's threads do not exist here
    ok = kernel_threads() is not parent
    seen.clear()
    run_parts(part, ("child",), 3)
    os.write(w, b"1" if ok and len(seen) == 3 else b"0")
    os._exit(0)
  os.close(w)
  assert os.read(r, 1) == b"1"
  os.waitpid(pid, 0)


def _drive(choice: SplitChoice, threads: int, seconds, calls: int) -> list[bool]:
  """The ways `choice` picks for `calls` calls on `threads` threads, each taking seconds(threaded)."""
  ways = []
  for _ in range(calls):
    way = choice.threaded(threads)
    choice.record(way, seconds(way))
    ways.append(way)
  return ways


@pytest.mark.parametrize("threaded_faster", [True, False])
def test_a_split_choice_tries_both_ways_in_turn_then_keeps_the_faster(threaded_faster):
  choice = SplitChoice()
  fast, slow = 1e-5, 3e-5
  n = SplitChoice.WARM_UP + len(SplitChoice.ORDER)
  ways = _drive(choice, 2, lambda way: fast if way == threaded_faster else slow, n + 20)
  # the warm-up calls run threaded, then the trial's turns, then the faster way every time
  assert ways[:n] == [True] * SplitChoice.WARM_UP + list(SplitChoice.ORDER)
  assert ways[n:] == [threaded_faster] * 20 and choice.decided is threaded_faster
  # the warm-up's times never count: slow ones there change nothing
  again = SplitChoice()
  times = iter([1.0] * SplitChoice.WARM_UP + [fast if w == threaded_faster else slow for w in SplitChoice.ORDER])
  _drive(again, 2, lambda way: next(times), n)
  assert again.decided is threaded_faster


def test_a_split_choice_is_made_again_for_a_new_thread_count_and_never_threads_one():
  choice = SplitChoice()
  n = SplitChoice.WARM_UP + len(SplitChoice.ORDER)
  _drive(choice, 2, lambda way: 1e-5 if way else 2e-5, n)
  assert choice.decided is True
  assert _drive(choice, 1, lambda way: 1.0, 5) == [False] * 5 and choice.decided is None  # one thread: nothing to choose
  ways = _drive(choice, 4, lambda way: 2e-5 if way else 1e-5, n + 3)  # four threads: tried again, and now slower
  assert ways[:SplitChoice.WARM_UP] == [True] * SplitChoice.WARM_UP and ways[n:] == [False] * 3


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(1e-6, 1e-3), min_size=len(SplitChoice.ORDER), max_size=len(SplitChoice.ORDER)))
def test_a_split_choice_keeps_the_way_with_the_best_time_of_its_trial(times):
  choice = SplitChoice()
  trial = iter(times)
  _drive(choice, 2, lambda way: 1.0, SplitChoice.WARM_UP)
  _drive(choice, 2, lambda way: next(trial), len(SplitChoice.ORDER))
  best = {way: min(t for t, w in zip(times, SplitChoice.ORDER) if w == way) for way in (True, False)}
  assert choice.decided is (best[True] < best[False])


def test_a_timed_call_runs_the_chosen_way_and_decides_by_its_times():
  import time as _time
  choice, ways = SplitChoice(), []
  def run(threaded):  # the whole range costs 2 ms here, the threads 0
    ways.append(threaded)
    if not threaded: _time.sleep(0.002)
  n = SplitChoice.WARM_UP + len(SplitChoice.ORDER)
  seconds = [choice.timed(2, run) for _ in range(n + 2)]
  assert ways[:n] == [True] * SplitChoice.WARM_UP + list(SplitChoice.ORDER) and ways[n:] == [True, True]
  assert choice.decided is True and all(s >= 0.002 for s, w in zip(seconds, ways) if not w)
