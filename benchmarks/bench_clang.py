"""CLANG kernel speed on the anchor workloads (benchmarks/clang_workloads.py): kc's hand-coded kernels on every core
and on one, next to numpy, tinygrad 0.10.0's CLANG backend and plain C loops (add and mul-add-exp, compiled with
kc's flags and split over the same threads: the bandwidth a kernel can reach) in the same run. Each result is
checked against numpy first; figures are medians of whole calls. Prints the CPU and ISA it ran on and writes its
section of benchmarks/RESULTS.md (not with --quick or --no-write).
--isa avx2 (or avx512f, sse2) builds kc's kernels (KC_CLANG_ISA), the plain C loops and tinygrad's kernels for that
x86 ISA level instead of this CPU (-march=native): what a machine with only that level would run; its section is
bench_clang_<isa>.
Run: python benchmarks/bench_clang.py [--quick] [--no-write] [--isa avx512f|avx2|sse2]"""
from __future__ import annotations
import argparse, json, math, os, pathlib, statistics, subprocess, sys, time
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import numpy as np  # noqa: E402
import kc  # noqa: E402
from kc import Buffer, dtypes  # noqa: E402
from kc import ast as A  # noqa: E402
from anchors import HERE, run_tinygrad, tinygrad_python, TINYGRAD_VERSION  # noqa: E402
from bench_backends import ensure_clang  # noqa: E402
from clang_workloads import CONV, WORKLOADS  # noqa: E402
from results import median_time, write_section  # noqa: E402

LOG2E = 1 / math.log(2)


def kc_ast(name: str, shapes):
  xs = [A.arg(i + 1, dtypes.float32, s) for i, s in enumerate(shapes)]
  if name == "add_16M": out = xs[0] + xs[1]
  elif name == "mul_add_exp_16M": out = ((xs[0] * xs[1] + xs[2]) * LOG2E).exp2()
  elif name == "sum_16M": out = xs[0].sum()
  elif name.startswith("matmul"):
    n = shapes[0][0]
    out = (xs[0].reshape(n, n, 1) * xs[1].reshape(1, n, n)).sum(1)
  elif name.startswith("conv2d"):
    cin, cout, H, W, k = CONV
    win = xs[0].pad(((0, 0), (1, 1), (1, 1))).windows(1, k).windows(2, k).permute(0, 3, 4, 1, 2).reshape(1, cin, k, k, H, W)
    out = (win * xs[1].reshape(cout, cin, k, k, 1, 1)).sum(axis=(1, 2, 3))
  elif name.startswith("softmax"):
    e = (xs[0] - xs[0].max(1, keepdims=True)).exp2()  # kc.ast reduces as numpy does: keepdims to broadcast per row
    out = e / e.sum(1, keepdims=True)
  else: raise ValueError(name)
  return A.sink(A.store(0, out))


def numpy_fn(name: str, xs):
  if name == "add_16M": return lambda: np.add(xs[0], xs[1])
  if name == "mul_add_exp_16M": return lambda: np.exp(xs[0] * xs[1] + xs[2])
  if name == "sum_16M": return lambda: xs[0].sum()
  if name.startswith("matmul"): return lambda: xs[0] @ xs[1]
  if name.startswith("conv2d"):
    cin, cout, H, W, k = CONV
    def conv():
      p = np.pad(xs[0], ((0, 0), (1, 1), (1, 1)))
      win = np.lib.stride_tricks.sliding_window_view(p, (k, k), axis=(1, 2))  # (cin, H, W, k, k)
      return np.tensordot(xs[1], win, axes=([1, 2, 3], [0, 3, 4]))
    return conv
  if name.startswith("softmax"):
    def softmax():
      e = np.exp(xs[0] - xs[0].max(1, keepdims=True))
      return e / e.sum(1, keepdims=True)
    return softmax
  raise ValueError(name)


def reference(name: str, xs) -> np.ndarray:
  if name == "mul_add_exp_16M": return np.exp2((xs[0] * xs[1] + xs[2]) * np.float32(LOG2E))
  if name.startswith("softmax"):
    e = np.exp2(xs[0] - xs[0].max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)
  return np.asarray(numpy_fn(name, [x.astype(np.float64) for x in xs])(), dtype=np.float32)


