"""kc.codegen.horizontal: the lane-by-lane combines of several vectors after their loops become one tree of even/odd
shuffles and vector ops, with every result the same sum (product, max) in the same order, bit for bit. A numpy
evaluator of the graph is the oracle; EMU runs whole kernels so rewritten against numpy."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
import kc
from kc import ast as A, dtypes
from kc.codegen.horizontal import butterfly, combined_vectors, combines_of_many_vectors, transpose_combines
from kc.codegen.vectorize import vectorize_alu
from kc.codegen.lower import pairwise
from kc.emu import DEVICE, impersonating
from kc.emu.renderer import EmuRenderer
from kc.ir.uop import Ops, UOp
from kc.kernel import Kernel
from kc.kernel.heuristics import hand_coded_optimizations

OPS = frozenset({Ops.ADD, Ops.MUL, Ops.MAX})
NP_OP = {Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.MAX: np.maximum}


def every_width(dt): return (16, 8, 4, 2)


def vector(i: int, dt, width: int) -> UOp:
  """A distinct vector value the evaluator is handed (an accumulator, as the combines read after a loop)."""
  vdt = dt.vec(width)
  return UOp(Ops.DEFINE_ACC, vdt, (UOp.const(vdt, 0),), (i,))


def lanes(v: UOp) -> list[UOp]: return [UOp(Ops.GEP, v.dtype.scalar(), (v,), (i,)) for i in range(v.dtype.count)]


def combine(op, vectors) -> UOp: return pairwise(op, [g for v in vectors for g in lanes(v)])


def evaluate(u: UOp, values: dict, memo=None):
  """The graph's value in numpy: scalars as numpy scalars of the dtype, vectors as arrays."""
  memo = {} if memo is None else memo
  if u in memo: return memo[u]
  np_dt = np.float32 if u.dtype.scalar() == dtypes.float32 else np.float64
  if u.op is Ops.DEFINE_ACC: ret = values[u]
  elif u.op is Ops.GEP: ret = evaluate(u.src[0], values, memo)[u.arg[0]]
  elif u.op is Ops.VECTORIZE: ret = np.array([evaluate(s, values, memo) for s in u.src], dtype=np_dt)
  elif u.op is Ops.SHUFFLE: ret = np.concatenate([evaluate(s, values, memo) for s in u.src])[list(u.arg)]
  elif u.op is Ops.SINK: ret = tuple(evaluate(s, values, memo) for s in u.src)
  else: ret = NP_OP[u.op](*(evaluate(s, values, memo) for s in u.src)).astype(np_dt)
  memo[u] = ret
  return ret


def ops_count(root: UOp, op: Ops, scalar: bool) -> int:
  return sum(1 for u in root.toposort if u.op is op and (u.dtype.count == 1) == scalar)


def powers(lo: int, hi: int): return st.sampled_from([1 << k for k in range(lo, hi + 1)])


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([dtypes.float32, dtypes.float64]), st.sampled_from(sorted(OPS, key=str)), powers(1, 4), powers(0, 4),
       powers(0, 4), st.booleans(), st.integers(0, 2 ** 32 - 1))
