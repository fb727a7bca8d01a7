"""kc.compile(opts="beam"), KC_BEAM and `kc beam`: searches go through the opt cache, so a kernel searched once is
never searched again; opts that no longer apply are searched again; KC_BEAM=N makes the default opts a search."""
import io, os, re, shutil, signal, subprocess, sys, time
import numpy as np
import pytest
import kc
import kc.search
from kc import ast as A
from kc.api import BeamChoice, beam_opts
from kc.tools.cli import BeamProgress, main
from kc.errors import ConfigError, KcError
from kc.ir.dtype import dtypes
from kc.kernel import Opt, OptOps
from kc.runtime.opt_cache import OptEntry, OptKey, opt_cache
from kc.search import SearchEvent, SearchResult
from kc.search.dask_executor import DaskCompileExecutor
from search_fakes import FakeCompiler

N = 64
CHOSEN = [Opt(OptOps.UPCAST, 0, 4)]  # what the fake search picks: not what the hand-coded heuristics pick on EMU


def _sink():
  return A.sink(A.store(0, A.arg(1, dtypes.float32, (N,)) * 3.0 + A.arg(2, dtypes.float32, (N,))))


class FakeSearch:
  """Stands in for kc.search.beam_search: records each call and returns CHOSEN, with progress events as the real one
  sends them."""

  def __init__(self, opts=CHOSEN): self.calls, self.opts = [], list(opts)

  def __call__(self, kernel, device, width=2, *, seed=0, progress=None, executor=None, **kw):
    assert not kernel.applied_opts  # the search starts from the kernel without opts
    self.calls.append({"width": width, "seed": seed, "executor": executor, "device": device.name})
    if progress is not None:
      for kind, done, total in (("round", 0, 3), ("compiled", 1, 3), ("compiled", 3, 3), ("timed", 2, 2), ("round_done", 2, 3), ("done", 1, 1)):
        progress(SearchEvent(kind, 0, done, total, 1e-5, 2e-5, f"fake {kind}"))
    k = kernel.copy()
    for o in self.opts: k.apply_opt(o)
    return SearchResult(opts=list(self.opts), kernel=k, seconds=1e-5, hand_opts=[], hand_seconds=2e-5, compiled=3, timed=2, elapsed=0.25)


@pytest.fixture
def fake(monkeypatch, cache_dir):
  monkeypatch.delenv("KC_BEAM", raising=False)
  monkeypatch.delenv("KC_BEAM_CLUSTER", raising=False)
  f = FakeSearch()
  monkeypatch.setattr(kc.search, "beam_search", f)
  return f


def test_a_second_beam_compile_does_no_search(fake):
  sink = _sink()
  ck = kc.compile(sink, "EMU", opts="beam")
  assert len(fake.calls) == 1 and fake.calls[0]["width"] == 2 and fake.calls[0]["executor"] is None
  assert ck.kernel.applied_opts == CHOSEN
  ck2 = kc.compile(sink, "EMU", opts="beam")
  assert len(fake.calls) == 1 and ck2.kernel.applied_opts == CHOSEN
  entry = opt_cache().get(OptKey.of(sink, kc.Device["EMU"].renderer, "EMU", 2))
  assert entry == OptEntry(tuple(CHOSEN), 1e-5, 2e-5, 0.25)


def test_the_searched_kernel_computes_the_right_result(fake):
  rng = np.random.default_rng(1)
  a, b = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
  out = kc.run(_sink(), {1: a, 2: b}, "EMU", opts="beam")[0]
  np.testing.assert_allclose(out, a * 3.0 + b, rtol=1e-6)


def test_the_cache_is_per_width_and_device(fake, monkeypatch):
  sink = _sink()
  kc.compile(sink, "EMU", opts="beam")
  monkeypatch.setenv("KC_BEAM", "3")
  kc.compile(sink, "EMU", opts="beam")
  kc.compile(sink, "CLANG", opts="beam")
  assert [(c["width"], c["device"]) for c in fake.calls] == [(2, "EMU"), (3, "EMU"), (3, "CLANG")]
  kc.compile(sink, "CLANG", opts="beam")
  assert len(fake.calls) == 3


