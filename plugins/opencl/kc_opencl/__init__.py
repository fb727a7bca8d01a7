"""kc-opencl: the OPENCL device. Importing this module is cheap: pyopencl is imported when the device is checked,
opened or asked for its limits, never here."""
from __future__ import annotations
from kc.backend import PLUGIN_API_VERSION, BackendSpec, DeviceUnavailable, distribution_version, hookimpl
from kc_opencl.platform import ENV_DEVICE, DeviceInfo, select_device, selected_info, unavailable_reason

__version__ = distribution_version("kc-opencl")

DEVICE = "OPENCL"
# below CLANG: the OpenCL device most machines have is PoCL on the CPU, where CLANG is as fast without a driver in
# between; KC_DEVICE=OPENCL makes it the default
PRIORITY = 5


def open_device():
  from kc_opencl.runtime import OpenCLDevice
  return OpenCLDevice(DEVICE, select_device(), f"kc-opencl {__version__}")


# not named `renderer`: importing the submodule kc_opencl.renderer would rebind that name in this package
def device_renderer():
  """The renderer with the selected device's limits, or conservative defaults where there is no device. A device whose
  compiler cannot build (unavailable_reason) still gives its limits: rendering needs only them, never a build."""
  from kc_opencl.renderer import OpenCLRenderer
  # the device is selected anew (the platforms can change under a test's stand-ins); its limits are queried once
  try:
    select_device()
    info = selected_info()
  except DeviceUnavailable: info = None
  return OpenCLRenderer(info)


@hookimpl
def kc_backends() -> list[BackendSpec]:
  return [BackendSpec(name=DEVICE, api_version=PLUGIN_API_VERSION, priority=PRIORITY, available=unavailable_reason,
                      open=open_device, renderer=device_renderer, distribution="kc-opencl", version=__version__)]


__all__ = ["DEVICE", "PRIORITY", "ENV_DEVICE", "DeviceInfo", "open_device", "device_renderer", "kc_backends", "select_device", "unavailable_reason",
           "__version__"]
