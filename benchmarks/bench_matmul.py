"""matmul against numpy's BLAS: kc's hand-coded CLANG kernel for float32 matmul 1024 and 2048 next to numpy's `a @ b`,
on one thread and on every core, with kc built for this CPU (-march=native) and for AVX2 (KC_CLANG_ISA=avx2; numpy's
BLAS still runs the kernel it picked for this CPU, named from threadpoolctl).

Each configuration runs in a process of its own (OpenBLAS reads its thread count at load; kc's kernels are built for
the configuration's ISA and thread count). The kc result is checked against numpy first. Timings are medians of whole
calls, two ways: "alternating", kc's call and numpy's call taking turns (what an application that mixes kc kernels
with BLAS calls sees: OpenBLAS's threads spin after a call and can hold the cores), and "alone", a block of kc calls
with no BLAS call between them. The all-core configurations run again with OPENBLAS_THREAD_TIMEOUT=4, OpenBLAS's
threads sleeping at once after a call (docs/EMBEDDING.md: kc beside a BLAS).
Run: python benchmarks/bench_matmul.py [--repeats N] [--no-write]"""
from __future__ import annotations
import argparse, json, os, pathlib, subprocess, sys
from typing import Optional
sys.path.insert(0, str(pathlib.Path(__file__).parent))
from results import write_section  # noqa: E402

SIZES = (1024, 2048)

ONE_CONFIG = r"""
import json, statistics, sys, time
import numpy as np
import kc
from kc import Buffer, dtypes, ast as A
sizes, repeats = json.loads(sys.argv[1]), int(sys.argv[2])
res = {}
for n in sizes:
  rng = np.random.default_rng(n)
  x, y = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
  a, b = A.arg(1, dtypes.float32, (n, n)), A.arg(2, dtypes.float32, (n, n))
  k = kc.compile(A.sink(A.store(0, a @ b)), device="CLANG", opts="hand")
  out = Buffer("CLANG", n * n, dtypes.float32).allocate()
  bx, by = (Buffer("CLANG", v.size, dtypes.float32).copyin(v) for v in (x, y))
  kc_call, np_call = (lambda: k(out, bx, by)), (lambda: x @ y)
  kc_call()
  ref = x.astype(np.float64) @ y.astype(np.float64)
  err = float(np.abs(out.numpy().reshape(n, n) - ref).max() / np.abs(ref).max())
  if err > 1e-5: raise SystemExit(f"kc matmul {n} is wrong: relative error {err:.2e}")
  np_call()
  def timed(f):
    t = time.perf_counter(); f(); return time.perf_counter() - t
  alt_kc, alt_np = [], []
  for _ in range(repeats):
    alt_np.append(timed(np_call)); alt_kc.append(timed(kc_call))
  # OpenBLAS's threads poll for about 0.1 s after its last call: "alone" starts once they sleep (a 1024 matmul's
  # whole block of kc calls fit in that window and measured the sharing, not kc alone)
  time.sleep(0.5)
  alone = [timed(kc_call) for _ in range(repeats)]
  np_alone = [timed(np_call) for _ in range(repeats)]
  res[n] = {"kc_alt": statistics.median(alt_kc), "np_alt": statistics.median(alt_np), "kc_alone": statistics.median(alone),
            "np_alone": statistics.median(np_alone), "opts": ", ".join(f"{o.op.name}{o.axis},{o.amt}" for o in k.kernel.applied_opts)}
try:
  from threadpoolctl import threadpool_info
  blas = [d for d in threadpool_info() if d.get("user_api") == "blas"]
  res["blas"] = ", ".join(f"{d.get('internal_api')} {d.get('version')} ({d.get('architecture', '?')} kernels, "
                          f"{d.get('num_threads')} threads)" for d in blas)
except ImportError:
  res["blas"] = "threadpoolctl is not installed: the BLAS and its kernel are not named"
from kc_clang.host import host_cpu
r = kc.Device["CLANG"].renderer
res["arch"], res["cpu"] = r.arch, host_cpu().describe()
print(json.dumps(res))
"""


# OpenBLAS's threads poll for 2^THREAD_TIMEOUT cycles after each call before they sleep (default 2^28, about 0.1 s):
# alternating with kc, they hold the cores kc's threads would run on. 4 (its least) makes them sleep at once.
QUIET_BLAS = {"OPENBLAS_THREAD_TIMEOUT": "4"}


