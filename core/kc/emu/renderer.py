"""What EMU lowers with: EmuRenderer, its generic GPU-like target, or `impersonating(renderer)`, any registered
device's lowering with EMU's rendering step (the serialized program); and the tensor cores' fragment layouts."""
from __future__ import annotations
import functools
from typing import Optional
from kc.ir.dtype import dtypes
from kc.renderer import Renderer, TensorCore
from kc.renderer.cstyle import CStyleLanguage
from kc.emu.program_format import serialize


DEVICE = "EMU"


# The generic renderer's tensor cores: small enough to read in a test, with fragments that cover the matrices.
# 4 threads per warp; N=M=K=4 with the rest of N and M upcast (half in, float out), and a 2x2x2 float one.
BUILTIN_TENSOR_CORES = [
  TensorCore(dims=(4, 4, 4), dtype_in=dtypes.half, dtype_out=dtypes.float, threads=[(0, 2), (1, 2)], reduce_axes=[(0, 4)],
             upcast_axes=([(0, 4), (2, 2)], [(0, 4), (1, 2)], [(1, 2), (2, 2)])),
  TensorCore(dims=(2, 2, 2), dtype_in=dtypes.float, dtype_out=dtypes.float, threads=[(0, 2), (1, 2)], reduce_axes=[(0, 2)],
             upcast_axes=([(0, 2)], [(0, 2)], []), opts_seq=("LC", "UP")),
]


@functools.lru_cache(maxsize=None)
def fragment_layout(tc: TensorCore):
  from kc.kernel.tc_layout import derive_fragment_layout
  return derive_fragment_layout(tc)


class EmuRenderer(Renderer):
  """The generic target EMU lowers for when it impersonates no device: GPU-like, with locals and float4. Every op
  that the C-style backends spell, the interpreter runs natively (transcendentals through numpy)."""
  device = DEVICE
  impersonates: Optional[str] = None
  has_local = True
  has_shared = True
  supports_float4 = True
  aligned_vectors = False  # impersonating a device, EMU checks that device's rule (Limits.aligned_vectors)
  global_max = (65535, 65535, 65535)
  local_max = (256, 256, 64)
  shared_max = 32768
  tensor_cores = BUILTIN_TENSOR_CORES
  code_for_op = dict(CStyleLanguage.code_for_op)

  def render(self, name: str, uops: list) -> str: return serialize(name, uops)


def _render_for_emu(self, name: str, uops: list) -> str: return serialize(name, uops)


@functools.lru_cache(maxsize=None)
def _impersonating_class(cls: type) -> type:
  # a subclass keeps every declaration and dialect rewrite of the impersonated renderer (class attributes and
  # methods alike); only the last step, rendering, is EMU's
  return type(f"Emu{cls.__name__}", (cls,), {"render": _render_for_emu, "device": DEVICE, "__module__": __name__,
                                            "__doc__": f"{cls.__name__} lowering, EMU rendering."})


def impersonating(target: Renderer) -> Renderer:
  """A renderer that lowers exactly like `target` (limits set on the instance included) but renders for EMU."""
  r = object.__new__(_impersonating_class(type(target)))
  r.__dict__.update(vars(target))
  r.impersonates = target.device
  r.device = DEVICE
  r.has_images = False  # EMU does not emulate images: kernels lowered for it must not use them
  return r
