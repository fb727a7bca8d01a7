"""Plugins across kc versions: the plugin API version is MAJOR.MINOR and a plugin built for an older minor of this
kc's major loads (one built for another major, or a newer minor, is refused, naming both versions and the accepted
range); KC_DISABLE_PLUGINS turns a plugin off without uninstalling it, and `kc devices` says so."""
import json, subprocess, sys, types, warnings
from dataclasses import dataclass
import pytest
from hypothesis import given, strategies as st
from kc.errors import PluginError
from kc.runtime.device import CompiledDevice, DeviceRegistry, HostAllocator
from kc.runtime.plugins import (PLUGIN_API_VERSION, ApiVersion, BackendSpec, PluginTable, PluginWarning, accepted_range,
                                api_compatible, hookimpl, validate_spec)

MAJOR, MINOR = PLUGIN_API_VERSION.major, PLUGIN_API_VERSION.minor


@dataclass
class Dist:
  name: str
  version: str
  metadata = None


class EntryPoint:
  """An installed plugin's entry point: load() returns the plugin module (or raises), and counts how often it ran."""
  def __init__(self, name, obj=None, error=None, dist=None):
    self.name, self.value, self._obj, self._error, self.loads = name, f"kc_{name}", obj, error, 0
    self.dist = dist or Dist(f"kc-{name}", "1.0.0")

  def load(self):
    self.loads += 1
    if self._error is not None: raise self._error
    return self._obj


def plugin(name: str, api) -> types.ModuleType:
  """A plugin module offering device `name`, declaring plugin API `api`."""
  mod = types.ModuleType(f"kc_{name.lower()}")
  dev = CompiledDevice(name, HostAllocator(), None, None, lambda n, lib: None)
  @hookimpl
  def kc_backends():
    return [BackendSpec(name=name, api_version=api, priority=0, available=lambda: None, open=lambda: dev)]
  mod.kc_backends = kc_backends
  return mod


def registry(*eps) -> DeviceRegistry: return DeviceRegistry(PluginTable(entry_points=lambda: list(eps)))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
  for var in ("KC_DEVICE", "KC_STRICT_PLUGINS", "KC_DISABLE_PLUGINS"): monkeypatch.delenv(var, raising=False)


# ------------------------------------------------------------------------------------------------ versions as a range

def test_an_int_is_the_major_of_a_plugin_built_for_api_1():
  assert ApiVersion.of(1) == ApiVersion(1, 0) == 1 and hash(ApiVersion(1, 0)) == hash(1)
  assert ApiVersion(1, 1) != 1 and ApiVersion(1, 1) > 1 and ApiVersion(1, 0) < ApiVersion(1, 1) < ApiVersion(2)
  assert str(ApiVersion(1, 1)) == "1.1" and PLUGIN_API_VERSION >= 0
  for bad in ("1.1", 1.1, None, True, -1): assert ApiVersion.of(bad) is None


@pytest.mark.parametrize("parts", [(1, -1), (-1, 0), (1.0, 0), (1, "1"), (True, 0)], ids=str)
def test_a_version_of_other_parts_is_a_plugin_error(parts):
  with pytest.raises(PluginError, match="two ints >= 0"): ApiVersion(*parts)


@pytest.mark.filterwarnings("ignore::kc.runtime.plugins.PluginWarning")
@given(st.integers(0, MAJOR + 2), st.integers(0, MINOR + 3))
def test_a_plugin_loads_exactly_when_its_major_is_ours_and_its_minor_no_newer(major, minor):
  version = ApiVersion(major, minor)
  fits = major == MAJOR and minor <= MINOR
  assert api_compatible(version) == fits
  reg = registry(EntryPoint("probe", plugin("PROBE", version), dist=Dist("kc-probe", "3.4")))
  assert ("PROBE" in reg.names()) == fits
  if not fits:
    msg = reg.errors()["probe"]
    assert "kc-probe 3.4" in msg and f"plugin API {version} " in msg and f"plugin API {PLUGIN_API_VERSION} " in msg
    assert accepted_range() in msg and accepted_range() == f"{MAJOR}.0 to {MAJOR}.{MINOR}"


def test_a_plugin_built_for_an_older_minor_loads_beside_a_current_one():
  old = EntryPoint("old", plugin("OLD", MAJOR))                       # built for API 1, which said the int 1
  older_minor = EntryPoint("mid", plugin("MID", ApiVersion(MAJOR, 0)))
  current = EntryPoint("new", plugin("NEW", PLUGIN_API_VERSION))
  reg = registry(old, older_minor, current)
  assert sorted(reg.names()) == ["MID", "NEW", "OLD"] and reg.errors() == {}


