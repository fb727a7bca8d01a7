"""Every OptOps check of the Kernel: it applies where legal, and where not it raises KernelOptError and leaves the
Kernel exactly as it was."""
import dataclasses
import pytest
from target_renderers import LimitsRenderer
import kc
from kc import ast as A, dtypes, KernelOptError, Variable
from kc.kernel import Kernel, KernelState, Opt, OptOps

F = lambda i, *s: A.arg(i, dtypes.float32, s)  # noqa: E731


def matmul(M=64, K=32, N=48):
  return A.sink(A.store(0, (F(1, M, K).reshape(M, K, 1) * F(2, K, N).reshape(1, K, N)).sum(1)))


def elementwise(*shape): return A.sink(A.store(0, F(1, *shape) + F(2, *shape)))
def rowsum(R=64, C=256): return A.sink(A.store(0, F(1, R, C).sum(1)))


def state(k: Kernel):
  """Everything an opt may change (every KernelState field, compared by value) and the shape it gives."""
  return k.state.copy(), k.full_shape


def refused(k: Kernel, opt: Opt, match: str):
  before = state(k)
  with pytest.raises(KernelOptError, match=match): k.apply_opt(opt)
  assert state(k) == before, f"{opt} was refused but changed the Kernel"


def test_kernel_setup_moves_reduce_axes_last_and_merges(gpu):
  k = Kernel(matmul(), gpu)
  assert k.full_shape == (64, 48, 32) and k.output_shape == (64, 48, 1) and k.first_reduce == 2 and k.first_upcast == 3
  assert len(k.sts) == len(k.bufs) + 2 and [b.op.name for b in k.bufs] == ["STORE", "LOAD", "LOAD"]
  k2 = Kernel(elementwise(8, 16, 4), gpu)
  assert k2.full_shape == (512,)  # contiguous dims merge into one


def test_upcast(gpu):
  k = Kernel(matmul(), gpu)
  k.apply_opt(Opt(OptOps.UPCAST, 0, 4))
  assert k.full_shape == (16, 48, 32, 4) and k.upcasted == 1 and k.colors()[-1] == "yellow"
  refused(k, Opt(OptOps.UPCAST, 1, 32), "does not divide|more than 16")
  refused(k, Opt(OptOps.UPCAST, 1, 48), "don't upcast more than 16")
  refused(k, Opt(OptOps.UPCAST, 2, 4), "upcast is for non-reduce")
  refused(k, Opt(OptOps.UPCAST, 1, 5), r"5 does not divide \d+")
  k.apply_opt(Opt(OptOps.UPCAST, 1, 16))
  assert k.upcasted == 2


def test_unroll(gpu):
  k = Kernel(Kernel.__init__ and A.sink(A.store(0, F(1, 4, 256).sum(1))), gpu)
  refused(k, Opt(OptOps.UNROLL, 0, 64), "don't unroll more than 32")
  k.apply_opt(Opt(OptOps.UNROLL, 0, 32))
  assert k.full_shape == (4, 8, 32) and k.colors() == ["blue", "red", "magenta"]
  refused(k, Opt(OptOps.UNROLL, 1, 2), "out of range|already upcasted")


def test_local_needs_locals_and_a_global_axis(gpu, cpu):
  k = Kernel(matmul(), gpu)
  refused(k, Opt(OptOps.LOCAL, 2, 4), "local is for globals")
  k.apply_opt(Opt(OptOps.LOCAL, 0, 8))
  assert k.local_dims == 1 and k.colors()[:3] == ["blue", "blue", "cyan"]
  refused(Kernel(matmul(), cpu), Opt(OptOps.LOCAL, 0, 8), "does not support local")


def test_group_checks(gpu, cpu):
  k = Kernel(rowsum(), gpu)
  refused(k, Opt(OptOps.GROUP, 1, 4), "out of range|must be reduce axis")
  k.apply_opt(Opt(OptOps.GROUPTOP, 0, 16))
  assert k.group_for_reduces == 1 and k.colors() == ["blue", "green", "red"]
  refused(Kernel(rowsum(), cpu), Opt(OptOps.GROUP, 0, 16), "does not support local or shared")
  # two reduces over the same axis in parallel (the max and the sum of one row) cannot share a group
  x = F(1, 64, 256)
  par = Kernel(A.sink(A.store(0, x.sum(1)), A.store(2, x.max(1))), gpu)
  refused(par, Opt(OptOps.GROUP, 0, 16), "parallel reduces")


