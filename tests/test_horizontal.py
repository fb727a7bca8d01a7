"""kc.codegen.horizontal and the butterflies of kc.codegen.combine: the lane-by-lane combines of vector accumulators
after their loops are butterflies of even/odd shuffles, and a vector of several such combines becomes one butterfly
over all their vectors, with every result the same sum (product, max) in the same order as pairwise's scalar tree,
bit for bit. A numpy evaluator of the graph is the oracle; EMU runs whole kernels so rewritten against numpy."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
import kc
from kc import ast as A, dtypes
from kc.codegen.combine import butterfly, lanes_combined, pairwise
from kc.codegen.horizontal import combined_vectors, transposable, transpose_combines
from kc.codegen.vectorize import vectorize_alu
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


def scalar_tree(op, vectors) -> UOp:
  """pairwise's scalar tree over the vectors' lanes in order: the order every combine must keep."""
  return pairwise(op, [g for v in vectors for g in lanes(v)])


def combine(op, vectors) -> UOp: return lanes_combined(op, vectors, every_width)


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


def random_values(vs, op, dt, rng) -> dict:
  """Values over many magnitudes, so that another order of the sums would round differently (products near 1)."""
  np_dt = np.float32 if dt == dtypes.float32 else np.float64
  if op is Ops.MUL: return {v: rng.uniform(0.5, 2, v.dtype.count).astype(np_dt) for v in vs}
  return {v: (rng.standard_normal(v.dtype.count) * 2.0 ** rng.integers(-20, 20, v.dtype.count)).astype(np_dt) for v in vs}


def same_bits(a, b) -> bool: return np.asarray(a).tobytes() == np.asarray(b).tobytes()


def ops_count(root: UOp, op: Ops, scalar: bool) -> int:
  return sum(1 for u in root.toposort if u.op is op and (u.dtype.count == 1) == scalar)


def powers(lo: int, hi: int): return st.sampled_from([1 << k for k in range(lo, hi + 1)])


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([dtypes.float32, dtypes.float64]), st.sampled_from(sorted(OPS, key=str)), powers(1, 4), powers(0, 4),
       powers(0, 4), st.booleans(), st.integers(0, 2 ** 32 - 1))
def test_the_butterfly_gives_each_combine_bit_for_bit(dt, op, width, n, m, as_vector, seed):
  """n lanes (a VECTORIZE) or one scalar, each the combine of m vectors' lanes (a butterfly): pairwise's bits, also
  after the transposition (and where the vectors are more than a vector's lanes, and no transposition happens)."""
  if as_vector and n < 2: return
  if not as_vector: n = 1
  rng = np.random.default_rng(seed)
  vs = [vector(i, dt, width) for i in range(n * m)]
  values = random_values(vs, op, dt, rng)
  combines = [combine(op, vs[j * m:(j + 1) * m]) for j in range(n)]
  wants = [scalar_tree(op, vs[j * m:(j + 1) * m]) for j in range(n)]
  root = UOp(Ops.VECTORIZE, dt.vec(n), tuple(combines)) if as_vector else combines[0]
  want = UOp(Ops.VECTORIZE, dt.vec(n), tuple(wants)) if as_vector else wants[0]
  sink = UOp(Ops.SINK, dtypes.void, (root,))
  after = transpose_combines(sink, every_width, frozenset({Ops.MAX}))
  assert same_bits(evaluate(sink, values)[0], evaluate(want, values))
  assert same_bits(evaluate(after, values)[0], evaluate(want, values))
  if n * m > width: return  # more vectors than lanes: each lane its own butterfly (checked above), no transposition
  # one op per pair of vectors, then one per halving down to the result's lanes: no scalar op per lane
  out = n if as_vector else 1
  assert ops_count(after, op, scalar=True) + ops_count(after, op, scalar=False) == n * m - 1 + (width // out).bit_length() - 1
  assert ops_count(after, op, scalar=True) == (0 if as_vector else 1 if n * m * width > 1 else 0)


@pytest.mark.parametrize("widths", [(16, 8, 4, 2), (16, 8), (4, 2), ()])
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_lanes_combined_is_a_butterfly_only_where_every_halving_is_declared(widths, m):
  vs = [vector(i, dtypes.float32, 8) for i in range(m)]
  got = lanes_combined(Ops.ADD, vs, lambda dt: widths)
  is_butterfly = m != 3 and all(w in widths for w in (8, 4, 2))
  assert any(u.op is Ops.SHUFFLE for u in got.toposort) == is_butterfly
  if not is_butterfly: assert got is scalar_tree(Ops.ADD, vs)
  values = random_values(vs, Ops.ADD, dtypes.float32, np.random.default_rng(m))
  assert same_bits(evaluate(got, values), evaluate(scalar_tree(Ops.ADD, vs), values))


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


def test_a_transposed_vector_of_combines_keeps_a_read_of_its_vectors_elsewhere():
  v, w = vector(0, dtypes.float32, 8), vector(1, dtypes.float32, 8)
  root = UOp(Ops.VECTORIZE, dtypes.float32.vec(2), (combine(Ops.ADD, [v]), combine(Ops.ADD, [w])))
  after = transpose_combines(UOp(Ops.SINK, dtypes.void, (root, v)), every_width)
  assert after.src[1] is v and after.src[0] is not root and after.src[0].op is Ops.ADD


def _swapped_level(u: UOp) -> UOp:
  """A butterfly with its top vector level's even and odd shuffles swapped: the same sums of the other neighbours."""
  x = u.src[0].src[0]
  even, odd = x.src
  return u.substitute({x: UOp(x.op, x.dtype, (UOp(Ops.SHUFFLE, even.dtype, even.src, odd.arg), UOp(Ops.SHUFFLE, odd.dtype, odd.src, even.arg)))})


@pytest.mark.parametrize("case", ["chain", "mixed ops", "lanes out of order", "two widths", "undeclared halving", "vectors past a width"])
def test_what_is_left_as_it_is(case):
  dt = dtypes.float32
  v, w = vector(0, dt, 8), vector(1, dt, 8)
  widths = every_width
  second = combine(Ops.ADD, [w])
  if case == "chain":  # a left-to-right sum of the lanes is another order: not the pairwise tree the butterfly keeps
    x = lanes(v)[0]
    for g in lanes(v)[1:]: x = x + g
    first = x
  elif case == "mixed ops": first, second = combine(Ops.ADD, [v]), combine(Ops.MUL, [w])
  elif case == "lanes out of order": first = _swapped_level(combine(Ops.ADD, [v]))
  elif case == "two widths": first = combine(Ops.ADD, [vector(2, dt, 4)])
  elif case == "undeclared halving": first, widths = scalar_tree(Ops.ADD, [v]), lambda dt: (8,)
  else: first, second = combine(Ops.ADD, [vector(i, dt, 2) for i in range(2)]), combine(Ops.ADD, [vector(i, dt, 2) for i in range(2, 4)])
  sink = UOp(Ops.SINK, dtypes.void, (UOp(Ops.VECTORIZE, dt.vec(2), (first, second)),))
  assert transpose_combines(sink, widths) is sink


def test_max_is_combined_only_where_the_dialect_has_vector_max():
  v, w = vector(0, dtypes.float32, 8), vector(1, dtypes.float32, 8)
  sink = UOp(Ops.SINK, dtypes.void, (UOp(Ops.VECTORIZE, dtypes.float32.vec(2), (combine(Ops.MAX, [v]), combine(Ops.MAX, [w]))),))
  assert transpose_combines(sink, every_width) is sink
  assert transpose_combines(sink, every_width, frozenset({Ops.MAX})) is not sink


def test_combined_vectors_reads_the_vectors_in_order():
  vs = [vector(i, dtypes.float32, 4) for i in range(4)]
  assert combined_vectors(combine(Ops.ADD, vs), OPS) == tuple(vs)
  assert combined_vectors(combine(Ops.ADD, vs[:1]), OPS) == (vs[0],)
  assert combined_vectors(combine(Ops.ADD, vs[:3]), OPS) is None  # three vectors: pairwise's scalar tree, no butterfly
  assert combined_vectors(combine(Ops.ADD, vs), frozenset({Ops.MUL})) is None  # an op the caller does not take


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(OPS, key=str)), st.sampled_from([(1, 2), (2, 2), (1, 4), (2, 4), (4, 4), (2, 8), (8, 8), (4, 16)]),
       st.integers(0, 6), st.integers(0, 2**32 - 1))
