"""Batched NVRTC builds: several kernels from one NVRTC program, each member's library the batch's cubin with its own
entry and dynamic shared memory; the member's machine code is the code its own compile gives; a bad member costs
only itself (compile_many builds the batch again one by one); the runtime looks up the library's entry."""
import struct, types
import numpy as np
import pytest
import kc
from kc import dtypes
from kc import ast as A
from kc.backend import CompileError
from kc.kernel import Kernel
from kc_cuda.compiler import NVRTCCompiler, batch_member, unpack_library
from kc_cuda.driver import unavailable_reason
from kc_cuda.renderer import DYNAMIC_SHARED_MARKER, CUDARenderer

ARCH = "sm_90"


def sections(elf: bytes) -> dict[str, bytes]:
  """The contents of an ELF64 little-endian image's sections (empty for NOBITS ones), by name."""
  assert elf[:4] == b"\x7fELF" and elf[4] == 2 and elf[5] == 1
  (shoff,) = struct.unpack_from("<Q", elf, 0x28)
  shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
  headers = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
  names = headers[shstrndx][4]
  def name(off: int) -> str: return elf[names + off:elf.index(b"\0", names + off)].decode()
  return {name(h[0]): (b"" if h[1] == 8 else elf[h[4]:h[4] + h[5]]) for h in headers}


def global_functions(elf: bytes) -> set[str]:
  """The names of the global function symbols in an ELF64 image's .symtab."""
  secs, out = sections(elf), set()
  symtab, strtab = secs[".symtab"], secs[".strtab"]
  for off in range(0, len(symtab), 24):
    st_name, st_info = struct.unpack_from("<IB", symtab, off)
    if st_info >> 4 == 1 and st_info & 0xF == 2: out.add(strtab[st_name:strtab.index(b"\0", st_name)].decode())
  return out


def rendered(sink, hand: bool) -> str:
  k = Kernel(sink, CUDARenderer(ARCH))
  if hand: k.hand_coded_optimizations()
  return k.to_program().src


def helper_kernel(op: str, dynamic: int = 0) -> str:
  """A kernel named `k` with a static helper named `helper` that computes `op`, optionally declaring dynamic shared
  memory as kc's renderer does."""
  shared = (f"  extern __shared__ __align__(16) unsigned char __kc_smem[];\n  __kc_smem[threadIdx.x] = 1;\n"
            f"  /* {DYNAMIC_SHARED_MARKER} {dynamic} */\n") if dynamic else ""
  return (f"#include <cuda_fp16.h>\nstatic __device__ __forceinline__ float helper(float x) {{ return {op}; }}\n"
          f"struct __align__(4) kc_half2 {{ half x, y; }};\n"
          f'extern "C" __global__ __launch_bounds__(32) void k(float* data0) {{\n{shared}'
          f"  data0[threadIdx.x] = helper((float)threadIdx.x);\n}}")


@pytest.fixture(scope="module")
def compiler(): return NVRTCCompiler(ARCH)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
  monkeypatch.setenv("KC_CACHE_DIR", str(tmp_path))
  return tmp_path


def test_members_name_distinct_entries_whose_code_is_their_own_compiles(compiler):
  x = A.arg(1, dtypes.float16, (64, 8))
  y = A.arg(1, dtypes.bfloat16, (16, 16))
  srcs = [rendered(A.sink(A.store(0, (x.cast(dtypes.float32).exp2() + 1.0).sqrt().sum(1))), True),
          rendered(A.sink(A.store(0, (x * x - x).max(1))), False),
          rendered(A.sink(A.store(0, y.cast(dtypes.float32) * 2.0)), True)]
  libs = compiler.compile_batch_uncached(srcs)
  metas = [unpack_library(lib)[0] for lib in libs]
  cubins = {unpack_library(lib)[1] for lib in libs}
  assert len(libs) == 3 and len(cubins) == 1  # one program: every member holds the batch's cubin
  (cubin,) = cubins
  entries = [m["entry"] for m in metas]
  assert len(set(entries)) == 3 and set(entries) <= global_functions(cubin)
  for src, meta in zip(srcs, metas):
    alone_meta, alone = unpack_library(compiler.compile_uncached(src))
    assert {k: v for k, v in meta.items() if k != "entry"} == alone_meta
    (name,) = global_functions(alone)
    assert meta["entry"] == f"kcb{srcs.index(src)}_{name}"
    # the same machine code as the kernel compiled alone
    assert sections(cubin)[f".text.{meta['entry']}"] == sections(alone)[f".text.{name}"]