def test_kc_beam_makes_the_default_opts_a_search(fake, monkeypatch):
  sink = _sink()
  assert kc.compile(sink, "EMU").kernel.applied_opts != CHOSEN and not fake.calls  # unset: hand-coded
  monkeypatch.setenv("KC_BEAM", "0")
  kc.compile(sink, "EMU")
  assert not fake.calls
  monkeypatch.setenv("KC_BEAM", "4")
  assert kc.compile(sink, "EMU").kernel.applied_opts == CHOSEN and fake.calls[-1]["width"] == 4
  kc.compile(sink, "EMU", opts="hand")  # "hand" stays hand-coded whatever KC_BEAM says
  kc.compile(sink, "EMU", opts=[Opt(OptOps.UPCAST, 0, 2)])
  assert len(fake.calls) == 1
  for bad in ("-1", "two"):
    monkeypatch.setenv("KC_BEAM", bad)
    with pytest.raises(ConfigError, match="KC_BEAM"): kc.compile(sink, "EMU")


def test_stored_opts_that_no_longer_apply_are_searched_again(fake):
  sink = _sink()
  key = OptKey.of(sink, kc.Device["EMU"].renderer, "EMU", 2)
  opt_cache().put(key, OptEntry((Opt(OptOps.UPCAST, 5, 4),)))  # axis 5 of a 1-D kernel
  assert kc.compile(sink, "EMU", opts="beam").kernel.applied_opts == CHOSEN and len(fake.calls) == 1
  assert opt_cache().get(key).opts == tuple(CHOSEN)


def test_beam_never_splits_the_reduce(fake, monkeypatch):
  fake.opts = []
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (1 << 21,)).sum()))
  assert isinstance(kc.compile(sink, "EMU", opts="hand"), kc.SplitCompiledKernel)
  ck = kc.compile(sink, "EMU", opts="beam")
  assert not isinstance(ck, kc.SplitCompiledKernel) and len(fake.calls) == 1


def test_kc_beam_cluster_sends_compiles_to_dask(fake, monkeypatch):
  monkeypatch.setenv("KC_BEAM_CLUSTER", "local")
  kc.compile(_sink(), "EMU", opts="beam")
  ex = fake.calls[0]["executor"]
  assert isinstance(ex, DaskCompileExecutor) and ex.address == "local"


def test_bad_beam_arguments_are_typed(fake):
  with pytest.raises(KcError, match="width"): beam_opts(_sink(), "EMU", 0)
  with pytest.raises(KcError): kc.compile("not an AST", "EMU", opts="beam")
  with pytest.raises(KcError, match="beam"): kc.api.optimize(kc.Kernel(_sink(), kc.Device["EMU"].renderer), "beam")
  assert not fake.calls


def test_the_real_search_runs_once_and_a_repeat_is_a_cache_hit(cache_dir, monkeypatch):
  monkeypatch.delenv("KC_BEAM", raising=False)
  monkeypatch.delenv("KC_BEAM_CLUSTER", raising=False)
  real, calls = kc.search.beam_search, []
  monkeypatch.setattr(kc.search, "beam_search", lambda *a, **kw: calls.append(1) or real(*a, **kw))
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (256,)) + A.arg(2, dtypes.float32, (256,))))
  first = kc.compile(sink, "EMU", opts="beam")
  assert len(calls) == 1
  t0 = time.perf_counter()
  again = kc.compile(sink, "EMU", opts="beam")
  repeat_ms = (time.perf_counter() - t0) * 1e3
  print(f"repeated kc.compile(opts='beam'): {repeat_ms:.1f} ms")  # measured, not asserted (speed belongs in benchmarks/)
  assert len(calls) == 1 and again.kernel.applied_opts == first.kernel.applied_opts
  choice = beam_opts(sink, "EMU", 2)
  assert isinstance(choice, BeamChoice) and choice.cached and list(choice.opts) == first.kernel.applied_opts and len(calls) == 1
  assert choice.entry.seconds > 0 and choice.entry.hand_seconds > 0 and choice.entry.elapsed > 0


