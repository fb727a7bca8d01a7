"""Tensor-core option discovery and application on matmul-shaped ASTs."""
import pytest
from target_renderers import LimitsRenderer, TC_HALF, TC_FLOAT
from kc import ast as A, dtypes, Ops
from kc.kernel import Kernel, Opt, OptOps
from kc.codegen import verify_ast
from kc.renderer import WMMAArg
from kc.errors import KernelOptError

H = lambda i, *s: A.arg(i, dtypes.half, s)  # noqa: E731
F = lambda i, *s: A.arg(i, dtypes.float32, s)  # noqa: E731


def half_matmul(M, K, N, cast_inputs=False):
  a, b = H(1, M, K).reshape(M, K, 1), H(2, K, N).reshape(1, K, N)
  prod = a.cast(dtypes.float) * b.cast(dtypes.float) if cast_inputs else (a * b).cast(dtypes.float)
  return A.sink(A.store(0, prod.sum(1)))


def float_matmul(M, K, N): return A.sink(A.store(0, (F(1, M, K).reshape(M, K, 1) * F(2, K, N).reshape(1, K, N)).sum(1)))


def test_tc_discovery_on_half_matmul_with_cast(tc_gpu):
  k = Kernel(half_matmul(64, 64, 64), tc_gpu)
  assert k.apply_tensor_cores(1, extra_opts=[])
  assert k.tensor_core is TC_HALF and k.use_tensor_cores == 1 and k.applied_opts == [Opt(OptOps.TC, 0, 0)]
  # the reduce unrolled by K, N and M split across the 4 threads (locals) and the rest upcast
  assert k.local_dims == len(TC_HALF.threads) and k.upcasted == 3
  assert k.tensor_core_opts.axis_pads == ()


def test_tc_on_float_matmul_without_cast(tc_gpu):
  k = Kernel(float_matmul(32, 32, 32), tc_gpu)
  assert k.apply_tensor_cores(1, extra_opts=[]) and k.tensor_core is TC_FLOAT


def test_inputs_widened_before_the_multiply_take_the_narrow_tensor_core(tc_gpu):
  # kc.ast's half matmul: CAST(LOAD half) -> float inputs multiplied in float, exactly what TC_HALF computes
  k = Kernel(half_matmul(64, 64, 64, cast_inputs=True), tc_gpu)
  assert k.apply_tensor_cores(1, tc_opt=0, extra_opts=[]) and k.tensor_core is TC_HALF
  k = Kernel(A.sink(A.store(0, H(1, 64, 64) @ H(2, 64, 64))), tc_gpu)
  assert k.apply_tensor_cores(1, tc_opt=0, extra_opts=[]) and k.tensor_core is TC_HALF
  # with only the float tensor core, the cast inputs are its float loads from tc_opt 1 on
  k = Kernel(half_matmul(64, 64, 64, cast_inputs=True), LimitsRenderer(tensor_cores=[TC_FLOAT]))
  assert not k.apply_tensor_cores(1, tc_opt=0) and k.apply_tensor_cores(1, tc_opt=1, extra_opts=[])
  # where both could, the half one takes them (the float one would load them widened)
  k = Kernel(half_matmul(64, 64, 64, cast_inputs=True), LimitsRenderer(tensor_cores=[TC_FLOAT, TC_HALF]))
  assert k.apply_tensor_cores(1, tc_opt=1, extra_opts=[]) and k.tensor_core is TC_HALF


def test_odd_sizes_need_padding_at_level_2(tc_gpu):
  ast = half_matmul(30, 30, 30)  # 30 is not a multiple of TC_HALF's 4
  for tc_opt in (0, 1):
    k = Kernel(ast, tc_gpu)
    before = (k.full_shape, list(k.applied_opts))
    assert not k.apply_tensor_cores(1, tc_opt=tc_opt, extra_opts=[])
    assert (k.full_shape, k.applied_opts) == before and k.tensor_core is None
  k = Kernel(ast, tc_gpu)
  assert k.apply_tensor_cores(1, tc_opt=2, extra_opts=[])
  # N, M and K all padded from 30 to 32; the padded axes are then split for the threads and upcasts
  assert k.tensor_core_opts.axis_pads == ((1, 4), (0, 4), (2, 4)) and k.tensor_core is TC_HALF
  assert k.full_shape == (8, 8, 2, 2, 8, 4, 2, 2) and k.sts[0].shape == (8, 8, 2, 2, 1, 1, 2, 2)


def test_not_a_matmul_gets_no_tensor_core(tc_gpu):
  assert not Kernel(A.sink(A.store(0, H(1, 64, 64).cast(dtypes.float).sum(1))), tc_gpu).apply_tensor_cores(1)
  assert not Kernel(A.sink(A.store(0, (H(1, 64, 64) * H(2, 64, 64)).cast(dtypes.float).max(1))), tc_gpu).apply_tensor_cores(1)
  assert not Kernel(half_matmul(64, 64, 64), LimitsRenderer()).apply_tensor_cores(1)
  assert not Kernel(half_matmul(64, 64, 64), tc_gpu).apply_tensor_cores(0)


@pytest.mark.parametrize("level", [1, 2, 3])
def test_levels_fold_into_the_ast(tc_gpu, level):
  # level 3 stages whole inputs in local memory: 64x64 halves twice fit 48 KiB with the unrolled K kept apart
  k = Kernel(half_matmul(32, 32, 32), tc_gpu)
  assert k.apply_tensor_cores(level)
  ast = k.get_optimized_ast()
  verify_ast(ast, optimized=True)
  ops = {u.op for u in ast.toposort}
  assert (Ops.WMMA in ops) == (level == 1)
  assert (Ops.DEFINE_LOCAL in ops) == (level == 3)
  if level == 1:
    wmma = next(u for u in ast.toposort if u.op is Ops.WMMA)
    assert isinstance(wmma.arg, WMMAArg) and wmma.arg.name == str(TC_HALF) and wmma.dtype == dtypes.float.vec(4)
    assert [s.op for s in wmma.src] == [Ops.CONTRACT, Ops.CONTRACT, Ops.VECTORIZE]


