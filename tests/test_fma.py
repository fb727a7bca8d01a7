"""kc.codegen.fma: on a renderer whose MULACC is a fused multiply-add (Renderer.fuses_accumulation), a float sum
reduce of products accumulates with one MULACC per product; every other a*b+c keeps its two roundings. EMU runs the
fused programs with numpy's results; CLANG (x86 with FMA3) renders them as fmaf and the FMA builtins, rounding once."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
import kc
from kc import ast as A, dtypes
from kc.codegen.fma import fuse_accumulations
from kc.emu import DEVICE, impersonating
from kc.emu.renderer import EmuRenderer
from kc.ir.uop import Ops, UOp
from kc.kernel import Kernel
from kc.kernel.heuristics import hand_coded_optimizations

F = lambda i, *s: A.arg(i, dtypes.float32, s)  # noqa: E731


class FusingRenderer(EmuRenderer):
  """EMU's renderer, fusing float32 and float64 sums of products of any width."""
  fuses_accumulation = True
  def fused_multiply_add(self, dt): return dt.scalar() in (dtypes.float32, dtypes.float64)


def mm(M, K, N): return A.sink(A.store(0, (F(1, M, K).reshape(M, K, 1) * F(2, K, N).reshape(1, K, N)).sum(1)))


def conv(cin=4, cout=8, H=6, W=16, k=3):
  x, w = F(1, cin, H, W), F(2, cout, cin, k, k)
  win = x.pad(((0, 0), (1, 1), (1, 1))).windows(1, k).windows(2, k).permute(0, 3, 4, 1, 2).reshape(1, cin, k, k, H, W)
  return A.sink(A.store(0, (win * w.reshape(cout, cin, k, k, 1, 1)).sum(axis=(1, 2, 3))))


def uops_of(sink, renderer, hand=True):
  k = Kernel(sink, renderer)
  if hand: hand_coded_optimizations(k)
  return k.linearize()


def accumulations(uops): return [u for u in uops if u.op is Ops.ASSIGN and u.src[0].op is Ops.DEFINE_ACC]


def test_off_by_default():
  from kc.renderer import Renderer
  assert Renderer.fuses_accumulation is False
  assert not any(u.op is Ops.MULACC for u in uops_of(mm(8, 8, 8), EmuRenderer()))


@pytest.mark.parametrize("hand", [False, True])
def test_a_matmul_accumulates_with_one_mulacc_per_product_and_no_multiply_left(hand):
  uops = uops_of(mm(16, 32, 16), FusingRenderer(), hand)
  # (EMU's renderer has work-groups: the hand-coded GROUPTOP adds an accumulator of the partial sums, no products)
  fused = [a for a in accumulations(uops) if a.src[1].op is Ops.MULACC]
  assert fused and all(a.src[1].src[2] is a.src[0] for a in fused)
  assert not any(u.op is Ops.MUL and u.dtype.scalar() == dtypes.float32 for u in uops)


def test_a_sum_of_several_products_per_step_is_a_chain_of_mulaccs_over_the_accumulator():
  # 4 output lanes along W, the 3x3 window unrolled: each lane's update adds 9 products (a pairwise tree of ADDs
  # before fusing): 9 MULACCs, no ADD
  k = Kernel(conv(), FusingRenderer())
  k.apply_opt(kc.Opt(kc.OptOps.UPCAST, 2, 4)); k.apply_opt(kc.Opt(kc.OptOps.UNROLL, 1, 0)); k.apply_opt(kc.Opt(kc.OptOps.UNROLL, 1, 0))
  accs = accumulations(k.linearize())
  assert len(accs) == 4
  for a in accs:
    chain, v = 0, a.src[1]
    while v.op is Ops.MULACC: chain, v = chain + 1, v.src[2]
    assert v is a.src[0] and chain == 9


def test_elementwise_and_non_product_sums_are_not_fused():
  x, y, z = F(1, 64), F(2, 64), F(3, 64)
  for sink in (A.sink(A.store(0, x * y + z)), A.sink(A.store(0, (x + y).sum())), A.sink(A.store(0, x.sum() * y + z))):
    assert not any(u.op is Ops.MULACC for u in uops_of(sink, FusingRenderer()))


def test_a_product_beside_other_terms_fuses_and_the_other_terms_still_add():
  # sum(x*y + z): the update is acc + x*y + z, a MULACC over (acc + z)
  x, y, z = F(1, 8, 32), F(2, 8, 32), F(3, 8, 32)
  (a,) = set(accumulations(uops_of(A.sink(A.store(0, (x * y + z).sum(1))), FusingRenderer(), hand=False)))
  assert a.src[1].op is Ops.MULACC and a.src[1].src[2].op is Ops.ADD and a.src[0] in a.src[1].src[2].src


def test_the_pass_leaves_other_dtypes_and_renderers_alone():
  acc = UOp(Ops.DEFINE_ACC, dtypes.float32, (UOp.const(dtypes.float32, 0.0),), (0,))
  a, b = UOp.const(dtypes.float32, 2.0), UOp.const(dtypes.float32, 3.0)
  upd = UOp(Ops.ASSIGN, dtypes.float32, (acc, UOp(Ops.ADD, dtypes.float32, (acc, UOp(Ops.MUL, dtypes.float32, (a, b))))))
  sink = UOp(Ops.SINK, dtypes.void, (upd,))
  assert fuse_accumulations(sink, lambda dt: False) is sink
  fused = fuse_accumulations(sink, lambda dt: True).src[0]
  assert fused.src[1].op is Ops.MULACC and fused.src[1].src == (a, b, acc)
  i = UOp.const(dtypes.int32, 1)  # an int sum of products stays as it is
  iacc = UOp(Ops.DEFINE_ACC, dtypes.int32, (UOp.const(dtypes.int32, 0),), (1,))
  isink = UOp(Ops.SINK, dtypes.void, (UOp(Ops.ASSIGN, dtypes.int32, (iacc, iacc + UOp(Ops.MUL, dtypes.int32, (i, i)))),))
  assert fuse_accumulations(isink, lambda dt: True) is isink


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(M=st.integers(1, 9), K=st.integers(1, 40), N=st.integers(1, 20), extra=st.booleans(), hand=st.booleans())
def test_fused_sums_of_products_on_emu_mean_what_numpy_means(emu, M, K, N, extra, hand):
  # any shape of matmul (with a term beside the product) through the fused lowering, run on EMU
  a, b, c = F(1, M, K).reshape(M, K, 1), F(2, K, N).reshape(1, K, N), F(3, M, K).reshape(M, K, 1)
  sink = A.sink(A.store(0, ((a * b + c) if extra else (a * b)).sum(1)))
  rng = np.random.default_rng(M * 1000 + K * 10 + N)
  x, y, z = (rng.standard_normal(s).astype(np.float32) for s in ((M, K), (K, N), (M, K)))
  emu.renderer = impersonating(FusingRenderer())
  got = kc.run(sink, {1: x, 2: y, 3: z} if extra else {1: x, 2: y}, device=DEVICE, opts="hand" if hand else "none")[0].reshape(M, N)
  want = x.astype(np.float64) @ y.astype(np.float64) + (z.astype(np.float64).sum(1, keepdims=True) if extra else 0)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * K)
