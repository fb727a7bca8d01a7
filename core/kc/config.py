"""Every environment knob kc reads, declared once: its name, type, default, a one-line doc and the part that reads it.

Reading. `read(name)` is a knob's value: a scoped override's (`override`, also `kc.Context`) when one is active in
this context, else the environment variable parsed with the knob's type, else the default. The environment is looked
at on every read, because tests set variables with monkeypatch.setenv and notebooks toggle DEBUG between cells and
both expect the next call to see it; what is read once is the parse: a value is parsed the first time it is seen and
kept per (knob, raw string), so a read costs a dict lookup. A value that does not parse, or is not one of the knob's
choices, is a kc.ConfigError naming the knob, the value and what would be valid.

Blank values: for most knobs a variable set to the empty string (or spaces) counts as unset. KC_CACHE_DIR is the
exception (Knob.blank_is_unset): unset it means the default folder, set empty it turns the disk caches off.

Overrides. `with kc.config.override(KC_BEAM=2, DEBUG=4): ...` wins over the environment inside the block. Overrides
nest (the inner one wins, the outer one is back after the block) and are per context (contextvars): another thread's
reads do not see them, and neither do worker processes or threads started inside the block, which read the
environment. A name no knob has, or a value of the wrong type, is a kc.ConfigError when the override is made.

Workers. Work that kc hands to its own workers on the caller's behalf (BEAM's compile pool: its processes live on
between calls, with the environment of when they were spawned) carries `snapshot()`, every knob's value as the caller
reads it at the call, and runs under `applied(snapshot)`: it sees the caller's environment of now and its overrides.

Declaring. The core's knobs are declared below. A backend plugin declares its own with kc.backend.knob(...) when its
module is imported (the core names no backend). `kc config --markdown` prints the table of every knob of kc and of the
installed plugins; docs/CONFIG.md holds it."""
from __future__ import annotations
import contextlib, contextvars, difflib, os, re, threading, types
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional
from kc.errors import ConfigError

TYPES = (bool, int, float, str)
_TYPE_HELP = {bool: "0 or 1", int: "an integer", float: "a number", str: "text"}


def _type_help(t: type) -> str: return _TYPE_HELP.get(t, t.__name__)


@dataclass(frozen=True)
class Knob:
  """One environment variable kc reads. `default` is what an unset variable reads as (None: the reader works it out,
  and `default_doc` says what it is); `choices`, when given, are the only values allowed."""
  name: str
  type: type
  default: Any
  doc: str
  reader: str                    # the module that reads it
  choices: tuple = ()
  default_doc: str = ""          # the default as a person reads it, where `default` alone does not say
  blank_is_unset: bool = True    # False: a variable set to "" is a value of its own

  def parse(self, raw: str) -> Any:
    """`raw`, the variable's text, as a value of this knob; ConfigError naming the knob when it is not one."""
    text = raw.strip()
    if not text and self.blank_is_unset: return self.default
    try: value = text if self.type is str else int(text) != 0 if self.type is bool else self.type(text)
    except ValueError:
      raise ConfigError(f"{self.name}={raw!r} is not {_type_help(self.type)}: {self._valid()}") from None
    if self.choices and value not in self.choices: raise ConfigError(f"{self.name}={raw!r}: {self._valid()}")
    return value

  def check(self, value: Any) -> Any:
    """`value` as an override of this knob (an int is taken for a float knob); ConfigError when it is of another type
    or not one of the choices."""
    if value is None and self.default is None: return None
    fits = isinstance(value, self.type) and (self.type is bool or not isinstance(value, bool))
    if self.type is float and isinstance(value, int) and not isinstance(value, bool): value, fits = float(value), True
    if not fits:
      raise ConfigError(f"{self.name} takes {_type_help(self.type)} ({self.type.__name__}), got "
                        f"{type(value).__name__} {value!r}")
    if self.choices and value not in self.choices: raise ConfigError(f"{self.name}={value!r}: {self._valid()}")
    return value

  def get(self) -> Any:
    """This knob's value now (read(self.name))."""
    return read(self.name)

  @property
  def shown_default(self) -> str:
    if self.default_doc: return self.default_doc
    if self.type is bool: return str(int(self.default))
    return "(empty)" if self.default == "" else str(self.default)

  def _valid(self) -> str:
    what = f"one of {', '.join(map(str, self.choices))}" if self.choices else _type_help(self.type)
    return f"set it to {what}, or unset it for the default ({self.shown_default})"


