"""kc.config: every environment knob declared once and read through one function; values parsed once per raw string
while changes to the environment are still seen; scoped, nestable, per-thread overrides (kc.Context); the generated
table in docs/CONFIG.md; and the tensor-core level as an explicit parameter of the kernel, read from KC_TC only by the
API and part of the opt cache's key."""
import io, os, re, subprocess, sys, threading
from contextlib import redirect_stdout
from pathlib import Path
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import kc
import kc.search
from kc import ast as A, config
from kc.api import beam_opts
from kc.errors import ConfigError, KernelOptError
from kc.ir.dtype import dtypes
from kc.kernel import Opt, OptOps
from kc.runtime.cache import compile_cache_dir
from kc.runtime.opt_cache import OptCache, OptEntry, OptKey, opt_cache
from kc.search import SearchResult

REPO = Path(__file__).resolve().parent.parent
CONFIG_DOC = REPO / "docs" / "CONFIG.md"
f32 = dtypes.float32


@pytest.fixture
def own_knobs(monkeypatch):
  """The knob registry as it is, restored after the test: what a test declares does not outlive it. The installed
  plugins are loaded first: a plugin first imported during the test would declare its knobs only into the copy, and
  once imported its module never declares them again."""
  kc.Device.table.load()
  monkeypatch.setattr(config, "_KNOBS", dict(config._KNOBS))


# ------------------------------------------------------------------------------------------------------------- reading

def _expected(knob: config.Knob, text: str):
  """What `text` means for `knob`, or ConfigError; the oracle the parser is checked against."""
  stripped = text.strip()
  if not stripped: return knob.default
  if knob.type is str: return stripped
  try: value = int(stripped) != 0 if knob.type is bool else knob.type(stripped)
  except ValueError: return ConfigError
  return ConfigError if knob.choices and value not in knob.choices else value


NUMERIC = [k for k in config.knobs() if k.name in config.CORE_KNOBS and k.type is not str]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(NUMERIC), st.one_of(st.integers(-5, 600).map(str), st.text(max_size=6),
                                           st.sampled_from([" 3 ", "1.5", "nan", "0x10", "", "  ", "1e3", "-0"])))
def test_every_core_knob_parses_with_its_type_or_names_itself_in_a_config_error(knob, text):
  expected = _expected(knob, text)
  if "\x00" in text: return  # the environment cannot hold it
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv(knob.name, text)
    if expected is ConfigError:
      with pytest.raises(ConfigError) as info: config.read(knob.name)
      assert f"{knob.name}={text!r}" in str(info.value) and "unset it for the default" in str(info.value)
    else:
      got = config.read(knob.name)
      assert got == expected or (got != got and expected != expected)  # nan is a float like any other
      assert type(got) is type(expected)


def test_unset_is_the_default_and_a_change_is_seen_at_the_next_read(monkeypatch):
  monkeypatch.delenv("DEBUG", raising=False)
  assert config.read("DEBUG") == 0 and config.debug_level() == 0 and config.source("DEBUG") == "default"
  monkeypatch.setenv("DEBUG", "4")
  assert config.debug_level() == 4 and config.source("DEBUG") == "environment"
  monkeypatch.setenv("DEBUG", "2")
  assert config.debug_level() == 2


def test_a_raw_value_is_parsed_once(monkeypatch):
  calls = []
  parse = config.Knob.parse
  monkeypatch.setattr(config.Knob, "parse", lambda self, raw: calls.append((self.name, raw)) or parse(self, raw))
  for raw in ("731", "731", "937", "731", "937"):
    monkeypatch.setenv("KC_BEAM", raw)
    assert config.read("KC_BEAM") == int(raw)
  assert calls == [("KC_BEAM", "731"), ("KC_BEAM", "937")]


def test_the_cache_dir_tells_unset_from_empty(monkeypatch):
  monkeypatch.delenv("KC_CACHE_DIR", raising=False)
  assert config.read("KC_CACHE_DIR") is None
  assert compile_cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "kc")
  monkeypatch.setenv("KC_CACHE_DIR", "")
  assert config.read("KC_CACHE_DIR") == "" and compile_cache_dir() is None
  monkeypatch.setenv("KC_CACHE_DIR", "  ")
  assert compile_cache_dir() is None
  with config.override(KC_CACHE_DIR="/some/where"): assert compile_cache_dir() == "/some/where"
  monkeypatch.setenv("KC_BEAM", "")  # elsewhere empty is unset
  assert config.read("KC_BEAM") == 0


