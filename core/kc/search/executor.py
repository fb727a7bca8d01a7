"""Compiling many candidate sources at once: LocalCompilePool, a pool of spawned worker processes, and the
CompileOutcome every executor yields (the Dask executor yields the same).

Workers are kc.testing.worker's isolated workers (spawned, never forked) that only ever call `compiler.compile(src)`
on a compiler unpickled from the parent, so a worker never opens a device. Each job carries the caller's configuration
(kc.config.snapshot()) and compiles under it: a worker spawned before the caller changed KC_CACHE_DIR, or one that
cannot see the caller's kc.config.override, still reads and fills the cache the caller would. Each source has its own time limit,
counted from when a worker starts it: a compile that hangs costs that one candidate, and its worker is killed and
replaced. A compile error is an outcome, never an exception of compile_many.

A compiler that cannot be pickled (OpenCL's holds its context) is compiled in the parent by a thread pool instead,
with the same outcomes; a thread cannot be killed, so a hung compile there is reported as timed out and left to
finish on its own.

Ctrl-C is the parent's to handle: workers ignore SIGINT (kc.testing.worker), and a parent interrupted while it
compiles kills the workers that were busy; LocalCompilePool.terminate() kills the rest (beam_search calls it when it
is interrupted). The wait loops wake at least every kc.search.interrupt.POLL_S seconds to raise a Ctrl-C that a
finalizer swallowed (under beam_search's watch), so no search waits out its compiles after one."""
from __future__ import annotations
import contextvars, os, pickle, queue, threading, time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_connections
from typing import Any, Callable, Iterator, Optional, Sequence
from kc.config import applied, snapshot
from kc.errors import ConfigError, KcError
from kc.search.interrupt import POLL_S, raise_if_interrupted
from kc.testing.worker import CRASH, HANG, Outcome, Worker, attempt


@dataclass(frozen=True)
class CompileOutcome:
  """One source's compile: `lib` (the binary) or `error` (why not: the compiler's message, a timeout, a worker that
  died), and the seconds it took. `index` is the source's position in the sequence given to compile_many."""
  index: int
  lib: Optional[bytes]
  error: Optional[str]
  seconds: float

  @property
  def ok(self) -> bool: return self.lib is not None


def compile_source(compiler: Any, src: str) -> tuple[Optional[bytes], Optional[str]]:
  """(binary, None) or (None, why): a compile error is a value here, whatever the compiler raised."""
  got = attempt(compiler.compile, src)  # any failure costs only this candidate
  return (got.value, None) if got.ok else (None, f"{got.etype}: {got.message}")


def compile_outcome(index: int, got: Outcome, timeout: float) -> CompileOutcome:
  """The CompileOutcome of source `index` from what became of its compile job."""
  if got.ok: return CompileOutcome(index, got.value, None, got.seconds)
  if got.kind == HANG: why = f"the compile took longer than {timeout:g} seconds"
  elif got.kind == CRASH: why = f"the compile worker died ({got.etype})"
  else: why = f"{got.etype}: {got.message}"
  return CompileOutcome(index, None, why, got.seconds)


def _compile_handler() -> Callable[[tuple[bytes, dict, Any], Any], Any]:
  """A compile worker's setup: its jobs are (pickled compiler, the caller's kc.config.snapshot(), source), or the same
  with a tuple of sources for a batch, which compile_many builds in one compiler run and answers with a (binary, None)
  or (None, why) per source; the last compiler unpickled is kept."""
  last: list = [b"", None]

  def compile_job(job: tuple[bytes, dict, Any], note) -> Any:
    blob, config, src = job
    if blob != last[0]:
      try: last[:] = [blob, pickle.loads(blob)]  # first: the compiler's plugin declares its knobs as it is imported
      except Exception as e:  # noqa: BLE001  (a compiler that does not unpickle here fails its sources, not the worker)
        raise KcError(f"the compiler does not load in a worker: {type(e).__name__}: {e}") from None
    with applied(config):
      if isinstance(src, str): return last[1].compile(src)
      return [(out, None) if isinstance(out, bytes) else (None, f"{type(out).__name__}: {out}") for out in last[1].compile_many(list(src))]
  return compile_job


