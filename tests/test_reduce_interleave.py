"""A reduce whose loop is one accumulator chain on a host CPU (one output lane, its lanes one vector or none) runs
its loop interleaved over 2 or 4 accumulators (kc.codegen.lower: Lowering.interleave), combined after the loop: the
loop is bound by throughput, not by one op's latency per step. The results are numpy's for every reduce op, loop
length and dtype, NaN included."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import kc
from kc import Kernel, Opt, OptOps, ast as A, dtypes
from kc.ir.uop import Ops

kc_clang_renderer = pytest.importorskip("kc_clang.renderer")


def vector_cpu(lanes: int = 16):
  r = kc_clang_renderer.ClangRenderer(native=False)
  r.float_lanes, r.vector_alu = lanes, True
  return r


def accumulators(sink, renderer, opts) -> list:
  k = Kernel(sink, renderer)
  for o in opts: k.apply_opt(o)
  return [u for u in k.linearize() if u.op is Ops.DEFINE_ACC]


@pytest.mark.parametrize("steps,ways", [(64, 4), (16, 4), (8, 4), (6, 2), (4, 2), (3, 1), (2, 1)])
def test_a_vector_row_reduce_keeps_as_many_accumulators_as_its_loop_allows(steps, ways):
  # a row max of `steps` vectors of 16: the loop's steps are split `ways` ways where each way gets at least 2
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (8, 16 * steps)).max(1)))
  accs = accumulators(sink, vector_cpu(), [Opt(OptOps.UNROLL, 0, 16)])
  assert [a.dtype for a in accs if a.dtype.count == 16] == [dtypes.float32.vec(16)] * ways


def test_a_scalar_reduce_with_one_output_interleaves_too(cpu):
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (8, 64)).sum(1)))
  assert len(accumulators(sink, cpu, [])) == 4


def test_a_gpu_keeps_one_accumulator_per_thread(gpu):
  # a GPU hides the latency behind other threads: more accumulators would only cost it registers
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (8, 64)).sum(1)))
  assert len(accumulators(sink, gpu, [])) == 1


def test_a_reduce_with_many_output_lanes_is_not_interleaved(cpu):
  # four output lanes are four chains already
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (8, 64)).sum(1)))
  assert len(accumulators(sink, cpu, [Opt(OptOps.UPCAST, 0, 4)])) == 4


OPS = {"sum": (lambda x: x.sum(-1), np.sum), "max": (lambda x: x.max(-1), np.max), "min": (lambda x: x.min(-1), np.min),
       "prod": (lambda x: x.prod(-1), np.prod)}


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(OPS)), st.integers(1, 70), st.integers(1, 5), st.sampled_from(["float32", "int32", "float64", "uint8"]),
       st.booleans(), st.integers(0, 2 ** 16))
def test_interleaved_reduces_mean_what_numpy_means(op, n, rows, dtype, nan, seed):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((rows, n)) * (1.05 if op == "prod" else 20)
  x = x.astype(dtype) if dtype.startswith("float") else (x % 3 + (op == "prod")).astype(dtype) if op == "prod" else x.astype(np.int64).astype(dtype)
  if nan and dtype.startswith("float"): x[rng.integers(rows), rng.integers(n)] = np.nan
  build, ref = OPS[op]
  got = kc.run(A.sink(A.store(0, build(A.arg(1, getattr(dtypes, dtype), (rows, n))))), {1: x}, "CLANG", "hand")[0]
  want = ref(x, axis=-1)
  if dtype.startswith("float"): np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-4)
  else: np.testing.assert_array_equal(got, want)
