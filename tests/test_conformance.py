"""The conformance suite's own tests: deliberately broken backends (tests/conformance_fakes.py) are caught by the
right tests with the right outcome, expectations and capabilities select what they should, and every report (JSON
against its schema, HTML) is written, also when setup fails."""
from __future__ import annotations
import json, os, subprocess, sys
import numpy as np
import pytest
import kc
from kc import dtypes
from kc_conformance import expectations as expect
from kc_conformance.capabilities import capability_set, declared
from kc_conformance.checks import needs_of
from kc_conformance.corpus import CASES, setup_of
from kc_conformance.report import schema, validate
from kc_conformance.specs import SPECS, specs_for
from kc_conformance.test_suite import ALL_IDS
from kc.testing.compare import compare
from kc.testing.tolerance import Tolerance, tolerance

TESTS = os.path.dirname(os.path.abspath(__file__))


def run_suite(tmp_path, device: str, *args: str, name: str = "report") -> tuple[int, dict, str]:
  """Run the suite in a pytest process of its own, with the fake backends registered; (exit code, JSON report, output)."""
  report = tmp_path / f"{name}.json"
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p)}
  r = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "kc_conformance", "-p", "conformance_fakes", f"--kc-device={device}",
                      f"--kc-report={report}", f"--kc-report={tmp_path / (name + '.html')}", "-p", "no:cacheprovider", "-q", *args],
                     capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
  assert report.exists(), f"no report was written:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
  return r.returncode, json.loads(report.read_text()), r.stdout + r.stderr


def outcomes(doc: dict) -> dict[str, str]: return {t["id"]: t["outcome"] for t in doc["tests"]}


def by_id(doc: dict) -> dict[str, dict]: return {t["id"]: t for t in doc["tests"]}


# ---------------------------------------------------------------------------------------------------------- broken backends

@pytest.fixture(scope="module")
def wrong_add(tmp_path_factory):
  """WRONGADD on three cells of the matrix, with an expectation file that xfails one failure, holds an entry that
  matches no test, and one whose arch condition does not hold here."""
  tmp = tmp_path_factory.mktemp("wrongadd")
  (tmp / "expect.json").write_text(json.dumps({"kc_conformance_expectations": 1, "entries": [
    {"test": "run/add_f32/none", "outcome": "xfail", "reason": "float adds subtract", "link": "https://example.org/issues/1"},
    {"test": "run/add_f32/hand", "reason": "only on another chip", "link": "https://example.org/issues/2", "arch": "^no-such-arch$"},
    {"test": "run/no_such_case/*", "reason": "a typo", "link": "https://example.org/issues/3"}]}))
  return run_suite(tmp, "WRONGADD", "-k", "add_f32 or cmplt_f32 or add_i32", f"--kc-expect={tmp / 'expect.json'}"), tmp


def test_wrong_results_for_one_op_fail_exactly_its_run_tests(wrong_add):
  (rc, doc, out), _ = wrong_add
  got = outcomes(doc)
  assert rc != 0
  assert got["run/add_f32/hand"] == "fail" and "wrong result" in by_id(doc)["run/add_f32/hand"]["reason"]
  # the other tiers of the same kernel, and kernels without a float32 add, pass
  for t in ("render/add_f32/none", "render/add_f32/hand", "compile/add_f32/hand", "run/cmplt_f32/none", "run/cmplt_f32/hand",
            "run/add_i32/none", "run/add_i32/hand"):
    assert got[t] == "pass", (t, got[t])
  errs = by_id(doc)["run/add_f32/hand"]["errors"]
  assert errs[0]["ok"] is False and errs[0]["max_abs"] > 1.0 and errs[0]["mismatches"] > 0
  # passing numeric tests record their observed errors too
  assert by_id(doc)["run/add_i32/hand"]["errors"][0] == {**by_id(doc)["run/add_i32/hand"]["errors"][0], "max_abs": 0.0, "ok": True}


def test_expectations_xfail_one_failure_and_an_unmatched_entry_is_an_error(wrong_add):
  (rc, doc, _), _ = wrong_add
  t = by_id(doc)
  assert t["run/add_f32/none"]["outcome"] == "xfail" and t["run/add_f32/none"]["link"] == "https://example.org/issues/1"
  assert t["run/add_f32/hand"]["outcome"] == "fail"  # its entry is for another arch
  errors = [x for x in doc["tests"] if x["outcome"] == "error"]
  assert len(errors) == 1 and "run/no_such_case/*" in errors[0]["reason"] and "matches no test" in errors[0]["reason"]
  s = doc["summary"]
  assert (s["failed"], s["xfailed"], s["errors"], s["crashed"]) == (1, 1, 1, 0)
  assert s["passed"] + s["failed"] + s["xfailed"] + s["errors"] + s["skipped"] + s["xpassed"] == s["total"]


