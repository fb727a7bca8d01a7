"""Fixtures shared by the tests under tests/. Helpers that tests import by name live in plain modules
(target_renderers.py); pytest's `pythonpath` setting puts this folder on sys.path."""
import os
import pytest
from hypothesis import settings
from target_renderers import MiniC, cpu_limits, gpu_limits, tensor_core_gpu_limits

# .ci/run sets HYPOTHESIS_PROFILE=ci: the same examples on every CI run, so a red CI reproduces; a developer's run
# draws new ones and keeps exploring
settings.register_profile("ci", derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
  """A fresh, empty compile cache for this test: KC_CACHE_DIR points at it."""
  monkeypatch.setenv("KC_CACHE_DIR", str(tmp_path))
  return tmp_path


@pytest.fixture
def gpu(): return gpu_limits()


@pytest.fixture
def cpu(): return cpu_limits()


@pytest.fixture
def tc_gpu(): return tensor_core_gpu_limits()


@pytest.fixture
def minic(): return MiniC()


@pytest.fixture
def emu():
  """The registered EMU device, with its generic renderer again afterwards whatever a test impersonated."""
  import kc
  dev = kc.Device["EMU"]
  dev.impersonate(None)
  yield dev
  dev.impersonate(None)


@pytest.fixture
def views_at_4096(monkeypatch):
  """Host memory whose buffer views must start at a multiple of 4096 bytes, refused elsewhere with a KcError, as an
  OpenCL device refuses a sub-buffer off its base address alignment (512 bytes on NVIDIA's OpenCL)."""
  import kc
  from kc.runtime.device import HostAllocator
  real_offset = HostAllocator.offset
  def strict_offset(self, opaque, nbytes, offset):
    if offset % 4096: raise kc.KcError(f"a view must start at a multiple of 4096 bytes (got byte {offset})")
    return real_offset(self, opaque, nbytes, offset)
  monkeypatch.setattr(HostAllocator, "view_alignment", 4096)
  monkeypatch.setattr(HostAllocator, "offset", strict_offset)