_KNOBS: dict[str, Knob] = {}
_declare_lock = threading.Lock()
_parsed: dict[tuple[str, str], tuple[Knob, Any]] = {}
_NONE: Mapping[str, Any] = types.MappingProxyType({})
_overrides: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar("kc_config_overrides", default=_NONE)
_plugin_loader: Optional[Callable[[], None]] = None
_NAME_RE = re.compile(r"[A-Z][A-Z0-9_]*\Z")


def declare(knob: Knob) -> Knob:
  """Add `knob` to the knobs kc reads and return it. Declaring a name again from the same reader replaces it (a module
  imported again); from another reader it is a ConfigError: one variable has one meaning."""
  if not isinstance(knob.name, str) or not _NAME_RE.match(knob.name):
    raise ConfigError(f"a knob's name is upper-case letters, digits and _, starting with a letter: got {knob.name!r}")
  if knob.type not in TYPES:
    raise ConfigError(f"knob {knob.name}: its type must be one of bool, int, float, str, got {knob.type!r}")
  knob.check(knob.default)
  with _declare_lock:
    if (have := _KNOBS.get(knob.name)) is not None and have.reader != knob.reader:
      raise ConfigError(f"{knob.name} is declared by {have.reader} and again by {knob.reader}: a variable has one "
                        "meaning and one reader, so pick another name")
    _KNOBS[knob.name] = knob
  return knob


def knob(name: str, type: type, default: Any, doc: str, reader: str, *,  # noqa: A002
         choices: tuple = (), default_doc: str = "") -> Knob:
  """Declare a backend plugin's knob (kc.backend.knob): call it at module level in a module the plugin's package
  imports, so that the knob exists once the plugin is loaded. The name starts with KC_ and is not one of kc's own;
  `reader` is the module that reads it (pass __name__). Read it with .get() or kc.backend.read_knob(name)."""
  if not isinstance(name, str) or not name.startswith("KC_"):
    raise ConfigError(f"a plugin's knob is named KC_<something>, got {name!r}")
  if name in CORE_KNOBS:
    raise ConfigError(f"{name} is one of kc's own knobs (read by {_KNOBS[name].reader}): a plugin cannot declare it")
  return declare(Knob(name, type, default, doc, reader, tuple(choices), default_doc))


def knobs() -> list[Knob]:
  """Every declared knob, by name: the core's, and those of every plugin imported so far."""
  with _declare_lock: return sorted(_KNOBS.values(), key=lambda k: k.name)


def use_plugin_loader(loader: Callable[[], None]) -> None:
  """How to import the installed plugins (kc.runtime.device registers its plugin table's load): called once when a
  name no declared knob has is read or overridden, since a plugin's knobs exist only once its module is imported."""
  global _plugin_loader
  _plugin_loader = loader


def knob_named(name: str) -> Knob:
  """The declared knob `name`; a ConfigError naming the knobs there are (and the nearest) when there is none."""
  global _plugin_loader
  if (found := _KNOBS.get(name)) is not None: return found
  if _plugin_loader is not None:  # the name may be a plugin's whose module is not imported yet: import them, once
    loader, _plugin_loader = _plugin_loader, None
    loader()
    if (found := _KNOBS.get(name)) is not None: return found
  near = difflib.get_close_matches(str(name), list(_KNOBS), n=3)
  hint = f" (did you mean {', '.join(near)}?)" if near else ""
  raise ConfigError(f"no kc knob is named {name!r}{hint}: the knobs are {', '.join(sorted(_KNOBS))} (a plugin's exist "
                    "once it is installed and loads)")


def environment_value(name: str) -> Optional[str]:
  """os.environ.get(name), in a tenth of its time on POSIX: os.environ keeps the environment as a dict of bytes, which
  is read here with the name encoded once, not per call (a kernel call reads DEBUG, and os.environ.get cost it 1-2 us).
  Whatever changes os.environ changes that dict, so both always agree."""
  data = getattr(os.environ, "_data", None)
  if os.name != "posix" or not isinstance(data, dict): return os.environ.get(name)
  try: key = _encoded[name]
  except KeyError: key = _encoded[name] = os.fsencode(name)
  raw = data.get(key)
  return None if raw is None else _decoded(raw)


