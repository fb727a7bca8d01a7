"""kc.codegen.widen: the value trees of a tile's narrow stores that compute the same ops become one vector of a declared
width, each store taking its own lanes, with every stored value the same. A numpy evaluator of the graph is the
oracle (each lane of a store must hold what it held before, bit for bit); EMU runs whole kernels so rewritten against
numpy."""
from collections import deque
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
import kc
from kc import ast as A, dtypes
from kc.codegen.widen import widen_stores
from kc.emu import DEVICE, impersonating
from kc.ir.uop import Ops, UOp
from kc.kernel import Kernel
from kc.kernel.heuristics import hand_coded_optimizations
from test_horizontal import VectorEmu

F32 = dtypes.float32
NP = {Ops.ADD: np.add, Ops.SUB: np.subtract, Ops.MUL: np.multiply, Ops.FDIV: np.divide, Ops.MAX: np.maximum,
      Ops.EXP2: np.exp2, Ops.NEG: np.negative, Ops.CMPLT: np.less, Ops.WHERE: np.where}
FUNCTIONS = frozenset({Ops.EXP2, Ops.MAX})


def every_width(dt): return (16, 8, 4, 2) if dt == F32 else ()


def leaf(i: int, width: int) -> UOp:
  """A distinct value the evaluator is handed (an accumulator's result, a loaded row)."""
  return UOp(Ops.DEFINE_ACC, F32.vec(width) if width > 1 else F32, (UOp.const(F32, 0.0),), (i,))


def buf() -> UOp: return UOp(Ops.DEFINE_GLOBAL, F32.ptr(), (), 0)


def store(value: UOp, offset: int, root=None, gate=None) -> UOp:
  off = UOp.const(dtypes.int32, offset) if root is None else root + offset
  return UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, F32.ptr(), (buf(), off) + ((gate,) if gate is not None else ())), value))


def evaluate(u: UOp, values: dict, memo: dict):
  if u in memo: return memo[u]
  if u.op is Ops.DEFINE_ACC: ret = values[u]
  elif u.op is Ops.CONST: ret = np.array(u.arg, dtype=np.float32 if u.dtype.scalar() == F32 else None)
  elif u.op is Ops.GEP: ret = np.atleast_1d(evaluate(u.src[0], values, memo))[u.arg[0]]
  elif u.op is Ops.VECTORIZE: ret = np.array([evaluate(s, values, memo) for s in u.src])
  elif u.op is Ops.STORE: ret = (u.src[0].src[1], np.atleast_1d(evaluate(u.src[1], values, memo)))
  elif u.op in (Ops.SINK, Ops.INDEX): ret = tuple(evaluate(s, values, memo) for s in u.src)
  else:
    out = NP[u.op](*(evaluate(s, values, memo) for s in u.src))
    ret = out if u.dtype.scalar() == dtypes.bool else np.asarray(out, dtype=np.float32)
  memo[u] = ret
  return ret


def stored(sink: UOp, values: dict) -> dict:
  """What each store writes, by its offset expression."""
  memo: dict = {}
  return {s.src[0].src[1]: evaluate(s, values, memo)[1].tobytes() for s in sink.src}


def gelu_like(x: UOp, bias: UOp) -> UOp:
  """Enough arithmetic to be worth widening: y = x + bias; y * (1 / (1 + exp2(-y))), with a select on the sign."""
  y = x + bias
  s = UOp.const(y.dtype, 1.0) / (UOp.const(y.dtype, 1.0) + (-y).alu(Ops.EXP2))
  return (y < UOp.const(y.dtype, 0.0)).where(y * s, y * s * UOp.const(y.dtype, 1.0))


