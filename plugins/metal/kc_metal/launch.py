"""What a Metal launch needs, decided without Metal: the argument slots a kernel declares, the dispatch (threadgroups
or threads) for kc's global/local sizes, and the checks that turn a launch Metal would reject or run wrongly into a
kc error that says what to change. Pure functions, so every system tests them."""
from __future__ import annotations
import re
from dataclasses import dataclass
from typing import Optional, Sequence
from kc.backend import KcError

Dims = tuple[int, int, int]
_SLOT = re.compile(r"\[\[buffer\((\d+)\)\]\]")


class LaunchError(KcError, ValueError):
  """A launch Metal cannot run as asked: wrong arguments, or sizes past what the device or the pipeline allows."""


def argument_slots(src: str, name: str) -> int:
  """How many [[buffer(i)]] arguments (buffers, then Variables) kernel `name` of `src` declares."""
  at = src.find(f"void {name}(")
  if at < 0: raise LaunchError(f"the Metal source has no kernel named {name!r}")
  signature = src[at:src.find("{", at)]  # the parameter list: attributes never contain a brace
  return len(_SLOT.findall(signature))


def check_arguments(name: str, slots: int, buffers: int, values: int) -> None:
  if buffers + values != slots:
    raise LaunchError(f"kernel {name} takes {slots} arguments, called with {buffers} buffers and {values} variable values")


def dims3(size: Optional[Sequence[int]], what: str, name: str) -> Dims:
  """A launch size as three non-negative ints (missing trailing dims are 1)."""
  dims = [1, 1, 1] if size is None else [int(s) for s in size]
  if len(dims) > 3 or any(d < 0 for d in dims):
    raise LaunchError(f"kernel {name}: {what} size {list(size or ())} is not up to three non-negative ints")
  return tuple(dims + [1] * (3 - len(dims)))  # type: ignore[return-value]


@dataclass(frozen=True)
class Dispatch:
  """One compute dispatch. per_thread False: `grid` counts threadgroups (dispatchThreadgroups); True: `grid` counts
  threads and Metal cuts it into threadgroups of `threadgroup`, the last ones smaller (dispatchThreads)."""
  grid: Dims
  threadgroup: Dims
  per_thread: bool


def plan_dispatch(name: str, global_size: Optional[Sequence[int]], local_size: Optional[Sequence[int]], max_threads: int,
                  local_max: Dims) -> Optional[Dispatch]:
  """The dispatch of kc's launch sizes, or None for an empty launch (Metal rejects a zero-sized grid).

  kc's global_size counts work-groups and local_size is the work-group: Metal's threadgroups and threads per
  threadgroup. local_size None means a kernel that reads only global ids (NOLOCALS): its global_size counts threads,
  and any threadgroup shape gives the same ids, so the grid is dispatched per thread in threadgroups as wide as the
  pipeline allows. `max_threads` is the pipeline's maxTotalThreadsPerThreadgroup, which can be below the device's
  1024 when a kernel uses many registers."""
  grid = dims3(global_size, "global", name)
  if local_size is None:
    if 0 in grid: return None
    return Dispatch(grid, (min(grid[0], max_threads), 1, 1), True)
  group = dims3(local_size, "local", name)
  if 0 in grid or 0 in group: return None
  too_big = [f"axis {i}: {s} > {m}" for i, (s, m) in enumerate(zip(group, local_max)) if s > m]
  if too_big or (n := group[0] * group[1] * group[2]) > max_threads:
    why = "; ".join(too_big) or f"{n} threads > the pipeline's {max_threads}"
    raise LaunchError(f"kernel {name} asks for a threadgroup {list(group)} that Metal cannot run ({why}): use smaller LOCAL/GROUP opts")
  return Dispatch(grid, group, False)
