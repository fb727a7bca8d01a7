"""The call path of a compiled CLANG kernel: what a call costs around the kernel itself, with numpy arrays (used in
place on host-memory devices) and with kc.Buffers, for a 4-element add (nothing but overhead) and a 1M-float add.
"copied" forces the copy-in/copy-out path a device-memory device takes, to show what using the arrays in place
saves. Kernels run on one thread (KC_CLANG_THREADS=1) so that OpenMP scheduling on a shared machine does not
drown the call path. Each result is checked against numpy first; figures are medians of whole calls.
Writes its section of benchmarks/RESULTS.md.
Run: python benchmarks/bench_call.py [--repeats 9]"""
from __future__ import annotations
import argparse, os, pathlib, platform, sys
os.environ.setdefault("KC_CLANG_THREADS", "1")
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import numpy as np  # noqa: E402
import kc  # noqa: E402
from kc import Buffer, dtypes  # noqa: E402
from kc import ast as A  # noqa: E402
from results import median_time, write_section  # noqa: E402

SIMD = ("avx512f", "avx2", "avx", "sse4_2", "asimd", "neon", "sve")


def cpu() -> str:
  """The CPU model and its widest vector extensions, from /proc/cpuinfo where there is one."""
  model, flags = platform.processor() or platform.machine(), set()
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      key, _, value = line.partition(":")
      if key.strip() in ("model name", "Model") and model in ("", platform.machine(), platform.processor()): model = value.strip()
      if key.strip() in ("flags", "Features"): flags |= set(value.split())
  except OSError: pass
  isa = "+".join(f for f in SIMD if f in flags) or "no SIMD flags listed"
  return f"{model}, {platform.machine()} ({isa}), {os.cpu_count()} cores"


def add_kernel(n: int) -> kc.CompiledKernel:
  return kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (n,)) + A.arg(2, dtypes.float32, (n,)))), device="CLANG")


def measure(n: int, repeats: int, number: int) -> dict[str, tuple[float, float]]:
  """{way: (median seconds per call, median kernel seconds as the call reports them)}"""
  k = add_kernel(n)
  rng = np.random.default_rng(0)
  x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
  out = np.zeros(n, np.float32)
  bx, by, bo = (Buffer("CLANG", n, dtypes.float32).allocate().copyin(a) for a in (x, y, out))
  k(out, x, y)
  k(bo, bx, by)
  assert np.array_equal(out, x + y) and np.array_equal(bo.numpy(), x + y), "the add is wrong: figures would mean nothing"
  allocator = kc.Device["CLANG"].allocator
  ways = {"numpy arrays": lambda: k(out, x, y), "kc.Buffers": lambda: k(bo, bx, by)}
  results = {}
  for way, call in [*ways.items(), ("numpy arrays, copied", ways["numpy arrays"])]:
    if way.endswith("copied"): allocator.from_numpy = lambda arr: None  # as a device whose memory is not the host's
    try:
      kernel_s: list[float] = []
      wall = median_time(lambda kernel_s=kernel_s, call=call: kernel_s.append(call()), repeats=repeats, number=number)
      results[way] = (wall, float(np.median(kernel_s)))
    finally: allocator.__dict__.pop("from_numpy", None)
  return results


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--repeats", type=int, default=9)
  args = ap.parse_args()
  rows, ratios = [], {}
  for label, n, number in (("4-element add", 4, 2000), ("1M-float add", 1 << 20, 20)):
    res = measure(n, args.repeats, number)
    ratios[label] = res["numpy arrays"][0] / res["kc.Buffers"][0]
    for way, (wall, kern) in res.items():
      rows.append((label, way, f"{wall * 1e6:.1f} us", f"{kern * 1e6:.1f} us", f"{(wall - kern) * 1e6:.1f} us"))
  for r in rows: print(f"{r[0]:15s} {r[1]:22s} call {r[2]:>11s}  kernel {r[3]:>11s}  around it {r[4]:>11s}")
  for label, ratio in ratios.items(): print(f"{label}: numpy / Buffer call time = {ratio:.2f}")
  body = (f"## bench_call: the call path of a CLANG kernel (`python benchmarks/bench_call.py --repeats {args.repeats}`)\n\n"
          f"CPU: {cpu()}. Kernels on one thread. \"call\" is the median wall time of `k(...)`, \"kernel\" the median "
          "time the call reports for the kernel alone, \"around it\" their difference: argument checks, handles, copies. "
          "\"copied\" forces the copy-in/copy-out path of a device-memory device.\n\n"
          "| kernel | arguments | call | kernel | around it |\n|---|---|---|---|---|\n" +
          "\n".join(f"| {' | '.join(r)} |" for r in rows) + "\n\n" +
          "; ".join(f"{label}: numpy / Buffer call time {ratio:.2f}x" for label, ratio in ratios.items()) + "\n")
  write_section("bench_call", body)


if __name__ == "__main__":
  main()
