"""Isolation: compile-tier and run-tier work happens in a worker process, so that a kernel that crashes (a segfault
in generated C) or hangs (a GPU kernel that never ends) takes down the worker, not the run.

One long-lived worker per run, started with `spawn` (no forked copy of a device runtime's threads). Jobs and results
go through a pipe as pickles: numpy arrays, UOps, Programs. When the worker dies, or a job runs past its timeout
(then it is killed), the caller gets a Crash and the next job starts a fresh worker."""
from __future__ import annotations
import multiprocessing, pickle, signal, traceback
from dataclasses import dataclass
from typing import Any, Optional
import kc


@dataclass
class Crash:
  """The job ended the worker: how (a signal, an exit code, or the timeout)."""
  reason: str


@dataclass
class Raised:
  """The job raised: the exception's type, its message and where (the last lines of the traceback)."""
  type: str
  message: str
  trace: str
  kc_error: bool


def _describe_exit(code: Optional[int]) -> str:
  if code is None: return "the worker did not exit"
  if code < 0:
    try: return f"the worker was killed by {signal.Signals(-code).name}"
    except ValueError: return f"the worker was killed by signal {-code}"
  return f"the worker exited with status {code}"


def _serve(conn, specs: list) -> None:
  """The worker's loop: register the in-process backends the run uses, then run jobs until the pipe closes."""
  from kc.runtime.plugins import register
  for spec in specs: register(spec, replace=True)
  from . import harness
  while True:
    try: job = conn.recv()
    except EOFError: return
    kind, args = job
    try:
      if kind == "compile": result: Any = harness.compile_source(*args)
      elif kind == "run": result = harness.launch(*args)
      else: raise kc.KcError(f"unknown job {kind!r}")
    except BaseException as e:  # everything the job raises is the job's result, not the worker's end
      result = Raised(type(e).__qualname__, str(e), "".join(traceback.format_exception(e)[-3:]), isinstance(e, kc.KcError))
    try: conn.send(result)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
      conn.send(Raised(type(e).__qualname__, f"the result does not pickle: {e}", "", False))


class Worker:
  """A worker process that runs jobs for one run. `specs` are BackendSpecs registered in this process (not through
  entry points) that the worker must register too: their callables must be importable module-level functions."""

  def __init__(self, specs: list, timeout: float):
    for spec in specs:
      try: pickle.dumps(spec)
      except Exception as e:
        raise kc.KcError(f"device {spec.name} was registered in-process with a BackendSpec that does not pickle ({e}): "
                         "the isolation worker cannot register it; use module-level functions in it") from None
    self.specs, self.timeout = specs, timeout
    self._proc = None
    self._conn = None
    self.started = 0

  def _start(self):
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    self._proc = ctx.Process(target=_serve, args=(child, self.specs), daemon=True, name="kc-conformance-worker")
    self._proc.start()
    child.close()
    self._conn = parent
    self.started += 1

  def call(self, kind: str, *args, timeout: Optional[float] = None) -> Any:
    """The job's result, a Raised, or a Crash."""
    if self._proc is None or not self._proc.is_alive(): self._start()
    limit = self.timeout if timeout is None else timeout
    try: self._conn.send((kind, args))
    except (BrokenPipeError, EOFError, OSError):
      return self._crashed("the worker was gone before the job was sent")
    if not self._conn.poll(limit):
      self.stop()
      return Crash(f"timeout: the job ran longer than {limit:g} s and was killed")
    try: return self._conn.recv()
    except (EOFError, ConnectionResetError, OSError):
      return self._crashed(None)

  def _crashed(self, why: Optional[str]) -> Crash:
    proc = self._proc
    proc.join(5)
    reason = why or _describe_exit(proc.exitcode)
    self._proc, self._conn = None, None
    return Crash(f"crash: {reason}")

  def stop(self):
    if self._proc is not None:
      if self._proc.is_alive():
        self._proc.kill()
      self._proc.join(5)
    if self._conn is not None: self._conn.close()
    self._proc, self._conn = None, None


def in_process_call(kind: str, *args) -> Any:
  """The same jobs without a worker (for debugging a backend, and for kc's own fast tests): a crash ends the run."""
  from . import harness
  try: return harness.compile_source(*args) if kind == "compile" else harness.launch(*args)
  except Exception as e:
    return Raised(type(e).__qualname__, str(e), "".join(traceback.format_exception(e)[-3:]), isinstance(e, kc.KcError))


__all__ = ["Crash", "Raised", "Worker", "in_process_call"]
