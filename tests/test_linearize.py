"""The linearizer: a valid order, balanced blocks, accumulators declared outside their loops, loop-invariant
code hoisted, fused chains as sibling loops, gated stores in IF blocks."""
from kc import Ops, dtypes, ast as A, Kernel, Opt, OptOps

F = lambda i, *s: A.arg(i, dtypes.float32, s)  # noqa: E731


def check_structure(uops):
  pos = {u: i for i, u in enumerate(uops)}
  stack = []
  loop_of = {}
  for i, u in enumerate(uops):
    for s in u.src:
      if s.op is not Ops.RANGE: assert s in pos and pos[s] < i, f"{u.op} uses {s.op} before it is defined"
    if u.op in (Ops.RANGE, Ops.IF): stack.append(u)
    elif u.op in (Ops.ENDRANGE, Ops.ENDIF):
      assert stack and stack[-1] is u.src[0], "blocks close in reverse order of opening"
      stack.pop()
    loop_of[u] = tuple(x for x in stack if x.op is Ops.RANGE)
    if u.op is Ops.DEFINE_ACC:
      for r in u.src[1:]: assert r not in loop_of[u], "an accumulator is declared outside its own loops"
  assert not stack
  return loop_of


def test_matmul_order_and_hoisting(cpu):
  k = Kernel(A.sink(A.store(0, (F(1, 8, 4).reshape(8, 4, 1) * F(2, 4, 6).reshape(1, 4, 6)).sum(1))), cpu)
  uops = k.linearize()
  loop_of = check_structure(uops)
  ranges = [u for u in uops if u.op is Ops.RANGE]
  assert len(ranges) == 3
  loads = [u for u in uops if u.op is Ops.LOAD]
  # the loads depend on the reduce loop; the store does not and sits after it, in the output loops only
  assert all(ranges[2] in loop_of[ld] for ld in loads)
  store = next(u for u in uops if u.op is Ops.STORE)
  assert ranges[2] not in loop_of[store] and set(ranges[:2]) <= set(loop_of[store])


def test_loop_invariant_load_is_hoisted(cpu):
  # row + column-sum: the row load does not depend on the reduce loop over the other axis
  x, y = F(1, 8, 16), F(2, 8, 1)
  k = Kernel(A.sink(A.store(0, (x * y).sum(1))), cpu)
  uops = k.linearize()
  loop_of = check_structure(uops)
  reduce_loop = [u for u in uops if u.op is Ops.RANGE][-1]
  y_load = next(u for u in uops if u.op is Ops.LOAD and u.src[0].src[0].arg == 2)
  assert reduce_loop not in loop_of[y_load]


def test_fused_chain_loops_are_siblings(cpu):
  x = F(1, 4, 32)
  k = Kernel(A.sink(A.store(0, (x - x.max(1, keepdims=True)).exp2().sum(1))), cpu)
  uops = k.linearize()
  loop_of = check_structure(uops)
  ranges = [u for u in uops if u.op is Ops.RANGE]
  assert len(ranges) == 3  # the row loop, then the max loop, then the sum loop after it
  first_end = next(i for i, u in enumerate(uops) if u.op is Ops.ENDRANGE and u.src[0] is ranges[1])
  assert uops.index(ranges[2]) > first_end and ranges[1] not in loop_of[ranges[2]]


def test_gated_store_gets_an_if_block(gpu):
  k = Kernel(A.sink(A.store(0, F(1, 64, 256).sum(1))), gpu)
  k.apply_opt(Opt(OptOps.GROUPTOP, 0, 16))
  uops = k.linearize()
  check_structure(uops)
  ifs = [u for u in uops if u.op is Ops.IF]
  assert len(ifs) == 1 and uops[uops.index(ifs[0]) + 1].op is Ops.STORE and uops[uops.index(ifs[0]) + 2].op is Ops.ENDIF
  barrier = next(u for u in uops if u.op is Ops.BARRIER)
  assert not any(u.op is Ops.IF for u in uops[:uops.index(barrier)]), "no thread may skip the barrier"


def test_deterministic(gpu):
  build = lambda: Kernel(A.sink(A.store(0, (F(1, 32, 16).reshape(32, 16, 1) * F(2, 16, 8).reshape(1, 16, 8)).sum(1))), gpu)  # noqa: E731
  a, b = build().hand_coded_optimizations(), build().hand_coded_optimizations()
  assert [(u.op, u.arg) for u in a.linearize()] == [(u.op, u.arg) for u in b.linearize()]
