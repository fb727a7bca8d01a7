"""verify_ast on well-formed and malformed ASTs, and fused reduce chains through the Kernel."""
import pytest
from kc import ast as A, dtypes, Ops, UOp, InvalidASTError, ShapeTracker, KernelOptError
from kc.kernel import Kernel, Opt, OptOps
from kc.codegen import verify_ast

F = lambda i, *s: A.arg(i, dtypes.float32, s)  # noqa: E731
ST = lambda *s: ShapeTracker.from_shape(s).to_uop()  # noqa: E731


def gbuf(i, dt=dtypes.float32): return UOp(Ops.DEFINE_GLOBAL, dt.ptr(), (), i)
def load(i, *shape, dt=dtypes.float32): return UOp(Ops.LOAD, dt, (gbuf(i, dt), ST(*shape)))
def store(i, value, *shape): return UOp(Ops.STORE, dtypes.void, (gbuf(i, value.dtype), ST(*shape), value))
def sink(*stores): return UOp(Ops.SINK, dtypes.void, stores)


def test_valid_ast_gives_every_shape():
  x = load(1, 4, 8)
  r = UOp(Ops.REDUCE_AXIS, dtypes.float32, (x,), (Ops.ADD, (1,)))
  sts = verify_ast(sink(store(0, r, 4, 1)))
  assert sts[x].shape == (4, 8) and sts[r].shape == (4, 1)


@pytest.mark.parametrize("build,match", [
  (lambda: load(1, 4), "SINK of STOREs"),
  (lambda: sink(load(1, 4)), "every source must be a STORE"),
  (lambda: sink(store(0, load(1, 4), 4), store(1, load(2, 8), 8)), "one size"),
  (lambda: sink(store(0, load(1, 4, 4) + load(2, 4, 1), 4, 4)), "implicit expand"),
  (lambda: sink(store(0, load(1, 4, 4) + load(2, 2, 8), 4, 4)), "implicit reshape"),
  (lambda: sink(store(0, load(1, 4, 4), 16, 1)), "does not match the value's shape"),
  (lambda: sink(store(0, UOp(Ops.REDUCE_AXIS, dtypes.float32, (load(1, 4, 4),), (Ops.ADD, (2,))), 4, 1)), "axes"),
  (lambda: sink(store(0, UOp(Ops.REDUCE_AXIS, dtypes.float32, (load(1, 4, 4),), (Ops.SQRT, (1,))), 4, 1)), "arg is"),
  (lambda: sink(UOp(Ops.STORE, dtypes.void, (gbuf(0, dtypes.int32), ST(4), load(1, 4)))), "cast the value first"),
  (lambda: sink(UOp(Ops.STORE, dtypes.void, (gbuf(0), UOp.const(dtypes.int32, 1), load(1, 4)))), "needs a VIEW"),
  (lambda: sink(store(0, UOp(Ops.VIEW, dtypes.float32, (load(1, 4, 4) * 2.0,), ShapeTracker.from_shape((4, 4)).permute((1, 0))), 4, 4)),
   "only expand its size-1 dims"),
  (lambda: sink(store(0, load(1, 4, 4), 4, 4), store(1, load(2, 16), 16)), "same number of dims|one size|one shape"),
])
def test_malformed_asts(build, match):
  with pytest.raises(InvalidASTError, match=match): verify_ast(build())


def test_builder_rejects_illegal_combinations():
  x = F(1, 4, 8)
  with pytest.raises(InvalidASTError, match="do not broadcast"): x + F(2, 3, 8)
  with pytest.raises(InvalidASTError, match="unknown dtype"): A.arg(1, "float", (4,))
  with pytest.raises(InvalidASTError, match="out of range"): x.sum(2)
  with pytest.raises(TypeError, match="bool or int"): x & 2
  with pytest.raises(InvalidASTError, match="same buffer index"): A.sink(A.store(0, x), A.store(0, x))
  with pytest.raises(InvalidASTError): x.reshape(5, 7)


def softmax_denominator(R=16, C=64):
  x = F(1, R, C)
  return A.sink(A.store(0, (x - x.max(1, keepdims=True)).exp2().sum(1)))


def variance(R=16, C=64):
  x = F(1, R, C)
  mean = x.sum(1, keepdims=True) * (1 / C)
  return A.sink(A.store(0, ((x - mean) * (x - mean)).sum(1) * (1 / C)))


@pytest.mark.parametrize("build", [softmax_denominator, variance])
def test_fused_reduce_chains_are_one_kernel(build, gpu):
  ast = build()
  reduces = [u for u in ast.toposort if u.op is Ops.REDUCE_AXIS]
  assert len(reduces) == 2 and any(u.op is Ops.VIEW and u.src for u in ast.toposort)
  k = Kernel(ast, gpu)
  assert k.full_shape == (16, 64) and len(k.broadcasts) >= 1 and len(k.sts) == len(k.bufs) + 4 + len(k.broadcasts)
  # the chain's two reduces share an axis: grouping them is refused; everything else applies and verifies
  with pytest.raises(KernelOptError, match="parallel reduces"): k.apply_opt(Opt(OptOps.GROUP, 0, 4))
  for opt in [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.LOCAL, 0, 2)]: k.apply_opt(opt)
  opt_ast = k.get_optimized_ast()
  verify_ast(opt_ast, optimized=True)
  views = [u for u in opt_ast.toposort if u.op is Ops.VIEW and u.src]
  assert views and all(v.arg.shape == k.full_shape for v in views)
  hand = Kernel(build(), gpu).hand_coded_optimizations()
  verify_ast(hand.get_optimized_ast(), optimized=True)


def test_grouped_reduce_goes_through_local_memory(gpu):
  k = Kernel(A.sink(A.store(0, F(1, 64, 256).sum(1))), gpu)
  k.apply_opt(Opt(OptOps.GROUPTOP, 0, 16))
  ast = k.get_optimized_ast()
  verify_ast(ast, optimized=True)
  local = [u for u in ast.toposort if u.op is Ops.DEFINE_LOCAL]
  reduces = [u for u in ast.toposort if u.op is Ops.REDUCE_AXIS]
  assert len(local) == 1 and local[0].arg == ("temp1", 16) and len(reduces) == 2
  assert ast.arg.local_dims == 0 and ast.arg.upcasted == 0


def test_one_buffer_declared_with_two_sizes_is_refused():
  from kc import ast as A
  a, b = A.arg(1, dtypes.float32, (4,)), A.arg(1, dtypes.float32, (8,))[:4]
  with pytest.raises(InvalidASTError, match="buffer 1 is declared with 4 and with 8 elements"): A.sink(A.store(0, a + b))
  A.sink(A.store(0, a + A.arg(1, dtypes.float32, (2, 2)).reshape(4)))  # one size, two shapes: the same buffer
