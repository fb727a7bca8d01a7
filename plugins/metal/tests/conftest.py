"""Fixtures of kc-metal's tests (they run from the repository root and from this folder alone)."""
import pytest
import kc


@pytest.fixture
def emu_metal(tmp_path, monkeypatch):
  """EMU impersonating METAL (its lowering, limits and alignment faults), with a fresh compile cache."""
  monkeypatch.setenv("KC_CACHE_DIR", str(tmp_path))
  emu = kc.Device["EMU"].impersonate("METAL")
  yield emu
  emu.impersonate(None)