def random_tree(draw, width: int, leaves: list[UOp], shared: UOp, depth: int, i: int) -> UOp:
  """One store's tree: the same shape for every store of a group (the draws are replayed), its own leaves."""
  kind = draw[0] % 6
  draw.rotate(-1)
  if depth == 0 or kind == 0: return leaves[i]
  if kind == 1: return shared
  a = random_tree(draw, width, leaves, shared, depth - 1, i)
  if kind == 2: return a * UOp.const(a.dtype, 1.5) + a
  if kind == 3: return (-a).alu(Ops.EXP2)
  if kind == 4: return a / (a * a + UOp.const(a.dtype, 2.0))
  b = random_tree(draw, width, leaves, shared, depth - 1, i)
  return a.alu(Ops.MAX, b)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.integers(2, 6), st.lists(st.integers(0, 5), min_size=8, max_size=8), st.integers(0, 3),
       st.integers(0, 2 ** 32 - 1))
def test_every_store_writes_the_same_lanes_after(width, n, draws, depth, seed):
  """n stores of `width` lanes with one random tree shape: each store's lanes are the same bits after the pass, and
  where it widened a group no op of that group is left at the stores' width."""
  rng = np.random.default_rng(seed)
  leaves = [leaf(i, width) for i in range(n)]
  shared = leaf(99, width)
  values = {v: (rng.standard_normal(width) * 4).astype(np.float32) for v in leaves + [shared]}
  if width == 1: values = {v: x[0] for v, x in values.items()}  # scalars as numpy scalars
  trees = [random_tree(deque(draws), width, leaves, shared, depth, i) for i in range(n)]
  sink = UOp(Ops.SINK, dtypes.void, tuple(store(t, 64 * i) for i, t in enumerate(trees)))
  after = widen_stores(sink, every_width, FUNCTIONS, select=True)
  assert stored(after, values) == stored(sink, values)
  if after is not sink:
    wide = [u for u in after.toposort if u.op in (Ops.EXP2, Ops.FDIV, Ops.MUL) and u.dtype.count > width]
    assert wide and all(u.dtype.count in every_width(F32) for u in wide)


def test_a_tiles_four_float4_rows_compute_their_epilogue_as_one_float16():
  accs = [leaf(i, 4) for i in range(4)]
  bias = leaf(9, 4)
  sink = UOp(Ops.SINK, dtypes.void, tuple(store(gelu_like(a, bias), 1024 * i) for i, a in enumerate(accs)))
  after = widen_stores(sink, every_width, FUNCTIONS, select=True)
  exps = [u for u in after.toposort if u.op is Ops.EXP2]
  assert [u.dtype for u in exps] == [F32.vec(16)]
  # the four rows packed once; the bias row repeated, not packed lane by lane from four places
  packs = [u for u in after.toposort if u.op is Ops.VECTORIZE and u.dtype.count == 16 and len({s.src[0] for s in u.src if s.op is Ops.GEP}) > 1]
  assert len(packs) == 1
  rng = np.random.default_rng(1)
  values = {v: rng.standard_normal(4).astype(np.float32) for v in accs + [bias]}
  assert stored(after, values) == stored(sink, values)


def test_groups_take_the_widest_declared_width_then_narrower_ones():
  accs = [leaf(i, 4) for i in range(6)]
  bias = leaf(9, 4)
  sink = UOp(Ops.SINK, dtypes.void, tuple(store(gelu_like(a, bias), 8 * i) for i, a in enumerate(accs)))
  after = widen_stores(sink, every_width, FUNCTIONS, select=True)
  assert sorted(u.dtype.count for u in after.toposort if u.op is Ops.EXP2) == [8, 16]  # 4 stores, then 2


@pytest.mark.parametrize("case", ["a bias add", "different ops", "different roots", "different gates", "undeclared width",
                                  "one store", "no vector exp2"])
