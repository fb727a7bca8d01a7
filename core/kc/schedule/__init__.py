"""kc.schedule: a program cut into kernels (scheduler), its intermediates planned (memory), and the movement and
split-reduce rules the kernels are built with."""
from kc.schedule.scheduler import BufferRef, Schedule, ScheduledKernel, schedule, schedule_for

__all__ = ["BufferRef", "Schedule", "ScheduledKernel", "schedule", "schedule_for"]