def test_the_butterfly_gives_each_combine_bit_for_bit(dt, op, width, n, m, as_vector, seed):
  """n lanes (a VECTORIZE) or one scalar, each the pairwise combine of m vectors' lanes: the same bits after (also
  where the vectors are more than a vector's lanes, and only parts of the tree are butterflies)."""
  if as_vector and n < 2: return
  if not as_vector: n = 1
  rng = np.random.default_rng(seed)
  vs = [vector(i, dt, width) for i in range(n * m)]
  np_dt = np.float32 if dt == dtypes.float32 else np.float64
  # values over many magnitudes, so that another order of the sums would round differently
  values = {v: (rng.standard_normal(width) * 2.0 ** rng.integers(-20, 20, width)).astype(np_dt) for v in vs}
  if op is Ops.MUL: values = {v: rng.uniform(0.5, 2, width).astype(np_dt) for v in vs}
  combines = [combine(op, vs[j * m:(j + 1) * m]) for j in range(n)]
  root = UOp(Ops.VECTORIZE, dt.vec(n), tuple(combines)) if as_vector else combines[0]
  sink = UOp(Ops.SINK, dtypes.void, (root,))
  after = transpose_combines(sink, every_width, frozenset({Ops.MAX}))
  want, got = evaluate(sink, values), evaluate(after, values)
  assert np.asarray(got[0]).tobytes() == np.asarray(want[0]).tobytes()
  if n * m > width: return  # more vectors than lanes: combined in parts (checked above), not as one butterfly
  # one op per pair of vectors, then one per halving down to the result's lanes: no scalar op per lane
  out = n if as_vector else 1
  assert ops_count(after, op, scalar=True) + ops_count(after, op, scalar=False) == n * m - 1 + (width // out).bit_length() - 1
  assert ops_count(after, op, scalar=True) == (0 if as_vector else 1 if n * m * width > 1 else 0)


def test_a_register_tiles_four_stores_take_five_vector_adds_each():
  # x @ W.T's 4x4 tile on AVX-512: per float4 store, 4 accumulators of 16 lanes
  vs = [vector(i, dtypes.float32, 16) for i in range(4)]
  root = UOp(Ops.VECTORIZE, dtypes.float32.vec(4), tuple(combine(Ops.ADD, [v]) for v in vs))
  after = transpose_combines(UOp(Ops.SINK, dtypes.void, (root,)), every_width)
  adds = [u for u in after.toposort if u.op is Ops.ADD]
  # two levels over pairs of vectors (2 + 1 adds of 16 lanes), then 16 -> 8 -> 4 lanes inside one vector
  assert sorted(u.dtype.count for u in adds) == [4, 8, 16, 16, 16]
  shuffles = [u for u in after.toposort if u.op is Ops.SHUFFLE]
  assert len(shuffles) == 10  # an even and an odd shuffle per add
  assert sorted(len(u.src) for u in shuffles) == [1] * 4 + [2] * 6  # over pairs of vectors, then inside one
  assert not any(u.op is Ops.GEP for u in after.toposort)  # no lane by lane


def test_a_combine_of_a_vector_read_elsewhere_too_keeps_that_read():
  v = vector(0, dtypes.float32, 8)
  s = combine(Ops.ADD, [v])
  after = transpose_combines(UOp(Ops.SINK, dtypes.void, (s, v)), every_width)
  assert after.src[1] is v and after.src[0] is not s


@pytest.mark.parametrize("case", ["chain", "mixed ops", "lanes out of order", "two widths", "undeclared halving"])
def test_what_is_left_as_it_is(case):
  dt = dtypes.float32
  v, w = vector(0, dt, 8), vector(1, dt, 8)
  widths = every_width
  if case == "chain":  # a left-to-right sum of the lanes is another order: not the pairwise tree the butterfly keeps
    x = lanes(v)[0]
    for g in lanes(v)[1:]: x = x + g
    root = x
  elif case == "mixed ops": root = UOp(Ops.VECTORIZE, dt.vec(2), (combine(Ops.ADD, [v]), combine(Ops.MUL, [w])))
  elif case == "lanes out of order": root = pairwise(Ops.ADD, lanes(v)[::-1])
  elif case == "two widths": root = UOp(Ops.VECTORIZE, dt.vec(2), (combine(Ops.ADD, [v]), combine(Ops.ADD, [vector(2, dt, 4)])))
  else: root, widths = combine(Ops.ADD, [v]), lambda dt: (8,)
  sink = UOp(Ops.SINK, dtypes.void, (root,))
  after = transpose_combines(sink, widths)
  if case in ("mixed ops", "two widths"):  # no one vector of both lanes; each lane's own vector is still combined as one
    assert after.src[0].op is Ops.VECTORIZE and all(s.src[0].op is Ops.GEP and s.src[0].src[0].dtype.count == 2 for s in after.src[0].src)
  else: assert after is sink


def test_max_is_combined_only_where_the_dialect_has_vector_max():
  v = vector(0, dtypes.float32, 8)
  sink = UOp(Ops.SINK, dtypes.void, (combine(Ops.MAX, [v]),))
  assert transpose_combines(sink, every_width) is sink
  assert transpose_combines(sink, every_width, frozenset({Ops.MAX})) is not sink


def test_combined_vectors_reads_the_vectors_in_order():
  vs = [vector(i, dtypes.float32, 4) for i in range(4)]
  found = combined_vectors(combine(Ops.ADD, vs), OPS)
  assert found is not None and found[0] == tuple(vs) and len(found[1]) == 15
  assert combined_vectors(combine(Ops.ADD, vs[:3]), OPS) is None  # three vectors: no balanced tree of whole vectors


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([(1, 2), (2, 2), (1, 4), (2, 4), (4, 4), (2, 8), (8, 8)]), st.integers(0, 2**32 - 1))
def test_combined_vectors_finds_exactly_the_pairwise_trees(n_width, seed):
  # a tree of ADDs over the lanes of n vectors (at most a width's worth) is a combine exactly when it is pairwise's
  # tree over them in order: random shapes and random orders of the leaves, pairwise's own tree among them
  n, width = n_width
  rng = np.random.default_rng(seed)
  vectors = [vector(i, dtypes.float32, width) for i in range(n)]
  leaves = [x for v in vectors for x in lanes(v)]
  if rng.random() < 0.3: leaves = [leaves[i] for i in rng.permutation(len(leaves))]

  def random_tree(xs: list[UOp]) -> UOp:
    if len(xs) == 1: return xs[0]
    cut = int(rng.integers(1, len(xs)))
    return UOp(Ops.ADD, dtypes.float32, (random_tree(xs[:cut]), random_tree(xs[cut:])))
  # a combine's leaves are whole vectors one after another, each vector's lanes in order (the vectors themselves in
  # any order: the combine is over them in that order)
  runs = [leaves[i:i + width] for i in range(0, len(leaves), width)]
  whole_vectors = all(run == lanes(run[0].src[0]) for run in runs)
  for root in (random_tree(leaves), pairwise(Ops.ADD, leaves)):
    found = combined_vectors(root, OPS)
    assert (found is not None) == (whole_vectors and pairwise(Ops.ADD, leaves) is root)
    if found is not None: assert found[0] == tuple(run[0].src[0] for run in runs)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(OPS, key=str)), powers(1, 4), powers(0, 2), st.integers(1, 12), st.integers(0, 2 ** 32 - 1))
