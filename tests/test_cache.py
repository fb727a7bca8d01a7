"""The compile cache (kc.runtime.cache): hits and misses, the size limit with least-recently-used eviction, entries checked
against their key, several processes writing at once, and folders that cannot hold the cache."""
import multiprocessing, os, shutil, sqlite3, stat, subprocess, tempfile, warnings
import pytest
from hypothesis import given, settings, strategies as st
import kc
import kc.runtime.device
from kc.runtime.cache import DB_NAME, CacheWarning, DiskCache, cache_max_bytes, compile_cache, compile_cache_dir
from kc.runtime.device import Compiler
from kc.errors import ConfigError


class CountingCompiler(Compiler):
  def __init__(self, ident="fake-cc 1.0", plugin_version="kc-fake 0.1", pad=0):
    super().__init__(plugin_version)
    self.ident, self.calls, self.pad = ident, 0, pad
  def identity(self): return self.ident
  def compile_uncached(self, src):
    self.calls += 1
    return f"BIN[{self.ident}]:{src}".encode() + b"." * self.pad


def rows(cache_dir):
  with sqlite3.connect(cache_dir / DB_NAME) as db: return dict(db.execute("SELECT key, blob FROM entries"))


def test_second_compile_is_a_cache_hit(cache_dir):
  c = CountingCompiler()
  assert c.compile("kernel A") == b"BIN[fake-cc 1.0]:kernel A"
  assert CountingCompiler().compile("kernel A") == b"BIN[fake-cc 1.0]:kernel A"  # a new compiler (process) reads the disk
  assert c.compile("kernel A") == b"BIN[fake-cc 1.0]:kernel A" and c.calls == 1
  assert c.compile("kernel B") == b"BIN[fake-cc 1.0]:kernel B" and c.calls == 2  # another source is a miss
  assert set(rows(cache_dir)) == {c.cache_key("kernel A"), c.cache_key("kernel B")}


def test_cache_key_depends_on_source_identity_and_versions(cache_dir, monkeypatch):
  c = CountingCompiler()
  keys = {c.cache_key("k"), c.cache_key("k2"), CountingCompiler(ident="fake-cc 2.0").cache_key("k"),
          CountingCompiler(plugin_version="kc-fake 0.2").cache_key("k")}
  monkeypatch.setattr(kc.runtime.device, "distribution_version", lambda dist: "99.0")  # another kc release
  keys.add(c.cache_key("k"))
  assert len(keys) == 5
  c.compile("k")
  c2 = CountingCompiler(ident="fake-cc 2.0")
  assert c2.compile("k") == b"BIN[fake-cc 2.0]:k" and c2.calls == 1  # an upgraded compiler never gets the old binary


def test_unset_cache_dir_is_under_home_and_caches(monkeypatch, tmp_path):
  # unset is the default folder, not "off": a fresh process must find what an earlier one compiled
  monkeypatch.delenv("KC_CACHE_DIR", raising=False)
  monkeypatch.setenv("HOME", str(tmp_path))
  assert compile_cache_dir() == str(tmp_path / ".cache" / "kc")
  c = CountingCompiler()
  c.compile("k"), c.compile("k")
  assert c.calls == 1 and (tmp_path / ".cache" / "kc").is_dir()


def test_empty_cache_dir_turns_the_cache_off(monkeypatch, tmp_path):
  monkeypatch.setenv("KC_CACHE_DIR", "")
  monkeypatch.chdir(tmp_path)
  c = CountingCompiler()
  c.compile("k"), c.compile("k")
  assert c.calls == 2 and not any(tmp_path.iterdir())


# ---------------------------------------------------------------------------------------------------------- size limit

def test_least_recently_used_entries_are_evicted_first(cache_dir, monkeypatch):
  monkeypatch.setenv("KC_CACHE_MAX_MB", str(3000 / 2**20))  # room for two entries of ~1100 bytes, not three
  c = CountingCompiler(pad=1000)
  c.compile("a"), c.compile("b")
  c.compile("a")                  # a hit: "a" is now the most recently used
  c.compile("c")                  # over the limit: "b", the least recently used, goes
  assert compile_cache().keys() == [c.cache_key("a"), c.cache_key("c")] and c.calls == 3
  assert compile_cache().total_bytes() <= 3000
  c.compile("a")
  assert c.calls == 3             # still there
  c.compile("b")
  assert c.calls == 4 and compile_cache().keys() == [c.cache_key("a"), c.cache_key("b")]