# ---------------------------------------------------------------------------------------------------------- kc beam

def test_kc_beam_end_to_end_on_clang(cache_dir, monkeypatch, capsys):
  monkeypatch.delenv("KC_BEAM", raising=False)
  monkeypatch.delenv("KC_BEAM_CLUSTER", raising=False)
  assert main(["beam", "add", "--device", "CLANG", "--width", "1"]) == 0
  out = capsys.readouterr()
  for word in ("opts:", "hand-coded:", "GFLOP/s", "GB/s", "speedup:", "search:", "compiled"):
    assert word in out.out, word
  assert "round 0" in out.err  # plain progress lines: stderr is not a terminal here
  sink = kc.ast.examples.example("add").build()[0]
  assert opt_cache().get(OptKey.of(sink, kc.Device["CLANG"].renderer, "CLANG", 1)) is not None
  assert main(["beam", "add", "--device", "CLANG", "--width", "1"]) == 0
  assert "from the opt cache" in capsys.readouterr().out


def test_kc_beam_no_cache_searches_again_and_stores(fake, capsys):
  assert main(["beam", "add", "--device", "EMU", "--width", "1"]) == 0
  assert main(["beam", "add", "--device", "EMU", "--width", "1"]) == 0
  assert len(fake.calls) == 1
  assert main(["beam", "add", "--device", "EMU", "--width", "1", "--no-cache", "--seed", "7"]) == 0
  assert len(fake.calls) == 2 and fake.calls[1]["seed"] == 7
  assert "2.00x over the hand-coded kernel" in capsys.readouterr().out


def test_kc_beam_ast_file(fake, tmp_path, capsys):
  f = tmp_path / "k.py"
  f.write_text(f"from kc import ast as A\nfrom kc import dtypes\nsink = A.arg(1, dtypes.float32, ({N},)) * 3.0 + A.arg(2, dtypes.float32, ({N},))\n")
  assert main(["beam", "--ast", str(f), "--device", "EMU"]) == 0
  assert str(CHOSEN[0]) in capsys.readouterr().out and len(fake.calls) == 1
  assert opt_cache().get(OptKey.of(_sink(), kc.Device["EMU"].renderer, "EMU", 2)) is not None  # the same kernel as _sink()


@pytest.mark.parametrize("argv, message", [
  (["beam"], "EXAMPLE or --ast"),
  (["beam", "add", "--ast", "x.py"], "EXAMPLE or --ast"),
  (["beam", "--ast", "/no/such/file.py"], "no such file"),
  (["beam", "add", "--width", "0"], "--width"),
  (["beam", "add", "--device", "NOSUCHDEV"], "NOSUCHDEV"),
])
def test_kc_beam_usage_errors_exit_2(fake, argv, message, capsys):
  assert main(argv) == 2
  assert message in capsys.readouterr().err and not fake.calls


@pytest.mark.parametrize("text, message", [("x = 1\n", "defines no variable `sink`"), ("sink = 3\n", "must be a kc.ast sink"),
                                           ("raise RuntimeError('boom')\n", "boom"), ("def (:\n", "SyntaxError")])
def test_kc_beam_bad_ast_files_exit_2(fake, tmp_path, text, message, capsys):
  f = tmp_path / "bad.py"
  f.write_text(text)
  assert main(["beam", "--ast", str(f), "--device", "EMU"]) == 2
  assert message in capsys.readouterr().err


class Terminal(io.StringIO):
  def isatty(self): return True


