"""The LLVM device (kc-llvm): its IR (target, no fast-math, kc's integer answers), the in-process compiler and its
cache key, the loader, and the thread split shared with CLANG."""
import os
import numpy as np
import pytest
import kc
from kc import dtypes
from kc import ast as A
from kc.errors import CompileError
import kc_llvm
from kc_llvm.compiler import LLVMCompiler, llvm_version
from kc_llvm.renderer import LLVMRenderer, split_symbol
from kc_llvm.target import chosen_target

pytestmark = pytest.mark.usefixtures("cache_dir")
F = lambda i, *s: A.arg(i, dtypes.float32, s)  # noqa: E731


def test_llvm_is_registered_through_its_entry_point():
  assert kc.Device["LLVM"].renderer.device == "LLVM"
  assert kc_llvm.unavailable_reason() is None


def test_ir_names_the_host_target_and_keeps_ieee_semantics():
  k = kc.compile(A.sink(A.store(0, (F(1, 1024) * F(2, 1024) + F(1, 1024)).exp2())), "LLVM", "hand")
  src, t = k.program.src, chosen_target()
  assert f'target triple = "{t.triple}"' in src and "target datalayout" in src
  # no fast-math flags (they change NaN, inf and rounding), no fused multiply-add: a*b+c rounds twice, as numpy's does
  assert not any(flag in src for flag in (" fast ", " contract ", " nnan ", " ninf ", " reassoc ", " afn ", "fma"))
  a, b = np.random.default_rng(0).standard_normal((2, 1024)).astype(np.float32)
  out = np.empty(1024, np.float32)
  k(out, a, b)
  np.testing.assert_allclose(out, np.exp2(a * b + a), rtol=2e-6)


def test_no_fused_multiply_add_in_the_machine_code():
  """a*b+c stays a multiply and an add on a CPU with FMA: numpy rounds twice."""
  src = kc.compile(A.sink(A.store(0, F(1, 1024) * F(2, 1024) + F(3, 1024))), "LLVM", "hand").program.src
  asm = LLVMCompiler().assembly(src).lower()
  assert "fma" not in asm and "mul" in asm and "add" in asm


@pytest.mark.parametrize("N", [1, 64])
def test_a_sum_of_products_accumulates_with_llvm_fma_and_rounds_each_product_once(N):
  """(1 + 2^-12)^2 rounded alone is 1 + 2^-11: added to -(1 + 2^-11) it gives 0 with two roundings and 2^-24 with one
  (kc.codegen.fma). A dot product of [1, 1+2^-12, 0, ...] and [-(1+2^-11), 1+2^-12, 0, ...] per output lane, scalar
  (N=1, no opts) and in the hand-coded vector tile."""
  if not chosen_target().has_fma: pytest.skip("this CPU has no FMA instructions: llvm.fma would be a library call")
  M, K = (1, 2) if N == 1 else (16, 64)
  a = np.zeros((M, K), np.float32); a[:, :2] = [1.0, 1 + 2.0 ** -12]
  b = np.zeros((K, N), np.float32); b[:2] = np.array([[-(1 + 2.0 ** -11)], [1 + 2.0 ** -12]], np.float32)
  k = kc.compile(A.sink(A.store(0, F(1, M, K) @ F(2, K, N))), "LLVM", "none" if N == 1 else "hand")
  assert "@llvm.fma." in k.program.src
  out = np.empty((M, N), np.float32)
  k(out, a, b)
  assert np.all(out == np.float32(2.0 ** -24)), out


def test_portable_and_sse2_code_fuses_nothing():
  import platform
  if platform.machine().lower() not in ("x86_64", "amd64"): pytest.skip("x86-64 only: every 64-bit ARM has FMA")
  assert not LLVMRenderer(chosen_target(portable=True)).fuses_accumulation
  assert not LLVMRenderer(chosen_target(isa="sse2")).fuses_accumulation


def test_vectors_are_as_wide_as_the_target_registers():
  r = LLVMRenderer()
  lanes = chosen_target().vector_bytes // 4
  assert r.vector_widths(dtypes.float32)[0] == lanes and r.vector_widths(dtypes.float32)[-1] == 2
  assert r.vector_widths(dtypes.int32) == () and r.vector_widths(dtypes.float16) == ()
  portable = LLVMRenderer(chosen_target(portable=True))
  assert portable.vector_widths(dtypes.float32) == (4, 2)


