"""Planning a program's intermediate buffers: one arena per compiled program, each intermediate at a byte offset.

An intermediate lives from the kernel that writes it to the last kernel that reads it. Two intermediates whose
lifetimes do not overlap may share bytes; a kernel never reads and writes the same bytes (an intermediate read by
the kernel that writes another stays live through that kernel). Offsets are found first-fit in launch order, each
aligned to ALIGNMENT bytes (what every device's sub-buffers need). A symbolic size is planned at its largest value."""
from __future__ import annotations
from dataclasses import dataclass
from kc.helpers import round_up
from kc.ir.dtype import DType
from kc.ir.uop import UOp

ALIGNMENT = 256


@dataclass(frozen=True)
class TempBuffer:
  """Intermediate `index` of a program: `size` elements of `dtype` at byte `offset` of the arena, written by kernel
  `first` and last read by kernel `last`."""
  index: int
  dtype: DType
  size: int
  offset: int
  first: int
  last: int

  @property
  def nbytes(self) -> int: return self.size * self.dtype.itemsize


def _bound(size) -> int:
  return int(size.vmax) if isinstance(size, UOp) else int(size)


def plan_arena(kernels, temps: list[tuple[DType, object]]) -> tuple[tuple[TempBuffer, ...], int]:
  """The intermediates of `kernels` (ScheduledKernels in launch order; temps[i] = (dtype, size) of intermediate i)
  placed in one arena; returns them and the arena's size in bytes (the peak)."""
  first, last = {}, {}
  for k, kernel in enumerate(kernels):
    for ref in kernel.buffers:
      if not ref.temp: continue
      written = any(kernel.buffers[s.src[0].arg] == ref for s in kernel.ast.src)
      if written: first.setdefault(ref.index, k)
      last[ref.index] = max(last.get(ref.index, k), k)
  live: list[tuple[int, int, int]] = []  # (offset, end, last kernel)
  out, peak = [], 0
  for t in sorted(range(len(temps)), key=lambda i: (first.get(i, 0), i)):
    dtype, size = temps[t]
    n, start = _bound(size), first.get(t, 0)
    live = [x for x in live if x[2] >= start]
    nbytes, offset = round_up(max(n * dtype.itemsize, 1), ALIGNMENT), 0
    for lo, hi, _ in sorted(live):
      if offset + nbytes <= lo: break
      offset = max(offset, hi)
    live.append((offset, offset + nbytes, last.get(t, start)))
    peak = max(peak, offset + nbytes)
    out.append(TempBuffer(t, dtype, n, offset, start, last.get(t, start)))
  return tuple(sorted(out, key=lambda x: x.index)), peak

