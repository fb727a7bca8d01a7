"""Times tinygrad 0.10.0 on the CLANG anchor workloads (benchmarks/clang_workloads.py) on its CLANG device. Runs in
the benchmark's own venv (tinygrad only); prints JSON {workload: median seconds of a realize} on stdout.
Usage: tinygrad_clang.py REPEATS"""
import json, math, os, statistics, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clang_workloads import WORKLOADS  # noqa: E402
from tinygrad import Device, Tensor  # noqa: E402


def build(name, xs):
  if name == "add_16M": return xs[0] + xs[1]
  if name == "mul_add_exp_16M": return (xs[0] * xs[1] + xs[2]).exp()
  if name == "sum_16M": return xs[0].sum()
  if name.startswith("matmul"): return xs[0] @ xs[1]
  if name.startswith("conv2d"): return xs[0].reshape(1, *xs[0].shape).conv2d(xs[1], padding=1)
  if name.startswith("softmax"): return xs[0].softmax(1)
  raise ValueError(name)


def main(repeats: int):
  Device.DEFAULT = "CLANG"
  Tensor.manual_seed(0)
  out = {}
  for name, (_, _, shapes) in WORKLOADS.items():
    xs = [Tensor.rand(*s).realize() for s in shapes]
    build(name, xs).realize()  # compile once
    times = []
    for _ in range(repeats if not name.startswith(("matmul_1024", "conv")) else max(3, repeats // 3)):
      t0 = time.perf_counter()
      build(name, xs).realize()
      Device["CLANG"].synchronize()
      times.append(time.perf_counter() - t0)
    out[name] = statistics.median(times)
    if name == "softmax_1024x1024":  # a sanity check: rows sum to one
      row = build(name, xs)[7].tolist()
      if abs(math.fsum(row) - 1) > 1e-3: raise SystemExit(f"tinygrad softmax rows do not sum to 1: {math.fsum(row)}")
  print(json.dumps(out))


if __name__ == "__main__":
  main(int(sys.argv[1]))
