"""half, bfloat16 and fp8 held as bits (kc_llvm.small_floats): every code converts to float exactly, floats convert
to the small float as numpy (and kc's codec) round them: to nearest even, subnormals, overflow, NaN; a double goes
through round-to-odd so that it rounds once."""
import numpy as np
import pytest
import kc
from kc import dtypes
from kc import ast as A
from kc.ir.codec import decode, encode

SMALL = [dtypes.float16, dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2]
pytestmark = pytest.mark.usefixtures("cache_dir")


def _run(sink, inputs):
  return kc.run(sink, inputs, "LLVM", "none")[0]


def _bits(out) -> np.ndarray:
  """A small float result as its raw bits (numpy's half, or the bits kc returns for bfloat16 and fp8)."""
  out = np.asarray(out)
  return out.view(np.uint16 if out.itemsize == 2 else np.uint8)


def _same(got, want):
  nan = np.isnan(want)
  assert np.array_equal(np.isnan(got), nan)
  assert np.array_equal(got[~nan].view(np.uint8), want[~nan].view(np.uint8))


@pytest.mark.parametrize("dt", SMALL, ids=lambda d: d.name)
def test_every_code_to_float(dt):
  width = dt.itemsize * 8
  codes = np.arange(1 << width, dtype=np.uint16 if width == 16 else np.uint8)
  sink = A.sink(A.store(0, A.arg(1, dt, (codes.size,)).cast(dtypes.float32)))
  src = kc.compile(sink, "LLVM", "none").program.src
  assert f"@kc.{dt.name}.to.f32" in src and "half" not in src.split("define void")[1]  # held as bits, no LLVM half
  _same(_run(sink, {1: codes.view(np.float16) if dt == dtypes.float16 else codes}), decode(codes, dt).astype(np.float32))


def _floats(dt) -> np.ndarray:
  """The small float's finite values, the midpoints between neighbours (ties), values just off them, random floats
  over its range, and what overflows, underflows or is special."""
  width = dt.itemsize * 8
  with np.errstate(invalid="ignore"):  # bfloat16's NaN codes warn as they widen
    values = decode(np.arange(1 << width, dtype=np.uint16 if width == 16 else np.uint8), dt).astype(np.float64)
  finite = np.unique(values[np.isfinite(values)])
  mids = (finite[:-1] + np.diff(finite) / 2).astype(np.float32)
  top = float(finite[-1])
  rng = np.random.default_rng(0)
  with np.errstate(over="ignore", invalid="ignore"): return _candidates(finite, mids, top, rng)


def _candidates(finite, mids, top, rng) -> np.ndarray:
  return np.concatenate([finite.astype(np.float32), mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf)),
                         rng.uniform(-1.2 * top, 1.2 * top, 4096).astype(np.float32),
                         (rng.standard_normal(4096) * float(finite[finite > 0][0]) * 4).astype(np.float32),
                         np.array([top * 1.06, top * 2, 1e30, -1e30, 3.4e38, np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45], np.float32)])


@pytest.mark.parametrize("dt", SMALL, ids=lambda d: d.name)
def test_float_to_small_float_rounds_to_nearest_even(dt):
  x = _floats(dt)
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (x.size,)).cast(dt)))
  with np.errstate(over="ignore"): want = decode(encode(x, dt), dt)  # numpy warns of what overflows to inf
  _same(decode(_bits(_run(sink, {1: x})), dt), want)


@pytest.mark.parametrize("dt", SMALL, ids=lambda d: d.name)
def test_double_to_small_float_rounds_as_kc_does(dt):
  """half and fp8: a double just past a tie of the small float rounds once (rounding it to float first would land on
  the tie, and the tie would round to even, the wrong way; round-to-odd keeps the side). bfloat16: through float,
  as ml_dtypes and kc's codec convert a double."""
  x = _floats(dt).astype(np.float64)
  finite = x[np.isfinite(x)]
  x = np.concatenate([x, np.nextafter(finite, np.inf), np.nextafter(finite, -np.inf), [1 + 2.0 ** -8 + 2.0 ** -30]])
  sink = A.sink(A.store(0, A.arg(1, dtypes.float64, (x.size,)).cast(dt)))
  with np.errstate(over="ignore"): want = decode(encode(x, dt), dt)  # numpy warns of what overflows to inf
  _same(decode(_bits(_run(sink, {1: x})), dt), want)
