"""Programs that need several kernels: how many kernels kc's scheduler makes of ten everyday programs next to
tinygrad 0.10.0's Tensor.schedule(), and how fast each whole program runs on CLANG next to tinygrad's CLANG device
and numpy. Every kc result (and every tinygrad result, so that both run the same program) is checked against numpy
in float64 before anything is timed; figures are medians of whole warm calls. Prints the CPU and ISA it ran on and
writes its section of benchmarks/RESULTS.md (not with --quick or --no-write).
Run: python benchmarks/bench_schedule.py [--quick] [--no-write] [--repeats N]"""
from __future__ import annotations
import argparse, json, math, os, pathlib, statistics, sys, tempfile, time
from dataclasses import dataclass
from typing import Callable, Optional
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import numpy as np  # noqa: E402
import kc  # noqa: E402
from kc import dtypes  # noqa: E402
from kc import ast as A  # noqa: E402
from anchors import run_tinygrad, TINYGRAD_VERSION  # noqa: E402
from results import median_time, write_section  # noqa: E402

EPS = 1e-5  # layernorm's epsilon


@dataclass(frozen=True)
class Sizes:
  rows: int  # rows of the row-wise programs (and of the matmul)
  cols: int  # their row length
  seq: int  # attention: sequence length (q, k and v are seq x head)
  head: int


FULL = Sizes(rows=512, cols=512, seq=256, head=64)
QUICK = Sizes(rows=64, cols=96, seq=32, head=16)


@dataclass(frozen=True)
class Program:
  """One program in kc.ast and numpy (tinygrad's is in tinygrad_schedule.py under the same name). `kc` and `numpy`
  take the inputs and return a tuple of outputs; kc's outputs are buffers 0..k-1 and its inputs follow."""
  name: str
  what: str  # the program in numpy's words, for the table
  shapes: Callable[[Sizes], tuple[tuple[int, ...], ...]]  # input shapes
  kc: Callable[..., tuple]
  numpy: Callable[..., tuple]
  outputs: int = 1
  needs: str = ""  # a kc.ast op that is younger than this benchmark ("Expr.cumsum", "A.concatenate"): n/a without it


def _softmax_kc(x):
  e = (x - x.max(1, keepdims=True)).exp()
  return e / e.sum(1, keepdims=True)


def _softmax_np(x):
  e = np.exp(x - x.max(1, keepdims=True))
  return e / e.sum(1, keepdims=True)


def _layernorm(x, w, b, sqrt): return (x - x.mean(1, keepdims=True)) / sqrt(x.var(1, keepdims=True) + EPS) * w + b
def _attention(q, k, v, softmax): return softmax(q @ k.T / math.sqrt(q.shape[1])) @ v
def _standardize(x): return (x - x.mean()) / x.std()
def _matmul_bias_relu(x, w, b, maximum): return maximum(x @ w + b, 0)


def _row_square(s: Sizes): return ((s.rows, s.cols),)


PROGRAMS: tuple[Program, ...] = (
  Program("softmax", "softmax over rows", _row_square, lambda x: (_softmax_kc(x),), lambda x: (_softmax_np(x),)),
  Program("layernorm", "(x - mean) / sqrt(var + 1e-5) * w + b over rows",
          lambda s: ((s.rows, s.cols), (s.cols,), (s.cols,)),
          lambda x, w, b: (_layernorm(x, w, b, lambda v: v.sqrt()),),
          lambda x, w, b: (_layernorm(x, w, b, np.sqrt),)),
  Program("attention", "softmax(q @ k.T / sqrt(d)) @ v", lambda s: ((s.seq, s.head),) * 3,
          lambda q, k, v: (_attention(q, k, v, _softmax_kc),),
          lambda q, k, v: (_attention(q, k, v, _softmax_np),)),
  Program("standardize", "(x - x.mean()) / x.std()", _row_square,
          lambda x: (_standardize(x),), lambda x: (_standardize(x),)),
  Program("argmax", "argmax over rows", _row_square, lambda x: (x.argmax(1),), lambda x: (x.argmax(1),)),
  Program("matmul_bias_relu", "maximum(x @ w + b, 0)", lambda s: ((s.rows, s.cols), (s.cols, s.cols), (s.cols,)),
          lambda x, w, b: (_matmul_bias_relu(x, w, b, A.maximum),),
          lambda x, w, b: (_matmul_bias_relu(x, w, b, np.maximum),)),
  Program("sum_axis0_axis1", "x.sum(0) and x.sum(1), two outputs", _row_square,
          lambda x: (x.sum(0), x.sum(1)), lambda x: (x.sum(0), x.sum(1)), outputs=2),
  Program("cumsum", "cumsum over rows", _row_square, lambda x: (x.cumsum(1),), lambda x: (x.cumsum(1),),
          needs="Expr.cumsum"),
  Program("concatenate", "concatenate([exp(a), b * 2], axis=1)", lambda s: ((s.rows, s.cols),) * 2,
          lambda a, b: (A.concatenate([a.exp(), b * 2], 1),),
          lambda a, b: (np.concatenate([np.exp(a), b * 2], 1),), needs="A.concatenate"),
  Program("var_std", "x.var(1) and x.std(1), two outputs", _row_square,
          lambda x: (x.var(1), x.std(1)), lambda x: (x.var(1), x.std(1)), outputs=2),
)


