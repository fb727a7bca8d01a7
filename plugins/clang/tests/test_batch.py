"""Batched builds (kc_clang.batch): many kernels from one C compiler run, each member's library behaving exactly as
the library of its own compile, with both C compilers; members that share a kernel name or a helper's name; split
kernels; and sources a batch cannot hold failing the batch so that compile_many builds them one by one."""
import ctypes, shutil
import numpy as np
import pytest
import kc
from kc import CompileError, dtypes
from kc.api import CompiledKernel
from kc import ast as A
import kc_clang
from kc_clang import batch
from kc_clang.compiler import ClangCompiler
from kc_clang.runtime import ClangProgram, _symbol_address

if kc_clang.unavailable_reason() is not None or not batch.batching_supported():
  pytest.skip("CLANG batches need a C compiler and the GNU linker's options (Linux)", allow_module_level=True)

pytestmark = pytest.mark.usefixtures("cache_dir")

# kernels over one shape: several share the name E_... (same loop nest, other bodies), two share the exp2 helper,
# one is large enough to be split across threads, one has the bfloat16 helpers
EXPRS = {
  "double": (lambda x: x * 2, (64, 64), dtypes.float32),
  "exp": (lambda x: (x * 2).exp(), (64, 64), dtypes.float32),
  "exp_plus": (lambda x: (x + 1).exp(), (64, 64), dtypes.float32),
  "rowsum": (lambda x: x.sum(axis=1), (64, 64), dtypes.float32),
  "big": (lambda x: (x * x).sum(axis=1), (4096, 256), dtypes.float32),
  "bf16": (lambda x: x * 3, (16, 16), dtypes.bfloat16),
}
NP_IN = {dtypes.float32: np.float32, dtypes.bfloat16: np.uint16}


def compilers() -> list[ClangCompiler]:
  found = [ClangCompiler(cmd=[cc]) for cc in ("gcc", "clang") if shutil.which(cc)]
  return found or [ClangCompiler()]


@pytest.fixture(scope="module")
def programs():
  out = {}
  for name, (fn, shape, dt) in EXPRS.items():
    out[name] = kc.compile(A.sink(A.store(0, fn(A.arg(1, dt, shape)))), device="CLANG", opts="hand")
  return out


def run_library(ck: CompiledKernel, lib: bytes, x: np.ndarray) -> np.ndarray:
  """Kernel `ck` loaded from the library `lib` and run on x: its output."""
  swapped = CompiledKernel(ck.ast, ck.kernel, ck.program, "CLANG", ClangProgram(ck.program.name, lib))
  out = np.full(ck.specs[0].shape, 0x7FC0 if x.dtype == np.uint16 else np.nan, x.dtype)
  swapped(out, x)
  return out


def inputs(name: str) -> np.ndarray:
  _, shape, dt = EXPRS[name]
  x = np.random.default_rng(0).uniform(-2, 2, shape).astype(np.float32)
  return (x.view(np.uint32) >> 16).astype(np.uint16) if dt == dtypes.bfloat16 else x


@pytest.mark.parametrize("compiler", compilers(), ids=lambda c: c.cmd[0])
def test_every_member_runs_as_its_own_build_does(programs, compiler):
  names = list(EXPRS)
  libs = compiler.compile_batch_uncached([programs[n].program.src for n in names])
  assert len(libs) == len(names)
  assert len({programs[n].program.name for n in names}) < len(names)  # the batch holds kernels of one name
  for name, lib in zip(names, libs):
    ck, x = programs[name], inputs(name)
    want = run_library(ck, compiler.compile_uncached(ck.program.src), x)
    got = run_library(ck, lib, x)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=name)  # bit for bit
    assert not np.isnan(got.astype(np.float32)).any() or x.dtype == np.uint16
  assert ClangProgram(programs["big"].program.name, libs[names.index("big")]).split  # the split symbol is exported


@pytest.mark.parametrize("compiler", compilers(), ids=lambda c: c.cmd[0])
def test_a_member_library_exports_only_its_own_names(programs, compiler, tmp_path):
  names = ("double", "exp", "big")
  libs = compiler.compile_batch_uncached([programs[n].program.src for n in names])
  for name, lib in zip(names, libs):
    path = tmp_path / f"{name}.so"
    path.write_bytes(lib)
    loaded = ctypes.CDLL(str(path))
    assert _symbol_address(loaded, programs[name].program.name) is not None
    # the batch's own names (kcb<i>_...) stay local to each library
    assert all(_symbol_address(loaded, f"kcb{j}_{programs[n].program.name}") is None for j, n in enumerate(names))


def test_members_are_renamed_apart():
  src = "#include <math.h>\nstatic inline float h(float x) { return x; }\nvoid k(float* d) { d[0] = h(1.0f); }\nconst int kc_parts_k = 1;\n"
  m = batch.member(3, src)
  assert m.exported == {"k": "kcb3_k", "kc_parts_k": "kcb3_kc_parts_k"}
  assert "#define h kcb3_h\n" in m.text and m.text.rstrip().endswith("#undef kc_parts_k")


@pytest.mark.parametrize("src", ["#define X 1\nvoid k(float* d) { d[0] = X; }\n", "static inline float h(float x) { return x; }\n"])
def test_a_source_a_batch_cannot_hold_fails_the_batch(src):
  with pytest.raises(CompileError): batch.member(0, src)


def test_compile_many_builds_a_bad_batch_one_by_one(programs):
  c = kc.Device["CLANG"].compiler
  good = [programs[n].program.src for n in ("double", "exp")]
  got = c.compile_many([good[0], "void broken(float* d) { d[0] = undefined_name; }\n", good[1]])
  assert isinstance(got[1], CompileError) and "undefined_name" in (got[1].log + str(got[1]))
  for src, lib, name in ((good[0], got[0], "double"), (good[1], got[2], "exp")):
    x = inputs(name)
    np.testing.assert_array_equal(run_library(programs[name], lib, x), run_library(programs[name], c.compile(src), x))
