"""The compile cache on disk: compiled binaries by key, in one sqlite database under $KC_CACHE_DIR.

sqlite (stdlib) rather than a folder of files because it already solves what a cache shared by processes needs:
writers in several processes at once (WAL mode, a busy timeout), atomic entries, and a cheap query for the least
recently used entries when the cache is over its size limit ($KC_CACHE_MAX_MB).

Each stored blob starts with the key it was stored under and a digest of its payload. An entry whose stored key or
digest does not match (a copied, swapped or damaged row) is a miss: it is deleted and the caller's fresh result
replaces it, so a bad entry never sticks. The cache is an optimization: a folder that cannot hold it (not
writable, a file) gives one warning and compilation goes on without it."""
from __future__ import annotations
import hashlib, os, sqlite3, threading, time, warnings
from typing import Optional
from kc.config import knob_named, read
from kc.errors import ConfigError

DEFAULT_MAX_MB = knob_named("KC_CACHE_MAX_MB").default
DB_NAME = "compile.db"
BUSY_TIMEOUT_S = 60.0  # a writer waits this long for another process's transaction before the entry is dropped
_KEY_LEN = 64          # keys are sha256 hex digests
_DIGEST_LEN = 32
# last_used is a logical clock kept by the database itself: one more than the newest use, so every process orders
# uses the same way (wall clocks of two processes can tie or disagree)
_NEXT_USE = "(SELECT COALESCE(MAX(last_used), 0) + 1 FROM entries)"


class CacheWarning(UserWarning):
  """The compile cache cannot be used; kc compiles without it."""


def compile_cache_dir() -> Optional[str]:
  """Where compiled programs are kept: $KC_CACHE_DIR, default ~/.cache/kc. KC_CACHE_DIR set to the empty
  string turns the cache off."""
  d = read("KC_CACHE_DIR")  # unset (None) and empty ("") mean different things here
  if d is None: return os.path.join(os.path.expanduser("~"), ".cache", "kc")
  return d or None


def cache_max_bytes() -> int:
  """The size limit from $KC_CACHE_MAX_MB (megabytes, default 512); a bad value raises ConfigError."""
  mb = read("KC_CACHE_MAX_MB")
  if not mb > 0 or mb == float("inf"):
    raise ConfigError(f"KC_CACHE_MAX_MB={mb!r} is not a size: give a number of megabytes > 0 "
                      "(KC_CACHE_DIR= turns the cache off)")
  return int(mb * 1024 * 1024)


def _pack(key: str, payload: bytes) -> bytes:
  return key.encode().ljust(_KEY_LEN, b"\0")[:_KEY_LEN] + hashlib.sha256(payload).digest() + payload


def _unpack(key: str, blob: bytes) -> Optional[bytes]:
  """The payload when `blob` was stored under `key` and is whole, else None."""
  head = _KEY_LEN + _DIGEST_LEN
  if not isinstance(blob, bytes) or len(blob) < head or blob[:_KEY_LEN] != key.encode().ljust(_KEY_LEN, b"\0")[:_KEY_LEN]: return None
  payload = blob[head:]
  return payload if hashlib.sha256(payload).digest() == blob[_KEY_LEN:head] else None


def _to_wal(conn: sqlite3.Connection) -> None:
  """Put the database in WAL mode. Of two connections that switch a new database at the same moment, sqlite answers
  one "database is locked" at once, without waiting in its busy handler (two processes opening a new cache together:
  a compile worker and its caller, 13 of 100 such openings of six processes): that answer is retried, with growing
  pauses, for up to BUSY_TIMEOUT_S, as a write waits."""
  deadline, pause = time.monotonic() + BUSY_TIMEOUT_S, 0.001
  while True:
    try:
      conn.execute("PRAGMA journal_mode=WAL")
      return
    except sqlite3.OperationalError as e:
      if "locked" not in str(e) and "busy" not in str(e) or time.monotonic() > deadline: raise
    time.sleep(pause)
    pause = min(2 * pause, 0.05)


