"""The opt cache: the best opts BEAM search found for a kernel, so that a second compile of it does no search.

One sqlite file, opts.sqlite, next to the compile cache in $KC_CACHE_DIR. An entry is keyed by
(AST key, renderer identity, device name, kc version, beam width, tensor-core level) and holds the opts as JSON
[[op name, axis, amt], ...] with the search's figures (best seconds, hand-coded seconds, search seconds). The
tensor-core level is part of the key because the same TC opt builds another kernel at each level (kc.config KC_TC).

The AST key is a sha256 of a canonical text of the AST graph, not of the UOps themselves: UOps hash by identity, which
is only stable within one process, while the cache is shared by every process that uses the folder.

Several processes may search and store at once: WAL mode, a busy timeout and one upsert per store make concurrent
writers wait for each other instead of failing. The cache is an optimization: a folder that cannot hold it (read-only,
a damaged file) gives one OptCacheWarning and the process keeps its results in memory, so a repeated compile in the
same process still does no search."""
from __future__ import annotations
import hashlib, json, os, sqlite3, threading, warnings
from dataclasses import dataclass
from typing import Any, Optional, Sequence
from kc.helpers import distribution_version
from kc.ir.uop import UOp
from kc.kernel import Opt, OptOps
from kc.runtime.cache import CacheWarning, compile_cache_dir, open_sqlite

DB_NAME = "opts.sqlite"
_TABLE = "opts"
_KEY_COLUMNS = "ast_key, renderer, device, kc_version, width, tc_level"
_SCHEMA = (f"CREATE TABLE IF NOT EXISTS {_TABLE} (ast_key TEXT NOT NULL, renderer TEXT NOT NULL, device TEXT NOT NULL, "
           "kc_version TEXT NOT NULL, width INTEGER NOT NULL, tc_level INTEGER NOT NULL, opts TEXT NOT NULL, "
           f"seconds REAL, hand_seconds REAL, elapsed REAL, PRIMARY KEY ({_KEY_COLUMNS}))")
_WHERE_KEY = " AND ".join(f"{c} = ?" for c in _KEY_COLUMNS.split(", "))


class OptCacheWarning(CacheWarning):
  """The opt cache's folder cannot hold it; search results are kept in memory for this process only."""


# --------------------------------------------------------------------------------------------------------- the keys

def _canonical_arg(arg: Any) -> str:
  # repr is exact for every arg an AST holds (ints, floats incl. -0.0 and nan, enums, ShapeTrackers, tuples of those);
  # the type name keeps 1, 1.0 and True apart even where a repr would not
  return f"{type(arg).__name__}:{arg!r}"


def ast_key(sink: UOp) -> str:
  """A sha256 hex digest of the AST's structure: equal for equal ASTs in any process, different for different ones.
  The nodes are listed in toposort order (deterministic: it follows each node's sources in order), each as its op,
  dtype, arg and the positions of its sources in that list, so shared subexpressions are written once."""
  nodes = list(sink.toposort)
  position = {u: i for i, u in enumerate(nodes)}
  text = json.dumps([[u.op.name, repr(u.dtype), _canonical_arg(u.arg), [position[s] for s in u.src]] for u in nodes],
                    separators=(",", ":"))
  return hashlib.sha256(text.encode()).hexdigest()


def renderer_identity(renderer) -> str:
  """What about the renderer decides which opts are fastest: its class, the device it renders for and its
  architecture string (Renderer.arch: CLANG names the CPU's ISA, CUDA its sm_XX; empty when a plugin does not say)."""
  cls = type(renderer)
  return f"{cls.__module__}.{cls.__qualname__}|{renderer.device}|{renderer.arch or ''}"


@dataclass(frozen=True)
class OptKey:
  """Where one search result is stored: a search on another renderer, device, kc version, width or tensor-core level
  is another entry."""
  ast_key: str
  renderer: str
  device: str
  kc_version: str
  width: int
  tc_level: int = 1

  @staticmethod
  def of(sink: UOp, renderer, device: str, width: int, tc_level: int = 1) -> "OptKey":
    return OptKey(ast_key(sink), renderer_identity(renderer), device, distribution_version("kc-core"), int(width),
                  int(tc_level))

  def row(self) -> tuple: return (self.ast_key, self.renderer, self.device, self.kc_version, self.width, self.tc_level)


@dataclass(frozen=True)
class OptEntry:
  """A stored search result: the opts to apply to a Kernel without opts, and the figures of the search that chose them."""
  opts: tuple[Opt, ...]
  seconds: Optional[float] = None       # the chosen kernel's time
  hand_seconds: Optional[float] = None  # the hand-coded kernel's time in the same search
  elapsed: Optional[float] = None       # how long the search took


# ------------------------------------------------------------------------------------------------------- opts as JSON

def _to_json(x):
  return list(map(_to_json, x)) if isinstance(x, (list, tuple)) else x


def _from_json(x):
  return tuple(map(_from_json, x)) if isinstance(x, list) else x


def opts_to_json(opts: Sequence[Opt]) -> str:
  return json.dumps([[o.op.name, o.axis, _to_json(o.amt)] for o in opts])


def opts_from_json(text: str) -> Optional[tuple[Opt, ...]]:
  """The opts stored as `text`, or None when it is not a list of [op name, axis, amt] (a row another version wrote,
  or damaged): such an entry is a miss."""
  try:
    rows = json.loads(text)
    return tuple(Opt(OptOps[name], axis, _from_json(amt)) for name, axis, amt in rows)
  except (ValueError, TypeError, KeyError):
    return None


