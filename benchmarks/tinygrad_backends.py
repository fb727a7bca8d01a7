"""Times tinygrad 0.10.0's add, sum, matmul, softmax and layernorm on one of its devices, the same sizes as bench_backends.py.
Runs inside the benchmark's own virtual environment, where only tinygrad is installed (no numpy); prints JSON
(seconds) on stdout. kc never imports tinygrad. Usage: tinygrad_backends.py DEVICE N_ADD N_SUM MM REPEATS"""
import json, statistics, sys, time
from tinygrad import Device, Tensor


def median_call(fn, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def main(device: str, n_add: int, n_sum: int, mm: int, repeats: int):
  Device.DEFAULT = device
  Tensor.manual_seed(0)
  a, b, s = Tensor.rand(n_add).realize(), Tensor.rand(n_add).realize(), Tensor.rand(n_sum).realize()
  x, y = Tensor.rand(mm, mm).realize(), Tensor.rand(mm, mm).realize()
  rows = Tensor.randn(mm, mm).realize()
  dev = Device[device]

  def run(make):
    make().realize()
    dev.synchronize()

  # each call schedules anew: tinygrad's per-call overhead is part of its figure, as kc's is part of kc's
  out = {"add": median_call(lambda: run(lambda: a + b), repeats), "sum": median_call(lambda: run(lambda: s.sum()), repeats),
         "matmul": median_call(lambda: run(lambda: x @ y), max(3, repeats // 3)),
         "softmax": median_call(lambda: run(lambda: rows.softmax(-1)), repeats),
         "layernorm": median_call(lambda: run(lambda: rows.layernorm(-1, 1e-5)), repeats)}
  # spot-check one row of the matmul against plain Python
  xs, ys, got = x[3].tolist(), y.tolist(), (x @ y)[3].tolist()
  for j in (0, mm // 2, mm - 1):
    ref = sum(xs[k] * ys[k][j] for k in range(mm))
    if abs(got[j] - ref) > 1e-3 * abs(ref): raise SystemExit(f"tinygrad matmul is wrong at (3, {j}): {got[j]} != {ref}")
  # and one row of each normalisation: a softmax row sums to 1, a layernorm row has mean 0 and mean square 1
  sm, ln = rows.softmax(-1)[5].tolist(), rows.layernorm(-1, 1e-5)[5].tolist()
  if abs(sum(sm) - 1) > 1e-3 or abs(sum(ln) / mm) > 1e-3 or abs(sum(v * v for v in ln) / mm - 1) > 1e-2:
    raise SystemExit("tinygrad's softmax or layernorm is wrong")
  print(json.dumps(out))


if __name__ == "__main__":
  main(sys.argv[1], *map(int, sys.argv[2:6]))
