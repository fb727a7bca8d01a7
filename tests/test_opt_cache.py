"""The opt cache (kc.runtime.opt_cache): AST keys that are stable across processes and tell ASTs apart, entries that
round-trip, several processes storing at once, and folders that cannot hold the cache."""
import multiprocessing, os, shutil, sqlite3, stat, subprocess, warnings
import pytest
from hypothesis import given, settings, strategies as st
import kc
from kc import ast as A
from kc.errors import KcError
from kc.ir.dtype import dtypes
from kc.kernel import Opt, OptOps
from kc.tools.fuzz.generate import generate
from kc.tools.fuzz.recipe import kc_lines
from kc.runtime.cache import CacheWarning
from kc.runtime.opt_cache import DB_NAME, OptCache, OptCacheWarning, OptEntry, OptKey, ast_key, opt_cache, opts_from_json, \
  opts_to_json, renderer_identity

OPTS = (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 0), Opt(OptOps.LOCAL, 1, 16), Opt(OptOps.NOLOCALS), Opt(OptOps.TC, 0, 2))


def _fuzz_source(seed: int):
  """The kc.ast code of fuzz kernel `seed`, or None when that recipe is one kc refuses (a typed error)."""
  code = "\n".join(kc_lines(generate(seed)))
  try: _build(code)
  except KcError: return None
  return code


def _build(code: str):
  ns = {"A": A, "dtypes": dtypes}
  exec(code, ns)  # noqa: S102 (the fuzzer's own generated kc.ast code)
  return ns["sink"]


def _keys_of(codes: list[str]) -> list[str]:
  return [ast_key(_build(c)) for c in codes]


def _key(device="CLANG", width=2, ast="a" * 64):
  return OptKey(ast, "SomeRenderer|CLANG|x86_64", device, "0.1.0", width)


# ---------------------------------------------------------------------------------------------------------- AST keys

def test_ast_keys_are_equal_across_processes():
  codes = [c for c in map(_fuzz_source, range(40)) if c is not None]
  assert len(codes) >= 20
  # a spawned process has its own UOp cache, object ids and string hash seed: only the structure is shared
  with multiprocessing.get_context("spawn").Pool(1) as pool:
    theirs = pool.apply(_keys_of, (codes,))
  assert theirs == _keys_of(codes)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_ast_keys_are_equal_exactly_when_the_asts_are(a, b):
  # UOps are hash-consed: in one process two ASTs are equal exactly when they are the same object
  ca, cb = _fuzz_source(a), _fuzz_source(b)
  if ca is None or cb is None: return
  sa, sb = _build(ca), _build(cb)
  assert ast_key(sa) == ast_key(_build(ca))
  assert (ast_key(sa) == ast_key(sb)) == (sa is sb)


def test_ast_keys_tell_apart_what_a_loose_text_would_not():
  x, y = A.arg(1, dtypes.float32, (8,)), A.arg(2, dtypes.float32, (8,))
  sinks = [A.sink(A.store(0, x + y)), A.sink(A.store(0, y + x)), A.sink(A.store(0, x * y)),
           A.sink(A.store(0, x + 0.0)), A.sink(A.store(0, x + -0.0)),                         # 0.0 and -0.0
           A.sink(A.store(0, A.arg(1, dtypes.float32, (4, 2)).sum(1))), A.sink(A.store(0, A.arg(1, dtypes.float32, (2, 4)).sum(1))),
           A.sink(A.store(0, A.arg(1, dtypes.float16, (8,)) + A.arg(2, dtypes.float16, (8,))))]
  assert len({id(s) for s in sinks}) == len(sinks)
  assert len({ast_key(s) for s in sinks}) == len(sinks)


def test_renderer_identity_names_class_device_and_arch():
  r = kc.Device["EMU"].renderer
  ident = renderer_identity(r)
  assert type(r).__qualname__ in ident and r.device in ident
  clone = type(r).__new__(type(r))
  clone.__dict__.update(r.__dict__)
  clone.arch = "some-other-isa"
  assert renderer_identity(clone) != ident and "some-other-isa" in renderer_identity(clone)


# ---------------------------------------------------------------------------------------------------------- round trip

def test_opts_json_round_trip_and_bad_rows_are_misses():
  assert opts_from_json(opts_to_json(OPTS)) == OPTS
  assert opts_from_json("[]") == ()
  for bad in ("not json", '[["NO_SUCH_OP", 0, 1]]', '[["UPCAST", 0]]', '{"a": 1}', "[1, 2]"):
    assert opts_from_json(bad) is None, bad


def test_an_entry_round_trips_through_the_disk(cache_dir):
  key, entry = _key(), OptEntry(OPTS, 1e-4, 3e-4, 2.5)
  assert opt_cache().get(key) is None
  opt_cache().put(key, entry)
  assert (cache_dir / DB_NAME).exists()
  assert OptCache(str(cache_dir)).get(key) == entry  # a fresh cache (another process) reads it from the file
  # every part of the key matters
  for other in (_key(device="EMU"), _key(width=3), _key(ast="b" * 64), OptKey(key.ast_key, key.renderer, key.device, "0.2.0", 2)):
    assert OptCache(str(cache_dir)).get(other) is None
  newer = OptEntry(OPTS[:2], 5e-5, 3e-4, 1.0)
  opt_cache().put(key, newer)  # a new search replaces the old result
  assert OptCache(str(cache_dir)).get(key) == newer and len(OptCache(str(cache_dir))) == 1
  opt_cache().forget(key)
  assert OptCache(str(cache_dir)).get(key) is None


