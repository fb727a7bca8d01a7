"""What the kc.ast tests share: the devices they check against numpy and a one-output run. A plain module, imported
by name (as target_renderers.py), so that a test module takes the `device` fixture by importing it."""
import numpy as np
import pytest
import kc
from kc import ast as A

DEVICES = ["CLANG", "EMU"]


@pytest.fixture(params=DEVICES)
def device(request):
  if request.param not in kc.Device.available(): pytest.skip(f"{request.param} cannot open here")
  return request.param


def run(expr: A.Expr, inputs: dict, device: str) -> np.ndarray:
  return kc.run(A.sink(A.store(0, expr)), inputs, device=device)[0]
