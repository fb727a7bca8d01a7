"""LLVM against CLANG on bench_clang.py's workloads (benchmarks/clang_workloads.py): kc's hand-coded kernels on the
LLVM device (kc-llvm: LLVM IR compiled in the process by llvmlite) and on CLANG, both in one process and timed
call by call in turn, on one thread (KC_LLVM_THREADS=1, KC_CLANG_THREADS=1) and on every core. Every result is
checked against numpy first; figures are medians of whole calls over interleaved rounds. Then the cold compile of
each workload's kernels on both devices: in a fresh process per device and round (so nothing is left in the
process's caches), each workload compiled with an empty KC_CACHE_DIR, timing the compile step (Compiler.compile of
the rendered sources) and the whole kc.compile. Targets: LLVM's kernels at 0.9x CLANG's speed or better (geometric
mean), its compiles at 0.5x CLANG's time or less. Prints the CPU, ISA and compilers it ran on and writes its
section of benchmarks/RESULTS.md (not with --quick or --no-write).
Run: python benchmarks/bench_llvm.py [--quick] [--no-write] [--rounds 5] [--repeats 5] [--compile-rounds 3]"""
from __future__ import annotations
import argparse, json, os, pathlib, statistics, subprocess, sys, tempfile, time
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import numpy as np  # noqa: E402
import kc  # noqa: E402
from kc import Buffer, dtypes  # noqa: E402
from kc import ast as A  # noqa: E402
from bench_clang import host_line, kc_ast, reference  # noqa: E402
from clang_workloads import WORKLOADS  # noqa: E402
from results import median_time, write_section  # noqa: E402

HERE = pathlib.Path(__file__).parent
DEVICES = ("CLANG", "LLVM")
SPEED_TARGET, COMPILE_TARGET = 0.9, 0.5

# --quick: the same kernels at small sizes (conv2d keeps its size: kc_ast builds it from clang_workloads.CONV)
QUICK_SHAPES = {"add_16M": [(1 << 20,)] * 2, "mul_add_exp_16M": [(1 << 20,)] * 3, "sum_16M": [(1 << 20,)],
                "matmul_512": [(128, 128)] * 2, "matmul_1024": [(256, 256)] * 2, "softmax_1024x1024": [(256, 256)]}


def workloads(quick: bool) -> dict[str, list[tuple[int, ...]]]:
  """Each workload's input shapes: clang_workloads' own, or the small ones of --quick."""
  return {name: (QUICK_SHAPES.get(name, shapes) if quick else shapes) for name, (_, _, shapes) in WORKLOADS.items()}


def threads_knob(device: str, threads: int) -> kc.Context:
  """The thread knob of `device` set to `threads`: its renderer reads it when it renders (whether a loop is split) and
  its runtime on every call (how many parts run), so kernels are compiled and called inside it."""
  return kc.Context(**{f"KC_{device}_THREADS": threads})


def llvm_line() -> str:
  """Which LLVM and target the LLVM device builds for."""
  from kc_llvm.compiler import llvm_version
  dev = kc.Device["LLVM"]
  target = dev.compiler.target
  return (f"kc LLVM: {llvm_version()}, cpu {target.cpu}, vectors of {target.vector_bytes // 4} floats, "
          f"O{dev.compiler.opt}, in-process (llvmlite)")


# ------------------------------------------------------------------------------------------------------ kernel speed

def prepared(device: str, name: str, shapes, xs, ref, threads: int):
  """The workload's kernel compiled for `device` at `threads` threads, with its buffers, checked against numpy."""
  with threads_knob(device, threads):
    ck = kc.compile(kc_ast(name, shapes), device=device, opts="hand")
    out = Buffer(device, ref.size, dtypes.float32).allocate()
    bufs = [out] + [Buffer(device, x.size, dtypes.float32).copyin(x) for x in xs]
    ck(*bufs)
  err = float(np.abs(out.numpy().reshape(-1) - ref.reshape(-1)).max() / max(1.0, float(np.abs(ref).max())))
  if err > 1e-3: raise SystemExit(f"kc {device} {name} ({threads} threads) is wrong: relative error {err:.2e}")
  return ck, bufs