def missing_op(program: Program) -> str:
  """Why kc cannot build `program` yet ("" when it can): the kc.ast op it needs is not there."""
  if not program.needs: return ""
  owner, name = program.needs.split(".")
  present = hasattr(A.Expr, name) if owner == "Expr" else hasattr(A, name)
  return "" if present else f"kc.ast has no {program.needs} yet"


def inputs_for(program: Program, sizes: Sizes, seed: int = 0) -> list[np.ndarray]:
  rng = np.random.default_rng(seed)
  return [rng.standard_normal(shape).astype(np.float32) for shape in program.shapes(sizes)]


def kc_sink(program: Program, xs: list[np.ndarray]):
  """The program as one kc.ast SINK: outputs are buffers 0..k-1, the inputs buffers k.. in order."""
  args = [A.arg(program.outputs + i, dtypes.float32, x.shape) for i, x in enumerate(xs)]
  outs = program.kc(*args)
  return A.sink(*(A.store(i, out) for i, out in enumerate(outs)))


def reference(program: Program, xs: list[np.ndarray]) -> tuple[np.ndarray, ...]:
  """numpy's answer in float64 from the float32 inputs, in the dtypes numpy's float32 program gives."""
  wide = program.numpy(*[x.astype(np.float64) for x in xs])
  narrow = program.numpy(*xs)
  return tuple(np.asarray(w).astype(n.dtype) for w, n in zip(wide, narrow))


def mismatch(program: Program, got: list[np.ndarray], want: tuple[np.ndarray, ...]) -> str:
  """Which output of `program` differs from numpy's beyond float32 rounding, and how ("" when none does)."""
  for i, (g, w) in enumerate(zip(got, want)):
    g = np.asarray(g)
    if g.shape != w.shape or g.dtype != w.dtype:
      return f"output {i} is {g.dtype}{g.shape}, numpy's is {w.dtype}{w.shape}"
    try:
      if w.dtype.kind == "f":  # float32 rounding, relative to each element and to the output's scale
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=1e-5 * max(1.0, float(np.abs(w).max())))
      else: np.testing.assert_array_equal(g, w)
    except AssertionError as e: return f"output {i} differs from numpy:{e}"
  return ""


def check(label: str, program: Program, got: list[np.ndarray], want: tuple[np.ndarray, ...]) -> None:
  """Abort the benchmark when a result is wrong: a wrong program's time means nothing."""
  if (why := mismatch(program, got, want)): raise SystemExit(f"{label} {program.name} is wrong: {why}")


# ***** kc *****

@dataclass
class KcResult:
  kernels: Optional[int]  # what kc.schedule.schedule decides; None: no scheduler in this kc, or no program
  peak_bytes: Optional[int]  # the schedule's intermediate memory
  seconds: Optional[float]
  launched: Optional[int] = None  # kernels a call of kc.compile's program launches (a split reduce adds one)
  why: str = ""  # why there is no time


def scheduler() -> Optional[Callable]:
  """kc.schedule.schedule, or None in a kc that predates it."""
  try: from kc.schedule import schedule
  except ImportError: return None
  return schedule


def kc_schedule(sink) -> tuple[Optional[int], Optional[int]]:
  """(kernels, intermediate bytes) that kc's scheduler decides for `sink`; (None, None) in a kc without one."""
  if (schedule := scheduler()) is None: return None, None
  s = schedule(sink)
  return len(s.kernels), s.peak_bytes


