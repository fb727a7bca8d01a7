"""The vector axis (kc.codegen.lower.Lowering.choose_vector_axis): its values lowered for all of its lanes at once
must give the kernel the lane-by-lane lowering becomes after the vector passes."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from kc import ast as A
from kc.kernel import Kernel
from kc.codegen.graph import rewrite_lowered
from kc.errors import KcError
from kc.ir.dtype import dtypes
from kc.ir.uop import Ops


def _random_tiles(ast, renderer, rng, actions, n: int, tries: int) -> list:
  """n Kernels of `ast`, each with up to three of the search's `actions` that apply, tried in a random order."""
  kernels = []
  for _ in range(n):
    k = Kernel(ast, renderer)
    for opt in rng.sample(actions, tries):
      try: k.apply_opt(opt)
      except KcError: pass
      if len(k.applied_opts) == 3: break
    kernels.append(k)
  return kernels


def _rendered_both_ways(ast, renderer, monkeypatch):
  """The source of `ast` as it is lowered, and lowered lane by lane with no vector axis. (Sources, not graphs: a
  vector accumulator holds its lanes' accumulator numbers, which the lane-by-lane lowering hands out in the order it
  meets the lanes; the source names accumulators by where they are declared.)"""
  from kc.codegen import lower as lowering
  from kc.codegen.linearize import linearize
  render = lambda: renderer.render("k", linearize(rewrite_lowered(lowering.lower(ast, renderer), renderer)))  # noqa: E731
  with_axis = render()
  with monkeypatch.context() as m:
    m.setattr(lowering.Lowering, "choose_vector_axis", lambda self: None)
    lane_by_lane = render()
  return with_axis, lane_by_lane


@pytest.mark.parametrize("lanes", [16, 8])
def test_the_vector_axis_builds_what_the_lanes_become(lanes, monkeypatch):
  # a vector axis lowered as whole vectors must give exactly the kernel the lane-by-lane lowering becomes after the
  # vector passes (fold_vector_accesses, vectorize_alu): every example kernel, hand-coded and random opts, on CLANG's
  # dialect at two vector widths; and the axis must be taken somewhere (else the test would test nothing)
  import random
  from kc.ast.examples import EXAMPLES
  from kc.codegen import lower as lowering
  from kc.schedule import schedule
  from kc.search.actions import action_list
  clang = pytest.importorskip("kc_clang.renderer").ClangRenderer(native=False)
  clang.float_lanes = lanes
  taken, rng, actions = [0], random.Random(lanes), action_list(clang)
  choose = lowering.Lowering.choose_vector_axis

  def counted(self):
    choose(self)
    taken[0] += self.vector_axis is not None
  monkeypatch.setattr(lowering.Lowering, "choose_vector_axis", counted)
  for name, example in EXAMPLES.items():
    for kernel in schedule(example.build()[0]).kernels:
      candidates = [Kernel(kernel.ast, clang).hand_coded_optimizations()] + _random_tiles(kernel.ast, clang, rng, actions, 4, 12)
      for k in candidates:
        try: ast = k.get_optimized_ast()
        except KcError: continue
        with_axis, lane_by_lane = _rendered_both_ways(ast, clang, monkeypatch)
        assert with_axis == lane_by_lane, f"{name}: {k.applied_opts}"
  assert taken[0] >= 5


@pytest.mark.parametrize("opts", [
  # a reduce padded to 32 rows and unrolled: the padded rows' loads never happen, each lane's 0 (no vector of them)
  [("UPCAST", 0, 0), ("PADTO", 0, 32), ("UNROLL", 0, 0)],
  # the rows unrolled beside the vector: real vectors and lanes combined pairwise
  [("UPCAST", 0, 0), ("UNROLL", 0, 4)],
  # a row's window shifted by one: no aligned vector, every lane its own load
  [("UPCAST", 0, 0)],
])
def test_the_vector_axis_builds_what_the_lanes_become_for_these_tiles(opts, monkeypatch):
  from kc.kernel import Opt, OptOps
  clang = pytest.importorskip("kc_clang.renderer").ClangRenderer(native=False)
  clang.float_lanes = 16
  F = lambda i, *s: A.arg(i, dtypes.float32, s)  # noqa: E731
  x = F(1, 16, 17)
  asts = {"column sums": A.sink(A.store(0, F(1, 16, 16).sum(0))),
          "shifted rows": A.sink(A.store(0, (x[:, 1:] * 2.0 + x[:, :16]).sum(0)))}
  for name, ast in asts.items():
    k = Kernel(ast, clang)
    for op, axis, amt in opts: k.apply_opt(Opt(OptOps[op], axis, amt))
    with_axis, lane_by_lane = _rendered_both_ways(k.get_optimized_ast(), clang, monkeypatch)
    assert with_axis == lane_by_lane, name