def test_what_combined_vectors_finds_is_pairwise_over_those_vectors(op, m_width, mutations, seed):
  """A butterfly over m vectors is found with exactly those vectors; with its SHUFFLEs' lanes shuffled or its ops
  changed at random nodes, whatever is found is still pairwise's tree over the vectors found, bit for bit."""
  m, width = m_width
  rng = np.random.default_rng(seed)
  vs = [vector(i, dtypes.float32, width) for i in range(m)]
  root = combine(op, vs)
  if mutations == 0: assert combined_vectors(root, OPS) == tuple(vs)
  for _ in range(mutations):
    nodes = [u for u in root.toposort if u.op is Ops.SHUFFLE or u.op in OPS and u.dtype.count > 1]
    if not nodes: break
    x = nodes[int(rng.integers(len(nodes)))]
    if x.op is Ops.SHUFFLE: new = UOp(Ops.SHUFFLE, x.dtype, x.src, tuple(int(i) for i in rng.permutation(x.arg)))
    else: new = UOp(sorted(OPS - {x.op}, key=str)[int(rng.integers(2))], x.dtype, x.src)
    root = root.substitute({x: new})
  if (found := combined_vectors(root, OPS)) is None: return
  values = random_values(vs, Ops.ADD, dtypes.float32, rng)
  with np.errstate(all="ignore"):  # a product of many large values overflows alike in both
    assert same_bits(evaluate(root, values), evaluate(scalar_tree(root.op, found), values))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(OPS, key=str)), powers(1, 4), powers(0, 2), st.integers(1, 12), st.integers(0, 2 ** 32 - 1))
