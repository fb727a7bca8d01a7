"""Batched builds (kc_clang.batch): many kernels from one C compiler run, each member's library behaving exactly as
the library of its own compile, with both C compilers; members that share a kernel name or a helper's name; split
kernels; and sources a batch cannot hold failing the batch so that compile_many builds them one by one."""
import ctypes, os, re, shutil, subprocess
import numpy as np
import pytest
import kc
from kc import CompileError, dtypes
from kc.api import CompiledKernel
from kc import ast as A
import kc_clang
from kc_clang import batch
from kc_clang.compiler import ClangCompiler, compile_flags, has_float16
from kc.backend import SharedLibrary, batch_member
from kc_clang.runtime import ClangProgram

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
    loaded = SharedLibrary(lib, name)
    assert loaded.address(programs[name].program.name) is not None
    # the batch's own names (kcb<i>_...) stay local to each library
    assert all(loaded.address(f"kcb{j}_{programs[n].program.name}") is None for j, n in enumerate(names))


def test_members_are_renamed_apart():
  src = "#include <math.h>\nstatic inline float h(float x) { return x; }\nvoid k(float* d) { d[0] = h(1.0f); }\nconst int kc_parts_k = 1;\n"
  m = batch_member(3, src)
  assert m.exported == {"k": "kcb3_k", "kc_parts_k": "kcb3_kc_parts_k"}
  assert "#define h kcb3_h\n" in m.text and m.text.rstrip().endswith("#undef kc_parts_k")


@pytest.mark.parametrize("src", ["#define X 1\nvoid k(float* d) { d[0] = X; }\n", "static inline float h(float x) { return x; }\n"])
def test_a_source_a_batch_cannot_hold_fails_the_batch(src):
  with pytest.raises(CompileError): batch_member(0, src)


def test_compile_many_builds_a_bad_batch_one_by_one(programs):
  c = kc.Device["CLANG"].compiler
  good = [programs[n].program.src for n in ("double", "exp")]
  got = c.compile_many([good[0], "void broken(float* d) { d[0] = undefined_name; }\n", good[1]])
  assert isinstance(got[1], CompileError) and "undefined_name" in (got[1].log + str(got[1]))
  for src, lib, name in ((good[0], got[0], "double"), (good[1], got[2], "exp")):
    x = inputs(name)
    np.testing.assert_array_equal(run_library(programs[name], lib, x), run_library(programs[name], c.compile(src), x))


# ---------------------------------------------------------------------------------------------------------- lean links

# calls into libm (expf), libgcc (half conversions without F16C, 128-bit division) and libc (memcpy of a variable size)
RUNTIME_CALLS = """#include <math.h>
#include <string.h>
static inline float twice(float x) { return x * 2.0f; }
void k(float* restrict out, float* restrict copy, long long* restrict quot, const float* restrict x, const int n) {
  for (int i = 0; i < n; i++) {
    HALF_LINE
    out[i] = expf(twice(h));
    quot[i] = (long long)(((__int128)(i + 1) << 60) / (__int128)(3 * i + 7));
  }
  memcpy(copy, x, (unsigned long)n * sizeof(float));
}
"""


def runtime_calls_source(compiler: ClangCompiler) -> str:
  half = "float h = (float)(_Float16)x[i];" if has_float16(tuple(compiler.cmd), tuple(compiler.flags)) else "float h = x[i];"
  return RUNTIME_CALLS.replace("HALF_LINE", half)


def baseline_compilers() -> list[ClangCompiler]:
  """Each C compiler at the baseline x86-64 level (no F16C: half converts through libgcc) and at the machine's."""
  return [ClangCompiler(cmd=c.cmd, flags=compile_flags(cmd=c.cmd, native=native)) for c in compilers() for native in (False, True)]


def call_runtime_calls(path: str, n: int = 100) -> tuple[np.ndarray, ...]:
  lib = ctypes.CDLL(path, mode=os.RTLD_NOW)  # every undefined symbol resolved now, or the load fails
  x = np.random.default_rng(1).uniform(-3, 3, n).astype(np.float32)
  out, copy, quot = np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(n, np.int64)
  ptr = ctypes.c_void_p
  lib.k.argtypes = [ptr, ptr, ptr, ptr, ctypes.c_int]
  lib.k(*(ptr(a.ctypes.data) for a in (out, copy, quot, x)), n)
  return x, out, copy, quot


@pytest.mark.parametrize("compiler", baseline_compilers(), ids=lambda c: f"{c.cmd[0]}{'-native' if '-march=native' in c.flags else ''}")
def test_a_lean_linked_member_calls_libm_libgcc_and_libc(compiler, tmp_path):
  lean = batch.lean_link(tuple(compiler.cmd), tuple(compiler.flags))
  assert lean is not None  # gcc and clang on Linux: the linker itself
  assert not any(a.endswith(".o") or a.startswith("-plugin") or a == "-lc" for a in lean.argv + lean.libraries)
  other = "static inline float twice(float x) { return x; }\nvoid j(float* restrict d) { d[0] = twice(1.0f); }\n"
  libs = compiler.compile_batch_uncached([other, runtime_calls_source(compiler)])
  paths = []
  for i, lib in enumerate((libs[1], compiler.compile_uncached(runtime_calls_source(compiler)))):
    paths.append(str(tmp_path / f"m{i}.so"))
    with open(paths[-1], "wb") as f: f.write(lib)
  x, out, copy, quot = call_runtime_calls(paths[0])
  h = x.astype(np.float16).astype(np.float32) if has_float16(tuple(compiler.cmd), tuple(compiler.flags)) else x
  np.testing.assert_allclose(out, np.exp(h.astype(np.float64) * 2), rtol=2e-6)
  np.testing.assert_array_equal(copy, x)
  assert quot.tolist() == [((i + 1) << 60) // (3 * i + 7) for i in range(len(x))]
  for got, want in zip(call_runtime_calls(paths[0]), call_runtime_calls(paths[1])):  # bit for bit the library of its own compile
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.skipif(shutil.which("readelf") is None, reason="no readelf here")
@pytest.mark.parametrize("compiler", compilers(), ids=lambda c: c.cmd[0])
def test_a_lean_linked_member_needs_only_libm_and_resolves_in_the_process(compiler, tmp_path):
  flags = compile_flags(cmd=compiler.cmd, native=False)
  compiler = ClangCompiler(cmd=compiler.cmd, flags=flags)
  lib = compiler.compile_batch_uncached(["void j(float* restrict d) { d[0] = 1.0f; }\n", runtime_calls_source(compiler)])[1]
  path = tmp_path / "member.so"
  path.write_bytes(lib)
  dynamic = subprocess.run(["readelf", "--dynamic", "--dyn-syms", "--wide", str(path)], capture_output=True, text=True, check=True).stdout
  needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic))
  assert needed == {"libm.so.6"}  # no libgcc_s: what libgcc has is linked in; libc is the process's own
  undefined = {m.split("@")[0] for m in re.findall(r"^\s*\d+: 0+\s+\d+\s+\w+\s+GLOBAL\s+\w+\s+UND\s+(\S+)", dynamic, re.MULTILINE)}
  assert "expf" in undefined and not any(name.startswith("__") for name in undefined)  # libgcc's helpers are inside
  process, libm = ctypes.CDLL(None), ctypes.CDLL("libm.so.6")
  for name in undefined: assert hasattr(process, name) or hasattr(libm, name), name
  assert ClangProgram("k", lib) is not None  # loads as the runtime loads it
