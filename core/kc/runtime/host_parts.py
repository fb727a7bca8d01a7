"""Running a split kernel's parts at once: part 0 on the calling thread, the others on persistent kernel threads.

Host backends (CLANG, LLVM) split a big kernel's outermost output loop into parts, each a call of the same compiled
function with its part and the number of parts as its last two arguments; this is the one pool that runs them.

Each kernel thread waits on a lock of its own and is woken by releasing it; it signals the end of its part by
releasing another. That is the least a wake-up can cost in Python (a futex each way): a ThreadPoolExecutor's futures,
queue and conditions took twice as long per call (20 against 45 us for an empty part on 2 busy cores), which a small
kernel split across cores pays on every call. The caller's foreign-function binding must release the GIL while the
kernel runs (cffi's and ctypes' do), so the parts run at once.

Which loop a host kernel splits is decided here too (splits_loop), so that every host renderer splits the same
loops: the first index of part p of `parts` of [lo, hi) is lo + (n/parts)*p + (n%parts)*p/parts with n = hi - lo
(neither overflows nor leaves a gap), computed by the kernel itself, so a range with Variable bounds splits too.

One split call runs at a time in a process (calls from several Python threads take turns): each already uses every
kernel thread. A forked child has none of its parent's threads and starts its own.

Whether a split kernel's call runs its parts on threads at all is decided by its own calls (SplitChoice): the
renderer's estimate of a kernel's work counts operations, not time, and a kernel near the threshold can run faster
whole on the calling thread than split with the threads' start-up paid."""
from __future__ import annotations
import functools, os, threading, time
from typing import Any, Callable, Optional
from kc.errors import ConfigError
from kc.ir.uop import Ops, UOp
from kc.renderer import estimate_ops


class KernelThreads:
  """Threads that each run one part of a call: `run(fn, args, parts)` calls fn(*args, part, parts) for every part."""

  def __init__(self):
    self._jobs: list[Optional[tuple[Callable, tuple]]] = []
    self._errors: list[Optional[BaseException]] = []
    self._go: list[threading.Lock] = []
    self._done: list[threading.Lock] = []
    self._turn = threading.Lock()  # one call at a time: the threads' job slots are shared

  @property
  def size(self) -> int: return len(self._go)

  def _grow(self, n: int) -> None:
    while self.size < n:
      i = self.size
      go, done = threading.Lock(), threading.Lock()
      go.acquire()
      done.acquire()
      self._jobs.append(None)
      self._errors.append(None)
      self._go.append(go)
      self._done.append(done)
      threading.Thread(target=self._serve, args=(i,), name=f"kc-kernel-{i}", daemon=True).start()

  def _serve(self, i: int) -> None:
    go, done = self._go[i], self._done[i]
    while True:
      go.acquire()
      job = self._jobs[i]
      try:
        if job is not None: job[0](*job[1])
      except BaseException as e:  # noqa: BLE001  (handed to the caller, which raises it)
        self._errors[i] = e
      finally:
        self._jobs[i] = None
        done.release()

  def run(self, fn: Callable, args: tuple, parts: int) -> None:
    """fn(*args, part, parts) for every part: parts 1.. on the threads, part 0 on this one, all finished on return (the
    buffers must not be read or freed while a part still writes them); the first error of any part is raised."""
    if parts == 1: return fn(*args, 0, 1)
    with self._turn:
      self._grow(parts - 1)
      for p in range(1, parts):
        self._jobs[p - 1], self._errors[p - 1] = (fn, (*args, p, parts)), None
        self._go[p - 1].release()
      interrupted: Optional[BaseException] = None
      try: fn(*args, 0, parts)
      finally:
        for p in range(1, parts):
          while True:
            try:
              self._done[p - 1].acquire()
              break
            except KeyboardInterrupt as e: interrupted = e  # wait for the part all the same, then stop
      if interrupted is not None: raise interrupted
      if (error := next((e for e in self._errors[:parts - 1] if e is not None), None)) is not None: raise error


_THREADS: Optional[KernelThreads] = None
_THREADS_PID = 0
_THREADS_LOCK = threading.Lock()


def kernel_threads() -> KernelThreads:
  """This process's kernel threads (a forked child makes its own)."""
  global _THREADS, _THREADS_PID
  with _THREADS_LOCK:
    if _THREADS is None or _THREADS_PID != os.getpid(): _THREADS, _THREADS_PID = KernelThreads(), os.getpid()
    return _THREADS


def run_parts(fn: Callable, args: tuple, parts: int) -> None:
  """fn(*args, part, parts) for every part, at once (KernelThreads.run)."""
  if parts == 1: return fn(*args, 0, 1)
  return kernel_threads().run(fn, args, parts)


