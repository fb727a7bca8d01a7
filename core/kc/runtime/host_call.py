"""The checks of a call by host address (kc.CompiledKernel.call_host): a framework that holds its tensors' memory
itself passes each buffer as (address, nbytes), and kc checks what integers can say before the kernel runs. It costs
a few integer comparisons a buffer, where a numpy array per tensor cost the framework a conversion and kc a flag
and overlap check through numpy (kc-torch's regions call their programs so on every step)."""
from __future__ import annotations
from dataclasses import dataclass
from typing import Sequence
from kc.runtime.arguments import ArgumentError


@dataclass(frozen=True)
class HostSlot:
  """What one buffer of a host-called kernel needs: its bytes (the declared shape's elements), the byte multiple its
  address must be (its element's size, or the widest vector access where the device needs that), and whether the
  kernel writes it."""
  nbytes: int
  alignment: int
  output: bool


def host_addresses(kernel: str, buffers: Sequence, slots: Sequence[HostSlot]) -> list[int]:
  """The addresses of `buffers` ((address, nbytes) pairs, in buffer-index order) after the checks: one pair per
  buffer, ints, a non-zero address at the buffer's alignment (any, for a buffer of no bytes) holding at least the
  bytes the kernel reaches, and no output sharing a byte with another buffer (a kernel may read what another
  element's write already changed). ArgumentError otherwise. What the caller says about its memory is taken as true,
  as a DLPack producer's is. The common case is one pass of comparisons; a failure is then looked at buffer by buffer
  to say which and why."""
  if len(buffers) != len(slots):
    raise ArgumentError(f"{kernel} takes {len(slots)} buffers (indices 0..{len(slots) - 1}), got {len(buffers)}")
  try:
    if all(type(a) is int and type(n) is int and n >= s.nbytes and (a > 0 and a % s.alignment == 0 or not s.nbytes)
           for (a, n), s in zip(buffers, slots)):
      addresses = [a for a, _ in buffers]
      if not _overlapping(addresses, slots): return addresses
  except (TypeError, ValueError): pass  # not pairs: said below
  raise _error(kernel, buffers, slots)


def _overlapping(addresses: list[int], slots: Sequence[HostSlot]) -> bool:
  """Whether an output's bytes meet another buffer's (each output against every other buffer: programs have few)."""
  for i, (a, s) in enumerate(zip(addresses, slots)):
    if not s.output or not s.nbytes: continue
    end = a + s.nbytes
    for j, (b, t) in enumerate(zip(addresses, slots)):
      if j != i and t.nbytes and a < b + t.nbytes and b < end: return True
  return False


def _error(kernel: str, buffers: Sequence, slots: Sequence[HostSlot]) -> ArgumentError:
  """The ArgumentError that says which buffer fails which check."""
  for i, (buffer, slot) in enumerate(zip(buffers, slots)):
    try: address, nbytes = buffer
    except (TypeError, ValueError): return ArgumentError(f"buffer {i} of {kernel} must be an (address, nbytes) pair, got {buffer!r}")
    if type(address) is not int or type(nbytes) is not int:
      return ArgumentError(f"buffer {i} of {kernel}: the address and the byte count must be ints, got {buffer!r}")
    if nbytes < slot.nbytes: return ArgumentError(f"buffer {i} of {kernel} needs {slot.nbytes} bytes, got a buffer of {nbytes}")
    if slot.nbytes and (address <= 0 or address % slot.alignment):
      return ArgumentError(f"buffer {i} of {kernel} must be at a non-zero address that is a multiple of "
                           f"{slot.alignment} bytes, got {address:#x}")
  addresses = [a for a, _ in buffers]
  i, j = next((i, j) for i, (a, s) in enumerate(zip(addresses, slots)) for j, (b, t) in enumerate(zip(addresses, slots))
              if s.output and s.nbytes and t.nbytes and j != i and a < b + t.nbytes and b < a + s.nbytes)
  return ArgumentError(f"output {i} of {kernel} shares memory with buffer {j}: an output must not overlap another buffer "
                       "in a call by address")
