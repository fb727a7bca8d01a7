"""Plugin discovery and the device registry, with fake entry points: broken plugins are recorded and never stop
the others, API versions are checked, KC_STRICT_PLUGINS turns failures into errors, defaults follow KC_DEVICE
and priority."""
import subprocess, sys, types
from dataclasses import dataclass
import pytest
import kc
from kc.runtime.device import Compiler, CompiledDevice, DeviceRegistry, HostAllocator
from kc.errors import DeviceUnavailable, KcError, PluginError
from kc.runtime.plugins import PLUGIN_API_VERSION, ApiVersion, BackendSpec, PluginTable, hookimpl
from kc.renderer import Renderer


class EchoCompiler(Compiler):
  """A compiler whose binary is the source: the plugin tests open devices but never run kernels."""
  def compile_uncached(self, src): return src.encode()


class FakeRenderer(Renderer):
  def __init__(self, device): self.device = device
  def render(self, name, uops): return f"// {self.device} {name}"


@dataclass
class FakeDist:
  name: str
  version: str
  metadata = None


class FakeEntryPoint:
  def __init__(self, name, obj=None, error=None, dist=None):
    self.name, self.value, self._obj, self._error = name, f"kc_{name}", obj, error
    self.dist = dist or FakeDist(f"kc-{name}", "1.2.3")
  def load(self):
    if self._error is not None: raise self._error
    return self._obj


class Opens:
  """Counts how often each device is opened."""
  def __init__(self): self.count: dict[str, int] = {}
  def __call__(self, name):
    def open_device():
      self.count[name] = self.count.get(name, 0) + 1
      return CompiledDevice(name, HostAllocator(), FakeRenderer(name), EchoCompiler(), lambda n, lib: None)
    return open_device


def spec(name, priority=0, reason=None, opener=None, api=PLUGIN_API_VERSION, renderer=True, available=None):
  return BackendSpec(name=name, api_version=api, priority=priority, available=available or (lambda: reason),
                     open=opener or Opens()(name), renderer=(lambda: FakeRenderer(name)) if renderer else None)


def plugin(*specs):
  """A plugin module whose kc_backends hook offers `specs`."""
  mod = types.ModuleType("fake_plugin")
  @hookimpl
  def kc_backends(): return list(specs)
  mod.kc_backends = kc_backends
  return mod


def registry(*eps):
  return DeviceRegistry(PluginTable(entry_points=lambda: list(eps)))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
  monkeypatch.delenv("KC_DEVICE", raising=False)
  monkeypatch.delenv("KC_STRICT_PLUGINS", raising=False)


# ------------------------------------------------------------------------------------------------------------ loading

def test_a_broken_plugin_is_recorded_and_the_others_load():
  reg = registry(FakeEntryPoint("alpha", plugin(spec("ALPHA"))),
                 FakeEntryPoint("broken", error=ImportError("No module named 'pyfoo'")),
                 FakeEntryPoint("zeta", plugin(spec("ZETA"))))
  assert reg.names() == ["ALPHA", "ZETA"]
  errs = reg.errors()
  assert list(errs) == ["broken"]
  assert "kc-broken 1.2.3" in errs["broken"] and "ImportError" in errs["broken"] and "pyfoo" in errs["broken"]
  assert reg["zeta"].name == "ZETA"


def test_a_plugin_whose_hook_raises_or_is_missing_is_recorded():
  def bad(): raise RuntimeError("cannot find libfoo.so")
  raising = types.ModuleType("raising")
  raising.kc_backends = hookimpl(bad, specname="kc_backends")
  reg = registry(FakeEntryPoint("raising", raising), FakeEntryPoint("empty", types.ModuleType("empty")),
                 FakeEntryPoint("notaspec", plugin("CUDA")), FakeEntryPoint("ok", plugin(spec("OK"))))
  errs = reg.errors()
  assert "libfoo.so" in errs["raising"]
  assert "no kc_backends hook" in errs["empty"]
  assert "not a kc.runtime.plugins.BackendSpec" in errs["notaspec"]
  assert reg.names() == ["OK"]


def test_wrong_api_version_names_the_distribution_and_both_versions():
  future = ApiVersion(PLUGIN_API_VERSION.major + 1)
  reg = registry(FakeEntryPoint("future", plugin(spec("FUTURE", api=future)), dist=FakeDist("kc-future", "9.0")),
                 FakeEntryPoint("ok", plugin(spec("OK"))))
  msg = reg.errors()["future"]
  assert "kc-future 9.0" in msg and f"API {future}" in msg and f"API {PLUGIN_API_VERSION}" in msg
  assert reg.names() == ["OK"]
  with pytest.raises(PluginError, match=f"kc-future 9.0 speaks kc plugin API 0.0 .* this kc speaks plugin API {PLUGIN_API_VERSION}"):
    kc.runtime.plugins.validate_spec(spec("FUTURE", api=0), "kc-future 9.0")