def test_an_unknown_name_is_a_config_error_that_suggests_one():
  with pytest.raises(ConfigError, match=r"no kc knob is named 'KC_BAEM' \(did you mean KC_BEAM"): config.read("KC_BAEM")


# ----------------------------------------------------------------------------------------------------------- overrides

def test_an_override_wins_over_the_environment_nests_and_ends(monkeypatch):
  monkeypatch.setenv("KC_BEAM", "5")
  assert kc.Context is config.Context is config.override
  with kc.Context(KC_BEAM=2, DEBUG=4) as outer:
    assert (config.read("KC_BEAM"), config.debug_level(), config.source("KC_BEAM")) == (2, 4, "override")
    with config.override(KC_BEAM=3):
      assert (config.read("KC_BEAM"), config.debug_level()) == (3, 4)
      with outer: assert config.read("KC_BEAM") == 2  # a Context entered again, inside itself
      assert config.read("KC_BEAM") == 3
    assert config.read("KC_BEAM") == 2
  assert (config.read("KC_BEAM"), config.source("KC_BEAM")) == (5, "environment")


def test_an_override_is_a_decorator_too():
  @config.override(KC_TC=3)
  def level(): return config.read("KC_TC")
  assert level() == 3 and config.read("KC_TC") == 1


@pytest.mark.parametrize("values,message", [
  ({"KC_BAEM": 2}, "no kc knob is named 'KC_BAEM'"),
  ({"KC_BEAM": "2"}, "KC_BEAM takes an integer .int., got str '2'"),
  ({"KC_BEAM": True}, "KC_BEAM takes an integer .int., got bool True"),
  ({"KC_BEAM": None}, "KC_BEAM takes an integer .int., got NoneType None"),
  ({"KC_SPLIT_REDUCE": 1}, "KC_SPLIT_REDUCE takes 0 or 1 .bool., got int 1"),
  ({"KC_CACHE_MAX_MB": "big"}, "KC_CACHE_MAX_MB takes a number .float., got str"),
  ({"KC_TC": 4}, r"KC_TC=4: set it to one of 0, 1, 2, 3"),
  ({"KC_DEVICE": 3}, "KC_DEVICE takes text .str., got int 3"),
], ids=lambda v: str(v) if isinstance(v, dict) else "")
def test_an_override_refuses_unknown_names_and_wrong_types(values, message):
  with pytest.raises(ConfigError, match=message): config.override(**values)


def test_an_int_overrides_a_float_knob_and_none_a_knob_whose_default_is_none():
  with config.override(KC_CACHE_MAX_MB=64, KC_CACHE_DIR=None):
    assert config.read("KC_CACHE_MAX_MB") == 64.0 and type(config.read("KC_CACHE_MAX_MB")) is float
    assert config.read("KC_CACHE_DIR") is None


def test_an_override_is_seen_by_its_own_thread_only():
  seen, ready, done = {}, threading.Event(), threading.Event()
  def other():
    ready.wait()
    seen["other"] = config.read("KC_BEAM")
    done.set()
  t = threading.Thread(target=other)
  t.start()
  with config.override(KC_BEAM=7):
    ready.set()
    done.wait(10)
    seen["own"] = config.read("KC_BEAM")
  t.join()
  assert seen == {"own": 7, "other": config.read("KC_BEAM")}


def test_a_snapshot_is_every_knob_as_read_now_and_applied_elsewhere_reads_the_same(monkeypatch):
  monkeypatch.setenv("KC_BEAM", "3")
  monkeypatch.delenv("KC_DEVICE", raising=False)
  with config.override(DEBUG=4): snap = config.snapshot()
  assert set(snap) == {k.name for k in config.knobs()}
  assert snap["KC_BEAM"] == 3 and snap["DEBUG"] == 4 and snap["KC_DEVICE"] == config.knob_named("KC_DEVICE").default
  monkeypatch.setenv("KC_BEAM", "9")  # the environment of another process, say
  with config.applied({**snap, "KC_NOT_DECLARED_HERE": 1}):  # a knob of a plugin this process has not imported
    assert config.read("KC_BEAM") == 3 and config.read("DEBUG") == 4
  assert config.read("KC_BEAM") == 9 and config.read("DEBUG") == 0


