"""The pytest plugin (entry point `pytest11`): options, tier selection, expectations, and the report.

It is inert in any pytest run that does not collect the suite (kc_conformance.test_suite): installing kc-conformance
changes nothing for other test suites. `pytest --pyargs kc_conformance --kc-device=NAME` runs it."""
from __future__ import annotations
import datetime
from typing import Optional
import pytest
from . import TIERS
from . import expectations as expect
from .checks import SEED
from .report import TestRecord, build, write

SUITE_MODULE = "kc_conformance.test_suite"
RUN_KEY = pytest.StashKey["ConformanceRun"]()


def pytest_addoption(parser):
  g = parser.getgroup("kc-conformance", "kc conformance suite")
  g.addoption("--kc-device", default=None, help="the device to certify (default: kc.Device.DEFAULT)")
  g.addoption("--kc-tier", default="run", choices=TIERS, help="run the tiers up to this one: render, compile or run (default: all)")
  g.addoption("--kc-report", action="append", default=[], metavar="FILE", help="write the report to FILE.json or FILE.html (repeatable)")
  g.addoption("--kc-expect", default=None, metavar="FILE", help="an expectation file of the backend's known failures")
  g.addoption("--kc-timeout", type=float, default=120.0, help="seconds a compile or run job may take before it counts as a crash")
  g.addoption("--kc-isolation", default="process", choices=("process", "none"),
              help="process (default): compile and run in a worker a crash cannot take the run down with; none: in this process")


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
    """Registered as a plugin of its own (pytest_configure): every phase of every test adds to its record."""
    if not self.active: return
    props = dict(report.user_properties)
    rec = self.records.get(report.nodeid)
    if rec is None:
      tier, test_id = self.ids.get(report.nodeid, ("setup", report.nodeid.split("::")[-1]))
      rec = self.records[report.nodeid] = TestRecord(test_id, report.nodeid, tier)
    rec.duration += report.duration
    if "kc_link" in props: rec.link = props["kc_link"]
    for key, name in (("kc_errors", "errors"), ("kc_program", "program"), ("kc_refused", "refused_opts")):
      if key in props: rec.extra[name] = props[key]
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
  run = config.stash[RUN_KEY] = ConformanceRun(config)
  config.pluginmanager.register(run, "kc-conformance-run")
  config.addinivalue_line("markers", "kc_tier(name): the conformance tier of a test")


def _is_suite(item) -> bool:
  mod = getattr(item, "module", None)
  return mod is not None and mod.__name__ == SUITE_MODULE


def conformance_id(item) -> str:
  tier = item.get_closest_marker("kc_tier").args[0]
  return f"{tier}/{item.callspec.id}"


class ExpectationProblem(pytest.Item):
  """An expectation-file problem as a test that errors in setup, so the run, its exit status and its report show it."""

  def __init__(self, *, message: str, **kw):
    super().__init__(**kw)
    self.message = message
    self.user_properties.append(("kc_reason", message))

  def setup(self): raise expect.ExpectationError(self.message)
  def runtest(self): pass
  def reportinfo(self): return self.path, None, self.name
  def repr_failure(self, excinfo, style=None): return str(excinfo.value)


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: an expectation problem is shown whatever is selected
def pytest_collection_modifyitems(session, config, items):
  run: ConformanceRun = config.stash[RUN_KEY]
  suite = [it for it in items if _is_suite(it)]
  if not suite: return
  run.active = True
  run.make_target()
  for it in suite: run.ids[it.nodeid] = (it.get_closest_marker("kc_tier").args[0], conformance_id(it))
  keep, drop = [], []
  for it in items:
    if _is_suite(it) and it.get_closest_marker("kc_tier").args[0] not in run.tiers: drop.append(it)
    else: keep.append(it)
  if drop:
    config.hook.pytest_deselected(items=drop)
    items[:] = keep
  if (path := config.getoption("kc_expect")):
    from .test_suite import ALL_IDS
    try: run.expectations = expect.load(path)
    except expect.ExpectationError as e: problems = [str(e)]
    else: problems = [f"expectation {e.test!r} ({e.reason}) matches no test of kc-conformance {_suite_version()}"
                      for e in expect.unmatched(run.expectations, ALL_IDS)]
    for i, msg in enumerate(problems):
      items.append(ExpectationProblem.from_parent(session, name=f"expectations[{i}]", message=msg))


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
  if not run.active and not session.config.getoption("kc_device"): return
  if run.setup_error is not None and exitstatus == 0: session.exitstatus = pytest.ExitCode.TESTS_FAILED
  run.write_reports()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
  run: ConformanceRun = config.stash[RUN_KEY]
  if not run.active: return
  from .report import summarize
  s = summarize(list(run.records.values()))
  dev = run.target.device if run.target is not None else config.getoption("kc_device")
  terminalreporter.write_sep("=", f"kc conformance {dev}: {s['passed']} passed, {s['failed']} failed, {s['crashed']} crashed, "
                                   f"{s['errors']} errors, {s['xfailed']} xfailed, {s['xpassed']} xpassed, {s['skipped']} skipped "
                                   f"({', '.join(f'{k} {v}' for k, v in sorted(s['skipped_by_reason'].items())) or 'none'})")
  if run.setup_error: terminalreporter.write_line(f"setup error: {run.setup_error}", red=True)
  for path in config.getoption("kc_report"): terminalreporter.write_line(f"report: {path}")