def time_kc(name: str, shapes, xs, ref, repeats: int, threads: str) -> tuple[float, str]:
  os.environ["KC_CLANG_THREADS"] = threads
  ck = kc.compile(kc_ast(name, shapes), device="CLANG", opts="hand")
  out = Buffer("CLANG", ref.size, dtypes.float32).allocate()
  bufs = [out] + [Buffer("CLANG", x.size, dtypes.float32).copyin(x) for x in xs]
  ck(*bufs)
  err = float(np.abs(out.numpy().reshape(-1) - ref.reshape(-1)).max() / max(1.0, float(np.abs(ref).max())))
  if err > 1e-3: raise SystemExit(f"kc CLANG {name} is wrong: relative error {err:.2e}")
  return median_time(lambda: ck(*bufs), repeats=repeats), ", ".join(f"{o.op.name}{o.axis},{o.amt}" for o in ck.kernel.applied_opts)


# plain C loops over the same data, split into parts as kc's kernels are (the runtime runs kc_part of kc_parts on
# each thread): what the compiler alone makes of the loop, the bandwidth kc's kernels are measured against
C_ANCHORS = {"add_16M": "out[i] = a[i] + b[i];", "mul_add_exp_16M": "out[i] = exp2f((a[i] * b[i] + c[i]) * 1.4426950408889634f);"}


def c_anchor(name: str):
  """The compiled plain C loop of workload `name`, a CLANG program: (out, a, b[, c], vals=(n,))."""
  from kc_clang.renderer import split_symbol
  from kc_clang.thread_pool import entry_source
  fn = f"c_{name}"
  src = (f"#include <math.h>\nconst int {split_symbol(fn)} = 1;\n"
         f"void {fn}(float* restrict out, const float* restrict a, const float* restrict b, const float* restrict c, "
         "const int n, const int kc_part, const int kc_parts) {\n"
         "  long long lo = (long long)n * kc_part / kc_parts, hi = (long long)n * (kc_part + 1) / kc_parts;\n"
         f"  for (long long i = lo; i < hi; i++) {C_ANCHORS[name]}\n}}\n"
         # the entry point CLANG's kernel threads call, as the renderer writes it for a split kernel
         + entry_source(fn, [True, True, True, True, False]) + "\n")
  dev = kc.Device["CLANG"]
  return dev.runtime(fn, dev.compiler.compile(src))


def time_c(name: str, xs, ref, repeats: int, threads: str) -> float:
  os.environ["KC_CLANG_THREADS"] = threads
  prg = c_anchor(name)
  out = Buffer("CLANG", ref.size, dtypes.float32).allocate()
  bufs = [out] + [Buffer("CLANG", x.size, dtypes.float32).copyin(x) for x in xs]
  bufs += [bufs[-1]] * (4 - len(bufs))  # add has no third input: c is passed and not read
  prg(*bufs, vals=(ref.size,))
  err = float(np.abs(out.numpy().reshape(-1) - ref.reshape(-1)).max() / max(1.0, float(np.abs(ref).max())))
  if err > 1e-3: raise SystemExit(f"plain C {name} is wrong: relative error {err:.2e}")
  return median_time(lambda: prg(*bufs, vals=(ref.size,)), repeats=repeats)


# tinygrad 0.10.0's CLANG compiles with -march=native (ClangCompiler's default args); for --isa its default becomes
# the level's -march, under a disk-cache key of its own so that no native binary of an earlier run is loaded
TINYGRAD_AT_LEVEL = """
import runpy, sys
from tinygrad.runtime import ops_clang
march, script = sys.argv[1], sys.argv[2]
ops_clang.ClangCompiler.__init__.__defaults__ = (f"compile_clang_{march}", [f"-march={march}"], "objdump")
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
"""


def run_tinygrad_clang(repeats: int, march: str = "") -> tuple[dict | None, str]:
  """tinygrad's CLANG timings, its kernels built for -march=`march` when given, else as tinygrad builds them."""
  if not march: return run_tinygrad("tinygrad_clang.py", repeats)
  py, why = tinygrad_python()
  if py is None: return None, why
  r = subprocess.run([str(py), "-c", TINYGRAD_AT_LEVEL, march, str(HERE / "tinygrad_clang.py"), str(repeats)], capture_output=True, text=True)
  if r.returncode != 0: return None, f"tinygrad_clang.py -march={march} failed: {r.stderr.strip()[-300:]}"
  return json.loads(r.stdout), ""


