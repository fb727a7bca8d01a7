"""Programs of several kernels in the three tiers. A case whose sink kc.schedule cuts into several kernels is
rendered kernel by kernel under the case's spec (each kernel optimized on its own, as kc.compile does), compiled
source by source, and run in the schedule's order with its intermediates in one arena, as kc.CompiledProgram runs
them: intermediates are views at byte offsets of one device buffer, which the run tier so certifies too. A sink of
one kernel is exactly today's single Program: nothing here touches it."""
from __future__ import annotations
from dataclasses import dataclass
from typing import Optional, Union
from kc import Buffer, Device, Program, UOp, dtypes
from kc.schedule import BufferRef, Schedule, schedule
from kc.schedule.memory import TempBuffer, aligned_arena
from .specs import Spec, optimized_kernel


@dataclass(frozen=True)
class Launch:
  """One kernel of a program: its Program and, per buffer index of its AST, the buffer that index stands for."""
  program: Program
  buffers: tuple[BufferRef, ...]


@dataclass(frozen=True)
class ScheduledPrograms:
  """A program's kernels rendered, in launch order, and its intermediates' places in an arena of `peak_bytes`."""
  launches: tuple[Launch, ...]
  temps: tuple[TempBuffer, ...]
  peak_bytes: int

  @property
  def programs(self) -> tuple[Program, ...]: return tuple(x.program for x in self.launches)

  @property
  def name(self) -> str: return "+".join(p.name for p in self.programs)

  @property
  def src(self) -> str:
    """Every kernel's source, in launch order (for a report: each is compiled on its own)."""
    return "\n\n".join(p.src for p in self.programs)


AnyProgram = Union[Program, ScheduledPrograms]


def several_kernels(sink: UOp) -> Optional[Schedule]:
  """The sink's schedule where it is more than one kernel (or needs an intermediate), else None."""
  plan = schedule(sink)
  return None if plan.single else plan


def render_scheduled(plan: Schedule, renderer, spec: Spec) -> ScheduledPrograms:
  """Each kernel of `plan` with the spec's opts (NotApplicable when any kernel refuses them), rendered."""
  launches = tuple(Launch(optimized_kernel(k.ast, renderer, spec).to_program(), k.buffers) for k in plan.kernels)
  return ScheduledPrograms(launches, plan.temps, plan.peak_bytes)


def programs_of(prg: AnyProgram) -> tuple[Program, ...]:
  """The Programs a tier renders, compiles and checks: one, or each kernel of a program."""
  return prg.programs if isinstance(prg, ScheduledPrograms) else (prg,)


def launches_with(prg: AnyProgram, bufs: dict[int, Buffer], device: str) -> list[tuple[Program, dict[int, Buffer]]]:
  """Each Program to launch, in order, with its buffers by the Program's own indices: the caller's `bufs` and, for a
  program of several kernels, its intermediates as views of one arena. The arena starts as poison bytes (NaN for
  floats): a kernel that reads an intermediate no earlier kernel wrote gives a wrong result, not a lucky one."""
  if not isinstance(prg, ScheduledPrograms): return [(prg, bufs)]
  temps: list[Buffer] = []
  # placed where the device's views may start, as kc.CompiledProgram places them (OpenCL's base alignment)
  placed, peak = aligned_arena(prg.temps, prg.peak_bytes, Device[device].allocator.view_alignment)
  if peak:
    arena = Buffer(device, peak, dtypes.uint8).copyin(bytes([0xFF]) * peak)
    temps = [arena.view(t.size, t.dtype, t.offset).allocate() for t in placed]
  return [(x.program, {i: temps[r.index] if r.temp else bufs[r.index] for i, r in enumerate(x.buffers)})
          for x in prg.launches]


__all__ = ["AnyProgram", "Launch", "ScheduledPrograms", "launches_with", "programs_of", "render_scheduled",
           "several_kernels"]
