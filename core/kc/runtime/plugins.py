"""Backend plugins: the pluggy hook spec, the BackendSpec a plugin returns, the API version rule, and the load loop.

Backend authors read `kc.backend`, which re-exports what is declared here; this module is the machinery behind it.

A plugin is a distribution with an entry point in the group `kc.backends` (name = device name, lower case) whose
object (usually the package module) has a `@kc.backend.hookimpl def kc_backends() -> list[BackendSpec]`. The core
registers its own EMU device the same way, through the `kc` distribution's entry point.

The load loop runs on first use of `kc.Device`, never at `import kc`. It keeps one pluggy PluginManager per load:
every entry point object is loaded and registered with it (pluggy checks the hook signatures), then each registered
plugin's own `kc_backends` is called through the manager, so that whatever one plugin gets wrong (an import error,
an incompatible plugin API version, a duplicate device name) is recorded against it in `kc.Device.errors()` and the
others load regardless. `KC_STRICT_PLUGINS=1` makes the first such failure raise `kc.PluginError` instead, for CI and
for plugin authors. Otherwise each failure is also reported once per process, as a PluginWarning naming the
distribution and why, when discovery runs. `KC_DISABLE_PLUGINS=name,...` leaves the plugins it names (by
distribution or entry-point name) unloaded: their modules are not even imported, and `disabled()` lists them.

Error keys say where the problem is: a plugin's entry-point name (lower case) when the plugin failed, a device
name (upper case) when one device of an otherwise loaded plugin was rejected or its availability check broke.

This module imports nothing from the rest of the runtime: `kc.runtime.device` (the registry) and
`kc.emu` (a backend) import it, so an import back would be a cycle."""
from __future__ import annotations
import dataclasses, functools, re, threading, warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Union
import pluggy
from kc import config
from kc.errors import PluginError
from kc.renderer import Renderer

PROJECT = "kc"
ENTRY_POINT_GROUP = "kc.backends"


@functools.total_ordering
@dataclass(frozen=True, eq=False)
class ApiVersion:
  """A plugin API version, MAJOR.MINOR. The minor goes up when kc.backend gains something a plugin may use (an old
  plugin, which does not use it, still works); the major when something a plugin may use changes or goes (an old
  plugin may break). A plugin built for MAJOR.m loads in a kc that speaks MAJOR.n for every n >= m.

  Plugins built for plugin API 1 declared it as the int 1: an int N means N.0, and compares (==, <) as N.0 does."""
  major: int
  minor: int = 0

  def __post_init__(self):
    for part in (self.major, self.minor):
      if not isinstance(part, int) or isinstance(part, bool) or part < 0:
        raise PluginError(f"a plugin API version is two ints >= 0 (MAJOR.MINOR), got "
                          f"ApiVersion({self.major!r}, {self.minor!r})")

  @staticmethod
  def of(version: Any) -> Optional["ApiVersion"]:
    """`version` as declared in a BackendSpec (an ApiVersion, or an int N meaning N.0), or None when it is neither."""
    if isinstance(version, ApiVersion): return version
    if isinstance(version, int) and not isinstance(version, bool) and version >= 0: return ApiVersion(version)
    return None

  def _pair(self) -> tuple[int, int]: return (self.major, self.minor)

  def __eq__(self, other: Any) -> bool:
    return (them := ApiVersion.of(other)) is not None and self._pair() == them._pair()

  def __lt__(self, other: Any) -> bool:
    if (them := ApiVersion.of(other)) is None: return NotImplemented
    return self._pair() < them._pair()

  # equal to the int N when it is N.0, so it hashes as N does then
  def __hash__(self) -> int: return hash(self.major) if self.minor == 0 else hash(self._pair())

  def __str__(self) -> str: return f"{self.major}.{self.minor}"


# the plugin API this kc speaks. 1.1 added kc.backend.knob/read_knob (a plugin's environment knobs, declared) and
# ApiVersion; 1.0 is the API plugins declared as the int 1. Bump the minor for additions, the major for changes.
PLUGIN_API_VERSION = ApiVersion(1, 1)


def accepted_range() -> str:
  """The plugin API versions this kc loads, as a person reads them ("1.0 to 1.1")."""
  return f"{PLUGIN_API_VERSION.major}.0 to {PLUGIN_API_VERSION}"


