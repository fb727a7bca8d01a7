"""Small dependency-free helpers shared by every layer."""
from __future__ import annotations
import functools, math, operator
from typing import Iterable, TypeVar

T = TypeVar("T")


def prod(xs: Iterable, start=1):
  return functools.reduce(operator.mul, xs, start)


def dedup(xs: Iterable[T]) -> list[T]:
  return list(dict.fromkeys(xs))


def all_same(xs: list) -> bool:
  return all(x == xs[0] for x in xs)


def all_int(xs) -> bool:
  return all(isinstance(x, int) for x in xs)


@functools.lru_cache(maxsize=None)
def distribution_version(dist: str) -> str:
  """The installed version of the distribution `dist` ("0.0.0+unknown" when imported from a source tree): the one
  lookup behind kc.__version__, every plugin's __version__ and the cache keys that must change with a release. Asked
  once a process: the metadata lookup takes milliseconds, and every compile's cache key asks."""
  from importlib.metadata import PackageNotFoundError, version
  try: return version(dist)
  except PackageNotFoundError: return "0.0.0+unknown"


def c_div(a: int, b: int) -> int:
  """Integer division truncating toward zero, as C and every kc backend do it."""
  q = abs(a) // abs(b)
  return q if (a < 0) == (b < 0) else -q


def c_mod(a: int, b: int) -> int:
  """Remainder with the sign of the dividend, the partner of c_div: a == b*c_div(a, b) + c_mod(a, b)."""
  return a - b * c_div(a, b)


def ceildiv(a: int, b: int) -> int:
  return -(-a // b)


def round_up(x: int, multiple: int) -> int:
  return ceildiv(x, multiple) * multiple


def flatten(xss: Iterable[Iterable[T]]) -> list[T]:
  return [x for xs in xss for x in xs]


def isfinite(x: float) -> bool:
  return not (math.isinf(x) or math.isnan(x))


def vector_registers(vector_bytes: int) -> int:
  """The vector registers of a host CPU whose widest vector is `vector_bytes`: 32 of 64 bytes (AVX-512), 16 of 32
  (AVX2) or of 16 (SSE, NEON). Register tiles (kc.kernel.heuristics) and lane accumulators (kc.codegen.lower) fit them."""
  return 32 if vector_bytes >= 64 else 16
