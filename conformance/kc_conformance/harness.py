"""Running a case on a device under some opts, and choosing which opts to try.

Buffers go through kc.Buffer (bfloat16 has no numpy dtype), outputs start as poison bytes (NaN for floats) so an
element the kernel never writes fails the comparison instead of passing by luck."""
from __future__ import annotations
import random
from typing import Optional, Union
import numpy as np
import kc
from kc import Buffer, DType, Kernel, KernelOptError, Opt, OptOps, dtypes
from .cases import Setup

O = OptOps
# Single opts tried on every case; amounts that do not divide an axis, or axes a case lacks, are refused by the
# Kernel and skipped. UNROLL/GROUP/GROUPTOP count their axis from the first reduce axis.
CANDIDATES: list[Opt] = [
  Opt(O.UPCAST, 0, 4), Opt(O.UPCAST, 0, 2), Opt(O.UPCAST, 1, 4), Opt(O.UPCAST, 1, 3), Opt(O.UPCAST, 0, 0),
  Opt(O.UNROLL, 0, 4), Opt(O.UNROLL, 0, 0), Opt(O.UNROLL, 1, 2), Opt(O.UNROLL, 0, 3),
  Opt(O.LOCAL, 0, 2), Opt(O.LOCAL, 0, 8), Opt(O.LOCAL, 1, 4), Opt(O.LOCAL, 0, 0),
  Opt(O.GROUP, 0, 4), Opt(O.GROUP, 1, 2), Opt(O.GROUPTOP, 0, 8), Opt(O.GROUPTOP, 0, 3),
  Opt(O.PADTO, 0, 32), Opt(O.PADTO, 1, 8), Opt(O.PADTO, 2, 16),
  Opt(O.SWAP, 0, 1), Opt(O.SWAP, 0, 2), Opt(O.NOLOCALS),
]
RANDOM_SEEDS = (0, 1, 2)

OptsSpec = Union[str, list[Opt]]


def renderer_of(device: str):
  return kc.Device[device].renderer


def missing_dtypes(setup: Setup, device: str) -> list[str]:
  """The dtypes of the case that the device's renderer says it cannot compute in (has_fp16 / has_fp64 False)."""
  r = renderer_of(device)
  lacks = {dtypes.float16: not getattr(r, "has_fp16", True), dtypes.float64: not getattr(r, "has_fp64", True)}
  return sorted({dt.name for dt in setup.dtypes.values() if lacks.get(dt, False)})


def refusal(setup: Setup, device: str, opts: list[Opt]) -> Optional[str]:
  """None when every opt applies, in order, to the case's kernel for `device`; else why one does not."""
  k = Kernel(setup.sink, renderer_of(device))
  for o in opts:
    try: k.apply_opt(o)
    except KernelOptError as e: return f"{o} is refused: {e}"
  return None


def random_opts(setup: Setup, device: str, seed: int, most: int = 3) -> list[Opt]:
  """A seeded random sequence of up to `most` opts that the Kernel accepts, one after the other: the candidates in
  a shuffled order (twice over, so an opt may repeat), each kept when it applies."""
  rng, k, applied = random.Random(seed), Kernel(setup.sink, renderer_of(device)), []
  for o in rng.sample(CANDIDATES, len(CANDIDATES)) + rng.sample(CANDIDATES, len(CANDIDATES)):
    try: k.apply_opt(o)
    except KernelOptError: continue
    applied.append(o)
    if len(applied) == most: break
  return applied


def _to_bytes(a: np.ndarray, dt: DType) -> memoryview:
  if dt == dtypes.bfloat16: a = (np.asarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16)  # exact: the values are bfloat16 already
  else: a = np.ascontiguousarray(a, dtype=dt.np)
  return memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8))


def _from_bytes(raw: bytearray, dt: DType) -> np.ndarray:
  if dt == dtypes.bfloat16: return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
  return np.frombuffer(raw, dt.np).copy()


def execute(setup: Setup, device: str, opts: OptsSpec) -> dict[int, np.ndarray]:
  """Compile the case for `device` with `opts`, run it once, and return its outputs shaped like numpy's."""
  ck = kc.compile(setup.sink, device=device, opts=opts)
  bufs: list[Buffer] = []
  for i in range(len(setup.dtypes)):
    dt = setup.dtypes[i]
    if i in setup.inputs: bufs.append(Buffer(device, setup.inputs[i].size, dt).copyin(_to_bytes(setup.inputs[i], dt)))
    else: bufs.append(Buffer(device, setup.expected[i].size, dt).copyin(bytes([0xFF]) * (setup.expected[i].size * dt.itemsize)))
  ck(*bufs, **setup.var_vals)
  outs = {}
  for i, want in setup.expected.items():
    raw = bytearray(bufs[i].nbytes)
    bufs[i].copyout(memoryview(raw))
    outs[i] = _from_bytes(raw, setup.dtypes[i]).reshape(want.shape)
  return outs
