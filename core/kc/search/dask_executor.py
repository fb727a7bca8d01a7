"""BEAM's candidate compiles on a Dask distributed cluster, for when one machine's cores are not enough.

DaskCompileExecutor is an executor for kc.search.beam_search: compile_many sends every source to the cluster's workers
(client.map of compile_timed) and yields each outcome as it completes (as_completed); timing stays with the caller,
on the local device. The workers need kc and the device's plugin installed (the compiler object travels to them
pickled), not the device itself: a compiler never opens it.

dask is an optional extra (`pip install 'kc[dask]'`): this module imports it only when an executor connects, so kc
without the extra never imports dask."""
from __future__ import annotations
import os, threading, time
from typing import Iterator, Optional, Sequence
from kc.errors import KcError
from kc.search.executor import CompileOutcome, compile_in_threads, compile_source, pickled

LOCAL = "local"  # the address that starts an in-process cluster instead of connecting to a scheduler
CONNECT_TIMEOUT_S = 30.0


class ClusterError(KcError):
  """The Dask cluster cannot be used: dask is not installed, or the scheduler cannot be reached."""


def compile_timed(compiler, src: str) -> tuple[Optional[bytes], Optional[str], float]:
  """Run on a worker: (binary, None, seconds) or (None, why, seconds). Every failure is a value (compile_source), so
  one broken candidate never fails the whole map."""
  t0 = time.perf_counter()
  lib, error = compile_source(compiler, src)
  return lib, error, time.perf_counter() - t0


def _distributed():
  try:
    import distributed
    return distributed
  except ImportError as e:
    raise ClusterError(f"a Dask cluster needs dask's distributed scheduler, which is not installed ({e}): "
                       "pip install 'kc[dask]'") from None


class DaskCompileExecutor:
  """Compiles on the Dask cluster at `address` (a scheduler address such as tcp://host:8786), or with `address="local"`
  on a cluster started in this process: one worker whose threads (default: this machine's cores) compile, no network
  and no extra processes. `local` is for trying the Dask path and for tests; it compiles no faster than the local
  process pool. The connection is made on first use and kept until close()."""

  def __init__(self, address: str, threads: Optional[int] = None):
    if not isinstance(address, str) or not address.strip():
      raise ClusterError(f"a Dask cluster address is a scheduler address (tcp://host:8786) or 'local', got {address!r}")
    self.address, self.threads = address.strip(), threads
    self._client = self._cluster = None
    self._lock = threading.Lock()

  def __repr__(self): return f"DaskCompileExecutor({self.address!r})"

  @property
  def client(self):
    """The distributed.Client, connected (or the local cluster started) on first use."""
    with self._lock:
      if self._client is None:
        distributed = _distributed()
        try:
          if self.address == LOCAL:
            # processes=False: the worker is a thread pool in this process; no dashboard, so no port is opened
            self._cluster = distributed.LocalCluster(n_workers=1, processes=False, threads_per_worker=self.threads,
                                                     dashboard_address=None)
            self._client = distributed.Client(self._cluster)
          else:
            self._client = distributed.Client(self.address, timeout=CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as e:
          self._close_locked()
          raise ClusterError(f"cannot reach the Dask scheduler at {self.address!r} ({type(e).__name__}: {e}); "
                             "give KC_BEAM_CLUSTER (or --cluster) a running scheduler's address, or 'local'") from None
      return self._client

  def slots(self) -> int:
    """How many compiles the cluster runs at once: its workers' threads together (at least 1)."""
    return max(1, sum(self.client.nthreads().values()))

  def compile_many(self, compiler, sources: Sequence[str], timeout: float) -> Iterator:
    """Compile every source on the cluster; yield a kc.search.CompileOutcome(index, lib, error, seconds) per source, in
    completion order. A compile gets `timeout` seconds of its own, counted as if the cluster's threads took the
    sources in order (source i must be done by start + timeout * (i // slots + 1)); one that is not is cancelled and
    yields an outcome with an error, so a hanging compile costs one candidate, not the search."""
    sources = list(sources)
    if not sources: return
    if pickled(compiler) is None:
      # a compiler that holds a live context (OpenCL's) cannot travel to a worker: it compiles in threads here
      yield from compile_in_threads(compiler, sources, timeout, os.cpu_count() or 1)
      return
    distributed = _distributed()
    client, slots = self.client, self.slots()
    start = time.monotonic()
    futures = client.map(compile_timed, [compiler] * len(sources), sources, pure=False)
    index = {f.key: i for i, f in enumerate(futures)}
    deadlines = [start + timeout * (i // slots + 1) for i in range(len(sources))]
    timed_out: set[int] = set()
    done = threading.Event()
    watchdog = threading.Thread(target=self._cancel_overdue, args=(futures, deadlines, timed_out, done), daemon=True,
                                name="kc-dask-timeouts")
    watchdog.start()
    try:
      for fut in distributed.as_completed(futures):
        i = index[fut.key]
        if fut.status == "finished":
          lib, error, seconds = fut.result()
          yield CompileOutcome(i, lib, error, seconds)
        elif i in timed_out or fut.status == "cancelled":
          yield CompileOutcome(i, None, f"compile timed out after {timeout:g} s on the Dask cluster", time.monotonic() - start)
        else:  # a worker that died, or a compiler the worker could not unpickle
          exc = fut.exception()
          yield CompileOutcome(i, None, f"the Dask cluster failed: {type(exc).__name__}: {exc}", time.monotonic() - start)
    finally:
      done.set()
      # an abandoned iteration (the search stopped early) must not leave compiles running on the cluster
      pending = [f for f in futures if not f.done()]
      if pending: client.cancel(pending)
      watchdog.join()

  @staticmethod
  def _cancel_overdue(futures, deadlines: list[float], timed_out: set[int], done: threading.Event):
    """Cancel each future still running at its deadline (a cancelled future completes in as_completed)."""
    for i in sorted(range(len(futures)), key=deadlines.__getitem__):
      if done.wait(max(0.0, deadlines[i] - time.monotonic())): return
      if not futures[i].done():
        timed_out.add(i)
        futures[i].cancel()

  def close(self):
    with self._lock: self._close_locked()

  def _close_locked(self):
    client, cluster, self._client, self._cluster = self._client, self._cluster, None, None
    if client is not None: client.close()
    if cluster is not None: cluster.close()

  def __enter__(self): return self

  def __exit__(self, *exc): self.close()


_shared: dict[str, DaskCompileExecutor] = {}
_shared_lock = threading.Lock()


def shared_executor(address: str) -> DaskCompileExecutor:
  """One executor per address for the whole process: a cluster is started (or connected to) once, not per kernel."""
  with _shared_lock:
    if (ex := _shared.get(address)) is None: ex = _shared[address] = DaskCompileExecutor(address)
  return ex


__all__ = ["ClusterError", "DaskCompileExecutor", "LOCAL", "compile_timed", "shared_executor"]
