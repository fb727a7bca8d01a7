"""Work in a process of its own, so that a job that segfaults or hangs costs that job, not the caller.

BEAM's compile pool (kc.search.executor), kc fuzz's per-device worker (kc.tools.fuzz.worker) and the conformance suite's
worker (kc_conformance.worker) all run jobs here, and all get one classification of what became of a job, an Outcome:

  ok       the job returned (`value`)
  typed    the job raised a kc.KcError (`etype`, `message`, `trace`)
  untyped  the job raised any other exception
  crash    the worker process died: `etype` is the signal (SIGSEGV) or the exit status; or the job lost the device
           (a kc.errors.DeviceLostError anywhere in what it raised: `etype` and `message` are that error's, unwrapped),
           after which the worker ends, since every later job on that device would fail the same way
  hang     no answer within the time limit: the worker was killed

Workers are spawned, never forked (a fork would copy the parent's open device, its threads and locks). A worker
calls `setup(*args)` once (a module-level function, so that it pickles) and runs every job with the handler it returns:
handler(job, note) -> value, where note(x) sends x to the parent while the job runs (kc fuzz sends the opts a kernel is
about to run with, so that a crash can still be replayed with them).

Ctrl-C is the parent's: workers ignore SIGINT from the moment they start (a terminal sends it to the whole process
group), and a parent interrupted while it waits for a job kills that worker (its late answer would be taken for the
next job's). Each worker writes its temporary files (Python's tempfile: kc-clang's batch folders) in a folder of its
own, which the parent removes once the worker ended: a worker killed mid-job cannot clean up after itself.
This module imports only the standard library and kc.errors: every layer may use it."""
from __future__ import annotations
import multiprocessing, pickle, shutil, signal, sys, tempfile, time, traceback, weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional
from kc.errors import DeviceLostError, KcError

OK, TYPED, UNTYPED, CRASH, HANG = "ok", "typed", "untyped", "crash", "hang"
READY, NOTE = "ready", "note"
START_TIMEOUT = 120.0  # opening a device may compile or load a runtime: a worker's start is not counted against a job


@dataclass(frozen=True)
class Outcome:
  """What became of one job (see the module's docstring for the kinds)."""
  kind: str
  value: Any = None
  etype: str = ""
  message: str = ""
  trace: str = ""
  seconds: float = 0.0

  @property
  def ok(self) -> bool: return self.kind == OK

  @property
  def raised(self) -> bool: return self.kind in (TYPED, UNTYPED)


def lost_device(e: Optional[BaseException]) -> Optional[DeviceLostError]:
  """The DeviceLostError in `e`'s chain of causes (the error itself, what it was raised from or during), if any."""
  seen: set[int] = set()
  while e is not None and id(e) not in seen:
    if isinstance(e, DeviceLostError): return e
    seen.add(id(e))
    e = e.__cause__ or e.__context__
  return None


def attempt(fn: Callable, *args, catch: type[BaseException] = Exception) -> Outcome:
  """fn(*args) as an Outcome: ok with its value, typed / untyped with what it raised, or a crash when what it raised
  holds a DeviceLostError (an exception that is not a `catch` propagates)."""
  start = time.perf_counter()
  try: value = fn(*args)
  except catch as e:
    if (lost := lost_device(e)) is not None: e, kind = lost, CRASH
    else: kind = TYPED if isinstance(e, KcError) else UNTYPED
    trace = "".join(traceback.format_exception(e)[-3:])
    return Outcome(kind, None, type(e).__qualname__, str(e), trace, time.perf_counter() - start)
  return Outcome(OK, value, seconds=time.perf_counter() - start)


def exit_description(code: Optional[int]) -> str:
  """How a process ended, from its exit code: SIGSEGV, signal 77, exit status 1."""
  if code is None: return "no exit status"
  if code < 0:
    try: return signal.Signals(-code).name
    except ValueError: return f"signal {-code}"
  return f"exit status {code}"


# ***** the worker's side *****

def _ignore_interrupt(signum, frame) -> None:
  """A worker's SIGINT handler: Ctrl-C is for the parent, which stops its workers itself. A handler rather than
  SIG_IGN, so that a program the worker runs (cc) gets the default action back and stops with the terminal's Ctrl-C."""


def _worker_main(conn, setup: Callable, args: tuple, path: list[str], tmp: Optional[str] = None) -> None:
  signal.signal(signal.SIGINT, _ignore_interrupt)
  if tmp is not None: tempfile.tempdir = tmp  # the worker's temporary files go where the parent removes them after it
  if hasattr(signal, "pthread_sigmask"): signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
  sys.path[:] = path  # the parent's imports (a job's module may live on a path only the parent was given)
  try: _serve(conn, setup, args)
  except (EOFError, OSError): pass  # the parent exited or closed this worker's pipe: nobody waits for results


def _serve(conn, setup: Callable, args: tuple) -> None:
  """Say READY (or send the Outcome of a setup that raised, and end), then answer jobs until None or a closed pipe."""
  started = attempt(setup, *args, catch=BaseException)
  if not started.ok: return conn.send(started)
  conn.send(READY)
  handler = started.value
  def note(x: Any) -> None: conn.send((NOTE, x))
  while (job := conn.recv()) is not None:
    _send(conn, outcome := attempt(handler, job, note, catch=BaseException))  # whatever the job raises is its outcome
    if outcome.kind == CRASH: return  # the device is lost: the parent starts a fresh worker for the next job


