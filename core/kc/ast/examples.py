"""Named example programs: what `kc render`, `kc run`, `kc bench` and `kc doctor` use. Each builds its sink, random
inputs, and the numpy result it must match. The last four are programs of several kernels (kc.schedule decides)."""
from __future__ import annotations
from dataclasses import dataclass
from typing import Callable
import numpy as np
from kc import ast as A
from kc.ir.dtype import dtypes
from kc.errors import KcError
from kc.ir.uop import UOp
import math


@dataclass(frozen=True)
class Example:
  name: str
  describe: str
  build: Callable[[], tuple[UOp, dict[int, np.ndarray], np.ndarray]]  # (sink, inputs by buffer index, expected output 0)


def _rand(rng, *shape): return rng.standard_normal(shape).astype(np.float32)


def _add():
  rng = np.random.default_rng(0)
  n = 1 << 16
  a, b = _rand(rng, n), _rand(rng, n)
  return A.sink(A.store(0, A.arg(1, dtypes.float32, (n,)) + A.arg(2, dtypes.float32, (n,)))), {1: a, 2: b}, a + b


def _sum():
  rng = np.random.default_rng(0)
  n = 1 << 16
  a = _rand(rng, n)
  return A.sink(A.store(0, A.arg(1, dtypes.float32, (n,)).sum())), {1: a}, a.sum(dtype=np.float64).astype(np.float32).reshape(1)


def _matmul():
  rng = np.random.default_rng(0)
  M = K = N = 256
  a, b = _rand(rng, M, K), _rand(rng, K, N)
  x, y = A.arg(1, dtypes.float32, (M, K)), A.arg(2, dtypes.float32, (K, N))
  return A.sink(A.store(0, (x.reshape(M, K, 1) * y.reshape(1, K, N)).sum(axis=1))), {1: a, 2: b}, (a @ b).reshape(M, 1, N)


def _conv2d():
  rng = np.random.default_rng(0)
  cin, cout, H, W, K = 4, 8, 16, 16, 3
  img, wt = _rand(rng, cin, H, W), _rand(rng, cout, cin, K, K)
  x = A.arg(1, dtypes.float32, (cin, H, W)).pad(((0, 0), (1, 1), (1, 1)))          # (cin, H+2, W+2)
  win = x.windows(1, K).windows(2, K)                                                # (cin, H, W, ky, kx)
  win = win.permute(0, 3, 4, 1, 2).reshape(1, cin, K, K, H, W)
  w = A.arg(2, dtypes.float32, (cout, cin, K, K)).reshape(cout, cin, K, K, 1, 1)
  out = (win * w).sum(axis=(1, 2, 3))                                                # (cout, 1, 1, 1, H, W)
  padded = np.pad(img, ((0, 0), (1, 1), (1, 1)))
  ref = np.zeros((cout, H, W), np.float32)
  for ky in range(K):
    for kx in range(K): ref += np.einsum("oc,chw->ohw", wt[:, :, ky, kx], padded[:, ky:ky + H, kx:kx + W])
  return A.sink(A.store(0, out)), {1: img, 2: wt}, ref.reshape(cout, 1, 1, 1, H, W)


def _softmax():
  rng = np.random.default_rng(0)
  R, C = 16, 64
  a = _rand(rng, R, C)
  x = A.arg(1, dtypes.float32, (R, C))
  e = (x - x.max(1, keepdims=True)).exp2()
  ref = np.exp2(a - a.max(1, keepdims=True))
  return A.sink(A.store(0, e / e.sum(1, keepdims=True))), {1: a}, ref / ref.sum(1, keepdims=True)


def _layernorm_stats():
  rng = np.random.default_rng(0)
  R, C = 32, 256
  a = _rand(rng, R, C)
  x = A.arg(1, dtypes.float32, (R, C))
  mean = x.sum(1, keepdims=True) * (1 / C)
  var = ((x - mean) * (x - mean)).sum(1) * (1 / C)
  return A.sink(A.store(0, var)), {1: a}, a.var(1, keepdims=True)


def _layernorm():
  rng = np.random.default_rng(0)
  R, C, eps = 64, 256, 1e-5
  a, w, b = _rand(rng, R, C), _rand(rng, C), _rand(rng, C)
  x, wt, bias = A.arg(1, dtypes.float32, (R, C)), A.arg(2, dtypes.float32, (C,)), A.arg(3, dtypes.float32, (C,))
  out = (x - x.mean(1, keepdims=True)) / (x.var(1, keepdims=True) + eps).sqrt() * wt + bias
  ref = (a - a.mean(1, keepdims=True)) / np.sqrt(a.var(1, keepdims=True) + eps) * w + b
  return A.sink(A.store(0, out)), {1: a, 2: w, 3: b}, ref


def _attention():
  rng = np.random.default_rng(0)
  M, N, D = 128, 128, 64
  qa, ka, va = _rand(rng, M, D), _rand(rng, N, D), _rand(rng, N, D)
  q, k, v = A.arg(1, dtypes.float32, (M, D)), A.arg(2, dtypes.float32, (N, D)), A.arg(3, dtypes.float32, (N, D))
  s = (q @ k.T) / math.sqrt(D)
  e = (s - s.max(1, keepdims=True)).exp()
  sa = qa @ ka.T / math.sqrt(D)
  ea = np.exp(sa - sa.max(1, keepdims=True))
  return A.sink(A.store(0, (e / e.sum(1, keepdims=True)) @ v)), {1: qa, 2: ka, 3: va}, (ea / ea.sum(1, keepdims=True)) @ va


def _standardize():
  rng = np.random.default_rng(0)
  a = _rand(rng, 128, 256)
  x = A.arg(1, dtypes.float32, (128, 256))
  return A.sink(A.store(0, (x - x.mean()) / x.std())), {1: a}, ((a - a.mean()) / a.std()).astype(np.float32)


def _argmax():
  rng = np.random.default_rng(0)
  a = _rand(rng, 256, 100)
  x = A.arg(1, dtypes.float32, (256, 100))
  # the column of each row's largest element, then the row whose largest element is largest: two kernels
  return A.sink(A.store(0, x.argmax(1) + x.max(1).argmax())), {1: a}, a.argmax(1) + a.max(1).argmax()


EXAMPLES: dict[str, Example] = {e.name: e for e in [
  Example("add", "elementwise a+b over 65536 floats", _add),
  Example("sum", "sum of 65536 floats to a scalar", _sum),
  Example("matmul", "256x256 @ 256x256 float32", _matmul),
  Example("conv2d", "3x3 convolution, 4->8 channels, 16x16, padding 1, from sliding-window views", _conv2d),
  Example("softmax", "row softmax of 16x64 in one kernel (a fused chain of two reduces)", _softmax),
  Example("variance", "row variance of 32x256 in one kernel (mean, then the mean of squared deviations)", _layernorm_stats),
  Example("layernorm", "layer norm of 64x256 rows with weight and bias", _layernorm),
  Example("attention", "softmax(q @ k.T / sqrt(d)) @ v, 128x128, d = 64: the softmax is materialised for @ v", _attention),
  Example("standardize", "(x - x.mean()) / x.std() over 128x256", _standardize),
  Example("argmax", "argmax of each row of 256x100 plus the row of the largest maximum", _argmax),
]}


def example(name: str) -> Example:
  if name not in EXAMPLES: raise KcError(f"unknown example {name!r}; the examples are {', '.join(EXAMPLES)}")
  return EXAMPLES[name]
