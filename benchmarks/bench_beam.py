"""BEAM search against the hand-coded opts and against tinygrad 0.10.0's BEAM, on CLANG and OPENCL (PoCL), for
matmul 1024, conv2d and softmax (benchmarks/clang_workloads.py): each kernel's speed (GFLOP/s or GB/s, median of whole
calls, every result checked against numpy first) and each search's wall time, all in one run. kc searches with an
empty opt cache and an empty compile cache (a fresh KC_CACHE_DIR), tinygrad with its beam and compile caches off.
CLANG kernels run on one thread on both sides (tinygrad's CLANG is single-threaded); kc compiles candidates on every
core, as tinygrad does. Last, the cost of a repeated kc.compile(opts="beam") of a searched kernel, in the same process
and in a fresh one. Writes its section of benchmarks/RESULTS.md (not with --quick).
Run: python benchmarks/bench_beam.py [--quick] [--widths 2,4] [--devices CLANG,OPENCL]"""
from __future__ import annotations
import argparse, atexit, os, pathlib, shutil, statistics, subprocess, sys, tempfile, time
if __name__ == "__main__":  # before kc is imported: one thread for CLANG kernels, a fresh cache for this run
  os.environ["KC_CLANG_THREADS"] = "1"
  os.environ["KC_CACHE_DIR"] = tempfile.mkdtemp(prefix="kc-bench-beam-")
  atexit.register(shutil.rmtree, os.environ["KC_CACHE_DIR"], ignore_errors=True)
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import numpy as np  # noqa: E402
import kc  # noqa: E402
from kc.api import beam_opts  # noqa: E402
from anchors import run_tinygrad, TINYGRAD_VERSION  # noqa: E402
from bench_backends import tinygrad_on_pocl_wheel  # noqa: E402
from bench_clang import kc_ast, reference  # noqa: E402
from clang_workloads import WORKLOADS  # noqa: E402
from results import cpu, write_section  # noqa: E402

NAMES = ("matmul_1024", "conv2d_3x3_32ch_64px", "softmax_1024x1024")
TINYGRAD_DEVICE = {"CLANG": "CLANG", "OPENCL": "GPU"}


def interleaved_seconds(kernels: dict, xs, want, repeats: int) -> dict:
  """Median wall seconds of a whole call of each kernel, after checking each result against numpy. The kernels take
  turns, one call each per repeat, so that all of them see the same machine: on 2 shared cores the same kernel
  measured minutes apart differed by up to 2x."""
  out = np.empty(want.shape, np.float32)
  for ck in kernels.values():
    out.fill(np.nan)
    ck(out, *xs)
    np.testing.assert_allclose(out, want, rtol=1e-3, atol=1e-3)
  times: dict = {label: [] for label in kernels}
  for _ in range(repeats):
    for label, ck in kernels.items():
      t0 = time.perf_counter()
      ck(out, *xs)
      times[label].append(time.perf_counter() - t0)
  return {label: statistics.median(t) for label, t in times.items()}