def speeds(shapes_of: dict, rounds: int, repeats: int) -> dict[tuple[str, int, str], float]:
  """{(workload, threads, device): median seconds per call}: per workload and thread count, `rounds` rounds that time
  `repeats` calls on each device in turn; a device's figure is the median of its rounds' medians."""
  rng = np.random.default_rng(0)
  inputs = {name: [rng.standard_normal(s).astype(np.float32) * (0.5 if name.startswith("mul_add") else 1) for s in shapes]
            for name, shapes in shapes_of.items()}
  refs = {name: reference(name, xs) for name, xs in inputs.items()}
  time.sleep(1.0)  # numpy's BLAS threads (the matmul references) spin on for a while after they return
  out: dict[tuple[str, int, str], float] = {}
  for name, shapes in shapes_of.items():
    for threads in (1, os.cpu_count() or 1):
      ready = {dev: prepared(dev, name, shapes, inputs[name], refs[name], threads) for dev in DEVICES}
      per_round: dict[str, list[float]] = {dev: [] for dev in DEVICES}
      for r in range(rounds):
        for dev in (DEVICES if r % 2 == 0 else DEVICES[::-1]):
          ck, bufs = ready[dev]
          with threads_knob(dev, threads): per_round[dev].append(median_time(lambda ck=ck, bufs=bufs: ck(*bufs), repeats=repeats))
      for dev in DEVICES: out[(name, threads, dev)] = statistics.median(per_round[dev])
      c, ll = out[(name, threads, "CLANG")], out[(name, threads, "LLVM")]
      print(f"{name:22s} {threads:2d} thread{'s' if threads > 1 else ' '}  CLANG {c * 1e3:8.2f} ms  LLVM {ll * 1e3:8.2f} ms  "
            f"LLVM at {c / ll:.2f}x CLANG's speed", flush=True)
  return out


# ------------------------------------------------------------------------------------------------------ cold compile

def cold_compiles(device: str, quick: bool) -> dict[str, tuple[int, float, float]]:
  """{workload: (kernels, seconds of Compiler.compile of their sources, seconds of the whole kc.compile)}, each with an
  empty KC_CACHE_DIR, in this process after one small kernel has been compiled (the compiler's first use: llvmlite's
  initialization, the first C compiler run). Run in a fresh process: kc.compile keeps what it compiled in memory."""
  dev = kc.Device[device]
  with tempfile.TemporaryDirectory() as d, kc.Context(KC_CACHE_DIR=d):
    kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (7,)) + 1.0)), device=device)
  times = {}
  for name, shapes in workloads(quick).items():
    ast = kc_ast(name, shapes)
    with tempfile.TemporaryDirectory() as d, kc.Context(KC_CACHE_DIR=d):
      t0 = time.perf_counter()
      ck = kc.compile(ast, device=device, opts="hand")
      whole = time.perf_counter() - t0
    srcs = [k.program.src for k in getattr(ck, "kernels", [ck])]  # a split reduce is two kernels
    with tempfile.TemporaryDirectory() as d, kc.Context(KC_CACHE_DIR=d):
      t0 = time.perf_counter()
      for src in srcs: dev.compiler.compile(src)
      step = time.perf_counter() - t0
    times[name] = (len(srcs), step, whole)
  return times


WORKER = "import json, sys; sys.path.insert(0, {here!r}); import bench_llvm; print(json.dumps(bench_llvm.cold_compiles({dev!r}, {quick})))"


def compile_times(rounds: int, quick: bool) -> dict[tuple[str, str], tuple[int, float, float]]:
  """{(workload, device): (kernels, median compile-step seconds, median kc.compile seconds)} over `rounds` fresh
  processes per device, the devices in turn."""
  runs: dict[str, list[dict]] = {dev: [] for dev in DEVICES}
  for r in range(rounds):
    for dev in (DEVICES if r % 2 == 0 else DEVICES[::-1]):
      code = WORKER.format(here=str(HERE), dev=dev, quick=quick)
      p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
      if p.returncode != 0: raise SystemExit(f"the cold compile run on {dev} failed:\n{p.stderr.strip()[-2000:]}")
      runs[dev].append(json.loads(p.stdout.strip().splitlines()[-1]))
  out = {}
  for dev in DEVICES:
    for name in runs[dev][0]:
      got = [run[name] for run in runs[dev]]
      out[(name, dev)] = (got[0][0], statistics.median(g[1] for g in got), statistics.median(g[2] for g in got))
  return out


# ----------------------------------------------------------------------------------------------------------- report