class SplitChoice:
  """Whether the next call of one split kernel runs its parts on threads (True) or its whole range on the calling
  thread (False, a call with part 0 of 1: no thread is woken), chosen by timing the kernel's own calls. The first
  WARM_UP calls run threaded and are not counted (they pay the first touch of the buffers, the threads' start, a
  cold cache); the next ones take turns in the order ORDER (whole, threaded, threaded, whole, ...: a time that drifts
  during the trial, as a core's clock or a warming cache does, weighs on both ways alike); then the way with the
  lower best time keeps every later call, until the thread count changes (a new count is tried anew). Both ways
  compute every output element with the same code, so the choice never changes a result, only the time.

  Measured on a 2-core AVX-512 EPYC (Zen 5), one thread against two: a 64x1024 layer norm 6.8 against 7.7 us, a
  64x64 matmul 2.4 against 5.3 us (both over the renderer's threshold), a 128x1024 layer norm 14.6 against 11.6 us."""

  WARM_UP = 3
  ORDER = (False, True, True, False, False, True, True, False)

  def __init__(self):
    self._threads = 0
    self._calls = 0
    self._best = [float("inf"), float("inf")]  # whole, threaded
    self.decided: Optional[bool] = None        # the choice once made

  def threaded(self, threads: int) -> bool:
    """Whether this call (on `threads` threads) runs threaded; report its time to record() after it."""
    if threads != self._threads: self._threads, self._calls, self._best, self.decided = threads, 0, [float("inf")] * 2, None
    if threads == 1: return False
    if self.decided is not None: return self.decided
    return True if self._calls < self.WARM_UP else self.ORDER[self._calls - self.WARM_UP]

  def record(self, threaded: bool, seconds: float) -> None:
    """The time of a call that threaded() chose for."""
    if self.decided is not None or self._threads == 1: return
    self._calls += 1
    if self._calls <= self.WARM_UP: return
    self._best[threaded] = min(self._best[threaded], seconds)
    if self._calls == self.WARM_UP + len(self.ORDER): self.decided = self._best[True] < self._best[False]

  def timed(self, threads: int, run: Callable[[bool], Any]) -> float:
    """One call of the kernel on `threads` threads: run(threaded) the way threaded() says, timed and recorded; its
    run time in seconds."""
    threaded = self.threaded(threads)
    start = time.perf_counter()
    run(threaded)
    seconds = time.perf_counter() - start
    self.record(threaded, seconds)
    return seconds


# ---------------------------------------------------------------------------------- which loop a host kernel splits

# below this many operations (estimate_ops: vector lanes counted, an exp as one) a kernel runs on one thread: waking
# the others costs more than it saves. Measured on a 2-core AVX-512 EPYC, one thread against two: a 64x1024 RMSNorm
# (0.2M ops) 7 against 23 us, a 64x1024 softmax (0.8M) 63 against 80 us, exp of 512K floats (1.6M) 175 against 175 us,
# a 256x1024 softmax (3.2M) 269 against 227 us; waking a sleeping kernel thread there costs 30-40 us
PARALLEL_MIN_OPS = 1 << 21


@functools.lru_cache(maxsize=None)
def cores() -> int:
  """os.cpu_count(), asked once: it reads a file of /sys each time, and a split kernel's every call asks."""
  return os.cpu_count() or 1


def max_threads() -> int:
  """The most threads a host backend's thread knob may ask for: 4 per core, and at least 256. Each part of a split
  kernel runs on an OS thread of its own: parts beyond the cores only add start-up and switching, and a count in the
  tens of thousands would start that many threads (or fail to). The floor leaves room to test more parts than a loop
  has iterations on a machine with few cores."""
  return max(256, 4 * cores())


def thread_count(asked: Optional[int], knob: str) -> int:
  """The threads a split kernel runs on: `asked` (the value of the backend's knob `knob`), else every core."""
  n, most = cores() if asked is None else asked, max_threads()
  if not 1 <= n <= most:
    raise ConfigError(f"{knob}={n} is not a thread count a host backend runs: give an int from 1 to {most} (4 per "
                      f"core, at least 256: each part is an OS thread, and this machine has {cores()} cores), or unset "
                      "it for every core")
  return n


def splits_loop(rng: UOp, uops: list[UOp], outermost: bool, threads: int, min_ops: int = PARALLEL_MIN_OPS) -> bool:
  """Whether a host renderer splits the loop `rng` of the linear `uops` into parts: the outermost loop over output
  elements (its iterations write disjoint outputs), when it encloses all the kernel's work (so parts need no barrier
  between them) and that work is large enough to pay for starting the parts (`min_ops`: a backend whose threads
  start sooner than KernelThreads' splits smaller kernels)."""
  if not outermost or rng.arg[1] != 0 or threads == 1 or not _encloses_all_work(rng, uops): return False
  work = estimate_ops(uops)
  return not (isinstance(work, int) and work < min_ops)


def _encloses_all_work(rng: UOp, uops: list[UOp]) -> bool:
  """Whether every other loop and every store of the kernel lies inside `rng`'s loop."""
  start = uops.index(rng)
  end = next((i for i, u in enumerate(uops) if u.op is Ops.ENDRANGE and u.src[0] is rng), len(uops))
  return all(start <= i <= end for i, u in enumerate(uops) if u.op in (Ops.RANGE, Ops.STORE))
