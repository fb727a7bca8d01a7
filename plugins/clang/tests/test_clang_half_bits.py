"""Half held as its bits (CStyleLanguage.half_as_bits): what CLANG renders where the C compiler has no _Float16 (clang
14 on x86 without AVX512-FP16). Every half code converts to numpy's float32 exactly, float32 values convert to
numpy's half (round to nearest even, subnormals, overflow to inf, NaN), and half arithmetic runs in float."""
import numpy as np
import pytest
import kc
from kc import Opt, OptOps, dtypes
from kc import ast as A
from kc.backend import CStyleLanguage
from kc_clang import compiler as clang_compiler
from kc_clang.renderer import ClangRenderer


@pytest.fixture
def half_as_bits(monkeypatch):
  """The CLANG device with a renderer built as if the compiler lacked _Float16."""
  clang_compiler.has_float16.cache_clear()
  monkeypatch.setattr(clang_compiler, "has_float16", lambda cmd, flags: False)
  monkeypatch.setattr("kc_clang.renderer.has_float16", lambda cmd, flags: False)
  r = ClangRenderer()
  assert r.half_as_bits and r.extra_matcher is CStyleLanguage.all_narrow_in_float and r.vector_widths(dtypes.float16) == ()
  dev = kc.Device["CLANG"]
  monkeypatch.setattr(dev, "renderer", r)
  return r


def _run(sink, inputs):
  return kc.run(sink, inputs, "CLANG", "none")[0]


def test_every_half_code_to_float(half_as_bits):
  codes = np.arange(1 << 16, dtype=np.uint16)
  sink = A.sink(A.store(0, A.arg(1, dtypes.float16, (codes.size,)).cast(dtypes.float32)))
  src = kc.compile(sink, "CLANG", "none").program.src
  assert "_Float16" not in src and "__kc_float16_to_f" in src
  got, want = _run(sink, {1: codes.view(np.float16)}), codes.view(np.float16).astype(np.float32)
  nan = np.isnan(want)
  assert np.array_equal(np.isnan(got), nan) and np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_float_to_half_rounds_as_numpy(half_as_bits):
  rng = np.random.default_rng(0)
  halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
  finite = halves[np.isfinite(halves)].astype(np.float32)
  # each half, the midpoints between neighbours (ties to even), values just off them, random floats over the range,
  # subnormals, and what overflows: 65504 + 16 is the tie that rounds to inf
  mids = (finite[:-1].astype(np.float64) + np.diff(finite.astype(np.float64)) / 2).astype(np.float32)
  x = np.concatenate([finite, mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf)),
                      rng.uniform(-7e4, 7e4, 4096).astype(np.float32), rng.uniform(-1e-7, 1e-7, 4096).astype(np.float32),
                      np.array([65519.99, 65520, 65536, 1e30, -1e30, np.inf, -np.inf, np.nan, 0.0, -0.0, 2.0 ** -25, 2.0 ** -24], np.float32)])
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (x.size,)).cast(dtypes.float16)))
  with np.errstate(over="ignore"): want = x.astype(np.float16)
  got = _run(sink, {1: x})
  nan = np.isnan(want)
  assert np.array_equal(np.isnan(got), nan) and np.array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16))


def test_half_arithmetic_runs_in_float_and_rounds_each_op(half_as_bits):
  rng = np.random.default_rng(1)
  a, b = (rng.standard_normal(256).astype(np.float16) for _ in range(2))
  x, y = A.arg(1, dtypes.float16, (256,)), A.arg(2, dtypes.float16, (256,))
  sink = A.sink(A.store(0, x * y + x))
  k = kc.compile(sink, "CLANG", [Opt(OptOps.UPCAST, 0, 4)])
  out = np.empty(256, np.float16)
  k(out, a, b)
  assert np.array_equal(out, (a * b + a).astype(np.float16))  # each op rounded to half, as numpy does