def api_compatible(version: Union[ApiVersion, int]) -> bool:
  """Whether a plugin that declares plugin API `version` (BackendSpec.api_version) can be loaded by this kc: the same
  major as PLUGIN_API_VERSION and a minor no newer than its minor (accepted_range()). A plugin built for an older
  minor uses nothing that changed since, so it loads; a newer minor may use what this kc lacks, and another major
  what it changed. A spec that is refused gets a kc.PluginError naming the plugin's distribution, both versions and
  the range."""
  declared = ApiVersion.of(version)
  ours = PLUGIN_API_VERSION
  return declared is not None and declared.major == ours.major and declared.minor <= ours.minor


class PluginWarning(UserWarning):
  """A plugin failed to load and was skipped (KC_STRICT_PLUGINS=1 makes that an error)."""


hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@dataclass(frozen=True)
class BackendSpec:
  """One device a plugin offers. Frozen: the registry hands the same spec to every caller.

  name: the device name users type (`kc.Device["CLANG"]`); letters, digits and _, starting with a letter. Names are
    case-insensitive and stored upper case. Use the entry point's name, upper case.
  api_version: the plugin API the backend was written for: always pass PLUGIN_API_VERSION as imported from
    kc.backend when the plugin was built (an ApiVersion; plugins built for API 1 pass the int 1, read as 1.0). See
    api_compatible for which versions load.
  priority: orders kc.Device.names(); the highest-priority device that can open here is kc.Device.DEFAULT.
    CPU backends sit low (CLANG is 10), accelerators high; EMU is -1000 so it is never the default by accident.
  available: a cheap check, run once per process: None when the device can open here, else the reason it cannot,
    as a sentence a user can act on ("no NVIDIA driver found (libcuda.so)"). It must not open the device, and it
    should not import the backend's heavy runtime dependency when that dependency is missing.
  open: builds the device's CompiledDevice (allocator, renderer, compiler, program loader); called once, the first
    time the device is used. Import heavy dependencies here, not at module level.
  renderer: builds the device's Renderer without opening the device, so source can be rendered (and compiled,
    where the compiler needs no device) on machines that cannot run it. None: the renderer is taken from the
    opened device, so the device can only render where it can open.
  compiler: builds the device's Compiler without opening the device, for backends whose compiler needs no device
    (NVRTC, a cross compiler): the conformance compile tier then runs on machines that cannot run the device. None:
    the compiler is taken from the opened device.
  distribution / version: the distribution that provides the device and its version, shown by `kc devices` and
    in every error about the device; filled in from the entry point's distribution when left empty.
  self_test: the backend's own checks, run by `kc doctor` on a device that opens here: returns each check's name
    mapped to None when it passed, else the problem as a sentence (what was wrong, with what compiler or driver, and
    what to do). For what a smoke test cannot see: a compiler version known to miscompile, a driver quirk. None: none.
  expected_everywhere: True for a device that needs nothing a machine may lack by design (no GPU, another OS), only
    what its plugin's installation brings (CLANG: a C compiler). Then a device that cannot open is a broken
    installation: `kc doctor` reports it as a problem and kc.Device.DEFAULT warns once when it falls back past it.
    False (default): a device that cannot open is simply absent here, as CUDA is without a GPU."""
  name: str
  api_version: Union[ApiVersion, int]
  priority: int
  available: Callable[[], Optional[str]]
  open: Callable[[], Any]  # -> kc.backend.CompiledDevice (declared by kc.runtime.device, which imports this module)
  renderer: Optional[Callable[[], Renderer]] = None
  distribution: str = ""
  version: str = ""
  compiler: Optional[Callable[[], Any]] = None  # -> kc.backend.Compiler (declared by kc.runtime.device)
  self_test: Optional[Callable[[], dict[str, Optional[str]]]] = None
  expected_everywhere: bool = False

  @property
  def origin(self) -> str:
    return f"{self.distribution} {self.version}".strip() if self.distribution else "an in-process backend"


class BackendHooks:
  """The hooks kc calls on a backend plugin. Implement them as module-level functions (or methods of the entry
  point's object) decorated with `@kc.backend.hookimpl`; pluggy refuses an implementation whose parameters are
  not a subset of the spec's."""

  @hookspec
  def kc_backends(self) -> list[BackendSpec]:  # type: ignore[empty-body]
    """The devices this plugin offers, one BackendSpec each (usually one). Called once per discovery, when
    kc.Device is first used; keep it cheap: build specs, do not open devices or import their drivers. An exception
    raised here is recorded against the plugin (kc.Device.errors()) and skips it."""


