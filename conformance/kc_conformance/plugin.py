"""The pytest plugin (entry point `pytest11`): options, tier selection, expectations, and the report.

It is inert in any pytest run that does not collect the suite (kc_conformance.test_suite): installing kc-conformance
changes nothing for other test suites. `pytest --pyargs kc_conformance --kc-device=NAME` runs it.

Under pytest-xdist (`-n N`) the workers collect and run the tests and the controller writes the report: everything
the report needs travels in each test report's user_properties (its conformance id and tier, the recorded details),
which xdist hands to the controller's pytest_runtest_logreport. Workers write no report."""
from __future__ import annotations
import datetime
from typing import Optional
import pytest
from . import TIERS
from . import expectations as expect
from .checks import SEED
from .report import TestRecord, build, unmet_requirement, write

SUITE_MODULE = "kc_conformance.test_suite"
RUN_KEY = pytest.StashKey["ConformanceRun"]()


def pytest_addoption(parser):
  g = parser.getgroup("kc-conformance", "kc conformance suite")
  g.addoption("--kc-device", default=None, help="the device to certify (default: kc.Device.DEFAULT)")
  g.addoption("--kc-tier", default="run", choices=TIERS, help="run the tiers up to this one: render, compile or run (default: all)")
  g.addoption("--kc-report", action="append", default=[], metavar="FILE", help="write the report to FILE.json or FILE.html (repeatable)")
  g.addoption("--kc-expect", default=None, metavar="FILE", help="an expectation file of the backend's known failures")
  g.addoption("--kc-timeout", type=float, default=120.0, help="seconds a compile or run job may take before it counts as a crash")
  g.addoption("--kc-specs", default=None, metavar="KINDS",
              help="only the optimization choices of these kinds, comma-separated: none, hand, single, random, tc (default: all)")
  g.addoption("--kc-isolation", default="process", choices=("process", "none"),
              help="process (default): compile and run in a worker a crash cannot take the run down with; none: in this process")
  g.addoption("--kc-require-tier", default=None, choices=TIERS,
              help="fail the run when this tier did not run for a selected case (a device that cannot open here "
                   "skips it)")
  g.addoption("--kc-list", nargs="?", const="-", default=None, metavar="FILE",
              help="write the ids of the selected tests, one per line, to FILE (default: stdout), and run nothing")


