"""CLANG's kernel threads in C: a split kernel's loop runs in chunks on native threads that poll a while before they
sleep, and that any thread takes.

A split kernel (renderer.py) runs its loop's range in parts: a call with (part, parts) runs part `part` of `parts`.
kc.backend.run_parts wakes Python threads blocked on a lock: a futex each way, and on a virtual machine the sleeping
thread's idle CPU must be woken by the hypervisor first. Measured on a 2-vCPU AVX-512 EPYC VM, a part on a woken
thread started 330-370 us late, so a 1M-float kernel of 720 us on one thread took 728 us on two. Here one C call runs
the kernel: its range is cut into CHUNKS_PER_THREAD chunks per thread, which the calling thread and the pool's take
one at a time until none is left, so a thread that starts late (or another library's polling thread keeps off its
CPU) leaves its chunks to the others. After a call the pool's threads poll for the next one for KC_CLANG_SPIN_US (1
ms by default; libgomp polls for some milliseconds, Intel's OpenMP for 200) before they sleep, giving way to any
other thread at each step: back-to-back kernels (a model's layers) start their chunks at once, and smaller kernels
are worth splitting (SPLIT_MIN_OPS). The call holds no GIL while it runs.

Where another library has loaded an OpenMP runtime into the process (torch's libgomp), its threads run the chunks
instead (KC_CLANG_OPENMP, on by default): they poll for some milliseconds after each of that library's parallel ops,
holding the cores, and this pool's threads, woken beside them, got a core only in the scheduler's slices (a torch
model with kc regions between eager ops ran kc's kernels at one thread's speed: a Linear+GELU MLP 2.6 ms against
1.2 alone; 1.5 on the runtime's threads). The call is the runtime's GOMP_parallel, which GCC's libgomp, LLVM's libomp
and Intel's libiomp5 all export. Not in a forked child (host.forked_child): the runtime's threads stayed in the parent.

The renderer gives every split kernel an entry point of one signature, `kc_entry_<name>(void **buffers, const int
*values, int part, int parts)`, which the threads call. The pool is a small C library compiled once by the CLANG
compiler (kc's compile cache keeps it); a forked child starts its own threads. One call runs at a time (a lock)."""
from __future__ import annotations
import ctypes, math, os, threading, time
from typing import Optional, Sequence
from kc.backend import KcError, SharedLibrary
from kc_clang.host import OPENMP, SPIN_US, forked_child

# a kernel of at least this many operations (kc.backend.estimate_ops) is split, where threads that poll start their
# parts in a few microseconds (kc.backend.PARALLEL_MIN_OPS, 8x more, is for threads woken from sleep). Measured on a
# 2-core AVX-512 EPYC, kernels run back to back, one thread against two: a 256x1024 softmax (0.3M) 143 against 77 us,
# a 256K-float add 25 against 18 us, a GELU of 256K floats 96 against 52 us; a 64x1024 layer norm (0.2M) stays whole
SPLIT_MIN_OPS = 1 << 18
# a split kernel's loop is cut into this many chunks per thread, taken one at a time: a thread that another process or
# library keeps off its CPU leaves its chunks to the others (torch's OpenMP threads poll for milliseconds after each
# op, and a part that waited for one held whole calls up by 4 ms)
CHUNKS_PER_THREAD = 4

