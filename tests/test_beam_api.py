"""kc.compile(opts="beam"), KC_BEAM and `kc beam`: searches go through the opt cache, so a kernel searched once is
never searched again; opts that no longer apply are searched again; KC_BEAM=N makes the default opts a search."""
import io, time
import numpy as np
import pytest
import kc
import kc.search
from kc import ast as A
from kc.api import BeamChoice, beam_opts
from kc.cli import BeamProgress, main
from kc.errors import ConfigError, KcError
from kc.ir.dtype import dtypes
from kc.kernel import Opt, OptOps
from kc.runtime.opt_cache import OptEntry, OptKey, opt_cache
from kc.search import SearchEvent, SearchResult
from kc.search.dask_executor import DaskCompileExecutor

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
  sink = kc.examples.example("add").build()[0]
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
