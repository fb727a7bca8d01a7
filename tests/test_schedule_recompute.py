"""kc.schedule.recompute: a transcendental value two loop nests of a kernel would each compute is stored once, on the
devices that compute transcendentals in software (host CPUs), above a size; a reduce's result that a kernel would
compute again for each output of another reduce reading it is stored once on every device; the programs mean what
numpy means."""
import numpy as np
from hypothesis import given, settings, strategies as st
import kc
from kc import ast as A, dtypes
from kc.schedule import schedule
from kc.schedule.movement import kernel_nodes
from kc.backend import estimate_ops
from kc.schedule.recompute import (MIN_ELEMENTS, MIN_RECOMPUTED, TRANSCENDENTAL, computes_transcendentals_in_software, recomputed_reduces,
                                   recomputed_transcendentals)


def softmax(shape):
  x = A.arg(1, dtypes.float32, shape)
  e = (x - x.max(-1, keepdims=True)).exp()
  return A.sink(A.store(0, e / e.sum(-1, keepdims=True)))


def transcendentals(plan) -> int:
  """The transcendental ops of all the kernels of a plan, each kernel's graph counted once."""
  return sum(u.op in TRANSCENDENTAL for k in plan.kernels for u in kernel_nodes(k.ast))


def test_a_large_softmax_computes_its_exp_once():
  sink = softmax((256, 1024))
  plain, shared = schedule(sink), schedule(sink, share_transcendentals=True)
  assert len(plain.kernels) == 1 and len(shared.kernels) == 2 and len(shared.temps) == 1
  # the plain kernel holds the exp once as a graph node, but its two loops each compute it: the shared plan's
  # kernels hold it once, in the kernel that stores it
  assert recomputed_transcendentals(s.src[2] for s in plain.kernels[0].ast.src)
  assert all(not recomputed_transcendentals(s.src[2] for s in k.ast.src) for k in shared.kernels)
  assert transcendentals(shared) == 1


def test_below_the_size_one_kernel_recomputes():
  rows = MIN_ELEMENTS // 128 - 1
  assert len(schedule(softmax((rows, 128)), share_transcendentals=True).kernels) == 1
  assert len(schedule(softmax((rows + 1, 128)), share_transcendentals=True).kernels) == 2


def test_values_without_transcendentals_stay_recomputed():
  # a layer norm reads x - mean in its variance's loop and in its output's: a subtraction is cheaper than a load
  x = A.arg(1, dtypes.float32, (256, 1024))
  d = x - x.mean(-1, keepdims=True)
  sink = A.sink(A.store(0, d / ((d * d).mean(-1, keepdims=True) + 1e-5).sqrt()))
  assert len(schedule(sink, share_transcendentals=True).kernels) == 1


def test_only_host_devices_share(cpu, gpu):
  assert computes_transcendentals_in_software(cpu) and not computes_transcendentals_in_software(gpu)


def test_compile_shares_on_clang_and_keeps_a_list_of_opts_per_plain_kernel():
  sink = softmax((128, 256))
  assert len(kc.compile(sink, "CLANG").kernels) == 2
  # a list of opts is given for the kernels of kc.schedule.schedule(sink): here one kernel's kc.Opts
  one = kc.compile(sink, "CLANG", opts=[kc.Opt(kc.OptOps.UPCAST, 1, 4)])
  assert type(one) is kc.CompiledKernel and one.kernel.applied_opts == [kc.Opt(kc.OptOps.UPCAST, 1, 4)]


ELEMENTWISE = {"exp": lambda v: v.exp(), "sin": lambda v: v.sin(), "log": lambda v: (v * v + 1.0).log(), "pow": lambda v: (v * v + 1.0) ** 1.5}
NP = {"exp": np.exp, "sin": np.sin, "log": lambda v: np.log(v * v + 1), "pow": lambda v: (v * v + 1) ** 1.5}


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(sorted(ELEMENTWISE)), st.sampled_from(["max", "sum"]), st.sampled_from(["sum", "max"]),
       st.sampled_from([(16, 1024), (128, 128), (4, 64), (3, 5, 2048)]), st.booleans(), st.integers(0, 2 ** 16))