def test_level_3_staging_must_fit_shared_memory(tc_gpu):
  # 64x64x64: both inputs staged per output position and unrolled K element are 256 KiB, over the 48 KiB declared
  k = Kernel(half_matmul(64, 64, 64), tc_gpu)
  assert not k.apply_tensor_cores(3) and k.applied_opts == [] and k.tensor_core is None and k.tc_level == 1
  with pytest.raises(KernelOptError, match="shared_max"): Kernel(half_matmul(64, 64, 64), tc_gpu, tc_level=3).apply_opt(Opt(OptOps.TC, 0, 0))


def test_hand_coded_tc_follow_ups(tc_gpu):
  k = Kernel(half_matmul(64, 64, 64), tc_gpu)
  assert k.apply_tensor_cores(1)
  assert k.applied_opts[0] == Opt(OptOps.TC, 0, 0)
  # upcast M then N by the largest of 5, 4, 3, 2 that divides, then a local on N
  assert [o.op for o in k.applied_opts[1:]] == [OptOps.UPCAST, OptOps.UPCAST, OptOps.LOCAL]


def test_tc_refusal_leaves_kernel_unchanged_even_midway(tc_gpu):
  # extra_opts that fail after the TC applied: the whole attempt is undone
  k = Kernel(half_matmul(64, 64, 64), tc_gpu)
  before = (k.full_shape, k.local_dims, k.upcasted)
  assert not k.apply_tensor_cores(1, extra_opts=[Opt(OptOps.UPCAST, 0, 7)])
  assert (k.full_shape, k.local_dims, k.upcasted, k.applied_opts, k.tensor_core) == (*before, [], None)


def test_fragment_layouts_cover_the_matrices():
  from kc.kernel.tc_layout import derive_fragment_layout
  lay = derive_fragment_layout(TC_HALF)
  assert len(lay.a) == 4 and all(len(x) == 8 for x in lay.a) and all(len(x) == 4 for x in lay.c)
  assert sorted(c for lane in lay.c for c in lane) == [(m, n) for m in range(4) for n in range(4)]  # every D element owned once
  assert {c for lane in lay.a for c in lane} == {(m, k) for m in range(4) for k in range(4)}
  small = derive_fragment_layout(TC_FLOAT)
  assert small.c == (((0, 0),), ((0, 1),), ((1, 0),), ((1, 1),))  # lane = n fastest, then m


def test_an_inconsistent_tensor_core_is_reported():
  from kc import KcError
  from kc.kernel.tc_layout import derive_fragment_layout
  from kc.renderer import TensorCore
  # A's fragment leaves out the upcast M axis: half of A is never loaded
  bad = TensorCore(dims=(4, 4, 4), dtype_in=dtypes.half, dtype_out=dtypes.float, threads=[(0, 2), (1, 2)], reduce_axes=[(0, 4)],
                   upcast_axes=([(0, 4)], [(0, 4), (1, 2)], [(1, 2), (2, 2)]))
  with pytest.raises(KcError, match="fragments of A hold 8 of its 16"): derive_fragment_layout(bad)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_every_tensor_core_choice_on_broadcast_operands_runs_as_numpy(dtype):
  """kc fuzz --device EMU --seed 9900, case 515: out[m, n] = sum_k A[n, k] * B[k], B broadcast along m and n (so is
  A along m), with Opt(TC, 1, 2): m, which neither operand walks, was taken as both N and M, and the output's lanes
  came in repeated pairs. The class: every TC choice (axis) and level (amt) of matmuls whose operands are broadcast
  along M, N or both, on EMU's tensor cores, gives numpy's answer or is refused."""
  import numpy as np
  import kc
  rng = np.random.default_rng(515)
  dt = getattr(dtypes, dtype)
  ran = 0
  for M, N, K in [(4, 4, 10), (4, 8, 8), (8, 4, 6), (2, 2, 4)]:
    for a_m, b_n in [(False, False), (True, False), (False, True), (True, True)]:  # A varies along m? B along n?
      a = rng.integers(-4, 5, (M if a_m else 1, K)).astype(dtype)
      b = rng.integers(-4, 5, (K, N if b_n else 1)).astype(dtype)
      xa = A.arg(1, dt, a.shape).reshape(a.shape[0], 1, K).expand(M, N, K)
      xb = A.arg(2, dt, b.shape).permute(1, 0).reshape(1, b.shape[1], K).expand(M, N, K)
      prod = (xa * xb).cast(dtypes.float32) if dtype == "float16" else xa * xb
      sink = A.sink(A.store(0, prod.sum(axis=2)))
      want = np.broadcast_to(a.astype(np.float32), (M, K)) @ np.broadcast_to(b.astype(np.float32), (K, N))
      for axis in range(4):
        for amt in range(3):
          try: got = kc.run(sink, {1: a, 2: b}, device="EMU", opts=[Opt(OptOps.TC, axis, amt)])[0].reshape(M, N)
          except KernelOptError: continue
          np.testing.assert_array_equal(got, want, err_msg=str((M, N, K, a_m, b_n, axis, amt)))
          ran += 1
  assert ran >= 10  # (choices that apply exist: else this checks nothing)