def test_reports_validate_and_the_html_shows_capabilities_and_failures(wrong_add):
  (_, doc, _), tmp = wrong_add
  validate(doc)
  assert doc["schema_version"] == 1 and doc["suite_version"] == kc_conformance_version() and doc["kc_version"] == kc.__version__
  assert doc["device"]["name"] == "WRONGADD" and doc["device"]["capabilities"]["locals"] is False
  page = (tmp / "report.html").read_text()
  assert "Capability matrix" in page and "dtype:float16" in page and "run/add_f32/hand" in page and "class=fail" in page
  assert "https://example.org/issues/1" in page  # the expected failure and its link


def kc_conformance_version() -> str:
  import kc_conformance
  return kc_conformance.SUITE_VERSION


def test_a_segfaulting_kernel_is_a_crash_and_the_run_continues(tmp_path):
  rc, doc, _ = run_suite(tmp_path, "SEGV", "-k", "test_run and (add_f32 or mul_f32)")
  runs = [t for t in doc["tests"] if t["tier"] == "run"]
  assert rc != 0 and len(runs) == 4
  assert all(t["outcome"] == "crash" and "SIGSEGV" in t["reason"] for t in runs), [(t["id"], t["reason"]) for t in runs]
  assert doc["summary"]["crashed"] == 4 and doc["summary"]["failed"] == 0


def test_a_kernel_that_loses_the_device_is_its_crash_and_the_next_job_gets_a_fresh_worker(tmp_path):
  # a GPU's sticky error: the faulting kernel is reported as a crash with the fault's own message (not the error
  # it was wrapped in), and the kernels after it pass, which they can only do on a fresh worker process
  rc, doc, _ = run_suite(tmp_path, "STICKY", "-k", "test_run and (add_f32 or mul_f32)")
  runs = {t["id"]: t for t in doc["tests"] if t["tier"] == "run"}
  faulting, fine = [t for i, t in runs.items() if "mul_f32" in i], [t for i, t in runs.items() if "add_f32" in i]
  assert rc != 0 and faulting and fine, sorted(runs)
  assert all(t["outcome"] == "crash" and "ILLEGAL_ADDRESS: an illegal memory access" in t["reason"] for t in faulting), \
    [(t["id"], t["reason"]) for t in faulting]
  assert all(t["outcome"] == "pass" for t in fine), [(t["id"], t["outcome"], t["reason"]) for t in fine]


def test_a_hung_kernel_is_a_crash_after_the_timeout(tmp_path):
  rc, doc, _ = run_suite(tmp_path, "HANG", "-k", "test_run and add_i32 and hand", "--kc-timeout=3")
  (t,) = doc["tests"]
  assert rc != 0 and t["outcome"] == "crash" and "timeout" in t["reason"] and t["duration"] >= 3


def test_a_program_past_the_declared_local_max_fails_the_render_tier(tmp_path):
  rc, doc, _ = run_suite(tmp_path, "BIGLOCAL", "-k", "test_render and (sum_axis1 or f32_arith)")
  got = by_id(doc)
  assert rc != 0
  # LOCAL-0-0 makes the 5 outputs one work-group of 5 threads, which the dialect rewrite widens to 500
  widened = got["render/sum_axis1/LOCAL-0-0"]
  assert widened["outcome"] == "fail" and "[500, 1, 1]" in widened["reason"] and "local_max (16, 16, 16)" in widened["reason"], widened
  assert got["render/f32_arith/none"]["outcome"] == "pass"  # no work-group, nothing widened


def test_an_unavailable_device_runs_the_render_tier_only(tmp_path):
  rc, doc, _ = run_suite(tmp_path, "NOHW", "-k", "f32_arith and hand")
  got = by_id(doc)
  assert rc == 0 and doc["device"]["available"] is False
  assert got["render/f32_arith/hand"]["outcome"] == "pass"
  for tier in ("compile", "run"):
    assert got[f"{tier}/f32_arith/hand"]["outcome"] == "skip" and got[f"{tier}/f32_arith/hand"]["reason"].startswith("unavailable:")
  assert doc["summary"]["skipped_by_reason"] == {"unavailable": 2}