def test_shared_values_mean_what_numpy_means(fn, first, second, shape, use_twice, seed):
  # f(x - first(x)) read by a second reduce and by the stored value (or by two stores): one kernel reads it in two
  # loops; on CLANG it is stored once where it is large. Either way, numpy's result, and no kernel computes it twice.
  n_in = 2 if use_twice else 1  # the input's buffer index, after the outputs'
  x = A.arg(n_in, dtypes.float32, shape)
  xs = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
  r1 = getattr(x, first)(-1, keepdims=True)
  v = ELEMENTWISE[fn](x * 0.5 - r1 * 0.25)
  out = v * getattr(v, second)(-1, keepdims=True)
  stores = [A.store(0, out)] + ([A.store(1, v + 1.0)] if use_twice else [])
  sink = A.sink(*stores)
  n1 = getattr(np, first)(xs, -1, keepdims=True)
  nv = NP[fn](xs * 0.5 - n1 * 0.25)
  want = [nv * getattr(np, second)(nv, -1, keepdims=True)] + ([nv + 1] if use_twice else [])
  got = kc.run(sink, {n_in: xs}, "CLANG", "hand")
  for g, w in zip((got[i] for i in range(len(want))), want): np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5 * float(np.abs(w).max()))
  plan = schedule(sink, share_transcendentals=True)
  assert all(not recomputed_transcendentals(s.src[2] for s in k.ast.src) for k in plan.kernels)


def rms_weight_gradient(n, d):
  """An RMSNorm's weight gradient: sum_i g[i, j] x[i, j] rstd[i], rstd[i] = 1/sqrt(mean_k x[i, k]^2 + eps)."""
  x, g = A.arg(1, dtypes.float32, (n, d)), A.arg(2, dtypes.float32, (n, d))
  rstd = ((x * x).sum(1).reshape(n, 1) * (1 / d) + 1e-6).sqrt().reciprocal()
  return A.sink(A.store(0, (g * x * rstd.expand(n, d)).sum(0)))


def test_a_reduce_read_inside_a_reduce_over_its_rows_is_stored_once():
  sink = rms_weight_gradient(64, 1024)
  assert recomputed_reduces(s.src[2] for s in sink.src)
  plan = schedule(sink)
  assert len(plan.kernels) == 2 and len(plan.temps) == 1 and plan.temps[0].size == 64  # rstd, once per row
  assert all(not recomputed_reduces(s.src[2] for s in k.ast.src) for k in plan.kernels)


def test_a_reduce_read_inside_a_reduce_over_the_same_rows_stays_in_one_kernel():
  # a variance reads its row's mean inside its own loop over the row: computed once per row, before that loop
  x = A.arg(1, dtypes.float32, (256, 1024))
  d = x - x.mean(-1, keepdims=True)
  sink = A.sink(A.store(0, (d * d).mean(-1)))
  assert not recomputed_reduces(s.src[2] for s in sink.src)
  assert len(schedule(sink).kernels) == 1


def _ops(ck) -> int:
  return sum(estimate_ops(p.uops) for p in getattr(ck, "programs", (ck.program,)))


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([(64, 1024), (8, 16), (256, 32), (1024, 64)]), st.sampled_from(["sum", "max"]), st.sampled_from(["sum", "max"]),
       st.sampled_from([0, 1]), st.integers(0, 2 ** 16))
def test_nested_reduces_cost_what_their_inputs_do_and_mean_what_numpy_means(shape, inner, outer, axis, seed):
  """inner(x, axis) broadcast back and read inside outer(g * x * that, the other axis): numpy's result, and the
  kernels' operations bounded by a multiple of the elements (plus what recomputing below MIN_RECOMPUTED may cost),
  where one kernel computed the inner reduce again for every index of the outer's result."""
  n, d = shape
  other = 1 - axis
  x, g = A.arg(1, dtypes.float32, shape), A.arg(2, dtypes.float32, shape)
  r = getattr(x * x, inner)(axis, keepdims=True) * 0.5 + 1.0
  sink = A.sink(A.store(0, getattr(g * x * r, outer)(other)))
  rng = np.random.default_rng(seed)
  xs, gs = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
  want = getattr(np, outer)(gs * xs * (getattr(np, inner)(xs * xs, axis, keepdims=True) * 0.5 + 1.0), other)
  ck = kc.compile(sink, "CLANG", "hand")
  got = np.zeros(want.shape, np.float32)
  ck(got, xs, gs)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
  assert _ops(ck) <= 32 * (n * d + MIN_RECOMPUTED)