def test_what_is_left_as_it_is(case):
  accs = [leaf(i, 4) for i in range(4)]
  bias = leaf(9, 4)
  ridx = UOp.range(dtypes.int32, 0, 8, 0)
  functions, widths = FUNCTIONS, every_width
  values = [gelu_like(a, bias) for a in accs]
  stores = [store(v, 16 * i) for i, v in enumerate(values)]
  if case == "a bias add": stores = [store(a + bias, 16 * i) for i, a in enumerate(accs)]  # packing costs what it saves
  elif case == "different ops": stores = [store(gelu_like(a, bias) if i % 2 else (a + bias) * (a - bias), 16 * i) for i, a in enumerate(accs)]
  elif case == "different roots": stores = [store(v, 16 * i, root=ridx * (i + 1)) for i, v in enumerate(values)]
  elif case == "different gates": stores = [store(v, 16 * i, gate=ridx.lt(i)) for i, v in enumerate(values)]
  elif case == "undeclared width": widths = lambda dt: (4, 2)  # noqa: E731
  elif case == "one store": stores = stores[:1]
  else: functions = frozenset({Ops.MAX})  # the exp2 stays at four lanes, and below it a pack per operand
  sink = UOp(Ops.SINK, dtypes.void, tuple(stores))
  after = widen_stores(sink, widths, functions, select=True)
  if case == "no vector exp2":  # what is above the exp2 is widened where it is worth it; no exp2 is
    assert all(u.dtype.count == 4 for u in after.toposort if u.op is Ops.EXP2)
  else: assert after is sink


def test_an_int_or_mask_leaf_is_never_packed():
  # WHERE on lane masks computed from ints (an index check) is left at the stores' width: masks are not packed
  accs = [leaf(i, 4) for i in range(4)]
  masks = [UOp(Ops.DEFINE_ACC, dtypes.bool.vec(4), (UOp.const(dtypes.bool, False),), (20 + i,)) for i in range(4)]
  vals = [m.where(gelu_like(a, a), a) for m, a in zip(masks, accs)]
  sink = UOp(Ops.SINK, dtypes.void, tuple(store(v, 4 * i) for i, v in enumerate(vals)))
  after = widen_stores(sink, every_width, FUNCTIONS, select=True)
  assert all(u.dtype.count == 4 for u in after.toposort if u.op is Ops.WHERE and u.src[0] in masks)
  assert not any(u.op is Ops.VECTORIZE and u.dtype.scalar() == dtypes.bool for u in after.toposort)


F = lambda i, *s: A.arg(i, F32, s)  # noqa: E731


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from([(8, 64, 16), (16, 32, 8), (4, 128, 4), (32, 48, 64)]), st.sampled_from(["x @ W.T", "x @ W"]),
       st.integers(0, 2 ** 16))
def test_kernels_with_widened_epilogues_run_as_numpy_computes_them(emu, shape, kind, seed):
  """A matmul (both operand layouts) with a bias and a division-heavy epilogue, hand-coded for a vector dialect,
  run on EMU."""
  M, K, N = shape
  rng = np.random.default_rng(seed)
  x, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal(N).astype(np.float32)
  w = rng.standard_normal((N, K) if kind == "x @ W.T" else (K, N)).astype(np.float32)
  y = (F(1, M, K) @ (F(2, N, K).T if kind == "x @ W.T" else F(2, K, N))) + F(3, N)
  sink = A.sink(A.store(0, y / (y * y + 1.0) + y.maximum(0.0) / (y * y + 2.0)))
  yy = x @ (w.T if kind == "x @ W.T" else w) + b
  want = yy / (yy * yy + 1) + np.maximum(yy, 0) / (yy * yy + 2)
  k = Kernel(sink, VectorEmu())
  hand_coded_optimizations(k)
  uops = k.linearize()
  stores = [u for u in uops if u.op is Ops.STORE]
  if len(stores) >= 4 and all(u.src[1].dtype.count == 4 for u in stores):  # a 4x4 tile of float4 rows: one float16 epilogue
    assert {u.dtype.count for u in uops if u.op is Ops.FDIV} == {16}
  emu.renderer = impersonating(VectorEmu())
  got = kc.run(sink, {1: x, 2: w, 3: b}, device=DEVICE, opts="hand")[0].reshape(want.shape)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
