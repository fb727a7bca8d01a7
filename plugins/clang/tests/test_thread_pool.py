"""CLANG's native kernel threads (kc_clang.thread_pool): every chunk of a call runs once with the call's buffers and
values, calls follow each other and come from several Python threads, a forked child starts threads of its own, a
thread kept off its CPU holds no call up, and split kernels (through their kc_entry_<name>) compute what numpy
computes at every thread count and spin time."""
import os, threading
import numpy as np
import pytest
import kc
from kc import ast as A, dtypes
from kc_clang.compiler import ClangCompiler
from kc_clang.runtime import _FFI
from kc_clang.thread_pool import CHUNKS_PER_THREAD, SPLIT_MIN_OPS, entry_source, entry_symbol, pool
from kc.backend import SharedLibrary

# an entry point that records each chunk: counts[chunk] += 1, seen[chunk] = chunks * 1000 + the call's value, and the
# thread that ran it; with a second value, chunk 0 of a call busy-waits that many milliseconds first
MARK = """
#include <pthread.h>
#include <time.h>
void kc_entry_mark(void **b, const int *v, int part, int parts) {
  int *counts = (int *)b[0], *seen = (int *)b[1];
  unsigned long *thread = (unsigned long *)b[2];
  if (part == 0 && v[1] > 0) {
    struct timespec t0, t; clock_gettime(CLOCK_MONOTONIC, &t0);
    do clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < v[1] * 1000000L);
  }
  counts[part] += 1; seen[part] = parts * 1000 + v[0]; thread[part] = (unsigned long)pthread_self();
}
"""


@pytest.fixture(autouse=True)
def own_threads(monkeypatch):
  # these tests are of CLANG's own threads; a test process may have an OpenMP runtime loaded (torch's), whose threads
  # would run the chunks instead (the tests of that path say so)
  monkeypatch.setenv("KC_CLANG_OPENMP", "0")


@pytest.fixture(scope="module")
def mark():
  lib = SharedLibrary(ClangCompiler().compile(MARK), "mark")
  yield lib, _FFI.cast("void*", lib.address("kc_entry_mark"))


def run_mark(entry, threads: int, value: int, busy_ms: int = 0, ran_on=None):
  chunks = threads * CHUNKS_PER_THREAD
  counts, seen = np.zeros(chunks, np.int32), np.zeros(chunks, np.int32)
  ran_on = np.zeros(chunks, np.uint64) if ran_on is None else ran_on
  pool(_FFI).run(entry, [_FFI.from_buffer(counts), _FFI.from_buffer(seen), _FFI.from_buffer(ran_on)], [value, busy_ms], threads)
  return counts, seen


def once_each(counts, seen, threads: int, value: int) -> bool:
  chunks = threads * CHUNKS_PER_THREAD
  return counts.tolist() == [1] * chunks and seen.tolist() == [chunks * 1000 + value] * chunks


@pytest.mark.parametrize("threads", [1, 2, 3, 9])
def test_every_chunk_runs_once_with_the_calls_arguments(mark, threads):
  for call in range(20):  # calls back to back: threads that poll, and threads made by an earlier call
    assert once_each(*run_mark(mark[1], threads, call), threads, call)


def test_threads_that_slept_wake_for_the_next_call(mark, monkeypatch):
  monkeypatch.setenv("KC_CLANG_SPIN_US", "0")  # every thread sleeps at once after its chunks
  for call in range(10):
    assert once_each(*run_mark(mark[1], 4, call), 4, call)


def test_a_slow_chunk_leaves_the_others_to_the_other_threads(mark):
  # chunk 0 takes 100 ms: the thread that took it takes no other chunk, the other thread runs them all meanwhile
  # (fixed parts, one per thread, would have given that thread 4 chunks), and the call ends with every chunk done
  ran_on = np.zeros(2 * CHUNKS_PER_THREAD, np.uint64)
  assert once_each(*run_mark(mark[1], 2, 5, busy_ms=100, ran_on=ran_on), 2, 5)
  assert ran_on[0] not in set(ran_on[1:].tolist()) and len(set(ran_on[1:].tolist())) == 1


def test_calls_from_several_python_threads_take_turns(mark):
  errors = []
  def worker(k):
    for call in range(30):
      if not once_each(*run_mark(mark[1], 2 + k % 3, k * 100 + call), 2 + k % 3, k * 100 + call): errors.append((k, call))
  ts = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
  for t in ts: t.start()
  for t in ts: t.join()
  assert not errors


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_runs_parts_on_threads_of_its_own(mark):
  run_mark(mark[1], 3, 1)  # the parent's threads exist before the fork
  pid = os.fork()
  if pid == 0:  # the child: none of the parent's threads came with it
    try: os._exit(0 if once_each(*run_mark(mark[1], 3, 7), 3, 7) else 1)
    except BaseException:
      os._exit(2)
  _, status = os.waitpid(pid, 0)
  assert os.waitstatus_to_exitcode(status) == 0