POOL_SOURCE = r"""
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
typedef void (*kc_entry)(void **, const int *, int, int);
/* A call cuts the kernel's loop into `chunks` chunks, which the caller and the threads take one at a time from the
   call's ticket (the call's number in the high half, the next chunk in the low half): a thread that runs late, or
   not at all (another library's thread holds its CPU), leaves its chunks to the others instead of holding the call
   up, and a thread still holding an earlier call's job can take no chunk of a later call. */
struct worker { _Atomic long call; };
static struct worker **workers; static int started, room;
static pthread_mutex_t sleep_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static long calls;                  /* calls made: each one's number is the next */
static _Atomic unsigned long ticket;
static _Atomic int finished;        /* chunks of this call done */
static kc_entry job; static void **job_buffers; static const int *job_values; static int job_chunks;
static _Atomic long spin_ns;

static long now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000L + t.tv_nsec; }
/* a step of waiting that keeps this CPU from idling (waking an idle one costs far more) but gives way at once to any
   other thread that has work for it: another library's threads (torch's, BLAS's) must not wait on a poll */
static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  for (int i = 0; i < 8; i++) __builtin_ia32_pause();
#endif
  sched_yield();
}

/* run chunks of call `call` until none is left; the job was read after the call's number was seen */
static void take_chunks(unsigned long call, kc_entry fn, void **buffers, const int *values, int chunks) {
  unsigned long t = atomic_load_explicit(&ticket, memory_order_acquire);
  while ((t >> 32) == call && (int)(t & 0xffffffffUL) < chunks) {
    if (!atomic_compare_exchange_weak_explicit(&ticket, &t, t + 1, memory_order_acq_rel, memory_order_acquire)) continue;
    fn(buffers, values, (int)(t & 0xffffffffUL), chunks);
    atomic_fetch_add_explicit(&finished, 1, memory_order_release);
    t = atomic_load_explicit(&ticket, memory_order_acquire);
  }
}

static void *serve(void *arg) {
  struct worker *me = arg;
  long seen = 0;
  for (;;) {
    long c, since = now_ns();
    while ((c = atomic_load_explicit(&me->call, memory_order_acquire)) == seen) {
      if (now_ns() - since < atomic_load_explicit(&spin_ns, memory_order_relaxed)) { relax(); continue; }
      pthread_mutex_lock(&sleep_lock);
      while ((c = atomic_load_explicit(&me->call, memory_order_acquire)) == seen) pthread_cond_wait(&wake, &sleep_lock);
      pthread_mutex_unlock(&sleep_lock);
      break;
    }
    seen = c;
    take_chunks((unsigned long)c, job, job_buffers, job_values, job_chunks);
  }
  return 0;
}

/* fn(buffers, values, c, chunks) for every chunk c, on this thread and `threads - 1` of the pool's: all finished on
   return. 0, or the error of starting a thread. One call at a time (the caller's lock). */
int kc_pool_run(kc_entry fn, void **buffers, const int *values, int threads, int chunks, long spin) {
  atomic_store(&spin_ns, spin * 1000L);
  for (; started < threads - 1; started++) {
    if (started == room) {
      struct worker **more = realloc(workers, sizeof *more * (room ? 2 * room : 16));
      if (!more) return ENOMEM;
      workers = more; room = room ? 2 * room : 16;
    }
    struct worker *w = malloc(sizeof *w);
    if (!w) return ENOMEM;
    atomic_init(&w->call, 0);
    pthread_t t; pthread_attr_t a;
    pthread_attr_init(&a); pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int err = pthread_create(&t, &a, serve, w);
    pthread_attr_destroy(&a);
    if (err) { free(w); return err; }
    workers[started] = w;
  }
  calls++;
  job = fn; job_buffers = buffers; job_values = values; job_chunks = chunks;
  atomic_store_explicit(&finished, 0, memory_order_relaxed);
  atomic_store_explicit(&ticket, (unsigned long)calls << 32, memory_order_release);
  for (int i = 0; i < threads - 1; i++) atomic_store_explicit(&workers[i]->call, calls, memory_order_release);
  pthread_mutex_lock(&sleep_lock); pthread_cond_broadcast(&wake); pthread_mutex_unlock(&sleep_lock);
  take_chunks((unsigned long)calls, fn, buffers, values, chunks);
  while (atomic_load_explicit(&finished, memory_order_acquire) < chunks) relax();
  return 0;
}

/* The same chunks on the threads of an OpenMP runtime another library loaded into this process (torch's libgomp):
   `parallel` is its GOMP_parallel, whose team (the caller its first member) takes chunks from this call's counter
   until none is left; all finished on return (the team's barrier). Its threads poll after each of that library's
   parallel ops, so they start these chunks at once where this pool's would wait for the cores they hold. */
typedef void (*kc_gomp_parallel)(void (*)(void *), void *, unsigned, unsigned);
struct openmp_call { kc_entry fn; void **buffers; const int *values; int chunks; _Atomic int next; };
static void openmp_member(void *arg) {
  struct openmp_call *c = arg;
  for (int k; (k = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed)) < c->chunks;) c->fn(c->buffers, c->values, k, c->chunks);
}
void kc_pool_run_openmp(kc_gomp_parallel parallel, kc_entry fn, void **buffers, const int *values, int threads, int chunks) {
  struct openmp_call c = {fn, buffers, values, chunks};
  atomic_init(&c.next, 0);
  parallel(openmp_member, &c, (unsigned)threads, 0);
}

/* in a forked child: none of the parent's threads exist (their records are left behind) */
void kc_pool_forget(void) {
  pthread_mutex_init(&sleep_lock, 0); pthread_cond_init(&wake, 0);
  workers = 0; started = room = 0;
}
"""


def entry_symbol(name: str) -> str:
  """The entry point of split kernel `name` that the pool's threads call (renderer.py writes it)."""
  return f"kc_entry_{name}"