_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")


def _strict() -> bool: return config.read("KC_STRICT_PLUGINS")


def _normalized(name: str) -> str:
  """A distribution or entry-point name compared as packaging compares distribution names (PEP 503)."""
  return re.sub(r"[-_.]+", "-", name.strip()).lower()


def disabled_by_config() -> frozenset[str]:
  """The plugin names KC_DISABLE_PLUGINS lists (comma-separated distribution or entry-point names), normalized."""
  return frozenset(_normalized(n) for n in config.read("KC_DISABLE_PLUGINS").split(",") if n.strip())


def installed_entry_points() -> list:
  from importlib.metadata import entry_points
  return list(entry_points(group=ENTRY_POINT_GROUP))


def _distribution_of(ep) -> tuple[str, str]:
  dist = getattr(ep, "dist", None)
  if dist is None: return f"the plugin behind entry point {ep.name!r}", "(unknown version)"
  return dist.metadata["Name"] if getattr(dist, "metadata", None) else dist.name, dist.version


def validate_spec(spec: Any, origin: str) -> BackendSpec:
  """`spec` checked and normalized (upper-case name); a PluginError names `origin` and what is wrong."""
  if not isinstance(spec, BackendSpec):
    raise PluginError(f"{origin} returned {type(spec).__name__} from kc_backends, not a kc.runtime.plugins.BackendSpec "
                      "(import BackendSpec from kc.backend)")
  if (declared := ApiVersion.of(spec.api_version)) is None:
    raise PluginError(f"{origin}: device {spec.name} declares the plugin API version {spec.api_version!r}, which is not "
                      "one: pass kc.backend.PLUGIN_API_VERSION as BackendSpec.api_version")
  if not api_compatible(declared):
    raise PluginError(f"{origin} speaks kc plugin API {declared} (device {spec.name}), but this kc speaks plugin API "
                      f"{PLUGIN_API_VERSION} and loads plugins built for {accepted_range()}: install a release of the "
                      f"plugin made for one of those, or a kc whose plugin API is {declared} or a later "
                      f"{declared.major}.x")
  if not isinstance(spec.name, str) or not _NAME_RE.match(spec.name):
    raise PluginError(f"{origin} offers a device named {spec.name!r}: a device name is letters, digits and _ and starts with a letter")
  if not isinstance(spec.priority, int): raise PluginError(f"{origin}: device {spec.name} has a priority of {spec.priority!r}, not an int")
  for field in ("available", "open"):
    if not callable(getattr(spec, field)): raise PluginError(f"{origin}: device {spec.name} has a {field} that is not callable")
  if spec.renderer is not None and not callable(spec.renderer):
    raise PluginError(f"{origin}: device {spec.name} has a renderer that is not callable")
  if spec.compiler is not None and not callable(spec.compiler):
    raise PluginError(f"{origin}: device {spec.name} has a compiler that is not callable")
  if spec.self_test is not None and not callable(spec.self_test):
    raise PluginError(f"{origin}: device {spec.name} has a self_test that is not callable")
  return dataclasses.replace(spec, name=spec.name.upper())