def test_shared_memory_limit(gpu):
  small = LimitsRenderer(has_local=True, has_shared=True, shared_max=64)
  k = Kernel(rowsum(), small)
  refused(k, Opt(OptOps.GROUP, 0, 32), r"exceeds maximum shared memory size: needs 128, max 64")
  k.apply_opt(Opt(OptOps.GROUP, 0, 16))  # 16 * 4 bytes == 64
  # once grouped, every later opt is measured against the limit too (a local multiplies the tile)
  refused(k, Opt(OptOps.LOCAL, 0, 2), "exceeds maximum shared memory")
  big = Kernel(rowsum(), gpu)
  big.apply_opt(Opt(OptOps.GROUP, 0, 16)); big.apply_opt(Opt(OptOps.LOCAL, 0, 2))
  assert big.local_dims == 1


def test_nolocals(gpu, cpu):
  k = Kernel(matmul(), gpu)
  k.apply_opt(Opt(OptOps.NOLOCALS))
  assert k.dont_use_locals and k.colors()[0] == "BLUE"
  refused(k, Opt(OptOps.LOCAL, 0, 4), "not using locals")
  refused(k, Opt(OptOps.NOLOCALS), "meaningless")
  k2 = Kernel(matmul(), gpu)
  k2.apply_opt(Opt(OptOps.LOCAL, 0, 4))
  refused(k2, Opt(OptOps.NOLOCALS), "can't have no locals with locals")
  refused(Kernel(matmul(), cpu), Opt(OptOps.NOLOCALS), "meaningless")


def test_swap(gpu):
  k = Kernel(A.sink(A.store(0, F(1, 8, 4, 6).permute(0, 2, 1) * 2.0)), gpu)
  assert k.global_dims >= 2
  before = k.full_shape
  k.apply_opt(Opt(OptOps.SWAP, 0, 1))
  assert k.full_shape == (before[1], before[0], *before[2:])
  refused(k, Opt(OptOps.SWAP, 1, 0), "swap is only for globals")
  r = Kernel(matmul(), gpu)
  refused(r, Opt(OptOps.SWAP, 0, 2), "swap is only for globals")


def test_padto(gpu):
  k = Kernel(A.sink(A.store(0, (F(1, 60, 62).reshape(60, 62, 1) * F(2, 62, 30).reshape(1, 62, 30)).sum(1))), gpu)
  assert k.full_shape == (60, 30, 62)
  k.apply_opt(Opt(OptOps.PADTO, 0, 64))
  assert k.full_shape == (64, 30, 62)
  k.apply_opt(Opt(OptOps.PADTO, 2, 64))  # a sum of a product: zeros in, zeros out
  assert k.full_shape == (64, 30, 64)
  refused(k, Opt(OptOps.PADTO, 1, 128), "more than quadruple")
  refused(k, Opt(OptOps.PADTO, 0, 32), "nothing was padded")
  # a max over padding would see the zeros; an exp2 of zero is one
  refused(Kernel(A.sink(A.store(0, F(1, 4, 30).max(1))), gpu), Opt(OptOps.PADTO, 1, 32), "cannot pad")
  refused(Kernel(A.sink(A.store(0, F(1, 4, 30).exp2().sum(1))), gpu), Opt(OptOps.PADTO, 1, 32), "cannot pad")
  n = Variable("n", 1, 64)
  refused(Kernel(A.sink(A.store(0, F(1, n, 30) * 2.0)), gpu), Opt(OptOps.PADTO, 0, 32), "symbolic")