def test_the_vector_axis_on_fuzzed_kernels(monkeypatch):
  # kc fuzz's kernels under hand-coded and random opts on this machine's CLANG: the lane-by-lane kernel, or where the
  # vector passes took two reduces' accumulators, added up afterwards, as the lanes of one vector accumulator (a
  # float2 per output lane), the vector axis keeps each reduce's own accumulator vector: a kernel that gives numpy's
  # answers (the fuzzer's check)
  import kc
  from kc.codegen import lower as lowering
  from kc.schedule import schedule
  from kc.tools.fuzz.check import judge, reference
  from kc.tools.fuzz.generate import generate
  from kc.tools.fuzz.recipe import kc_lines
  from kc.tools.fuzz.worker import Job, opts_from_spec, random_opts, run_job
  if kc.Device.unavailable_reason("CLANG") is not None: pytest.skip("no CLANG here")
  clang = kc.Device["CLANG"].renderer
  taken, choose, differ = [0], lowering.Lowering.choose_vector_axis, set()

  def counted(self):
    choose(self)
    taken[0] += self.vector_axis is not None
  monkeypatch.setattr(lowering.Lowering, "choose_vector_axis", counted)
  for seed in range(1000, 1400):
    r = generate(seed)
    ns = {"A": A, "dtypes": dtypes, "np": np}
    try: exec("\n".join(kc_lines(r)), ns)  # noqa: S102 (the fuzzer's own generated kc.ast code)
    except KcError: continue
    for i, kernel in enumerate(schedule(ns["sink"]).kernels):
      for mode in ("hand", "random"):
        k = Kernel(kernel.ast, clang)
        try:
          if mode == "hand": k.hand_coded_optimizations()
          else:
            for opt in opts_from_spec(random_opts(kernel.ast, "CLANG", f"{seed}:{i}")): k.apply_opt(opt)
          ast = k.get_optimized_ast()
        except KcError: continue
        with_axis, lane_by_lane = _rendered_both_ways(ast, clang, monkeypatch)
        if with_axis != lane_by_lane: differ.add(seed)
  assert taken[0] >= 20
  for seed in sorted(differ):
    r = generate(seed)
    for mode in ("hand", "random"):
      verdict = judge(reference(r), run_job(Job(tuple(kc_lines(r)), r.inputs(), mode, seed), "CLANG"))
      assert verdict.outcome == "ok", (seed, mode, verdict.message)


def _tile_kernels(kind: str, rows: int, k: int, dt):
  """Kernels whose one store is a reduce over contiguous lanes (what Lowering.tile_stores builds), and neighbours
  that are not: the value changed after the reduce, an input padded or shifted along the reduce, a store along an
  axis of another stride."""
  X = A.arg(1, dt, (rows, k))
  if kind == "sum": return A.sink(A.store(0, X.sum(1)))
  if kind == "max": return A.sink(A.store(0, X.max(1)))
  if kind == "prod": return A.sink(A.store(0, X.prod(1)))
  if kind == "products": return A.sink(A.store(0, (X * A.arg(2, dt, (k,)).reshape(1, k)).sum(1)))
  if kind == "linear": return A.sink(A.store(0, X @ A.arg(2, dt, (8, k)).T))
  if kind == "scaled": return A.sink(A.store(0, X.sum(1) * 0.5))
  if kind == "padded": return A.sink(A.store(0, X.pad(((0, 0), (3, 1))).sum(1)))
  if kind == "shifted": return A.sink(A.store(0, A.arg(1, dt, (rows, k + 1))[:, 1:].sum(1)))
  if kind == "columns": return A.sink(A.store(0, A.arg(1, dt, (2, rows, k)).sum(2).T))
  raise ValueError(kind)


def _with_and_without_tiles(ast, renderer, monkeypatch) -> tuple[str, str]:
  from kc.codegen import lower as lowering
  from kc.codegen.linearize import linearize
  render = lambda: renderer.render("k", linearize(rewrite_lowered(lowering.lower(ast, renderer), renderer)))  # noqa: E731
  tiled = render()
  with monkeypatch.context() as m:
    m.setattr(lowering.Lowering, "tile_stores", lambda self, store, env: None)
    return tiled, render()


TILE_KINDS = ["sum", "max", "prod", "products", "linear", "scaled", "padded", "shifted", "columns"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(TILE_KINDS), st.sampled_from([4, 8, 12, 16, 32, 48]), st.sampled_from([16, 24, 32, 64, 80]),
       st.sampled_from([dtypes.float32, dtypes.float16]), st.sampled_from([16, 8, 4]), st.integers(0, 2 ** 16))
def test_a_tile_of_reduces_is_stored_as_its_lanes_would_be(monkeypatch, kind, rows, k, dt, lanes, seed):
  """Lowering.tile_stores builds the rows' vector accumulators into one stored butterfly: exactly the kernel that
  storing row by row becomes after fold_vector_accesses and transpose_combines. Hand-coded and random opts (the
  search's actions) on CLANG's dialect at three vector widths, the row tile's neighbours included."""
  import random
  from kc.kernel import Opt, OptOps
  from kc.search.actions import action_list
  clang = pytest.importorskip("kc_clang.renderer").ClangRenderer(native=False)
  clang.float_lanes = lanes
  ast, rng = _tile_kernels(kind, rows, k, dt), random.Random(seed)
  candidates = [Kernel(ast, clang).hand_coded_optimizations()] + _random_tiles(ast, clang, rng, actions := action_list(clang), 3, len(actions))
  # and a row tile: the reduce unrolled by one or two vectors, the rows upcast, maybe one more action
  kern = Kernel(ast, clang)
  for opt in [Opt(OptOps.UNROLL, 0, rng.choice([lanes, 2 * lanes])), Opt(OptOps.UPCAST, 0, rng.choice([2, 3, 4, 8, 16])), rng.choice(actions)]:
    try: kern.apply_opt(opt)
    except KcError: pass
  candidates.append(kern)
  for kern in candidates:
    try: opt_ast = kern.get_optimized_ast()
    except KcError: continue
    tiled, row_by_row = _with_and_without_tiles(opt_ast, clang, monkeypatch)
    assert tiled == row_by_row, f"{kind} {rows}x{k} {dt} at {lanes} lanes: {kern.applied_opts}"