def test_the_progress_bar_shows_compiled_timed_and_best():
  pytest.importorskip("tqdm")
  term = Terminal()
  show = BeamProgress(term)
  assert show.bar_enabled
  FakeSearch()(kc.Kernel(_sink(), kc.Device["EMU"].renderer), kc.Device["EMU"], progress=show)
  text = term.getvalue()
  assert "round 0" in text and "3/3" in text and "timed 2/2" in text and "best 10.0 us" in text
  plain = io.StringIO()
  FakeSearch()(kc.Kernel(_sink(), kc.Device["EMU"].renderer), kc.Device["EMU"], progress=BeamProgress(plain))
  assert plain.getvalue().splitlines() == ["beam: fake round_done (best 10.0 us, hand-coded 20.0 us)",
                                           "beam: fake done (best 10.0 us, hand-coded 20.0 us)"]


def test_kc_render_beam(fake, capsys):
  assert main(["render", "add", "--device", "EMU", "--opts", "beam"]) == 0
  assert str(CHOSEN) in capsys.readouterr().out and len(fake.calls) == 1


# ---------------------------------------------------------------------------------------------------------- Ctrl-C

def _matmul_sink(n: int = 16):
  return A.sink(A.store(0, A.arg(1, dtypes.float32, (n, n)) @ A.arg(2, dtypes.float32, (n, n))))


def _interrupt_at(where: str, monkeypatch):
  """Make a KeyboardInterrupt happen in round 1 of the next search, where a Ctrl-C would land: in the parent's wait
  for compile results (`wait`), between two results (`consumer`: a progress display) or while timing a candidate
  (`timing`)."""
  import kc.search.beam as beam, kc.search.executor as executor
  in_round_1 = []
  real_emit, real_wait, real_time = beam._Search.emit, executor.wait_connections, beam.time_launcher

  def emit(self, kind, rnd, done, total, message=""):
    if kind == "round" and rnd == 1: in_round_1.append(True)
    if where == "consumer" and in_round_1 and kind == "compiled": raise KeyboardInterrupt
    real_emit(self, kind, rnd, done, total, message)

  def wait(conns, timeout=None):
    if where == "wait" and in_round_1: raise KeyboardInterrupt
    return real_wait(conns, timeout)

  def time_it(*a, **kw):
    if where == "timing" and in_round_1: raise KeyboardInterrupt
    return real_time(*a, **kw)
  monkeypatch.setattr(beam._Search, "emit", emit)
  monkeypatch.setattr(executor, "wait_connections", wait)
  monkeypatch.setattr(beam, "time_launcher", time_it)


def _record_workers(monkeypatch) -> list:
  from kc.testing.worker import Worker
  started, real_init = [w.process for w in kc.search.shared_pool()._pool], Worker.__init__

  def init(self, *args, **kw):
    real_init(self, *args, **kw)
    started.append(self.process)
  monkeypatch.setattr(Worker, "__init__", init)
  return started


@pytest.mark.parametrize("where", ["wait", "consumer", "timing"])
def test_an_interrupted_beam_compile_stops_its_workers_and_stores_nothing(where, cache_dir, monkeypatch):
  monkeypatch.delenv("KC_BEAM", raising=False)
  monkeypatch.delenv("KC_BEAM_CLUSTER", raising=False)
  workers = _record_workers(monkeypatch)
  _interrupt_at(where, monkeypatch)
  sink = _matmul_sink()
  with pytest.raises(KeyboardInterrupt) as info: kc.compile(sink, "CLANG", opts="beam")
  assert isinstance(info.value, kc.search.SearchInterrupted)
  best = info.value.best  # round 0 timed the hand-coded and the unoptimized kernel
  assert best is not None and best.seconds > 0 and len(best.rounds) == 1 and best.hand_seconds > 0
  assert workers and not kc.search.shared_pool()._pool
  assert not any(p.is_alive() for p in workers), [p.exitcode for p in workers]
  assert opt_cache().get(OptKey.of(sink, kc.Device["CLANG"].renderer, "CLANG", 2)) is None
  monkeypatch.undo()  # the pool starts the workers it needs again
  assert [o.lib for o in kc.search.shared_pool().compile_many(FakeCompiler(), ["x"], 30)] == [b"LIB:x"]