def test_strict_plugins_turns_a_failure_into_an_error(monkeypatch):
  monkeypatch.setenv("KC_STRICT_PLUGINS", "1")
  reg = registry(FakeEntryPoint("ok", plugin(spec("OK"))), FakeEntryPoint("broken", error=ImportError("gone")))
  for _ in range(2):  # and keeps failing: a strict load is never half done
    with pytest.raises(PluginError, match="kc-broken 1.2.3.*gone.*KC_STRICT_PLUGINS"):
      reg.names()
  monkeypatch.setenv("KC_STRICT_PLUGINS", "0")
  assert reg.names() == ["OK"] and "broken" in reg.errors()


def test_duplicate_device_names_keep_the_first_and_record_the_second():
  reg = registry(FakeEntryPoint("a", plugin(spec("SAME", priority=1))), FakeEntryPoint("b", plugin(spec("same", priority=2))))
  assert reg.names() == ["SAME"] and reg.spec("SAME").distribution == "kc-a"
  assert "kc-b 1.2.3" in reg.errors()["SAME"] and "kc-a 1.2.3 registered it first" in reg.errors()["SAME"]


def test_an_availability_check_that_raises_is_recorded_and_means_unavailable(monkeypatch):
  def check(): raise OSError("driver crashed")
  reg = registry(FakeEntryPoint("flaky", plugin(spec("FLAKY", priority=5, available=check))), FakeEntryPoint("ok", plugin(spec("OK"))))
  assert reg.available() == ["OK"] and reg.DEFAULT == "OK"
  assert "driver crashed" in reg.errors()["FLAKY"]
  with pytest.raises(DeviceUnavailable, match="driver crashed"):
    reg["FLAKY"]
  monkeypatch.setenv("KC_STRICT_PLUGINS", "1")
  with pytest.raises(PluginError, match="driver crashed"):
    registry(FakeEntryPoint("flaky", plugin(spec("FLAKY", available=check)))).available()


def test_pluggy_rejects_a_hook_with_a_bad_signature():
  mod = types.ModuleType("badsig")
  @hookimpl
  def kc_backends(config): return []
  mod.kc_backends = kc_backends
  reg = registry(FakeEntryPoint("badsig", mod), FakeEntryPoint("ok", plugin(spec("OK"))))
  assert "config" in reg.errors()["badsig"] and reg.names() == ["OK"]


def test_listing_entry_points_failing_is_recorded():
  def boom(): raise RuntimeError("broken metadata")
  reg = DeviceRegistry(PluginTable(entry_points=boom))
  assert reg.names() == [] and "broken metadata" in reg.errors()["kc.backends"]


# ------------------------------------------------------------------------------------------------------------ devices

def test_devices_open_lazily_once_and_by_any_case():
  opens = Opens()
  reg = registry(FakeEntryPoint("lazy", plugin(spec("LAZY", opener=opens("LAZY")))))
  assert reg.names() == ["LAZY"] and reg.available() == ["LAZY"] and opens.count == {}
  d = reg["lazy"]
  assert d is reg["Lazy"] is reg["LAZY"] and opens.count == {"LAZY": 1}
  assert d.name == "LAZY" and d.renderer.device == "LAZY"


def test_unknown_device_lists_the_known_ones():
  reg = registry(FakeEntryPoint("a", plugin(spec("AAA"))), FakeEntryPoint("b", plugin(spec("BBB"))))
  with pytest.raises(KcError, match="unknown device 'QQQ'.*AAA, BBB"):
    reg["QQQ"]


def test_an_unavailable_device_says_why_and_still_gives_its_renderer():
  opens = Opens()
  reg = registry(FakeEntryPoint("gpu", plugin(spec("GPU", priority=50, reason="no NVIDIA driver found (libcuda.so)",
                                                   opener=opens("GPU")))),
                 FakeEntryPoint("cpu", plugin(spec("CPU", priority=10))))
  assert reg.names() == ["GPU", "CPU"] and reg.available() == ["CPU"]
  assert reg.unavailable_reason("gpu") == "no NVIDIA driver found (libcuda.so)"
  with pytest.raises(DeviceUnavailable, match="GPU cannot open here: no NVIDIA driver"):
    reg["GPU"]
  r = reg.renderer("gpu")
  assert isinstance(r, FakeRenderer) and r.device == "GPU" and opens.count == {}
  assert reg.DEFAULT == "CPU"  # the higher priority is skipped because it cannot open


