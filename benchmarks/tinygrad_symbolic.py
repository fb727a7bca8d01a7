"""Times tinygrad 0.10.0's simplify() on benchmarks/symbolic_corpus.py. Runs inside the benchmark's own
virtual environment with tinygrad installed; prints JSON on stdout. kc never imports tinygrad."""
import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from symbolic_corpus import time_simplify  # noqa: E402
from tinygrad.ops import UOp  # noqa: E402


def main(fresh: int, warm_repeats: int):
  print(json.dumps(time_simplify(UOp.variable, "t", fresh, warm_repeats, lambda u: len(u.sparents), lambda u: u.render())))


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]))