def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of each kernel's timing")
  ap.add_argument("--repeats", type=int, default=5, help="calls per device in a round")
  ap.add_argument("--compile-rounds", type=int, default=3, help="fresh processes per device for the cold compiles")
  ap.add_argument("--quick", action="store_true", help="small sizes, 2 rounds of 3 calls, 1 compile round; print only")
  ap.add_argument("--no-write", action="store_true", help="print only (RESULTS.md is not written)")
  args = ap.parse_args()
  if args.quick: args.rounds, args.repeats, args.compile_rounds = 2, 3, 1
  for dev in DEVICES:
    if (why := kc.Device.unavailable_reason(dev)) is not None: raise SystemExit(f"{dev} does not open here: {why}")
  head = [host_line(), llvm_line()]
  print("\n".join(head), flush=True)
  shapes_of = workloads(args.quick)
  speed = speeds(shapes_of, args.rounds, args.repeats)
  comp = compile_times(args.compile_rounds, args.quick)
  names, cores = list(shapes_of), os.cpu_count() or 1
  gm = lambda xs: statistics.geometric_mean(list(xs))  # noqa: E731
  verdict = lambda r, ok: f"{r:.2f}x ({'meets' if ok else 'misses'} the target)"  # noqa: E731

  lines = [f"## LLVM against CLANG (`python benchmarks/bench_llvm.py --rounds {args.rounds} --repeats {args.repeats} "
           f"--compile-rounds {args.compile_rounds}`)", "",
           "bench_clang.py's workloads with kc's hand-coded kernels on the LLVM device (kc-llvm) and on CLANG, in one process, "
           f"timed in turn: {args.rounds} interleaved rounds of {args.repeats} whole calls per device, each device's figure the "
           "median of its rounds' medians; every result checked against numpy first. One thread is KC_CLANG_THREADS=1 and "
           f"KC_LLVM_THREADS=1; all cores is {cores} threads on each. Speed is CLANG's time over LLVM's (above 1: LLVM is faster; "
           f"the target is {SPEED_TARGET}x or more).", "", *head, "",
           f"| workload | CLANG 1 thread | LLVM 1 thread | LLVM speed | CLANG {cores} threads | LLVM {cores} threads | LLVM speed |",
           "|---|---:|---:|---:|---:|---:|---:|"]
  ratio = {t: {n: speed[(n, t, "CLANG")] / speed[(n, t, "LLVM")] for n in names} for t in (1, cores)}
  for n in names:
    cells = [f"{speed[(n, t, d)] * 1e3:.2f} ms" if d != "ratio" else f"{ratio[t][n]:.2f}x"
             for t in (1, cores) for d in ("CLANG", "LLVM", "ratio")]
    lines.append(f"| {n} | " + " | ".join(cells) + " |")
  g = {t: gm(ratio[t].values()) for t in (1, cores)}
  lines.append(f"| geometric mean | | | {g[1]:.2f}x | | | {g[cores]:.2f}x |")
  lines += ["", f"- LLVM's speed against CLANG's, geometric mean: one thread {verdict(g[1], g[1] >= SPEED_TARGET)}, "
                f"{cores} threads {verdict(g[cores], g[cores] >= SPEED_TARGET)}; target {SPEED_TARGET}x or more.", ""]

  lines += ["### Cold compile", "",
            f"Each workload's kernels compiled with an empty KC_CACHE_DIR, in a fresh process per device and round ({args.compile_rounds} "
            f"round{'s' if args.compile_rounds > 1 else ''}, devices in turn, medians) that has compiled one small kernel before "
            "(the compiler's first use). \"compile\" is "
            "Compiler.compile of the rendered sources (CLANG: a C compiler run; LLVM: llvmlite in the process), \"kc.compile\" the "
            "whole call (schedule, opts, render, compile, load). Time is LLVM's over CLANG's (below 1: LLVM compiles faster; "
            f"the target is {COMPILE_TARGET}x or less).", "",
            "| workload | kernels | CLANG compile | LLVM compile | LLVM / CLANG | CLANG kc.compile | LLVM kc.compile | LLVM / CLANG |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
  step = {n: comp[(n, "LLVM")][1] / comp[(n, "CLANG")][1] for n in names}
  whole = {n: comp[(n, "LLVM")][2] / comp[(n, "CLANG")][2] for n in names}
  for n in names:
    c, ll = comp[(n, "CLANG")], comp[(n, "LLVM")]
    lines.append(f"| {n} | {c[0]} | {c[1] * 1e3:.1f} ms | {ll[1] * 1e3:.1f} ms | {step[n]:.2f}x | {c[2] * 1e3:.1f} ms | "
                 f"{ll[2] * 1e3:.1f} ms | {whole[n]:.2f}x |")
  gs, gw = gm(step.values()), gm(whole.values())
  lines.append(f"| geometric mean | | | | {gs:.2f}x | | | {gw:.2f}x |")
  lines += ["", f"- LLVM's cold compile time against CLANG's, geometric mean: compile step {verdict(gs, gs <= COMPILE_TARGET)}, "
                f"whole kc.compile {verdict(gw, gw <= COMPILE_TARGET)}; target {COMPILE_TARGET}x or less."]
  if args.quick: lines.insert(2, "**--quick: small sizes and few repeats, not the workloads' figures.**\n")
  body = "\n".join(lines)
  print(body)
  if not (args.quick or args.no_write): write_section("bench_llvm", body)


if __name__ == "__main__":
  main()
