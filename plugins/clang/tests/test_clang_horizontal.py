"""CLANG kernels whose vector accumulators are combined after their loops (x @ W.T: every Linear layer; several row
maxima or sums at once) combine them with even/odd shuffles of whole vectors (kc.codegen.horizontal), at every ISA
level and with gcc and clang, with numpy's results; and gcc is not left tuning for a CPU without the AVX-512 the
host runs (-mtune=generic where gcc 12 takes a Zen 4 for a Zen 3)."""
import platform, re, shutil
import numpy as np
import pytest
import kc
from kc import Buffer, dtypes
from kc import ast as A
from kc.api import optimize
from kc_clang import compiler
from kc_clang.compiler import ClangCompiler, CompilerId, compile_flags
from kc_clang.host import ISA_LEVELS, HostCPU, isa_level
from kc_clang.renderer import ClangRenderer

X86 = platform.machine().lower() in ("x86_64", "amd64")
COMPILERS = [c for c in ("gcc", "clang") if shutil.which(c)]


def _renderer(isa):
  if isa == "native": return ClangRenderer()
  try: isa_level(isa)
  except kc.ConfigError: return None
  return ClangRenderer(isa=isa) if X86 else None


F = lambda i, *s: A.arg(i, dtypes.float32, s)  # noqa: E731
CASES = {
  "x @ W.T": ((16, 256, 32), lambda M, K, N: F(1, M, K) @ F(2, N, K).T, lambda x, w: x @ w.T),
  "row sums": ((8, 1024, 1), lambda M, K, N: F(1, M, K).sum(axis=1), lambda x, w: x.sum(axis=1)),
  "row maxima": ((8, 1024, 1), lambda M, K, N: F(1, M, K).max(axis=1), lambda x, w: x.max(axis=1)),
}


@pytest.mark.parametrize("cc", COMPILERS)
@pytest.mark.parametrize("isa", ["native", *ISA_LEVELS])
@pytest.mark.parametrize("case", list(CASES))
def test_combined_lanes_are_shuffled_as_vectors_and_mean_what_numpy_means(case, isa, cc):
  r = _renderer(isa)
  if r is None: pytest.skip(f"this host lacks {isa}")
  (M, K, N), build, oracle = CASES[case]
  prg = optimize(kc.Kernel(A.sink(A.store(0, build(M, K, N))), r), "hand").to_program()
  widest = max(r.vector_widths(dtypes.float32), default=1)
  if widest >= 4 and case != "row sums":  # (a row sum's one chain may be no vector accumulator at small widths)
    # an even-lanes shuffle of an accumulator, and no two lanes of one accumulator summed (or maxed) as scalars
    assert re.search(r"\{acc\d+\[0\],acc\d+\[2\],", prg.src), prg.src
    assert not re.search(r"(acc\d+)\[\d+\]\s*\+\s*\1\[|max\w*\((acc\d+)\[\d+\],\s*\2\[", prg.src), prg.src
  flags = compile_flags(cmd=[cc], isa=None if isa == "native" else isa)
  fn = kc.Device["CLANG"].runtime(prg.name, ClangCompiler(cmd=[cc], flags=flags).compile(prg.src))
  rng = np.random.default_rng(0)
  x, w = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((N, K)).astype(np.float32)
  want = oracle(x, w)
  out = Buffer("CLANG", want.size, dtypes.float32).allocate()
  fn(out, *(Buffer("CLANG", a.size, dtypes.float32).copyin(a) for a in ((x, w) if case == "x @ W.T" else (x,))))
  np.testing.assert_allclose(out.numpy().reshape(want.shape), want, rtol=1e-5, atol=1e-4)


ZEN4 = HostCPU("x86_64", "AMD EPYC 9R14 96-Core Processor", ("avx", "avx2", "avx512f", "fma"))


@pytest.mark.parametrize("cpu, found, generic", [
  (ZEN4, CompilerId("gcc", 12, "gcc 12.2.0"), True),   # gcc 12 tunes a Zen 4 as a Zen 3
  (ZEN4, CompilerId("gcc", 13, "gcc 13.1.0"), False),  # gcc 13 knows znver4
  (ZEN4, CompilerId("clang", 14, "clang version 14"), False),
  (HostCPU("x86_64", "AMD EPYC 7B13", ("avx", "avx2", "fma")), CompilerId("gcc", 12, "gcc 12.2.0"), False),  # a Zen 3
  (HostCPU("x86_64", "Intel(R) Xeon(R) Platinum 8375C", ("avx2", "avx512f")), CompilerId("gcc", 12, "gcc"), False),
])
def test_gcc_tunes_generically_only_for_a_cpu_it_does_not_know(monkeypatch, cpu, found, generic):
  monkeypatch.setattr(compiler, "compiler_id", lambda cmd: found)
  assert compiler.tuning_misses_cpu(("cc",), cpu) is generic


@pytest.mark.skipif(not COMPILERS or "gcc" not in COMPILERS, reason="needs gcc")
def test_native_flags_carry_the_generic_tuning_where_gcc_misses_the_cpu():
  from kc_clang.host import host_cpu
  flags = compiler.native_flags(("gcc",))
  assert flags[0] == "-march=native"
  assert ("-mtune=generic" in flags) == compiler.tuning_misses_cpu(("gcc",), host_cpu())