def open_sqlite(root: str, path: str, statements: list[str]) -> sqlite3.Connection:
  """A connection to the sqlite file `path` in the folder `root` (made if missing) in WAL mode, shared by processes
  (sqlite's locking, waiting up to BUSY_TIMEOUT_S for a writer) and by threads (the caller holds a lock), after
  running `statements` (the schema). Raises OSError or sqlite3.Error when the folder cannot hold it."""
  os.makedirs(root, exist_ok=True)
  conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
  try:
    _to_wal(conn)
    for statement in statements: conn.execute(statement)
  except BaseException:
    conn.close()
    raise
  return conn


# The total size is kept in a one-row table by triggers, so a put does not sum the table: `size` lies after the blob in
# each row, and summing it read every blob's overflow pages (tens of ms a put in a cache of 60 MB, which the put paid
# again and again). The index on (last_used, size) makes the eviction's walk and an exact sum read no blob either.
# REPLACE deletes the old row, which fires the delete trigger only with recursive_triggers on. The schema is made in
# one write transaction, so no entry lands between the total's first sum and its triggers.
_BY_USE = "entries_by_use_and_size"
_SCHEMA = [
  "PRAGMA synchronous=NORMAL",  # WAL stays consistent on a crash; losing the last entries only costs a compile
  "PRAGMA recursive_triggers=ON",
  "BEGIN IMMEDIATE",
  "CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, blob BLOB NOT NULL, size INTEGER NOT NULL, last_used INTEGER NOT NULL)",
  f"CREATE INDEX IF NOT EXISTS {_BY_USE} ON entries (last_used, size)",
  "DROP INDEX IF EXISTS entries_by_use",  # an older kc's index on last_used alone: the new one serves its queries
  "CREATE TABLE IF NOT EXISTS totals (id INTEGER PRIMARY KEY CHECK (id = 0), bytes INTEGER NOT NULL)",
  f"INSERT OR IGNORE INTO totals (id, bytes) SELECT 0, COALESCE(SUM(size), 0) FROM entries INDEXED BY {_BY_USE}",
  "CREATE TRIGGER IF NOT EXISTS entries_added AFTER INSERT ON entries BEGIN UPDATE totals SET bytes = bytes + NEW.size WHERE id = 0; END",
  "CREATE TRIGGER IF NOT EXISTS entries_removed AFTER DELETE ON entries BEGIN UPDATE totals SET bytes = bytes - OLD.size WHERE id = 0; END",
  "COMMIT"]


class DiskCache:
  """One sqlite database of key -> (blob, size, last_used). Safe to share between threads (one lock) and processes
  (sqlite's locking); a process that forks opens its own connection."""

  def __init__(self, root: str, max_bytes: int):
    self.root, self.path, self.max_bytes = root, os.path.join(root, DB_NAME), max_bytes
    self._lock = threading.Lock()
    self._conn: Optional[sqlite3.Connection] = None
    self._pid = -1

  def _connection(self) -> sqlite3.Connection:
    if self._conn is None or self._pid != os.getpid():
      # a connection inherited through fork is never used (nor closed: sqlite forbids both); the child opens its own
      self._conn, self._pid = open_sqlite(self.root, self.path, _SCHEMA), os.getpid()
    return self._conn

  def check(self):
    """Open the database now: raises OSError or sqlite3.Error when the folder cannot hold it."""
    with self._lock: self._connection()

  def get(self, key: str) -> Optional[bytes]:
    with self._lock:
      conn = self._connection()
      row = conn.execute("SELECT blob FROM entries WHERE key = ?", (key,)).fetchone()
      if row is None: return None
      if (payload := _unpack(key, bytes(row[0]))) is None:
        conn.execute("DELETE FROM entries WHERE key = ?", (key,))
        return None
      conn.execute(f"UPDATE entries SET last_used = {_NEXT_USE} WHERE key = ?", (key,))
      return payload

  def put(self, key: str, payload: bytes):
    blob = _pack(key, payload)
    with self._lock:
      conn = self._connection()
      if len(blob) > self.max_bytes:  # it would evict everything and still not fit; an older value must not stay either
        conn.execute("DELETE FROM entries WHERE key = ?", (key,))
        return
      conn.execute("BEGIN IMMEDIATE")
      try:
        conn.execute(f"INSERT OR REPLACE INTO entries (key, blob, size, last_used) VALUES (?, ?, ?, {_NEXT_USE})", (key, blob, len(blob)))
        self._evict(conn)
        conn.execute("COMMIT")
      except BaseException:
        conn.execute("ROLLBACK")
        raise

  def _evict(self, conn: sqlite3.Connection):
    """Delete least recently used entries until the total size is within the limit. The running total decides
    whether to; the sum itself (over the index, never the blobs) decides how many, as an older kc's REPLACE without
    recursive triggers leaves the running total too high, and this puts it right."""
    if conn.execute("SELECT bytes FROM totals WHERE id = 0").fetchone()[0] <= self.max_bytes: return
    total = conn.execute(f"SELECT COALESCE(SUM(size), 0) FROM entries INDEXED BY {_BY_USE}").fetchone()[0]
    doomed = []
    for rowid, size in conn.execute(f"SELECT rowid, size FROM entries INDEXED BY {_BY_USE} ORDER BY last_used"):
      if total <= self.max_bytes: break
      doomed.append((rowid,))
      total -= size
    conn.executemany("DELETE FROM entries WHERE rowid = ?", doomed)
    conn.execute("UPDATE totals SET bytes = ? WHERE id = 0", (total,))

  def keys(self) -> list[str]:
    """Every key, least recently used first."""
    with self._lock: return [k for (k,) in self._connection().execute("SELECT key FROM entries ORDER BY last_used")]

  def total_bytes(self) -> int:
    with self._lock: return self._connection().execute(f"SELECT COALESCE(SUM(size), 0) FROM entries INDEXED BY {_BY_USE}").fetchone()[0]


