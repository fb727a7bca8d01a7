"""kc.search's LocalCompilePool: sources compiled in spawned workers, compile errors and hung compiles as outcomes
that cost one source each, and the thread path for a compiler that cannot be pickled."""
import pytest
import kc
from kc import ConfigError
from kc.search import CompileOutcome, LocalCompilePool
from kc.runtime.cache import lookup
from search_fakes import (BatchingCompiler, ConfigReportingCompiler, FakeCompiler, UnpicklableCompiler,
                          UnpicklableConfigReportingCompiler)


@pytest.fixture
def pool():
  with LocalCompilePool(workers=2) as p: yield p


def by_index(outcomes) -> dict[int, CompileOutcome]:
  outcomes = list(outcomes)
  assert sorted(o.index for o in outcomes) == list(range(len(outcomes)))  # one outcome per source
  return {o.index: o for o in outcomes}


def test_clang_sources_compile_in_workers(pool, cache_dir):
  if kc.Device.unavailable_reason("CLANG") is not None: pytest.skip("no CLANG here")
  from kc import ast as A, dtypes
  from kc.kernel import Kernel
  r = kc.Device.renderer("CLANG")
  srcs = [Kernel(A.sink(A.store(0, A.arg(1, dtypes.float32, (n,)) * 2.0)), r).to_program().src for n in (8, 16, 32)]
  got = by_index(pool.compile_many(kc.Device.compiler("CLANG"), srcs + ["this is not C"], timeout=60))
  for i in range(3):
    assert got[i].ok and got[i].error is None and got[i].lib[:4] == b"\x7fELF"  # a shared object
  assert not got[3].ok and got[3].lib is None and "CompileError" in got[3].error  # an outcome, not an exception


def test_a_compile_error_is_an_outcome(pool):
  got = by_index(pool.compile_many(FakeCompiler(), ["a", "ERROR b", "c"], timeout=30))
  assert got[0].lib == b"LIB:a" and got[2].lib == b"LIB:c"
  assert got[1].lib is None and "source says ERROR" in got[1].error


def test_a_hung_compile_costs_one_source_and_its_worker_is_replaced(pool):
  srcs = ["one", "HANG", "two", "three", "four"]
  got = by_index(pool.compile_many(FakeCompiler(hang=120), srcs, timeout=1.5))
  assert got[1].lib is None and "longer than 1.5 seconds" in got[1].error
  assert [got[i].lib for i in (0, 2, 3, 4)] == [b"LIB:one", b"LIB:two", b"LIB:three", b"LIB:four"]
  # the stuck worker was killed and replaced: the pool still has two live workers and compiles again
  assert len(pool._pool) == 2 and all(w.process.is_alive() for w in pool._pool)
  assert by_index(pool.compile_many(FakeCompiler(), ["again"], timeout=30))[0].lib == b"LIB:again"


def test_outcomes_arrive_in_completion_order(pool):
  # the hung source is first in the sequence and last to be reported
  outcomes = list(pool.compile_many(FakeCompiler(hang=120), ["HANG", "x", "y"], timeout=1.5))
  assert [o.index for o in outcomes][-1] == 0 and not outcomes[-1].ok


def test_a_compiler_that_builds_batches_gets_each_workers_share_in_one_run(pool, cache_dir):
  # six sources on two workers: two batches of three, each one compiler run; a batch with a bad source is built one
  # by one inside its worker (compile_many), so the bad one fails alone and its neighbours come out as built alone
  got = by_index(pool.compile_many(BatchingCompiler(), ["a", "b", "c", "d", "ERROR e", "f"], timeout=30))
  assert [got[i].lib for i in range(3)] == [b"BATCH3:a", b"BATCH3:b", b"BATCH3:c"]
  assert got[3].lib == b"LIB:d" and got[5].lib == b"LIB:f" and got[4].lib is None and "says ERROR" in got[4].error
  # a compiler without batches, or one source per worker, is a job a source
  assert by_index(pool.compile_many(BatchingCompiler(), ["g", "h"], timeout=30))[0].lib == b"LIB:g"


def test_a_hung_batch_costs_only_its_hung_source(pool, cache_dir):
  got = by_index(pool.compile_many(BatchingCompiler(hang=120), ["a", "HANG", "c", "d"], timeout=1.0))
  assert got[1].lib is None and "longer than 1 seconds" in got[1].error  # its own limit, once alone
  assert got[0].lib == b"LIB:a" and [got[2].lib, got[3].lib] == [b"BATCH2:c", b"BATCH2:d"]
  assert len(pool._pool) == 2 and all(w.process.is_alive() for w in pool._pool)


def test_workers_compile_under_the_callers_configuration_of_now(pool, tmp_path, monkeypatch):
  # the workers are spawned under one environment and kept; the caller then changes it and overrides a knob: each
  # compile reads the caller's values at its call (a worker's own environment would give the old cache folder)
  monkeypatch.setenv("KC_CACHE_DIR", str(tmp_path / "first"))
  monkeypatch.setenv("DEBUG", "0")
  assert by_index(pool.compile_many(ConfigReportingCompiler(), ["a", "b"], timeout=30))[0].lib == f"{tmp_path / 'first'}|0".encode()
  monkeypatch.setenv("KC_CACHE_DIR", str(tmp_path / "second"))
  with kc.config.override(DEBUG=1):
    got = by_index(pool.compile_many(ConfigReportingCompiler(), ["a", "b"], timeout=30))
  assert got[0].lib == got[1].lib == f"{tmp_path / 'second'}|1".encode()
  assert by_index(pool.compile_many(ConfigReportingCompiler(), ["c"], timeout=30))[0].lib == f"{tmp_path / 'second'}|0".encode()


def test_a_kept_worker_fills_the_callers_cache(pool, tmp_path, monkeypatch):
  monkeypatch.setenv("KC_CACHE_DIR", str(tmp_path / "first"))
  list(pool.compile_many(BatchingCompiler(), ["a", "b"], timeout=30))  # spawns the workers
  monkeypatch.setenv("KC_CACHE_DIR", str(tmp_path / "second"))
  got = by_index(pool.compile_many(BatchingCompiler(), ["c", "d"], timeout=30))
  assert lookup(BatchingCompiler().cache_key("c")) == got[0].lib == b"LIB:c"  # in the caller's cache of now


def test_the_thread_path_sees_the_callers_overrides():
  with LocalCompilePool(workers=2) as p, kc.config.override(DEBUG=2):
    got = by_index(p.compile_many(UnpicklableConfigReportingCompiler(), ["a", "b", "c"], timeout=30))
  assert {o.lib.split(b"|")[1] for o in got.values()} == {b"2"}


def test_an_unpicklable_compiler_compiles_in_threads():
  with LocalCompilePool(workers=2) as p:
    got = by_index(p.compile_many(UnpicklableCompiler(hang=120), ["a", "HANG", "ERROR", "d"], timeout=1.0))
    assert not p._pool  # no process was started for it
  assert got[0].lib == b"LIB:a" and got[3].lib == b"LIB:d"
  assert got[1].lib is None and "longer than 1 seconds" in got[1].error
  assert got[2].lib is None and "ERROR" in got[2].error


def test_bad_arguments_are_kc_errors():
  with pytest.raises(ConfigError, match="workers=.*got 0"): LocalCompilePool(workers=0)
  with pytest.raises(ConfigError, match="timeout.*got 0"):
    list(LocalCompilePool(workers=1).compile_many(FakeCompiler(), ["a"], timeout=0))
  assert list(LocalCompilePool(workers=1).compile_many(FakeCompiler(), [], timeout=1)) == []
