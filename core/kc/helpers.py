"""Small dependency-free helpers shared by every layer."""
from __future__ import annotations
import functools, math, operator, os
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


def env_value(key: str, default: T) -> T:
  """The environment variable `key` read as the type of `default` (unset or blank: `default`), on every call.
  A value that does not parse raises kc.errors.ConfigError naming the variable, never a bare ValueError."""
  raw = os.getenv(key)
  if raw is None or not raw.strip(): return default
  try: return type(default)(raw.strip())
  except (TypeError, ValueError):
    from kc.errors import ConfigError
    raise ConfigError(f"{key}={raw!r} is not a valid {type(default).__name__}: set it to a number like {default!r}, "
                      f"or unset it for the default") from None


def distribution_version(dist: str) -> str:
  """The installed version of the distribution `dist` ("0.0.0+unknown" when imported from a source tree): the one
  lookup behind kc.__version__, every plugin's __version__ and the cache keys that must change with a release."""
  from importlib.metadata import PackageNotFoundError, version
  try: return version(dist)
  except PackageNotFoundError: return "0.0.0+unknown"


def debug_level() -> int:
  """DEBUG from the environment, read on every call so a test or a notebook can turn it on and off:
  2 kernel timings, 4 the rendered source, 5 the linear UOps."""
  return env_value("DEBUG", 0)


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
