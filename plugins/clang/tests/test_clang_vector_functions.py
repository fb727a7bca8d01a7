"""CLANG's functions of float vectors (renderer.VECTOR_FUNCTIONS) against numpy's float64 results rounded once to
float32: exp2 (kc_exp2_<n>) within 2 ulp and log2 (kc_log2_<n>) within 3 everywhere, exact at the special values,
subnormals included; and WHERE on lane masks (kc_where_<n>, comparisons of float vectors) exactly as numpy selects."""
import re, shutil
import numpy as np
import pytest
import kc
from kc import Opt, OptOps, dtypes
from kc import ast as A
from kc_clang.compiler import ClangCompiler, compile_flags
from kc_clang.renderer import ClangRenderer


def _exp2_kernel(n: int, width: int):
  x = A.arg(1, dtypes.float32, (n,))
  return kc.compile(A.sink(A.store(0, x.exp2())), "CLANG", [Opt(OptOps.UPCAST, 0, width)])


def _ulps(got: np.ndarray, want64: np.ndarray) -> np.ndarray:
  want = want64.astype(np.float32)
  return np.abs(got.astype(np.float64) - want.astype(np.float64)) / np.spacing(np.abs(want)).astype(np.float64)


@pytest.mark.parametrize("width", [w for w in ClangRenderer().vector_widths(dtypes.float32) if w >= 4])
def test_vector_exp2_is_vectorized_and_within_2_ulp(width):
  rng = np.random.default_rng(width)
  n = 1 << 18
  x = np.concatenate([np.linspace(-152, 130, n // 2, dtype=np.float32), rng.uniform(-1, 1, n // 4).astype(np.float32),
                      rng.uniform(-149.9, -125, n // 4).astype(np.float32)])  # the subnormal results
  ck = _exp2_kernel(x.size, width)
  assert f"kc_exp2_{width}(" in ck.program.src  # the vector function, not exp2f lane by lane
  out = np.empty_like(x)
  ck(out, x)
  want = np.exp2(x.astype(np.float64))
  with np.errstate(over="ignore"): want32 = want.astype(np.float32)
  finite = np.isfinite(want32) & (want32 != 0)
  assert _ulps(out[finite], want[finite]).max() <= 2
  assert np.array_equal(out[~finite], want32[~finite])  # inf above 128, 0 below -149.5


def test_vector_exp2_special_values():
  specials = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 128.0, 127.99999, -126.0, -149.0, -149.5, -150.0, -151.0,
                       200.0, -200.0, 1e30, -1e30, 0.5, -0.5, 1.0, 3.0] * 4, dtype=np.float32)[:64]
  width = max(ClangRenderer().vector_widths(dtypes.float32))
  ck = _exp2_kernel(specials.size, width)
  out = np.empty_like(specials)
  ck(out, specials)
  with np.errstate(over="ignore"):
    want = np.exp2(specials.astype(np.float64)).astype(np.float32)
  np.testing.assert_array_equal(out, want)  # NaN matches NaN; inf, 0 and the exact powers of two exactly


def _log2_kernel(n: int, width: int):
  x = A.arg(1, dtypes.float32, (n,))
  return kc.compile(A.sink(A.store(0, x.log2())), "CLANG", [Opt(OptOps.UPCAST, 0, width)])


@pytest.mark.parametrize("width", [w for w in ClangRenderer().vector_widths(dtypes.float32) if w >= 4])
def test_vector_log2_is_vectorized_and_within_3_ulp(width):
  rng = np.random.default_rng(width)
  n = 1 << 18
  x = np.concatenate([rng.uniform(0.5, 2.0, n // 4), np.exp2(rng.uniform(-149, 128, n // 4)),  # subnormals too
                      1.0 + rng.uniform(-2.0 ** -10, 2.0 ** -10, n // 4), rng.uniform(1e-30, 1e30, n // 4)]).astype(np.float32)
  x = x[(x > 0) & np.isfinite(x)]
  x = x[: x.size // width * width]
  ck = _log2_kernel(x.size, width)
  assert f"kc_log2_{width}(" in ck.program.src  # the vector function, not log2f lane by lane
  out = np.empty_like(x)
  ck(out, x)
  want = np.log2(x.astype(np.float64))
  nonzero = want != 0
  # 3 ulp at worst, where x is near 1 (the exponent adds nothing and t's own rounding shows); libm's log2f gives 1
  assert _ulps(out[nonzero], want[nonzero]).max() <= 3
  # near 1 log2 is tiny: the error there is measured against the result's size (the series keeps it relative)
  assert np.array_equal(out[~nonzero], want[~nonzero].astype(np.float32))


def test_vector_log2_special_values():
  specials = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1.0, 2.0, 0.5, -1.0, -1e-45, 1e-45, 2.0 ** -126, 2.0 ** -127,
                       2.0 ** 127, 3.4028235e38, 1.4142135, 1.4142137, 0.70710677, -np.nan, 8.0] * 4, dtype=np.float32)[:64]
  width = max(ClangRenderer().vector_widths(dtypes.float32))
  ck = _log2_kernel(specials.size, width)
  out = np.empty_like(specials)
  ck(out, specials)
  with np.errstate(divide="ignore", invalid="ignore"):
    want = np.log2(specials.astype(np.float64))
    exact = ~np.isfinite(want) | (np.round(want) == want)  # nan, +-inf and the powers of two: exactly
  np.testing.assert_array_equal(out[exact], want[exact].astype(np.float32))
  assert _ulps(out[~exact], want[~exact]).max() <= 3


def _select_cases(x, y, m):
  """(kc expression, numpy result) pairs of WHERE and comparisons on float32 inputs x, y and a bool input m."""
  with np.errstate(invalid="ignore"):
    return [
      (lambda X, Y, M: X.maximum(0.0), np.maximum(x, 0)),  # a ReLU
      (lambda X, Y, M: A.where(X < Y, X * 2, Y - 1), np.where(x < y, x * 2, y - 1)),
      (lambda X, Y, M: A.where(X != X, 0.0, X.abs()), np.where(x != x, 0, np.abs(x))),  # NaN to 0
      (lambda X, Y, M: X.maximum(Y).minimum(1.5), np.minimum(np.maximum(x, y), np.float32(1.5))),  # NaN wins in both
      (lambda X, Y, M: A.where(M, X, Y * 3), np.where(m, x, y * 3)),  # a loaded bool as the mask
      (lambda X, Y, M: A.where((X < 0) & (Y > 0) | M, X + Y, -X), np.where((x < 0) & (y > 0) | m, x + y, -x)),
      (lambda X, Y, M: A.where(~(X < Y), X, Y) * 3, np.where(~(x < y), x, y) * 3),
      (lambda X, Y, M: X.sign() * Y, np.sign(x) * y),
    ]


@pytest.mark.parametrize("width", [w for w in ClangRenderer().vector_widths(dtypes.float32) if w >= 4])
def test_vector_where_and_comparisons_select_as_numpy(width):
  rng = np.random.default_rng(100 + width)
  n = width * 64
  x, y = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
  x[::7], y[::11], x[::13], y[::17], x[::19] = np.nan, np.nan, 0.0, -0.0, -np.inf
  m = rng.random(n) < 0.5
  X, Y, M = A.arg(1, dtypes.float32, (n,)), A.arg(2, dtypes.float32, (n,)), A.arg(3, dtypes.bool, (n,))
  for i, (expr, want) in enumerate(_select_cases(x, y, m)):
    ck = kc.compile(A.sink(A.store(0, expr(X, Y, M))), "CLANG", [Opt(OptOps.UPCAST, 0, width)])
    assert f"kc_where_{width}(" in ck.program.src or "kc_int" in ck.program.src, (i, ck.program.src)
    out = np.empty(n, np.float32)
    ck(out, *(a for k, a in ((1, x), (2, y), (3, m)) if k in ck.program.globals))
    np.testing.assert_array_equal(out, want.astype(np.float32), err_msg=f"case {i}")


@pytest.mark.parametrize("width", [w for w in ClangRenderer().vector_widths(dtypes.float32) if w >= 4])
def test_a_max_reduce_keeps_one_vector_accumulator_and_matches_numpy(width):
  # softmax's row max: the unrolled lanes' accumulators are one vector updated by kc_max_<n>, their combine after the
  # loop is scalar maxes; NaN anywhere in a row wins, -inf and signed zeros as numpy
  rng = np.random.default_rng(200 + width)
  rows, cols = 24, width * 16
  x = rng.standard_normal((rows, cols)).astype(np.float32)
  x[3, 5], x[7, -1], x[11, 0] = np.nan, np.nan, np.nan
  x[13], x[14] = -np.inf, 0.0
  x[14, ::3] = -0.0
  X = A.arg(1, dtypes.float32, (rows, cols))
  ck = kc.compile(A.sink(A.store(0, X.max(axis=1))), "CLANG", [Opt(OptOps.UNROLL, 0, width)])
  # the accumulators are vectors (the loop's steps interleaved over several: adjacent ones may share a wider vector)
  assert re.search(r"kc_max_\d+\(acc", ck.program.src), ck.program.src
  out = np.empty(rows, np.float32)
  ck(out, x)
  np.testing.assert_array_equal(out, x.max(axis=1))


@pytest.mark.parametrize("cc", [c for c in ("gcc", "clang") if shutil.which(c)])
@pytest.mark.parametrize("isa", ["avx512f", "avx2", "sse2"])
@pytest.mark.parametrize("fn", ["exp2", "log2"])
def test_vector_functions_fuse_their_steps_where_fma3_is_and_keep_their_bounds(fn, isa, cc):
  """Built for each ISA level with each compiler: the polynomial's steps are FMA builtins where the code may use
  FMA3 (avx2, avx512f) and a multiply and an add on sse2, exp2's scaling vscalefps on avx512f; exp2 within 2 ulp and
  log2 within 3 either way."""
  try: r = ClangRenderer(isa=isa)
  except kc.ConfigError: pytest.skip(f"this host lacks {isa}")
  width = max(r.vector_widths(dtypes.float32))
  rng = np.random.default_rng(7)
  x = (rng.uniform(-140, 120, 1 << 14) if fn == "exp2" else np.exp2(rng.uniform(-140, 120, 1 << 14))).astype(np.float32)
  k = kc.Kernel(A.sink(A.store(0, getattr(A.arg(1, dtypes.float32, (x.size,)), fn)())), r)
  k.apply_opt(Opt(OptOps.UPCAST, 0, width))
  prg = k.to_program()
  body = prg.src[prg.src.index(f"kc_{fn}_{width}("):]
  assert ("__builtin_ia32_vfmadd" in body.split("\n}")[0]) == (isa != "sse2")
  # AVX-512F's exp2 scales by 2^n with vscalefps (no exponent bits built, no NaN lanes carried past them)
  if fn == "exp2": assert ("__builtin_ia32_scalefps512_mask" in body.split("\n}")[0]) == (isa == "avx512f")
  lib = ClangCompiler(cmd=[cc], flags=compile_flags(cmd=[cc], isa=isa)).compile(prg.src)
  out = kc.Buffer("CLANG", x.size, dtypes.float32).allocate()
  kc.Device["CLANG"].runtime(prg.name, lib)(out, kc.Buffer("CLANG", x.size, dtypes.float32).copyin(x))
  want = getattr(np, fn)(x.astype(np.float64))
  keep = want != 0
  assert _ulps(out.numpy()[keep], want[keep]).max() <= (2 if fn == "exp2" else 3)


SPECIALS = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.5], np.float32)


@pytest.mark.parametrize("cc", [c for c in ("gcc", "clang") if shutil.which(c)])
def test_a_max_that_updates_no_accumulator_selects_without_a_branch_as_numpy(cc, monkeypatch):
  # a 2x2 window's max unrolled is a tree of scalar maxes: kc_selmax_float32 (a compare-and-max and a blend), which
  # gives numpy's maximum for every pair of specials: a NaN in either operand wins, of two equal zeros the second;
  # a reduce's running max over a row keeps kc_max_float32 (its branch predicts well)
  monkeypatch.setenv("KC_CC", cc)
  a, b = (v.ravel() for v in np.meshgrid(SPECIALS, SPECIALS, indexing="ij"))
  x = np.stack([a, b], axis=1)                                    # (81, 2): every ordered pair
  X = A.arg(1, dtypes.float32, x.shape)
  ck = kc.compile(A.sink(A.store(0, X.max(axis=1))), "CLANG", [Opt(OptOps.UNROLL, 0, 0)])
  assert "kc_selmax_float32(" in ck.program.src and "kc_max_float32(" not in ck.program.src, ck.program.src
  out = np.empty(len(x), np.float32)
  ck(out, x)
  want = np.maximum(x[:, 0], x[:, 1])
  np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
  np.testing.assert_array_equal(out.view(np.uint32)[~np.isnan(want)], want.view(np.uint32)[~np.isnan(want)])
  row = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (7, 33)).max(axis=1))), "CLANG", "none")  # a scalar loop
  assert re.search(r"kc_max_float32\(acc", row.program.src), row.program.src
