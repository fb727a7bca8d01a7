"""What codegen does for speed changes no answer: its memo tables give exactly what the uncached computation would,
for every UOp asked (an entry keyed too coarsely, by op, dtype or arg instead of the UOp itself, would hand one node's
answer to another), and the graphs a pass is done with are freed as soon as it returns."""
import gc, weakref
import pytest
from hypothesis import given, settings, strategies as st
from kc import ast as A
from kc.kernel import Kernel
from kc.codegen.graph import rewrite_lowered
from kc.codegen.lower import lower
from kc.ir.dtype import dtypes
from kc.ir.uop import Ops, UOp
from kc.codegen.vectorize import _accumulator_trees, accumulators_under, passing_toposort


def _accumulators(n: int) -> list[UOp]:
  loop = UOp.range(dtypes.int32, 0, 16, 0)
  return [UOp(Ops.DEFINE_ACC, dtypes.float32, (UOp.const(dtypes.float32, 0.0), loop), (i,)) for i in range(n)]


# a recipe for a graph: each step combines two earlier nodes (by index) with ADD or MUL
steps = st.lists(st.tuples(st.sampled_from([Ops.ADD, Ops.MUL]), st.integers(0, 1000), st.integers(0, 1000)), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(steps)
def test_accumulators_under_each_uop_match_its_toposort(recipe):
  accs = _accumulators(3)
  nodes = [*accs, UOp.const(dtypes.float32, 1.5), UOp.const(dtypes.float32, 2.0)]
  for op, a, b in recipe: nodes.append(UOp(op, dtypes.float32, (nodes[a % len(nodes)], nodes[b % len(nodes)])))
  under = accumulators_under(UOp(Ops.SINK, dtypes.void, tuple(nodes)).toposort)
  for x in nodes: assert under[x] == {u for u in x.toposort if u.op is Ops.DEFINE_ACC}


def _walked_leaves(u: UOp) -> list[UOp]:
  """The leaves of u's tree of its own op and dtype, by walking it (a shared subtree each time it is reached: at
  most 2**14 leaves for the graphs below)."""
  return [y for x in u.src for y in (_walked_leaves(x) if x.op is u.op and x.dtype == u.dtype else [x])]


@settings(max_examples=300, deadline=None)
@given(steps.filter(lambda r: len(r) <= 14), st.sampled_from([(), (2,), (8, 4, 2), (16, 8, 4, 2)]))
def test_accumulator_trees_match_a_walk_of_each_tree(recipe, declared):
  accs = _accumulators(4)
  one = UOp.const(dtypes.float32, 1.5)
  # updates of accumulators by ADD and by MUL, a float64 value and a plain constant: leaves of every kind
  nodes = [UOp(Ops.ASSIGN, dtypes.float32, (a, UOp(op, dtypes.float32, (a, one))))
           for a, op in zip(accs, (Ops.ADD, Ops.ADD, Ops.MUL, Ops.ADD))] + [one, UOp.const(dtypes.float64, 2.0)]
  for op, a, b in recipe:
    x, y = nodes[a % len(nodes)], nodes[b % len(nodes)]
    if x.dtype != y.dtype: y = UOp(Ops.CAST, x.dtype, (y,))
    nodes.append(UOp(op, x.dtype, (x, y)))
  topo = list(UOp(Ops.SINK, dtypes.void, tuple(nodes)).toposort)
  found = _accumulator_trees(topo, lambda dt: declared)
  for u in topo:
    if u.op not in (Ops.ADD, Ops.MUL): continue
    leaves = _walked_leaves(u)
    updates = all(x.op is Ops.ASSIGN and x.src[0].op is Ops.DEFINE_ACC and x.src[1].op is u.op for x in leaves)
    assert (u in found) == (len(leaves) in declared and updates)


def test_the_passes_leave_their_input_graphs_to_reference_counting():
  # a cached toposort holds its sink (a reference cycle): a pass that cached one on the lowered graph kept tens of
  # thousands of UOps alive until the cyclic collector found them, and every collection until then walked them
  renderer = pytest.importorskip("kc_clang.renderer").ClangRenderer(native=False)
  renderer.float_lanes = 16
  F = lambda i, *s: A.arg(i, dtypes.float32, s)  # noqa: E731
  k = Kernel(A.sink(A.store(0, (F(1, 64, 64).reshape(64, 64, 1) * F(2, 64, 64).reshape(1, 64, 64)).sum(1))), renderer)
  k.hand_coded_optimizations()
  optimized = k.get_optimized_ast()
  was_on = gc.isenabled()
  gc.disable()
  try:
    lowered = lower(optimized, renderer)
    alive = weakref.ref(lowered)
    out = rewrite_lowered(lowered, renderer)
    assert any(u.op is Ops.DEFINE_ACC and u.dtype.count == 16 for u in passing_toposort(out))  # the vector passes ran
    # (the rewritten graph may be the lowered one where no pass changed it: both dropped, nothing keeps it)
    del lowered, out
    assert alive() is None
  finally:
    if was_on: gc.enable()


def test_codegen_pauses_the_collector_and_restores_its_state():
  from kc.codegen.program import collector_paused, render_program
  seen = []

  class Watching(pytest.importorskip("kc_clang.renderer").ClangRenderer):
    def render(self, name, uops):
      seen.append(gc.isenabled())
      return super().render(name, uops)

  F = lambda i, *s: A.arg(i, dtypes.float32, s)  # noqa: E731
  ast = A.sink(A.store(0, F(1, 8) + F(2, 8)))
  renderer = Watching(native=False)
  was_on = gc.isenabled()
  try:
    for on in (True, False):
      (gc.enable if on else gc.disable)()
      k = Kernel(ast, renderer)
      render_program(k.get_optimized_ast(), renderer, "k", k.ast)
      assert gc.isenabled() is on  # a collector the caller turned off stays off
    gc.enable()
    with collector_paused():  # nested: the outermost pause turns it back on
      with pytest.raises(ZeroDivisionError), collector_paused(): _ = 1 / 0
      assert not gc.isenabled()
    assert gc.isenabled()
  finally:
    (gc.enable if was_on else gc.disable)()
  assert seen == [False, False]


def _lowered_both_ways(ast, renderer, monkeypatch):
  """The lowering of `ast` as it is, and with no value shared between the lanes of an upcast axis (every value
  lowered at every lane, as each lane's environment asks)."""
  from kc.codegen import lower as lowering
  with monkeypatch.context() as m:
    # lane by lane: the vector axis computes all of its lanes at once, whatever they share (test_vector_axis below)
    m.setattr(lowering.Lowering, "choose_vector_axis", lambda self: None)
    fast = lowering.lower(ast, renderer)
    m.setattr(lowering.Lowering, "ignored_axes", lambda self, u: ())
    slow = lowering.lower(ast, renderer)
  return fast, slow


@pytest.mark.parametrize("name", ["softmax", "layernorm", "variance", "matmul", "conv2d", "attention", "standardize", "argmax", "sum"])
def test_a_value_shared_across_lanes_lowers_as_each_lane_would(name, monkeypatch):
  # a value lowered once for the lanes of an upcast axis it does not vary along (a row's max read by every lane of a
  # softmax row) must be exactly what each lane's own lowering gives: the same graph, node for node
  from kc.ast.examples import EXAMPLES
  from kc.errors import KernelOptError
  from kc.kernel import Opt, OptOps
  from kc.schedule import schedule
  from target_renderers import MiniC
  clang = pytest.importorskip("kc_clang.renderer").ClangRenderer(native=False)
  clang.float_lanes = 16
  shared = 0
  for kernel in schedule(EXAMPLES[name].build()[0]).kernels:
    candidates = [Kernel(kernel.ast, r).hand_coded_optimizations() for r in (clang, MiniC())]
    tc = Kernel(kernel.ast, MiniC(), tc_level=2)
    try: tc.apply_opt(Opt(OptOps.TC, 0, 2))
    except KernelOptError: pass  # no tensor core fits this kernel
    else: candidates.append(tc)
    for k in candidates:
      fast, slow = _lowered_both_ways(k.get_optimized_ast(), k.renderer, monkeypatch)
      assert fast is slow
      shared += k.upcasted > 0
  assert shared  # some kernel had lanes to share values between

