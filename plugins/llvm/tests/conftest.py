"""Fixtures of this plugin's tests. They run from the repository root with the rest of kc's tests and from this
folder alone, so they need nothing from kc's own tests/ folder."""
import pytest
import kc_llvm

if kc_llvm.unavailable_reason() is not None:
  pytest.skip(f"LLVM cannot run here: {kc_llvm.unavailable_reason()}", allow_module_level=True)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
  """A fresh, empty compile cache for this test: KC_CACHE_DIR points at it."""
  monkeypatch.setenv("KC_CACHE_DIR", str(tmp_path))
  return tmp_path