_encoded: dict[str, bytes] = {}


def _decoded(raw: bytes) -> str:
  try: return _decodings[raw]
  except KeyError: pass
  value = _decodings[raw] = os.fsdecode(raw)
  return value


_decodings: dict[bytes, str] = {}


def read(name: str) -> Any:
  """The value of knob `name` now: an active override's, else the environment's (parsed once per raw string), else
  the default."""
  k = knob_named(name)
  if name in (active := _overrides.get()): return active[name]
  if (raw := environment_value(name)) is None: return k.default
  # keyed by name, not by the Knob (hashing a Knob hashes every field); the Knob kept with the value decides
  if (hit := _parsed.get((name, raw))) is not None and hit[0] is k: return hit[1]
  value = k.parse(raw)
  _parsed[(name, raw)] = (k, value)
  return value


def source(name: str) -> str:
  """Where read(name) takes its value from now: "override", "environment" or "default"."""
  knob_named(name)
  if name in _overrides.get(): return "override"
  return "environment" if os.environ.get(name) is not None else "default"


def debug_level() -> int:
  """DEBUG: 2 kernel timings and BEAM's rounds, 3 BEAM's candidates, 4 the rendered source, 5 the linear UOps.
  read("DEBUG") without its general steps where nothing sets it (every kernel call asks: a third of a microsecond)."""
  if "DEBUG" not in _overrides.get() and environment_value("DEBUG") is None: return _DEBUG_DEFAULT
  return read("DEBUG")


def env_value(key: str, default: Any) -> Any:
  """The read of plugin API 1.0, kept for plugins built for it (kc.backend.env_value): a declared knob's value
  (`default` when that is None), else the variable `key` parsed as the type of `default` (unset or blank: `default`)."""
  if key in _KNOBS:
    value = read(key)
    return default if value is None else value
  if (raw := os.environ.get(key)) is None: return default
  return Knob(key, type(default), default, "", "a plugin built for plugin API 1.0").parse(raw)


class Context(contextlib.ContextDecorator):
  """`with kc.Context(KC_BEAM=2, DEBUG=4):` (or kc.config.override): these knobs read as given inside the block, over
  the environment. Each value is checked against its knob when the Context is made. Nestable, reusable, and per
  context (contextvars): see the module's docstring for what a worker sees."""

  def __init__(self, **values: Any):
    self.values = {name: knob_named(name).check(value) for name, value in values.items()}
    self._tokens: list[contextvars.Token] = []

  def __enter__(self) -> "Context":
    self._tokens.append(_overrides.set({**_overrides.get(), **self.values}))
    return self

  def __exit__(self, *exc) -> None:
    _overrides.reset(self._tokens.pop())


override = Context


def snapshot() -> dict[str, Any]:
  """Every declared knob's value as read() gives it now, for a worker to run under (`applied`). A knob whose variable
  does not parse is left out: the worker's own read of it raises, as the caller's would have."""
  values = {}
  for k in knobs():
    try: values[k.name] = read(k.name)
    except ConfigError: continue
  return values


def applied(values: Mapping[str, Any]) -> Context:
  """`values` (a snapshot() taken in another process or thread) as overrides; a knob this process has not declared
  (a plugin it has not imported) is skipped, so applying a snapshot never imports plugins."""
  with _declare_lock: known = {name: value for name, value in values.items() if name in _KNOBS}
  return Context(**known)


# ------------------------------------------------------------------------------------------------------ kc's own knobs

def _core(name: str, type: type, default: Any, doc: str, reader: str, **extra: Any) -> Knob:  # noqa: A002
  return declare(Knob(name, type, default, doc, reader, **extra))


_DEBUG_DEFAULT = _core("DEBUG", int, 0, "how much kc prints: 2 kernel timings and BEAM's rounds, 3 BEAM's candidates, 4 the "
                       "rendered source, 5 the linear UOps",
                       "kc.api, kc.search.beam, kc.codegen.program").default
_core("KC_DEVICE", str, "", "the default device (kc.Device.DEFAULT); unset: the highest-priority device that opens "
      "here", "kc.runtime.device", default_doc="(highest priority available)")
