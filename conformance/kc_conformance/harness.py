"""Launching a rendered Program on a device with a case's data, the way kc's runtime API does it, and reading its
outputs back.

Buffers go through kc.Buffer (bfloat16 has no numpy dtype); outputs start as poison bytes (NaN for floats) so an
element the kernel never writes fails the comparison instead of passing by luck."""
from __future__ import annotations
import numpy as np
import kc
from kc import Buffer, DType, Program, dtypes
from kc.ir.dtype import float_to_fp8, fp8_to_float32
from .case import Setup


def to_bytes(a: np.ndarray, dt: DType) -> memoryview:
  if dt == dtypes.bfloat16: a = (np.asarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16)  # exact: the values are bfloat16 already
  elif dt in dtypes.fp8s: a = float_to_fp8(a, dt)  # exact: the values are fp8 already
  else: a = np.ascontiguousarray(a, dtype=dt.np)
  return memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8))


def from_bytes(raw: bytearray, dt: DType) -> np.ndarray:
  if dt == dtypes.bfloat16: return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
  if dt in dtypes.fp8s: return fp8_to_float32(np.frombuffer(raw, np.uint8), dt)
  return np.frombuffer(raw, dt.np).copy()


def compile_source(device: str, src: str) -> int:
  """The compile tier: the device's compiler accepts the source. Returns the binary's size."""
  return len(kc.Device.compiler(device).compile(src))


def launch(device: str, prg: Program, setup: Setup) -> dict[int, np.ndarray]:
  """Compile `prg` for `device`, run it once on the case's inputs, and return its outputs shaped like numpy's."""
  dev = kc.Device[device]
  handle = dev.runtime(prg.name, dev.compiler.compile(prg.src))
  bufs: dict[int, Buffer] = {}
  for i, dt in setup.dtypes.items():
    data = setup.inputs.get(i)
    size = data.size if data is not None else setup.expected[i].size
    # an image buffer holds float32 texels; its allocation (the options) is the ImageDType
    buf = Buffer(device, size, dt, options=setup.images.get(i))
    if data is not None: bufs[i] = buf.copyin(to_bytes(data, dt))
    else: bufs[i] = buf.copyin(bytes([0xFF]) * (size * dt.itemsize))
  global_size, local_size = prg.launch_dims(setup.var_vals)
  handle(*[bufs[g] for g in prg.globals], global_size=global_size, local_size=local_size,
         vals=[setup.var_vals[v.arg[0]] for v in prg.vars], wait=True)
  outs = {}
  for i, want in setup.expected.items():
    raw = bytearray(bufs[i].nbytes)
    bufs[i].copyout(memoryview(raw))
    outs[i] = from_bytes(raw, setup.dtypes[i]).reshape(want.shape)
  return outs
