"""benchmarks/bench_schedule.py's programs, each run by kc on CLANG at small sizes and checked against numpy, so that
the benchmark's programs cannot rot; a program whose kc.ast op is not there yet is skipped, saying which."""
import ast, pathlib, sys
import numpy as np
import pytest
import kc

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import bench_schedule as B  # noqa: E402

# an odd size (padding, unaligned rows) and a vector-friendly one
SIZES = [B.Sizes(rows=5, cols=7, seq=6, head=3), B.Sizes(rows=16, cols=24, seq=8, head=4)]


@pytest.fixture(scope="module")
def clang():
  if "CLANG" not in kc.Device.available(): pytest.skip(f"CLANG is not available: {kc.Device.errors().get('CLANG', '')}")


@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: f"{s.rows}x{s.cols}")
@pytest.mark.parametrize("program", B.PROGRAMS, ids=lambda p: p.name)
def test_program_matches_numpy_on_clang(clang, program, sizes):
  if (why := B.missing_op(program)): pytest.skip(why)
  xs = B.inputs_for(program, sizes, seed=sizes.rows)
  want = B.reference(program, xs)
  assert len(want) == program.outputs
  outs = [np.empty(w.shape, w.dtype) for w in want]
  sink = B.kc_sink(program, xs)
  prg = kc.compile(sink, "CLANG")
  prg(*outs, *xs)
  assert B.mismatch(program, outs, want) == ""
  ran = kc.run(sink, {program.outputs + i: x for i, x in enumerate(xs)}, "CLANG")  # outputs shaped as numpy's
  assert B.mismatch(program, [ran[i] for i in range(program.outputs)], want) == ""
  # the table's kernel counts: the scheduler's, never more than a call launches (a split reduce launches one more)
  scheduled, peak = B.kc_schedule(sink)
  if scheduled is not None:
    assert 1 <= scheduled <= len(getattr(prg, "programs", (prg.program,))) and peak >= 0


def test_kernel_count_names_a_split_reduce():
  assert B.kc_kernels(B.KcResult(kernels=2, peak_bytes=0, seconds=1.0, launched=2)) == "2"
  assert B.kc_kernels(B.KcResult(kernels=1, peak_bytes=0, seconds=1.0, launched=2)) == "1 (2 at run time: split reduce)"
  assert B.kc_kernels(B.KcResult(kernels=None, peak_bytes=None, seconds=None, why="no op")) == "n/a"


def test_mismatch_catches_a_wrong_output():
  program = next(p for p in B.PROGRAMS if p.name == "var_std")
  xs = B.inputs_for(program, SIZES[1])
  want = B.reference(program, xs)
  assert B.mismatch(program, list(want), want) == ""
  off = want[1].copy()
  off[3] *= 1.01
  assert "output 1 differs" in B.mismatch(program, [want[0], off], want)
  assert "output 0 is float64" in B.mismatch(program, [want[0].astype(np.float64), want[1]], want)


def test_missing_op_names_the_op():
  fake = B.Program("fake", "", B._row_square, lambda x: (x,), lambda x: (x,), needs="Expr.no_such_op")
  assert B.missing_op(fake) == "kc.ast has no Expr.no_such_op yet"
  for present in ("Expr.sum", "A.sink"):
    assert B.missing_op(B.Program("fake", "", B._row_square, lambda x: (x,), lambda x: (x,), needs=present)) == ""


def test_tinygrad_side_has_the_same_programs():
  """tinygrad_schedule.py runs in tinygrad's venv (it imports tinygrad): its PROGRAMS' keys are read from its source."""
  tree = ast.parse((BENCHMARKS / "tinygrad_schedule.py").read_text())
  table = next(n.value for n in tree.body
               if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "PROGRAMS" for t in n.targets))
  assert [k.value for k in table.keys] == [p.name for p in B.PROGRAMS]
