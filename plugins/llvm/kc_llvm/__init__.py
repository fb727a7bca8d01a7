"""kc-llvm: the LLVM device. Kernels are rendered as LLVM IR and compiled in this process by llvmlite, so no C compiler
is needed. Importing this module is cheap: llvmlite is imported when the device opens or a kernel renders."""
from __future__ import annotations
import importlib.util
from typing import Optional
from kc.backend import PLUGIN_API_VERSION, BackendSpec, distribution_version, hookimpl
from kc_llvm import target  # noqa: F401  (declares the plugin's knobs)

__version__ = distribution_version("kc-llvm")

DEVICE = "LLVM"
PRIORITY = 9  # a host device like CLANG, just below it: where both are installed CLANG stays the default


def unavailable_reason() -> Optional[str]:
  """None when llvmlite is installed, else how to get it."""
  if importlib.util.find_spec("llvmlite") is None: return "llvmlite is not installed: pip install llvmlite"
  return None


def make_compiler():
  from kc_llvm.compiler import LLVMCompiler
  return LLVMCompiler(f"kc-llvm {__version__}")


def open_device():
  from kc.backend import CompiledDevice, HostAllocator
  from kc_llvm.runtime import LLVMProgram
  return CompiledDevice(DEVICE, HostAllocator(), make_renderer(), make_compiler(), LLVMProgram)


def make_renderer():
  from kc_llvm.renderer import LLVMRenderer
  return LLVMRenderer()


@hookimpl
def kc_backends() -> list[BackendSpec]:
  return [BackendSpec(name=DEVICE, api_version=PLUGIN_API_VERSION, priority=PRIORITY, available=unavailable_reason,
                      open=open_device, renderer=make_renderer, compiler=make_compiler, distribution="kc-llvm",
                      # llvmlite (a dependency, with wheels for every platform) is all LLVM needs: where it cannot
                      # open, the installation is broken
                      version=__version__, expected_everywhere=True)]


__all__ = ["open_device", "make_renderer", "make_compiler", "unavailable_reason", "kc_backends", "DEVICE", "PRIORITY",
           "__version__"]