def run_kc(program: Program, xs: list[np.ndarray], want: tuple[np.ndarray, ...], repeats: int) -> KcResult:
  """Schedule, compile, check and time `program` on CLANG; a missing op or a program kc refuses gives no time and
  why, so that the other programs are still measured. A wrong answer aborts."""
  if (why := missing_op(program)): return KcResult(None, None, None, why)
  try:
    sink = kc_sink(program, xs)
    kernels, peak = kc_schedule(sink)
    prg = kc.compile(sink, "CLANG")
  except kc.KcError as e:
    return KcResult(None, None, None, f"kc refuses it: {type(e).__name__}: {str(e)[:200]}")
  outs = [np.empty(w.shape, w.dtype) for w in want]
  prg(*outs, *xs)
  check("kc CLANG", program, outs, want)
  launched = len(getattr(prg, "programs", (prg.program,)))
  return KcResult(kernels, peak, median_time(lambda: prg(*outs, *xs), repeats=repeats), launched=launched)


# ***** tinygrad *****

Runs = list[tuple[Program, list[np.ndarray]]]


def run_tinygrad_programs(runs: Runs, repeats: int, folder: pathlib.Path) -> tuple[dict, str]:
  """tinygrad_schedule.py on the same inputs (raw float32 files in `folder`): {name: result}, or ({}, why not)."""
  from bench_backends import ensure_clang
  if (why := ensure_clang()): return {}, why
  programs = {}
  for program, xs in runs:
    ins = []
    for i, x in enumerate(xs):
      x.tofile(path := folder / f"{program.name}_in{i}.bin")
      ins.append([str(path), list(x.shape)])
    outs = [str(folder / f"{program.name}_out{i}.bin") for i in range(program.outputs)]
    programs[program.name] = {"inputs": ins, "outputs": outs}
  (spec := folder / "spec.json").write_text(json.dumps({"repeats": repeats, "programs": programs}))
  res, why = run_tinygrad("tinygrad_schedule.py", spec)
  return res or {}, why


def tinygrad_outputs(result: dict, want: tuple[np.ndarray, ...]) -> list[np.ndarray]:
  """tinygrad's outputs as written, in numpy's dtypes (its argmax is int32 where numpy's is int64)."""
  return [np.fromfile(path, dtype=np.dtype(fmt)).reshape(shape).astype(w.dtype)
          for (path, fmt, shape), w in zip(result["outputs"], want)]


def check_tinygrad(runs: Runs, refs: dict, tg: dict) -> list[str]:
  """Abort when tinygrad's result differs from numpy's (then it ran another program); notes for those that failed."""
  notes = []
  for p, _ in runs:
    if "error" in tg.get(p.name, {}): notes.append(f"{p.name}: tinygrad failed: {tg[p.name]['error']}")
    elif p.name in tg:
      check(f"tinygrad {TINYGRAD_VERSION} CLANG", p, tinygrad_outputs(tg[p.name], refs[p.name]), refs[p.name])
  return notes


# ***** the report *****

def ms(seconds: Optional[float]) -> str: return "n/a" if seconds is None else f"{seconds * 1e3:.3f}"
def ratio(a: Optional[float], b: Optional[float]) -> str: return "n/a" if a is None or b is None else f"{a / b:.3g}"
def count(n: Optional[int]) -> str: return "n/a" if n is None else str(n)


def kc_kernels(r: KcResult) -> str:
  """The scheduler's count, and the run-time count where kc.compile's split-reduce made it larger."""
  if r.kernels is None or r.launched is None or r.launched == r.kernels: return count(r.kernels)
  return f"{r.kernels} ({r.launched} at run time: split reduce)"


def geomean(pairs) -> str:
  ratios = [a / b for a, b in pairs if a is not None and b is not None]
  return f"{statistics.geometric_mean(ratios):.3g} (of {len(ratios)})" if ratios else "n/a"


def table(kc_res: dict[str, KcResult], tg: dict, np_times: dict[str, float]) -> list[str]:
  tgv = f"tinygrad {TINYGRAD_VERSION}"
  lines = [f"| program | kc kernels | {tgv} kernels | kc intermediates (bytes) | kc CLANG ms | {tgv} CLANG ms | "
           f"{tgv} TinyJit ms | numpy ms | kc/numpy | kc/tinygrad | kc/TinyJit |", "|---|" + "---:|" * 10]
  for p in PROGRAMS:
    k, t, n = kc_res[p.name], tg.get(p.name, {}), np_times[p.name]
    lines.append(f"| {p.name} | {kc_kernels(k)} | {t.get('kernels', 'n/a')} | {count(k.peak_bytes)} | "
                 f"{ms(k.seconds)} | {ms(t.get('seconds'))} | {ms(t.get('jit_seconds'))} | {ms(n)} | "
                 f"{ratio(k.seconds, n)} | {ratio(k.seconds, t.get('seconds'))} | "
                 f"{ratio(k.seconds, t.get('jit_seconds'))} |")
  kc_times = [kc_res[p.name].seconds for p in PROGRAMS]
  others = [[np_times[p.name] for p in PROGRAMS]] + [[tg.get(p.name, {}).get(key) for p in PROGRAMS]
                                                      for key in ("seconds", "jit_seconds")]
  lines.append("| geometric mean | | | | | | | | " + " | ".join(geomean(zip(kc_times, o)) for o in others) + " |")
  return lines