def run_config(isa: str, threads: str, repeats: int, blas_env: Optional[dict] = None) -> dict:
  """One configuration in a fresh process: kc built for `isa` ("" = this CPU), kc and the BLAS on `threads` threads,
  with `blas_env` set for the BLAS (else the BLAS's defaults)."""
  env = {k: v for k, v in os.environ.items() if k not in ("KC_CLANG_ISA", "KC_CLANG_THREADS", *QUIET_BLAS)}
  env.update(blas_env or {})
  if isa: env["KC_CLANG_ISA"] = isa
  if threads != "all":
    env["KC_CLANG_THREADS"] = threads
    env.update({v: threads for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")})
  r = subprocess.run([sys.executable, "-c", ONE_CONFIG, json.dumps(SIZES), str(repeats)], capture_output=True, text=True, env=env)
  if r.returncode != 0: raise SystemExit(f"matmul with KC_CLANG_ISA={isa or 'native'} threads={threads} failed:\n{r.stderr[-2000:]}")
  return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--repeats", type=int, default=7)
  ap.add_argument("--no-write", action="store_true", help="print only (RESULTS.md is not written)")
  args = ap.parse_args()
  cores = os.cpu_count() or 1
  rows, blas, cpu, ratios = [], set(), "", {}
  quiet_ratios = {}
  for isa in ("", "avx2"):
    for threads, blas_env in (("1", None), ("all", None), ("all", QUIET_BLAS)):
      res = run_config(isa, threads, args.repeats, blas_env)
      blas.add(res["blas"]); cpu = res["cpu"]
      for n in SIZES:
        m, gf = res[str(n)], 2 * n ** 3 / 1e9
        ratio = m["np_alt"] / m["kc_alt"]
        (quiet_ratios if blas_env else ratios)[(isa or "native", threads, n)] = ratio
        label = threads if threads == '1' else f"all ({cores})" + (", OPENBLAS_THREAD_TIMEOUT=4" if blas_env else "")
        rows.append(f"| {res['arch']} | {label} | {n} | {gf / m['kc_alt']:.1f} | "
                    f"{gf / m['np_alt']:.1f} | **{ratio:.2f}** | {gf / m['kc_alone']:.1f} | {gf / m['np_alone']:.1f} | "
                    f"{m['np_alone'] / m['kc_alone']:.2f} | [{m['opts']}] |")
      print(rows[-2], rows[-1], sep="\n", flush=True)
  native = [r for (isa, _, _), r in ratios.items() if isa == "native"]
  avx2 = [r for (isa, _, _), r in ratios.items() if isa == "avx2"]
  lines = [f"## matmul against numpy's BLAS (`python benchmarks/bench_matmul.py --repeats {args.repeats}`)", "",
           __doc__.split("Run:")[0].strip().replace("\n", " "), "",
           f"CPU: {cpu}. numpy's BLAS: {'; '.join(sorted(blas))}.", "",
           "| kc built for | threads | n | kc GFLOP/s (alternating) | numpy GFLOP/s (alternating) | kc/numpy (alternating) | "
           "kc GFLOP/s (alone) | numpy GFLOP/s (alone) | kc/numpy (alone) | kc's opts |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---|", *rows, "",
           f"- kc/numpy alternating, built for this CPU: {min(native):.2f}x to {max(native):.2f}x (the target: at least 0.9x); "
           f"built for AVX2: {min(avx2):.2f}x to {max(avx2):.2f}x (the target: at least 0.75x), with OpenBLAS's defaults",
           "- with OPENBLAS_THREAD_TIMEOUT=4 (OpenBLAS's threads sleep at once after a call instead of polling for about "
           "0.1 s): alternating, built for this CPU " + ", ".join(f"{r:.2f}x" for (i, _, _), r in quiet_ratios.items() if i == "native") +
           "; built for AVX2 " + ", ".join(f"{r:.2f}x" for (i, _, _), r in quiet_ratios.items() if i == "avx2") +
           ". Alternating with OpenBLAS's defaults, its polling threads hold the cores kc's threads would take (kc's chunks "
           "then run on what is left: about one core's speed on two cores); see docs/EMBEDDING.md"]
  text = "\n".join(lines)
  print(text)
  if not args.no_write: write_section("bench_matmul", text)


if __name__ == "__main__":
  main()
