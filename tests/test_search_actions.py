"""kc.search's action list and next_kernels: every action either applies or is refused with KernelOptError on a
range of kernels and renderers, and each limit drops the candidates that break it before anything is compiled."""
import pytest
import kc
from kc import KernelOptError, Opt, OptOps, dtypes
from kc import ast as A
from kc.kernel import Kernel
from kc.ast.examples import EXAMPLES
from kc.search import SearchLimits, action_list, next_kernels
from kc.search.actions import expand, kernel_limit_violation, local_bytes, program_limit_violation, upcast_cap
from target_renderers import cpu_limits, gpu_limits, tensor_core_gpu_limits


def _renderer(name: str):
  if name == "gpu": return gpu_limits()
  if name == "tc_gpu": return tensor_core_gpu_limits()
  if name not in kc.Device: pytest.skip(f"{name} is not installed")
  return kc.Device.renderer(name)


def _kernels() -> dict:
  sinks = {name: EXAMPLES[name].build()[0] for name in ("add", "sum", "matmul", "conv2d", "softmax")}
  # a reduce with few outputs and a long reduce axis: the hand-coded kernel groups it into work-groups (locals)
  sinks["reduce_locals"] = A.sink(A.store(0, A.arg(1, dtypes.float32, (4, 1024)).sum(1)))
  # a half matmul that the tensor cores take
  sinks["matmul_half"] = A.sink(A.store(0, (A.arg(1, dtypes.float16, (16, 16)) @ A.arg(2, dtypes.float16, (16, 16))).astype(dtypes.float32)))
  return sinks


KERNELS = _kernels()
RENDERERS = ["CLANG", "OPENCL", "CUDA", "gpu", "tc_gpu"]


@pytest.mark.parametrize("rname", RENDERERS)
def test_every_action_applies_or_is_refused(rname):
  r = _renderer(rname)
  acts = action_list(r)
  applied: dict[OptOps, int] = {}
  for sink in KERNELS.values():
    base = Kernel(sink, r)
    for start in (base, base.copy().hand_coded_optimizations()):
      for opt in acts:
        k = start.copy()
        before = list(k.applied_opts)
        try: k.apply_opt(opt)
        except KernelOptError:
          assert k.applied_opts == before  # a refused opt leaves the kernel as it was
          continue
        # anything but KernelOptError propagates and fails the test: a bug in the Kernel
        applied[opt.op] = applied.get(opt.op, 0) + 1
        assert k.applied_opts[-1] == opt
  assert sum(applied.values()) > 100  # the list is not all refusals
  assert {OptOps.UPCAST, OptOps.UNROLL, OptOps.SWAP, OptOps.PADTO} <= set(applied)
  if r.has_local: assert {OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.NOLOCALS} <= set(applied)
  if r.tensor_cores: assert applied.get(OptOps.TC, 0) > 0  # the half matmul takes a tensor core


def test_the_action_list_follows_the_renderer():
  cpu, gpu, tc = action_list(cpu_limits()), action_list(gpu_limits()), action_list(tensor_core_gpu_limits())
  ops = lambda acts: {a.op for a in acts}
  assert ops(cpu) == {OptOps.UPCAST, OptOps.UNROLL, OptOps.PADTO, OptOps.SWAP}  # no locals, no shared memory, no tensor cores
  assert ops(gpu) == set(OptOps) - {OptOps.TC}
  assert ops(tc) == set(OptOps) and all(a.amt == 2 for a in tc if a.op is OptOps.TC)
  assert Opt(OptOps.UPCAST, 0, 0) in cpu and Opt(OptOps.UNROLL, 0, 0) in cpu  # whole axes
  # no LOCAL or GROUP wider than a work-group may be
  small = gpu_limits()
  small.local_max = (8, 8, 1)
  assert max(a.amt for a in action_list(small) if a.op in (OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP)) <= 64
  assert max(a.amt for a in gpu if a.op is OptOps.GROUPTOP) == 256


def test_upcast_amounts_reach_the_widest_vector():
  if "CLANG" not in kc.Device: pytest.skip("CLANG is not installed")
  r = kc.Device.renderer("CLANG")
  widest = max(r.vector_widths(dtypes.float32))
  assert Opt(OptOps.UPCAST, 0, min(widest, 16)) in action_list(r)
  assert not any(a.op in (OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.NOLOCALS) for a in action_list(r))


def test_next_kernels_are_copies_with_one_more_opt():
  sink = KERNELS["matmul"]
  k = Kernel(sink, gpu_limits())
  children = next_kernels(k, action_list(k.renderer))
  assert len(children) > 10 and not k.applied_opts  # the parent is not changed
  for opt, child in children: assert child.applied_opts == [opt] and child is not k
  assert (Opt(OptOps.LOCAL, 0, 4) in [o for o, _ in children])
  # an action the Kernel refuses is left out
  assert Opt(OptOps.UNROLL, 3, 2) not in [o for o, _ in children]


def test_the_upcast_limit_drops_candidates():
  k = Kernel(KERNELS["add"], gpu_limits())
  limits = SearchLimits(upcast_max=4)
  kept, dropped = expand(k, [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 0, 8)], limits)
  assert [c.opt for c in kept] == [Opt(OptOps.UPCAST, 0, 4)]
  assert [c.opt for c in dropped] == [Opt(OptOps.UPCAST, 0, 8)] and "8 upcast lanes, more than 4" in dropped[0].reason
  assert next_kernels(k, [Opt(OptOps.UPCAST, 0, 8)], limits) == []


def test_the_upcast_cap_counts_wide_vectors():
  wide = cpu_limits()
  wide.vector_alu = True
  wide.vector_widths = lambda dt: (16, 8, 4)
  assert upcast_cap(wide, SearchLimits(upcast_max=256)) == 1024 and upcast_cap(cpu_limits(), SearchLimits(upcast_max=256)) == 256


def test_the_work_group_limit_drops_candidates():
  r = gpu_limits()
  k = Kernel(KERNELS["matmul"], r)
  k.apply_opt(Opt(OptOps.LOCAL, 0, 16))
  assert kernel_limit_violation(k) is None
  # the same kernel on a renderer that launches at most 8 threads per work-group
  r.local_max = (2, 2, 2)
  assert "work-group of 16 threads" in kernel_limit_violation(k)
  kept, dropped = expand(k, [Opt(OptOps.UPCAST, 1, 4)])
  assert not kept and "work-group" in dropped[0].reason


def test_the_shared_memory_limit_drops_candidates():
  r = gpu_limits()
  k = Kernel(KERNELS["reduce_locals"], r)
  k.apply_opt(Opt(OptOps.GROUPTOP, 0, 256))
  prg = k.to_program()
  assert local_bytes(prg.uops) == 4 * 256  # one float per thread of the work-group
  assert program_limit_violation(prg, r) is None
  small = gpu_limits()
  small.shared_max = 512
  assert "1024 bytes of local memory, more than shared_max 512" in program_limit_violation(prg, small)


def test_the_uop_limit_drops_candidates():
  k = Kernel(KERNELS["matmul"], gpu_limits())
  kept, dropped = expand(k, action_list(k.renderer), SearchLimits(uops_max=20))
  assert not kept and dropped and all("UOps, more than 20" in c.reason for c in dropped)
  kept, dropped = expand(k, action_list(k.renderer))
  assert kept and all(c.program is not None and len(c.program.uops) <= 3000 for c in kept)
