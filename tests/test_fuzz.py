"""kc fuzz: deterministic generation, a small run on CLANG and EMU, and injected faults (a wrong answer, an untyped
error, a segfault) recorded as such, with reproducers that fail when run."""
import json, os, subprocess, sys, textwrap
import numpy as np
import pytest
from kc.fuzz import FuzzConfig, case_seed, fuzz, generate, kc_lines, np_lines, summary
from kc.fuzz.check import reference
from kc.fuzz.tolerance import TABLE


def test_generator_is_deterministic_per_seed():
  for i in range(20):
    a, b = generate(case_seed(7, i)), generate(case_seed(7, i))
    assert kc_lines(a) == kc_lines(b) and np_lines(a) == np_lines(b)
    assert all(np.array_equal(a.data[k], b.data[k]) for k in a.data)
  assert len({"\n".join(kc_lines(generate(case_seed(7, i)))) for i in range(20)}) > 15


def test_every_generated_case_has_a_sound_reference():
  for i in range(100): assert reference(generate(case_seed(3, i))) is not None


def test_tolerance_is_the_core_table():
  from kc import dtypes
  from kc.ir import tolerance as core
  # the fuzzer's per-op bounds are the core table's numbers for the float types it generates, every op class included
  assert set(TABLE) == {"float32", "float16"}
  for dt, kinds in TABLE.items():
    assert set(kinds) == set(core.KINDS) - {"exact"}
    for kind, b in kinds.items():
      t = core.tolerance(getattr(dtypes, dt), kind)
      assert (t.rtol, t.atol, t.ulp) == (b.rtol, b.atol, b.ulp) and not b.exact
  assert TABLE["float16"]["reduce"].rtol > TABLE["float32"]["reduce"].rtol  # a real table, not one number repeated
  # the conformance suite reads the very same table
  conf = pytest.importorskip("kc_conformance.tolerance")
  assert conf.TABLE is core.TABLE and conf.tolerance is core.tolerance and conf.Tolerance is core.Tolerance


def test_small_run_on_clang_and_emu(tmp_path):
  res = fuzz(FuzzConfig(devices=("CLANG", "EMU"), n=30, seed=1, out_dir=str(tmp_path), minimize_seconds=5))
  assert len(res) == 2 * 30 * 3
  assert sum(r.outcome == "ok" for r in res) > 0
  assert "CLANG" in summary(res) and "EMU" in summary(res)
  for r in res:
    if r.outcome in ("wrong", "untyped-error", "crash", "hang"): assert r.reproducer and os.path.exists(r.reproducer)


def _inject(tmp_path, body: str) -> dict:
  """An environment whose Python processes (the fuzz workers and the reproducers) run `body` at start-up."""
  d = tmp_path / "inject"
  d.mkdir()
  (d / "sitecustomize.py").write_text(textwrap.dedent(body))
  env = dict(os.environ)
  env["PYTHONPATH"] = str(d) + os.pathsep + env.get("PYTHONPATH", "")
  return env


_PATCH = """
import kc.api
_orig = kc.api.CompiledKernel.__call__
def _broken(self, *args, **kw):
  ret = _orig(self, *args, **kw)
  if self.kernel.reduceops:
    {action}
  return ret
kc.api.CompiledKernel.__call__ = _broken
"""


def _run_cli(tmp_path, env, *extra):
  out = tmp_path / "out"
  p = subprocess.run([sys.executable, "-m", "kc.cli", "fuzz", "--device", "CLANG", "--n", "12", "--seed", "5", "--opts", "none",
                      "--out", str(out), "--json", str(tmp_path / "r.json"), "--minimize", "20", *extra],
                     env=env, capture_output=True, text=True, timeout=300)
  return p, json.loads((tmp_path / "r.json").read_text())


def test_injected_wrong_result_gets_a_failing_reproducer(tmp_path):
  env = _inject(tmp_path, _PATCH.format(action="for i in self.program.outs: args[i].reshape(-1)[:1] = 1 - args[i].reshape(-1)[:1]"))
  p, data = _run_cli(tmp_path, env)
  assert p.returncode == 1, p.stderr
  wrong = [r for r in data["results"] if r["outcome"] == "wrong"]
  assert wrong and all(r["reproducer"] for r in wrong)
  rp = subprocess.run([sys.executable, wrong[0]["reproducer"]], env=env, capture_output=True, text=True, timeout=120)
  assert rp.returncode == 1 and "FAIL" in rp.stdout
  clean = subprocess.run([sys.executable, wrong[0]["reproducer"]], capture_output=True, text=True, timeout=120)
  assert clean.returncode in (0, 1)  # without the fault it runs to the end (whatever the core's own bugs say)


def test_injected_crash_and_untyped_error_are_recorded_and_the_run_goes_on(tmp_path):
  env = _inject(tmp_path, _PATCH.format(action="import os, signal\n    os.kill(os.getpid(), signal.SIGSEGV) if len(self.program.outs) == 1 "
                                                "and args[0].size % 2 else (_ for _ in ()).throw(RuntimeError('injected'))"))
  p, data = _run_cli(tmp_path, env)
  outcomes = [r["outcome"] for r in data["results"]]
  assert p.returncode == 1
  assert len(outcomes) == 12
  assert "crash" in outcomes and "untyped-error" in outcomes
  assert any(o not in ("crash", "untyped-error") for o in outcomes)  # cases without a reduce still ran
  for r in data["results"]:
    if r["outcome"] == "untyped-error": assert "RuntimeError" in r["message"]
    if r["outcome"] == "crash": assert "SIGSEGV" in r["message"]