def test_a_snapshot_leaves_out_a_variable_that_does_not_parse(monkeypatch):
  monkeypatch.setenv("KC_BEAM", "lots")
  snap = config.snapshot()
  assert "KC_BEAM" not in snap and "DEBUG" in snap
  with config.applied(snap), pytest.raises(ConfigError, match="KC_BEAM"): config.read("KC_BEAM")


# ----------------------------------------------------------------------------------------------------- plugins' knobs

def test_a_plugin_declares_its_knobs_and_reads_them(own_knobs, monkeypatch):
  from kc.backend import knob, read_knob
  arch = knob("KC_TESTDEV_ARCH", str, "gen1", "the arch TESTDEV renders for", "kc_testdev.arch")
  level = knob("KC_TESTDEV_LEVEL", int, 2, "how hard TESTDEV tries", "kc_testdev.arch", choices=(1, 2, 3))
  assert arch.get() == read_knob("KC_TESTDEV_ARCH") == "gen1" and level.get() == 2
  monkeypatch.setenv("KC_TESTDEV_ARCH", " gen2 ")
  monkeypatch.setenv("KC_TESTDEV_LEVEL", "5")
  assert arch.get() == "gen2"
  with pytest.raises(ConfigError, match=r"KC_TESTDEV_LEVEL='5': set it to one of 1, 2, 3"): level.get()
  with config.override(KC_TESTDEV_LEVEL=3): assert level.get() == 3
  table = config.markdown_table()
  assert "| `KC_TESTDEV_ARCH` | str | gen1 | kc_testdev.arch | the arch TESTDEV renders for |" in table
  assert table.index("`KC_TC_OPT`") < table.index("`KC_TESTDEV_ARCH`")  # kc's own first, then the plugins'
  assert knob("KC_TESTDEV_ARCH", str, "gen3", "a reload of the module", "kc_testdev.arch").get() == "gen2"


@pytest.mark.parametrize("name,kind,default,reader,message", [
  ("TESTDEV_ARCH", str, "", "kc_testdev", "a plugin's knob is named KC_<something>"),
  ("KC_BEAM", int, 0, "kc_testdev", "KC_BEAM is one of kc's own knobs"),
  ("KC_CC", str, "", "kc_testdev", "KC_CC is declared by kc_clang.compiler and again by kc_testdev"),
  ("KC_TESTDEV_X", list, [], "kc_testdev", "its type must be one of bool, int, float, str"),
  ("KC_TESTDEV_Y", int, "3", "kc_testdev", "KC_TESTDEV_Y takes an integer"),
  ("KC_testdev", int, 3, "kc_testdev", "upper-case letters"),
])
def test_a_plugin_knob_that_cannot_be_is_a_config_error(own_knobs, name, kind, default, reader, message):
  import kc_clang  # noqa: F401  (declares KC_CC)
  from kc.backend import knob
  with pytest.raises(ConfigError, match=message): knob(name, kind, default, "doc", reader)


def test_a_plugin_knob_can_be_overridden_before_any_device_is_used():
  # the plugin declares KC_CC when it is imported: the override loads the plugins first
  code = ("import sys, kc; assert 'kc_clang' not in sys.modules\n"
          "with kc.Context(KC_CC='clang'): import kc_clang.compiler as c; print(c.compiler_command())")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0 and out.stdout.strip() == "['clang']", out.stderr


def test_env_value_of_plugin_api_1_0_still_reads(own_knobs, monkeypatch):
  from kc.backend import env_value
  monkeypatch.setenv("KC_OLDDEV_THREADS", "3")
  assert env_value("KC_OLDDEV_THREADS", 1) == 3 and env_value("KC_OLDDEV_UNSET", 8) == 8
  monkeypatch.setenv("KC_OLDDEV_THREADS", "many")
  with pytest.raises(ConfigError, match="KC_OLDDEV_THREADS='many'"): env_value("KC_OLDDEV_THREADS", 1)
  with config.override(KC_BEAM=6): assert env_value("KC_BEAM", 0) == 6  # a declared knob reads as declared


# ----------------------------------------------------------------------------------------------------------- the table

def test_the_committed_table_is_the_generated_one(monkeypatch):
  monkeypatch.delenv("KC_DISABLE_PLUGINS", raising=False)
  from kc.tools.cli import main
  out = io.StringIO()
  with redirect_stdout(out): assert main(["config", "--markdown"]) == 0
  generated = out.getvalue().strip()
  text = CONFIG_DOC.read_text()
  committed = text[text.index(config.TABLE_BEGIN):text.index(config.TABLE_END) + len(config.TABLE_END)]
  assert committed == generated, "docs/CONFIG.md's table is stale: paste in the output of `kc config --markdown`"
  for name in ("DEBUG", "KC_TC", "KC_DISABLE_PLUGINS", "KC_CC", "KC_CLANG_THREADS", "KC_OPENCL_DEVICE", "KC_CUDA_ARCH",
               "KC_METAL_FAMILY"):
    assert f"| `{name}` |" in committed