def repeat_compile_ms(sink, device: str) -> tuple[float, float]:
  """Median ms of kc.compile(opts="beam") of a kernel already in the opt cache: in this process, and in a fresh one."""
  times = []
  for _ in range(7):
    t0 = time.perf_counter()
    kc.compile(sink, device, opts="beam")
    times.append(time.perf_counter() - t0)
  code = ("import sys, time; sys.path.insert(0, %r)\nfrom bench_clang import kc_ast\nfrom clang_workloads import WORKLOADS\n"
          "import kc\nsink = kc_ast('matmul_1024', WORKLOADS['matmul_1024'][2])\nt0 = time.perf_counter()\n"
          "kc.compile(sink, %r, opts='beam')\nprint(time.perf_counter() - t0)\n") % (str(pathlib.Path(__file__).parent), device)
  fresh = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
  return statistics.median(times) * 1e3, fresh * 1e3


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--quick", action="store_true", help="width 2 on CLANG matmul only, no RESULTS.md")
  ap.add_argument("--widths", default="2,4")
  ap.add_argument("--devices", default="CLANG,OPENCL")
  ap.add_argument("--repeats", type=int, default=7)
  args = ap.parse_args()
  widths = [2] if args.quick else [int(w) for w in args.widths.split(",")]
  devices = [d for d in (["CLANG"] if args.quick else args.devices.split(",")) if d in kc.Device.available()]
  names = NAMES[:1] if args.quick else NAMES
  rng = np.random.default_rng(0)
  rows, notes = [], []
  for dev in devices:
    for name in names:
      unit, amount, shapes = WORKLOADS[name]
      xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
      want = reference(name, xs)  # softmax in base 2, as kc_ast builds it
      sink = kc_ast(name, shapes)
      row = {"device": dev, "name": name, "unit": unit, "amount": amount}
      kernels = {"hand": kc.compile(sink, dev, "hand", split_reduce=False)}
      for w in widths:
        t0 = time.perf_counter()
        choice = beam_opts(sink, dev, w, cache=False)
        row[f"search{w}"] = time.perf_counter() - t0
        kernels[f"beam{w}"] = kc.compile(sink, dev, list(choice.opts))
        row[f"opts{w}"] = ", ".join(f"{o.op.name}{o.axis},{o.amt}" for o in choice.opts)
        print(dev, name, f"BEAM={w}", f"search {row[f'search{w}']:.1f} s", row[f"opts{w}"], flush=True)
      row.update(interleaved_seconds(kernels, xs, want, args.repeats))
      hand = row["hand"]
      print(dev, name, {k: f"{amount / row[k] / 1e9:.1f} {unit}" for k in kernels}, flush=True)
      with (tinygrad_on_pocl_wheel() if dev == "OPENCL" else _nothing()) as why:
        res, why = (None, why) if why else run_tinygrad("tinygrad_beam.py", TINYGRAD_DEVICE[dev], name, 2, args.repeats)
      if res is None: notes.append(f"tinygrad BEAM=2 on {dev} {name}: {why}")
      else: row["tg_search"], row["tg"] = res["search_s"], res["run_s"]
      print(dev, name, "hand", f"{amount / hand / 1e9:.1f} {unit}", "tinygrad", res, flush=True)
      rows.append(row)
  sink = kc_ast("matmul_1024", WORKLOADS["matmul_1024"][2])
  same, fresh = repeat_compile_ms(sink, "CLANG")
  rate = lambda r, k: f"{r['amount'] / r[k] / 1e9:.1f}" if k in r else "n/a"  # noqa: E731
  lines = ["## BEAM search (`python benchmarks/bench_beam.py`)", "",
           f"CPU: {cpu()}; kc CLANG arch: {kc.Device['CLANG'].renderer.arch}. "
           "Kernel speed: median of whole calls, the hand-coded and searched kernels taking turns call by call, each result "
           "checked against numpy first; CLANG kernels on one thread "
           "(kc and tinygrad), OPENCL on PoCL for both (tinygrad's GPU device). Search: wall seconds from the AST to the "
           "chosen opts, with empty caches on both sides; kc compiles candidates on every core in spawned workers, "
           f"tinygrad {TINYGRAD_VERSION} in its own pool. Units: GFLOP/s (matmul, conv2d), GB/s (softmax).", "",
           "| device | kernel | hand | " + " | ".join(f"kc BEAM={w} (search s)" for w in widths) + " | tinygrad BEAM=2 (search s) | "
           "kc BEAM=2 / hand | kc BEAM=2 / tinygrad BEAM=2 | search time kc / tinygrad |",
           "|---|---|---:|" + "---:|" * len(widths) + "---:|---:|---:|---:|"]
  for r in rows:
    cells = [f"{rate(r, f'beam{w}')} ({r[f'search{w}']:.1f})" for w in widths]
    tg = f"{rate(r, 'tg')} ({r['tg_search']:.1f})" if "tg" in r else "n/a"
    vs_tg = f"{r['tg'] / r['beam2']:.2f}x" if "tg" in r and "beam2" in r else "n/a"
    t_tg = f"{r['search2'] / r['tg_search']:.2f}" if "tg" in r and "search2" in r else "n/a"
    vs_hand = f"{r['hand'] / r['beam2']:.2f}x" if "beam2" in r else "n/a"
    lines.append(f"| {r['device']} | {r['name']} | {rate(r, 'hand')} | " + " | ".join(cells) + f" | {tg} | {vs_hand} | {vs_tg} | {t_tg} |")
  lines += ["", "Chosen opts:", ""] + [f"- {r['device']} {r['name']} BEAM={w}: {r[f'opts{w}']}" for r in rows for w in widths]
  lines += ["", f"A repeated `kc.compile(sink, 'CLANG', opts='beam')` of matmul 1024 once it is in the opt cache: {same:.1f} ms "
            f"(median of 7, same process), {fresh:.1f} ms (a fresh process, its import excluded)."]
  if notes: lines += [""] + [f"- {n}" for n in notes]
  text = "\n".join(lines)
  print(text)
  if not args.quick: write_section("bench_beam", text)


class _nothing:
  def __enter__(self): return None
  def __exit__(self, *exc): return False


if __name__ == "__main__":
  main()