def test_the_report_is_written_when_setup_fails(tmp_path):
  rc, doc, _ = run_suite(tmp_path, "NOSUCHDEVICE", "-k", "f32_arith and hand")
  validate(doc)
  assert rc != 0 and "unknown device 'NOSUCHDEVICE'" in doc["setup_error"] and doc["device"]["name"] == "NOSUCHDEVICE"
  assert (tmp_path / "report.html").read_text().count("setup failed") == 1


def test_kc_conformance_command_with_tier_and_junit(tmp_path):
  junit, report = tmp_path / "junit.xml", tmp_path / "emu.json"
  r = subprocess.run([sys.executable, "-m", "kc.tools.cli", "conformance", "--device", "EMU", "--tier", "compile", "-k", "f32_arith and hand",
                      "--report", str(report), "--junitxml", str(junit)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
  doc = json.loads(report.read_text())
  assert r.returncode == 0, r.stdout[-2000:]
  assert doc["tiers"] == ["render", "compile"] and outcomes(doc) == {"render/f32_arith/hand": "pass", "compile/f32_arith/hand": "pass"}
  assert 'testcase' in junit.read_text() and "f32_arith" in junit.read_text()


def test_collection_touches_no_device(tmp_path):
  # TOUCHY raises when asked if it is available, opened, or asked for its renderer: collection does none of these
  rc, doc, out = run_suite(tmp_path, "TOUCHY", "--collect-only")
  assert rc == 0 and f"{len(ALL_IDS)} tests collected" in out and doc["tests"] == []


# ---------------------------------------------------------------------------------------------------------- in-process pieces

def test_every_expectation_pattern_is_checked_against_the_whole_suite(tmp_path):
  entries = [expect.Expectation("run/add_f32/*", "xfail", "r", "l"), expect.Expectation("render/opt_errors/matmul_*", "xfail", "r", "l"),
             expect.Expectation("run/add_f99/*", "xfail", "r", "l")]
  assert [e.test for e in expect.unmatched(entries, ALL_IDS)] == ["run/add_f99/*"]
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps({"kc_conformance_expectations": 1, "entries": [{"test": "run/*", "reason": "no link"}]}))
  with pytest.raises(expect.ExpectationError, match="'link' is required"): expect.load(str(bad))


def test_capabilities_come_from_the_renderer_and_select_tests():
  from kc.emu import EmuRenderer

  class NoHalf(EmuRenderer):
    supported_dtypes = frozenset(dtypes.all) - {dtypes.float16}
    tensor_cores = []
  have = capability_set(declared(NoHalf()))
  case = CASES["matmul_half_in_float_acc"]
  needs = needs_of(case, setup_of(case.name), SPECS["tc1"])
  assert needs - have == {"dtype:float16", "tensor_cores:float16->float32"}
  assert needs - capability_set(declared(EmuRenderer())) == set()  # EMU's built-in tensor cores take half in, float out
  assert "locals" in needs_of(case, setup_of(case.name), SPECS["LOCAL-0-2"])
  # tensor-core specs exist only for matmuls; the dtype matrix runs under none and hand
  assert {s.name for s in specs_for(CASES["add_f32"])} == {"none", "hand"} and "tc1" not in {s.name for s in specs_for(CASES["f32_arith"])}


def test_tolerances_by_dtype_and_class_with_ulp_bounds_and_overrides():
  assert tolerance(dtypes.int32, "arith").exact and tolerance(dtypes.float32, "exact").exact
  t = tolerance(dtypes.float32, "transcendental")
  assert t.ulp == 4
  want = np.array([1.0, 1000.0], np.float32)
  two_ulp = want + 2 * np.spacing(want)
  c = compare(0, two_ulp, want, dtypes.float32, t)
  assert c.ok and abs(c.max_ulp - 2.0) < 1e-9 and c.max_abs == pytest.approx(2 * np.spacing(np.float32(1000.0)))
  assert not compare(0, want + 8 * np.spacing(want), want, dtypes.float32, t).ok
  override = {"float32": Tolerance(rtol=0.5)}
  assert tolerance(dtypes.float32, "reduce", override) == Tolerance(rtol=0.5)
  # a NaN where numpy has a number fails with an infinite error; NaN where numpy has NaN is equal
  assert not compare(0, np.array([np.nan], np.float32), np.array([1.0], np.float32), dtypes.float32, t).ok
  assert compare(0, np.array([np.nan], np.float32), np.array([np.nan], np.float32), dtypes.float32, t).ok


def test_the_schema_is_the_one_reports_claim():
  s = schema()
  assert s["properties"]["schema_version"]["const"] == 1
  assert set(s["properties"]["tests"]["items"]["properties"]["outcome"]["enum"]) == {"pass", "fail", "crash", "skip", "xfail", "xpass", "error"}


# ---------------------------------------------------------------------------------------------------------- failure groups

def test_failures_are_grouped_by_cause_with_an_example_and_a_rerun_command(wrong_add):
  (_, doc, out), tmp = wrong_add
  fails = [t["id"] for t in doc["tests"] if t["outcome"] == "fail"]
  (g,) = [g for g in doc["failure_groups"] if g["cause"] == "WrongResult"]  # the other: the expectation file's error
  assert len(doc["failure_groups"]) == 2 and g["count"] == len(fails) and sorted(g["tests"]) == sorted(fails)
  ex = g["example"]
  assert "-" in ex["source"] and ex["errors"][0]["ok"] is False and ex["mismatches"]
  for m in ex["mismatches"]: assert abs(m["expected"] - m["actual"]) > 1e-6 * (1 + abs(m["expected"]))
  assert ex["command"] == f"kc conformance --device WRONGADD --expect {tmp / 'expect.json'} -k '{ex['nodeid'].split('::')[-1]}'"
  assert "failures by cause (2)" in out and ex["command"] in out
  assert "Failures by cause" in (tmp / "report.html").read_text()


def test_an_unknown_device_is_one_setup_error_not_one_per_test(tmp_path):
  rc, doc, out = run_suite(tmp_path, "NOSUCHDEVICE")
  assert rc != 0 and doc["summary"]["total"] == 1 and doc["summary"]["errors"] == 1
  assert out.count("unknown device 'NOSUCHDEVICE'") <= 4  # the error line, the summary, the setup error and its group


def test_the_report_is_complete_under_xdist(wrong_add):
  pytest.importorskip("xdist")
  (_, doc, _), tmp = wrong_add
  rc, par, _ = run_suite(tmp, "WRONGADD", "-n", "2", "-k", "add_f32 or cmplt_f32 or add_i32", f"--kc-expect={tmp / 'expect.json'}", name="xdist")
  assert outcomes(par) == outcomes(doc) and par["summary"] == doc["summary"] and rc != 0
  assert [g["tests"].__len__() for g in par["failure_groups"]] == [g["count"] for g in doc["failure_groups"]]


def test_kc_conformance_says_an_unknown_device_once_and_exits_2(capsys):
  from kc.tools.cli import main
  assert main(["conformance", "--device", "NOPE"]) == 2
  err = capsys.readouterr().err
  assert err.count("unknown device 'NOPE'") == 1 and "EMU" in err


def test_spec_kind_selection():
  import pytest as _pytest
  from kc.tools.cli import SPEC_KINDS
  from kc_conformance.plugin import _spec_kinds
  from kc_conformance.specs import SPECS
  assert SPEC_KINDS == {s.kind for s in SPECS.values()}  # the CLI's list (it does not import the suite) stays the suite's
  assert _spec_kinds(None) is None and _spec_kinds("none, hand") == {"none", "hand"}
  with _pytest.raises(_pytest.UsageError, match="single"): _spec_kinds("none,singel")


# ------------------------------------------------------------------------------------------------ what a run certified

def test_a_run_that_only_rendered_says_so_and_fails_when_a_tier_is_required(tmp_path):
  rc, doc, out = run_suite(tmp_path, "NOHW", "-k", "f32_arith and hand")
  said = "certified: render tier only; the compile and run tiers were skipped because NOHW cannot open here"
  assert rc == 0 and said in out and doc["summary"]["certified"].startswith(said)
  for tier in ("run", "compile"):
    rc, doc, out = run_suite(tmp_path, "NOHW", "-k", "f32_arith and hand", f"--kc-require-tier={tier}", name=tier)
    said = f"--kc-require-tier {tier}: that tier did not run for 1 selected case, e.g. {tier}/f32_arith/hand"
    assert rc == 1 and said in out, out
  rc, _, out = run_suite(tmp_path, "NOHW", "-k", "f32_arith and hand", "--kc-require-tier=render", name="render")
  assert rc == 0 and "--kc-require-tier" not in out


def test_a_required_tier_that_ran_passes_and_a_case_the_device_cannot_take_does_not_count(tmp_path):
  # CLANG declares no tensor cores: the tensor-core specs skip for capability in every tier, which certifies nothing
  # but is no tier that failed to run
  rc, doc, out = run_suite(tmp_path, "CLANG", "-k", "f32_arith and hand or matmul_square and tc1",
                           "--kc-require-tier=run")
  got = outcomes(doc)
  assert rc == 0, out[-3000:]
  assert got["run/f32_arith/hand"] == "pass" and got["run/matmul_square/tc1"] == "skip"
  assert doc["summary"]["certified"] == "certified: render, compile and run tiers"


def _record(tid: str, outcome: str = "pass", reason=None):
  from kc_conformance.report import TestRecord
  return TestRecord(tid, tid, tid.split("/")[0], outcome, reason)


def test_the_certified_line_and_the_required_tier_rules():
  from kc_conformance.report import coverage_line, unmet_requirement
  away = "unavailable: X cannot open here (no GPU); the run tier needs the device's runtime"
  ran = [_record("render/a/hand"), _record("compile/a/hand", "fail"), _record("run/a/hand", "skip", away)]
  assert coverage_line(ran, ["render", "compile", "run"]) == \
    "certified: render and compile tiers only; the run tier was skipped because X cannot open here (no GPU)"
  assert unmet_requirement(ran, "run") == [("run/a/hand", away)] and unmet_requirement(ran, "compile") == []
  capability = "capability: needs float4, which X does not declare"
  known = "expected: known bug (link)"
  partial = ran[:2] + [_record("run/a/hand"), _record("render/b/none"), _record("run/b/none", "skip", known),
                       _record("run/c/none", "skip", capability), _record("render/c/none", "skip", capability)]
  assert coverage_line(partial, ["render", "compile", "run"]) == \
    "certified: render, compile and run tiers; 1 of 3 run tests were skipped (expected: known bug (link))"
  # b's run test was skipped, and b has no compile test selected; c does not apply to the device
  assert unmet_requirement(partial, "run") == [("run/b/none", known)]
  assert unmet_requirement(partial, "compile") == [(f"compile/{c}/none", "not selected") for c in "bc"]
  nothing = coverage_line([_record("run/a/hand", "skip", away)], ["render", "compile", "run"])
  assert nothing.startswith("certified: nothing; no test ran (unavailable: X cannot open here (no GPU))"), nothing


def _kc(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "kc.tools.cli", "conformance", *args], capture_output=True, text=True,
                        timeout=300)


