"""The `device` fixture: every registered device, skipped with its reason where it cannot open here.

KC_E2E_DEVICES=CLANG,EMU narrows the run to some devices (a local shortcut; CI runs them all)."""
import gc, os
import pytest
import kc


def _devices() -> list[str]:
  names = kc.Device.names()
  if wanted := os.environ.get("KC_E2E_DEVICES", "").strip():
    chosen = [kc.Device.canonical(n.strip()) for n in wanted.split(",") if n.strip()]
    names = [n for n in names if n in chosen]
  return names


@pytest.fixture(params=_devices())
def device(request) -> str:
  name = request.param
  if (reason := kc.Device.unavailable_reason(name)) is not None: pytest.skip(f"{name} cannot open here: {reason}")
  return name


@pytest.fixture(scope="module", autouse=True)
def collect_garbage_after():
  """Thousands of kernels leave cyclic garbage (UOps held by the tracebacks of skipped tests); collecting it here
  keeps later tests that count live UOps from seeing it go away under them."""
  yield
  gc.collect()
