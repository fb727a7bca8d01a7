"""The METAL device (kc-metal) on a machine without Metal: the MSL dialect, the simdgroup-matrix tensor cores and
their fragment layout, GPU families, the device registered and unavailable, launch planning, and tensor-core
matmuls run through the Metal renderer's lowering on EMU. The rendered corpus is C++-checked in test_metal_msl.py."""
import sys
import numpy as np
import pytest
import kc
from kc import Opt, OptOps, dtypes
from kc import ast as A
from kc.backend import ConfigError, DeviceUnavailable, KcError, TensorCore, layout_mismatch
import kc_metal
from kc_metal.family import ENV_FAMILY, FAMILIES, NEWEST, family_named, newest_supported
from kc_metal.launch import Dispatch, LaunchError, argument_slots, check_arguments, plan_dispatch
from kc_metal.renderer import LOCAL_MAX, MetalRenderer, metal_tensor_cores
from kc_metal.tensor_cores import SIMDGROUP_LAYOUT, simdgroup_coord, simdgroup_tensor_core

ALL_PAIRS = [(dtypes.float32, dtypes.float32), (dtypes.float16, dtypes.float32), (dtypes.float16, dtypes.float16),
             (dtypes.bfloat16, dtypes.float32)]


def matmul(dt_in, dt_acc, M, K, N):
  """(M, K) @ (K, N) as the AST a tensor core of (dt_in, dt_acc) matches: dt_in products, cast to dt_acc, summed in
  dt_acc (the kc.ast builder would sum half products in float, which only the half -> float tensor core takes)."""
  from kc import ShapeTracker, UOp, Ops
  def load(i, st): return UOp(Ops.LOAD, dt_in, (UOp(Ops.DEFINE_GLOBAL, dt_in.ptr(), (), i), st.to_uop()))
  mul = load(1, ShapeTracker.from_shape((M, K, 1)).expand((M, K, N))) * load(2, ShapeTracker.from_shape((1, K, N)).expand((M, K, N)))
  if dt_in != dt_acc: mul = mul.cast(dt_acc)
  red = UOp(Ops.REDUCE_AXIS, dt_acc, (mul,), (Ops.ADD, (1,)))
  out = UOp(Ops.STORE, dtypes.void, (UOp(Ops.DEFINE_GLOBAL, dt_acc.ptr(), (), 0), ShapeTracker.from_shape((M, 1, N)).to_uop(), red))
  return UOp(Ops.SINK, dtypes.void, (out,))


def render(sink, renderer=None, opts=()):
  k = kc.Kernel(sink, opts=renderer or MetalRenderer())
  for o in opts: k.apply_opt(o)
  return k.to_program()


# ----------------------------------------------------------------------------------------------- tensor-core layout

# The simdgroup_matrix 8x8 fragment layout. Apple does not document it; MLX's GEMM kernels rely on it:
# ml-explore/mlx, mlx/backend/metal/kernels/steel/gemm/mma.h. There, BaseMMAFrag<T, 8, 8>::get_coord(simd_lane_id)
# (and, in older versions, BlockMMA's constructor) computes qid = lane / 4, row fm = (qid & 4) + (lane / 2) % 4,
# col fn = (qid & 2) * 2 + (lane % 2) * 2, and each thread's thread_elements()[0] and [1] are (fm, fn) and
# (fm, fn + 1) of A (M x K, read from As[row * lda + col]), of B (K x N) and of C/D (M x N).

def test_simdgroup_layout_is_mlx_get_coord():
  assert [simdgroup_coord(lane) for lane in (0, 1, 2, 3, 4, 8, 16, 31)] == [(0, 0), (0, 2), (1, 0), (1, 2), (2, 0), (0, 4), (4, 0), (7, 6)]
  held = [c for lane in SIMDGROUP_LAYOUT.c for c in lane]
  assert sorted(held) == [(r, c) for r in range(8) for c in range(8)]  # 32 lanes x 2 elements: the whole 8x8, once each


@pytest.mark.parametrize("family", ["apple7", "apple8", "apple9"])
def test_every_declared_tensor_core_matches_the_simdgroup_layout(family):
  tcs = MetalRenderer(family_named(family)).tensor_cores
  assert tcs
  for tc in tcs: assert layout_mismatch(tc, SIMDGROUP_LAYOUT) is None, tc


def test_layout_check_catches_a_wrong_description():
  tc = simdgroup_tensor_core(dtypes.float32, dtypes.float32)
  swapped = TensorCore(dims=tc.dims, dtype_in=tc.dtype_in, dtype_out=tc.dtype_out, threads=tc.threads, reduce_axes=tc.reduce_axes,
                       upcast_axes=tc.upcast_axes, st1_pattern=tc.st1_pattern, expanded_shape=tc.expanded_shape,
                       # B's lanes 1 and 2 read K bits 1 and 0 instead of 0 and 1: K is numbered unlike A's
                       st2_pattern=(((0, 0), (1, 1), (1, 2), (0, 3), (1, 0)), tc.st2_pattern[1]))
  assert layout_mismatch(swapped, SIMDGROUP_LAYOUT) is not None


