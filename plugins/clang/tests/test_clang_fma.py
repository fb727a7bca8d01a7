"""CLANG's sums of products round each product once (kc.codegen.fma): fmaf for scalars, the FMA3/AVX-512F builtins
for float vectors, on x86 code that may use FMA3 (native on a CPU with it, KC_CLANG_ISA avx2 and avx512f); elsewhere,
and in every elementwise a*b+c, the product is rounded before the add, as numpy rounds it. Built with gcc and clang."""
import platform, shutil
import numpy as np
import pytest
import kc
from kc import Buffer, dtypes
from kc import ast as A
from kc.api import optimize
from kc_clang.compiler import ClangCompiler, compile_flags
from kc_clang.host import ISA_LEVELS, host_cpu, isa_level
from kc_clang.renderer import ClangRenderer

X86 = platform.machine().lower() in ("x86_64", "amd64")
BUILTIN = {"avx512f": "__builtin_ia32_vfmaddps512_mask", "avx2": "__builtin_ia32_vfmaddps256"}
COMPILERS = [c for c in ("gcc", "clang") if shutil.which(c)]


def _runs(name: str) -> bool:
  try: isa_level(name)
  except kc.ConfigError: return False
  return X86


def mm(M, K, N):
  return A.sink(A.store(0, A.arg(1, dtypes.float32, (M, K)) @ A.arg(2, dtypes.float32, (K, N))))


@pytest.mark.skipif(not X86, reason="ISA levels are x86-64 only")
@pytest.mark.parametrize("name", list(ISA_LEVELS))
def test_the_levels_with_fma3_fuse_a_matmuls_accumulation_and_sse2_does_not(name):
  r = ClangRenderer(isa=name) if _runs(name) else None
  if r is None: pytest.skip(f"this host lacks {name}")
  src = optimize(kc.Kernel(mm(64, 64, 64), r), "hand").to_program().src
  assert r.fuses_accumulation == (name != "sse2")
  # every accumulator's update is the builtin, with no multiply left beside it
  updates = [line.split(" = ", 1)[1] for line in src.splitlines() if line.strip().startswith("acc") and " = " in line and "cast0" not in line]
  if name in BUILTIN: assert updates and all(u.startswith(BUILTIN[name] + "(") and "*" not in u for u in updates)
  else: assert "__builtin_ia32_vfmadd" not in src and "__builtin_fma" not in src


def test_portable_code_fuses_nothing():
  assert ClangRenderer(native=False).fuses_accumulation is False


def _run(sink, r: ClangRenderer, cc: str, inputs, out_size, opts="none"):
  prg = optimize(kc.Kernel(sink, r), opts).to_program()
  flags = compile_flags(cmd=[cc], isa=None if r.native else r.arch.split()[-1])
  fn = kc.Device["CLANG"].runtime(prg.name, ClangCompiler(cmd=[cc], flags=flags).compile(prg.src))
  out = Buffer("CLANG", out_size, dtypes.float32).allocate()
  fn(out, *(Buffer("CLANG", x.size, dtypes.float32).copyin(x) for x in inputs))
  return prg.src, out.numpy()


E12, E24 = 2.0 ** -12, 2.0 ** -24


@pytest.mark.skipif(not (X86 and "fma" in host_cpu().features), reason="needs an x86 CPU with FMA3")
@pytest.mark.parametrize("cc", COMPILERS)
@pytest.mark.parametrize("N", [1, 16, 64])
def test_a_product_is_rounded_once_in_a_sum_and_twice_elementwise(cc, N, cache_dir):
  # (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24: rounded alone it is 1 + 2^-11, so -(1 + 2^-11) + it is 0 with two roundings
  # and 2^-24 with one. A dot product of [1, 1+2^-12, 0, ...] and [-(1+2^-11), 1+2^-12, 0, ...] in each of N output
  # lanes of M rows (N=1: fmaf in a loop of 2; 16, 64: float vectors, the hand-coded register tile of 16 rows, over
  # a K of 64 so that the hand-coded opts keep a loop), and the same sum written elementwise
  M, K = (1, 2) if N == 1 else (16, 64)
  a = np.zeros((M, K), np.float32); a[:, :2] = [1.0, 1 + E12]
  b = np.zeros((K, N), np.float32); b[:2] = np.array([[-(1 + 2 * E12)], [1 + E12]], np.float32)
  r = ClangRenderer()
  src, got = _run(mm(M, K, N), r, cc, [a, b], M * N, opts="none" if N == 1 else "hand")
  assert ("__builtin_fmaf" if N == 1 else BUILTIN[r.arch.split()[-1]]) in src
  assert np.all(got == np.float32(E24)), got
  x, y, z = (A.arg(i, dtypes.float32, (N,)) for i in (1, 2, 3))
  ones = np.full(N, 1 + E12, np.float32)
  src, got = _run(A.sink(A.store(0, x * y + z)), r, cc, [ones, ones, np.full(N, -(1 + 2 * E12), np.float32)], N, opts="hand")
  assert "fma" not in src
  assert np.all(got == ones * ones - np.float32(1 + 2 * E12)) and np.all(got == 0)


@pytest.mark.skipif(not X86, reason="ISA levels are x86-64 only")
@pytest.mark.parametrize("cc", COMPILERS)
@pytest.mark.parametrize("name", [n for n in ("avx512f", "avx2") if n in ISA_LEVELS])
def test_fused_matmul_and_conv_for_a_level_match_numpy(cc, name, cache_dir):
  if not _runs(name): pytest.skip(f"this host lacks {name}")
  rng = np.random.default_rng(3)
  x, y = rng.standard_normal((48, 80)).astype(np.float32), rng.standard_normal((80, 96)).astype(np.float32)
  src, got = _run(mm(48, 80, 96), ClangRenderer(isa=name), cc, [x, y], 48 * 96, opts="hand")
  assert BUILTIN[name] in src
  np.testing.assert_allclose(got.reshape(48, 96), x.astype(np.float64) @ y.astype(np.float64), rtol=1e-5, atol=1e-4)
  cin, cout, H, W, k = 4, 16, 8, 32, 3
  img, w = rng.standard_normal((cin, H, W)).astype(np.float32), rng.standard_normal((cout, cin, k, k)).astype(np.float32)
  xi, wi = A.arg(1, dtypes.float32, (cin, H, W)), A.arg(2, dtypes.float32, (cout, cin, k, k))
  win = xi.pad(((0, 0), (1, 1), (1, 1))).windows(1, k).windows(2, k).permute(0, 3, 4, 1, 2).reshape(1, cin, k, k, H, W)
  sink = A.sink(A.store(0, (win * wi.reshape(cout, cin, k, k, 1, 1)).sum(axis=(1, 2, 3))))
  src, got = _run(sink, ClangRenderer(isa=name), cc, [img, w], cout * H * W, opts="hand")
  assert BUILTIN[name] in src
  p = np.pad(img.astype(np.float64), ((0, 0), (1, 1), (1, 1)))
  want = np.einsum("oikl,ihwkl->ohw", w.astype(np.float64), np.lib.stride_tricks.sliding_window_view(p, (k, k), axis=(1, 2)))
  np.testing.assert_allclose(got.reshape(cout, H, W), want, rtol=1e-5, atol=1e-4)