def test_kc_config_lists_values_and_where_they_come_from(capsys, monkeypatch):
  from kc.tools.cli import main
  monkeypatch.setenv("KC_BEAM", "3")
  monkeypatch.setenv("DEBUG", "loud")
  monkeypatch.delenv("KC_CACHE_DIR", raising=False)  # CI sets it: the default is what this line checks
  with config.override(KC_TC=2): assert main(["config"]) == 0
  out = capsys.readouterr().out
  assert re.search(r"^KC_BEAM +3 +environment ", out, re.M) and re.search(r"^KC_TC +2 +override ", out, re.M)
  assert re.search(r"^DEBUG +invalid: DEBUG='loud'", out, re.M)
  assert re.search(r"^KC_CACHE_DIR +~/.cache/kc +", out, re.M)
  assert re.search(r"^KC_CC +", out, re.M)


# ---------------------------------------------------------------------------------------------- the tensor-core level

def _float_matmul():
  x, y = A.arg(1, f32, (4, 8)), A.arg(2, f32, (8, 4))
  return A.sink(A.store(0, (x.reshape(4, 8, 1) * y.reshape(1, 8, 4)).sum(1, keepdims=True)))


def test_the_kernel_layer_never_reads_kc_tc():
  kernel_layer = REPO / "core" / "kc" / "kernel"
  readers = [p.name for p in kernel_layer.rglob("*.py") if re.search(r"[\"']KC_TC[\"']", p.read_text())]
  assert readers == []


def test_a_kernel_takes_its_level_as_a_parameter_not_from_the_environment(monkeypatch):
  monkeypatch.setenv("KC_TC", "3")
  renderer = kc.Device["EMU"].renderer
  k = kc.Kernel(_float_matmul(), renderer)
  k.apply_opt(Opt(OptOps.TC, 0, 0))
  assert (k.tc_level, k.use_tensor_cores) == (1, 1)
  for level in (1, 2, 3):
    k = kc.Kernel(_float_matmul(), renderer, tc_level=level)
    k.apply_opt(Opt(OptOps.TC, 0, 0))
    assert k.use_tensor_cores == level and k.copy().use_tensor_cores == level
  off = kc.Kernel(_float_matmul(), renderer, tc_level=0)
  with pytest.raises(KernelOptError, match="tensor cores are off"): off.apply_opt(Opt(OptOps.TC, 0, 0))
  for bad in (4, -1, "2", True, None):
    with pytest.raises(ConfigError, match="tensor-core level must be 0 .off., 1"):
      kc.Kernel(_float_matmul(), renderer, tc_level=bad)


def test_apply_tensor_cores_takes_the_level_by_its_name_or_its_old_name():
  renderer = kc.Device["EMU"].renderer
  k = kc.Kernel(_float_matmul(), renderer)
  assert k.apply_tensor_cores(use_tensor_cores=2, extra_opts=[]) and k.use_tensor_cores == 2
  assert kc.Kernel(_float_matmul(), renderer).apply_tensor_cores(tc_level=3, extra_opts=[])
  assert kc.Kernel(_float_matmul(), renderer, tc_level=3).apply_tensor_cores(extra_opts=[])  # the kernel's own level
  assert not kc.Kernel(_float_matmul(), renderer).apply_tensor_cores(0)
  with pytest.raises(ConfigError, match="two names of one setting"):
    kc.Kernel(_float_matmul(), renderer).apply_tensor_cores(1, use_tensor_cores=2)
  with pytest.raises(ConfigError, match="got 7"): kc.Kernel(_float_matmul(), renderer).apply_tensor_cores(7)