def test_an_entry_larger_than_the_limit_is_compiled_but_not_kept(cache_dir, monkeypatch):
  monkeypatch.setenv("KC_CACHE_MAX_MB", str(500 / 2**20))
  c = CountingCompiler(pad=1000)
  assert c.compile("big").startswith(b"BIN[") and c.compile("big").startswith(b"BIN[") and c.calls == 2
  assert compile_cache().keys() == []


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from("get put".split()), st.integers(0, 5), st.integers(0, 300)), max_size=40),
       limit=st.integers(200, 1200))
def test_eviction_matches_a_model_lru(ops, limit):
  """Any sequence of gets and puts leaves exactly the entries (in the order of use) an in-memory LRU model keeps."""
  with tempfile.TemporaryDirectory() as root:
    cache, model = DiskCache(root, limit), {}  # model: key -> stored size, in order of use
    for op, k, n in ops:
      key = f"{k:064x}"
      if op == "get":
        got = cache.get(key)
        assert (got is not None) == (key in model)
        if key in model: model[key] = model.pop(key)
      else:
        payload = bytes([k]) * n
        cache.put(key, payload)
        if (size := n + 96) <= limit:
          model.pop(key, None)
          model[key] = size
          while sum(model.values()) > limit: model.pop(next(iter(model)))
        else: model.pop(key, None)  # too big to keep, and an older value under its key goes too
        assert cache.get(key) == (payload if key in model else None)
        if key in model: model[key] = model.pop(key)
    assert cache.keys() == list(model) and cache.total_bytes() == sum(model.values()) <= limit
    assert running_total(root) == sum(model.values())  # the triggers' total, which decides when to evict


def running_total(root) -> int:
  with sqlite3.connect(os.path.join(root, DB_NAME)) as db: return db.execute("SELECT bytes FROM totals").fetchone()[0]


def test_a_put_reads_no_blob_to_know_the_total(tmp_path):
  # the sum and the eviction's walk are answered from the index (size lies after the blob in a row: reading it read
  # every blob's overflow pages, tens of ms a put in a large cache), and the running total from its own one-row table
  cache = DiskCache(str(tmp_path), 10**6)
  cache.put("0" * 64, b"x" * 100_000)
  db = sqlite3.connect(tmp_path / DB_NAME)
  plans = [" ".join(r[-1] for r in db.execute(f"EXPLAIN QUERY PLAN {q}")) for q in
           ("SELECT COALESCE(SUM(size), 0) FROM entries INDEXED BY entries_by_use_and_size",
            "SELECT rowid, size FROM entries INDEXED BY entries_by_use_and_size ORDER BY last_used")]
  assert all("COVERING INDEX" in p for p in plans), plans
  assert running_total(tmp_path) == 100_000 + 96


def test_a_cache_an_older_kc_made_gets_its_total_and_heals_a_drifted_one(tmp_path):
  # an older kc's database: no totals table, an index on last_used alone, one entry (1096 bytes stored, as packed)
  path = tmp_path / DB_NAME
  with sqlite3.connect(path) as db:
    db.execute("CREATE TABLE entries (key TEXT PRIMARY KEY, blob BLOB NOT NULL, size INTEGER NOT NULL, last_used INTEGER NOT NULL)")
    db.execute("CREATE INDEX entries_by_use ON entries (last_used)")
    db.execute("INSERT INTO entries VALUES (?, ?, 1096, 1)", ("a" * 64, b"x"))
  cache = DiskCache(str(tmp_path), 3000)
  cache.put("b" * 64, b"y" * 1000)  # opening sums what was there; the put adds its own
  assert running_total(tmp_path) == 2 * 1096 == cache.total_bytes()
  for _ in range(3):  # an older kc replacing the same entry, without recursive triggers: the total counts it again
    with sqlite3.connect(path) as db: db.execute("INSERT OR REPLACE INTO entries VALUES (?, ?, 1096, 99)", ("a" * 64, b"z"))
  assert running_total(tmp_path) == 5 * 1096
  cache.put("c" * 64, b"w" * 10)  # the total says over the limit: the exact sum decides, nothing goes, the total is right
  assert sorted(k[0] for k in cache.keys()) == ["a", "b", "c"] and running_total(tmp_path) == cache.total_bytes() == 2 * 1096 + 106