def test_vectorize_alu_leaves_the_combines_of_many_vectors_as_they_are(op, n, m, pool, seed):
  # what lets vectorize_alu skip them (rewrite_lowered passes combines_of_many_vectors as `left`): walked, such a
  # VECTORIZE comes back unchanged. Lanes are combines of m vectors drawn from a pool, so lanes share vectors,
  # repeat, or all read one (a splat)
  rng = np.random.default_rng(seed)
  width = 4
  vectors = [vector(i, dtypes.float32, width) for i in range(pool)]
  lanes_ = [combine(op, [vectors[int(j)] for j in rng.integers(0, pool, m)]) for _ in range(n)]
  v = UOp(Ops.VECTORIZE, dtypes.float32.vec(n), tuple(lanes_))
  sink = UOp(Ops.SINK, dtypes.void, (v,))
  if combines_of_many_vectors(v, OPS): assert vectorize_alu(sink, every_width, frozenset({Ops.MAX})) is sink


def test_combines_of_many_vectors_needs_more_than_two_vectors_at_each_place():
  vs = [vector(i, dtypes.float32, 4) for i in range(8)]
  def vec(*combines): return UOp(Ops.VECTORIZE, dtypes.float32.vec(len(combines)), combines)
  assert combines_of_many_vectors(vec(*(combine(Ops.ADD, [v]) for v in vs[:4])), OPS)
  assert not combines_of_many_vectors(vec(*(combine(Ops.ADD, [v]) for v in vs[:2])), OPS)  # two: one permute
  assert not combines_of_many_vectors(vec(*(combine(Ops.ADD, [vs[0]]) for _ in range(4))), OPS)  # a splat
  # the first vectors of the four lanes are only two different ones
  assert not combines_of_many_vectors(vec(*(combine(Ops.ADD, [vs[i % 2], vs[4 + i]]) for i in range(4))), OPS)
  assert not combines_of_many_vectors(vec(*(combine(Ops.ADD, [v]) for v in vs[:3]), combine(Ops.MUL, [vs[3]])), OPS)


def test_butterfly_to_one_lane_is_a_scalar():
  out = butterfly(Ops.ADD, (vector(0, dtypes.float32, 4),), 1)
  assert out.dtype == dtypes.float32 and out.op is Ops.ADD