class PluginTable:
  """Which backends exist: specs found through entry points or registered in-process, the errors of the ones
  that could not load, and the (cached) result of each availability check."""

  def __init__(self, entry_points: Optional[Callable[[], Iterable]] = None):
    self._entry_points = entry_points if entry_points is not None else installed_entry_points
    self._registered: dict[str, BackendSpec] = {}   # register(): kept across reload()
    self._discovered: dict[str, BackendSpec] = {}
    self._load_errors: dict[str, str] = {}
    self._disabled: dict[str, str] = {}      # entry-point name -> "distribution version", left unloaded
    self._check_errors: dict[str, str] = {}
    self._reasons: dict[str, Optional[str]] = {}
    self._loaded = False
    self._lock = threading.RLock()

  # -- queries --------------------------------------------------------------------------------------------------------
  def specs(self) -> dict[str, BackendSpec]:
    self.load()
    return {**self._discovered, **self._registered}

  def errors(self) -> dict[str, str]:
    self.load()
    return {**self._load_errors, **self._check_errors}

  def disabled(self) -> dict[str, str]:
    """The plugins KC_DISABLE_PLUGINS left unloaded at discovery: entry-point name -> distribution and version."""
    self.load()
    return dict(self._disabled)

  def unavailable_reason(self, name: str) -> Optional[str]:
    """None when device `name` can open here, else why not. The check runs once per process."""
    spec = self.specs()[name]
    with self._lock:
      if name in self._reasons: return self._reasons[name]
      try:
        reason = spec.available()
        if reason is not None and not isinstance(reason, str): reason = str(reason)
      except Exception as e:
        msg = f"device {name} from {spec.origin}: its availability check raised {type(e).__name__}: {e}"
        if _strict(): raise PluginError(msg) from e
        self._check_errors[name] = msg
        reason = f"its availability check failed ({type(e).__name__}: {e})"
      self._reasons[name] = reason
      return reason

  # -- changes --------------------------------------------------------------------------------------------------------
  def register(self, spec: BackendSpec, replace: bool = False) -> BackendSpec:
    """Add an in-process backend. A name that is taken raises PluginError unless replace=True."""
    spec = validate_spec(spec, spec.origin if isinstance(spec, BackendSpec) else "register()")
    with self._lock:
      taken = self._registered.get(spec.name) or (self._discovered.get(spec.name) if self._loaded else None)
      if taken is not None and not replace:
        raise PluginError(f"device {spec.name} is already registered by {taken.origin}: pick another name or pass replace=True")
      self._discovered.pop(spec.name, None)
      self._registered[spec.name] = spec
      self._reasons.pop(spec.name, None)
      self._check_errors.pop(spec.name, None)
    return spec

  def unregister(self, name: str):
    with self._lock:
      name = name.upper()
      for d in (self._registered, self._discovered, self._reasons, self._check_errors): d.pop(name, None)

  def reload(self):
    """Forget what discovery found (and the availability checks) so the next query discovers again."""
    with self._lock:
      self._discovered, self._load_errors, self._check_errors, self._reasons, self._disabled = {}, {}, {}, {}, {}
      self._loaded = False

  # -- the load loop --------------------------------------------------------------------------------------------------
  def load(self):
    if self._loaded: return
    with self._lock:
      if self._loaded: return
      found = self._discover(strict=_strict())
      self._discovered, self._load_errors, self._disabled = found.specs, found.errors, found.disabled
      self._loaded = True
    # outside the lock: a warning filter set to "error" raises here, and must not leave the table half loaded
    for msg in found.errors.values():
      warnings.warn(f"kc skipped a backend plugin: {msg} (kc devices lists it; KC_STRICT_PLUGINS=1 makes this an error)",
                    PluginWarning, stacklevel=3)
    if found.unknown_disabled:
      warnings.warn(f"KC_DISABLE_PLUGINS names {', '.join(found.unknown_disabled)}, which no installed plugin is called "
                    f"(by distribution or entry-point name); the plugins are {', '.join(found.names) or 'none'}",
                    PluginWarning, stacklevel=3)

  def _discover(self, strict: bool) -> "_Discovery":
    found: dict[str, BackendSpec] = {}
    errors: dict[str, str] = {}
    off, disabled, names = disabled_by_config(), {}, []

    def fail(key: str, msg: str, cause: Optional[BaseException] = None):
      if strict: raise PluginError(msg + " (KC_STRICT_PLUGINS=1 makes this an error; unset it to skip the plugin)") from cause
      errors[key] = f"{errors[key]}; {msg}" if key in errors else msg

    try: eps = list(self._entry_points())
    except Exception as e:
      fail(ENTRY_POINT_GROUP, f"cannot list the {ENTRY_POINT_GROUP} entry points: {type(e).__name__}: {e}", e)
      eps = []

    # first every plugin is loaded and registered (a plugin that cannot be is skipped), then each registered one is
    # asked for its devices; entry points go in name order so that which duplicate wins does not depend on install order
    manager = new_plugin_manager()
    registered: list[tuple[Any, Any, str, str]] = []  # (entry point, plugin object, distribution, version)
    for ep in sorted(eps, key=lambda ep: ep.name):
      dist, version = _distribution_of(ep)
      names += [ep.name, dist]
      # not even imported: a broken plugin's import may be what breaks
      if {_normalized(ep.name), _normalized(dist)} & off:
        disabled[ep.name] = f"{dist} {version}"
        continue
      try: registered.append((ep, register_entry_point(manager, ep, f"{dist} {version}"), dist, version))
      except Exception as e:
        fail(ep.name, str(e) if isinstance(e, PluginError) else
             f"{dist} {version}: entry point {ep.name} = {getattr(ep, 'value', '?')} failed to load: {type(e).__name__}: {e}", e)

    for ep, plugin, dist, version in registered:
      origin = f"{dist} {version}"
      try: specs = backends_of(manager, plugin)
      except Exception as e:
        fail(ep.name, f"{origin}: the kc_backends hook of entry point {ep.name} = {getattr(ep, 'value', '?')} raised "
                      f"{type(e).__name__}: {e}", e)
        continue
      for raw in specs:
        if isinstance(raw, BackendSpec) and not raw.distribution:
          raw = dataclasses.replace(raw, distribution=dist, version=version)
        try: spec = validate_spec(raw, origin)
        except PluginError as e:
          fail(ep.name, str(e), e)
          continue
        if (taken := found.get(spec.name) or self._registered.get(spec.name)) is not None:
          fail(spec.name, f"device {spec.name} from {spec.origin} is ignored: {taken.origin} registered it first; uninstall one of them")
          continue
        found[spec.name] = spec
    unknown = sorted(off - {_normalized(n) for n in names})
    return _Discovery(found, errors, disabled, unknown, sorted(set(names)))


