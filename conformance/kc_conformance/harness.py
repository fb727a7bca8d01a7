"""Launching a rendered Program on a device with a case's data, the way kc's runtime API does it, and reading its
outputs back.

Buffers go through kc.Buffer (bfloat16 has no numpy dtype); outputs start as poison bytes (NaN for floats) so an
element the kernel never writes fails the comparison instead of passing by luck."""
from __future__ import annotations
import numpy as np
import kc
from kc import Buffer, DType
from kc.ir.codec import decode, encode
from kc.runtime.cache import compile_cache
from .case import Setup
from .programs import AnyProgram, launches_with


def to_bytes(a: np.ndarray, dt: DType) -> memoryview:
  bits = encode(a, dt)  # exact: bfloat16 and fp8 values are rounded to their type already
  return memoryview(np.ascontiguousarray(bits).reshape(-1).view(np.uint8))


def from_bytes(raw: bytearray, dt: DType) -> np.ndarray:
  return decode(np.frombuffer(raw, np.uint8), dt).copy()


def compile_source(device: str, src: str) -> int:
  """The compile tier: the device's compiler accepts the source. Returns the binary's size."""
  return len(kc.Device.compiler(device).compile(src))


def compile_sources(device: str, srcs: list[str]) -> list[str]:
  """Build many sources at once into the compile cache (the compile tier then finds them there); returns, per source,
  "" or its compile error (each compile test reports its own). It builds nothing without a compile cache (the
  compile tests would build everything again) or for a compiler that builds one source at a time anyway (building
  early would only move the time)."""
  compiler = kc.Device.compiler(device)
  if compile_cache() is None or not compiler.builds_batches(): return ["" for _ in srcs]
  return ["" if isinstance(out, bytes) else str(out) for out in compiler.compile_many(srcs)]


def launch(device: str, prg: AnyProgram, setup: Setup) -> dict[int, np.ndarray]:
  """Compile `prg` for `device`, run it once on the case's inputs, and return its outputs shaped like numpy's. A
  program of several kernels runs each in the schedule's order."""
  dev = kc.Device[device]
  bufs: dict[int, Buffer] = {}
  for i, dt in setup.dtypes.items():
    data = setup.inputs.get(i)
    size = data.size if data is not None else setup.expected[i].size
    # an image buffer holds float32 texels; its allocation (the options) is the ImageDType
    buf = Buffer(device, size, dt, options=setup.images.get(i))
    if data is not None: bufs[i] = buf.copyin(to_bytes(data, dt))
    else: bufs[i] = buf.copyin(bytes([0xFF]) * (size * dt.itemsize))
  for program, args in launches_with(prg, bufs, device):
    handle = dev.runtime(program.name, dev.compiler.compile(program.src))
    global_size, local_size = program.launch_dims(setup.var_vals)
    handle(*[args[g] for g in program.globals], global_size=global_size, local_size=local_size,
           vals=[setup.var_vals[v.arg[0]] for v in program.vars], wait=True)
  outs = {}
  for i, want in setup.expected.items():
    raw = bytearray(bufs[i].nbytes)
    bufs[i].copyout(memoryview(raw))
    outs[i] = from_bytes(raw, setup.dtypes[i]).reshape(want.shape)
  return outs
