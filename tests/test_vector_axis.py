"""The vector axis (kc.codegen.lower.Lowering.choose_vector_axis): its values lowered for all of its lanes at once
must give the kernel the lane-by-lane lowering becomes after the vector passes."""
import numpy as np
import pytest
from kc import ast as A
from kc.kernel import Kernel
from kc.codegen.graph import rewrite_lowered
from kc.errors import KcError
from kc.ir.dtype import dtypes


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
      candidates = [Kernel(kernel.ast, clang).hand_coded_optimizations()]
      for _ in range(4):  # random tiles: up to three of the search's actions that apply, in a random order
        k = Kernel(kernel.ast, clang)
        for opt in rng.sample(actions, 12):
          try: k.apply_opt(opt)
          except KcError: pass
          if len(k.applied_opts) == 3: break
        candidates.append(k)
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
