"""kc.search.interrupt: a Ctrl-C during a search is never lost, even when Python raises it inside a finalizer (where
an exception is printed and dropped) instead of in the search's own code."""
import gc, signal, sys, threading, time
import pytest
from kc.search import LocalCompilePool
from kc.search import interrupt
from search_fakes import FakeCompiler, UnpicklableCompiler

pytestmark = [pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
              pytest.mark.usefixtures("python_sigint_handler")]


@pytest.fixture
def python_sigint_handler():
  """Python's own SIGINT handler, as a program started from a terminal has it (a pytest-xdist worker ignores SIGINT)."""
  old = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  signal.signal(signal.SIGINT, old)


class _SwallowsACtrlC:
  """Its finalizer receives a SIGINT and goes on running Python code: the KeyboardInterrupt is raised inside the
  finalizer, where Python prints it as ignored, the way a UOp.__del__ running at that moment swallowed one."""
  def __del__(self):
    signal.raise_signal(signal.SIGINT)
    for _ in range(100): pass


def swallow_a_ctrl_c() -> None:
  _SwallowsACtrlC()
  gc.collect()


def test_a_swallowed_ctrl_c_is_raised_at_the_next_check():
  with interrupt.watched():
    swallow_a_ctrl_c()  # no KeyboardInterrupt reaches this frame
    with pytest.raises(KeyboardInterrupt): interrupt.raise_if_interrupted()
    interrupt.raise_if_interrupted()  # raised once
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_swallowed_ctrl_c_is_not_printed_as_an_error_but_other_unraisables_are(monkeypatch):
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(type(u.exc_value).__name__))
  with interrupt.watched():
    swallow_a_ctrl_c()
    class Broken:
      def __del__(self): raise ValueError("a real error in a finalizer")
    Broken()
    gc.collect()
    with pytest.raises(KeyboardInterrupt): interrupt.raise_if_interrupted()
  assert seen == ["ValueError"]
  swallow_a_ctrl_c()  # without the watch, Python reports it as it always did
  assert seen == ["ValueError", "KeyboardInterrupt"]


def test_a_caught_ctrl_c_is_consumed():
  with interrupt.watched():
    with pytest.raises(KeyboardInterrupt): signal.raise_signal(signal.SIGINT)
    interrupt.consume()
    interrupt.raise_if_interrupted()


def test_without_the_watch_a_swallowed_ctrl_c_is_lost():
  """What kc.search guards against: Python's own handler leaves nothing behind."""
  swallow_a_ctrl_c()
  interrupt.raise_if_interrupted()


def test_a_programs_own_handler_and_other_threads_are_left_alone():
  seen = []
  old = signal.signal(signal.SIGINT, lambda *a: seen.append(a[0]))
  try:
    with interrupt.watched():
      assert signal.getsignal(signal.SIGINT) is not interrupt._mark_and_raise
      signal.raise_signal(signal.SIGINT)
      interrupt.raise_if_interrupted()  # the program's handler took it
    assert seen == [signal.SIGINT]
  finally: signal.signal(signal.SIGINT, old)
  installed = []
  def in_a_thread():
    with interrupt.watched(): installed.append(signal.getsignal(signal.SIGINT))
  t = threading.Thread(target=in_a_thread)
  t.start(); t.join()
  assert installed == [signal.default_int_handler]


@pytest.mark.parametrize("compiler", [FakeCompiler(hang=60), UnpicklableCompiler(hang=60)], ids=["processes", "threads"])
def test_compile_waits_raise_a_swallowed_ctrl_c(compiler):
  """A compile that takes a minute: the wait for it raises the swallowed Ctrl-C instead of waiting it out."""
  with LocalCompilePool(workers=1) as pool, interrupt.watched():
    outcomes = pool.compile_many(compiler, ["HANG"], timeout=60)
    swallow_a_ctrl_c()
    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt): next(outcomes)
    assert time.perf_counter() - start < 30
