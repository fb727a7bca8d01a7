"""BEAM's compiles on Dask (kc.search.dask_executor): outcomes, errors and timeouts as values, a typed error without
dask or without a scheduler, kc without the extra never importing dask, and the same search result as the local pool."""
import copy, hashlib, pickle, subprocess, sys, threading
import pytest
import kc
from kc import ast as A
from kc.kernel import Kernel
from kc.ir.dtype import dtypes
from kc.search import CompileOutcome, beam_search
from kc.search import dask_executor
from kc.search.dask_executor import ClusterError, DaskCompileExecutor

distributed = pytest.importorskip("distributed", reason="the Dask executor needs kc[dask]")

RELEASE = threading.Event()  # lets a "hanging" compile return once the test has seen it time out


class EchoCompiler:
  """Compiles "ok ..." to its bytes, raises a CompileError on "bad ...", and waits on "hang ..." until RELEASE."""

  def compile(self, src: str) -> bytes:
    if src.startswith("bad"): raise kc.CompileError(f"cannot compile {src!r}", src=src)
    if src.startswith("hang"): RELEASE.wait(30)
    return src.encode()


class UnpicklableCompiler(EchoCompiler):
  def __reduce__(self): raise TypeError("holds a live context")


@pytest.fixture(scope="module")
def local():
  with DaskCompileExecutor("local", threads=2) as ex: yield ex


def _by_index(outcomes) -> dict[int, CompileOutcome]:
  out = {o.index: o for o in outcomes}
  return out


def test_every_source_gives_one_outcome_and_errors_are_outcomes(local):
  srcs = ["ok a", "bad b", "ok c", "ok a"]
  got = _by_index(local.compile_many(EchoCompiler(), srcs, timeout=30))
  assert sorted(got) == [0, 1, 2, 3]
  assert got[0].lib == b"ok a" and got[2].lib == b"ok c" and got[3].lib == b"ok a" and got[0].error is None
  assert got[1].lib is None and "CompileError" in got[1].error and "cannot compile" in got[1].error
  assert all(o.seconds >= 0 for o in got.values())
  assert list(local.compile_many(EchoCompiler(), [], timeout=1)) == []


def test_a_hanging_compile_times_out_and_costs_only_itself(local):
  RELEASE.clear()
  try:
    # the limit is what the hanging compile costs; the others must finish within it on a busy machine too
    got = _by_index(local.compile_many(EchoCompiler(), ["ok 1", "hang 2", "ok 3"], timeout=5.0))
  finally:
    RELEASE.set()
  assert got[0].lib == b"ok 1" and got[2].lib == b"ok 3"
  assert got[1].lib is None and "timed out" in got[1].error


def test_an_unpicklable_compiler_compiles_here(local):
  with pytest.raises(TypeError): pickle.dumps(UnpicklableCompiler())
  got = _by_index(local.compile_many(UnpicklableCompiler(), ["ok x", "bad y"], timeout=30))
  assert got[0].lib == b"ok x" and got[1].lib is None and "cannot compile" in got[1].error


def test_real_sources_compile_on_the_cluster(local, cache_dir):
  dev = kc.Device["CLANG"]
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (64,)) + 1.0))
  src = Kernel(sink, dev.renderer).hand_coded_optimizations().to_program().src
  (o,) = local.compile_many(dev.compiler, [src], timeout=60)
  assert o.ok and o.lib == dev.compiler.compile(src)


def test_without_dask_the_error_names_the_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` now raises ImportError
  ex = DaskCompileExecutor("local")
  with pytest.raises(ClusterError, match=r"pip install 'kc\[dask\]'"):
    list(ex.compile_many(EchoCompiler(), ["ok"], timeout=1))


def test_an_unreachable_scheduler_is_a_typed_error(monkeypatch):
  monkeypatch.setattr(dask_executor, "CONNECT_TIMEOUT_S", 1.0)
  with pytest.raises(ClusterError, match="cannot reach the Dask scheduler"):
    DaskCompileExecutor("tcp://127.0.0.1:9").client
  with pytest.raises(ClusterError): DaskCompileExecutor("  ")


def test_kc_never_imports_dask_unless_a_cluster_is_used(tmp_path):
  code = ("import sys, kc, kc.search, kc.search.dask_executor, kc.tools.cli\n"
          "from kc import ast as A\n"
          "kc.compile(A.sink(A.store(0, A.arg(1, kc.dtypes.float32, (8,)) * 2.0)), 'EMU')\n"
          "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"KC_CACHE_DIR": str(tmp_path),
                       "PATH": "/usr/bin:/bin"}, timeout=120)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == "[]"


class ToyTimedDevice:
  """A real device (its kernels run, so the search's correctness check is real) whose timings are a fixed function of
  each binary: a search on it is deterministic, so two executors must choose exactly the same opts."""

  def __init__(self, base, slowest: bytes = b""):
    self.base, self.name, self.renderer, self.allocator = base, base.name, base.renderer, base.allocator
    # one source a compiler run on both paths: a batch member's library (the local pool batches CLANG's sources) is
    # another binary of the same kernel, which these timings, a function of the bytes, would time differently
    self.compiler = copy.copy(base.compiler)
    self.compiler.max_batch = 1
    self.slowest = slowest  # a binary that takes longer than every other one (the kernel without opts)

  def runtime(self, name, lib):
    handle = self.base.runtime(name, lib)
    seconds = 3e-5 if lib == self.slowest else 1e-5 * (1 + int(hashlib.sha256(lib).hexdigest()[:8], 16) / 2**32)

    def run(*bufs, **kw):
      handle(*bufs, **kw)
      return seconds
    return run


def test_the_dask_path_chooses_the_same_opts_as_the_local_pool(local, cache_dir):
  x, y = A.arg(1, dtypes.float32, (16, 16)), A.arg(2, dtypes.float32, (16, 16))
  sink = A.sink(A.store(0, x @ y))
  clang = kc.Device["CLANG"]
  dev = ToyTimedDevice(clang, slowest=clang.compiler.compile(Kernel(sink, clang.renderer).to_program().src))
  on_pool = beam_search(Kernel(sink, dev.renderer), dev, 2, max_rounds=2, seed=3)
  on_dask = beam_search(Kernel(sink, dev.renderer), dev, 2, max_rounds=2, seed=3, executor=local)
  assert on_dask.opts == on_pool.opts and on_pool.opts  # the toy times make some opts faster than none
  assert on_dask.compiled == on_pool.compiled and on_dask.seconds == on_pool.seconds
