"""kc-cuda: the CUDA device. Importing this module is cheap: cuda-bindings is imported when the device is checked,
opened, or asked for its compiler, never here.

The renderer and the NVRTC compiler work with no GPU (BackendSpec.renderer and .compiler), for the arch of
KC_CUDA_ARCH (default sm_90): source renders and compiles to cubin anywhere; running needs an NVIDIA GPU and driver."""
from __future__ import annotations
from kc.backend import PLUGIN_API_VERSION, BackendSpec, distribution_version, hookimpl
from kc_cuda import arch, driver  # noqa: F401  (both cheap to import: they declare the KC_CUDA_* knobs)

__version__ = distribution_version("kc-cuda")

DEVICE = "CUDA"
PRIORITY = 100  # an accelerator: the default device wherever a GPU can open


def _unavailable():
  from kc_cuda.driver import unavailable_reason
  return unavailable_reason()


def open_device():
  from kc_cuda.driver import selected_ordinal
  from kc_cuda.runtime import CUDADevice
  return CUDADevice(DEVICE, selected_ordinal(), f"kc-cuda {__version__}")


def device_renderer():
  """The renderer for the GPU kc would open, or for KC_CUDA_ARCH where none can open."""
  from kc_cuda.arch import selected_arch
  from kc_cuda.renderer import CUDARenderer
  from kc_cuda.driver import device_props, selected_ordinal, unavailable_reason
  return CUDARenderer(selected_arch(), device_props(selected_ordinal()) if unavailable_reason() is None else None)


def device_compiler():
  """NVRTC for the selected arch: needs no GPU."""
  from kc_cuda.arch import selected_arch
  from kc_cuda.compiler import NVRTCCompiler
  return NVRTCCompiler(selected_arch(), f"kc-cuda {__version__}")


@hookimpl
def kc_backends() -> list[BackendSpec]:
  return [BackendSpec(name=DEVICE, api_version=PLUGIN_API_VERSION, priority=PRIORITY, available=_unavailable, open=open_device,
                      renderer=device_renderer, compiler=device_compiler, distribution="kc-cuda", version=__version__)]


__all__ = ["DEVICE", "PRIORITY", "open_device", "device_renderer", "device_compiler", "kc_backends", "__version__"]
