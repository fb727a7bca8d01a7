"""The CUDA renderer and NVRTC compiler with no GPU: CUDA C for each arch compiles to cubin, tensor-core kernels
included; errors are typed and say where; limits are the Kernel's to refuse, never a launch's."""
import re, subprocess, sys
import pytest
import kc
from kc import KernelOptError, Opt, OptOps, dtypes
from kc import ast as A
from kc.backend import CompileError, ConfigError, Ops
from kc.kernel import Kernel
from kc_cuda.arch import parse_arch
from kc_cuda.compiler import NVRTCCompiler, nvrtc_major, pack_library, unpack_library
from kc_cuda.renderer import DYNAMIC_SHARED_MARKER, STATIC_SHARED_MAX, CUDARenderer

ARCHS = ("sm_80", "sm_89", "sm_90")


def matmul(dt_in, dt_acc, M=32, K=64, N=16):
  x, y = A.arg(1, dt_in, (M, K)).reshape(M, K, 1), A.arg(2, dt_in, (K, N)).reshape(1, K, N)
  prod = x * y if dt_in == dt_acc else x.cast(dt_acc) * y.cast(dt_acc)
  return A.sink(A.store(0, prod.sum(1)))


def tc_pairs(arch):
  return [(m.tc.dtype_in, m.tc.dtype_out) for m in CUDARenderer(arch).mmas]


@pytest.mark.parametrize("arch", ARCHS)
def test_tensor_core_kernels_compile_to_cubin(arch):
  r, c = CUDARenderer(arch), NVRTCCompiler(arch)
  assert len(tc_pairs(arch)) == (6 if arch != "sm_80" else 4)
  for dt_in, dt_acc in tc_pairs(arch):
    k = Kernel(matmul(dt_in, dt_acc), r)
    assert k.apply_tensor_cores(1, tc_opt=2), (dt_in, dt_acc)
    prg = k.to_program()
    assert "mma.sync.aligned" in prg.src
    # the tensor core of the kernel's own dtypes, not the tf32 one that also takes widened inputs
    assert {u.arg.dtype_in for u in prg.uops if u.op is Ops.WMMA} == {dt_in}
    meta, cubin = unpack_library(c.compile(prg.src))
    assert meta == {"arch": arch, "cuda": nvrtc_major(), "dynamic_shared": 0}
    assert cubin[:4] == b"\x7fELF"  # cubin is an ELF image, not PTX text


def test_plain_kernels_compile():
  r, c = CUDARenderer("sm_90"), NVRTCCompiler("sm_90")
  x = A.arg(1, dtypes.float16, (64, 8))
  sinks = [A.sink(A.store(0, (x.cast(dtypes.float32).exp2() + 1.0).sqrt().sum(1))),
           A.sink(A.store(0, (x * x - x).max(1))),
           A.sink(A.store(0, A.arg(1, dtypes.int64, (16,)) // A.arg(2, dtypes.int64, (16,))))]
  for sink in sinks:
    for hand in (False, True):
      k = Kernel(sink, r)
      if hand: k.hand_coded_optimizations()
      assert c.compile(k.to_program().src).startswith(b"KCCUDA1")


def test_vectors_and_launch_bounds():
  r = CUDARenderer("sm_90")
  k = Kernel(A.sink(A.store(0, A.arg(1, dtypes.float16, (64, 64)) * 2.0)), r)
  k.apply_opt(Opt(OptOps.LOCAL, 0, 16))
  k.apply_opt(Opt(OptOps.UPCAST, 1, 8))
  prg = k.to_program()
  src = prg.src
  assert f"__launch_bounds__({prg.local_size[0] * prg.local_size[1] * prg.local_size[2]})" in src
  assert "struct __align__(16) kc_half8" in src and "make_kc_half8(" in src
  NVRTCCompiler("sm_90").compile(src)


def test_compile_error_carries_log_and_source_lines():
  src = 'extern "C" __global__ void broken(float* data0) {\n  int x = 1;\n  data0[0] = undefined_name;\n}\n'
  with pytest.raises(CompileError) as e:
    NVRTCCompiler("sm_90").compile_uncached(src)
  assert "undefined_name" in str(e.value) and "sm_90" in str(e.value)
  assert re.search(r">\s+3 \|   data0\[0\] = undefined_name;", e.value.log)  # the failing line, marked, with its neighbours


def test_cache_key_holds_arch_and_nvrtc():
  a, b = NVRTCCompiler("sm_80"), NVRTCCompiler("sm_90")
  assert a.cache_key("x") != b.cache_key("x")
  assert "nvrtc" in a.identity() and "sm_80" in a.identity()


def test_arch_parsing():
  assert parse_arch("sm_89") == parse_arch("89") == parse_arch("8.9") == "sm_89"
  assert parse_arch("sm_100") == "sm_100"
  for bad in ("sm89x", "ampere", "sm_3", ""):
    with pytest.raises(ConfigError, match="KC_CUDA_ARCH"): parse_arch(bad)
  with pytest.raises(CompileError, match="supports"): NVRTCCompiler("sm_99")


def test_library_round_trip_and_garbage():
  assert unpack_library(pack_library({"dynamic_shared": 7}, b"\x7fELFxyz")) == ({"dynamic_shared": 7}, b"\x7fELFxyz")
  with pytest.raises(CompileError, match="KC_CACHE_DIR"): unpack_library(b"\x7fELF not a library")


def test_limits_are_refused_by_the_kernel():
  r = CUDARenderer("sm_90")
  k = Kernel(A.sink(A.store(0, A.arg(1, dtypes.float32, (2048, 4)) + 1.0)), r)
  with pytest.raises(KernelOptError, match="1024|local"): k.apply_opt(Opt(OptOps.LOCAL, 0, 2048))
  # a grouped reduce (1024 threads) whose local buffer is 64 KiB: over the 48 KiB a kernel may declare with no device to ask
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (64, 4096)).sum(1)))
  k = Kernel(sink, r)
  with pytest.raises(KernelOptError, match="shared memory"):
    for o in (Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.GROUPTOP, 0, 256), Opt(OptOps.UPCAST, 0, 16)): k.apply_opt(o)


