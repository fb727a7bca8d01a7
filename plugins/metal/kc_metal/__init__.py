"""kc-metal: the METAL device. Importing this module is cheap and works on any system: pyobjc's Metal bindings are
imported when the device is opened, on macOS only. Elsewhere the device is registered and unavailable, and its
renderer still renders Metal Shading Language (the conformance render tier)."""
from __future__ import annotations
import sys
from typing import Optional
from kc.backend import PLUGIN_API_VERSION, BackendSpec, distribution_version, hookimpl
from kc_metal.family import ENV_FAMILY

__version__ = distribution_version("kc-metal")

DEVICE = "METAL"
# above CLANG: on a Mac with an Apple GPU, Metal is the device kernels should run on
PRIORITY = 20


# what a Mac needs besides the renderer: pyobjc's Metal bindings, which the extra installs
RUNTIME_MODULES = ("Metal", "objc")
INSTALL_HINT = "python -m pip install 'kc-metal[runtime]'"


def unavailable_reason() -> Optional[str]:
  """None where the device can open, else why not (checked without creating a Metal device where it cannot)."""
  if sys.platform != "darwin": return f"Metal needs macOS with an Apple GPU (this is {sys.platform})"
  try: from kc_metal.runtime import metal_unavailable_reason
  except ImportError as e:
    if e.name not in RUNTIME_MODULES: raise
    return f"pyobjc's Metal bindings are not installed (no module {e.name!r}): install the runtime with {INSTALL_HINT}"
  return metal_unavailable_reason()


def open_device():
  from kc_metal.runtime import MetalDevice
  return MetalDevice(DEVICE, f"kc-metal {__version__}")


# not named `renderer`: importing the submodule kc_metal.renderer would rebind that name in this package
def device_renderer():
  """The renderer for KC_METAL_FAMILY (default the newest Apple family); an open device renders for its own family."""
  from kc_metal.renderer import MetalRenderer
  return MetalRenderer()


@hookimpl
def kc_backends() -> list[BackendSpec]:
  return [BackendSpec(name=DEVICE, api_version=PLUGIN_API_VERSION, priority=PRIORITY, available=unavailable_reason,
                      open=open_device, renderer=device_renderer, distribution="kc-metal", version=__version__)]


__all__ = ["DEVICE", "PRIORITY", "ENV_FAMILY", "INSTALL_HINT", "open_device", "device_renderer", "kc_backends", "unavailable_reason",
           "__version__"]