def test_renderer_of_a_device_without_a_renderer_factory():
  reg = registry(FakeEntryPoint("up", plugin(spec("UP", renderer=False))),
                 FakeEntryPoint("down", plugin(spec("DOWN", renderer=False, reason="not macOS"))))
  assert reg.renderer("UP").device == "UP"  # available: taken from the opened device
  with pytest.raises(DeviceUnavailable, match="not macOS.*BackendSpec.renderer"):
    reg.renderer("DOWN")
  bare = CompiledDevice("BARE", HostAllocator(), None, EchoCompiler(), lambda n, lib: None)
  reg2 = registry(FakeEntryPoint("bare", plugin(spec("BARE", renderer=False, opener=lambda: bare))))
  with pytest.raises(KcError, match="BARE from kc-bare 1.2.3 has no renderer"):
    reg2.renderer("bare")


def test_a_device_that_fails_to_open_raises_device_unavailable():
  def explode(): raise RuntimeError("context creation failed")
  reg = registry(FakeEntryPoint("x", plugin(spec("X", opener=explode))))
  with pytest.raises(DeviceUnavailable, match="X .*kc-x 1.2.3.*context creation failed"):
    reg["X"]


def test_default_is_the_highest_priority_available_device():
  reg = registry(FakeEntryPoint("low", plugin(spec("LOW", priority=1))), FakeEntryPoint("high", plugin(spec("HIGH", priority=99))),
                 FakeEntryPoint("mid", plugin(spec("MID", priority=50))))
  assert reg.names() == ["HIGH", "MID", "LOW"] and reg.DEFAULT == "HIGH"


def test_kc_device_picks_the_default(monkeypatch):
  reg = registry(FakeEntryPoint("low", plugin(spec("LOW", priority=1))), FakeEntryPoint("high", plugin(spec("HIGH", priority=99))))
  monkeypatch.setenv("KC_DEVICE", "low")
  assert reg.DEFAULT == "LOW"
  monkeypatch.setenv("KC_DEVICE", "nosuch")
  with pytest.raises(KcError, match="unknown device 'nosuch'"):
    reg.DEFAULT
  reg.DEFAULT = "high"
  assert reg.DEFAULT == "HIGH"


def test_no_available_device_explains_each():
  reg = registry(FakeEntryPoint("gpu", plugin(spec("GPU", reason="no GPU"))))
  with pytest.raises(DeviceUnavailable, match="GPU: no GPU"):
    reg.DEFAULT


def test_programmatic_register_and_its_duplicates():
  table = PluginTable(entry_points=lambda: [FakeEntryPoint("disk", plugin(spec("DISK")))])
  reg = DeviceRegistry(table)
  table.register(spec("MEM", priority=3))
  assert reg.names() == ["MEM", "DISK"] and reg.spec("MEM").origin == "an in-process backend"
  with pytest.raises(PluginError, match="DISK is already registered by kc-disk 1.2.3"):
    table.register(spec("disk"))
  first = reg["MEM"]
  table.register(spec("MEM", priority=3), replace=True)
  assert reg["MEM"] is not first  # a replaced backend is opened anew
  with pytest.raises(PluginError, match="device name"):
    table.register(spec("9lives"))


def test_an_entry_point_cannot_take_an_in_process_name():
  table = PluginTable(entry_points=lambda: [FakeEntryPoint("mem", plugin(spec("MEM")))])
  table.register(spec("MEM"))
  assert table.specs()["MEM"].distribution == "" and "registered it first" in table.errors()["MEM"]


# ------------------------------------------------------------------------------------------------------------ the real kc

def test_import_kc_does_not_discover_plugins():
  code = ("import sys, kc; from kc.runtime import plugins; "
          "assert not plugins.BACKENDS._loaded; assert not [m for m in sys.modules if m.startswith('kc_')]; "
          "kc.Device.names(); assert plugins.BACKENDS._loaded; print('ok')")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
  assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_kc_device_is_the_global_registry():
  assert isinstance(kc.Device, DeviceRegistry) and kc.Device.table is kc.runtime.plugins.BACKENDS
  assert isinstance(kc.Device.errors(), dict)


# ------------------------------------------------------------------------------------------------------------ kc.backend

BACKEND_CONTRACT = {
  "ENTRY_POINT_GROUP", "PLUGIN_API_VERSION", "api_compatible", "hookspec", "hookimpl", "BackendHooks", "BackendSpec",
  "Renderer", "TensorCore", "Program", "CStyleLanguage", "Compiler", "Allocator", "LRUAllocator", "HostAllocator", "HostMemory",
  "CompiledDevice", "ProgramHandle", "raw_buffers", "int32_values", "estimate_ops", "env_value",
  "Ops", "UOp", "UPat", "PatternMatcher", "GroupOp", "DType", "PtrDType", "ImageDType", "dtypes",
  "KcError", "CompileError", "DeviceUnavailable", "ConfigError",
}