_core("KC_BEAM", int, 0, "the BEAM width that opts=None searches with; 0: the hand-coded opts", "kc.api")
_core("KC_BEAM_CLUSTER", str, "", "a Dask scheduler address, or `local`, that BEAM's compiles fan out to; unset: a "
      "local process pool", "kc.api")
_core("KC_CACHE_DIR", str, None, "the folder of the compile cache and the opt cache; set empty: no disk cache",
      "kc.runtime.cache", default_doc="~/.cache/kc", blank_is_unset=False)
_core("KC_CACHE_MAX_MB", float, 512.0, "the compile cache's size limit in megabytes (least recently used entries go)",
      "kc.runtime.cache")
_core("KC_SPLIT_REDUCE", bool, True, "0: a large reduce with few outputs stays one kernel instead of a partial and a "
      "combine kernel, and a large matmul on a host CPU one kernel instead of a pack of its second operand and the "
      "product", "kc.api")
_core("KC_STRICT_PLUGINS", bool, False, "1: a plugin that fails to load is a kc.PluginError, not a warning",
      "kc.runtime.plugins")
_core("KC_DISABLE_PLUGINS", str, "", "plugins to leave unloaded, by distribution or entry-point name, comma-separated",
      "kc.runtime.plugins")
_core("KC_EMULATE", str, "", "the registered device whose renderer the EMU device lowers as; unset: EMU's own",
      "kc.emu.device")
_core("KC_TC", int, 1, "the tensor-core level of kc.compile's kernels: 0 off, 1 WMMA, 2 the shape opts without WMMA, 3 "
      "WMMA's addressing emulated through local memory", "kc.api", choices=(0, 1, 2, 3))
_core("KC_TC_OPT", int, 0, "which kernels apply_tensor_cores takes when not told: 0 LOADs multiplied directly, 1 also "
      "CAST inputs, 2 also sizes that need padding", "kc.kernel.kernel", choices=(0, 1, 2))
_core("KC_MV", int, 1, "0: the hand-coded opts skip the matrix-vector heuristic", "kc.kernel.heuristics")
_core("KC_MV_BLOCKSIZE", int, 4, "the matrix-vector heuristic's block size", "kc.kernel.heuristics")
_core("KC_MV_THREADS_PER_ROW", int, 8, "the matrix-vector heuristic's threads per output row", "kc.kernel.heuristics")
_core("KC_MV_ROWS_PER_THREAD", int, 4, "the matrix-vector heuristic's output rows per thread", "kc.kernel.heuristics")
_core("KC_NOLOCALS", int, 0, "1: the hand-coded opts give a kernel without local dims NOLOCALS instead of choosing local "
      "dims", "kc.kernel.heuristics")
CORE_KNOBS = frozenset(_KNOBS)


# ---------------------------------------------------------------------------------------------------------- the table

TABLE_BEGIN = "<!-- knobs: generated by `kc config --markdown`; edit the declarations, not this table -->"
TABLE_END = "<!-- end of knobs -->"


def _cell(text: str) -> str: return text.replace("|", "\\|")


def markdown_table(every: Optional[list[Knob]] = None) -> str:
  """The knobs (default: every declared one) as a markdown table between TABLE_BEGIN and TABLE_END: kc's own first,
  then the plugins', each by name."""
  rows = sorted(knobs() if every is None else every, key=lambda k: (k.name not in CORE_KNOBS, k.name))
  lines = [TABLE_BEGIN, "", "| knob | type | default | read by | what it does |", "|---|---|---|---|---|"]
  for k in rows:
    values = f" ({', '.join(map(str, k.choices))})" if k.choices else " (0/1)" if k.type is bool else ""
    kind = k.type.__name__ + values
    lines.append(f"| `{k.name}` | {kind} | {_cell(k.shown_default)} | {_cell(k.reader)} | {_cell(k.doc)} |")
  return "\n".join(lines + ["", TABLE_END])


__all__ = ["Knob", "Context", "override", "declare", "knob", "knobs", "knob_named", "read", "source", "debug_level",
           "env_value", "markdown_table", "use_plugin_loader", "CORE_KNOBS", "TABLE_BEGIN", "TABLE_END"]