class VectorEmu(EmuRenderer):
  """EMU's renderer as a host CPU's: no work-groups, computing on float32 vectors of 16, 8, 4 and 2 lanes."""
  has_local = has_shared = False
  global_max = local_max = None
  tensor_cores = []
  code_for_op = {**EmuRenderer.code_for_op, Ops.MAX: lambda a, b, dt: f"max({a},{b})"}  # spelled: max stays MAX
  vector_alu = True
  vector_functions = frozenset({Ops.MAX})
  def vector_widths(self, dt): return (16, 8, 4, 2) if dt == dtypes.float32 else ()


F = lambda i, *s: A.arg(i, dtypes.float32, s)  # noqa: E731


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from([(8, 64, 16), (16, 32, 8), (4, 128, 4), (32, 48, 64)]), st.sampled_from(["sum", "max"]), st.integers(0, 2 ** 16))
def test_kernels_with_combined_lanes_run_as_numpy_computes_them(emu, shape, kind, seed):
  """x @ W.T (both operands contiguous along K) and row maxima, hand-coded for a vector dialect, run on EMU."""
  M, K, N = shape
  rng = np.random.default_rng(seed)
  x, w = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((N, K)).astype(np.float32)
  if kind == "sum": sink, inputs, want = A.sink(A.store(0, F(1, M, K) @ F(2, N, K).T)), {1: x, 2: w}, x @ w.T
  else: sink, inputs, want = A.sink(A.store(0, F(1, M, K).max(axis=1))), {1: x}, x.max(axis=1)
  k = Kernel(sink, VectorEmu())
  hand_coded_optimizations(k)
  assert any(u.op is Ops.SHUFFLE and u.arg[:2] == (0, 2) for u in k.linearize()), "no even-lane shuffle: the pass did not run on this kernel"
  emu.renderer = impersonating(VectorEmu())
  got = kc.run(sink, inputs, device=DEVICE, opts="hand")[0].reshape(want.shape)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _assigns_per_accumulator(uops) -> dict:
  counts: dict = {}
  for u in uops:
    if u.op is Ops.ASSIGN: counts[u.src[0]] = counts.get(u.src[0], 0) + 1
  return counts


@pytest.mark.parametrize("opts", ["none", "hand"])
@pytest.mark.parametrize("second", [False, True])
@pytest.mark.parametrize("axes", [(0, 1), (1,), (0,)])
@pytest.mark.parametrize("shape", [(1, 12, 16), (2, 8, 16), (4, 16, 8), (3, 12, 32)])
def test_a_sum_of_combines_updates_its_accumulator_once(emu, shape, axes, second, opts):
  """kc fuzz --device CLANG --seed 4414 (KC_CLANG_ISA=avx2), case 24: the sum of a matmul's outputs was twice the
  sum. Its accumulator's update adds a vector of four combines (each matmul output's lanes), and the combine of that
  accumulator after its loop was replaced too: the replacement was built on the old update, so the graph kept both
  updates. The class: a reduce over values that are combines themselves, any axes, with a second reduce reading it."""
  M, K, N = shape
  rng = np.random.default_rng(M * K * N)
  x, w = rng.standard_normal((M, K)).astype(np.float32), rng.integers(-8, 8, (K, N)).astype(np.float32)
  prod = F(1, M, K) @ F(2, K, N)
  total = prod.sum(axis=axes, keepdims=True)
  stores = [A.store(0, total)] + ([A.store(3, (prod + total).sum(axis=1))] if second else [])
  sink, want = A.sink(*stores), (x @ w).sum(axis=axes, keepdims=True)
  for renderer in (VectorEmu(), kc.Device.renderer("CLANG")):
    from kc.schedule import schedule
    for sk in schedule(sink).kernels:
      k = Kernel(sk.ast, renderer)
      if opts == "hand": hand_coded_optimizations(k)
      assert set(_assigns_per_accumulator(k.linearize()).values()) <= {1}, "an accumulator is updated twice"
  emu.renderer = impersonating(VectorEmu())
  for device in (DEVICE, "CLANG"):
    got = kc.run(sink, {1: x, 2: w}, device=device, opts=opts)
    np.testing.assert_allclose(got[0].reshape(want.shape), want, rtol=1e-5, atol=1e-4)
    if second:
      np.testing.assert_allclose(got[3].reshape(M), ((x @ w) + want).sum(axis=1), rtol=1e-5, atol=1e-3)