# ----------------------------------------------------------------------------------------------- families and dtypes

def test_family_decides_the_tensor_cores(monkeypatch):
  monkeypatch.delenv(ENV_FAMILY, raising=False)
  assert MetalRenderer().family == NEWEST and NEWEST.name == "apple9"
  pairs = lambda fam: [(tc.dtype_in, tc.dtype_out) for tc in metal_tensor_cores(family_named(fam))]  # noqa: E731
  assert pairs("apple9") == ALL_PAIRS
  assert pairs("apple7") == pairs("apple8") == ALL_PAIRS[:3]  # bfloat simdgroup matrices from Apple9 on
  assert pairs("apple6") == pairs("mac2") == []
  monkeypatch.setenv(ENV_FAMILY, "Apple8")
  assert MetalRenderer().family.name == "apple8" and len(MetalRenderer().tensor_cores) == 3


def test_bad_family_is_a_config_error_naming_the_variable(monkeypatch):
  monkeypatch.setenv(ENV_FAMILY, "m3")
  with pytest.raises(ConfigError, match=ENV_FAMILY): MetalRenderer()


def test_newest_supported_family_prefers_apple_families():
  assert newest_supported(lambda v: v in (1007, 1008, 2002)).name == "apple8"
  assert newest_supported(lambda v: v == 2002).name == "mac2"
  assert set(FAMILIES) >= {"apple7", "apple9", "mac2"}


def test_declared_dtypes_are_what_msl_has():
  r = MetalRenderer()
  assert not r.supports_dtype(dtypes.float64)  # Metal has no double
  for dt in (dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
             dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32):
    assert r.supports_dtype(dt), dt
  assert all(r.supports_dtype(dt) == (dt in r.supported_dtypes) for dt in dtypes.all)  # a dtype kc adds is not claimed unseen


def test_limits():
  r = MetalRenderer()
  assert (r.local_max, r.max_work_group_size, r.shared_max) == ((1024, 1024, 1024), 1024, 32768)
  assert r.has_local and r.has_shared and r.supports_float4


# ----------------------------------------------------------------------------------------------- the dialect

def test_kernel_signature_binds_arguments_and_launch_indices():
  src = render(A.sink(A.store(0, A.arg(1, dtypes.float32, (64, 16)).sum(1)))).src
  assert "kernel void " in src and "#include <metal_stdlib>" in src
  assert "device float* data0 [[buffer(0)]]" in src and "device float* data1 [[buffer(1)]]" in src
  assert "uint3 __kc_gid [[threadgroup_position_in_grid]]" in src


def test_locals_barrier_and_thread_ids():
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (4, 256)).sum(1)))
  src = render(sink, opts=[Opt(OptOps.GROUPTOP, 0, 16)]).src
  assert "threadgroup_barrier(mem_flags::mem_threadgroup);" in src and "threadgroup float temp" in src
  assert "[[thread_position_in_threadgroup]]" in src and "(int)__kc_lid.x" in src


def test_global_ids_without_locals():
  src = render(A.sink(A.store(0, A.arg(1, dtypes.float32, (64,)) + 1.0)), opts=[Opt(OptOps.NOLOCALS, None, None)]).src
  assert "[[thread_position_in_grid]]" in src and "__kc_gid" not in src


def test_variables_are_constant_references():
  n = kc.Variable("n", 1, 64)
  src = render(A.sink(A.store(0, A.arg(1, dtypes.float32, (n,)).sum(0)))).src  # a loop to n reads it in the kernel
  assert "constant int& n [[buffer(2)]]" in src


def test_types_bitcasts_and_literals():
  src = render(A.sink(A.store(0, A.arg(1, dtypes.float32, (8,)).bitcast(dtypes.int32)))).src
  assert "as_type<int>(" in src
  src = render(A.sink(A.store(0, A.arg(1, dtypes.int64, (8,)) + (2**40)))).src
  assert "1099511627776l" in src and "device long*" in src
  src = render(A.sink(A.store(0, (A.arg(1, dtypes.float16, (8,)) * A.arg(2, dtypes.bfloat16, (8,)).cast(dtypes.float16))))).src
  assert "device half*" in src and "device bfloat*" in src


def test_vectors_use_msl_constructors():
  src = render(A.sink(A.store(0, A.arg(1, dtypes.float32, (64,)) * 2.0)), opts=[Opt(OptOps.UPCAST, 0, 4)]).src
  assert "float4(" in src and "(float4)(" not in src


