"""Every Metal kernel of the conformance corpus, rendered and checked as C++ against msl_shim.h (see
metal_msl_check.py for what that proves and what it cannot). Skips where no C++ compiler or no kc-conformance is
installed."""
import importlib.util, os
import pytest
from kc_metal.family import family_named
from kc_metal.renderer import MetalRenderer
from metal_msl_check import Kernel, check, corpus_kernels, cxx

pytestmark = [pytest.mark.skipif(cxx() is None, reason="no C++ compiler (g++ or clang++) to check MSL with"),
              pytest.mark.skipif(importlib.util.find_spec("kc_conformance") is None, reason="kc-conformance is not installed")]


def test_corpus_kernels_check_as_cxx():
  # apple9 declares every tensor core, so every simdgroup helper is among the kernels
  kernels, _ = corpus_kernels(MetalRenderer(family_named("apple9")))
  assert len(kernels) > 500
  assert any("simdgroup_multiply_accumulate" in k.src for k in kernels)
  # the bfloat helper Apple9 compiles (plugins/metal/mac_check.py compiles these on a Mac): the tc_matmul_bf16_f32 cases
  bfloat = {k.label for k in kernels if "simdgroup_matrix<bfloat, 8, 8>" in k.src}
  assert "tc_matmul_bf16_f32_tiles[tc1]" in bfloat, sorted(bfloat)
  assert check(kernels, jobs=os.cpu_count() or 2) == []


def test_the_check_finds_errors_and_names_the_kernel():
  head = "using namespace metal;\nkernel void f(device float* d [[buffer(0)]]) {"
  kernels = [Kernel("fine", f"{head} float4 v = float4(1.0f, 2.0f, 3.0f, 4.0f); d[0] = v.w + sqrt(d[1]); }}"),
             Kernel("undeclared", f"{head} d[0] = frobnicate(d[1]); }}"),
             Kernel("bitcast", f"{head} d[0] = as_type<float>((half)(1.0f)); }}"),  # 2 bytes to 4: as_type<> refuses
             Kernel("no_int_sqrt", f"{head} d[0] = sqrt(3); }}")]
  errors = check(kernels, jobs=1)
  assert {e.split(":")[0] for e in errors} == {"undeclared", "bitcast", "no_int_sqrt"}, errors


def test_int64_indices_render_as_long_and_check_as_cxx():
  # rows of 4096 with up to 2^20 rows: offsets pass 2^31, so launch indices, loops and offsets are long
  import kc
  from kc import Opt, OptOps, dtypes
  from kc import ast as A
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (kc.Variable("n", 1, 2**20), 4096)).sum(1)))
  k = kc.Kernel(sink, MetalRenderer())
  k.apply_opt(Opt(OptOps.GROUP, 0, 16))
  src = k.to_program().src
  assert "long gidx0 = (int)__kc_gid.x;" in src and "long lidx0 = (int)__kc_lid.x;" in src
  assert "for (long ridx0 = 0l;" in src
  assert check([Kernel("int64 indices", src)], jobs=1) == []