def _counting_tiles(monkeypatch) -> list:
  """The tile_stores results of every lowering from now on (None where it built nothing)."""
  from kc.codegen import lower as lowering
  built, tile = [], lowering.Lowering.tile_stores

  def counted(self, store, env):
    built.append(ret := tile(self, store, env))
    return ret
  monkeypatch.setattr(lowering.Lowering, "tile_stores", counted)
  return built


@pytest.mark.parametrize("lanes", [16, 8])
@pytest.mark.parametrize("kind", ["sum", "max", "products"])
def test_a_row_tile_is_built_as_one_store(kind, lanes, monkeypatch):
  # the row tile takes the path (else the test above would compare nothing) and builds no row's own butterfly (at 4
  # lanes the rows themselves are the vector axis: no tile)
  from kc.kernel import Opt, OptOps
  clang = pytest.importorskip("kc_clang.renderer").ClangRenderer(native=False)
  clang.float_lanes = lanes
  built = _counting_tiles(monkeypatch)
  kern = Kernel(_tile_kernels(kind, 64, 128, dtypes.float32), clang)
  for opt in (Opt(OptOps.UNROLL, 0, lanes), Opt(OptOps.UPCAST, 0, 4)): kern.apply_opt(opt)
  uops = kern.linearize()
  assert [b is not None for b in built] == [True]
  # 4 rows of one vector each: 2 + 1 combines of pairs of vectors, then log2(lanes / 4) levels inside one vector down
  # to 4 lanes; a pair of shuffles per combine, no lane read alone
  assert sum(u.op is Ops.SHUFFLE for u in uops) == 2 * (3 + (lanes.bit_length() - 1) - 2)
  assert not any(u.op is Ops.GEP for u in uops)


@pytest.mark.parametrize("lanes", [16, 8])
def test_a_linear_layers_register_tile_is_a_vector_store_per_row_of_outputs(lanes, monkeypatch):
  # x @ W.T hand-coded: a tile of outputs 4 wide along N (stride 1) and 4 (16 lanes) or 2 (8) rows along M, each
  # row of 4 outputs a tile of its own, its 4 accumulators combined into one float4 store; none lane by lane
  clang = pytest.importorskip("kc_clang.renderer").ClangRenderer(native=False)
  clang.float_lanes = lanes
  built = _counting_tiles(monkeypatch)
  kern = Kernel(_tile_kernels("linear", 64, 128, dtypes.float32).replace(
    src=(A.store(0, A.arg(1, dtypes.float32, (64, 128)) @ A.arg(2, dtypes.float32, (32, 128)).T),)), clang).hand_coded_optimizations()
  uops = kern.linearize()
  assert [b is not None and len(b) for b in built] == [{16: 4, 8: 2}[lanes]], kern.applied_opts
  stores = [u for u in uops if u.op is Ops.STORE]
  assert len(stores) == {16: 4, 8: 2}[lanes] and all(s.src[1].dtype.count == 4 for s in stores)
  assert not any(u.op is Ops.GEP for u in uops)


@pytest.mark.parametrize("kind", ["sum", "max", "products", "linear"])
def test_row_tiles_run_as_numpy(kind, monkeypatch, cache_dir):
  import kc
  from kc.kernel import Opt, OptOps
  if kc.Device.unavailable_reason("CLANG") is not None: pytest.skip("no CLANG here")
  built, lanes = _counting_tiles(monkeypatch), kc.Device["CLANG"].renderer.float_lanes
  rng = np.random.default_rng(len(kind))
  x, v, w = (rng.standard_normal(s).astype(np.float32) for s in ((64, 128), (128,), (8, 128)))
  want = {"sum": x.sum(1), "max": x.max(1), "products": (x * v).sum(1), "linear": x @ w.T}[kind]
  opts = [Opt(OptOps.UNROLL, 0, lanes), Opt(OptOps.UPCAST, 1 if kind == "linear" else 0, 4)]
  inputs = {1: x, **({2: v} if kind == "products" else {2: w} if kind == "linear" else {})}
  got = kc.run(_tile_kernels(kind, 64, 128, dtypes.float32), inputs, device="CLANG", opts=opts)
  assert any(b is not None for b in built)
  np.testing.assert_allclose(got[0].reshape(want.shape), want, rtol=1e-5, atol=1e-4)
