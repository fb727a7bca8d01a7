"""kc-clang: the CLANG device. Importing this module is cheap: cffi is imported when the device opens."""
from __future__ import annotations
from kc.backend import PLUGIN_API_VERSION, BackendSpec, distribution_version, hookimpl
from kc_clang.compiler import ClangCompiler, compiler_command, unavailable_reason

__version__ = distribution_version("kc-clang")

DEVICE = "CLANG"
PRIORITY = 10  # below every accelerator: CLANG is the device that is there when nothing faster is


def open_device():
  from kc.backend import CompiledDevice, HostAllocator
  from kc_clang.runtime import ClangProgram
  return CompiledDevice(DEVICE, HostAllocator(), make_renderer(), ClangCompiler(f"kc-clang {__version__}"), ClangProgram)


def make_renderer():
  from kc_clang.renderer import ClangRenderer
  return ClangRenderer()


def self_test() -> dict:
  """The known compiler bugs' reproducers and the canary kernels on CLANG against numpy (kc doctor runs it)."""
  from kc_clang.doctor import self_test as run  # imports numpy and kc's builder: only when doctor asks
  return run(DEVICE)


@hookimpl
def kc_backends() -> list[BackendSpec]:
  return [BackendSpec(name=DEVICE, api_version=PLUGIN_API_VERSION, priority=PRIORITY, available=unavailable_reason,
                      open=open_device, renderer=make_renderer, distribution="kc-clang", version=__version__,
                      # a C compiler is all CLANG needs: where it cannot open, the installation or KC_CC is broken
                      self_test=self_test, expected_everywhere=True)]


__all__ = ["ClangCompiler", "compiler_command", "open_device", "self_test", "kc_backends", "DEVICE", "PRIORITY",
           "__version__"]
