"""The benchmark anchors that live outside kc: tinygrad 0.10.0 from PyPI in a virtual environment that only
the benchmarks use (kc never imports it)."""
from __future__ import annotations
import json, pathlib, subprocess, sys
from typing import Optional

HERE = pathlib.Path(__file__).parent
TINYGRAD_VENV = HERE / ".venv-tinygrad"
TINYGRAD_VERSION = "0.10.0"


def tinygrad_python() -> tuple[Optional[pathlib.Path], str]:
  """The Python of the tinygrad venv, created on first use; (None, reason) when it cannot be made."""
  py = TINYGRAD_VENV / "bin" / "python"
  try:
    if not py.exists():
      subprocess.run([sys.executable, "-m", "venv", str(TINYGRAD_VENV)], check=True, capture_output=True)
    probe = subprocess.run([str(py), "-c", "import tinygrad, importlib.metadata as m; print(m.version('tinygrad'))"], capture_output=True, text=True)
    if probe.returncode != 0 or probe.stdout.strip() != TINYGRAD_VERSION:
      subprocess.run([str(py), "-m", "pip", "install", "-q", f"tinygrad=={TINYGRAD_VERSION}"], check=True, capture_output=True, text=True)
  except subprocess.CalledProcessError as e:
    return None, f"could not install tinygrad {TINYGRAD_VERSION}: {(e.stderr or '').strip()[-300:]}"
  return py, ""


def run_tinygrad(script: str, *args) -> tuple[Optional[dict], str]:
  """Run benchmarks/<script> under tinygrad's venv and parse the JSON it prints."""
  py, why = tinygrad_python()
  if py is None: return None, why
  r = subprocess.run([str(py), str(HERE / script), *map(str, args)], capture_output=True, text=True)
  if r.returncode != 0: return None, f"{script} failed: {r.stderr.strip()[-300:]}"
  return json.loads(r.stdout), ""
