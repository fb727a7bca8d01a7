"""The CLANG device (kc-clang) with hand-written C kernels: compile, load, launch, compare with numpy."""
import subprocess, sys, textwrap
import numpy as np
import pytest
import kc
from kc import Buffer, dtypes
from kc.errors import CompileError, KcError
import kc_clang
from kc_clang.compiler import ClangCompiler

ADD = """
void add(float* restrict data0, const float* restrict data1, const float* restrict data2) {
  for (int i = 0; i < 1000; i++) data0[i] = data1[i] + data2[i];
}
"""

# a variable loop bound and a variable scale, as the renderer passes them: const int after the buffers
AXPY_N = """
void axpy_n(float* restrict data0, const float* restrict data1, const int n, const int k) {
  for (int i = 0; i < n; i++) data0[i] = data0[i] + (float)k * data1[i];
}
"""

if kc_clang.unavailable_reason() is not None:
  pytest.skip(f"CLANG cannot run here: {kc_clang.unavailable_reason()}", allow_module_level=True)


# every compile lands in a fresh cache directory (the cache_dir fixture of this folder's conftest.py)
pytestmark = pytest.mark.usefixtures("cache_dir")


@pytest.fixture
def clang():
  return kc.Device["CLANG"]


def buf(arr):
  return Buffer("CLANG", arr.size, dtypes.from_numpy(arr.dtype)).copyin(arr)


def test_clang_is_registered_through_its_entry_point():
  spec = kc.Device.spec("clang")
  assert "CLANG" in kc.Device.names() and "CLANG" in kc.Device.available()
  assert spec.distribution == "kc-clang" and spec.version == kc_clang.__version__ and spec.priority == kc_clang.PRIORITY
  assert "clang" not in kc.Device.errors()


def test_importing_kc_clang_does_not_import_cffi():
  code = "import sys, kc_clang; assert 'cffi' not in sys.modules, 'cffi imported'; print('ok')"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
  assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_add_kernel_matches_numpy(clang):
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
  out = Buffer("CLANG", 1000, dtypes.float32).allocate()
  prg = clang.runtime("add", clang.compiler.compile(ADD))
  # global/local sizes are part of the launch protocol; CLANG kernels loop, so they are ignored
  assert prg(out, buf(a), buf(b), global_size=(7, 1, 1), local_size=None) is None
  np.testing.assert_array_equal(out.numpy(), a + b)


def _mapped_kernel_files(name: str) -> list[str]:
  """The lines of /proc/self/maps that map a loaded library of kernel `name` (its file is removed once loaded)."""
  with open("/proc/self/maps") as f: return [line for line in f if f"/kc-{name}-" in line]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc/self/maps")
def test_a_dropped_program_unloads_its_library(clang):
  """A program's library is unmapped once the program is garbage: a process that loads kernels for hours keeps only
  the live ones mapped (each library maps 4 or 5 regions, and a process may have 65530)."""
  import gc
  lib = clang.compiler.compile(ADD)
  kept = clang.runtime("add", lib)
  for _ in range(50): clang.runtime("add", lib)  # each dropped at once
  gc.collect()
  mapped = {line.split()[-2] for line in _mapped_kernel_files("add")}
  assert len(mapped) == 1  # the kept program's file only
  out = Buffer("CLANG", 1000, dtypes.float32).allocate()
  a = np.arange(1000, dtype=np.float32)
  kept(out, buf(a), buf(a))
  np.testing.assert_array_equal(out.numpy(), a + a)
  del kept
  gc.collect()
  assert _mapped_kernel_files("add") == []


def test_variable_arguments_and_timing(clang):
  x, y = np.ones(64, np.float32), np.arange(64, dtype=np.float32)
  out, inp = buf(x), buf(y)
  prg = clang.runtime("axpy_n", clang.compiler.compile(AXPY_N))
  seconds = prg(out, inp, vals=(40, 3), wait=True)
  assert isinstance(seconds, float) and 0 < seconds < 10
  expect = x.copy()
  expect[:40] += 3 * y[:40]  # only the first n elements, scaled by k
  np.testing.assert_array_equal(out.numpy(), expect)
  prg(out._buf, inp._buf, vals=(np.int32(1), np.int64(-1)))  # raw allocator handles and numpy ints work too
  expect[:1] -= y[:1]
  np.testing.assert_array_equal(out.numpy(), expect)