@pytest.mark.parametrize("value", ["abc", "-5", "0", "nan", "inf"])
def test_a_bad_size_limit_is_a_config_error_naming_the_variable(cache_dir, monkeypatch, value):
  monkeypatch.setenv("KC_CACHE_MAX_MB", value)
  with pytest.raises(ConfigError, match="KC_CACHE_MAX_MB"): CountingCompiler().compile("k")


def test_the_size_limit_defaults_to_a_few_hundred_megabytes(monkeypatch):
  monkeypatch.delenv("KC_CACHE_MAX_MB", raising=False)
  assert 100 * 2**20 <= cache_max_bytes() <= 1024 * 2**20
  monkeypatch.setenv("KC_CACHE_MAX_MB", "1.5")
  assert cache_max_bytes() == int(1.5 * 2**20)


# ---------------------------------------------------------------------------------------------------------- bad entries

def test_swapped_entries_are_misses_and_are_replaced(cache_dir):
  c = CountingCompiler()
  ka, kb = c.cache_key("kernel a"), c.cache_key("kernel b")
  c.compile("kernel a"), c.compile("kernel b")
  with sqlite3.connect(cache_dir / DB_NAME) as db:  # each key now holds the other's binary
    blobs = rows(cache_dir)
    db.execute("UPDATE entries SET blob = ? WHERE key = ?", (blobs[kb], ka))
    db.execute("UPDATE entries SET blob = ? WHERE key = ?", (blobs[ka], kb))
  assert c.compile("kernel a") == b"BIN[fake-cc 1.0]:kernel a" and c.compile("kernel b") == b"BIN[fake-cc 1.0]:kernel b"
  assert c.calls == 4
  assert rows(cache_dir) == blobs  # replaced by the right entries, which are hits again
  assert c.compile("kernel a") == b"BIN[fake-cc 1.0]:kernel a" and c.calls == 4