def describe(sizes: Sizes) -> list[str]:
  return [f"- {p.name}: {p.what}; inputs {', '.join('x'.join(map(str, s)) for s in p.shapes(sizes))} float32"
          for p in PROGRAMS]


INTRO = (
  "Ten everyday programs, the same in kc.ast, tinygrad {tg} Tensor code and numpy. Kernels: what "
  "`kc.schedule.schedule(sink)` decides (`len(s.kernels)`; intermediates: `s.peak_bytes`) and what tinygrad's "
  "`Tensor.schedule()` of the outputs holds (kernels only, not buffer copies). kc.compile's split-reduce may add a "
  "combine kernel at run time, splitting one large reduce into a partial and a combine kernel for parallelism "
  "(kc.schedule.split_reduce); the count is the scheduler's, with the run-time count beside it where a split "
  "added kernels. Times: medians of whole warm calls in ms: kc's "
  "compiled program called with numpy arrays (outputs in place) on all {cores} cores; tinygrad's realize of the "
  "freshly built graph (its kernels cached, its Python scheduling counted, as a user's code pays it) and its TinyJit "
  "replay (the captured kernels alone), on its single-threaded CLANG device; numpy in float32, its BLAS on every "
  "core. Every kc and tinygrad result is checked against numpy in float64 first. kc/numpy, kc/tinygrad and "
  "kc/TinyJit are time ratios: below 1, kc is faster.")


def report(args, sizes: Sizes, kc_res: dict[str, KcResult], tg: dict, np_times: dict, notes: list[str]) -> str:
  from bench_clang import host_line
  flags = f"--repeats {args.repeats}" + (" --quick" if args.quick else "")
  # the machine is shared: a load above its core count shows in every column, numpy's threaded BLAS most
  load = "load average {:.2f}, {:.2f}, {:.2f} at the end of the run".format(*os.getloadavg())
  return "\n".join([f"## Multi-kernel programs (`python benchmarks/bench_schedule.py {flags}`)", "",
                    INTRO.format(tg=TINYGRAD_VERSION, cores=os.cpu_count()), "", f"{host_line()}; {load}", "",
                    *describe(sizes), "",
                    *table(kc_res, tg, np_times)] + [f"- {n}" for n in notes])


def main():
  ap = argparse.ArgumentParser(description=__doc__)
  ap.add_argument("--repeats", type=int, default=9)
  ap.add_argument("--quick", action="store_true",
                  help=f"small sizes ({QUICK}) and 3 repeats; RESULTS.md is not written")
  ap.add_argument("--no-write", action="store_true", help="print only (RESULTS.md is not written)")
  args = ap.parse_args()
  sizes = QUICK if args.quick else FULL
  if args.quick: args.repeats = 3
  from bench_clang import host_line
  print(host_line(), flush=True)
  runs = [(p, inputs_for(p, sizes)) for p in PROGRAMS]
  refs = {p.name: reference(p, xs) for p, xs in runs}
  kc_res: dict[str, KcResult] = {}
  for p, xs in runs:
    r = kc_res[p.name] = run_kc(p, xs, refs[p.name], args.repeats)
    print(f"{p.name}: kc {kc_kernels(r)} kernels, {ms(r.seconds)} ms {r.why}", flush=True)
  # numpy's BLAS threads keep spinning for a while after a call returns: numpy is timed after kc, apart from it
  time.sleep(1.0)
  np_times = {p.name: median_time(lambda p=p, xs=xs: p.numpy(*xs), repeats=args.repeats) for p, xs in runs}
  notes = [f"{p.name}: kc n/a: {kc_res[p.name].why}" for p in PROGRAMS if kc_res[p.name].why]
  if scheduler() is None:
    notes.append("kc's kernel counts are n/a: this kc has no kc.schedule.schedule")
  with tempfile.TemporaryDirectory() as folder:
    tg, why = run_tinygrad_programs(runs, args.repeats, pathlib.Path(folder))
    notes += [f"tinygrad CLANG not run: {why}"] if why else check_tinygrad(runs, refs, tg)
  body = report(args, sizes, kc_res, tg, np_times, notes)
  print(body)
  if not (args.quick or args.no_write): write_section("bench_schedule", body)


if __name__ == "__main__":
  main()