class ConformanceRun:
  """What one run collects: the target, the records by node id, the expectations, and whatever stopped it."""

  def __init__(self, config):
    self.config = config
    self.active = False
    self.target = None
    self.setup_error: Optional[str] = None
    self.records: dict[str, TestRecord] = {}
    self.ids: dict[str, tuple[str, str]] = {}  # node id -> (tier, conformance test id)
    self.expectations: list[expect.Expectation] = []
    self.started = _now()
    self.tiers = list(TIERS[:TIERS.index(config.getoption("kc_tier")) + 1])
    self.unmet: list[tuple[str, str]] = []  # (test id, why) of the cases --kc-require-tier's tier did not run for

  def make_target(self):
    from .target import Target
    import kc
    try:
      device = self.config.getoption("kc_device") or kc.Device.DEFAULT
      kc.Device.spec(device)  # an unknown name fails here, with the registered names in the message
      self.target = Target(kc.Device.canonical(device), timeout=self.config.getoption("kc_timeout"),
                           isolate=self.config.getoption("kc_isolation") == "process")
    except Exception as e:
      self.setup_error = f"{type(e).__name__}: {e}"

  def write_reports(self):
    import kc
    paths = self.config.getoption("kc_report")
    if not paths: return
    device = self.target.describe() if self.target is not None else {"name": self.config.getoption("kc_device")}
    if self.target is not None and self.setup_error is None and "error" in device: self.setup_error = device["error"]
    doc = build(device=device, tests=list(self.records.values()), tiers=self.tiers, seed=SEED, started=self.started, finished=_now(),
                setup_error=self.setup_error, expectations=self.config.getoption("kc_expect"), kc_version=kc.__version__)
    for path in paths: write(doc, path)

  def pytest_runtest_logreport(self, report):
    """Registered as a plugin of its own (pytest_configure): every phase of every test adds to its record. A test
    belongs to the suite when it carries a kc_id (set at collection, so also on reports from xdist workers)."""
    props = dict(report.user_properties)
    if "kc_id" not in props: return
    self.active = True
    if "kc_setup_error" in props and self.setup_error is None: self.setup_error = props["kc_setup_error"]
    rec = self.records.get(report.nodeid)
    if rec is None: rec = self.records[report.nodeid] = TestRecord(props["kc_id"], report.nodeid, props.get("kc_tier", "setup"))
    rec.duration += report.duration
    if "kc_link" in props: rec.link = props["kc_link"]
    for key, name in (("kc_errors", "errors"), ("kc_program", "program"), ("kc_refused", "refused_opts"), ("kc_mismatches", "mismatches")):
      if key in props: rec.extra[name] = props[key]
    if "kc_cause" in props: rec.cause = tuple(props["kc_cause"])
    if "kc_source" in props: rec.source = props["kc_source"]
    xfail = hasattr(report, "wasxfail")
    if report.when == "setup":
      if report.failed: rec.outcome, rec.reason = "error", props.get("kc_reason") or _reason(report)
      elif report.skipped: rec.outcome, rec.reason = ("xfail" if xfail else "skip"), _reason(report)
    elif report.when == "call":
      if report.passed: rec.outcome, rec.reason = ("xpass", _reason(report)) if xfail else ("pass", None)
      elif report.skipped: rec.outcome, rec.reason = ("xfail" if xfail else "skip"), _reason(report)
      else: rec.outcome, rec.reason = ("crash" if "kc_crash" in props else "fail"), _reason(report)
    elif report.when == "teardown" and report.failed and rec.outcome not in ("fail", "crash", "error"):
      rec.outcome, rec.reason = "error", _reason(report)


def _now() -> str: return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def pytest_configure(config):
  _spec_kinds(config.getoption("kc_specs"))  # a bad --kc-specs is a usage error before anything is collected
  required, tier = config.getoption("kc_require_tier"), config.getoption("kc_tier")
  if required is not None and TIERS.index(required) > TIERS.index(tier):
    raise pytest.UsageError(f"--kc-require-tier {required} needs that tier to run, but --kc-tier {tier} stops "
                            "before it")
  if config.getoption("kc_list"): config.option.collectonly = True
  run = config.stash[RUN_KEY] = ConformanceRun(config)
  config.pluginmanager.register(run, "kc-conformance-run")
  config.addinivalue_line("markers", "kc_tier(name): the conformance tier of a test")


def _is_suite(item) -> bool:
  mod = getattr(item, "module", None)
  return mod is not None and mod.__name__ == SUITE_MODULE


def conformance_id(item) -> str:
  tier = item.get_closest_marker("kc_tier").args[0]
  return f"{tier}/{item.callspec.id}"


def is_xdist_worker(config) -> bool: return hasattr(config, "workerinput")


class SetupProblem(pytest.Item):
  """A problem that stops the run before any test (an unknown device), as one test that errors in setup: the run
  says it once, its exit status and its report show it."""
  error = pytest.UsageError

  def __init__(self, *, message: str, **kw):
    super().__init__(**kw)
    self.message = message
    self.user_properties += [("kc_id", self.name), ("kc_tier", "setup"), ("kc_reason", message)]

  def setup(self): raise self.error(self.message)
  def runtest(self): pass
  def reportinfo(self): return self.path, None, self.name
  def repr_failure(self, excinfo, style=None): return str(excinfo.value)