@pytest.mark.parametrize("dt_in,dt_out", ALL_PAIRS)
def test_tensor_core_kernel_calls_a_simdgroup_helper(dt_in, dt_out):
  k = kc.Kernel(matmul(dt_in, dt_out, 16, 16, 16), opts=MetalRenderer())
  k.apply_opt(Opt(OptOps.TC, 0, 0))
  src = k.to_program().src
  name = f"__WMMA_8_8_8_{dt_in.name}_{dt_out.name}"
  assert f"{name}(" in src.split("kernel void")[1]
  helper = src.split("kernel void")[0]
  assert "simdgroup_multiply_accumulate(mat_c, mat_a, mat_b, mat_c);" in helper and "thread_elements()[1]" in helper
  t_in = {dtypes.float32: "float", dtypes.float16: "half", dtypes.bfloat16: "bfloat"}[dt_in]
  assert f"simdgroup_matrix<{t_in}, 8, 8> mat_a" in helper


# ----------------------------------------------------------------------------------------------- the device here

@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS the device may open")
def test_device_is_registered_and_unavailable_off_macos():
  assert "METAL" in kc.Device.names()
  assert "Metal needs macOS with an Apple GPU" in kc_metal.unavailable_reason()
  with pytest.raises(DeviceUnavailable, match="Metal needs macOS"): kc.Device["METAL"]
  assert isinstance(kc.Device.renderer("METAL"), MetalRenderer)  # the render tier needs no device
  assert "Metal" not in sys.modules  # nothing imported pyobjc's bindings


# ----------------------------------------------------------------------------------------------- launch planning

def test_argument_slots_and_checks():
  n = kc.Variable("n", 1, 64)
  prg = render(A.sink(A.store(0, A.arg(1, dtypes.float32, (n,)).sum(0))))
  assert argument_slots(prg.src, prg.name) == 3
  check_arguments(prg.name, 3, 2, 1)
  with pytest.raises(LaunchError, match="takes 3 arguments"): check_arguments(prg.name, 3, 2, 0)
  with pytest.raises(LaunchError, match="no kernel named"): argument_slots(prg.src, "other")


def test_plan_dispatch():
  assert plan_dispatch("k", [4, 2, 1], [32, 1, 1], 1024, LOCAL_MAX) == Dispatch((4, 2, 1), (32, 1, 1), False)
  assert plan_dispatch("k", [1000], None, 256, LOCAL_MAX) == Dispatch((1000, 1, 1), (256, 1, 1), True)
  assert plan_dispatch("k", [10], None, 256, LOCAL_MAX) == Dispatch((10, 1, 1), (10, 1, 1), True)
  assert plan_dispatch("k", [0, 1, 1], [4, 1, 1], 1024, LOCAL_MAX) is None
  with pytest.raises(LaunchError, match="pipeline's 512"): plan_dispatch("k", [1, 1, 1], [32, 32, 1], 512, LOCAL_MAX)
  with pytest.raises(LaunchError, match="axis 2"): plan_dispatch("k", [1, 1, 1], [1, 1, 2048], 4096, LOCAL_MAX)
  with pytest.raises(LaunchError, match="non-negative"): plan_dispatch("k", [1, -1], [1], 1024, LOCAL_MAX)
  assert issubclass(LaunchError, KcError)


# ----------------------------------------------------------------------------------------------- numerics on EMU

@pytest.mark.parametrize("dt_in,dt_out", ALL_PAIRS)
@pytest.mark.parametrize("M,K,N", [(16, 24, 8), (13, 19, 11)])  # whole tiles, and odd sizes padded (PADTO) to them
def test_tensor_core_matmul_on_emu(emu_metal, dt_in, dt_out, M, K, N):
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
  if dt_in == dtypes.bfloat16: a, b = [(x.view(np.uint32) & 0xFFFF0000).view(np.float32) for x in (a, b)]  # bfloat16-exact values
  else: a, b = a.astype(dt_in.np), b.astype(dt_in.np)
  k = kc.compile(matmul(dt_in, dt_out, M, K, N), device="EMU", opts=[Opt(OptOps.TC, 0, 2)])
  wmma = [u.arg.name for u in k.program.uops if u.op is kc.Ops.WMMA]
  assert wmma and set(wmma) == {f"WMMA_8_8_8_{dt_in.name}_{dt_out.name}"}
  out = np.empty((M, N), dt_out.np)
  if dt_in == dtypes.bfloat16:  # no numpy bfloat16: the inputs go in as their upper 16 bits
    bufs = []
    for x in (a, b):
      bufs.append(kc.Buffer("EMU", x.size, dt_in).allocate())
      bufs[-1].copyin(memoryview((x.view(np.uint32) >> 16).astype(np.uint16)))
    k(out, *bufs)
  else: k(out, a, b)
  tol = 2e-2 if dt_out == dtypes.float16 else 1e-4
  np.testing.assert_allclose(out.astype(np.float32), a.astype(np.float32) @ b.astype(np.float32), rtol=tol, atol=tol)
