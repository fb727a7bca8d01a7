"""Times tinygrad 0.10.0's BEAM search on one anchor workload (benchmarks/clang_workloads.py): the search (the first
realize under BEAM=width, with tinygrad's beam and compile caches off, so every candidate is compiled) and then the
searched kernels' speed. Runs in the benchmark's own venv (tinygrad only); prints JSON {"search_s", "run_s"}.
Usage: tinygrad_beam.py DEVICE WORKLOAD WIDTH REPEATS"""
import json, os, statistics, sys, time
os.environ["IGNORE_BEAM_CACHE"] = "1"  # search every time: a cached result would time nothing
os.environ["CACHELEVEL"] = "0"         # and compile every candidate, as kc's search does on an empty cache
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clang_workloads import WORKLOADS  # noqa: E402
from tinygrad import Device, Tensor  # noqa: E402
from tinygrad.helpers import Context  # noqa: E402
from tinygrad_clang import build  # noqa: E402


def main(device: str, name: str, width: int, repeats: int):
  Device.DEFAULT = device
  Tensor.manual_seed(0)
  xs = [Tensor.rand(*s).realize() for s in WORKLOADS[name][2]]
  dev = Device[device]
  with Context(BEAM=width):
    t0 = time.perf_counter()
    build(name, xs).realize()
    dev.synchronize()
    search = time.perf_counter() - t0
    times = []
    for _ in range(repeats):  # the searched kernels, from tinygrad's in-process method cache
      t0 = time.perf_counter()
      build(name, xs).realize()
      dev.synchronize()
      times.append(time.perf_counter() - t0)
  print(json.dumps({"search_s": search, "run_s": statistics.median(times)}))


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