@dataclass(frozen=True)
class _Discovery:
  """What one discovery found: the specs, the errors (by entry-point or device name), the plugins KC_DISABLE_PLUGINS
  left unloaded, the names it lists that no plugin has, and every plugin's entry-point and distribution names."""
  specs: dict[str, BackendSpec]
  errors: dict[str, str]
  disabled: dict[str, str]
  unknown_disabled: list[str]
  names: list[str]


def new_plugin_manager() -> pluggy.PluginManager:
  """A PluginManager that knows kc's hooks (BackendHooks) and no plugin yet."""
  manager = pluggy.PluginManager(PROJECT)
  manager.add_hookspecs(BackendHooks)
  return manager


def register_entry_point(manager: pluggy.PluginManager, ep, origin: str) -> Any:
  """Load entry point `ep` and register its object with `manager`, which checks its hookimpls against BackendHooks.
  Returns the registered object; an object that implements no kc hook is refused, naming `origin`."""
  obj = ep.load()
  if manager.is_registered(obj):  # pluggy would refuse it too, in its own words
    raise PluginError(f"{origin}: entry point {ep.name} = {getattr(ep, 'value', '?')} loads the object that "
                      f"{manager.get_name(obj)} already registered; a plugin object has one entry point")
  manager.register(obj, name=f"{origin}: {ep.name} = {getattr(ep, 'value', '?')}")
  if not manager.get_hookcallers(obj):
    manager.unregister(obj)
    raise PluginError(f"{origin}: entry point {ep.name} = {getattr(ep, 'value', '?')} has no kc_backends hook; "
                      "define one decorated with @kc.backend.hookimpl")
  return obj


def backends_of(manager: pluggy.PluginManager, plugin: Any) -> list:
  """The specs `plugin`'s own kc_backends implementations return, called through `manager` with every other
  registered plugin left out, so that an exception or a bad spec is this plugin's alone."""
  others = [p for p in manager.get_plugins() if p is not plugin]
  out: list = []
  for result in manager.subset_hook_caller("kc_backends", remove_plugins=others)():
    out.extend(result if isinstance(result, (list, tuple)) else [result])
  return out


BACKENDS = PluginTable()


def register(spec: BackendSpec, replace: bool = False) -> BackendSpec:
  """Register an in-process backend with `kc.Device` (no distribution or entry point needed)."""
  return BACKENDS.register(spec, replace=replace)


def unregister(name: str): BACKENDS.unregister(name)


__all__ = ["PLUGIN_API_VERSION", "ApiVersion", "accepted_range", "disabled_by_config",
           "ENTRY_POINT_GROUP", "BackendSpec", "BackendHooks", "PluginTable", "PluginWarning", "BACKENDS",
           "api_compatible", "hookimpl", "hookspec", "register", "unregister", "installed_entry_points", "validate_spec",
           "new_plugin_manager", "register_entry_point", "backends_of"]