def batch_size(compiler: Any, sources: int, workers: int) -> int:
  """How many sources one worker job builds: 1, or for a compiler that builds batches in one compiler run
  (compile_batch_uncached: CLANG, CUDA, a generated plugin) an equal share of the sources for each worker, at most
  its max_batch."""
  if not (callable(batches := getattr(compiler, "builds_batches", None)) and batches()): return 1
  return max(1, min(int(getattr(compiler, "max_batch", 1)), -(-sources // max(1, workers))))


def _compile_worker() -> Worker: return Worker(_compile_handler, name="kc-compile")


class LocalCompilePool:
  """Compiles sources in `workers` spawned processes (default: os.cpu_count()), started on first use and kept
  between calls. compile_many is for one caller at a time (the searches of one process take turns)."""

  def __init__(self, workers: Optional[int] = None):
    if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
      raise ConfigError(f"LocalCompilePool(workers=...) is a number of processes >= 1, got {workers!r}")
    self.workers = workers or os.cpu_count() or 1
    self._pool: list[Worker] = []
    self._lock = threading.Lock()

  def __enter__(self) -> "LocalCompilePool": return self
  def __exit__(self, *exc) -> None: self.close()

  def close(self) -> None:
    """Stop every worker process (a later compile_many starts new ones)."""
    for w in self._pool: w.stop()
    self._pool = []

  def terminate(self) -> None:
    """Kill every worker process now, busy or not, and wait for each to end (after a Ctrl-C: nothing they compile
    is wanted). A later compile_many starts new ones."""
    pool, self._pool = self._pool, []
    for w in pool: w.kill()

  def compile_many(self, compiler: Any, sources: Sequence[str], timeout: float) -> Iterator[CompileOutcome]:
    """One CompileOutcome per source, in completion order; a source that takes longer than `timeout` seconds is a
    failed outcome."""
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
      raise ConfigError(f"a compile timeout is a number of seconds > 0, got {timeout!r}")
    if not sources: return
    if (blob := pickled(compiler)) is None:
      yield from compile_in_threads(compiler, sources, timeout, self.workers)
      return
    with self._lock: yield from self._compile_in_processes(blob, sources, float(timeout), batch_size(compiler, len(sources), self.workers))

  def _compile_in_processes(self, blob: bytes, sources: Sequence[str], timeout: float, batch: int = 1) -> Iterator[CompileOutcome]:
    # jobs are tuples of source indices: batches of `batch` (one compiler run each, with `timeout` per source), and
    # single sources again for a batch whose worker hung or died, so that a bad source costs only itself
    todo = deque(tuple(range(i, min(i + batch, len(sources)))) for i in range(0, len(sources), batch))
    config = snapshot()
    left = len(sources)
    busy: dict[Worker, tuple[int, ...]] = {}  # a worker -> the indices of the sources it compiles
    startup_deaths = 0  # workers that died before they could take a source: the interpreter cannot start kc
    while len(self._pool) < min(self.workers, len(todo)): self._pool.append(_compile_worker())
    try:
      while left:
        for w in self._pool:  # give every idle, started worker a job
          if w.ready and w not in busy and todo:
            busy[w] = job = todo.popleft()
            w.send((blob, config, sources[job[0]] if len(job) == 1 else tuple(sources[i] for i in job)))
        now = time.perf_counter()
        deadlines = [w.since + timeout * len(job) - now for w, job in busy.items()]
        # woken at least every POLL_S, for a Ctrl-C that a finalizer swallowed (kc.search.interrupt)
        ready = wait_connections([w.conn for w in self._pool], timeout=max(0.0, min([POLL_S, *deadlines])))
        raise_if_interrupted()
        for i, w in enumerate(self._pool):
          if w.conn in ready: got = w.receive()
          elif w in busy and time.perf_counter() - w.since >= timeout * len(busy[w]): got = w.hung(timeout * len(busy[w]))
          else: continue
          if not isinstance(got, Outcome): continue  # READY
          job = busy.pop(w, ())
          if len(job) > 1:
            if got.ok:
              left -= len(job)
              for index, (lib, why) in zip(job, got.value): yield CompileOutcome(index, lib, why, got.seconds / len(job))
            else: todo.extendleft((index,) for index in reversed(job))  # each source again on its own
          elif job:
            left -= 1
            yield compile_outcome(job[0], got, timeout)
          elif not w.ready and (startup_deaths := startup_deaths + 1) > 2 * self.workers:
            raise ConfigError(f"compile workers die as they start ({got.message}): "
                          "run the program as a script with an `if __name__ == '__main__':` guard")
          if got.kind in (CRASH, HANG) or not w.ready:  # dead, stuck, or its setup failed: a fresh worker takes its place
            w.kill()
            self._pool[i] = _compile_worker()
    except KeyboardInterrupt:
      self.terminate()
      raise
    finally:
      # a caller that stops early (or is interrupted) leaves workers with a source in flight: their late answers would
      # be taken for the next call's, so they are killed; the next call starts the workers it needs
      for w in busy: w.kill()
      self._pool = [w for w in self._pool if w not in busy]


def pickled(compiler: Any) -> Optional[bytes]:
  """The compiler pickled for another process, or None where it cannot travel (OpenCL's holds a live context)."""
  try: return pickle.dumps(compiler)
  except Exception:  # noqa: BLE001  (what an unpicklable object raises varies: TypeError, PicklingError, AttributeError)
    return None


def compile_in_threads(compiler: Any, sources: Sequence[str], timeout: float, workers: int) -> Iterator[CompileOutcome]:
  """The thread path for a compiler that cannot be pickled: the same outcomes, compiled in this process by at most
  `workers` threads at a time, each in a copy of the caller's context (its kc.config overrides). A thread past its time
  limit stops counting against `workers` (another starts in its place) and is left to finish: a daemon thread, so it
  never holds up the interpreter's exit."""
  results: queue.SimpleQueue = queue.SimpleQueue()

  def run(index: int) -> None: results.put((index, attempt(compiler.compile, sources[index])))

  todo = deque(range(len(sources)))
  running: dict[int, float] = {}  # index -> when its thread started
  while todo or running:
    while todo and len(running) < workers:
      index = todo.popleft()
      running[index] = time.perf_counter()
      context = contextvars.copy_context()  # one per thread: a context is entered by one thread at a time
      threading.Thread(target=context.run, args=(run, index), daemon=True, name="kc-compile").start()
    wait_for = max(0.0, min(min(running.values()) + timeout - time.perf_counter(), POLL_S))
    try: index, got = results.get(timeout=wait_for)
    except queue.Empty: raise_if_interrupted()
    else:
      if running.pop(index, None) is not None: yield compile_outcome(index, got, timeout)  # else: reported as timed out
    now = time.perf_counter()
    for index, start in list(running.items()):
      if now - start >= timeout:
        del running[index]
        yield compile_outcome(index, Outcome(HANG, seconds=now - start), timeout)


_SHARED: Optional[LocalCompilePool] = None
_SHARED_LOCK = threading.Lock()


def shared_pool() -> LocalCompilePool:
  """The process's LocalCompilePool, made on first use and kept for every later search."""
  global _SHARED
  with _SHARED_LOCK:
    if _SHARED is None: _SHARED = LocalCompilePool()
    return _SHARED
