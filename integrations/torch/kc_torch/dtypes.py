"""torch dtypes as kc dtypes, and the dtype torch computes an op in."""
from __future__ import annotations
import torch
import kc

TO_KC: dict[torch.dtype, kc.DType] = {
  torch.bool: kc.dtypes.bool, torch.int8: kc.dtypes.int8, torch.uint8: kc.dtypes.uint8, torch.int16: kc.dtypes.int16,
  torch.int32: kc.dtypes.int32, torch.int64: kc.dtypes.int64, torch.float16: kc.dtypes.float16,
  torch.bfloat16: kc.dtypes.bfloat16, torch.float32: kc.dtypes.float32, torch.float64: kc.dtypes.float64,
  torch.uint16: kc.dtypes.uint16, torch.uint32: kc.dtypes.uint32, torch.uint64: kc.dtypes.uint64,
}
HALF = (torch.float16, torch.bfloat16)


def to_kc(dtype: torch.dtype) -> kc.DType:
  return TO_KC[dtype]


def supported(dtype: torch.dtype) -> bool:
  return dtype in TO_KC


def opmath(dtype: torch.dtype) -> torch.dtype:
  """The dtype torch's CPU kernels compute an elementwise op of `dtype` in: float32 for half and bfloat16 (each op's
  result is rounded back once), the dtype itself otherwise."""
  return torch.float32 if dtype in HALF else dtype
