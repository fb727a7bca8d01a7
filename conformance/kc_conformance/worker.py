"""Isolation: compile-tier and run-tier work happens in a worker process, so that a kernel that crashes (a segfault
in generated C) or hangs (a GPU kernel that never ends) takes down the worker, not the run.

One long-lived kc.testing.worker process per run (spawned: no forked copy of a device runtime's threads). Jobs and
results go through its pipe as pickles: numpy arrays, UOps, Programs. Every call gives an Outcome: the job's result,
what it raised (typed or untyped), or a crash or hang; after a crash or hang the next job starts a fresh worker."""
from __future__ import annotations
import pickle
from typing import Any, Callable, Optional
import kc
from kc.testing.worker import CRASH, HANG, Outcome, Worker as IsolatedWorker, attempt


def _register(specs: list) -> Callable:
  """The worker's setup: register the in-process backends the run uses; its jobs run through run_job."""
  from kc.runtime.plugins import register
  for spec in specs: register(spec, replace=True)
  return run_job


def run_job(job: tuple, note=None) -> Any:
  """A ("compile", args), ("compile_many", args) or ("run", args) job of the conformance harness."""
  from . import harness
  kind, args = job
  if kind == "compile": return harness.compile_source(*args)
  if kind == "compile_many": return harness.compile_sources(*args)
  if kind == "run": return harness.launch(*args)
  raise kc.KcError(f"unknown job {kind!r}: compile or run")


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
    self._worker: Optional[IsolatedWorker] = None
    self.started = 0

  def call(self, kind: str, *args, timeout: Optional[float] = None) -> Outcome:
    """What became of the job (its result is the Outcome's value)."""
    if self._worker is None or not self._worker.alive:
      self.stop()
      self._worker = IsolatedWorker(_register, (self.specs,), name="kc-conformance-worker")
      self.started += 1
      if (failed := self._worker.wait_ready()) is not None:
        self._worker = None
        return failed
    got = self._worker.call((kind, args), self.timeout if timeout is None else timeout)
    if got.kind in (CRASH, HANG): self._worker = None  # killed or dead: the next job starts a fresh one
    return got

  def stop(self):
    if self._worker is not None: self._worker.stop()
    self._worker = None


def in_process_call(kind: str, *args) -> Outcome:
  """The same jobs without a worker (for debugging a backend, and for kc's own fast tests): a crash ends the run."""
  return attempt(run_job, (kind, args))


__all__ = ["Worker", "in_process_call", "run_job"]