@pytest.mark.parametrize("npdt", [np.int8, np.int32, np.int64, np.uint32])
def test_integer_division_by_zero_and_min_by_minus_one(npdt):
  """numpy's answers where LLVM's division is undefined: x // 0 == x % 0 == 0, MIN // -1 wraps to MIN, MIN % -1 == 0."""
  dt = dtypes.from_numpy(np.dtype(npdt))
  lo = np.iinfo(npdt).min
  a = np.array([7, -7, lo, lo, 5, 0, 9], npdt) if lo < 0 else np.array([7, 0, 9, 4000000000], npdt)
  b = np.array([0, 0, -1, 0, -1, 0, 2], npdt) if lo < 0 else np.array([0, 0, 2, 3], npdt)
  x, y = A.arg(1, dt, (a.size,)), A.arg(2, dt, (a.size,))
  out = kc.run(A.sink(A.store(0, x // y), A.store(3, x % y)), {1: a, 2: b}, "LLVM", "none")
  q, r = out[0], out[3]
  with np.errstate(divide="ignore", over="ignore"): want_q, want_r = a // b, a % b
  assert np.array_equal(q, want_q) and np.array_equal(r, want_r)


def test_bad_ir_is_a_compile_error_with_the_source():
  with pytest.raises(CompileError, match="LLVM rejected the kernel's IR") as e:
    LLVMCompiler().compile("define void @k() { ret i32 0 }")
  assert e.value.src is not None


def test_the_object_is_cached_on_disk_keyed_by_llvm_and_the_target(cache_dir, monkeypatch):
  src = kc.compile(A.sink(A.store(0, F(1, 64) + 1.0)), "LLVM", "none").program.src
  c = LLVMCompiler()
  ident = c.identity()
  assert llvm_version() in ident and chosen_target().cpu in ident and "O2" in ident
  obj = c.compile(src)
  assert obj[:4] in (b"\x7fELF", b"\xcf\xfa\xed\xfe", b"\x64\x86\x00\x00") or len(obj) > 0
  monkeypatch.setattr(LLVMCompiler, "compile_uncached", lambda self, s: pytest.fail("compiled again despite the cache"))
  assert LLVMCompiler().compile(src) == obj  # a new compiler object, the same key: from the cache
  assert LLVMCompiler(opt=3).cache_key(src) != c.cache_key(src)
  assert LLVMCompiler(target=chosen_target(portable=True)).cache_key(src) != c.cache_key(src)


def test_memory_is_shared_with_numpy():
  """HostMemory: a kc.Buffer's numpy view is the memory the kernel writes (no copy)."""
  buf = kc.Buffer("LLVM", 256, dtypes.float32).copyin(np.arange(256, dtype=np.float32))
  out = kc.Buffer("LLVM", 256, dtypes.float32).allocate()
  k = kc.compile(A.sink(A.store(0, F(1, 256) * 2.0)), "LLVM", "hand")
  k(out, buf)
  assert np.array_equal(out.numpy(), np.arange(256, dtype=np.float32) * 2)


def test_big_kernels_split_their_outer_loop_across_threads(monkeypatch):
  n = 256
  sink = A.sink(A.store(0, (F(1, n, n).reshape(n, n, 1) * F(2, n, n).reshape(1, n, n)).sum(1)))
  monkeypatch.setenv("KC_LLVM_THREADS", "2")
  k = kc.compile(sink, device="LLVM")
  assert f"@{split_symbol(k.name)} = constant i32 1" in k.program.src and "i32 %kc_part, i32 %kc_parts)" in k.program.src
  a, b = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
  for parts in ("2", "3", "64", "256"):  # read at each call: more parts than rows leaves some empty
    monkeypatch.setenv("KC_LLVM_THREADS", parts)
    out = np.zeros((n, n), np.float32)
    k(out, a, b)
    np.testing.assert_allclose(out, a @ b, atol=1e-3)
  small = kc.compile(A.sink(A.store(0, F(1, 16) * 2.0)), device="LLVM")
  assert "kc_part" not in small.program.src.split("define void")[1]  # too little work to start threads for
  monkeypatch.setenv("KC_LLVM_THREADS", "1")
  assert "%kc_part" not in kc.compile(sink, device="LLVM").program.src


def test_a_split_kernel_runs_whole_on_the_caller_where_its_own_calls_say_so(monkeypatch):
  # kc.backend.SplitChoice, as on CLANG: both ways give numpy's result; decided whole, the parts are one call
  from kc.backend import SplitChoice
  from kc_llvm import runtime
  n = 256
  monkeypatch.setenv("KC_LLVM_THREADS", "2")
  k = kc.compile(A.sink(A.store(0, (F(1, n, n).reshape(n, n, 1) * F(2, n, n).reshape(1, n, n)).sum(1))), device="LLVM")
  choice = k._handle._choice
  assert choice is not None
  a, b = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
  for _ in range(SplitChoice.WARM_UP + len(SplitChoice.ORDER)):
    out = np.zeros((n, n), np.float32)
    k(out, a, b)
    np.testing.assert_allclose(out, a @ b, atol=1e-3)
  assert choice.decided is not None
  parts = []
  real = runtime.run_parts
  monkeypatch.setattr(runtime, "run_parts", lambda fn, args, p: parts.append(p) or real(fn, args, p))
  for decided in (False, True):
    choice.decided = decided
    out = np.zeros((n, n), np.float32)
    k(out, a, b)
    np.testing.assert_allclose(out, a @ b, atol=1e-3)
  assert parts == [1, 2]


def test_a_split_loop_with_variable_bounds(monkeypatch):
  monkeypatch.setenv("KC_LLVM_THREADS", "3")
  v = kc.Variable("n", 1, 1 << 20)
  k = kc.compile(A.sink(A.store(0, (A.arg(1, dtypes.float32, (v, 512)) * 2.0 + 1.0).exp2())), device="LLVM")
  assert "%kc_part" in k.program.src
  for rows in (1, 2, 7, 600):
    inp = np.random.rand(rows, 512).astype(np.float32)
    out = np.zeros((rows, 512), np.float32)
    k(out, inp, n=rows)
    np.testing.assert_allclose(out, np.exp2(inp * 2 + 1), rtol=1e-6)


@pytest.mark.parametrize("value", ["0", "100000"])
def test_thread_counts_out_of_range_are_config_errors(value, monkeypatch):
  monkeypatch.setenv("KC_LLVM_THREADS", value)
  with pytest.raises(kc.ConfigError, match=rf"KC_LLVM_THREADS={value} .* from 1 to "):
    kc.compile(A.sink(A.store(0, F(1, 1024, 1024) * 2.0)), device="LLVM")


@pytest.mark.parametrize("isa", ["avx9", "sse2"])
def test_isa_levels(isa, monkeypatch):
  """KC_LLVM_ISA names an x86-64 level (its vectors' width); an unknown one is a ConfigError."""
  import platform
  if platform.machine().lower() not in ("x86_64", "amd64"): pytest.skip("ISA levels are x86-64 only")
  if isa == "avx9":
    with pytest.raises(kc.ConfigError, match="not an ISA level"): chosen_target(isa=isa)
    return
  t = chosen_target(isa=isa)
  assert t.cpu == "x86-64" and LLVMRenderer(t).vector_widths(dtypes.float32) == (4, 2)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_kernels_load_and_split_in_a_forked_child(monkeypatch):
  """A forked child makes its own JIT and its own kernel threads instead of using the parent's."""
  monkeypatch.setenv("KC_LLVM_THREADS", "2")
  k = kc.compile(A.sink(A.store(0, F(1, 512, 512) * 2.0)), device="LLVM")
  inp, out = np.ones((512, 512), np.float32), np.zeros((512, 512), np.float32)
  k(out, inp)
  pid = os.fork()
  if pid == 0:
    try:
      fresh = kc.compile(A.sink(A.store(0, F(1, 512, 512) * 3.0)), device="LLVM")
      out[:] = 0
      k(out, inp)
      ok = (out == 2).all()
      fresh(out, inp)
      os._exit(0 if ok and (out == 3).all() else 1)
    finally: os._exit(2)
  _, status = os.waitpid(pid, 0)
  assert os.WEXITSTATUS(status) == 0


def test_exp2_of_float_vectors_is_one_call_for_all_lanes_within_2_ulp():
  """EXP2 of a float vector is vector_exp2's polynomial (not a C library call per lane): within 2 ulp of the exact
  result over the whole range, subnormals, overflow to inf, underflow to 0 and NaN included."""
  x = np.concatenate([np.linspace(-160, 140, 200001, dtype=np.float32),
                      np.array([np.nan, np.inf, -np.inf, 0, -0.0, 127.99, -149.5, -126.5, 1e-30], np.float32)])
  x = np.pad(x, (0, (-x.size) % 64))
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (x.size,)).exp2()))
  k = kc.compile(sink, "LLVM", "hand")
  assert "call <" in k.program.src and "@kc.exp2.v" in k.program.src and "@llvm.exp2" not in k.program.src
  out = np.empty_like(x)
  k(out, x)
  with np.errstate(over="ignore"): want = np.exp2(x.astype(np.float64)).astype(np.float32)
  assert np.array_equal(np.isnan(out), np.isnan(want))
  special = ~np.isfinite(want) | (want == 0)
  assert np.array_equal(out[special & ~np.isnan(want)], want[special & ~np.isnan(want)])
  ulp = np.abs(out[~special].view(np.int32).astype(np.int64) - want[~special].view(np.int32).astype(np.int64))
  assert ulp.max() <= 2


def test_threads_compile_and_load_kernels_at_once():
  """LLVM's state is used by one thread at a time (kc_llvm.target.LOCK): kernels compiled and loaded from several
  Python threads at once all build and give their results."""
  from concurrent.futures import ThreadPoolExecutor
  def build_and_run(i: int) -> bool:
    k = kc.compile(A.sink(A.store(0, F(1, 512) * float(i + 2) + float(i))), device="LLVM")
    x, out = np.arange(512, dtype=np.float32), np.empty(512, np.float32)
    k(out, x)
    return bool(np.array_equal(out, x * np.float32(i + 2) + np.float32(i)))
  with ThreadPoolExecutor(4) as pool: assert all(pool.map(build_and_run, range(16)))
