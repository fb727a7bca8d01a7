"""Fixtures of this plugin's tests. They run from the repository root with the rest of kc's tests and from this
folder alone, so they need nothing from kc's own tests/ folder."""
import pytest


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
  """A fresh, empty compile cache for this test: KC_CACHE_DIR points at it."""
  monkeypatch.setenv("KC_CACHE_DIR", str(tmp_path))
  return tmp_path