def test_padto_of_a_reduce_axis_pads_inputs_and_not_the_reduced_output(gpu):
  k = Kernel(A.sink(A.store(0, (F(1, 30, 40).reshape(30, 40, 1) * F(2, 40, 30).reshape(1, 40, 30)).sum(1))), gpu)
  k.apply_opt(Opt(OptOps.PADTO, 2, 64))
  assert k.sts[0].shape[2] == 1 and k.sts[1].shape[2] == 64 and k.sts[2].shape[2] == 64
  assert k.sts[1].axis_is_masked(2)  # the padding reads as zero
  refused(k, Opt(OptOps.PADTO, 2, 256), "more than quadruple|nothing was padded")


def test_tc_must_be_first(tc_gpu):
  from test_tensor_cores import half_matmul
  k = Kernel(half_matmul(64, 64, 64), tc_gpu)
  k.apply_opt(Opt(OptOps.UPCAST, 0, 2))
  refused(k, Opt(OptOps.TC, 0, 0), "tensor core opts must be first")
  refused(Kernel(half_matmul(64, 64, 64), LimitsRenderer()), Opt(OptOps.TC, 0, 0), "no tensor cores")


def test_upcast_of_tc_locals_is_refused(tc_gpu):
  from test_tensor_cores import half_matmul
  k = Kernel(half_matmul(64, 64, 64), tc_gpu)
  k.apply_opt(Opt(OptOps.TC, 0, 0))
  tc_local = k.global_dims
  refused(k, Opt(OptOps.UPCAST, tc_local, 2), "can't upcast TC locals")
  refused(k, Opt(OptOps.GROUP, 0, 2), "tensor cores|out of range|must be reduce")


@pytest.mark.parametrize("opt,match", [
  (Opt(OptOps.UPCAST, 7, 2), r"UPCAST axis 7 is out of range: this kernel has axes 0\.\.2 \(shape \(64, 48, 32\)\)"),
  (Opt(OptOps.UPCAST, 0, 1), "meaningless"), (Opt(OptOps.UPCAST, 0, -2), "amount must be an int >= 0.*got -2"),
  (Opt(OptOps.LOCAL, -1, 2), "LOCAL's axis must be an int >= 0, got -1"), ("not an opt", "not an Opt: 'not an opt' \\(str\\)"),
  (Opt(OptOps.UPCAST, 0, 5), "does not divide")])
def test_malformed_opts(gpu, opt, match):
  refused(Kernel(matmul(), gpu), opt, match)


def test_amt_zero_means_the_whole_axis(gpu):
  k = Kernel(A.sink(A.store(0, F(1, 64, 3) * 2.0)), gpu)
  k2 = Kernel(A.sink(A.store(0, (F(1, 64, 3).permute(1, 0) * 2.0))), gpu)
  k2.apply_opt(Opt(OptOps.UPCAST, 0, 0))
  assert k2.full_shape[-1] == 3 and k2.upcasted == 1
  assert k.full_shape == (192,)


def test_copy_is_independent(gpu):
  k = Kernel(matmul(), gpu)
  k.apply_opt(Opt(OptOps.UPCAST, 0, 4))
  c = k.copy()
  c.apply_opt(Opt(OptOps.LOCAL, 0, 4))
  assert k.local_dims == 0 and c.local_dims == 1 and len(k.applied_opts) == 1 and len(c.applied_opts) == 2


def test_kernel_state_fields_are_the_kernels_attributes(gpu):
  k = Kernel(matmul(), gpu)
  for f in dataclasses.fields(KernelState): assert getattr(k, f.name) is getattr(k.state, f.name)
  k.upcasted = 3  # writing the attribute writes the state
  assert k.state.upcasted == 3


def test_kernel_declares_exactly_the_state_fields():
  # the Kernel's annotations are what type checkers see of the properties made from KernelState: a field added to
  # one and not the other is a missing or a stale attribute for mypy
  assert {f.name for f in dataclasses.fields(KernelState)} == {n for n in Kernel.__annotations__ if n != "state"}


def test_state_copy_shares_nothing_mutable(gpu):
  k = Kernel(matmul(), gpu)
  k.apply_opt(Opt(OptOps.UPCAST, 0, 4))
  saved = k.state.copy()
  assert saved == k.state and saved.sts is not k.state.sts and saved.applied_opts is not k.state.applied_opts
  assert saved.bufs_for_tensor_core is not k.state.bufs_for_tensor_core
  k.apply_opt(Opt(OptOps.LOCAL, 0, 4))
  assert saved != k.state and saved.local_dims == 0 and len(saved.applied_opts) == 1


