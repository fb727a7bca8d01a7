"""The errors EMU raises where a real device would silently misbehave, each naming the kernel and the UOp."""
from __future__ import annotations
from kc.errors import CompileError, KcError


class EmulatorError(KcError, RuntimeError):
  """The emulated kernel did something a real device would get wrong; the message names the kernel and the UOp."""


class OutOfBoundsError(EmulatorError, IndexError):
  """A load or store outside its buffer (or a local buffer beyond its declared size), or a misaligned vector access."""


class BarrierError(EmulatorError):
  """Some threads of a work-group reach a BARRIER that others of the same group skip."""


class MisalignedAccessError(EmulatorError):
  """A vector (or wider than a byte) access at an address that is not a multiple of its size, on an impersonated
  device whose loads need that (a GPU's misaligned-address fault): a kc.Buffer view at an odd byte offset, loaded as
  float4, or a float view two bytes in."""


class DataRaceError(EmulatorError):
  """Threads that read or write the same element without a barrier between them (or read what nobody wrote)."""


class LaunchError(EmulatorError, ValueError):
  """Launch sizes, buffers or variable values that do not fit the kernel or the renderer's limits."""


class UnsupportedOpError(EmulatorError, CompileError):
  """A UOp (or dtype) the interpreter does not run. It is a CompileError too: EMU's compiler rejects the program,
  as a backend compiler rejects source it cannot build."""