def test_a_damaged_row_is_a_miss(cache_dir):
  key = _key()
  opt_cache().put(key, OptEntry(OPTS))
  with sqlite3.connect(cache_dir / DB_NAME) as db: db.execute("UPDATE opts SET opts = '[[\"GONE\", 1, 2]]'")
  assert OptCache(str(cache_dir)).get(key) is None


def test_the_key_of_a_real_kernel_names_its_renderer(cache_dir):
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (16,)) * 2.0))
  emu = kc.Device["EMU"]
  key = OptKey.of(sink, emu.renderer, "EMU", 2)
  assert key.ast_key == ast_key(sink) and key.renderer == renderer_identity(emu.renderer) and key.kc_version == kc.__version__


# ---------------------------------------------------------------------------------------------------------- concurrency

def _store_many(root: str, writer: int, n: int) -> int:
  cache = OptCache(root)
  with warnings.catch_warnings():
    warnings.simplefilter("error", CacheWarning)  # a writer that fell back to memory would hide a lost entry
    for i in range(n):
      # every writer stores the shared keys 0..9 and keys of its own
      cache.put(_key(ast=f"shared-{i % 10}"), OptEntry((Opt(OptOps.UPCAST, 0, writer + 1),), float(writer)))
      cache.put(_key(ast=f"writer-{writer}-{i}"), OptEntry((Opt(OptOps.LOCAL, 0, i + 1),), float(i)))
  return n


def test_two_processes_storing_at_once_both_land(cache_dir):
  n = 40
  with multiprocessing.get_context("spawn").Pool(2) as pool:
    assert pool.starmap(_store_many, [(str(cache_dir), w, n) for w in range(2)]) == [n, n]
  cache = OptCache(str(cache_dir))
  for w in range(2):
    for i in range(n):
      assert cache.get(_key(ast=f"writer-{w}-{i}")) == OptEntry((Opt(OptOps.LOCAL, 0, i + 1),), float(i))
  for i in range(10):  # a shared key holds one writer's whole entry, never a mix
    e = cache.get(_key(ast=f"shared-{i}"))
    assert e is not None and e.opts == (Opt(OptOps.UPCAST, 0, int(e.seconds) + 1),)
  assert len(cache) == 10 + 2 * n


# ---------------------------------------------------------------------------------------------------------- unusable folders

def _falls_back_once(root):
  """Store and read through an unusable folder: one OptCacheWarning, and the entries are kept in memory."""
  cache = opt_cache()
  key, entry = _key(), OptEntry(OPTS, 1.0)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert cache.get(key) is None
    cache.put(key, entry)
    assert cache.get(key) == entry
    cache.put(_key(width=7), entry)
    assert opt_cache().get(_key(width=7)) == entry and len(cache) == 2
  (w,) = [w for w in caught if issubclass(w.category, CacheWarning)]
  assert w.category is OptCacheWarning and str(root) in str(w.message) and "in memory" in str(w.message)
  assert not cache.on_disk


@pytest.fixture
def read_only_dir(tmp_path):
  """A folder this process cannot write into: mode 0o500, or for root (who writes through mode bits) an immutable one."""
  root = tmp_path / "ro"
  root.mkdir()
  root.chmod(stat.S_IRUSR | stat.S_IXUSR)
  immutable = False
  try:
    if os.access(root, os.W_OK):
      immutable = shutil.which("chattr") is not None and subprocess.run(["chattr", "+i", str(root)], capture_output=True).returncode == 0
      if not immutable: pytest.skip("this user writes through permission bits (root) and chattr +i does not work here")
    yield root
  finally:
    if immutable: subprocess.run(["chattr", "-i", str(root)], check=True)
    root.chmod(stat.S_IRWXU)


def test_a_read_only_dir_warns_once_and_keeps_results_in_memory(read_only_dir, monkeypatch):
  monkeypatch.setenv("KC_CACHE_DIR", str(read_only_dir))
  _falls_back_once(read_only_dir)
  assert list(read_only_dir.iterdir()) == []


def test_a_file_that_is_not_a_database_warns_once_and_keeps_results_in_memory(tmp_path, monkeypatch):
  (tmp_path / DB_NAME).write_bytes(b"\x00garbage, not an sqlite database\xff" * 200)
  monkeypatch.setenv("KC_CACHE_DIR", str(tmp_path))
  _falls_back_once(tmp_path)
  assert (tmp_path / DB_NAME).read_bytes().startswith(b"\x00garbage")  # the file is left alone


def test_a_file_where_the_folder_should_be_warns_once_and_keeps_results_in_memory(tmp_path, monkeypatch):
  (tmp_path / "file").write_text("not a folder")
  monkeypatch.setenv("KC_CACHE_DIR", str(tmp_path / "file" / "kc"))
  _falls_back_once(tmp_path / "file" / "kc")


def test_an_empty_cache_dir_keeps_results_in_memory_without_a_warning(tmp_path, monkeypatch):
  monkeypatch.setenv("KC_CACHE_DIR", "")
  monkeypatch.chdir(tmp_path)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    opt_cache().put(_key(), OptEntry(OPTS))
    assert opt_cache().get(_key()) == OptEntry(OPTS)
  assert list(tmp_path.iterdir()) == []