def test_the_entry_point_passes_buffers_and_values_in_parameter_order():
  src = entry_source("k", [True, False, True, False])
  assert entry_symbol("k") == "kc_entry_k" and "k(b[0], v[0], b[1], v[1], part, parts)" in src


@pytest.mark.parametrize("threads", ["2", "3", "5"])
@pytest.mark.parametrize("spin", ["0", "1000"])
def test_split_kernels_mean_what_numpy_means(monkeypatch, threads, spin):
  monkeypatch.setenv("KC_CLANG_THREADS", threads)
  monkeypatch.setenv("KC_CLANG_SPIN_US", spin)
  x = A.arg(1, dtypes.float32, (300, 1024))
  e = (x - x.max(-1, keepdims=True)).exp()
  ck = kc.compile(A.sink(A.store(0, e / e.sum(-1, keepdims=True))), "CLANG")
  assert any("kc_entry_" in p.src for p in ck.programs)  # some kernel of it is split
  xs = np.random.default_rng(int(threads)).standard_normal((300, 1024)).astype(np.float32)
  out = np.empty_like(xs)
  for _ in range(3): ck(out, xs)
  want = np.exp(xs - xs.max(-1, keepdims=True))
  np.testing.assert_allclose(out, want / want.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_a_split_kernel_runs_whole_on_the_caller_where_its_own_calls_say_so(monkeypatch):
  # kc.backend.SplitChoice: the trial's calls run both ways, each giving numpy's result; once decided, a kernel
  # that runs whole never wakes the threads, and one that runs threaded does on every call
  from kc.backend import SplitChoice
  from kc_clang import runtime
  monkeypatch.setenv("KC_CLANG_THREADS", "2")
  x = A.arg(1, dtypes.float32, (512, 1024))
  ck = kc.compile(A.sink(A.store(0, x.exp() * 2.0)), "CLANG")
  choice = ck._handle._choice
  assert "kc_entry_" in ck.program.src and choice is not None
  xs = np.random.default_rng(6).standard_normal((512, 1024)).astype(np.float32)
  out = np.empty_like(xs)
  for _ in range(SplitChoice.WARM_UP + len(SplitChoice.ORDER)):
    out[:] = 0
    ck(out, xs)
    np.testing.assert_allclose(out, np.exp(xs) * 2, rtol=1e-6)
  assert choice.decided is not None
  woken = []
  real_pool = runtime.pool
  monkeypatch.setattr(runtime, "pool", lambda ffi: woken.append(1) or real_pool(ffi))
  for decided in (False, True):
    choice.decided = decided
    out[:] = 0
    ck(out, xs)
    np.testing.assert_allclose(out, np.exp(xs) * 2, rtol=1e-6)
    assert len(woken) == int(decided)
  # by address (call_host: the kernel declared with uintptr_t buffers when whole, void* for the threads' entry)
  for decided in (False, True):
    choice.decided = decided
    out[:] = 0
    ck.call_host((out.ctypes.data, out.nbytes), (xs.ctypes.data, xs.nbytes))
    np.testing.assert_allclose(out, np.exp(xs) * 2, rtol=1e-6)
  assert len(woken) == 2


def test_a_split_kernel_with_a_variable_gets_its_value():
  n = kc.Variable("n", 1, 4096)
  x = A.arg(1, dtypes.float32, (n, 512))
  ck = kc.compile(A.sink(A.store(0, x.exp() * 2.0)), "CLANG")
  assert "kc_entry_" in ck.program.src
  xs = np.random.default_rng(3).standard_normal((3000, 512)).astype(np.float32)
  out = np.empty_like(xs)
  ck(out, xs, n=3000)
  np.testing.assert_allclose(out, np.exp(xs) * 2, rtol=1e-6)


def test_smaller_kernels_split_than_with_threads_woken_from_sleep():
  from kc.backend import PARALLEL_MIN_OPS  # the core's threshold, for backends whose threads sleep
  assert SPLIT_MIN_OPS < PARALLEL_MIN_OPS


def test_split_kernels_built_in_one_batch_keep_their_entry_points():
  # kc_clang.batch renames every global name of a member (the kernel, its split symbol, its entry point) and exports
  # each under its own name again: every member's threads call that member's kernel
  from kc_clang.runtime import ClangProgram
  from kc.kernel import Kernel
  dev = kc.Device["CLANG"]
  progs = []
  for scale in (2.0, 3.0, 5.0):
    x = A.arg(1, dtypes.float32, (512, 1024))
    k = Kernel(A.sink(A.store(0, x.exp() * scale)), dev.renderer)
    progs.append(k.to_program())
  assert all("kc_entry_" in p.src for p in progs)
  libs = dev.compiler.compile_many([p.src for p in progs])
  xs = np.random.default_rng(4).standard_normal((512, 1024)).astype(np.float32)
  for p, lib, scale in zip(progs, libs, (2.0, 3.0, 5.0)):
    out = np.empty_like(xs)
    ClangProgram(p.name, lib).launch_arrays([out, xs])
    np.testing.assert_allclose(out, np.exp(xs) * scale, rtol=1e-6)


def test_a_split_library_without_an_entry_point_is_refused():
  from kc.backend import KcError
  from kc_clang.renderer import split_symbol
  from kc_clang.runtime import ClangProgram
  src = f"const int {split_symbol('k')} = 1;\nvoid k(float* d, const int kc_part, const int kc_parts) {{ d[kc_part] = 1; }}\n"
  with pytest.raises(KcError, match="no entry point 'kc_entry_k'"): ClangProgram("k", ClangCompiler().compile(src))


# ***** on a loaded OpenMP runtime's threads *****

# GOMP_parallel as a runtime with one thread would run it: the region's function once, on the caller, which counts
FAKE_GOMP = """
static int calls; static unsigned asked;
void fake_gomp_parallel(void (*fn)(void *), void *data, unsigned threads, unsigned flags) { calls++; asked = threads; fn(data); }
int fake_calls(void) { return calls; }
unsigned fake_asked(void) { return asked; }
"""


def test_chunks_run_on_a_loaded_openmp_runtimes_team(mark, monkeypatch):
  from kc_clang import thread_pool
  fake = SharedLibrary(ClangCompiler().compile(FAKE_GOMP), "fake_gomp")
  calls, asked = _FFI.cast("int(*)(void)", fake.address("fake_calls")), _FFI.cast("unsigned(*)(void)", fake.address("fake_asked"))
  monkeypatch.setenv("KC_CLANG_OPENMP", "1")
  monkeypatch.setattr(thread_pool, "loaded_openmp", lambda: int(_FFI.cast("uintptr_t", fake.address("fake_gomp_parallel"))))
  own = thread_pool.KernelPool(_FFI, ClangCompiler().compile(thread_pool.POOL_SOURCE))
  for call in range(3):
    chunks = 3 * CHUNKS_PER_THREAD
    counts, seen, ran_on = np.zeros(chunks, np.int32), np.zeros(chunks, np.int32), np.zeros(chunks, np.uint64)
    own.run(mark[1], [_FFI.from_buffer(counts), _FFI.from_buffer(seen), _FFI.from_buffer(ran_on)], [call, 0], 3)
    # every chunk once, all on the team's one member (the caller), the team asked for the call's threads
    assert once_each(counts, seen, 3, call) and len(set(ran_on.tolist())) == 1
  assert calls() == 3 and asked() == 3
  monkeypatch.setenv("KC_CLANG_OPENMP", "0")  # the knob turns it off at once (this pool starts no threads of its own:
  assert own.openmp() is None                  # they would outlive its library)


LIBGOMP = """
import ctypes, ctypes.util, os, sys
import numpy as np
ctypes.CDLL(ctypes.util.find_library("gomp"))  # what torch's import does: an OpenMP runtime in the process
import kc
from kc import ast as A, dtypes
from kc_clang.thread_pool import loaded_openmp
x = A.arg(1, dtypes.float32, (1024, 1024))
ck = kc.compile(A.sink(A.store(0, x.exp() * 2.0)), "CLANG")
assert "kc_entry_" in ck.program.src and loaded_openmp() is not None
xs = np.random.default_rng(5).standard_normal((1024, 1024)).astype(np.float32)
out = np.empty_like(xs)
for _ in range(5): ck(out, xs)
np.testing.assert_allclose(out, np.exp(xs) * 2, rtol=1e-6)
sys.stdout.flush()
pid = os.fork()
if pid == 0:  # the runtime's threads stayed in the parent: the child's split kernel runs on CLANG's own
  out[:] = 0
  ck(out, xs)
  os._exit(0 if np.allclose(out, np.exp(xs) * 2, rtol=1e-6) else 1)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_split_kernels_on_libgomps_threads_and_in_a_forked_child(tmp_path):
  import ctypes.util, subprocess, sys
  if ctypes.util.find_library("gomp") is None: pytest.skip("no libgomp here")
  env = {**os.environ, "KC_CLANG_THREADS": "2", "KC_CLANG_OPENMP": "1", "KC_CACHE_DIR": str(tmp_path)}
  out = subprocess.run([sys.executable, "-c", LIBGOMP], env=env, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0 and out.stdout.strip().endswith("child 0"), out.stderr


def test_a_multiprocessing_worker_counts_as_a_forked_child():
  import multiprocessing
  from kc_clang.host import forked_child
  assert not forked_child()
  with multiprocessing.get_context("spawn").Pool(1) as p: assert p.apply(forked_child) is True