class ExpectationProblem(SetupProblem):
  """An expectation-file problem (a bad file, an entry that matches no test)."""
  error = expect.ExpectationError


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: an expectation problem is shown whatever is selected
def pytest_collection_modifyitems(session, config, items):
  run: ConformanceRun = config.stash[RUN_KEY]
  suite = [it for it in items if _is_suite(it)]
  if not suite: return
  run.active = True
  run.make_target()
  for it in suite:
    tier = it.get_closest_marker("kc_tier").args[0]
    run.ids[it.nodeid] = (tier, conformance_id(it))
    it.user_properties += [("kc_id", conformance_id(it)), ("kc_tier", tier)]
  kinds = _spec_kinds(config.getoption("kc_specs"))
  keep, drop = [], []
  for it in items:
    # without a target no test can run: they all go, and the one SetupProblem below says why
    if _is_suite(it) and (run.target is None or it.get_closest_marker("kc_tier").args[0] not in run.tiers or not _spec_selected(it, kinds)):
      drop.append(it)
    else: keep.append(it)
  if drop:
    config.hook.pytest_deselected(items=drop)
    items[:] = keep
  if config.getoption("kc_list"):
    _list(run, items)
    return
  if run.target is None:
    problem = SetupProblem.from_parent(session, name="setup", message=f"kc-conformance could not set up: {run.setup_error}")
    problem.user_properties.append(("kc_setup_error", run.setup_error))
    items.append(problem)
  if (path := config.getoption("kc_expect")):
    from .test_suite import ALL_IDS
    try: run.expectations = expect.load(path)
    except expect.ExpectationError as e: problems = [str(e)]
    else: problems = [f"expectation {e.test!r} ({e.reason}) matches no test of kc-conformance {_suite_version()}"
                      for e in expect.unmatched(run.expectations, ALL_IDS)]
    for i, msg in enumerate(problems):
      items.append(ExpectationProblem.from_parent(session, name=f"expectations[{i}]", message=msg))


def _list(run: ConformanceRun, items) -> None:
  """--kc-list: the selected tests' conformance ids, one per line (after -k, --kc-tier and --kc-specs), on stdout or
  in the file given."""
  if run.target is None: raise pytest.UsageError(f"kc-conformance could not set up: {run.setup_error}")
  text = "".join(run.ids[it.nodeid][1] + "\n" for it in items if _is_suite(it))
  if (path := run.config.getoption("kc_list")) == "-": print(text, end="", flush=True)
  else:
    with open(path, "w") as f: f.write(text)


def _spec_kinds(option: Optional[str]) -> Optional[frozenset[str]]:
  """The spec kinds --kc-specs selects, None for all; an unknown kind is a usage error naming the known ones."""
  if not option: return None
  from .specs import SPECS
  known = {s.kind for s in SPECS.values()}
  kinds = frozenset(k.strip() for k in option.split(",") if k.strip())
  if bad := kinds - known: raise pytest.UsageError(f"--kc-specs: unknown kind(s) {', '.join(sorted(bad))}; the kinds are {', '.join(sorted(known))}")
  return kinds


def _spec_selected(item, kinds: Optional[frozenset[str]]) -> bool:
  """A case/spec test whose spec is of a selected kind (the error-contract tests are not spec tests: always kept)."""
  if kinds is None: return True
  from .specs import SPECS
  check = item.callspec.params.get("check", "") if hasattr(item, "callspec") else ""
  case, _, spec = check.partition("/")
  return case == "opt_errors" or spec not in SPECS or SPECS[spec].kind in kinds


def _suite_version():
  from . import SUITE_VERSION
  return SUITE_VERSION


@pytest.fixture(scope="session")
def kc_target(request):
  run: ConformanceRun = request.config.stash[RUN_KEY]
  if run.target is None: raise pytest.UsageError(f"kc-conformance could not set up: {run.setup_error}")
  try: run.target.renderer  # noqa: B018  (made here, by the first test, never at collection)
  except Exception as e:
    run.setup_error = f"the renderer of {run.target.device} could not be made: {type(e).__name__}: {e}"
    raise
  yield run.target
  run.target.close()


