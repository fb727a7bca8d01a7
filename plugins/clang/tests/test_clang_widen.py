"""CLANG kernels whose register tile stores narrow vectors (x @ W.T: four float4 rows per tile) compute what follows
the product (a bias, a sigmoid, a select) as one vector of the widest width the ISA has (kc.codegen.widen), at every
ISA level and with gcc and clang, with numpy's results."""
import platform, re, shutil
import numpy as np
import pytest
import kc
from kc import Buffer, dtypes
from kc import ast as A
from kc.api import optimize
from kc_clang.compiler import ClangCompiler, compile_flags
from kc_clang.host import ISA_LEVELS, isa_level
from kc_clang.renderer import ClangRenderer

X86 = platform.machine().lower() in ("x86_64", "amd64")
COMPILERS = [c for c in ("gcc", "clang") if shutil.which(c)]
F = lambda i, *s: A.arg(i, dtypes.float32, s)  # noqa: E731


def _renderer(isa):
  if isa == "native": return ClangRenderer()
  try: isa_level(isa)
  except kc.ConfigError: return None
  return ClangRenderer(isa=isa) if X86 else None


@pytest.mark.parametrize("cc", COMPILERS)
@pytest.mark.parametrize("isa", ["native", *ISA_LEVELS])
def test_a_tiles_epilogue_runs_at_the_widest_width_and_means_what_numpy_means(isa, cc):
  r = _renderer(isa)
  if r is None: pytest.skip(f"this host lacks {isa}")
  M, K, N = 16, 256, 32
  y = F(1, M, K) @ F(2, N, K).T + F(3, N)
  sig = 1.0 / (1.0 + (-y).exp2())
  sink = A.sink(A.store(0, (y < 0).where(y * sig, y * 0.5 + sig)))
  prg = optimize(kc.Kernel(sink, r), "hand").to_program()
  widest = max(r.vector_widths(dtypes.float32), default=1)
  stored = {int(n) for n in re.findall(r"\*\(\(float(\d+)\*\)\(data0", prg.src)}
  exps = {int(n) for n in re.findall(r"kc_exp2_(\d+)\(", prg.src)}
  if stored and max(stored) < widest:  # narrow stores: their exp2 at the widest width, and at no other
    assert exps == {widest}, prg.src
  flags = compile_flags(cmd=[cc], isa=None if isa == "native" else isa)
  fn = kc.Device["CLANG"].runtime(prg.name, ClangCompiler(cmd=[cc], flags=flags).compile(prg.src))
  rng = np.random.default_rng(0)
  x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((M, K), (N, K), (N,)))
  yy = x @ w.T + b
  s = 1 / (1 + np.exp2(-yy))
  want = np.where(yy < 0, yy * s, yy * 0.5 + s)
  out = Buffer("CLANG", want.size, dtypes.float32).allocate()
  fn(out, *(Buffer("CLANG", a.size, dtypes.float32).copyin(a) for a in (x, w, b)))
  np.testing.assert_allclose(out.numpy().reshape(want.shape), want, rtol=1e-4, atol=1e-4)