def test_kc_conformance_list_prints_the_selected_ids():
  r = _kc("--device", "EMU", "--list", "--specs", "none")
  # the error-contract tests belong to no spec: every --specs keeps them
  want = [i for i in ALL_IDS if i.endswith("/none") or i.startswith("render/opt_errors/")]
  assert r.returncode == 0 and sorted(r.stdout.splitlines()) == sorted(want), r.stderr
  r = _kc("--device", "EMU", "--device", "CLANG", "--list", "-k", "f32_arith and hand", "--tier", "compile")
  assert r.returncode == 0 and r.stdout.splitlines() == [f"{dev} {tier}/f32_arith/hand" for dev in ("EMU", "CLANG")
                                                         for tier in ("render", "compile")], r.stdout + r.stderr


def test_kc_conformance_list_into_a_reader_that_stops_early_ends_quietly():
  # `kc conformance --list | head -2`: the closed pipe ends the command with the shell's SIGPIPE status, no traceback
  p = subprocess.Popen([sys.executable, "-m", "kc.tools.cli", "conformance", "--device", "EMU", "--list"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
  assert p.stdout is not None and p.stdout.readline().startswith("render/")
  p.stdout.close()
  err = p.stderr.read() if p.stderr is not None else ""
  assert p.wait(timeout=300) == 141 and "Traceback" not in err, err


def test_kc_conformance_refuses_a_required_tier_that_cannot_run(capsys):
  from kc.tools.cli import main
  assert main(["conformance", "--device", "EMU", "--tier", "compile", "--require-tier", "run"]) == 2
  assert "--require-tier run needs that tier to run, but --tier compile stops before it" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------- programs of several kernels

# the everyday programs the suite certifies as whole programs (kc_conformance/program_cases.py), and those of ops
# kc.ast gains in parallel, certified once it has them
PROGRAMS = ("layernorm", "attention", "var_std_rows", "standardize", "argmax_argmin_rows", "outputs_of_three_shapes",
            "reduce_reshaped", "reduce_broadcast_other_axis", "reduce_of_reduce", "reduce_of_reshaped_reduce")
LATER_PROGRAMS = {"cumsum_rows": hasattr(kc.ast.Expr, "cumsum"), "concatenate_computed": hasattr(kc.ast, "concatenate"),
                  "stack_of_reduces": hasattr(kc.ast, "stack")}


@pytest.mark.parametrize("device", ["CLANG", "EMU"])
def test_program_cases_exist_and_pass(tmp_path, device):
  from kc.schedule import schedule
  names = {n for n, c in CASES.items() if c.group == "program"}
  want = {f"program_{p}" for p in PROGRAMS} | {f"program_{p}" for p, there in LATER_PROGRAMS.items() if there}
  assert want <= names and all(n.startswith("program_") for n in names), sorted(want - names)
  plans = {n: schedule(setup_of(n).sink) for n in names}
  assert sum(len(p.kernels) > 1 for p in plans.values()) >= 6 and sum(len(p.temps) > 1 for p in plans.values()) >= 2
  rc, doc, out = run_suite(tmp_path, device, "-k", "program_")
  ids = [i for i in ALL_IDS if i.split("/")[1] in names]
  assert rc == 0 and outcomes(doc) == {i: "pass" for i in ids}, out[-3000:]
  # the render tier reports each kernel of a program: the chain's four, in launch order
  chain = by_id(doc)["render/program_chain_of_intermediates/hand"]["program"]
  assert len(chain["kernels"]) == 4 and chain["name"] == "+".join(k["name"] for k in chain["kernels"])


# ---------------------------------------------------------------------------------------------------------- batched builds

def test_the_compile_tier_builds_what_was_rendered_in_batches(cache_dir, monkeypatch):
  """The first compile test builds every kernel rendered so far with compile_many (batches in one compiler run);
  each compile test then finds its kernel in the cache."""
  from kc_conformance.target import Target
  from kc.runtime.device import Compiler
  batches, singles = [], []
  real_batch, real_single = Compiler.compile_batch_uncached, type(kc.Device["CLANG"].compiler).compile_uncached
  monkeypatch.setattr(type(kc.Device["CLANG"].compiler), "compile_batch_uncached",
                      lambda self, srcs: batches.append(list(srcs)) or real_batch(self, srcs))
  monkeypatch.setattr(type(kc.Device["CLANG"].compiler), "compile_uncached", lambda self, src: singles.append(src) or real_single(self, src))
  target, record = Target("CLANG", isolate=False), (lambda key, value: None)
  pairs = [(c, s) for c in ("f32_arith", "sum_axis1", "sum_i32") for s in ("none", "hand")]
  for c, s in pairs: target.render_tier(c, s, record)
  rendered = {target._programs[(c, s)][1].src for c, s in pairs}
  target.compile_tier(*pairs[0], record)
  assert sorted(src for b in batches for src in b) == sorted(rendered)
  singles.clear()
  for c, s in pairs: target.compile_tier(c, s, record)
  assert singles == [] and len(batches) == 1  # every compile test was a cache hit; nothing new was rendered


def test_a_compiler_that_builds_one_source_at_a_time_is_not_asked_early(cache_dir, monkeypatch):
  from kc_conformance.target import Target
  compiler_type = type(kc.Device["EMU"].compiler)
  built = []
  real = compiler_type.compile
  monkeypatch.setattr(compiler_type, "compile", lambda self, src: built.append(src) or real(self, src))
  target, record = Target("EMU", isolate=False), (lambda key, value: None)
  for s in ("none", "hand"): target.render_tier("f32_arith", s, record)
  target.compile_tier("f32_arith", "none", record)
  assert built == [target._programs[("f32_arith", "none")][1].src]  # its own kernel only: nothing built early


def test_a_programs_intermediates_run_where_the_devices_views_may_start(views_at_4096):
  """The run tier places a program's intermediates as kc.CompiledProgram does: at the device's view alignment (on
  NVIDIA's OpenCL 512 bytes, where 256-byte offsets failed every program with two intermediates). EMU's allocator
  here refuses a view at any offset but a multiple of 4096, as OpenCL refuses one off its base alignment."""
  from kc_conformance.harness import launch
  from kc_conformance.programs import render_scheduled, several_kernels
  setup = setup_of("program_chain_of_intermediates")
  plan = several_kernels(setup.sink)
  assert plan is not None and any(t.offset % 4096 for t in plan.temps)
  outs = launch("EMU", render_scheduled(plan, kc.Device.renderer("EMU"), SPECS["hand"]), setup)
  for i, want in setup.expected.items():
    assert compare(i, outs[i], want, setup.dtypes[i], tolerance(setup.dtypes[i], "transcendental")).ok