def _send(conn, outcome: Outcome) -> None:
  try: conn.send(outcome)  # pickled whole before a byte is written: a failure leaves the pipe clean
  except (pickle.PicklingError, TypeError, AttributeError) as e:
    conn.send(Outcome(UNTYPED, None, type(e).__qualname__, f"the result does not pickle: {e}", "", outcome.seconds))


# ***** the parent's side *****

def _start_without_interrupts(process) -> None:
  """Start `process` with SIGINT blocked in this thread, so that the child starts with it blocked (a Ctrl-C during
  its start-up waits until _worker_main ignores it, instead of printing a traceback from the child's imports). A
  Ctrl-C that arrives meanwhile is delivered to the parent when the mask is restored."""
  if not hasattr(signal, "pthread_sigmask"):  # Windows: no signal masks (and no process group to share a Ctrl-C)
    return process.start()
  old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
  try: process.start()
  finally: signal.pthread_sigmask(signal.SIG_SETMASK, old)


class Worker:
  """The parent's handle on one spawned worker process: its pipe (`conn`, for waiting on several workers at once),
  whether it has said READY, and `since`, when the job in flight was sent (None when idle)."""

  def __init__(self, setup: Callable, args: tuple = (), name: str = "kc-worker"):
    ctx = multiprocessing.get_context("spawn")
    self.conn, child = ctx.Pipe()
    # a folder of the worker's own for its temporary files, removed once it ended: a worker killed mid-job (a hung
    # compile) never cleans up what it was writing (kc-clang's batch folders were left behind by every killed one)
    self.tmp = tempfile.mkdtemp(prefix="kc-worker-")
    self._remove_tmp = weakref.finalize(self, shutil.rmtree, self.tmp, True)
    self.process = ctx.Process(target=_worker_main, args=(child, setup, tuple(args), list(sys.path), self.tmp), daemon=True, name=name)
    try: _start_without_interrupts(self.process)
    except BaseException:  # a Ctrl-C delivered as the mask was restored: this worker is nobody's, so it goes now
      if self.process.pid is not None: self.process.kill()
      self.conn.close()
      self._remove_tmp()
      raise
    finally: child.close()
    self.ready = False
    self.since: Optional[float] = None

  @property
  def alive(self) -> bool: return self.process.is_alive()

  def wait_ready(self, timeout: float = START_TIMEOUT) -> Optional[Outcome]:
    """None once the worker is READY; else why not: its setup's Outcome, a crash, or a hang (the worker is killed)."""
    started = time.perf_counter()
    try: msg = self.conn.recv() if self.conn.poll(timeout) else None
    except (EOFError, OSError): return self.died()
    if msg == READY:
      self.ready = True
      return None
    self.kill()
    if isinstance(msg, Outcome): return msg
    return Outcome(HANG, None, "timeout", f"the worker did not start within {timeout:g} s", "", time.perf_counter() - started)

  def send(self, job: Any) -> None:
    self.conn.send(job)
    self.since = time.perf_counter()

  def receive(self) -> Any:
    """The worker's next message: READY, (NOTE, x), or the job's Outcome (the worker is idle again); the crash
    Outcome where it died."""
    try: msg = self.conn.recv()
    except (EOFError, OSError): return self.died()
    if msg == READY: self.ready = True
    elif isinstance(msg, Outcome):
      self.since = None
      if msg.kind == CRASH: self.process.join(5)  # it lost its device and is ending: `alive` turns False
    return msg

  def call(self, job: Any, timeout: float, on_note: Optional[Callable[[Any], None]] = None) -> Outcome:
    """Run one job: its Outcome, or a crash, or a hang once `timeout` seconds have passed (the worker is killed)."""
    try:
      try: self.send(job)
      except (EOFError, OSError): return self.died()
      deadline = self.since + timeout
      while self.conn.poll(max(0.0, deadline - time.perf_counter())):
        msg = self.receive()
        if isinstance(msg, Outcome): return msg
        if on_note is not None and isinstance(msg, tuple) and msg[0] == NOTE: on_note(msg[1])
      return self.hung(timeout)
    except BaseException:  # interrupted while the job runs: its answer is nobody's now
      self.kill()
      raise

  def _elapsed(self) -> float: return 0.0 if self.since is None else time.perf_counter() - self.since

  def died(self) -> Outcome:
    """The crash Outcome of a worker whose pipe closed: how it ended."""
    seconds = self._elapsed()
    self.process.join(5)
    how = exit_description(self.process.exitcode)
    self.kill()
    return Outcome(CRASH, None, how, f"the worker process died ({how})", "", seconds)

  def hung(self, timeout: float) -> Outcome:
    """The hang Outcome of a job past its `timeout`: the worker is killed."""
    seconds = self._elapsed()
    self.kill()
    return Outcome(HANG, None, "timeout", f"no answer within {timeout:g} s; the worker was killed", "", seconds)

  def kill(self) -> None:
    """End the worker now, busy or not, and wait for it; its temporary folder goes with it."""
    self.process.kill()
    self.process.join(5)
    self.conn.close()
    self.since = None
    if not self.process.is_alive(): self._remove_tmp()

  def stop(self) -> None:
    """Ask an idle worker to end, and kill it if it does not within a second."""
    try: self.conn.send(None)
    except (OSError, EOFError, ValueError): pass  # ValueError: a pipe this side closed already
    self.process.join(1)
    if self.process.is_alive(): self.kill()
    else:
      self.conn.close()
      self._remove_tmp()
