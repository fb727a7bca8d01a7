"""hand_coded_optimizations picks the opts of the seeds' heuristics. The expected opts below are the choices of
the reference implementation (tinygrad 0.10.0's Kernel.hand_coded_optimizations) on the same ASTs, for a
GPU-like target (locals, 32 KiB shared) and a CPU-like one (no locals), but where kc differs on purpose: a grouped
reduce whose own loop a load walks contiguously steps 4 elements at a time (UNROLL of that loop by 4: vector loads,
and vector work on them; the reference stops at the GROUPTOP)."""
import pytest
from hypothesis import given, settings, strategies as st
from kc import ast as A, dtypes
from kc.kernel import Kernel, Opt, OptOps

F = lambda i, *s: A.arg(i, dtypes.float32, s)  # noqa: E731


def mm(M, K, N): return A.sink(A.store(0, (F(1, M, K).reshape(M, K, 1) * F(2, K, N).reshape(1, K, N)).sum(1)))


CASES = {
  "matmul_64x32x48": (lambda: mm(64, 32, 48),
    ((2, 8, 16, 3, 4, 32), [("UPCAST", 1, 3), ("UPCAST", 0, 4), ("UNROLL", 0, 0), ("LOCAL", 0, 8), ("LOCAL", 1, 16)]),
    ((16, 16, 3, 4, 32), [("UPCAST", 1, 3), ("UPCAST", 0, 4), ("UNROLL", 0, 0)])),
  "matmul_128": (lambda: mm(128, 128, 128),
    ((4, 2, 8, 16, 32, 4, 4, 4), [("UPCAST", 1, 4), ("UPCAST", 0, 4), ("UNROLL", 0, 4), ("LOCAL", 0, 8), ("LOCAL", 1, 16)]),
    ((32, 32, 32, 4, 4, 4), [("UPCAST", 1, 4), ("UPCAST", 0, 4), ("UNROLL", 0, 4)])),
  "matvec_1x1024x1024": (lambda: mm(1, 1024, 1024),
    ((64, 4, 8, 128, 4), [("GROUP", 0, 8), ("LOCAL", 0, 4), ("UPCAST", 0, 4)]),
    ((256, 256, 4, 4), [("UPCAST", 0, 4), ("UNROLL", 0, 4)])),
  "matrix_times_vector": (lambda: A.sink(A.store(0, (F(1, 1024, 1024) * F(2, 1024).reshape(1, 1024)).sum(1))),
    ((64, 4, 8, 128, 4), [("GROUP", 0, 8), ("LOCAL", 0, 4), ("UPCAST", 0, 4)]),
    ((256, 256, 4, 4), [("UPCAST", 0, 4), ("UNROLL", 0, 4)])),
  "sum_to_scalar_4096": (lambda: A.sink(A.store(0, F(1, 4096).sum())),
    ((256, 4, 4), [("GROUPTOP", 0, 256), ("UNROLL", 1, 4)]), ((1024, 4), [("UNROLL", 0, 4)])),
  "sum_rows_64x256": (lambda: A.sink(A.store(0, F(1, 64, 256).sum(1))),
    ((64, 16, 4, 4), [("GROUPTOP", 0, 16), ("UNROLL", 1, 4)]), ((64, 64, 4), [("UNROLL", 0, 4)])),
  "sum_cols_256x64": (lambda: A.sink(A.store(0, F(1, 256, 64).sum(0))),
    ((64, 16, 16), [("GROUPTOP", 0, 16)]), ((64, 64, 4), [("UNROLL", 0, 4)])),
  "elementwise_64x64": (lambda: A.sink(A.store(0, F(1, 64, 64) + F(2, 64, 64))),
    ((32, 32, 4), [("UPCAST", 0, 4), ("LOCAL", 0, 32)]), ((1024, 4), [("UPCAST", 0, 4)])),
  "elementwise_1000": (lambda: A.sink(A.store(0, F(1, 1000) * F(2, 1000))),
    ((125, 2, 4), [("UPCAST", 0, 4), ("LOCAL", 0, 2)]), ((250, 4), [("UPCAST", 0, 4)])),
  "max_rows_33x77": (lambda: A.sink(A.store(0, F(1, 33, 77).max(1))),
    ((11, 3, 77), [("LOCAL", 0, 3)]), ((33, 77), [])),
}


