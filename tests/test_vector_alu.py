"""Renderer.vector_alu: lanes that line up stay one vector through their arithmetic and in vector accumulators
(kc.codegen.vectorize), the hand-coded heuristics give a reduce a register tile of the widest vectors, and EMU runs
the vector programs with the results of the scalar ones."""
import numpy as np
import pytest
import kc
from kc import ast as A, dtypes
from kc.kernel import Kernel
from kc.ir.uop import Ops
from kc.kernel.heuristics import hand_coded_optimizations
from kc.renderer import Renderer
from kc.emu import DEVICE, impersonating

kc_clang_renderer = pytest.importorskip("kc_clang.renderer")

F = lambda i, *s: A.arg(i, dtypes.float32, s)  # noqa: E731


def vector_renderer(lanes: int = 16):
  """A CLANG renderer with vectors of `lanes` floats that computes on them."""
  r = kc_clang_renderer.ClangRenderer(native=False)
  r.float_lanes, r.vector_alu = lanes, True
  return r


def mm(M, K, N): return A.sink(A.store(0, (F(1, M, K).reshape(M, K, 1) * F(2, K, N).reshape(1, K, N)).sum(1)))


def hand(sink, renderer) -> Kernel:
  k = Kernel(sink, renderer)
  hand_coded_optimizations(k)
  return k


def test_off_by_default_and_on_for_clang():
  # a dialect says it computes on vectors; CLANG's vector extensions do, in native and portable code alike (OpenCL
  # on a CPU device does too: kc-opencl's tests)
  assert Renderer.vector_alu is False
  assert kc_clang_renderer.ClangRenderer(native=False).vector_alu is True


def test_matmul_has_vector_accumulators_and_no_scalar_ones():
  k = hand(mm(64, 64, 64), vector_renderer(16))
  uops = k.linearize()
  accs = [u for u in uops if u.op is Ops.DEFINE_ACC]
  assert accs and all(u.dtype == dtypes.float32.vec(16) for u in accs)
  # a register tile: 2 vectors along N times 8 rows, each its own accumulator, that fits 32 registers
  assert len(accs) == 16
  src = k.to_program().src
  assert "float16 acc0" in src and "float acc" not in src
  assert not any(u.op is Ops.GEP and u.src[0].op is Ops.LOAD and u.src[0].dtype.count == 16 for u in uops)  # no lane reads of B


@pytest.mark.parametrize("lanes,tile", [(16, 16), (8, 10), (4, 10)])
def test_register_tile_fits_the_registers(lanes, tile):
  # 32 registers of 16 floats: 8 rows x 2 vectors; 16 registers of 8 or 4: rows*2 + 2 + 1 <= 16 gives 6 x 2 ... as
  # the rows that divide the axis allow
  k = hand(mm(96, 32, 96), vector_renderer(lanes))
  accs = [u for u in k.linearize() if u.op is Ops.DEFINE_ACC]
  assert all(u.dtype.count == lanes for u in accs)
  regs = 32 if lanes * 4 >= 64 else 16
  assert len(accs) + 3 <= regs


def test_flag_off_keeps_scalar_accumulators():
  r = vector_renderer(16)
  r.vector_alu = False
  accs = [u for u in hand(mm(64, 64, 64), r).linearize() if u.op is Ops.DEFINE_ACC]
  assert accs and all(u.dtype.count == 1 for u in accs)