def test_a_newer_minor_or_another_major_is_refused_naming_both_versions_and_the_range():
  newer = ApiVersion(MAJOR, MINOR + 1)
  with pytest.raises(PluginError) as info: validate_spec(plugin("NEWER", newer).kc_backends()[0], "kc-newer 2.0")
  msg = str(info.value)
  assert f"kc-newer 2.0 speaks kc plugin API {newer} (device NEWER)" in msg
  assert f"this kc speaks plugin API {PLUGIN_API_VERSION}" in msg
  assert f"loads plugins built for {MAJOR}.0 to {PLUGIN_API_VERSION}" in msg
  with pytest.raises(PluginError, match=f"speaks kc plugin API {MAJOR + 1}.0 .* {MAJOR}.0 to {PLUGIN_API_VERSION}"):
    validate_spec(plugin("NEXT", ApiVersion(MAJOR + 1)).kc_backends()[0], "kc-next 9.0")


@pytest.mark.parametrize("api", ["1.1", 1.1, None, True], ids=repr)
def test_an_api_version_that_is_no_version_is_refused(api):
  with pytest.raises(PluginError, match="is not one: pass kc.backend.PLUGIN_API_VERSION"):
    validate_spec(plugin("ODD", api).kc_backends()[0], "kc-odd 1.0")


# -------------------------------------------------------------------------------------------------- KC_DISABLE_PLUGINS

@pytest.mark.parametrize("setting", ["broken", "kc-broken", "KC_Broken", " other , kc.broken "])
def test_a_disabled_plugin_is_not_even_imported_and_is_listed(monkeypatch, setting):
  monkeypatch.setenv("KC_STRICT_PLUGINS", "1")  # its import error would raise: it never runs
  broken = EntryPoint("broken", error=ImportError("No module named 'pyfoo'"))
  other = EntryPoint("other", plugin("OTHER", PLUGIN_API_VERSION))
  monkeypatch.setenv("KC_DISABLE_PLUGINS", setting)
  reg = registry(broken, other, EntryPoint("fine", plugin("FINE", PLUGIN_API_VERSION)))
  expected = ["FINE"] if "other" in setting else ["FINE", "OTHER"]
  assert reg.names() == expected and reg.errors() == {} and broken.loads == 0
  assert reg.table.disabled()["broken"] == "kc-broken 1.0.0"


def test_without_the_setting_the_broken_plugin_is_loaded_and_recorded():
  broken = EntryPoint("broken", error=ImportError("No module named 'pyfoo'"))
  reg = registry(broken, EntryPoint("fine", plugin("FINE", PLUGIN_API_VERSION)))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", PluginWarning)
    assert reg.names() == ["FINE"] and "pyfoo" in reg.errors()["broken"]
  assert broken.loads == 1 and reg.table.disabled() == {}


def test_a_name_no_plugin_has_is_warned_about(monkeypatch):
  monkeypatch.setenv("KC_DISABLE_PLUGINS", "kc-fine,kc-typo")
  reg = registry(EntryPoint("fine", plugin("FINE", PLUGIN_API_VERSION)))
  unknown = r"KC_DISABLE_PLUGINS names kc-typo, which no installed plugin is called .* fine, kc-fine"
  with pytest.warns(PluginWarning, match=unknown):
    assert reg.names() == []
  assert reg.table.disabled() == {"fine": "kc-fine 1.0.0"}


def _kc(*args: str, **env: str) -> subprocess.CompletedProcess:
  import os
  return subprocess.run([sys.executable, "-m", "kc.tools.cli", *args], capture_output=True, text=True, timeout=120,
                        env={**os.environ, "KC_DEVICE": "", **env})


def test_kc_devices_shows_a_disabled_plugin():
  out = _kc("devices", KC_DISABLE_PLUGINS="kc-opencl")
  assert out.returncode == 0, out.stderr
  assert "disabled plugin opencl: kc-opencl " in out.stdout and "(KC_DISABLE_PLUGINS)" in out.stdout
  assert not any(line.startswith("OPENCL ") for line in out.stdout.splitlines())
  shown = json.loads(_kc("devices", "--json", KC_DISABLE_PLUGINS="opencl").stdout)
  assert list(shown["disabled"]) == ["opencl"] and "OPENCL" not in [row["device"] for row in shown["devices"]]
  assert json.loads(_kc("devices", "--json").stdout)["disabled"] == {}