def picked(ast, renderer):
  k = Kernel(ast, renderer).hand_coded_optimizations()
  return k.full_shape, [(o.op.name, o.axis, o.amt) for o in k.applied_opts]


@pytest.mark.parametrize("name", list(CASES))
def test_hand_coded_choices(name, gpu, cpu):
  build, want_gpu, want_cpu = CASES[name]
  assert picked(build(), gpu) == want_gpu
  assert picked(build(), cpu) == want_cpu


def test_matvec_knobs(gpu, monkeypatch):
  monkeypatch.setenv("KC_MV_THREADS_PER_ROW", "16")
  assert picked(mm(1, 1024, 1024), gpu)[1][0] == ("GROUP", 0, 16)
  monkeypatch.setenv("KC_MV", "0")
  assert all(op != "GROUP" for op, _, _ in picked(mm(1, 1024, 1024), gpu)[1])


def test_nolocals_knob(gpu, monkeypatch):
  monkeypatch.setenv("KC_NOLOCALS", "1")
  k = Kernel(A.sink(A.store(0, F(1, 64, 64) + F(2, 64, 64))), gpu).hand_coded_optimizations()
  assert k.dont_use_locals and k.applied_opts[-1] == Opt(OptOps.NOLOCALS)


def test_masked_small_axes_are_upcast(cpu):
  # a stack of 3 along a new leading axis: each slice is a padded (masked) view
  parts = [F(i + 1, 1, 64).pad(((i, 2 - i), (0, 0))) for i in range(3)]
  k = Kernel(A.sink(A.store(0, parts[0] + parts[1] + parts[2])), cpu).hand_coded_optimizations()
  assert Opt(OptOps.UPCAST, 0, 0) in k.applied_opts and k.full_shape[-1] in (3, 4)


def test_every_choice_is_legal_and_reproducible(gpu):
  # replaying the picked opts on a fresh Kernel gives the same shape: the heuristic only uses apply_opt
  for build, _, _ in CASES.values():
    k = Kernel(build(), gpu).hand_coded_optimizations()
    r = Kernel(build(), gpu)
    for o in k.applied_opts: r.apply_opt(o)
    assert r.full_shape == k.full_shape and r.colors() == k.colors()


@pytest.mark.parametrize("shape,tile", [((1024, 512), 8), ((96, 36), 4), ((64, 3), None)])
def test_a_transposing_copy_gets_a_square_tile_and_matches_numpy(cpu, shape, tile):
  # the output is contiguous along its last axis, the input along its first: both upcast (the input's first), so
  # each step loads whole input rows and stores whole output rows; an axis too short for a tile leaves the usual opts
  import numpy as np
  import kc
  n, k_ = shape
  sink = A.sink(A.store(0, F(1, n, k_).permute(1, 0) * 2))
  k = Kernel(sink, cpu).hand_coded_optimizations()
  if tile is None: assert len([o for o in k.applied_opts if o.op is OptOps.UPCAST]) <= 1
  else: assert k.applied_opts == [Opt(OptOps.UPCAST, 0, tile), Opt(OptOps.UPCAST, 1, tile)]
  x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
  np.testing.assert_array_equal(kc.run(sink, {1: x}, "CLANG")[0], x.T * 2)


def test_a_copy_without_a_transpose_gets_no_square_tile(cpu):
  k = Kernel(A.sink(A.store(0, F(1, 64, 64) + F(2, 64, 64).permute(1, 0).permute(1, 0))), cpu).hand_coded_optimizations()
  assert len(k.applied_opts) == 1


@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("shape", [(64, 1024), (256, 64), (3, 512), (48, 96)])
def test_a_column_reduce_runs_on_vectors_of_its_contiguous_output_axis(op, shape):
  """(g * x).op(0): nothing broadcast, the output and both inputs contiguous along the columns, the reduce walking
  rows. On CLANG the columns are upcast by the widest vector (and up to 4 of them): every load of the reduce's loop
  is a whole vector of a row, where it was one float; numpy's result."""
  import numpy as np
  import kc
  n, d = shape
  sink = A.sink(A.store(0, getattr(F(1, n, d) * F(2, n, d), op)(0)))
  renderer = kc.Device["CLANG"].renderer
  width = max(renderer.vector_widths(dtypes.float32))
  k = Kernel(sink, renderer).hand_coded_optimizations()
  assert k.applied_opts[0] == Opt(OptOps.UPCAST, 0, width), k.applied_opts
  loads = [u for u in k.linearize() if u.op.name == "LOAD" and u.dtype.scalar() == dtypes.float32]
  assert loads and all(u.dtype.count == width for u in loads)
  rng = np.random.default_rng(1)
  g, x = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
  np.testing.assert_allclose(kc.run(sink, {1: g, 2: x}, "CLANG")[0], getattr(np, op)(g * x, 0), rtol=1e-4, atol=1e-4)


