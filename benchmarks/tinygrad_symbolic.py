"""Times tinygrad 0.10.0's simplify() on benchmarks/symbolic_corpus.py. Runs inside the benchmark's own
virtual environment with tinygrad installed; prints JSON on stdout. kc never imports tinygrad."""
import json, os, statistics, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from symbolic_corpus import corpus  # noqa: E402
from tinygrad.ops import UOp  # noqa: E402


def nodes(u): return len(u.sparents)


def main(fresh: int, warm_repeats: int):
  names = list(corpus(UOp.variable, "probe"))
  res = {}
  for name in names:
    builds = [corpus(UOp.variable, f"t{k}")[name] for k in range(fresh)]
    cold = []
    for e in builds:
      t0 = time.perf_counter(); e.simplify(); cold.append(time.perf_counter() - t0)
    e = builds[0]
    warm = []
    for _ in range(warm_repeats):
      t0 = time.perf_counter(); e.simplify(); warm.append(time.perf_counter() - t0)
    res[name] = {"nodes_in": nodes(e), "nodes_out": nodes(e.simplify()), "cold_s": statistics.median(cold),
                 "warm_s": statistics.median(warm), "render": e.simplify().render()}
  print(json.dumps(res))


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]))
