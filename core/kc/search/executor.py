"""Compiling many candidate sources at once: LocalCompilePool, a pool of spawned worker processes, and the
CompileOutcome every executor yields (the Dask executor yields the same).

Workers are spawned (never forked: a fork would copy the parent's open device, its threads and locks) and only ever
call `compiler.compile(src)` on a compiler unpickled from the parent, so a worker never opens a device. Each source
has its own time limit, counted from when a worker starts it: a compile that hangs costs that one candidate, and its
worker is killed and replaced. A compile error is an outcome, never an exception of compile_many.

A compiler that cannot be pickled (OpenCL's holds its context) is compiled in the parent by a thread pool instead,
with the same outcomes; a thread cannot be killed, so a hung compile there is reported as timed out and left to
finish on its own.

Ctrl-C is the parent's to handle: workers ignore SIGINT (a terminal sends it to the whole process group) from the
moment they start, and a parent interrupted while it compiles kills the workers that were busy; LocalCompilePool.
terminate() kills the rest (beam_search calls it when it is interrupted)."""
from __future__ import annotations
import multiprocessing, os, pickle, queue, signal, sys, threading, time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait as wait_connections
from typing import Any, Iterator, Optional, Sequence
from kc.errors import ConfigError, KcError


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
  try: return compiler.compile(src), None
  except Exception as e: return None, f"{type(e).__name__}: {e}"  # noqa: BLE001  (any failure costs only this candidate)


def _ignore_interrupt(signum, frame) -> None:
  """A worker's SIGINT handler: Ctrl-C is for the parent, which stops its workers itself. A handler rather than
  SIG_IGN, so that a compiler the worker runs (cc) gets the default action back and stops with the terminal's Ctrl-C."""


def _start_without_interrupts(process) -> None:
  """Start `process` with SIGINT blocked in this thread, so that the child starts with it blocked (a Ctrl-C during
  its start-up waits until _worker_main ignores it, instead of printing a traceback from the child's imports). A
  Ctrl-C that arrives meanwhile is delivered to the parent when the mask is restored."""
  if not hasattr(signal, "pthread_sigmask"):  # Windows: no signal masks (and no process group to share a Ctrl-C)
    process.start()
    return
  old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
  try: process.start()
  finally: signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _worker_main(conn: Connection, path: list[str]) -> None:
  """A worker's loop: receive (index, pickled compiler, source), send back (index, lib, error, seconds); None ends it,
  and so does a parent that went away."""
  signal.signal(signal.SIGINT, _ignore_interrupt)
  if hasattr(signal, "pthread_sigmask"): signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
  sys.path[:] = path  # the parent's imports (a compiler's module may live on a path only the parent was given)
  try: _serve(conn)
  except (EOFError, OSError): pass  # the parent exited or closed this worker's pipe: nobody waits for results


def _serve(conn: Connection) -> None:
  conn.send("ready")
  last: tuple[bytes, Any] = (b"", None)
  while (task := conn.recv()) is not None:
    index, blob, src = task
    start = time.perf_counter()
    try:
      if blob != last[0]: last = (blob, pickle.loads(blob))
      lib, error = compile_source(last[1], src)
    except Exception as e:  # noqa: BLE001  (a compiler that does not unpickle here fails its sources, not the worker)
      lib, error = None, f"the compiler does not load in a worker: {type(e).__name__}: {e}"
    conn.send((index, lib, error, time.perf_counter() - start))


class _Worker:
  """One spawned worker process and the parent's end of its pipe; `task` is what it is compiling and since when."""

  def __init__(self, ctx):
    self.conn, child = ctx.Pipe()
    self.process = ctx.Process(target=_worker_main, args=(child, list(sys.path)), daemon=True, name="kc-compile")
    try: _start_without_interrupts(self.process)
    except BaseException:  # a Ctrl-C delivered as the mask was restored: this worker is nobody's, so it goes now
      if self.process.pid is not None: self.process.kill()
      self.conn.close()
      raise
    finally: child.close()
    self.ready = False
    self.task: Optional[tuple[int, float]] = None

  def kill(self) -> None:
    self.process.kill()
    self.process.join(5)
    self.conn.close()

  def stop(self) -> None:
    try: self.conn.send(None)
    except (OSError, EOFError): pass
    self.process.join(1)
    if self.process.is_alive(): self.kill()
    else: self.conn.close()