@pytest.mark.parametrize("level", [1, 2, 3])
def test_kc_compile_reads_kc_tc_once_and_passes_it_down(monkeypatch, level):
  rng = np.random.default_rng(level)
  a, b = rng.standard_normal((4, 8), np.float32), rng.standard_normal((8, 4), np.float32)
  monkeypatch.setenv("KC_TC", str(level))
  ck = kc.compile(_float_matmul(), "EMU", opts=[Opt(OptOps.TC, 0, 0)])
  assert ck.kernel.use_tensor_cores == level
  with config.override(KC_TC=1 + level % 3):
    assert kc.compile(_float_matmul(), "EMU", opts=[Opt(OptOps.TC, 0, 0)]).kernel.use_tensor_cores == 1 + level % 3
  out = kc.run(_float_matmul(), {1: a, 2: b}, "EMU", opts=[Opt(OptOps.TC, 0, 0)])[0]
  np.testing.assert_allclose(out.reshape(4, 4), a @ b, rtol=1e-5, atol=1e-6)


def test_a_conformance_tc_spec_sets_its_level_without_touching_the_environment(monkeypatch):
  from kc_conformance.specs import SPECS, optimized_kernel
  monkeypatch.setenv("KC_TC", "1")
  before = dict(os.environ)
  for level in (1, 2, 3):
    assert optimized_kernel(_float_matmul(), kc.Device["EMU"].renderer, SPECS[f"tc{level}"]).use_tensor_cores == level
  assert dict(os.environ) == before


class _Search:
  """kc.search.beam_search's stand-in: records the level of each kernel it is given and picks the tensor core."""
  def __init__(self): self.levels = []
  def __call__(self, kernel, device, width=2, **kw):
    self.levels.append(kernel.tc_level)
    k = kernel.copy()
    k.apply_opt(Opt(OptOps.TC, 0, 0))
    return SearchResult(opts=list(k.applied_opts), kernel=k, seconds=1e-5, hand_opts=[], hand_seconds=2e-5, compiled=1,
                        timed=1, elapsed=0.1)


def test_two_tensor_core_levels_are_two_opt_cache_entries(cache_dir, monkeypatch):
  monkeypatch.delenv("KC_BEAM", raising=False)
  monkeypatch.delenv("KC_BEAM_CLUSTER", raising=False)
  search = _Search()
  monkeypatch.setattr(kc.search, "beam_search", search)
  sink = _float_matmul()
  for level in ("1", "3", "1", "3"):
    monkeypatch.setenv("KC_TC", level)
    assert kc.compile(sink, "EMU", opts="beam").kernel.use_tensor_cores == int(level)
  assert search.levels == [1, 3] and len(opt_cache()) == 2
  keys = [OptKey.of(sink, kc.Device["EMU"].renderer, "EMU", 2, level) for level in (1, 3)]
  assert keys[0] != keys[1] and all(opt_cache().get(key) is not None for key in keys)
  assert beam_opts(sink, "EMU", tc_level=3).cached and search.levels == [1, 3]


def test_an_opt_cache_made_without_the_level_is_made_again(tmp_path):
  import sqlite3
  with sqlite3.connect(tmp_path / "opts.sqlite") as db:
    db.execute("CREATE TABLE opts (ast_key TEXT NOT NULL, renderer TEXT NOT NULL, device TEXT NOT NULL, "
               "kc_version TEXT NOT NULL, width INTEGER NOT NULL, opts TEXT NOT NULL, seconds REAL, hand_seconds REAL, "
               "elapsed REAL, PRIMARY KEY (ast_key, renderer, device, kc_version, width))")
    db.execute("INSERT INTO opts VALUES ('a', 'r', 'EMU', '0.1', 2, '[]', 1.0, 1.0, 1.0)")
  cache = OptCache(str(tmp_path))
  key = OptKey("a", "r", "EMU", "0.1", 2, 3)
  assert len(cache) == 0 and cache.get(key) is None
  cache.put(key, OptEntry((Opt(OptOps.UPCAST, 0, 4),)))
  assert cache.on_disk and OptCache(str(tmp_path)).get(key) == OptEntry((Opt(OptOps.UPCAST, 0, 4),))


def test_debug_level_follows_the_environment_and_overrides(monkeypatch):
  """debug_level's shortcut (nothing set: the default) must give what read("DEBUG") gives in every other case."""
  monkeypatch.delenv("DEBUG", raising=False)
  assert config.debug_level() == 0
  with kc.Context(DEBUG=3): assert config.debug_level() == 3
  monkeypatch.setenv("DEBUG", "2")
  assert config.debug_level() == 2
  with kc.Context(DEBUG=5): assert config.debug_level() == 5
  monkeypatch.setenv("DEBUG", "lots")
  with pytest.raises(kc.ConfigError): config.debug_level()
  monkeypatch.delenv("DEBUG")
  assert config.debug_level() == 0
