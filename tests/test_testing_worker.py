"""kc.testing.worker: the one isolated-worker harness of the compile pool, kc fuzz and the conformance suite, and
its one classification of what became of a job (ok, typed, untyped, crash, hang)."""
import pytest
from kc.errors import DeviceLostError, KcError
from kc.testing.worker import CRASH, HANG, OK, TYPED, UNTYPED, Worker, attempt, exit_description
from isolate_jobs import echo_handler, failing_setup


@pytest.fixture(scope="module")
def worker():
  w = Worker(echo_handler, ("got ",))
  assert w.wait_ready() is None
  yield w
  w.stop()


def fresh(w: Worker) -> Worker:
  """The module's worker, or a fresh one where the last test ended it."""
  if w.alive: return w
  w.__init__(echo_handler, ("got ",))
  assert w.wait_ready() is None
  return w


def test_a_job_that_returns_is_ok_with_its_value(worker):
  got = fresh(worker).call(("return", "x"), 30)
  assert (got.kind, got.value, got.ok, got.raised) == (OK, "got x", True, False) and got.seconds >= 0


@pytest.mark.parametrize("what, kind, etype", [("kc-error", TYPED, "KcError"), ("value-error", UNTYPED, "ValueError"),
                                               ("unpicklable", UNTYPED, None)])
def test_a_job_that_raises_is_typed_or_untyped_and_the_worker_goes_on(worker, what, kind, etype):
  w = fresh(worker)
  got = w.call((what, "bad value 7"), 30)
  assert got.kind == kind and got.raised and got.etype == (etype or got.etype)  # what fails to pickle varies
  assert ("bad value 7" in got.message) if what != "unpicklable" else ("does not pickle" in got.message)
  assert w.alive and w.call(("return", "again"), 30).value == "got again"


def test_a_segfault_is_a_crash_named_by_its_signal(worker):
  w = fresh(worker)
  got = w.call(("segfault", None), 30)
  assert (got.kind, got.etype) == (CRASH, "SIGSEGV") and "SIGSEGV" in got.message and not w.alive
  assert fresh(w).call(("return", "after"), 30).value == "got after"


def test_a_lost_device_is_the_jobs_crash_unwrapped_and_ends_the_worker(worker):
  w = fresh(worker)
  got = w.call(("lost-device", "illegal address in kernel E_4"), 30)
  assert (got.kind, got.etype, got.message) == (CRASH, "DeviceLostError", "illegal address in kernel E_4")
  assert not w.alive  # every later job on that device would fail the same way
  assert fresh(w).call(("return", "after"), 30).value == "got after"


def test_attempt_finds_a_lost_device_anywhere_in_the_chain_of_causes():
  def lost_while_handling():
    try: raise DeviceLostError("sticky")
    except DeviceLostError: raise ValueError("cleanup failed")  # noqa: B904 (the lost device is only the context)
  got = attempt(lost_while_handling)
  assert (got.kind, got.etype, got.message) == (CRASH, "DeviceLostError", "sticky")
  assert attempt(lambda: (_ for _ in ()).throw(KcError("plain"))).kind == TYPED


def test_an_exit_is_a_crash_with_its_status(worker):
  got = fresh(worker).call(("exit", 3), 30)
  assert (got.kind, got.etype) == (CRASH, "exit status 3")


def test_a_hang_is_killed_after_the_timeout(worker):
  w = fresh(worker)
  got = w.call(("hang", 60), 1.0)
  assert (got.kind, got.etype) == (HANG, "timeout") and "1 s" in got.message and 1.0 <= got.seconds < 30
  assert not w.alive


def test_notes_reach_the_parent_while_the_job_runs(worker):
  heard = []
  assert fresh(worker).call(("note", [1, 2]), 30, on_note=heard.append).value == "noted" and heard == [[1, 2]]


def test_workers_ignore_sigint(worker):
  # a terminal's Ctrl-C goes to the whole process group: the parent handles it, the worker carries on
  w = fresh(worker)
  assert w.call(("sigint", None), 30).value == "still here" and w.alive


def test_an_interrupted_call_kills_its_worker(worker, monkeypatch):
  w = fresh(worker)
  def interrupted(timeout=0.0): raise KeyboardInterrupt
  monkeypatch.setattr(w.conn, "poll", interrupted)
  with pytest.raises(KeyboardInterrupt): w.call(("hang", 60), 30)
  monkeypatch.undo()
  assert not w.alive


def test_a_setup_that_raises_says_why_the_worker_did_not_start():
  w = Worker(failing_setup)
  got = w.wait_ready()
  assert (got.kind, got.etype, got.message) == (TYPED, "KcError", "the device does not open here") and not w.alive


def test_attempt_classifies_in_process_and_lets_an_interrupt_through():
  assert attempt(int, "7").value == 7
  assert attempt(int, "seven").kind == UNTYPED
  def refuse(): raise KcError("no")
  assert attempt(refuse).kind == TYPED
  def interrupt(): raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt): attempt(interrupt)


def test_exit_description():
  assert [exit_description(c) for c in (None, 0, 2, -11, -9)] == ["no exit status", "exit status 0", "exit status 2",
                                                                  "SIGSEGV", "SIGKILL"]


@pytest.mark.parametrize("ending", ["killed", "stopped"])
def test_a_workers_temporary_files_go_with_it(ending):
  """A worker's temporary files (Python's tempfile: kc-clang's batch folders) are in a folder of its own, which the
  parent removes once the worker ended, killed mid-job (a hung compile) or stopped: a killed worker cannot clean up
  after itself."""
  import os
  w = Worker(echo_handler, ("",))
  assert w.wait_ready() is None
  got = w.call(("tempfile", "x"), 30)
  assert got.kind == OK and os.path.commonpath([got.value, w.tmp]) == w.tmp and os.path.exists(os.path.join(got.value, "left"))
  if ending == "killed": assert w.call(("hang", 60), 0.5).kind == HANG
  else: w.stop()
  assert not w.alive and not os.path.exists(w.tmp)
