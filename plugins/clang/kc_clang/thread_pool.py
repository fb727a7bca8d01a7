"""CLANG's kernel threads in C: the parts of a split kernel run on native threads that spin a while before they sleep.

A split kernel (renderer.py) runs once per part. kc.backend.run_parts wakes Python threads blocked on a lock: a
futex each way, and on a virtual machine a sleeping thread's idle CPU must be woken by the hypervisor first. Measured
on a 2-vCPU AVX-512 EPYC VM, a part on a woken thread started 330-370 us late, so a 1M-float kernel of 720 us on one
thread took 728 us on two. Here one C call runs every part: part 0 on the calling thread, the others on threads that,
after their part, poll for the next call for KC_CLANG_SPIN_US (1 ms by default) before blocking, as OpenMP runtimes
do (libgomp spins for some milliseconds, Intel's for 200); back-to-back kernels (a model's layers) then start their
parts at once, and smaller kernels are worth splitting (SPLIT_MIN_OPS). The call holds no GIL while it runs.

The renderer gives every split kernel an entry point of one signature, `kc_entry_<name>(void **buffers, const int
*values, int part, int parts)`, which the threads call. The pool is a small C library compiled once by the CLANG
compiler (kc's compile cache keeps it); a forked child starts its own threads. One call runs at a time (a lock)."""
from __future__ import annotations
import os, threading
from typing import Optional, Sequence
from kc.backend import KcError, SharedLibrary
from kc_clang.host import SPIN_US

# a kernel of at least this many operations (kc.backend.estimate_ops) is split, where threads that poll start their
# parts in a few microseconds (kc.backend.PARALLEL_MIN_OPS, 8x more, is for threads woken from sleep). Measured on a
# 2-core AVX-512 EPYC, kernels run back to back, one thread against two: a 256x1024 softmax (0.3M) 143 against 77 us,
# a 256K-float add 25 against 18 us, a GELU of 256K floats 96 against 52 us; a 64x1024 layer norm (0.2M) stays whole
SPLIT_MIN_OPS = 1 << 18

POOL_SOURCE = r"""
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
typedef void (*kc_entry)(void **, const int *, int, int);
/* thread i runs part i+1 of a call: the call stores a new number in its `call` (after the job), and the thread runs
   the job of that call once; a thread a call has no part for is not told, so it never runs another call's job */
struct worker { int part; _Atomic long call; };
static struct worker **workers; static int started, room;
static pthread_mutex_t sleep_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static long calls;                /* calls made: each one's number is the next */
static _Atomic int remaining;     /* parts 1.. of this call not finished */
static kc_entry job; static void **job_buffers; static const int *job_values; static int job_parts;
static _Atomic long spin_ns;

static long now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000L + t.tv_nsec; }
static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
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
    job(job_buffers, job_values, me->part, job_parts);
    atomic_fetch_sub_explicit(&remaining, 1, memory_order_release);
  }
  return 0;
}

/* fn(buffers, values, p, parts) for every part p, on this thread (0) and the pool's: all finished on return.
   0, or the error of starting a thread. One call at a time (the caller's lock). */
int kc_pool_run(kc_entry fn, void **buffers, const int *values, int parts, long spin) {
  atomic_store(&spin_ns, spin * 1000L);
  for (; started < parts - 1; started++) {
    if (started == room) {
      struct worker **more = realloc(workers, sizeof *more * (room ? 2 * room : 16));
      if (!more) return ENOMEM;
      workers = more; room = room ? 2 * room : 16;
    }
    struct worker *w = malloc(sizeof *w);
    if (!w) return ENOMEM;
    w->part = started + 1; atomic_init(&w->call, 0);
    pthread_t t; pthread_attr_t a;
    pthread_attr_init(&a); pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int err = pthread_create(&t, &a, serve, w);
    pthread_attr_destroy(&a);
    if (err) { free(w); return err; }
    workers[started] = w;
  }
  job = fn; job_buffers = buffers; job_values = values; job_parts = parts;
  atomic_store(&remaining, parts - 1);
  calls++;
  for (int i = 0; i < parts - 1; i++) atomic_store_explicit(&workers[i]->call, calls, memory_order_release);
  pthread_mutex_lock(&sleep_lock); pthread_cond_broadcast(&wake); pthread_mutex_unlock(&sleep_lock);
  fn(buffers, values, 0, parts);
  while (atomic_load_explicit(&remaining, memory_order_acquire) > 0) relax();
  return 0;
}

/* in a forked child: none of the parent's threads exist (their records are left behind) */
void kc_pool_forget(void) {
  pthread_mutex_init(&sleep_lock, 0); pthread_cond_init(&wake, 0);
  workers = 0; started = room = 0; atomic_store(&remaining, 0);
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
    self._run = ffi.cast("int(*)(void*, void**, int*, int, long)", self._lib.address("kc_pool_run"))
    self._forget = ffi.cast("void(*)(void)", self._lib.address("kc_pool_forget"))
    self._lock = threading.Lock()
    self._pid = os.getpid()

  def run(self, entry, buffers: Sequence, values: Sequence[int], parts: int) -> None:
    """entry(buffers, values, part, parts) for every part, at once; returns when every part finished."""
    b = self._ffi.new("void*[]", list(buffers) or [self._ffi.NULL])
    v = self._ffi.new("int[]", list(values)) if values else self._ffi.NULL
    with self._lock:
      if self._pid != os.getpid(): self._forget(); self._pid = os.getpid()  # a forked child: its threads start anew
      err = self._run(entry, b, v, parts, max(0, SPIN_US.get()))
    if err: raise KcError(f"CLANG could not start a kernel thread ({os.strerror(err)}): set KC_CLANG_THREADS lower")


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