NUMPY_ONE_THREAD = """
import json, sys, time, statistics, numpy as np
n, repeats = int(sys.argv[1]), int(sys.argv[2])
a, b = (np.random.default_rng(0).standard_normal((n, n)).astype(np.float32) for _ in range(2))
a @ b
times = []
for _ in range(repeats):
  t = time.perf_counter(); a @ b; times.append(time.perf_counter() - t)
print(json.dumps(statistics.median(times)))
"""


def numpy_matmul_one_thread(n: int, repeats: int) -> float:
  """numpy's matmul with its BLAS on one thread, in a fresh process (the BLAS reads its thread count at load)."""
  env = {**os.environ, **{v: "1" for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}}
  r = subprocess.run([sys.executable, "-c", NUMPY_ONE_THREAD, str(n), str(repeats)], capture_output=True, text=True, env=env, check=True)
  return json.loads(r.stdout)


def host_line() -> str:
  """Which CPU, ISA and compiler the kernels were built for."""
  from kc_clang.host import host_cpu
  dev, cpu = kc.Device["CLANG"], host_cpu()
  cc = dev.compiler.identity().split(" | ")
  return (f"CPU: {cpu.model} ({cpu.machine}, {os.cpu_count()} cores); kc CLANG arch: {dev.renderer.arch}; "
          f"compiler: {cc[1] if len(cc) > 1 else cc[0]}; flags: {' '.join(dev.compiler.flags)}")