def test_kernels_run_on_views(clang):
  base = buf(np.zeros(16, np.float32))
  prg = clang.runtime("axpy_n", clang.compiler.compile(AXPY_N))
  prg(base.view(4, dtypes.float32, offset=32), buf(np.arange(4, dtype=np.float32)), vals=(4, 2))
  expect = np.zeros(16, np.float32)
  expect[8:12] = 2 * np.arange(4)
  np.testing.assert_array_equal(base.numpy(), expect)


def test_launch_errors_are_typed(clang):
  prg = clang.runtime("axpy_n", clang.compiler.compile(AXPY_N))
  a, b = buf(np.zeros(4, np.float32)), buf(np.zeros(4, np.float32))
  with pytest.raises(KcError, match="outside int32"):
    prg(a, b, vals=(2**31, 1))
  with pytest.raises(KcError, match="int32"):
    prg(a, b, vals=(1.5, 1))
  with pytest.raises(KcError, match="not CLANG host memory"):
    prg(np.zeros(4, np.float32), b, vals=(1, 1))
  prg(a, b, vals=(4, 1))
  with pytest.raises(KcError, match="takes 2 buffers and 2 variable values, called with 2 and 1"):
    prg(a, b, vals=(4,))
  with pytest.raises(KcError, match="no function named 'nosuch'"):
    clang.runtime("nosuch", clang.compiler.compile(AXPY_N))


def test_bad_c_raises_compile_error_with_source_and_log(clang):
  bad = "void broken(float* data0) { data0[0] = undeclared_name; }"
  with pytest.raises(CompileError) as info:
    clang.compiler.compile(bad)
  err = info.value
  assert err.src == bad and "undeclared_name" in err.log and "error" in err.log
  assert "failed to compile" in str(err) and "undeclared_name" in str(err)


def test_compile_is_cached_on_disk(cache_dir, monkeypatch):
  calls = []
  comp = ClangCompiler("kc-clang test")
  real = comp.compile_uncached
  monkeypatch.setattr(comp, "compile_uncached", lambda src: calls.append(src) or real(src))
  lib = comp.compile(ADD)
  assert comp.compile(ADD) == lib and len(calls) == 1
  assert lib[:4] in (b"\x7fELF", b"\xcf\xfa\xed\xfe")  # a shared object (ELF, or Mach-O on macOS)
  from kc.runtime.cache import compile_cache
  assert compile_cache().keys() == [comp.cache_key(ADD)]


def test_native_code_by_default_portable_on_request(monkeypatch):
  from kc_clang.host import host_cpu
  for var in ("KC_CLANG_MARCH_NATIVE", "KC_CLANG_PORTABLE"): monkeypatch.delenv(var, raising=False)
  native = ClangCompiler()
  monkeypatch.setenv("KC_CLANG_PORTABLE", "1")
  portable = ClangCompiler()
  assert "-march=native" in native.flags and "-march=native" not in portable.flags
  assert native.cache_key(ADD) != portable.cache_key(ADD)
  # a native binary is keyed on the CPU: its model and ISA extensions; a portable one on the architecture only
  assert host_cpu().describe() in native.identity() and host_cpu().describe() not in portable.identity()
  assert host_cpu().machine in portable.identity()
  assert "-ffast-math" not in native.flags and "-O2" in native.flags and "-fopenmp" not in native.flags
  # KC_CLANG_MARCH_NATIVE, the older spelling: 1 is native (now the default), 0 portable
  monkeypatch.delenv("KC_CLANG_PORTABLE")
  monkeypatch.setenv("KC_CLANG_MARCH_NATIVE", "0")
  assert ClangCompiler().flags == portable.flags
  monkeypatch.setenv("KC_CLANG_MARCH_NATIVE", "1")
  assert ClangCompiler().flags == native.flags
  monkeypatch.setenv("KC_CC", "cc -DKC_TEST=1")
  assert ClangCompiler().cmd == ["cc", "-DKC_TEST=1"] and ClangCompiler().cache_key(ADD) != native.cache_key(ADD)