@pytest.fixture
def kc_record(request):
  """record(name, value): a detail of this test for the report (pytest's record_property warns under JUnit's xunit2)."""
  return lambda name, value: request.node.user_properties.append((name, value))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
  run: ConformanceRun = item.config.stash[RUN_KEY]
  if not (run.active and _is_suite(item) and run.expectations and run.target is not None): return
  try: arch = run.target.arch
  except Exception: arch = ""
  if (e := expect.first_match(run.expectations, conformance_id(item), arch)) is None: return
  item.user_properties.append(("kc_link", e.link))
  if e.outcome == "skip": pytest.skip(f"expected: {e.reason} ({e.link})")
  item.add_marker(pytest.mark.xfail(reason=f"{e.reason} ({e.link})", strict=False))


def _reason(report) -> Optional[str]:
  if report.skipped and isinstance(report.longrepr, tuple): return str(report.longrepr[2]).removeprefix("Skipped: ")
  if hasattr(report, "wasxfail") and report.wasxfail: return str(report.wasxfail).removeprefix("reason: ")
  if report.failed:
    if (crash := getattr(report.longrepr, "reprcrash", None)) is not None and crash.message: return crash.message.removeprefix("Failed: ")
    text = getattr(report, "longreprtext", "") or str(report.longrepr)
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].removeprefix("E").strip() if lines else None
  return None


def pytest_sessionfinish(session, exitstatus):
  run: ConformanceRun = session.config.stash[RUN_KEY]
  if is_xdist_worker(session.config): return  # the controller writes the report from the workers' test reports
  if not run.active and not session.config.getoption("kc_device"): return
  if run.target is None and run.setup_error is None: run.make_target()  # under xdist only the workers made one
  if run.setup_error is not None and exitstatus == 0: session.exitstatus = pytest.ExitCode.TESTS_FAILED
  if (required := session.config.getoption("kc_require_tier")) and not session.config.option.collectonly:
    run.unmet = unmet_requirement(list(run.records.values()), required)
    if run.unmet and session.exitstatus == 0: session.exitstatus = pytest.ExitCode.TESTS_FAILED
  run.write_reports()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
  run: ConformanceRun = config.stash[RUN_KEY]
  if not run.active or is_xdist_worker(config): return
  from .report import coverage_line, failure_groups, summarize, summary_lines
  s = summarize(list(run.records.values()))
  dev = run.target.device if run.target is not None else config.getoption("kc_device")
  terminalreporter.write_sep("=", f"kc conformance {dev}: {s['passed']} passed, {s['failed']} failed, {s['crashed']} crashed, "
                                   f"{s['errors']} errors, {s['xfailed']} xfailed, {s['xpassed']} xpassed, {s['skipped']} skipped "
                                   f"({', '.join(f'{k} {v}' for k, v in sorted(s['skipped_by_reason'].items())) or 'none'})")
  terminalreporter.write_line(coverage_line(list(run.records.values()), run.tiers))
  if run.unmet:
    test, why = run.unmet[0]
    cases = f"{len(run.unmet)} selected case{'s' if len(run.unmet) > 1 else ''}"
    terminalreporter.write_line(f"--kc-require-tier {config.getoption('kc_require_tier')}: that tier did not run for "
                                f"{cases}, e.g. {test} ({why})", red=True)
  if run.setup_error: terminalreporter.write_line(f"setup error: {run.setup_error}", red=True)
  groups = failure_groups(list(run.records.values()), dev, config.getoption("kc_expect"))
  if groups:
    terminalreporter.write_line(f"failures by cause ({len(groups)}):")
    for line in summary_lines(groups): terminalreporter.write_line(line)
  for path in config.getoption("kc_report"): terminalreporter.write_line(f"report: {path}")
