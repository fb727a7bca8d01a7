"""Lowering: launch dims fitted to the renderer's limits, and the lowered graph's shape."""
import itertools
import pytest
from hypothesis import given, settings, strategies as st
from kc import Ops, UOp, dtypes, KernelOptError, ast as A, Opt, OptOps, Kernel, sym_infer
from kc.codegen.lower import get_grouped_dims, lower


def launch_values(sizes):
  return itertools.product(*[range(s) for s in sizes])


def check_bijection(dims, max_sizes, reverse):
  idxs, sizes, guard = get_grouped_dims("g", dims, max_sizes, reverse)
  assert len(sizes) == max(len(max_sizes), 0) and all(s <= m for s, m in zip(sizes, max_sizes))
  specials = {u.arg[0]: u for x in idxs for u in x.toposort if u.op is Ops.SPECIAL}
  seen = set()
  for vals in launch_values(sizes):
    env = {specials[f"g{a}"]: v for a, v in enumerate(vals) if f"g{a}" in specials}
    at = {k: UOp.const(dtypes.int32, v) for k, v in env.items()}
    if guard is not None and not sym_infer(guard.substitute(at), {}): continue  # an extra launch index: gated off
    point = tuple(sym_infer(x.substitute(at), {}) for x in idxs)
    assert all(0 <= p < d for p, d in zip(point, dims)), (point, dims)
    seen.add(point)
  assert len(seen) == max(1, __import__("math").prod(dims)), "every index of the dims is reached"
  if guard is None: assert __import__("math").prod(sizes) == max(1, __import__("math").prod(dims)), "and exactly once"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 3, 7, 16, 100, 70000]), min_size=1, max_size=5),
       st.sampled_from([(16, 16, 16), (1024, 1024, 64), (65535, 65535, 65535), (2**31 - 1, 65535, 65535), (32, 16, 8)]), st.booleans())
def test_grouped_dims_are_simplified(dims, max_sizes, reverse):
  # the indices come out in the form simplify gives them (a dim alone on its axis is that axis's index, one of size
  # 1 is 0): the lowering builds on them without simplifying them again
  try: idxs, _, guard = get_grouped_dims("g", tuple(dims), max_sizes, reverse)
  except KernelOptError: return
  assert all((x * 1 + 0).simplify() is x for x in idxs) and (guard is None or guard is guard.simplify())


@pytest.mark.parametrize("dims,max_sizes,reverse,sizes", [
  ((4, 5, 6), (16, 16, 16), True, [6, 5, 4]),        # globals: the last dim goes to x
  ((4, 5, 6), (16, 16, 16), False, [4, 5, 6]),
  ((2, 3, 4, 5), (16, 16, 16), False, [6, 4, 5]),     # one dim too many: collapse onto the first axis with room
  ((100000,), (65535, 65535, 65535), False, [50000, 2, 1]),  # too large for x: split across x and y
  ((256,), (8, 8, 8), False, [8, 8, 4]),              # and across all three
  ((7,), (16, 16, 16), False, [7, 1, 1]),             # padded with 1s
])
def test_grouped_dims(dims, max_sizes, reverse, sizes):
  assert get_grouped_dims("g", dims, max_sizes, reverse)[1] == sizes and get_grouped_dims("g", dims, max_sizes, reverse)[2] is None
  if __import__("math").prod(dims) <= 5000: check_bijection(dims, max_sizes, reverse)


def test_grouped_dims_that_cannot_fit_name_both_shapes():
  with pytest.raises(KernelOptError, match=r"dims \(3, 5, 7, 11\).*\(8, 8, 8\)"): get_grouped_dims("g", (3, 5, 7, 11), (8, 8, 8))
  with pytest.raises(KernelOptError, match="no axis left"): get_grouped_dims("g", (97,), (16,))


def test_a_prime_dim_over_the_limit_is_launched_rounded_up_and_guarded():
  idxs, sizes, guard = get_grouped_dims("g", (97,), (16, 16, 16))
  assert sizes == [16, 7, 1] and guard is not None
  check_bijection((97,), (16, 16, 16), False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=5), st.lists(st.integers(2, 64), min_size=1, max_size=3), st.booleans())