CASES = {
  "matmul": (lambda: mm(48, 40, 64), lambda a: a[1] @ a[2], {1: (48, 40), 2: (40, 64)}),
  "mul_add": (lambda: A.sink(A.store(0, F(1, 256) * F(2, 256) + F(3, 256))), lambda a: a[1] * a[2] + a[3], {1: (256,), 2: (256,), 3: (256,)}),
  "sub_div_neg": (lambda: A.sink(A.store(0, -(F(1, 64) - F(2, 64)) / F(3, 64))), lambda a: -(a[1] - a[2]) / a[3],
                  {1: (64,), 2: (64,), 3: (64,)}),
  "row_sums": (lambda: A.sink(A.store(0, F(1, 32, 64).sum(1))), lambda a: a[1].sum(1), {1: (32, 64)}),
  "max_rows": (lambda: A.sink(A.store(0, F(1, 32, 64).max(1))), lambda a: a[1].max(1), {1: (32, 64)}),
  "exp": (lambda: A.sink(A.store(0, F(1, 128).exp() * F(2, 128))), lambda a: np.exp(a[1]) * a[2], {1: (128,), 2: (128,)}),
  "where": (lambda: A.sink(A.store(0, (F(1, 64) < F(2, 64)).where(F(1, 64), F(2, 64) * 2))), lambda a: np.where(a[1] < a[2], a[1], a[2] * 2),
            {1: (64,), 2: (64,)}),
  # lane masks combined (AND, OR, not), a bool computed lane by lane packed into a mask, and log2 of a vector
  "mask_logic": (lambda: A.sink(A.store(0, (((F(1, 64) < 0) & ~(F(2, 64) < F(1, 64))) | (F(2, 64) > 1)).where(F(1, 64).log2(), -F(2, 64)))),
                 lambda a: np.where(((a[1] < 0) & ~(a[2] < a[1])) | (a[2] > 1), np.log2(a[1]), -a[2]), {1: (64,), 2: (64,)}),
  "int_mask": (lambda: A.sink(A.store(0, (A.arg(2, dtypes.int32, (64,)) % 3 == 0).where(F(1, 64) * 2, F(1, 64).exp2()))),
               lambda a: np.where(a[2] % 3 == 0, a[1] * 2, np.exp2(a[1])), {1: (64,), 2: (64,)}),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("lanes", [16, 4])
def test_emu_runs_vector_programs(emu, name, lanes):
  build, ref, shapes = CASES[name]
  rng = np.random.default_rng(0)
  inputs = {i: rng.standard_normal(s).astype(np.float32) + (3 if name == "sub_div_neg" and i == 3 else 0) for i, s in shapes.items()}
  if name == "int_mask": inputs[2] = rng.integers(-9, 9, 64).astype(np.int32)
  emu.renderer = impersonating(vector_renderer(lanes))
  out = kc.run(build(), inputs, device=DEVICE)[0]
  with np.errstate(invalid="ignore", divide="ignore"): want = np.asarray(ref(inputs), np.float32).reshape(-1)
  np.testing.assert_allclose(out.reshape(-1), want, rtol=1e-5, atol=1e-4)


def test_comparisons_and_where_are_vectors_only_with_vector_select():
  # a ReLU after vector arithmetic: one vector WHERE on a mask of one vector comparison; without vector_select the
  # comparison and the WHERE run lane by lane
  sink = A.sink(A.store(0, (F(1, 256) * 2 + 1).maximum(0.0) * A.where(F(1, 256) < F(2, 256), F(2, 256), 3.0)))
  r = vector_renderer(16)
  k = Kernel(sink, r)
  k.apply_opt(kc.Opt(kc.OptOps.UPCAST, 0, 16))
  uops = k.linearize()
  assert any(u.op is Ops.WHERE and u.dtype == dtypes.float32.vec(16) for u in uops)
  assert any(u.op is Ops.CMPLT and u.dtype == dtypes.bool.vec(16) for u in uops)
  assert any(u.op is Ops.MAX and u.dtype == dtypes.float32.vec(16) for u in uops)
  assert not any(u.op in (Ops.WHERE, Ops.CMPLT, Ops.MAX) and u.dtype.count == 1 for u in uops)
  r.vector_select = False
  r.vector_functions = r.vector_functions - {Ops.MAX}
  k = Kernel(sink, r)
  k.apply_opt(kc.Opt(kc.OptOps.UPCAST, 0, 16))
  assert not any(u.op in (Ops.WHERE, Ops.CMPLT, Ops.MAX) and u.dtype.count > 1 for u in k.linearize())


def conv(cin=8, cout=16, H=8, W=32, k=3):
  x, w = F(1, cin, H, W), F(2, cout, cin, k, k)
  win = x.pad(((0, 0), (1, 1), (1, 1))).windows(1, k).windows(2, k).permute(0, 3, 4, 1, 2).reshape(1, cin, k, k, H, W)
  return A.sink(A.store(0, (win * w.reshape(cout, cin, k, k, 1, 1)).sum(axis=(1, 2, 3))))


def test_conv_tile_reuses_each_packed_window_row_across_output_channels():
  # the input row is padded along W, so its lanes are loaded one by one and packed: rows along the output channels
  # (the axis the input is broadcast along), not along H, and the 3x3 window unrolled
  k = hand(conv(), vector_renderer(16))
  assert k.full_shape[k.first_upcast:] == (16, 16, 3, 3)  # W lanes, 16 output channels, the window
  uops = k.linearize()
  vmuls = [u for u in uops if u.op in (Ops.MUL, Ops.MULACC) and u.dtype == dtypes.float32.vec(16)]
  packed = [u for u in uops if u.op is Ops.VECTORIZE and u.dtype == dtypes.float32.vec(16) and len(set(u.src)) > 1]
  # each of the 9 window rows (6 of them packed: those the pad masks at an edge lane) feeds 16 vector products; no
  # product is computed lane by lane
  assert len(packed) == 6 and len(vmuls) == 16 * 9 and not any(u.op is Ops.MUL and u.dtype == dtypes.float32 for u in uops)


def test_lane_accumulators_combined_after_the_loop_become_one_vector_accumulator():
  # a row sum unrolled by 16 keeps 16 scalar accumulators combined pairwise after the loop: one float16 accumulator
  # instead, combined in the same pairwise order, so CLANG computes the same bits as without vector arithmetic (3
  # loop steps: too few to interleave them over more accumulators, tests/test_reduce_interleave.py)
  sink = A.sink(A.store(0, F(1, 8, 48).sum(1)))
  r = vector_renderer(16)
  k = Kernel(sink, r)
  k.apply_opt(kc.Opt(kc.OptOps.UNROLL, 0, 16))
  accs = [u for u in k.linearize() if u.op is Ops.DEFINE_ACC]
  assert [u.dtype for u in accs] == [dtypes.float32.vec(16)]
  x = np.random.default_rng(1).standard_normal((8, 48)).astype(np.float32) * 1e3
  opts = [kc.Opt(kc.OptOps.UNROLL, 0, 16)]
  vec = kc.run(sink, {1: x}, "CLANG", opts)[0]
  r.vector_alu = False
  scalar = Kernel(sink, r)
  scalar.apply_opt(opts[0])
  assert all(u.dtype.count == 1 for u in scalar.linearize() if u.op is Ops.DEFINE_ACC)
  np.testing.assert_allclose(vec, x.sum(1), rtol=1e-5, atol=1e-2)
  ck = kc.Device["CLANG"]
  prg = scalar.to_program()
  out = np.empty(8, np.float32)
  kc.CompiledKernel(sink, scalar, prg, "CLANG", ck.runtime(prg.name, ck.compiler.compile(prg.src)))(out, x)
  assert np.array_equal(vec, out)


@pytest.mark.parametrize("functions", [frozenset(), frozenset({Ops.EXP2})])
def test_exp2_is_a_vector_op_only_where_the_dialect_has_the_vector_function(functions):
  r = vector_renderer(16)
  r.vector_functions = functions
  k = Kernel(A.sink(A.store(0, F(1, 256).exp2() * F(2, 256))), r)
  k.apply_opt(kc.Opt(kc.OptOps.UPCAST, 0, 16))
  exps = [u for u in k.linearize() if u.op is Ops.EXP2]
  assert [u.dtype.count for u in exps] == ([16] if functions else [1] * 16)


@pytest.mark.parametrize("n,swapped", [(512, False), (1024, True), (2048, True)])
def test_large_matmul_runs_its_b_panels_outermost(n, swapped):
  # rows outermost streams all of B (n*n floats) once per block of 8 rows; B's 32-column panels outermost stream A
  # once per panel, 4x fewer bytes. Only worth it once B does not fit in a core's cache (1 MiB: n = 512 fits)
  k = hand(mm(n, n, n), vector_renderer(16))
  assert (kc.Opt(kc.OptOps.SWAP, 0, 1) in k.applied_opts) == swapped
  assert k.full_shape[:2] == ((n // 32, n // 8) if swapped else (n // 8, n // 32))


def mm_t(M, K, N):
  """x @ w.T with w stored (N, K): both operands contiguous along the reduce (torch's Linear)."""
  return A.sink(A.store(0, (F(1, M, K).reshape(M, 1, K) * F(2, N, K).reshape(1, N, K)).sum(2)))


@pytest.mark.parametrize("lanes", [16, 8])
def test_k_contiguous_matmul_is_vectorized_along_the_reduce(lanes):
  # the register tile along N would load each lane of w's rows one by one; the reduce unrolled by a vector instead,
  # one vector accumulator per output of a tile over M and N that fits the registers, each step whole-vector loads
  k = hand(mm_t(64, 256, 128), vector_renderer(lanes))
  assert kc.Opt(kc.OptOps.UNROLL, 0, lanes) in k.applied_opts
  uops = k.linearize()
  accs = [u for u in uops if u.op is Ops.DEFINE_ACC]
  regs = 32 if lanes * 4 >= 64 else 16
  assert accs and all(u.dtype == dtypes.float32.vec(lanes) for u in accs) and 4 <= len(accs) <= regs // 2
  # no packing of scalars (the even/odd shuffles of the accumulators after the loop take lanes of vectors: permutes)
  assert not any(u.op is Ops.VECTORIZE and len(set(u.src)) > 1 and u.dtype.count == lanes and not all(x.op is Ops.GEP for x in u.src)
                 for u in uops)
  # w (256 KiB: 128 rows) is the larger input: its axis N runs outermost, so it streams once
  assert kc.Opt(kc.OptOps.SWAP, 0, 1) in k.applied_opts


@pytest.mark.parametrize("M,K,N", [(8, 64, 16), (12, 48, 20), (64, 1024, 64)])
def test_k_contiguous_matmul_matches_numpy_on_clang(M, K, N):
  rng = np.random.default_rng(M * K + N)
  x, w = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((N, K)).astype(np.float32)
  out = kc.run(mm_t(M, K, N), {1: x, 2: w}, "CLANG")[0]
  np.testing.assert_allclose(out, x @ w.T, rtol=1e-4, atol=1e-4 * np.sqrt(K))


@pytest.mark.parametrize("op", ["sum", "max"])
def test_a_row_reduce_gets_the_vector_tile_for_sums_and_maxes(op):
  # a row max (softmax's, a max-pool over a contiguous axis) loads its rows as vectors like a row sum: 64 rows of 1024
  # floats, the reduce axis by 16 lanes and 4 rows at a time (one lane at a time it ran 7x slower)
  x = np.random.default_rng(7).standard_normal((64, 1024)).astype(np.float32)
  x[5, 17] = np.nan
  sink = A.sink(A.store(0, getattr(F(1, 64, 1024), op)(1)))
  k = hand(sink, vector_renderer(16))
  assert kc.Opt(kc.OptOps.UNROLL, 0, 16) in k.applied_opts
  assert all(u.dtype.count == 16 for u in k.linearize() if u.op is Ops.DEFINE_ACC)
  np.testing.assert_allclose(kc.run(sink, {1: x}, "CLANG")[0], getattr(np, op)(x, axis=1), rtol=1e-5, atol=1e-3)


def test_lane_accumulators_of_a_tile_are_vectors_only_where_the_lanes_load_as_vectors():
  # unrolled by a vector along K with 8 output lanes: w K-contiguous gives a vector accumulator per output lane;
  # the usual layout (w stored (K, N), strided along K) keeps an accumulator per output lane, as vectors along N
  opts = [kc.Opt(kc.OptOps.UNROLL, 0, 16), kc.Opt(kc.OptOps.UPCAST, 1, 4), kc.Opt(kc.OptOps.UPCAST, 0, 2)]
  for sink, vector in ((mm_t(32, 64, 32), True), (mm(32, 64, 32), False)):
    k = Kernel(sink, vector_renderer(16))
    for o in opts: k.apply_opt(o)
    accs = [u for u in k.linearize() if u.op is Ops.DEFINE_ACC]
    assert [u.dtype.count for u in accs] == ([16] * 8 if vector else [4] * 2)


def executed(uops, op) -> int:
  """How many lanes of `op` a linear program computes: each UOp's lanes times the trip counts of its loops."""
  trips, total = [1], 0
  for u in uops:
    if u.op is Ops.RANGE: trips.append(trips[-1] * (u.src[1].arg - u.src[0].arg))
    elif u.op is Ops.ENDRANGE: trips.pop()
    elif u.op is op: total += u.dtype.count * trips[-1]
  return total


def softmax_rows(rows, cols, mask: bool, batch: int = 16):
  x = F(1, batch, rows, cols) * 0.125
  if mask: x = A.arg(2, dtypes.bool, (rows, cols)).reshape(1, rows, cols).where(float("-inf"), x)
  e = (x - x.max(2, keepdims=True)).exp()
  return A.sink(A.store(0, e / e.sum(2, keepdims=True)))


@pytest.mark.parametrize("mask", [False, True])
def test_row_softmax_reduces_each_row_once(mask):
  # the max and sum of a row are broadcast back along it: no register tile splits the row into column blocks that
  # each repeat the row's reduces (a causal mask, broadcast along the batch of 16 x 128 rows, once drew one, its
  # column blocks outermost)
  k = hand(softmax_rows(128, 128, mask), vector_renderer(16))
  # each element's exp is computed twice, once in the sum's loop and once in the normalize loop (this Kernel is one of
  # a program's: kc.compile's schedule stores it once on CLANG), and no loop over column blocks outside the reduces'
  # loops repeats them
  assert executed(k.linearize(), Ops.EXP2) == 2 * 16 * 128 * 128
  assert not any(o.op is kc.OptOps.SWAP for o in k.applied_opts) and k.full_shape[k.first_upcast:].count(16) <= 1


def test_accumulators_stay_vectors_under_a_where_after_the_reduce():
  # a ReLU or a mask after a matmul is a WHERE, which C computes lane by lane: the tile's accumulators stay vectors and
  # only the WHERE after the loop runs per lane (a gradient's relu mask once made every accumulator a scalar)
  h = F(3, 64, 64)
  masked = (h > 0).where(F(1, 64, 64) @ F(2, 64, 64), 0.0)
  k = hand(A.sink(A.store(0, masked)), vector_renderer(16))
  uops = k.linearize()
  accs = [u for u in uops if u.op is Ops.DEFINE_ACC]
  assert len(accs) == 16 and all(u.dtype == dtypes.float32.vec(16) for u in accs)
  rng = np.random.default_rng(3)
  a, b, hv = (rng.standard_normal((64, 64)).astype(np.float32) for _ in range(3))
  out = kc.run(A.sink(A.store(0, masked)), {1: a, 2: b, 3: hv}, "CLANG")[0]
  np.testing.assert_allclose(out, np.where(hv > 0, a @ b, 0), rtol=1e-5, atol=1e-4)


def test_a_relu_of_the_k_contiguous_input_keeps_the_reduce_vectorized_along_k():
  # relu(x) @ w.T: each lane of x's ReLU is computed from a loaded vector's lane, packed from registers, not loaded
  # lane by lane, so the reduce stays vectorized along K (a tile of vector accumulators) instead of falling back to
  # vectors along N gathered from w's rows
  x, w = F(1, 64, 256), F(2, 128, 256)
  relu = (x > 0).where(x, 0.0)
  sink = A.sink(A.store(0, (relu.reshape(64, 1, 256) * w.reshape(1, 128, 256)).sum(2)))
  k = hand(sink, vector_renderer(16))
  accs = [u for u in k.linearize() if u.op is Ops.DEFINE_ACC]
  assert accs and all(u.dtype == dtypes.float32.vec(16) for u in accs) and kc.Opt(kc.OptOps.UNROLL, 0, 16) in k.applied_opts
  rng = np.random.default_rng(5)
  xa, wa = rng.standard_normal((64, 256)).astype(np.float32), rng.standard_normal((128, 256)).astype(np.float32)
  np.testing.assert_allclose(kc.run(sink, {1: xa, 2: wa}, "CLANG")[0], np.maximum(xa, 0) @ wa.T, rtol=1e-4, atol=1e-3)


def weight_grad(n=2, cin=3, cout=4, H=4, W=32, k=3):
  """A convolution's weight gradient as kc-torch lowers it: the padded input's windows times the output gradient,
  summed over the batch and the image: (cout, cin, k, k)."""
  x, g = F(1, n, cin, H, W), F(2, n, cout, H, W)
  win = x.pad(((0, 0), (0, 0), (1, 1), (1, 1))).windows(2, k).windows(3, k)             # (n, cin, H, W, k, k)
  prod = win.reshape(n, 1, cin, H, W, k, k) * g.reshape(n, cout, 1, H, W, 1, 1)
  return A.sink(A.store(0, prod.sum(axis=(0, 3, 4))))


def weight_grad_numpy(x, g, k=3):
  xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
  H, W = x.shape[2:]
  return np.stack([np.stack([np.einsum("nchw,nohw->oc", xp[:, :, i:i + H, j:j + W], g) for j in range(k)], -1) for i in range(k)], -2)


@pytest.mark.parametrize("W", [16, 32])
def test_a_weight_gradients_shifted_window_rows_accumulate_as_vectors(W):
  # the reduce runs along the image row, which both inputs read contiguously, the input shifted by the window's
  # column and zero where that passes the pad: each shifted row is a permute of the loaded vectors, and each
  # output of the unrolled window keeps one vector accumulator per vector of the row (no sum across lanes per step)
  opts = [kc.Opt(kc.OptOps.UNROLL, 2, W), kc.Opt(kc.OptOps.UPCAST, 3, 3), kc.Opt(kc.OptOps.UPCAST, 2, 3)]
  k = Kernel(weight_grad(W=W), vector_renderer(16))
  for o in opts: k.apply_opt(o)
  uops = k.linearize()
  accs = [u for u in uops if u.op is Ops.DEFINE_ACC]
  assert [u.dtype.count for u in accs] == [16] * (9 * W // 16)
  assert executed(uops, Ops.MUL) == 0 or all(u.dtype.count == 16 for u in uops if u.op is Ops.MUL and u.dtype.base == dtypes.float32)
  rng = np.random.default_rng(W)
  x, g = rng.standard_normal((2, 3, 4, W)).astype(np.float32), rng.standard_normal((2, 4, 4, W)).astype(np.float32)
  out = kc.run(weight_grad(W=W), {1: x, 2: g}, device="CLANG", opts=opts)[0]
  np.testing.assert_allclose(out, weight_grad_numpy(x, g), rtol=1e-4, atol=1e-4)


def test_lane_accumulators_that_would_not_fit_the_registers_stay_a_sum_per_step():
  # a 32-lane row is 2 vectors: times the 9 window outputs of 2 output channels, 36 vector accumulators, over three
  # quarters of 32 registers
  opts = [kc.Opt(kc.OptOps.UNROLL, 2, 32), kc.Opt(kc.OptOps.UPCAST, 3, 3), kc.Opt(kc.OptOps.UPCAST, 2, 3), kc.Opt(kc.OptOps.UPCAST, 0, 2)]
  k = Kernel(weight_grad(W=32), vector_renderer(16))
  for o in opts: k.apply_opt(o)
  accs = [u for u in k.linearize() if u.op is Ops.DEFINE_ACC]
  assert len(accs) == 18 and all(u.dtype.count == 1 for u in accs)


def test_a_replacement_built_on_a_node_above_another_replacement_is_built_on_its_rebuilt_version():
  """kc.codegen.vectorize.replaced: C's value is built on B, which lies above A (replaced too). The new graph holds
  C's value on the rebuilt B and no old node above A: a pass that left the old B beside the new one kept an
  accumulator's update twice (tests/test_horizontal.py, test_a_sum_of_combines_updates_its_accumulator_once)."""
  from kc.codegen.vectorize import passing_toposort, replaced
  from kc.ir.uop import UOp
  x = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ("x", 0, 9)).cast(dtypes.float32)
  a = x + 1.0
  b = a * 2.0
  c = b - 3.0
  sink = UOp(Ops.SINK, dtypes.void, (c, b))
  new_a, new_c = x + 4.0, b * 5.0  # new_c reads the old b
  out = replaced(passing_toposort(sink), {a: new_a, c: new_c})
  nodes = set(out.toposort)
  assert a not in nodes and b not in nodes  # every node above the old a is rebuilt
  assert out.src[1] == new_a * 2.0 and out.src[0] == (new_a * 2.0) * 5.0


def test_the_vectorizes_left_unwalked_come_back_as_walked(monkeypatch):
  # vectorize_alu skips the VECTORIZEs it cannot change (splats, lanes of different ops): walking every one of them
  # must give the same graph. Every example kernel, hand-coded and random tiles, on CLANG's dialect, lowered with its
  # vector axis (splats and a shifted row's mixed lanes are left) and lane by lane (where vectorize_alu builds vectors)
  import random
  from kc.ast.examples import EXAMPLES
  from kc.codegen import graph, lower as lowering, vectorize
  from kc.ir.rewrite import graph_rewrite
  from kc.schedule import schedule
  from kc.search.actions import action_list
  clang = kc_clang_renderer.ClangRenderer(native=False)
  rng, actions = random.Random(7), action_list(clang)
  widths, functions = graph._declared_widths(clang), frozenset(clang.vector_functions)
  rules = graph.lowered_rules(frozenset(clang.code_for_op or {}), clang.extra_matcher)
  choose = lowering.Lowering.choose_vector_axis
  skipped = changed = 0
  for example in EXAMPLES.values():
    for kernel in schedule(example.build()[0]).kernels:
      candidates = [Kernel(kernel.ast, clang).hand_coded_optimizations()]
      for _ in range(3):
        k = Kernel(kernel.ast, clang)
        for opt in rng.sample(actions, 12):
          try: k.apply_opt(opt)
          except kc.KcError: pass
          if len(k.applied_opts) == 3: break
        candidates.append(k)
      for k in candidates:
        try: ast = k.get_optimized_ast()
        except kc.KcError: continue
        for vector_axis in (choose, lambda self: None):
          monkeypatch.setattr(lowering.Lowering, "choose_vector_axis", vector_axis)
          sink = graph_rewrite(graph.fold_vector_accesses(lowering.lower(ast, clang), clang), rules)
          fast = vectorize.vectorize_alu(sink, widths, functions, clang.vector_select)
          skipped += sum(1 for u in sink.toposort if u.op is Ops.VECTORIZE and not vectorize._may_change(u))
          with monkeypatch.context() as m:
            m.setattr(vectorize, "_may_change", lambda v: True)
            assert vectorize.vectorize_alu(sink, widths, functions, clang.vector_select) is fast, k.applied_opts
          changed += fast is not sink
  assert skipped > 50 and changed > 5  # the rule skipped VECTORIZEs, and the pass still changed kernels
