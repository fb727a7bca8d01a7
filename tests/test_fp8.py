"""fp8e4m3 and fp8e5m2 end to end: kc's own numpy conversions against ml_dtypes (the independent reference), the
promotion lattice, constant folding, arguments, and the emulator's and the C dialects' arithmetic and conversions."""
import itertools
import numpy as np
import pytest
import kc
from kc import ast as A, dtypes
from kc.ir.dtype import float_to_fp8, fp8_to_float32, least_upper_dtype, truncate

ml_dtypes = pytest.importorskip("ml_dtypes")
FORMATS = [(dtypes.fp8e4m3, ml_dtypes.float8_e4m3fn), (dtypes.fp8e5m2, ml_dtypes.float8_e5m2)]
IDS = ["e4m3", "e5m2"]
DEVICES = [d for d in ("EMU", "CLANG", "OPENCL") if kc.Device.unavailable_reason(d) is None]


def _ref_bits(x: np.ndarray, md) -> np.ndarray:
  """ml_dtypes' fp8 codes of float32 values (its NaN conversions warn, as numpy's own casts do)."""
  with np.errstate(invalid="ignore", over="ignore"): return x.astype(md).view(np.uint8)


def _probe_floats(md) -> np.ndarray:
  """float32 values that exercise every rounding case: all float16 bit patterns, every midpoint between neighbouring
  fp8 values (the ties), just either side of them, specials and the overflow edges."""
  vals = np.arange(256, dtype=np.uint8).view(md).astype(np.float32)
  vals = np.sort(vals[np.isfinite(vals)].astype(np.float64))
  mids = ((vals[:-1] + vals[1:]) / 2).astype(np.float32)
  near = np.concatenate([np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))])
  special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 448, 464, 480, 57344, 61440, 65536, 1e30, -1e30, 1e-30], np.float32)
  return np.concatenate([np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32), mids, near, special])


@pytest.mark.parametrize("dt,md", FORMATS, ids=IDS)
def test_decode_matches_ml_dtypes_for_every_code(dt, md):
  codes = np.arange(256, dtype=np.uint8)
  assert np.array_equal(fp8_to_float32(codes, dt), codes.view(md).astype(np.float32), equal_nan=True)


@pytest.mark.parametrize("dt,md", FORMATS, ids=IDS)
def test_encode_matches_ml_dtypes(dt, md):
  x = _probe_floats(md)
  assert np.array_equal(float_to_fp8(x, dt), _ref_bits(x, md))


def test_encode_rounds_float64_once():
  # just below the midpoint of 0.6875 and 0.75: one rounding gives 0.6875 (through float32 it would tie to 0.75)
  assert fp8_to_float32(float_to_fp8(0.71875 - 1e-9, dtypes.fp8e4m3), dtypes.fp8e4m3) == 0.6875


def test_dtype_facts_and_aliases():
  assert dtypes.float8_e4m3fn is dtypes.fp8e4m3 and dtypes.float8_e5m2 is dtypes.fp8e5m2
  for dt in dtypes.fp8s:
    assert dt in dtypes.floats and dt in dtypes.all and dtypes.is_float(dt) and dt.np is None and dt.itemsize == 1
    assert dtypes.fields()[dt.name] is dt
  assert (dtypes.fp8e4m3.min, dtypes.fp8e4m3.max) == (-448.0, 448.0)
  assert (dtypes.fp8e5m2.min, dtypes.fp8e5m2.max) == (-np.inf, np.inf)
  assert dtypes.finfo(dtypes.fp8e4m3) == (4, 3) and dtypes.finfo(dtypes.fp8e5m2) == (5, 2)


def test_promotion_places_fp8_below_the_16_bit_floats():
  e4, e5 = dtypes.fp8e4m3, dtypes.fp8e5m2
  assert least_upper_dtype(e4, e5) is dtypes.float16 and least_upper_dtype(e4, dtypes.bfloat16) is dtypes.bfloat16
  assert least_upper_dtype(dtypes.bool, e4) is e4 and least_upper_dtype(e5, dtypes.int8) is dtypes.float16
  assert least_upper_dtype(e4, dtypes.float32) is dtypes.float32 and least_upper_dtype(e5, dtypes.int32) is dtypes.float64
  # every pair without fp8 keeps its result
  others = [d for d in dtypes.all if d not in dtypes.fp8s]
  for a, b in itertools.product(others, repeat=2):
    if a.np is not None and b.np is not None: assert least_upper_dtype(a, b).np == np.promote_types(a.np, b.np)


def test_constant_folding_rounds_to_fp8():
  assert truncate(dtypes.fp8e4m3, 0.3) == 0.3125 and np.isnan(truncate(dtypes.fp8e4m3, 1000.0))
  assert truncate(dtypes.fp8e5m2, 1e6) == np.inf and truncate(dtypes.fp8e4m3, 464.0) == 448.0