class LocalCompilePool:
  """Compiles sources in `workers` spawned processes (default: os.cpu_count()), started on first use and kept
  between calls. compile_many is for one caller at a time (the searches of one process take turns)."""

  def __init__(self, workers: Optional[int] = None):
    if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
      raise ConfigError(f"LocalCompilePool(workers=...) is a number of processes >= 1, got {workers!r}")
    self.workers = workers or os.cpu_count() or 1
    self._ctx = multiprocessing.get_context("spawn")
    self._pool: list[_Worker] = []
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
    with self._lock: yield from self._compile_in_processes(blob, sources, float(timeout))

  def _compile_in_processes(self, blob: bytes, sources: Sequence[str], timeout: float) -> Iterator[CompileOutcome]:
    todo = deque(range(len(sources)))
    left = len(sources)
    startup_deaths = 0  # workers that died before they could take a source: the interpreter cannot start kc
    while len(self._pool) < min(self.workers, len(sources)): self._pool.append(_Worker(self._ctx))
    try:
      while left:
        for w in self._pool:  # give every idle, started worker a source
          if w.ready and w.task is None and todo:
            index = todo.popleft()
            w.conn.send((index, blob, sources[index]))
            w.task = (index, time.perf_counter())
        now = time.perf_counter()
        deadlines = [w.task[1] + timeout - now for w in self._pool if w.task is not None]
        ready = wait_connections([w.conn for w in self._pool], timeout=max(0.0, min(deadlines)) if deadlines else None)
        for i, w in enumerate(self._pool):
          outcome: Optional[CompileOutcome] = None
          if w.conn in ready:
            try: msg = w.conn.recv()
            except (EOFError, OSError):  # the worker died (a compiler that crashed the interpreter)
              msg = None
            if msg == "ready": w.ready = True
            elif msg is not None:
              outcome = CompileOutcome(*msg)
              w.task = None
            else:
              if w.task is not None:
                outcome = CompileOutcome(w.task[0], None, f"the compile worker died (exit code {w.process.exitcode})", time.perf_counter() - w.task[1])
              elif not w.ready and (startup_deaths := startup_deaths + 1) > 2 * self.workers:
                raise KcError(f"compile workers die as they start (exit code {w.process.exitcode}): "
                              "run the program as a script with an `if __name__ == '__main__':` guard")
              self._replace(i)
          elif w.task is not None and time.perf_counter() - w.task[1] >= timeout:
            outcome = CompileOutcome(w.task[0], None, f"the compile took longer than {timeout:g} seconds", time.perf_counter() - w.task[1])
            self._replace(i)  # the stuck worker is killed; a fresh one takes its place
          if outcome is not None:
            left -= 1
            yield outcome
    except KeyboardInterrupt:
      self.terminate()
      raise
    finally:
      # a caller that stops early (or is interrupted) leaves workers with a source in flight: their late answers would
      # be taken for the next call's, so they are killed; the next call starts the workers it needs
      for w in self._pool:
        if w.task is not None: w.kill()
      self._pool = [w for w in self._pool if w.task is None]

  def _replace(self, i: int) -> None:
    self._pool[i].kill()
    self._pool[i] = _Worker(self._ctx)


def pickled(compiler: Any) -> Optional[bytes]:
  """The compiler pickled for another process, or None where it cannot travel (OpenCL's holds a live context)."""
  try: return pickle.dumps(compiler)
  except Exception:  # noqa: BLE001  (what an unpicklable object raises varies: TypeError, PicklingError, AttributeError)
    return None


def compile_in_threads(compiler: Any, sources: Sequence[str], timeout: float, workers: int) -> Iterator[CompileOutcome]:
  """The thread path for a compiler that cannot be pickled: the same outcomes, compiled in this process by at most
  `workers` threads at a time. A thread past its time limit stops counting against `workers` (another starts in its
  place) and is left to finish: a daemon thread, so it never holds up the interpreter's exit."""
  results: queue.SimpleQueue = queue.SimpleQueue()

  def run(index: int) -> None:
    start = time.perf_counter()
    lib, error = compile_source(compiler, sources[index])
    results.put((index, lib, error, time.perf_counter() - start))

  todo = deque(range(len(sources)))
  running: dict[int, float] = {}  # index -> when its thread started
  while todo or running:
    while todo and len(running) < workers:
      index = todo.popleft()
      running[index] = time.perf_counter()
      threading.Thread(target=run, args=(index,), daemon=True, name="kc-compile").start()
    wait_for = max(0.0, min(running.values()) + timeout - time.perf_counter())
    try: index, lib, error, seconds = results.get(timeout=wait_for)
    except queue.Empty: pass
    else:
      if running.pop(index, None) is not None: yield CompileOutcome(index, lib, error, seconds)  # else: reported as timed out
    now = time.perf_counter()
    for index, start in list(running.items()):
      if now - start >= timeout:
        del running[index]
        yield CompileOutcome(index, None, f"the compile took longer than {timeout:g} seconds", now - start)


_SHARED: Optional[LocalCompilePool] = None
_SHARED_LOCK = threading.Lock()


def shared_pool() -> LocalCompilePool:
  """The process's LocalCompilePool, made on first use and kept for every later search."""
  global _SHARED
  with _SHARED_LOCK:
    if _SHARED is None: _SHARED = LocalCompilePool()
    return _SHARED