def _two_products(transposed: bool, n_out: int):
  """n_out batched products stored side by side (one loop nest, as an attention backward's): out_i = a_i @ b_i over
  (4, 32, 48) x (4, 48, 64), each b_i read K-contiguous (transposed, b_i.T stored as (4, 64, 48)) or N-contiguous."""
  outs = []
  for i in range(n_out):
    a = A.arg(n_out + 2 * i, dtypes.float32, (4, 32, 48))
    b = A.arg(n_out + 2 * i + 1, dtypes.float32, (4, 64, 48)).permute(0, 2, 1) if transposed else \
        A.arg(n_out + 2 * i + 1, dtypes.float32, (4, 48, 64))
    outs.append(A.store(i, (a.reshape(4, 32, 48, 1) * b.reshape(4, 1, 48, 64)).sum(2)))
  return A.sink(*outs)


@pytest.mark.parametrize("n_out", [1, 2, 3])
def test_products_side_by_side_get_the_tiles_of_one_with_room_for_each(n_out):
  """Side-by-side reduces share a tile: K-contiguous operands get the reduce's vector tile (its axis unrolled by the
  widest vector), as one product does (two products fell to vectors along N, loaded lane by lane: an attention
  backward's 3.6x slower); N-contiguous ones the register tile, sized so that every reduce's accumulators and loaded
  vectors fit the registers (three products spilled a tile sized for one). numpy's products either way."""
  import numpy as np
  import kc
  from kc.helpers import prod, vector_registers
  renderer = kc.Device["CLANG"].renderer
  width = max(renderer.vector_widths(dtypes.float32))
  regs = vector_registers(width * 4)
  rng = np.random.default_rng(n_out)
  for transposed in (True, False):
    sink = _two_products(transposed, n_out)
    k = Kernel(sink, renderer).hand_coded_optimizations()
    if transposed: assert k.applied_opts[0] == Opt(OptOps.UNROLL, 0, width), k.applied_opts
    else:
      assert k.applied_opts[0] == Opt(OptOps.UPCAST, 2, width), k.applied_opts
      lanes = prod(o.amt for o in k.applied_opts if o.op is OptOps.UPCAST)
      cols = prod(o.amt for o in k.applied_opts if o.op is OptOps.UPCAST and o.axis == 2) // width
      assert n_out * (lanes // width + cols) + 1 <= regs, k.applied_opts
    ins = {n_out + j: rng.standard_normal((4, 64, 48) if transposed and j % 2 else (4, 32, 48) if j % 2 == 0 else (4, 48, 64)).astype(np.float32)
           for j in range(2 * n_out)}
    got = kc.run(sink, ins, "CLANG")
    for i in range(n_out):
      b = ins[n_out + 2 * i + 1]
      np.testing.assert_allclose(got[i], ins[n_out + 2 * i] @ (b.transpose(0, 2, 1) if transposed else b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cols", ["4w-2", "3w+1", "w+w/4"])
def test_an_output_axis_off_the_vector_width_is_padded_to_it_and_tiled(cols):
  """x @ w with N no multiple of the widest vector (a vocabulary of 1000, a conv's 30 or 13 columns): on CLANG, N is
  padded to a multiple (PADTO: the tail's lanes masked) and upcast by the widest vector, one col of vectors, where
  padding adds at most a third of the work; scalar accumulators were the alternative (x @ w of 2048x128x1000: 35 ->
  124 GFLOP/s on one thread). Padding by more (w + w/4 columns to 2w) is left alone. numpy's product either way."""
  import numpy as np
  import kc
  renderer = kc.Device["CLANG"].renderer
  width = max(renderer.vector_widths(dtypes.float32))
  n = {"4w-2": 4 * width - 2, "3w+1": 3 * width + 1, "w+w/4": width + width // 4}[cols]
  sink = mm(24, 40, n)
  k = Kernel(sink, renderer).hand_coded_optimizations()
  padded = -(-n // width) * width
  if 3 * padded <= 4 * n:
    assert k.applied_opts[:2] == [Opt(OptOps.PADTO, 1, width), Opt(OptOps.UPCAST, 1, width)], k.applied_opts
    assert k.full_shape[k.first_upcast] == width and padded in (k.full_shape[1] * width, k.full_shape[1])
  else: assert all(o.op is not OptOps.PADTO for o in k.applied_opts), k.applied_opts
  rng = np.random.default_rng(n)
  a, b = rng.standard_normal((24, 40)).astype(np.float32), rng.standard_normal((40, n)).astype(np.float32)
  out = kc.run(sink, {1: a, 2: b}, "CLANG")[0]
  assert out.shape == (24, n)
  np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


# sibling reduces: several reduces over one axis of the same inputs in one kernel (a layer norm's backward sums g * w
# and g * w * xhat over each row). The matrix-vector step GROUPs the first reduce, which the kernel refuses with
# another reduce beside it: the step is skipped as a whole, and the kernel keeps the other steps' opts
SIBLINGS = {"xy": lambda x, y, ax: (x * y).sum(ax), "x": lambda x, y, ax: x.sum(ax), "xx": lambda x, y, ax: (x * x).sum(ax),
            "ymax": lambda x, y, ax: y.max(ax)}


@settings(max_examples=25, deadline=None)
@given(rows=st.sampled_from([1, 5, 16, 32, 64]), cols=st.sampled_from([3, 16, 64, 1024]), axis=st.sampled_from([0, 1]),
       terms=st.lists(st.sampled_from(sorted(SIBLINGS)), min_size=2, max_size=3, unique=True), full=st.booleans())
def test_sibling_reduces_get_legal_opts_on_every_target_and_match_numpy(rows, cols, axis, terms, full):
  import numpy as np
  import kc
  from target_renderers import cpu_limits, gpu_limits, tensor_core_gpu_limits
  x, y = F(1, rows, cols), F(2, rows, cols)
  def value(x, y, reduce_keepdims):  # noqa: E306 (numpy's arrays and kc.ast's values alike)
    total = None
    for t in terms:
      r = SIBLINGS[t](x, y, axis)
      r = reduce_keepdims(r)
      total = r if total is None else total + r
    return x - total if full else total
  sink = A.sink(A.store(0, value(x, y, lambda r: r.reshape((1, cols) if axis == 0 else (rows, 1)) if full else r)))
  for renderer in (gpu_limits(), cpu_limits(), tensor_core_gpu_limits()):
    k = Kernel(sink, renderer).hand_coded_optimizations()
    replayed = Kernel(sink, renderer)
    for o in k.applied_opts: replayed.apply_opt(o)
    assert replayed.full_shape == k.full_shape
  rng = np.random.default_rng(rows * cols)
  xs, ys = (rng.standard_normal((rows, cols)).astype(np.float32) for _ in range(2))
  want = value(xs, ys, lambda r: np.expand_dims(r, axis) if full else r)
  reads_y = any(t in ("xy", "ymax") for t in terms)
  got = kc.run(sink, {1: xs, 2: ys} if reads_y else {1: xs}, "EMU", opts="hand")[0]
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * cols)


def test_a_step_that_the_kernel_refuses_half_way_leaves_it_as_it_was(gpu):
  from kc.errors import KernelOptError
  from kc.kernel.heuristics import _step
  k = Kernel(mm(64, 32, 48), gpu)
  def half(k):  # noqa: E306
    k.apply_opt(Opt(OptOps.UPCAST, 0, 4))
    k.apply_opt(Opt(OptOps.UNROLL, 0, 64))  # more than the reduce has: refused
  before = (k.full_shape, list(k.applied_opts))
  assert _step(k, half) is False and (k.full_shape, k.applied_opts) == before
  with pytest.raises(KernelOptError): k.apply_opt(Opt(OptOps.UNROLL, 0, 64))
  assert _step(k, lambda k: k.apply_opt(Opt(OptOps.UPCAST, 0, 4)) or True) and k.applied_opts == [Opt(OptOps.UPCAST, 0, 4)]
