"""kc.schedule.pack_operand: on a host CPU dialect that computes on vectors, a large float32 matmul compiled with the
hand-coded opts is a kernel that copies its second operand into panels of W columns (W: two of the widest vectors)
and the product reading them; the program computes what numpy computes, whatever the operands' layouts."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
import kc
from kc import ast as A, dtypes
from kc.emu import DEVICE, impersonating
from kc.emu.renderer import EmuRenderer
from kc.ir.uop import Ops
from kc.schedule import schedule
from kc.schedule.pack_operand import (MIN_COLUMNS, MIN_PACKED, MIN_REDUCE, MIN_ROWS, pack_operand,
                                      panel_width)
from kc.schedule.split_reduce import TEMP

F = lambda i, *s: A.arg(i, dtypes.float32, s)  # noqa: E731


class HostRenderer(EmuRenderer):
  """EMU's renderer as a host CPU dialect: no work-groups, vector arithmetic on float32 vectors of 4 (W = 8)."""
  has_local = False
  has_shared = False
  vector_alu = True
  def vector_widths(self, dt): return (4, 2) if dt == dtypes.float32 else ()


def the_kernel(sink):
  (k,) = schedule(sink).kernels
  return k.ast


def mm(M, K, N, transposed=False):
  b = F(2, N, K).T if transposed else F(2, K, N)
  return A.sink(A.store(0, F(1, M, K) @ b))


def test_the_panel_width_is_two_of_the_widest_vectors_and_none_with_work_groups():
  assert panel_width(HostRenderer()) == 8
  assert panel_width(EmuRenderer()) is None and panel_width(None) is None


