"""What a device declares, read from its Renderer, and what a test needs. Selection is by capability only: a test
whose needs the device does not declare skips and names what is missing; no test looks at a device's name."""
from __future__ import annotations
from typing import Iterable
from kc import DType, dtypes

# the capabilities a test may need besides dtypes and tensor cores
FLAGS = ("locals", "shared", "float4", "images")


def dtype_need(dt: DType) -> str: return f"dtype:{dt.base.scalar().name}"


def tensor_core_need(dtype_in: DType, dtype_out: DType) -> str: return f"tensor_cores:{dtype_in.name}->{dtype_out.name}"


def declared(renderer) -> dict:
  """The renderer's declarations as plain data (the report's `capabilities`)."""
  return {
    "locals": bool(renderer.has_local), "shared": bool(renderer.has_shared), "float4": bool(renderer.supports_float4),
    "images": bool(renderer.has_images),
    "dtypes": sorted(dt.name for dt in dtypes.all if renderer.supports_dtype(dt)),
    "tensor_cores": sorted({f"{tc.dtype_in.name}->{tc.dtype_out.name}" for tc in renderer.tensor_cores}),
    "tensor_core_shapes": sorted(str(tc) for tc in renderer.tensor_cores),
    "global_max": list(renderer.global_max) if renderer.global_max is not None else None,
    "local_max": list(renderer.local_max) if renderer.local_max is not None else None,
    "shared_max": renderer.shared_max,
  }


def capability_set(caps: dict) -> frozenset[str]:
  """The `declared` dict as the strings tests name in their needs."""
  out = {flag for flag in FLAGS if caps[flag]}
  out |= {f"dtype:{name}" for name in caps["dtypes"]}
  out |= {f"tensor_cores:{pair}" for pair in caps["tensor_cores"]}
  return frozenset(out)


def missing(needs: Iterable[str], have: frozenset[str]) -> list[str]:
  return sorted(set(needs) - have)