def test_dynamic_shared_memory_where_the_device_allows_more():
  r = CUDARenderer("sm_90")
  r.shared_max = 227 * 1024  # an H100's opt-in maximum, as a device's props would give it
  k = Kernel(A.sink(A.store(0, A.arg(1, dtypes.float32, (64, 4096)).sum(1))), r)
  for o in (Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.GROUPTOP, 0, 256), Opt(OptOps.UPCAST, 0, 16)): k.apply_opt(o)
  src = k.to_program().src
  assert "extern __shared__" in src and DYNAMIC_SHARED_MARKER in src
  meta, _ = unpack_library(NVRTCCompiler("sm_90").compile(src))
  assert meta["dynamic_shared"] > STATIC_SHARED_MAX


def test_device_is_registered_and_renders_without_a_gpu():
  assert "CUDA" in kc.Device
  r = kc.Device.renderer("CUDA")
  assert isinstance(r, CUDARenderer) and r.arch == "sm_90"
  assert kc.Device.compiler("CUDA").arch == "sm_90"


def test_arch_from_environment(monkeypatch):
  import kc_cuda
  monkeypatch.setenv("KC_CUDA_ARCH", "sm_80")
  if kc.Device.unavailable_reason("CUDA") is None: pytest.skip("a GPU is present: its arch wins over KC_CUDA_ARCH")
  assert kc_cuda.device_renderer().arch == "sm_80" and not any(m.min_capability > 80 for m in kc_cuda.device_renderer().mmas)
  monkeypatch.setenv("KC_CUDA_ARCH", "volta")
  with pytest.raises(ConfigError, match="KC_CUDA_ARCH"): kc_cuda.device_renderer()


def test_reading_nvrtcs_log_leaves_the_interpreters_bytes_alone():
  # a kernel that compiles has a one-byte log (its NUL): read into a bytes object, NVRTC overwrote the interpreter's
  # shared b" ", and print then wrote NUL between its arguments. In a fresh interpreter: a regression cannot poison
  # this one
  code = ("from kc_cuda.compiler import NVRTCCompiler\n"
          "src = 'extern \"C\" __global__ void k(float* a) { a[0] = a[1]; }'\n"
          "lib, log = NVRTCCompiler('sm_90').compile_with_log(src)\n"
          "assert log == '' and lib.startswith(b'KCCUDA1'), log\n"
          "print('a', 'b', b' '[0], (b'x' * 2).replace(b'x', b' ')[0])\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True).stdout
  assert out == b"a b 32 32\n", out


def test_an_arch_the_cuda_major_dropped_names_the_major_that_compiles_it(monkeypatch):
  import kc_cuda.compiler as compiler
  monkeypatch.setattr(compiler, "supported_archs", lambda: ("sm_75", "sm_80", "sm_90"))  # CUDA 13's range
  monkeypatch.setattr(compiler, "nvrtc_version", lambda: "13.0")
  dropped = r"NVRTC 13\.0 \(CUDA 13\) cannot compile for sm_70.*older than sm_75.*'kc-cuda\[cu12\]'"
  with pytest.raises(CompileError, match=dropped): NVRTCCompiler("sm_70")
  assert "cu12" not in compiler.unsupported_arch_message("sm_99")  # newer than this NVRTC: no older major helps
  monkeypatch.setattr(compiler, "nvrtc_version", lambda: "12.9")
  # CUDA 12 is the oldest major kc knows: nothing older to name
  assert compiler.unsupported_arch_message("sm_70").endswith("sm_75, sm_80, sm_90")


def test_int64_indices_render_as_long_long_and_compile():
  # rows of 4096 with up to 2^20 rows: offsets pass 2^31, so launch indices, loops and offsets are long long
  r, c = CUDARenderer("sm_90"), NVRTCCompiler("sm_90")
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (kc.Variable("n", 1, 2**20), 4096)).sum(1)))
  for opts in ((), (Opt(OptOps.GROUP, 0, 16),)):
    k = Kernel(sink, r)
    for o in opts: k.apply_opt(o)
    src = k.to_program().src
    assert "long long gidx0 = blockIdx.x;" in src and "for (long long ridx0 = 0ll;" in src and "int " not in src
    assert c.compile(src).startswith(b"KCCUDA1")
  # a small kernel keeps int
  small = Kernel(A.sink(A.store(0, A.arg(1, dtypes.float32, (64, 32)).sum(1))), r).to_program().src
  assert "int gidx0 = blockIdx.x;" in small and "long" not in small