SLOW_CC = """#!/bin/sh
# cc, one second slower for each compile (a compile writes -o FILE; the compiler probes do not), and held for half a
# minute once the file HOLD exists: the search cannot finish before the test interrupts it
case " $* " in *" -o "*) if [ -e "HOLD" ]; then sleep 30; else sleep 1; fi;; esac
exec cc "$@"
"""


def _children(pid: int) -> list[int]:
  """The processes whose parent is `pid` (Linux /proc)."""
  found = []
  for entry in os.listdir("/proc"):
    if not entry.isdigit(): continue
    try:
      with open(f"/proc/{entry}/stat") as f: fields = f.read().rsplit(")", 1)[1].split()
    except OSError: continue
    if fields[1] == str(pid): found.append(int(entry))
  return found


def _running(pid: int) -> bool:
  """Whether `pid` is a live process (a zombie waiting for its new parent to reap it has ended)."""
  try:
    with open(f"/proc/{pid}/stat") as f: return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError: return False


@pytest.mark.skipif(not os.path.isdir("/proc") or not shutil.which("cc"), reason="needs Linux's /proc and cc")
@pytest.mark.parametrize("group", [True, False], ids=["ctrl-c", "kill-parent"])
def test_ctrl_c_stops_kc_beam_with_the_best_so_far_and_status_130(group, tmp_path):
  # a terminal's Ctrl-C reaches every process of the group (workers too); `kill -INT` only the parent
  (tmp_path / "slowcc").write_text(SLOW_CC.replace('"HOLD"', f'"{tmp_path / "hold"}"'))
  cache = tmp_path / "cache"
  env = {**os.environ, "KC_CACHE_DIR": str(cache), "KC_CC": f"sh {tmp_path / 'slowcc'}", "KC_BEAM": "",
         "KC_BEAM_CLUSTER": ""}
  p = subprocess.Popen([sys.executable, "-m", "kc.tools.cli", "beam", "matmul", "--device", "CLANG", "--no-cache"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
  try:
    err = []
    while "round 0" not in (line := p.stderr.readline()):  # round 0 is over: round 1's compiles are in flight
      assert line, f"kc beam ended before round 1: {''.join(err)}{p.stdout.read()}"
      err.append(line)
    (tmp_path / "hold").touch()  # the compiles that start from now on outlast the test
    time.sleep(0.5)
    workers = [c for c in _children(p.pid) if "spawn_main" in open(f"/proc/{c}/cmdline").read()]
    os.killpg(p.pid, signal.SIGINT) if group else os.kill(p.pid, signal.SIGINT)
    out, rest = p.communicate(timeout=60)
  finally:
    if p.poll() is None: p.kill()
  err = "".join(err) + rest
  assert p.returncode == 130, (out, err)
  assert "Traceback" not in err and "KeyboardInterrupt" not in err and len(err.splitlines()) <= 3, err
  assert err.splitlines()[-1] == "kc beam: interrupted; the search's result was not stored in the opt cache"
  # round 1's first compiles may have started before the hold: they finish, and so may round 1
  assert "best so far: [" in out and re.search(r"after [12] finished rounds?:", out), out
  assert len(workers) >= 1 and not any(_running(w) for w in workers)
  assert not (cache / "opts.sqlite").exists() or not _opt_rows(cache / "opts.sqlite")


def _opt_rows(path) -> list:
  import sqlite3
  with sqlite3.connect(path) as db: return db.execute("SELECT * FROM opts").fetchall()