def main():
  ap = argparse.ArgumentParser(description=__doc__)
  ap.add_argument("--repeats", type=int, default=7)
  ap.add_argument("--quick", action="store_true", help="3 repeats; print only (RESULTS.md is not written)")
  ap.add_argument("--no-write", action="store_true", help="print only (RESULTS.md is not written)")
  ap.add_argument("--isa", choices=["avx512f", "avx2", "sse2"],
                  help="build kc's kernels (KC_CLANG_ISA), the plain C loops and tinygrad's for this x86 ISA level instead of "
                       "-march=native; writes the section bench_clang_<isa>")
  args = ap.parse_args()
  if args.quick: args.repeats = 3
  level = None
  if args.isa:
    from kc_clang.host import isa_level
    try: level = isa_level(args.isa)  # before the device opens: it reads KC_CLANG_ISA then
    except kc.ConfigError as e: raise SystemExit(f"--isa {args.isa}: {e}") from None
    os.environ["KC_CLANG_ISA"] = args.isa
  print(host_line(), flush=True)
  rng = np.random.default_rng(0)
  rows: dict[str, dict[str, float]] = {"numpy": {}, "numpy (BLAS on one thread)": {}, "kc CLANG (all cores)": {}, "kc CLANG (one thread)": {},
                                       "plain C loop (all cores)": {}, "plain C loop (one thread)": {}}
  opts: dict[str, str] = {}
  # numpy's BLAS threads keep spinning for a while after a call returns and take a core from whatever runs next, so
  # every numpy call (the references, then the anchors) is kept apart from the kc timings
  inputs = {name: [rng.standard_normal(s).astype(np.float32) * (0.5 if name.startswith("mul_add") else 1) for s in shapes]
            for name, (_, _, shapes) in WORKLOADS.items()}
  refs = {name: reference(name, xs) for name, xs in inputs.items()}
  time.sleep(1.0)
  for name, (_, _, shapes) in WORKLOADS.items():
    xs, ref = inputs[name], refs[name]
    reps = args.repeats if not name.startswith("matmul_1024") else max(3, args.repeats // 3)
    rows["kc CLANG (all cores)"][name], opts[name] = time_kc(name, shapes, xs, ref, reps, str(os.cpu_count() or 1))
    rows["kc CLANG (one thread)"][name], _ = time_kc(name, shapes, xs, ref, reps, "1")
    if name in C_ANCHORS:
      rows["plain C loop (all cores)"][name] = time_c(name, xs, ref, reps, str(os.cpu_count() or 1))
      rows["plain C loop (one thread)"][name] = time_c(name, xs, ref, reps, "1")
    print(name, {k: f"{v[name] * 1e3:.2f} ms" for k, v in rows.items() if name in v}, flush=True)
  for name in WORKLOADS:
    reps = args.repeats if not name.startswith("matmul_1024") else max(3, args.repeats // 3)
    rows["numpy"][name] = median_time(numpy_fn(name, inputs[name]), repeats=reps)
    if name.startswith("matmul"): rows["numpy (BLAS on one thread)"][name] = numpy_matmul_one_thread(WORKLOADS[name][2][0][0], reps)
  os.environ.pop("KC_CLANG_THREADS", None)
  notes = []
  if (why := ensure_clang()): notes.append(f"tinygrad CLANG not run: {why}")
  else:
    res, why = run_tinygrad_clang(args.repeats, level.march if level else "")
    if res is None: notes.append(f"tinygrad CLANG not run: {why}")
    else: rows[f"tinygrad {TINYGRAD_VERSION} CLANG"] = res
  tg = rows.get(f"tinygrad {TINYGRAD_VERSION} CLANG")
  names = list(WORKLOADS)
  from kc_clang.host import host_cpu
  if level:
    target = (f"Built for the ISA level {level.name} rather than for this CPU (-march=native): kc's kernels with "
              f"KC_CLANG_ISA={level.name} (-march={level.march}, "
              f"vectors of {level.vector_bytes // 4} floats, tiles for {32 if level.vector_bytes >= 64 else 16} vector registers), the plain "
              f"C loops and tinygrad's kernels with -march={level.march}; this CPU has {host_cpu().isa}. numpy picks its kernels at run time "
              "for this CPU. What a machine with only this ISA level would run, at this CPU's clock and caches.")
  else: target = "Built for this CPU (-march=native): kc's kernels, the plain C loops and tinygrad's kernels."
  lines = [f"## CLANG kernel speed{f' for {level.name}' if level else ''} (`python benchmarks/bench_clang.py --repeats {args.repeats}"
           f"{f' --isa {level.name}' if level else ''}`)", "", target, "",
           f"Medians of whole calls (result ready), every kc result checked against numpy first; kc uses its hand-coded opts and "
           f"splits the outermost output loop over the {os.cpu_count()} cores here (a thread pool in the runtime), or runs on one thread "
           f"(KC_CLANG_THREADS=1). tinygrad {TINYGRAD_VERSION}'s CLANG backend is single-threaded; numpy's BLAS (matmul) uses every core, "
           "or one (OPENBLAS_NUM_THREADS=1). The plain C loops are `out[i] = a[i] + b[i]` and `exp2f((a*b+c)*log2(e))`, compiled with "
           "kc's flags and split over the same threads. exp is exp2 of x*log2(e) in kc, as in tinygrad.", "", host_line(), "",
           "| implementation | " + " | ".join(f"{n} {WORKLOADS[n][0]}" for n in names) + " |", "|---|" + "---:|" * len(names)]
  for label, row in rows.items():
    lines.append(f"| {label} | " + " | ".join(f"{WORKLOADS[n][1] / row[n] / 1e9:.1f}" if n in row else "-" for n in names) + " |")
  if tg:
    for label, target in (("kc CLANG (all cores)", 3), ("kc CLANG (one thread)", 2)):
      ratios = [tg[n] / rows[label][n] for n in names]
      lines.append(f"\n- {label} vs tinygrad CLANG: " + ", ".join(f"{n} {r:.2f}x" for n, r in zip(names, ratios)) +
                   f"; geometric mean {statistics.geometric_mean(ratios):.2f}x (above 1: kc is faster; the target is {target}x)")
  lines += ["", "Hand-coded opts: " + "; ".join(f"{n} [{o}]" for n, o in opts.items())] + [f"- {n}" for n in notes]
  body = "\n".join(lines)
  print(body)
  if not (args.quick or args.no_write): write_section(f"bench_clang_{level.name}" if level else "bench_clang", body)


if __name__ == "__main__":
  main()