def entry_source(name: str, is_buffer: Sequence[bool]) -> str:
  """kc_entry_<name>: the kernel called with its parameters (each a buffer, else an int value, in `is_buffer`'s
  order) from an array of buffers and one of values, then its part and parts."""
  args, nb, nv = [], 0, 0
  for buffer in is_buffer:
    args.append(f"b[{nb}]" if buffer else f"v[{nv}]")
    nb, nv = nb + buffer, nv + (not buffer)
  call = f"{name}({', '.join(args + ['part', 'parts'])})"
  return f"void {entry_symbol(name)}(void **b, const int *v, int part, int parts) {{ (void)b; (void)v; {call}; }}"


class KernelPool:
  """The native threads of this process (pool()): run(entry, buffers, values, parts)."""

  def __init__(self, ffi, library: bytes):
    self._ffi = ffi
    self._lib = SharedLibrary(library, "kc_pool")
    self._run = ffi.cast("int(*)(void*, void**, int*, int, int, long)", self._lib.address("kc_pool_run"))
    self._forget = ffi.cast("void(*)(void)", self._lib.address("kc_pool_forget"))
    self._run_openmp = ffi.cast("void(*)(void*, void*, void**, int*, int, int)", self._lib.address("kc_pool_run_openmp"))
    self._lock = threading.Lock()
    self._pid = os.getpid()
    self._openmp, self._openmp_looked = None, -math.inf  # a loaded runtime's GOMP_parallel, and when it was looked for

  def run(self, entry, buffers: Sequence, values: Sequence[int], threads: int) -> None:
    """entry(buffers, values, chunk, chunks) for CHUNKS_PER_THREAD chunks per thread, on `threads` threads at once;
    returns when every chunk finished."""
    b = self._ffi.new("void*[]", list(buffers) or [self._ffi.NULL])
    v = self._ffi.new("int[]", list(values)) if values else self._ffi.NULL
    with self._lock:
      if self._pid != os.getpid(): self._forget(); self._pid = os.getpid()  # a forked child: its threads start anew
      if (parallel := self.openmp()) is not None:
        self._run_openmp(parallel, entry, b, v, threads, threads * CHUNKS_PER_THREAD)
        return
      err = self._run(entry, b, v, threads, threads * CHUNKS_PER_THREAD, max(0, SPIN_US.get()))
    if err: raise KcError(f"CLANG could not start a kernel thread ({os.strerror(err)}): set KC_CLANG_THREADS lower")

  def openmp(self):
    """GOMP_parallel of an OpenMP runtime this process has loaded (KC_CLANG_OPENMP), else None: looked for again at
    most once a second until one is found, since a library that brings one may be imported after the first call."""
    if not OPENMP.get() or forked_child(): return None
    if self._openmp is None and time.monotonic() - self._openmp_looked > 1.0:
      self._openmp_looked = time.monotonic()
      if (address := loaded_openmp()) is not None: self._openmp = self._ffi.cast("void*", address)
    return self._openmp


# the file names of OpenMP runtimes that export GOMP_parallel: GCC's libgomp (torch bundles one), LLVM's libomp and
# Intel's libiomp5 (both export GCC's entry points too)
_OPENMP_RUNTIMES = ("libgomp", "libomp", "libiomp5")


def loaded_openmp() -> Optional[int]:
  """The address of GOMP_parallel in an OpenMP runtime already loaded into this process (Linux: /proc/self/maps), else
  None. Nothing is loaded here: a runtime no library brought keeps no threads worth sharing."""
  try:
    with open("/proc/self/maps") as f: paths = dict.fromkeys(line.split()[-1] for line in f if line.rstrip().endswith(".so") or ".so." in line)
  except OSError: return None
  for path in paths:
    if not os.path.basename(path).startswith(_OPENMP_RUNTIMES): continue
    try: lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError: continue
    if (fn := getattr(lib, "GOMP_parallel", None)) is not None: return ctypes.cast(fn, ctypes.c_void_p).value
  return None


_POOL: Optional[KernelPool] = None
_POOL_LOCK = threading.Lock()


def pool(ffi) -> KernelPool:
  """This process's pool, built the first time a split kernel runs (a compile the first time on a machine)."""
  global _POOL
  with _POOL_LOCK:
    if _POOL is None:
      from kc_clang import __version__
      from kc_clang.compiler import ClangCompiler
      _POOL = KernelPool(ffi, ClangCompiler(f"kc-clang {__version__}").compile(POOL_SOURCE))
    return _POOL