def test_a_refused_opt_restores_every_state_field():
  # the work-group check comes after the LOCAL has moved the axes: the rollback has a changed state to undo
  small = LimitsRenderer(has_local=True, has_shared=True, global_max=(65535, 65535, 65535), local_max=(4, 4, 4), shared_max=32768)
  k = Kernel(elementwise(64, 64), small)
  k.apply_opt(Opt(OptOps.UPCAST, 0, 4))
  before = k.state.copy()
  with pytest.raises(KernelOptError, match="work-group of 128 threads"): k.apply_opt(Opt(OptOps.LOCAL, 0, 128))
  assert k.state == before


def test_kc_kernel_is_the_one_kernel_class_and_builds_programs(gpu):
  assert kc.Kernel is Kernel  # one class: the kernel layer calls down into codegen for its UOps and Program
  k = kc.Kernel(elementwise(4, 4), kc.Device["CLANG"].renderer)
  k.apply_opt(Opt(OptOps.UPCAST, 0, 4))
  c = k.copy()
  assert type(c) is kc.Kernel and c.to_program().src == k.to_program(name_override=c.name).src
  assert c.linearize() == k.linearize()


def test_names_are_deterministic_and_source_safe(gpu):
  from kc.codegen import to_function_name
  a, b = Kernel(matmul(), gpu), Kernel(matmul(), gpu)
  na, nb = to_function_name(a.name), to_function_name(b.name)
  # the name is part of the source: the same kernel gets the same name whatever the process compiled before, so its
  # source hits the compile cache of any other process
  assert na == nb == "r_64_48_32" and na.isidentifier()
  assert a.to_program().src == b.to_program().src
  e = Kernel(elementwise(4, 4), gpu)
  assert to_function_name(e.name).startswith("E_16")
  two = Kernel(A.sink(A.store(0, F(1, 4) * 2.0), A.store(1, F(1, 4) + 1.0)), gpu)
  assert to_function_name(two.name).startswith("E2_4")
  copy = Kernel(A.sink(A.store(0, F(1, 4, 4).permute(1, 0))), gpu)
  assert to_function_name(copy.name).startswith("C_")


def test_padto_checks_every_reduce_that_walks_the_axis(gpu):
  # softmax in one kernel: the max and the sum reduce an axis the output keeps; padding it would change both
  x = F(1, 6, 30)
  e = (x - x.max(1, keepdims=True)).exp2()
  k = Kernel(A.sink(A.store(0, e / e.sum(1, keepdims=True))), gpu)
  refused(k, Opt(OptOps.PADTO, 1, 32), "cannot pad the reduce")
  # a sum of a value that is not 0 where the input is padded: x + 1
  refused(Kernel(A.sink(A.store(0, (F(1, 4, 30) + 1.0).sum(1))), gpu), Opt(OptOps.PADTO, 1, 32), "cannot pad")
  # a sum of x*2 pads fine
  ok = Kernel(A.sink(A.store(0, (F(1, 4, 30) * 2.0).sum(1))), gpu)
  ok.apply_opt(Opt(OptOps.PADTO, 1, 32))
  assert ok.full_shape == (4, 32)


def test_padto_refuses_when_a_division_would_see_the_padding(gpu):
  x, y = A.arg(1, dtypes.int32, (9, 8)), A.arg(2, dtypes.int32, (9, 8))
  refused(Kernel(A.sink(A.store(0, x // y)), gpu), Opt(OptOps.PADTO, 0, 32), "divide by zero")
  ok = Kernel(A.sink(A.store(0, x // 3)), gpu)  # a constant divisor is never zero
  ok.apply_opt(Opt(OptOps.PADTO, 0, 32))
  with pytest.raises(kc.UOpError, match="NEG is not defined on bool"): kc.UOp(kc.Ops.NEG, dtypes.bool, (kc.UOp.const(dtypes.bool, True),))