def test_missing_compiler_is_a_reason_and_a_compile_error(monkeypatch):
  monkeypatch.setenv("KC_CC", "kc-no-such-cc")
  assert "kc-no-such-cc" in kc_clang.unavailable_reason() and "KC_CC" in kc_clang.unavailable_reason()
  with pytest.raises(CompileError, match="not found"):
    ClangCompiler().compile_uncached(ADD)


COMPILE_IN_A_PROCESS = textwrap.dedent("""
  import hashlib, kc
  lib = kc.Device["CLANG"].compiler.compile(open(__import__("sys").argv[1]).read())
  print(hashlib.sha256(lib).hexdigest())
""")


def test_concurrent_processes_compile_the_same_source(tmp_path, cache_dir):
  src = tmp_path / "k.c"
  src.write_text(ADD + "\n// concurrent\n")
  procs = [subprocess.Popen([sys.executable, "-c", COMPILE_IN_A_PROCESS, str(src)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for _ in range(2)]
  results = [p.communicate(timeout=120) for p in procs]
  assert [p.returncode for p in procs] == [0, 0], results
  digests = {out.strip() for out, _ in results}
  assert len(digests) == 1
  from kc.runtime.cache import compile_cache
  assert len(compile_cache().keys()) == 1


def test_big_kernels_split_their_outer_loop_across_threads(monkeypatch):
  from kc import ast as A
  from kc_clang.renderer import SPLIT_MARKER, split_symbol
  n = 256
  F = lambda i, *s: A.arg(i, dtypes.float32, s)  # noqa: E731
  sink = A.sink(A.store(0, (F(1, n, n).reshape(n, n, 1) * F(2, n, n).reshape(1, n, n)).sum(1)))
  monkeypatch.setenv("KC_CLANG_THREADS", "2")
  k = kc.compile(sink, device="CLANG")
  src = k.program.src
  assert SPLIT_MARKER in src and "const int kc_part, const int kc_parts)" in src and split_symbol(k.name) in src
  assert "omp" not in src  # threads come from the runtime, not OpenMP
  a, b = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
  for parts in ("2", "3", "64", "100"):  # the number of parts is read at each call: more parts than rows leaves some empty
    monkeypatch.setenv("KC_CLANG_THREADS", parts)
    out = np.zeros((n, n), np.float32)
    k(out, a, b)
    np.testing.assert_allclose(out, a @ b, atol=1e-3)
  small = kc.compile(A.sink(A.store(0, F(1, 16) * 2.0)), device="CLANG")
  assert "kc_part" not in small.program.src  # too little work to start threads for
  monkeypatch.setenv("KC_CLANG_THREADS", "1")
  assert "kc_part" not in kc.compile(sink, device="CLANG").program.src


def test_a_split_loop_with_variable_bounds(monkeypatch):
  """The parts of a loop over a Variable's range are computed in C, so every value of the Variable splits exactly."""
  from kc import ast as A
  monkeypatch.setenv("KC_CLANG_THREADS", "3")
  v = kc.Variable("n", 1, 1 << 20)
  x = A.arg(1, dtypes.float32, (v, 512))
  k = kc.compile(A.sink(A.store(0, (x * 2.0 + 1.0).exp2())), device="CLANG")
  assert "kc_part" in k.program.src, "the loop over n should be split"
  for rows in (1, 2, 7, 600):
    inp = np.random.rand(rows, 512).astype(np.float32)
    out = np.zeros((rows, 512), np.float32)
    k(out, inp, n=rows)
    np.testing.assert_allclose(out, np.exp2(inp * 2 + 1), rtol=1e-6)


@pytest.mark.parametrize("value", ["0", "-3", "100000", "max+1"])
def test_thread_counts_out_of_range_are_config_errors(value, monkeypatch):
  """KC_CLANG_THREADS is 1 to max_threads() (4 per core, at least 256): each part is an OS thread the pool starts,
  so 100000 would start 100000 threads at the first call instead of being refused."""
  from kc_clang.renderer import max_threads, threads
  most = max_threads()
  assert most == max(256, 4 * (__import__("os").cpu_count() or 1))
  value = str(most + 1) if value == "max+1" else value
  monkeypatch.setenv("KC_CLANG_THREADS", value)
  with pytest.raises(kc.ConfigError, match=rf"KC_CLANG_THREADS={value} .* from 1 to {most} "):
    kc.compile(kc.ast.sink(kc.ast.store(0, kc.ast.arg(1, dtypes.float32, (1024, 1024)) * 2.0)), device="CLANG")
  monkeypatch.setenv("KC_CLANG_THREADS", str(most))
  assert threads() == most


def test_part_bounds_tile_the_range_exactly():
  """__kc_part_start in C: consecutive parts meet, the first starts at lo and the last ends at hi, for ranges
  that do not divide evenly, ranges shorter than the number of parts, and empty ones."""
  from kc_clang.renderer import PART_START
  src = PART_START + "\nvoid starts(long long* out, const int lo, const int hi, const int parts) {\n" \
        "  for (int p = 0; p <= parts; p++) out[p] = __kc_part_start(lo, hi, p, parts);\n}\n"
  prg = kc.Device["CLANG"].runtime("starts", ClangCompiler().compile(src))
  for lo, hi, parts in [(0, 1024, 3), (5, 12, 4), (0, 2, 8), (3, 3, 2), (0, 2**31 - 1, 7)]:
    out = Buffer("CLANG", parts + 1, dtypes.int64).allocate()
    prg(out, vals=(lo, hi, parts))
    got = out.numpy().tolist()
    assert got[0] == lo and got[-1] == hi and all(a <= b for a, b in zip(got, got[1:])), (lo, hi, parts, got)
    assert max(b - a for a, b in zip(got, got[1:])) - min(b - a for a, b in zip(got, got[1:])) <= 1


def test_host_vector_widths_and_arch(monkeypatch):
  from kc_clang.host import host_cpu
  from kc_clang.renderer import ClangRenderer
  cpu = host_cpu()
  native, portable = ClangRenderer(native=True), ClangRenderer(native=False)
  assert portable.vector_widths(dtypes.float32) == (4, 2) and portable.arch == cpu.machine
  lanes = cpu.vector_bytes // 4
  assert native.vector_widths(dtypes.float32)[0] == lanes and native.vector_widths(dtypes.float32)[-1] == 2
  assert native.vector_widths(dtypes.int32) == () and native.arch == f"{cpu.machine} {cpu.isa}".strip()
  monkeypatch.setenv("KC_CLANG_PORTABLE", "1")
  assert ClangRenderer().vector_widths(dtypes.float32) == (4, 2)


@pytest.mark.parametrize("width", [8, 16])
def test_wide_vector_accesses_at_any_offset(width):
  """float8/float16 loads and stores through a view at an element offset that is not a multiple of the width."""
  from kc import ast as A
  from kc import Opt, OptOps
  from kc_clang.renderer import ClangRenderer
  r = ClangRenderer(native=True)
  r.float_lanes = width  # the widest access, whatever this host's registers are: the compiler lowers it
  x = A.arg(1, dtypes.float32, (4 * width,))
  kern = kc.Kernel(A.sink(A.store(0, x * 3.0)), r)
  kern.apply_opt(Opt(OptOps.UPCAST, 0, width))
  prg = kern.to_program()
  assert f"float{width} " in prg.src
  dev = kc.Device["CLANG"]
  fn = dev.runtime(prg.name, dev.compiler.compile(prg.src))
  base_in, base_out = buf(np.arange(4 * width + 3, dtype=np.float32)), buf(np.zeros(4 * width + 3, np.float32))
  inp, out = base_in.view(4 * width, dtypes.float32, offset=12), base_out.view(4 * width, dtypes.float32, offset=4)
  fn(out, inp)
  np.testing.assert_array_equal(out.numpy(), 3 * np.arange(3, 4 * width + 3, dtype=np.float32))


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_both_c_compilers_build_split_kernels(cc, monkeypatch):
  """gcc and clang each build and run a kernel split across threads with nothing but the compiler installed."""
  import shutil
  from kc import ast as A
  if shutil.which(cc) is None: pytest.skip(f"{cc} is not installed")
  monkeypatch.setenv("KC_CLANG_THREADS", "2")
  x = A.arg(1, dtypes.float32, (1024, 1024))
  k = kc.compile(A.sink(A.store(0, (x * x).sum(1))), device="CLANG")
  assert "kc_part" in k.program.src
  dev = kc.Device["CLANG"]
  fn = dev.runtime(k.name, ClangCompiler(cmd=[cc]).compile(k.program.src))
  inp = np.random.rand(1024, 1024).astype(np.float32)
  out = Buffer("CLANG", 1024, dtypes.float32).allocate()
  fn(out, buf(inp))
  np.testing.assert_allclose(out.numpy(), (inp * inp).sum(1), rtol=1e-4)


def test_compile_errors_show_the_source_around_the_error():
  from kc_clang.compiler import ClangCompiler
  bad = "void f(float* a) {\n  int x = 1;\n  a[0] = y;\n  return;\n}"
  with pytest.raises(kc.CompileError) as e: ClangCompiler().compile_uncached(bad)
  assert ">   3 |   a[0] = y;" in str(e.value) and "2 |   int x = 1;" in str(e.value) and e.value.src == bad and "y" in e.value.log


def test_host_cpu_facts_from_cpuinfo():
  from kc_clang.host import HostCPU, _cpuinfo_fields
  x86 = "processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse sse2 avx avx2 fma\n\nprocessor\t: 1\nmodel name\t: other\n"
  assert _cpuinfo_fields(x86) == {"processor": "0", "model name": "Some CPU", "flags": "fpu sse sse2 avx avx2 fma"}
  assert HostCPU("x86_64", "Some CPU", ("avx", "avx2", "fma")).isa == "avx2" and HostCPU("x86_64", "", ("avx2",)).vector_bytes == 32
  assert HostCPU("x86_64", "", ("avx2", "avx512f")).vector_bytes == 64 and HostCPU("x86_64", "", ()).isa == "sse2"
  assert HostCPU("aarch64", "", ("asimd",)).isa == "neon" and HostCPU("aarch64", "", ()).vector_bytes == 16
  assert HostCPU("riscv64", "", ()).isa == "" and HostCPU("riscv64", "", ()).vector_bytes == 16
  a, b = HostCPU("x86_64", "A", ("avx2",)), HostCPU("x86_64", "A", ("avx2", "avx512f"))
  assert a.describe() != b.describe()  # the same model with other extensions is another cache key


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork here")
def test_split_kernels_run_in_a_forked_child(monkeypatch):
  """A child forked after the pool started has none of its threads: it makes its own pool instead of waiting forever."""
  import os
  from kc import ast as A
  monkeypatch.setenv("KC_CLANG_THREADS", "2")
  x = A.arg(1, dtypes.float32, (512, 512))
  k = kc.compile(A.sink(A.store(0, x * 2.0)), device="CLANG")
  inp, out = np.ones((512, 512), np.float32), np.zeros((512, 512), np.float32)
  k(out, inp)  # the parent's pool exists now
  pid = os.fork()
  if pid == 0:
    try:
      out[:] = 0
      k(out, inp)
      os._exit(0 if (out == 2).all() else 1)
    finally: os._exit(2)
  _, status = os.waitpid(pid, 0)
  assert os.WEXITSTATUS(status) == 0