def test_grouped_dims_cover_every_index_once(dims, max_sizes, reverse):
  try: check_bijection(tuple(dims), tuple(max_sizes), reverse)
  except KernelOptError: pass  # an unfittable case: the error is the answer, tested above


def test_small_global_max_splits_a_kernel_over_axes(gpu):
  r = type(gpu)(has_local=True, has_shared=True, global_max=(8, 8, 8), local_max=(4, 4, 4))
  k = Kernel(A.sink(A.store(0, A.arg(1, dtypes.float32, (256,)) * 2.0)), r)
  prg = k.to_program()
  assert all(g <= 8 for g in prg.global_size) and 256 == __import__("math").prod(prg.global_size) * __import__("math").prod(prg.local_size or [1])


def test_upcasts_are_unrolled_and_accumulators_shared(cpu):
  x = A.arg(1, dtypes.float32, (16, 64))
  k = Kernel(A.sink(A.store(0, (x - x.max(1, keepdims=True)).exp2().sum(1))), cpu)
  k.apply_opt(Opt(OptOps.UNROLL, 0, 4))
  sink = lower(k.get_optimized_ast(), cpu)
  ops = [u.op for u in sink.toposort]
  assert Ops.EXPAND not in ops and Ops.CONTRACT not in ops and Ops.REDUCE_AXIS not in ops and Ops.VIEW not in ops
  accs = [u for u in sink.toposort if u.op is Ops.DEFINE_ACC]
  assert len(accs) == 8  # the max and the sum, each with one accumulator per unrolled lane
  # the chain's second reduce has a loop of its own: the two reduces' accumulators walk different RANGEs
  loops = {a.src[1:] for a in accs}
  assert len(loops) == 2 and set(next(iter(loops))).isdisjoint(list(loops)[1])


def test_upcast_lanes_that_reduce_the_same_values_share_an_accumulator(cpu):
  # softmax's max and sum reduce the axis the output keeps: every upcast lane of that axis reduces the same row
  x = A.arg(1, dtypes.float32, (4, 16))
  e = (x - x.max(1, keepdims=True)).exp2()
  k = Kernel(A.sink(A.store(0, e / e.sum(1, keepdims=True))), cpu)
  k.apply_opt(Opt(OptOps.UPCAST, 1, 4))
  accs = [u for u in lower(k.get_optimized_ast(), cpu).toposort if u.op is Ops.DEFINE_ACC]
  # the reduced axis is 4 loop steps x 4 unrolled lanes: 4 accumulators per reduce, shared by the 4 output lanes
  assert len(accs) == 2 * 4


def _lowering_with_upcasts():
  """A Lowering whose last axis (8 wide) is upcast, so that it has a lane placeholder."""
  from kc.codegen.lower import Lowering
  from target_renderers import LimitsRenderer
  cpu = LimitsRenderer(has_local=False, has_shared=False, global_max=None, local_max=None)
  k = Kernel(A.sink(A.store(0, A.arg(1, dtypes.float32, (16, 32)) + 1.0)), cpu)
  k.apply_opt(Opt(OptOps.UPCAST, 0, 8))  # the kernel's one (merged) axis of 512
  return Lowering(k.get_optimized_ast(), cpu.has_local, cpu.global_max, cpu.local_max)


@settings(max_examples=200, deadline=None)
@given(st.integers(-4, 4), st.integers(-4, 4), st.integers(-4, 4), st.integers(1, 5), st.integers(-8, 8), st.integers(-30, 30),
       st.integers(0, 7), st.booleans())
def test_a_lane_check_decided_by_ranges_holds_everywhere(kx, kl, kd, d, c, bound, lane, negate):
  lw = _lowering_with_upcasts()
  axis = len(lw.full_shape) - 1
  h, x, y = lw.holder(axis), UOp.variable("x", 0, 5), UOp.variable("y", 0, 3)
  # a placeholder as a plain term and inside a division (where only its whole range can count)
  clause = ((x * kx + h * kl + (h * kd + y + 8) // d + c) < bound).simplify()
  if negate: clause = clause.logical_not()
  known = lw.decided(clause, {axis: lane})
  for xv, yv in itertools.product(range(6), range(4)):
    truth = sym_infer(clause, {"x": xv, "y": yv, h.arg[0]: lane})
    if known is not None: assert bool(truth) == known, (clause.render(), xv, yv, lane)