_caches: dict[str, DiskCache] = {}
_unusable: dict[str, str] = {}
_caches_lock = threading.Lock()


def _warn_unusable(root: str, err: BaseException):
  why = f"{type(err).__name__}: {err}"
  with _caches_lock:
    first = root not in _unusable
    _unusable[root] = why
  if first:
    warnings.warn(f"the kc compile cache cannot use KC_CACHE_DIR={root!r} ({why}); compiling without a cache. Point KC_CACHE_DIR "
                  "at a writable folder, or set it to the empty string to turn the cache off", CacheWarning, stacklevel=4)


def compile_cache() -> Optional[DiskCache]:
  """The cache of $KC_CACHE_DIR with the limit of $KC_CACHE_MAX_MB, or None when it is off or unusable (warned once)."""
  if (root := compile_cache_dir()) is None: return None
  limit = cache_max_bytes()
  if root in _unusable: return None
  with _caches_lock: cache = _caches.get(root)
  if cache is None:
    cache = DiskCache(root, limit)
    try: cache.check()
    except (OSError, sqlite3.Error) as e:
      _warn_unusable(root, e)
      return None
    with _caches_lock: cache = _caches.setdefault(root, cache)
  cache.max_bytes = limit
  return cache


def lookup(key: str) -> Optional[bytes]:
  """The bytes stored under `key`, None on a miss or with the cache off. A cache that fails (a database another program
  broke) is warned about once and bypassed."""
  cache = compile_cache()
  if cache is None: return None
  try: return cache.get(key)
  except (OSError, sqlite3.Error) as e:
    _warn_unusable(cache.root, e)
    return None


def store(key: str, payload: bytes) -> None:
  """Keep `payload` under `key` for next time; a cache that fails midway (a disk that fills up) is warned about once."""
  cache = compile_cache()
  if cache is None: return
  try: cache.put(key, payload)
  except (OSError, sqlite3.Error) as e: _warn_unusable(cache.root, e)


def cached(key: str, make) -> bytes:
  """The bytes stored under `key`, else `make()`, stored for next time. A cache that fails midway is warned about once
  and bypassed; the result is always `make()`'s."""
  if (hit := lookup(key)) is not None: return hit
  out = make()
  store(key, out)
  return out


__all__ = ["CacheWarning", "DiskCache", "DEFAULT_MAX_MB", "cache_max_bytes", "cached", "compile_cache", "compile_cache_dir", "lookup", "store"]