@pytest.mark.parametrize("damage", [lambda b: b[:len(b) // 2], lambda b: b[:-1] + bytes([b[-1] ^ 1]), lambda b: b"", lambda b: b"junk"],
                         ids=["truncated", "bit-flip", "empty", "junk"])
def test_a_corrupt_entry_is_a_miss_and_is_rewritten(cache_dir, damage):
  c = CountingCompiler()
  key = c.cache_key("kernel source")
  c.compile("kernel source")
  good = rows(cache_dir)[key]
  with sqlite3.connect(cache_dir / DB_NAME) as db: db.execute("UPDATE entries SET blob = ? WHERE key = ?", (damage(good), key))
  assert c.compile("kernel source") == b"BIN[fake-cc 1.0]:kernel source" and c.calls == 2
  assert rows(cache_dir)[key] == good
  assert CountingCompiler().compile("kernel source") == b"BIN[fake-cc 1.0]:kernel source" and c.calls == 2


# ---------------------------------------------------------------------------------------------------------- concurrency

class Slow(Compiler):
  def identity(self): return "race"
  def compile_uncached(self, src): return (src * 500).encode()


def _writer(n: int, seed: int) -> int:
  """Compile overlapping sources (kernel 0..9, in an order of its own) and check every result; returns the count."""
  c = Slow()
  for i in range(n):
    src = f"kernel {(i * (seed + 3)) % 10}"
    assert c.compile(src) == (src * 500).encode(), src
  return n


def test_concurrent_writers_in_several_processes_all_succeed(cache_dir, monkeypatch):
  # a limit that holds about half the sources, so the writers also evict each other's entries
  monkeypatch.setenv("KC_CACHE_MAX_MB", str(5 * 4100 / 2**20))
  with warnings.catch_warnings():
    warnings.simplefilter("error", CacheWarning)
    with multiprocessing.get_context("spawn").Pool(4) as pool:
      assert pool.starmap(_writer, [(60, s) for s in range(4)], chunksize=1) == [60] * 4
  keys = compile_cache().keys()
  assert 0 < len(keys) <= 5 and compile_cache().total_bytes() <= 5 * 4100
  assert all(Slow().compile(f"kernel {i}") == (f"kernel {i}" * 500).encode() for i in range(10))


def _open_together(root: str, i: int, barrier, results) -> None:
  try:
    barrier.wait()
    cache = DiskCache(root, 1 << 20)
    if i % 2: cache.get("k0")
    else: cache.put(f"k{i}", b"x" * 10)
    results.put(None)
  except Exception as e:  # noqa: BLE001  (reported to the test)
    results.put(f"{type(e).__name__}: {e}")


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork here")
def test_processes_that_open_a_new_cache_at_the_same_moment_all_succeed(tmp_path):
  # a compile worker and its caller opening a new KC_CACHE_DIR together: sqlite answered one of two connections
  # that switched the new database to WAL at once "database is locked", without waiting (13 of 100 rounds failed)
  ctx = multiprocessing.get_context("fork")
  for round_ in range(30):
    root, n = str(tmp_path / f"round{round_}"), 6
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_open_together, args=(root, i, barrier, results)) for i in range(n)]
    for p in procs: p.start()
    errors = [e for e in (results.get(timeout=60) for _ in procs) if e is not None]
    for p in procs: p.join()
    assert not errors, (round_, errors)


# ---------------------------------------------------------------------------------------------------------- unusable folders

def test_a_file_as_cache_dir_warns_once_and_still_compiles(tmp_path, monkeypatch):
  blocker = tmp_path / "file"
  blocker.write_text("not a folder")
  monkeypatch.setenv("KC_CACHE_DIR", str(blocker))
  c = CountingCompiler()
  with pytest.warns(CacheWarning, match=r"KC_CACHE_DIR=.*file.*compiling without a cache"):
    assert c.compile("k") == b"BIN[fake-cc 1.0]:k"
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert c.compile("k") == b"BIN[fake-cc 1.0]:k" and c.calls == 2  # uncached, and no second warning
  assert blocker.read_text() == "not a folder"


def test_a_database_that_is_not_one_warns_and_still_compiles(tmp_path, monkeypatch):
  (tmp_path / DB_NAME).write_bytes(b"this is not an sqlite database" * 100)
  monkeypatch.setenv("KC_CACHE_DIR", str(tmp_path))
  with pytest.warns(CacheWarning, match="compiling without a cache"):
    assert CountingCompiler().compile("k") == b"BIN[fake-cc 1.0]:k"


@pytest.fixture
def read_only_dir(tmp_path):
  """A folder nobody can write into. Root writes through permission bits, so for root the folder is made immutable."""
  d = tmp_path / "ro"
  d.mkdir()
  if os.geteuid() != 0:
    d.chmod(stat.S_IRUSR | stat.S_IXUSR)
    yield d
    d.chmod(stat.S_IRWXU)
    return
  if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode != 0:
    pytest.skip("running as root where chattr +i does not work: no way to make a folder root cannot write")
  yield d
  subprocess.run(["chattr", "-i", str(d)], check=True)


def test_a_read_only_cache_dir_warns_once_and_still_compiles(read_only_dir, monkeypatch):
  monkeypatch.setenv("KC_CACHE_DIR", str(read_only_dir))
  c = CountingCompiler()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert c.compile("k") == b"BIN[fake-cc 1.0]:k" and c.compile("k") == b"BIN[fake-cc 1.0]:k"
  (w,) = [w for w in caught if issubclass(w.category, CacheWarning)]
  assert str(read_only_dir) in str(w.message) and "compiling without a cache" in str(w.message)
  assert c.calls == 2 and list(read_only_dir.iterdir()) == []
