"""What a Metal launch needs, decided without Metal: the argument slots a kernel declares, the alignment each buffer
argument needs, the dispatch (threadgroups or threads) for kc's global/local sizes, the checks that turn a launch Metal
would reject or run wrongly into a kc error that says what to change, and the bookkeeping of committed command
buffers that synchronize waits on. Pure code (Metal's objects are duck-typed), so every system tests it."""
from __future__ import annotations
import re, threading
from dataclasses import dataclass
from typing import Any, Optional, Sequence
from kc.backend import KcError

Dims = tuple[int, int, int]
_SLOT = re.compile(r"\[\[buffer\((\d+)\)\]\]")
_BUFFER_PARAM = re.compile(r"device (\w+)\* (\w+) \[\[buffer\((\d+)\)\]\]")
_VECTOR_ACCESS = re.compile(r"\(device ([a-z]+)([234])\*\)\((\w+)[+)]")
# the size of each MSL scalar type kc renders (a value is read at a multiple of its size)
MSL_SIZES = {"bool": 1, "char": 1, "uchar": 1, "short": 2, "ushort": 2, "half": 2, "bfloat": 2, "int": 4, "uint": 4,
             "float": 4, "long": 8, "ulong": 8}
MAX_ALIGNMENT = 16  # setBuffer:offset:atIndex: - the offset is aligned to the type the function reads, at most 16 bytes


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


def _msl_size(type_name: str, lanes: int = 1) -> int:
  if type_name not in MSL_SIZES:
    raise LaunchError(f"the Metal source reads a buffer as {type_name!r}, a type kc does not render")
  return MSL_SIZES[type_name] * (4 if lanes == 3 else lanes)  # a 3-vector is as aligned as a 4-vector


def argument_alignments(src: str, name: str) -> dict[int, int]:
  """{buffer slot: the byte multiple its offset must be} for kernel `name` of `src`: the size of what the kernel
  reads or writes there, its element type or, where it accesses the buffer as vectors, the widest vector (float4: 16,
  half4: 8). Metal needs a buffer's offset aligned to that, never to more than 16 bytes."""
  at = src.find(f"void {name}(")
  if at < 0: raise LaunchError(f"the Metal source has no kernel named {name!r}")
  brace = src.find("{", at)
  params = {var: (int(slot), _msl_size(t)) for t, var, slot in _BUFFER_PARAM.findall(src[at:brace])}
  align = dict(params.values())
  for t, lanes, var in _VECTOR_ACCESS.findall(src[brace:]):
    if var in params: align[params[var][0]] = max(align[params[var][0]], _msl_size(t, int(lanes)))
  return {slot: min(a, MAX_ALIGNMENT) for slot, a in align.items()}


def check_alignment(name: str, alignments: dict[int, int], offsets: Sequence[int]) -> None:
  """A LaunchError naming the first buffer whose view starts at an offset that is not a multiple of what the kernel
  reads there (a misaligned read is undefined on a GPU)."""
  for slot, offset in enumerate(offsets):
    if offset % (need := alignments.get(slot, 1)):
      raise LaunchError(f"kernel {name} reads buffer {slot} in {need}-byte values, but its view starts at byte {offset}: "
                        f"Metal needs a multiple of {need} there; use a view at such an offset, or copy the data into a "
                        "buffer of its own")


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


def describe(error) -> str:
  """An NSError's text (Metal puts a compiler log or a command buffer's failure in localizedDescription)."""
  if error is None: return ""
  return str(error.localizedDescription())


class GPUError(KcError, RuntimeError):
  """A kernel that Metal ran and that failed on the GPU (a fault, a timeout); the message names the kernel."""


class PendingWork:
  """The command buffers committed and not yet waited on, each with the kernel it runs. `wait` waits for every one of
  them and keeps the failures; `synchronize` waits too, then raises the first failure (naming its kernel and how many
  others failed), so no caller reads memory a later buffer is still writing. A free waits without raising: a kernel's
  error belongs to the next synchronize, not to whichever buffer happens to be collected first."""

  def __init__(self):
    self._lock = threading.Lock()
    self._waiting = threading.Lock()  # a second thread's wait returns only after the buffers the first took are done
    self._pending: list[tuple[str, Any]] = []  # (kernel, MTLCommandBuffer)
    self._failed: list[str] = []

  def add(self, kernel: str, command_buffer: Any) -> None:
    with self._lock: self._pending.append((kernel, command_buffer))

  def wait(self) -> None:
    with self._waiting:
      with self._lock: pending, self._pending = self._pending, []
      failed = []
      for kernel, cb in pending:
        cb.waitUntilCompleted()
        if (error := cb.error()) is not None: failed.append(f"kernel {kernel} failed on the GPU: {describe(error)}")
      if failed:
        with self._lock: self._failed.extend(failed)

  def synchronize(self) -> None:
    self.wait()
    with self._lock: failed, self._failed = self._failed, []
    if failed:
      more = f" (and {len(failed) - 1} more: {'; '.join(failed[1:])})" if len(failed) > 1 else ""
      raise GPUError(f"a METAL {failed[0]}{more}")
