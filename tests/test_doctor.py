"""`kc doctor` and the default device with devices that are installed but broken: a device that should open on any
machine (BackendSpec.expected_everywhere) and cannot is a problem, as is a failed BackendSpec.self_test; a device
that is merely absent (no GPU) is not. kc.Device.DEFAULT warns once when it falls back past a broken device."""
import os, subprocess, sys, warnings
import pytest
import kc
from kc.tools import cli
from kc.runtime import device as device_module
from kc.runtime.device import DeviceRegistry
from kc.runtime.plugins import PLUGIN_API_VERSION, BackendSpec, PluginTable, PluginWarning


def _spec(name, priority, reason=None, expected=False, self_test=None):
  """A device that opens (doctor's smoke test is faked by the fixture) or cannot open for `reason`."""
  return BackendSpec(name=name, api_version=PLUGIN_API_VERSION, priority=priority, available=lambda: reason,
                     open=lambda: None, distribution=f"kc-{name.lower()}", version="1.0", self_test=self_test,
                     expected_everywhere=expected)


@pytest.fixture
def registry(monkeypatch):
  """kc.Device replaced by a registry with no plugins, for doctor and the tests to register fake devices in; doctor's
  smoke test (the add example) passes on every device that opens."""
  reg = DeviceRegistry(PluginTable(entry_points=lambda: []))
  monkeypatch.setattr(device_module, "Device", reg)
  monkeypatch.setattr(cli, "_run_example", lambda name, device, opts: (0.0, 1e-5))
  monkeypatch.delenv("KC_DEVICE", raising=False)
  return reg


def _doctor(capsys) -> tuple[int, str]:
  rc = cli.main(["doctor"])
  return rc, capsys.readouterr().out


def test_an_absent_device_is_not_a_problem(registry, capsys):
  registry.table.register(_spec("GPU", 100, reason="no GPU driver here"))
  registry.table.register(_spec("CPU", 10))
  rc, out = _doctor(capsys)
  assert rc == 0 and "GPU: unavailable (no GPU driver here)" in out and "CPU: ok" in out and "no problems found" in out


def test_an_installed_device_that_cannot_open_is_a_problem(registry, capsys):
  registry.table.register(_spec("CPU", 10, reason="no C compiler: 'nonexistent-cc' is not on PATH", expected=True))
  registry.table.register(_spec("OTHER", 5))
  rc, out = _doctor(capsys)
  assert rc == 1 and "1 problem found" in out
  line = next(ln for ln in out.splitlines() if ln.startswith("CPU:"))
  assert "BROKEN" in line and "kc-cpu 1.0" in line and "'nonexistent-cc' is not on PATH" in line


def test_a_failed_self_test_is_a_problem(registry, capsys):
  problem = "gave 255 where numpy gives 1; compiler 'cc': gcc 12, flags '-O2'"
  registry.table.register(_spec("CPU", 10, self_test=lambda: {"known bug cc12-thing": problem, "canary add": None}))
  rc, out = _doctor(capsys)
  assert rc == 1 and "CPU: ok" in out and "1 problem found" in out
  assert f"CPU: self-test known bug cc12-thing: WRONG: {problem}" in out


@pytest.mark.parametrize("self_test, says", [
  (lambda: {"a": None, "b": None}, "CPU: self-test ok (2 checks)"),
  (lambda: 1 / 0, "CPU: self-test FAILED (ZeroDivisionError"),
  (lambda: ["not a dict"], "CPU: self-test FAILED (it returned list"),
])
def test_self_test_outcomes(registry, capsys, self_test, says):
  registry.table.register(_spec("CPU", 10, self_test=self_test))
  rc, out = _doctor(capsys)
  assert says in out and rc == (0 if "ok" in says else 1)


def test_default_warns_once_when_it_falls_back_past_a_broken_device(registry):
  registry.table.register(_spec("GPU", 100, reason="no GPU driver here"))             # absent: no warning
  registry.table.register(_spec("CPU", 10, reason="no C compiler", expected=True))    # broken: one warning
  registry.table.register(_spec("SLOW", 5))
  with pytest.warns(PluginWarning, match=r"device CPU \(kc-cpu 1.0\) is installed but cannot open here: no C compiler. "
                                         r"The default device is SLOW instead"):
    assert registry.DEFAULT == "SLOW"
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert registry.DEFAULT == "SLOW"  # once


def test_default_says_nothing_when_the_broken_device_ranks_lower_or_is_chosen(registry, monkeypatch):
  registry.table.register(_spec("CPU", 10))
  registry.table.register(_spec("SLOW", 5, reason="broken", expected=True))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert registry.DEFAULT == "CPU"
    registry.table.register(_spec("BEST", 50, reason="broken", expected=True))
    monkeypatch.setenv("KC_DEVICE", "SLOW")  # an explicit choice falls back past nothing
    assert registry.DEFAULT == "SLOW"


def test_a_compiler_that_does_not_exist(tmp_path):
  """KC_CC=nonexistent-cc: CLANG cannot open; doctor says so and fails, and the default device warns that it moved."""
  pytest.importorskip("kc_clang")
  env = {**os.environ, "KC_CC": "nonexistent-cc", "KC_CACHE_DIR": str(tmp_path)}
  env.pop("KC_DEVICE", None)
  r = subprocess.run([sys.executable, "-m", "kc.tools.cli", "doctor"], capture_output=True, text=True, env=env, timeout=600)
  clang = next(ln for ln in r.stdout.splitlines() if ln.startswith("CLANG:"))
  assert r.returncode == 1 and "BROKEN" in clang and "'nonexistent-cc' is not on PATH" in clang, r.stdout + r.stderr
  code = "import kc\nprint(kc.Device.DEFAULT)\nprint(kc.Device.DEFAULT)\n"
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
  if "CLANG" in kc.Device.names() and kc.Device.names().index("CLANG") < kc.Device.names().index(r.stdout.split()[0]):
    assert r.stderr.count("PluginWarning: device CLANG (kc-clang") == 1, r.stderr