def _cast_kernel(src_dt, dst_dt, n):
  return A.sink(A.store(0, A.arg(1, src_dt, (n,)).cast(dst_dt)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt,md", FORMATS, ids=IDS)
def test_conversions_on_device_match_ml_dtypes(device, dt, md):
  x = _probe_floats(md)
  got = kc.run(_cast_kernel(dtypes.float32, dt, x.size), {1: x}, device=device)[0]
  assert np.array_equal(got.view(np.uint8), _ref_bits(x, md))
  codes = np.arange(256, dtype=np.uint8)
  back = kc.run(_cast_kernel(dt, dtypes.float32, 256), {1: codes}, device=device)[0]
  assert np.array_equal(back, codes.view(md).astype(np.float32), equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt,md", FORMATS + [(dtypes.bfloat16, ml_dtypes.bfloat16)], ids=IDS + ["bf16"])
@pytest.mark.parametrize("test", ["isnan", "isinf", "isfinite"])
def test_float_tests_of_every_code(device, dt, md, test):
  # e4m3 has no infinity: a test against an inf constant of its own compared with NaN (isfinite was False everywhere)
  codes = np.arange(2 ** (8 * md(0).itemsize), dtype=np.uint8 if md(0).itemsize == 1 else np.uint16)
  want = getattr(np, test)(codes.view(md).astype(np.float32))
  got = kc.run(A.sink(A.store(0, getattr(A.arg(1, dt, (codes.size,)), test)())), {1: codes}, device=device)[0]
  assert np.array_equal(got, want), np.flatnonzero(got != want)[:8]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt,md", FORMATS, ids=IDS)
def test_arithmetic_rounds_after_every_op(device, dt, md):
  rng = np.random.default_rng(0)
  xv, yv = ((rng.standard_normal(256) * 8).astype(np.float32).astype(md) for _ in range(2))
  x, y = A.arg(1, dt, (256,)), A.arg(2, dt, (256,))
  outs = kc.run(A.sink(A.store(0, x * y + x), A.store(3, x < y), A.store(4, x.bitcast(dtypes.uint8))), {1: xv, 2: yv}, device=device)
  f = lambda a: a.astype(np.float32)  # noqa: E731
  want = (f((f(xv) * f(yv)).astype(md)) + f(xv)).astype(md)
  assert outs[0].dtype == md and np.array_equal(outs[0].view(np.uint8), want.view(np.uint8))
  assert np.array_equal(outs[3], f(xv) < f(yv)) and np.array_equal(outs[4], xv.view(np.uint8))
  mx = kc.run(A.sink(A.store(0, x.max(0))), {1: xv}, device=device)[0]
  assert f(mx.reshape(-1)[:1].view(md))[0] == f(xv).max()


def test_arguments_accept_ml_dtypes_and_bits_and_reject_others():
  x = A.arg(1, dtypes.fp8e4m3, (4,))
  k = kc.compile(A.sink(A.store(0, x + x)), device="EMU")
  bits = np.array([0x38, 0x40, 0xB8, 0], np.uint8)  # 1, 2, -1, 0
  out = np.zeros(4, np.uint8)
  k(out, bits)
  assert np.array_equal(fp8_to_float32(out, dtypes.fp8e4m3), [2, 4, -2, 0])
  out_md = np.zeros(4, ml_dtypes.float8_e4m3fn)
  k(out_md, bits.view(ml_dtypes.float8_e4m3fn))
  assert np.array_equal(out_md.astype(np.float32), [2, 4, -2, 0])
  with pytest.raises(kc.KcError, match="fp8e4m3.*ml_dtypes.float8_e4m3fn"): k(out, bits.astype(np.float32))
  with pytest.raises(kc.KcError, match="fp8e4m3"): k(np.zeros(4, ml_dtypes.float8_e5m2), bits)


def test_wmma_free_matmul_of_fp8_accumulates_in_float32():
  a, b = A.arg(1, dtypes.fp8e4m3, (8, 16)), A.arg(2, dtypes.fp8e4m3, (16, 8))
  sink = A.sink(A.store(0, (a.cast(dtypes.float32).reshape(8, 16, 1) * b.cast(dtypes.float32).reshape(1, 16, 8)).sum(1)))
  rng = np.random.default_rng(1)
  av, bv = (rng.standard_normal(shape).astype(np.float32).astype(ml_dtypes.float8_e4m3fn) for shape in ((8, 16), (16, 8)))
  got = kc.run(sink, {1: av, 2: bv}, device="EMU")[0]
  np.testing.assert_allclose(got.reshape(8, 8), av.astype(np.float32) @ bv.astype(np.float32), rtol=1e-5, atol=1e-5)


def test_a_new_backend_from_the_template_runs_fp8_through_the_base(tmp_path):
  import importlib, sys
  from kc.tools.new_backend import write_backend
  from kc.runtime import plugins
  folder = write_backend("fp8toy", tmp_path)
  sys.path.insert(0, str(folder))
  try:
    [spec] = importlib.import_module("kc_fp8toy").kc_backends()
    plugins.register(spec, replace=True)
    try:
      for dt, md in FORMATS:
        x = _probe_floats(md)
        got = kc.run(_cast_kernel(dtypes.float32, dt, x.size), {1: x}, device="FP8TOY")[0]
        assert np.array_equal(got.view(np.uint8), _ref_bits(x, md))
        xv = np.linspace(-3, 3, 32, dtype=np.float32).astype(md)
        a = A.arg(1, dt, (32,))
        out = kc.run(A.sink(A.store(0, a * a)), {1: xv}, device="FP8TOY")[0]
        assert np.array_equal(out.view(np.uint8), (xv.astype(np.float32) ** 2).astype(md).view(np.uint8))
    finally: plugins.unregister("FP8TOY")
  finally:
    sys.path.remove(str(folder))
    for mod in [m for m in sys.modules if m == "kc_fp8toy" or m.startswith("kc_fp8toy.")]: del sys.modules[mod]


@pytest.mark.parametrize("device", DEVICES)
def test_a_cast_from_float64_rounds_once(device):
  # each just off a tie: between 0.6875 and 0.75, and at 464, the midpoint past which e4m3 overflows to NaN. Through
  # float32 these would round onto the tie and then to even; one rounding gives the nearer value
  x = np.array([0.71875 - 1e-9, 0.71875 + 1e-9, -(0.71875 - 1e-9), 464 - 1e-7, 464 + 1e-7, 0.5, 1e300, -1e-300, np.nan], np.float64)
  got = kc.run(_cast_kernel(dtypes.float64, dtypes.fp8e4m3, x.size), {1: x}, device=device)[0]
  assert np.array_equal(got.view(np.uint8), float_to_fp8(x, dtypes.fp8e4m3))
  vals = fp8_to_float32(got.view(np.uint8), dtypes.fp8e4m3)
  assert vals[:4].tolist() == [0.6875, 0.75, -0.6875, 448.0] and np.isnan(vals[4]) and vals[5] == 0.5 and np.isnan(vals[6]) and vals[7] == 0


@pytest.mark.parametrize("dt,md", FORMATS, ids=IDS)
def test_emu_wmma_with_fp8_inputs_multiplies_exactly_and_accumulates_in_float32(dt, md):
  # the built-in 4x4x4 half tensor core with fp8 inputs, as sm_89's m16n8k32 takes e4m3/e5m2 with float accumulation
  import dataclasses
  from kc.emu import BUILTIN_TENSOR_CORES, EmuRenderer
  tc = dataclasses.replace(BUILTIN_TENSOR_CORES[0], dtype_in=dt)
  renderer = EmuRenderer()
  renderer.tensor_cores = [tc]
  dev = kc.Device["EMU"]
  saved, dev.renderer = dev.renderer, renderer
  try:
    M = K = N = 16
    a, b = A.arg(1, dt, (M, K)), A.arg(2, dt, (K, N))
    k = kc.Kernel(A.sink(A.store(0, (a.reshape(M, K, 1) * b.reshape(1, K, N)).cast(dtypes.float32).sum(1))), renderer)
    assert k.apply_tensor_cores(1, tc_opt=2, extra_opts=[])
    assert any(u.op is kc.Ops.WMMA for u in k.get_optimized_ast().toposort)
    rng = np.random.default_rng(2)
    x, y = ((rng.standard_normal((16, 16)) * 4).astype(np.float32).astype(md) for _ in range(2))
    prg = k.to_program()
    bufs = [kc.Buffer("EMU", 256, d).allocate() for d in (dtypes.float32, dt, dt)]
    bufs[1].copyin(memoryview(x.view(np.uint8).reshape(-1))); bufs[2].copyin(memoryview(y.view(np.uint8).reshape(-1)))
    g, l = prg.launch_dims({})
    dev.runtime(prg.name, dev.compiler.compile(prg.src))(*[bufs[i] for i in prg.globals], global_size=g, local_size=l)
    # products of fp8 values are exact in float32; float64 sums of them are the reference, float32 accumulation is close
    want = x.astype(np.float64) @ y.astype(np.float64)
    np.testing.assert_allclose(bufs[0].numpy().reshape(M, N), want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
  finally: dev.renderer = saved


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt,md", FORMATS, ids=IDS)
def test_sums_and_matmuls_accumulate_in_float32_and_round_once(device, dt, md):
  # as half and bfloat16 do (ACCUMULATE): added up in fp8, every partial sum would be rounded, and the answer would
  # depend on the order of the terms
  rng = np.random.default_rng(2)
  x = rng.standard_normal(96).astype(np.float32).astype(md)
  got = kc.run(A.sink(A.store(0, A.arg(1, dt, (96,)).sum())), {1: x}, device=device)[0]
  assert np.asarray(got).view(md) == x.astype(np.float32).sum(dtype=np.float32).astype(md)
  a, b = rng.standard_normal((6, 16)).astype(np.float32).astype(md), rng.standard_normal((16, 5)).astype(np.float32).astype(md)
  got = kc.run(A.sink(A.store(0, A.arg(1, dt, (6, 16)) @ A.arg(2, dt, (16, 5)))), {1: a, 2: b}, device=device)[0]
  want = (a.astype(np.float32) @ b.astype(np.float32)).astype(md)
  np.testing.assert_array_equal(np.asarray(got).view(md).astype(np.float32), want.astype(np.float32))