def test_kc_backend_exports_the_whole_contract_and_the_core_objects_themselves():
  import kc.backend, kc.runtime.device, kc.runtime.plugins
  assert BACKEND_CONTRACT <= set(kc.backend.__all__)
  assert all(hasattr(kc.backend, n) for n in kc.backend.__all__)
  # the same objects the core uses, not copies: a plugin's subclass is the core's subclass
  assert kc.backend.BackendSpec is BackendSpec and kc.backend.hookimpl is hookimpl and kc.backend.Renderer is Renderer
  assert kc.backend.CompiledDevice is kc.runtime.device.CompiledDevice and kc.backend.Ops is kc.Ops and kc.backend.KcError is KcError
  assert kc.backend.ENTRY_POINT_GROUP == "kc.backends" and kc.backend.PLUGIN_API_VERSION == PLUGIN_API_VERSION
  assert "kc_backends" in (kc.backend.__doc__ or "") and "PLUGIN_API_VERSION" in (kc.backend.__doc__ or "")


def test_api_compatible_is_this_major_up_to_this_minor():
  from kc.backend import api_compatible
  major, minor = PLUGIN_API_VERSION.major, PLUGIN_API_VERSION.minor
  assert api_compatible(PLUGIN_API_VERSION) and api_compatible(ApiVersion(major, 0)) and api_compatible(major)
  assert not api_compatible(ApiVersion(major, minor + 1)) and not api_compatible(ApiVersion(major + 1))
  assert not api_compatible(major - 1) and not api_compatible(str(PLUGIN_API_VERSION)) and not api_compatible(None)


def test_a_plugin_written_against_kc_backend_alone_loads():
  from kc import backend as kb
  mod = types.ModuleType("kc_contract_only")
  @kb.hookimpl
  def kc_backends():
    return [kb.BackendSpec(name="Contract", api_version=kb.PLUGIN_API_VERSION, priority=1, available=lambda: None,
                           open=lambda: kb.CompiledDevice("CONTRACT", kb.HostAllocator(), None, EchoCompiler(), lambda n, lib: None))]
  mod.kc_backends = kc_backends
  reg = registry(FakeEntryPoint("contract", mod))
  assert reg.names() == ["CONTRACT"] and reg.errors() == {} and reg["contract"].name == "CONTRACT"


def test_the_hook_spec_is_the_documented_backend_hooks_class():
  manager = kc.runtime.plugins.new_plugin_manager()
  assert manager.hook.kc_backends.spec.namespace is kc.runtime.plugins.BackendHooks
  assert kc.runtime.plugins.BackendHooks.kc_backends.__doc__


def test_each_plugin_is_called_on_its_own_through_one_manager():
  """A plugin whose hook raises is recorded, and the plugins registered before and after it still give their specs."""
  def bad(): raise RuntimeError("boom")
  raising = types.ModuleType("raising")
  raising.kc_backends = hookimpl(bad, specname="kc_backends")
  reg = registry(FakeEntryPoint("a", plugin(spec("A"))), FakeEntryPoint("m", raising), FakeEntryPoint("z", plugin(spec("Z"))))
  assert reg.names() == ["A", "Z"] and list(reg.errors()) == ["m"] and "kc-m 1.2.3" in reg.errors()["m"]
  assert reg.spec("A").distribution == "kc-a" and reg.spec("Z").distribution == "kc-z"


def test_two_entry_points_of_one_object_are_refused_for_the_second():
  shared = plugin(spec("ONE"))
  reg = registry(FakeEntryPoint("first", shared), FakeEntryPoint("second", shared))
  assert reg.names() == ["ONE"] and reg.spec("ONE").distribution == "kc-first" and "kc-second 1.2.3" in reg.errors()["second"]
  assert "already registered" in reg.errors()["second"] and "kc-first 1.2.3" in reg.errors()["second"]


def test_emu_is_registered_through_the_kc_distributions_entry_point():
  eps = {ep.name: ep for ep in kc.runtime.plugins.installed_entry_points()}
  assert eps["emu"].value == "kc.emu.device"
  assert kc.runtime.plugins._distribution_of(eps["emu"])[0] == "kc-core"
  # found by discovery like any plugin, not registered in-process by the core
  table = PluginTable(entry_points=lambda: [eps["emu"]])
  assert list(table.specs()) == ["EMU"] and table.errors() == {} and table.specs()["EMU"].distribution == "kc-core"


def test_the_root_pyproject_declares_the_emu_entry_point():
  import tomllib
  from pathlib import Path
  project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
  assert project["entry-points"]["kc.backends"] == {"emu": "kc.emu.device"}