def test_the_same_kernel_and_helper_names_in_one_batch_keep_their_own_meanings(compiler):
  srcs = [helper_kernel("x + 1.0f"), helper_kernel("x * 2.0f"), helper_kernel("x + 1.0f")]
  libs = compiler.compile_batch_uncached(srcs)
  (cubin,) = {unpack_library(lib)[1] for lib in libs}
  entries = [unpack_library(lib)[0]["entry"] for lib in libs]
  assert entries == ["kcb0_k", "kcb1_k", "kcb2_k"] and set(entries) <= global_functions(cubin)
  code = [sections(cubin)[f".text.{e}"] for e in entries]
  assert code[0] == code[2] != code[1]  # x + 1 twice, x * 2 once: each member calls its own helper
  for src, text in zip(srcs, code): assert text == sections(unpack_library(compiler.compile_uncached(src))[1])[".text.k"]


def test_each_member_has_its_own_dynamic_shared_memory(compiler):
  libs = compiler.compile_batch_uncached([helper_kernel("x", dynamic=65536), helper_kernel("x"), helper_kernel("x", dynamic=100352)])
  assert [unpack_library(lib)[0]["dynamic_shared"] for lib in libs] == [65536, 0, 100352]


def test_a_bad_source_fails_only_itself_through_compile_many(compiler, cache_dir):
  good = [helper_kernel("x + 3.0f"), helper_kernel("x - 3.0f")]
  bad = helper_kernel("x + undeclared_name")
  with pytest.raises(CompileError): compiler.compile_batch_uncached([good[0], bad, good[1]])
  got = compiler.compile_many([good[0], bad, good[1]])
  assert isinstance(got[1], CompileError) and "undeclared_name" in got[1].log
  for out, src in zip((got[0], got[2]), good):
    assert isinstance(out, bytes) and "k" in global_functions(unpack_library(out)[1])
    assert compiler.compile(src) == out  # stored in the cache


def test_compile_many_builds_misses_in_batches_of_max_batch(compiler, cache_dir):
  srcs = [helper_kernel(f"x + {i}.0f") for i in range(compiler.max_batch + 2)]
  got = compiler.compile_many(srcs)
  metas = [unpack_library(lib)[0] for lib in got]
  assert [m["entry"] for m in metas] == [f"kcb{i}_k" for i in range(compiler.max_batch)] + ["kcb0_k", "kcb1_k"]


def test_a_member_with_its_own_preprocessor_line_is_built_alone(compiler, cache_dir):
  own = "#define SCALE 2.0f\n" + helper_kernel("x * SCALE")
  with pytest.raises(CompileError, match="preprocessor"): batch_member(0, own)
  got = compiler.compile_many([helper_kernel("x"), own])
  assert all(isinstance(out, bytes) for out in got)
  assert "entry" not in unpack_library(got[1])[0]  # built one by one: the library of compile_uncached
  with pytest.raises(CompileError, match="one extern"): batch_member(0, "__global__ void k() {}")


@pytest.mark.parametrize("meta, asked", [({"entry": "kcb3_k"}, b"kcb3_k"), ({}, b"k")])
def test_the_runtime_asks_the_driver_for_the_librarys_entry(monkeypatch, meta, asked):
  runtime = pytest.importorskip("kc_cuda.runtime", reason="cuda-bindings' driver module is not importable")
  from kc_cuda.compiler import pack_library
  real, calls = runtime.cu, []
  ok = real.CUresult.CUDA_SUCCESS
  fake = types.SimpleNamespace(CUresult=real.CUresult, CUfunction_attribute=real.CUfunction_attribute,
                               cuModuleLoadData=lambda image: (ok, "module"),
                               cuModuleGetFunction=lambda module, name: calls.append((module, name)) or (ok, "function"),
                               cuFuncSetAttribute=lambda *a: (ok,), cuModuleUnload=lambda module: (ok,))
  monkeypatch.setattr(runtime, "cu", fake)
  device = types.SimpleNamespace(props=types.SimpleNamespace(name="a GPU", shared_per_block_optin=227 * 1024), activate=lambda: None)
  prg = runtime.CUDAProgram(device, "k", pack_library({"arch": ARCH, "cuda": 12, "dynamic_shared": 0, **meta}, b"\x7fELF"))
  assert calls == [("module", asked)] and prg.function == "function"


@pytest.mark.skipif(unavailable_reason() is not None, reason=f"no CUDA GPU here: {unavailable_reason()}")
def test_batch_built_kernels_run_on_the_gpu(cache_dir):
  dev = kc.Device["CUDA"]
  srcs = [helper_kernel("x + 1.0f"), helper_kernel("x * 2.0f", dynamic=65536)]
  libs = dev.compiler.compile_batch_uncached(srcs)
  want = [np.arange(32, dtype=np.float32) + 1, np.arange(32, dtype=np.float32) * 2]
  for lib, expected in zip(libs, want):
    prg = dev.runtime("k", lib)
    mem = dev.allocator.alloc(32 * 4)
    prg(mem, global_size=(1, 1, 1), local_size=(32, 1, 1), wait=True)
    out = np.zeros(32, np.float32)
    dev.allocator.copyout(memoryview(out).cast("B"), mem)
    np.testing.assert_array_equal(out, expected)
