"""Planning a program's intermediate buffers: one arena per compiled program, each intermediate at a byte offset.

An intermediate lives from the kernel that writes it to the last kernel that reads it. Two intermediates whose
lifetimes do not overlap may share bytes; a kernel never reads and writes the same bytes (an intermediate read by
the kernel that writes another stays live through that kernel). Offsets are found first-fit in launch order, each
aligned to ALIGNMENT bytes, which most devices' sub-buffers need; a device that needs more (an OpenCL device whose
CL_DEVICE_MEM_BASE_ADDR_ALIGN is larger: 512 bytes on NVIDIA's) gets the same intermediates placed again at its
multiple (placed_at). A symbolic size is planned at its largest value."""
from __future__ import annotations
import math
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
  unplaced = [TempBuffer(t, dtype, _bound(size), 0, first.get(t, 0), last.get(t, first.get(t, 0))) for t, (dtype, size) in enumerate(temps)]
  return placed_at(tuple(unplaced), ALIGNMENT)


def aligned_arena(temps: tuple[TempBuffer, ...], peak: int, alignment: int) -> tuple[tuple[TempBuffer, ...], int]:
  """An arena's intermediates and size as planned (at ALIGNMENT), or placed again where a device's buffer views must
  start at a multiple of `alignment` (Allocator.view_alignment) that ALIGNMENT is not."""
  if not temps or ALIGNMENT % alignment == 0: return temps, peak
  return placed_at(temps, math.lcm(ALIGNMENT, alignment))


def placed_at(temps: tuple[TempBuffer, ...], alignment: int) -> tuple[tuple[TempBuffer, ...], int]:
  """`temps` (their sizes and lifetimes) placed first-fit in launch order at offsets that are multiples of
  `alignment`; returns them and the arena's size in bytes (the peak)."""
  live: list[tuple[int, int, int]] = []  # (offset, end, last kernel)
  out, peak = [], 0
  for t in sorted(temps, key=lambda x: (x.first, x.index)):
    live = [x for x in live if x[2] >= t.first]
    nbytes, offset = round_up(max(t.nbytes, 1), alignment), 0
    for lo, hi, _ in sorted(live):
      if offset + nbytes <= lo: break
      offset = max(offset, hi)
    live.append((offset, offset + nbytes, t.last))
    peak = max(peak, offset + nbytes)
    out.append(TempBuffer(t.index, t.dtype, t.size, offset, t.first, t.last))
  return tuple(sorted(out, key=lambda x: x.index)), peak