def test_a_large_matmul_is_a_pack_and_a_product_reading_the_panels():
  M, K, N = MIN_ROWS, 2 * MIN_REDUCE, MIN_COLUMNS
  p = pack_operand(the_kernel(mm(M, K, N)), HostRenderer())
  assert p is not None and p.temp_size == K * N and p.temp_dtype == dtypes.float32
  # the pack reads B (buffer 2) and writes the panels; the product reads A and the panels and writes the output
  assert p.first_buffers == (2, TEMP) and p.second_buffers == (0, 1, TEMP)
  (store,) = p.first.src
  assert store.src[1].arg.shape == (N // 8, K, 8)
  # the product reads the panels with one view: a panel's W columns contiguous, its K rows W apart
  loads = [u for u in p.second.toposort if u.op is Ops.LOAD and u.src[0].arg == 2]
  assert len(loads) == 1 and len(loads[0].src[1].arg.views) == 1
  assert sorted(s for s in loads[0].src[1].arg.views[0].strides if s) == [1, 8, 8 * K]


@pytest.mark.parametrize("sink", [
  mm(MIN_ROWS - 1, MIN_REDUCE, MIN_COLUMNS), mm(MIN_ROWS, MIN_REDUCE - 1, MIN_COLUMNS), mm(MIN_ROWS, MIN_REDUCE, MIN_COLUMNS - 8),
  mm(MIN_ROWS, MIN_REDUCE, MIN_COLUMNS + 4),  # N not a multiple of W
  mm(MIN_ROWS, MIN_REDUCE, MIN_COLUMNS) if MIN_REDUCE * MIN_COLUMNS < MIN_PACKED else mm(8, 8, 8),  # B too small
  A.sink(A.store(0, A.arg(1, dtypes.int32, (128, 512)) @ A.arg(2, dtypes.int32, (512, 256)))),  # not float32
  A.sink(A.store(0, (F(1, 128, 512) @ F(2, 512, 256)) * (F(3, 128, 512) @ F(4, 512, 256)))),  # two reduces
  A.sink(A.store(0, F(1, 128, 512) @ F(2, 506, 256).pad(((3, 3), (0, 0))))),  # B masked
  A.sink(A.store(0, (F(1, 128, 512) * 2) @ F(2, 512, 256))),  # A computed
  A.sink(A.store(0, F(1, 2, 128, 512) @ F(2, 2, 512, 256))),  # batched: four axes
], ids=["few rows", "short reduce", "few columns", "ragged columns", "small B", "int", "two reduces", "masked",
        "computed", "batched"])
def test_what_stays_one_kernel(sink):
  assert pack_operand(the_kernel(sink), HostRenderer()) is None


def test_a_b_read_across_n_is_not_packed():
  # x @ W.T: K-contiguous loads on both sides (vector dot products already), and its pack would be a transpose
  assert pack_operand(the_kernel(mm(MIN_ROWS, 2 * MIN_REDUCE, MIN_COLUMNS, transposed=True)), HostRenderer()) is None


def test_devices_with_work_groups_or_no_vectors_keep_one_kernel():
  ast = the_kernel(mm(MIN_ROWS, 2 * MIN_REDUCE, MIN_COLUMNS))
  assert pack_operand(ast, HostRenderer()) is not None and pack_operand(ast, EmuRenderer()) is None
  scalar = HostRenderer()
  scalar.vector_alu = False
  assert pack_operand(ast, scalar) is None


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(M=st.sampled_from([128, 136]), K=st.sampled_from([512, 520]), N=st.sampled_from([256, 272]),
       layout=st.sampled_from(["ab", "ba", "bias_relu", "wide"]))
def test_packed_programs_on_emu_mean_what_numpy_means(emu, M, K, N, layout):
  # B row-major, the operands in the other order (B's load first), a bias and ReLU after the product, and the
  # product with size-1 axes in its kernel (as kc-torch's Linear layers have)
  rng = np.random.default_rng(M + K + N)
  x, y, bias = (rng.standard_normal(s).astype(np.float32) for s in ((M, K), (K, N), (N,)))
  a, b = F(1, M, K).reshape(M, K, 1), F(2, K, N).reshape(1, K, N)
  want = x.astype(np.float64) @ y.astype(np.float64)
  if layout == "wide": value = (F(1, M, K).reshape(M, 1, K, 1) * F(2, K, N).reshape(1, 1, K, N)).sum(2).reshape(M, N)
  else: value = (b * a if layout == "ba" else a * b).sum(1)
  if layout == "bias_relu": value, want = (value + F(3, N)).maximum(0.0), np.maximum(want + bias, 0)
  sink = A.sink(A.store(0, value))
  emu.renderer = impersonating(HostRenderer())
  assert len(kc.compile(sink, device=DEVICE, opts="hand").kernels) == 2
  inputs = {1: x, 2: y, 3: bias} if layout == "bias_relu" else {1: x, 2: y}
  got = kc.run(sink, inputs, device=DEVICE, opts="hand")[0].reshape(M, N)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_pack_kernel_writes_numpys_panels(emu):
  M, K, N = MIN_ROWS, 2 * MIN_REDUCE, MIN_COLUMNS
  emu.renderer = impersonating(HostRenderer())
  p = pack_operand(the_kernel(mm(M, K, N)), emu.renderer)
  y = np.random.default_rng(0).standard_normal((K, N)).astype(np.float32)
  panels = kc.run(p.first, {0: y}, device=DEVICE)[1]
  np.testing.assert_array_equal(panels.reshape(N // 8, K, 8), y.reshape(K, N // 8, 8).transpose(1, 0, 2))


def test_explicit_opts_and_split_reduce_off_keep_one_kernel(emu):
  emu.renderer = impersonating(HostRenderer())
  sink = mm(MIN_ROWS, 2 * MIN_REDUCE, MIN_COLUMNS)
  assert len(kc.compile(sink, device=DEVICE, opts="hand").kernels) == 2
  assert not hasattr(kc.compile(sink, device=DEVICE, opts="none"), "kernels")
  assert not hasattr(kc.compile(sink, device=DEVICE, opts="hand", split_reduce=False), "kernels")


@pytest.mark.parametrize("n,swapped", [(512, False), (2048, True)])
def test_the_product_runs_its_panel_loop_outermost_where_b_does_not_fit_the_cache(n, swapped):
  # the columns within a panel are upcast whole, so the loop over panels is the product's own N/W axis: the
  # hand-coded opts swap it outside the rows' loop where B (here 1 MB, 16 MB) streams from beyond the cache
  from kc.kernel import Kernel
  from kc.kernel.heuristics import hand_coded_optimizations
  k = Kernel(pack_operand(the_kernel(mm(n, n, n)), HostRenderer()).second, HostRenderer())
  hand_coded_optimizations(k)
  assert (kc.Opt(kc.OptOps.SWAP, 0, 1) in k.applied_opts) == swapped