# ----------------------------------------------------------------------------------------------------------- the cache

def _drop_unleveled_table(conn: sqlite3.Connection) -> None:
  """A table an older kc made is keyed without the tensor-core level, so its entries cannot say which level their
  opts were searched at: it is dropped and made again (a search each costs, once), in one transaction so that two
  processes opening the folder at once do it once."""
  conn.execute("BEGIN IMMEDIATE")
  try:
    if "tc_level" not in {row[1] for row in conn.execute(f"PRAGMA table_info({_TABLE})")}:
      conn.execute(f"DROP TABLE {_TABLE}")
      conn.execute(_SCHEMA)
    conn.execute("COMMIT")
  except BaseException:
    conn.execute("ROLLBACK")
    raise


class OptCache:
  """The opt cache of one folder (None: memory only). Safe to share between threads (one lock) and processes
  (sqlite's locking); a process that forks opens its own connection. Once the folder fails, this cache warns once and
  serves from memory for the rest of the process."""

  def __init__(self, root: Optional[str]):
    self.root = root
    self.path = os.path.join(root, DB_NAME) if root is not None else None
    self._memory: dict[OptKey, OptEntry] = {}
    self._lock = threading.Lock()
    self._conn: Optional[sqlite3.Connection] = None
    self._pid = -1
    self.broken: Optional[str] = None if root is not None else "no cache folder"

  @property
  def on_disk(self) -> bool: return self.broken is None

  def _connection(self) -> sqlite3.Connection:
    # only called while on_disk, which a cache without a folder never is
    if self._conn is None or self._pid != os.getpid():
      # a connection inherited through fork is never used (nor closed: sqlite forbids both); the child opens its own
      self._conn, self._pid = open_sqlite(self.root, self.path, [_SCHEMA]), os.getpid()
      _drop_unleveled_table(self._conn)
    return self._conn

  def _fail(self, err: BaseException):
    """The folder cannot hold the cache: warn (once per cache) and keep to memory from now on."""
    first = self.broken is None
    self.broken = f"{type(err).__name__}: {err}"
    if self._conn is not None and self._pid == os.getpid():
      try: self._conn.close()
      except sqlite3.Error: pass
    self._conn = None
    if first:
      warnings.warn(f"the kc opt cache cannot use {self.path!r} ({self.broken}); BEAM results are kept in memory for this "
                    "process only. Point KC_CACHE_DIR at a writable folder", OptCacheWarning, stacklevel=4)

  def get(self, key: OptKey) -> Optional[OptEntry]:
    with self._lock:
      if self.on_disk:
        try:
          query = f"SELECT opts, seconds, hand_seconds, elapsed FROM {_TABLE} WHERE {_WHERE_KEY}"
          row = self._connection().execute(query, key.row()).fetchone()
        except (OSError, sqlite3.Error) as e:
          self._fail(e)
        else:
          if row is None or (opts := opts_from_json(row[0])) is None: return None
          return OptEntry(opts, *row[1:])
      return self._memory.get(key)

  def put(self, key: OptKey, entry: OptEntry):
    with self._lock:
      # memory always holds it too: if the disk fails later this process still finds what it searched
      self._memory[key] = entry
      if not self.on_disk: return
      try:
        conn = self._connection()
        # one statement is one transaction: a concurrent writer waits on the busy timeout, then replaces or is replaced
        conn.execute(f"INSERT INTO {_TABLE} ({_KEY_COLUMNS}, opts, seconds, hand_seconds, elapsed) VALUES "
                     f"(?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT ({_KEY_COLUMNS}) DO UPDATE SET opts = excluded.opts, "
                     "seconds = excluded.seconds, hand_seconds = excluded.hand_seconds, elapsed = excluded.elapsed",
                     (*key.row(), opts_to_json(entry.opts), entry.seconds, entry.hand_seconds, entry.elapsed))
      except (OSError, sqlite3.Error) as e:
        self._fail(e)

  def forget(self, key: OptKey):
    """Drop an entry (its opts no longer apply to the kernel): the next lookup is a miss."""
    with self._lock:
      self._memory.pop(key, None)
      if not self.on_disk: return
      try: self._connection().execute(f"DELETE FROM {_TABLE} WHERE {_WHERE_KEY}", key.row())
      except (OSError, sqlite3.Error) as e: self._fail(e)

  def __len__(self) -> int:
    with self._lock:
      if self.on_disk:
        try: return self._connection().execute(f"SELECT COUNT(*) FROM {_TABLE}").fetchone()[0]
        except (OSError, sqlite3.Error) as e: self._fail(e)
      return len(self._memory)


_caches: dict[Optional[str], OptCache] = {}
_caches_lock = threading.Lock()


def opt_cache() -> OptCache:
  """The opt cache of $KC_CACHE_DIR (read on every call; the compile cache's default folder). KC_CACHE_DIR set to the
  empty string keeps results in memory only, without a warning."""
  root = compile_cache_dir()
  with _caches_lock:
    if (cache := _caches.get(root)) is None: cache = _caches[root] = OptCache(root)
  return cache


__all__ = ["DB_NAME", "OptCache", "OptCacheWarning", "OptEntry", "OptKey", "ast_key", "opt_cache", "opts_from_json",
           "opts_to_json", "renderer_identity"]