def test_vectorize_then_transpose_keeps_every_vector_of_combines_bit_for_bit(op, n, m, pool, seed):
  # rewrite_lowered's order: vectorize_alu leaves what transpose_combines takes (transposable, its `left`), then the
  # transposition. Lanes are combines of m vectors drawn from a pool, so lanes share vectors, repeat, or all read one
  rng = np.random.default_rng(seed)
  width = 4
  vectors = [vector(i, dtypes.float32, width) for i in range(pool)]
  lanes_ = [combine(op, [vectors[int(j)] for j in rng.integers(0, pool, m)]) for _ in range(n)]
  sink = UOp(Ops.SINK, dtypes.void, (UOp(Ops.VECTORIZE, dtypes.float32.vec(n), tuple(lanes_)),))
  functions = frozenset({Ops.MAX})
  after = vectorize_alu(sink, every_width, functions, left=lambda v: transposable(v, OPS, every_width) is not None)
  after = transpose_combines(after, every_width, functions)
  values = random_values(vectors, op, dtypes.float32, rng)
  assert same_bits(evaluate(after, values)[0], evaluate(sink, values)[0])
  if n * m <= width: assert not any(u.op is Ops.GEP for u in after.toposort)  # one butterfly over all of them


def test_transposable_takes_lanes_of_one_op_over_as_many_vectors_within_a_width():
  vs = [vector(i, dtypes.float32, 4) for i in range(8)]
  def vec(*combines): return UOp(Ops.VECTORIZE, dtypes.float32.vec(len(combines)), combines)
  assert transposable(vec(*(combine(Ops.ADD, [v]) for v in vs[:4])), OPS, every_width) == tuple(vs[:4])
  assert transposable(vec(*(combine(Ops.ADD, [v]) for v in vs[:2])), OPS, every_width) == tuple(vs[:2])
  assert transposable(vec(*(combine(Ops.ADD, [vs[0]]) for _ in range(4))), OPS, every_width) == (vs[0],) * 4  # a splat
  assert transposable(vec(*(combine(Ops.ADD, vs[2 * i:2 * i + 2]) for i in range(4))), OPS, every_width) is None  # 8 > 4 lanes
  assert transposable(vec(*(combine(Ops.ADD, [v]) for v in vs[:3]), combine(Ops.MUL, [vs[3]])), OPS, every_width) is None
  assert transposable(vec(combine(Ops.ADD, vs[:2]), combine(Ops.ADD, vs[2:3])), OPS, every_width) is None  # 2 and 1 vectors
  assert transposable(vec(*(combine(Ops.ADD, [v]) for v in vs[:2])), OPS, lambda dt: (4,)) is None  # 4 -> 2 undeclared


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
