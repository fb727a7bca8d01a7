"""Rewrite throughput and simplify() latency of kc's symbolic layer, next to tinygrad 0.10.0 on the same
index expressions (benchmarks/symbolic_corpus.py). Writes its section of benchmarks/RESULTS.md.

cold: the first simplify() of a freshly built expression (nothing cached), median over fresh builds.
warm: simplify() again on the same expression (kc memoizes rewrites on the hash-consed UOps).
numpy and a C loop have no counterpart for this figure; tinygrad is the anchor."""
from __future__ import annotations
import argparse, statistics, sys, time, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import kc  # noqa: E402
from kc import UOp, Ops, graph_rewrite  # noqa: E402
from kc.ir.symbolic import symbolic  # noqa: E402
from anchors import run_tinygrad, TINYGRAD_VERSION  # noqa: E402
from results import write_section  # noqa: E402
from symbolic_corpus import corpus, time_simplify  # noqa: E402


def measure_kc(fresh: int, warm_repeats: int) -> dict:
  return time_simplify(kc.Variable, "k", fresh, warm_repeats, lambda u: len(u.toposort), lambda u: u.render(simplify=False))


def throughput(copies: int) -> tuple[int, float]:
  """Nodes per second of one graph_rewrite over a SINK of many fresh corpus expressions (cold)."""
  exprs = [e for k in range(copies) for e in corpus(kc.Variable, f"tp{k}").values()]
  sink = UOp(Ops.SINK, kc.dtypes.void, tuple(exprs))
  n = len(sink.toposort)
  t0 = time.perf_counter(); graph_rewrite(sink, symbolic); dt = time.perf_counter() - t0
  return n, n / dt


def main():
  ap = argparse.ArgumentParser(description=__doc__)
  ap.add_argument("--fresh", type=int, default=200, help="fresh builds per expression for the cold median")
  ap.add_argument("--warm", type=int, default=200)
  args = ap.parse_args()
  ours = measure_kc(args.fresh, args.warm)
  theirs, why = run_tinygrad("tinygrad_symbolic.py", args.fresh, args.warm)
  tp_nodes, tp = throughput(40)
  us = lambda s: f"{s * 1e6:.1f}"  # noqa: E731
  rows = ["| expression | nodes in | nodes out kc / tg | kc cold µs | tinygrad cold µs | tg/kc cold | kc warm µs | tinygrad warm µs |",
          "|---|---:|---:|---:|---:|---:|---:|---:|"]
  ratios = []
  for name, k in ours.items():
    t = theirs.get(name) if theirs else None
    if t: ratios.append(t["cold_s"] / k["cold_s"])
    rows.append(f"| {name} | {k['nodes_in']} | {k['nodes_out']} / {t['nodes_out'] if t else '-'} | {us(k['cold_s'])} | "
                f"{us(t['cold_s']) if t else '-'} | {f'{ratios[-1]:.2f}x' if t else '-'} | {us(k['warm_s'])} | {us(t['warm_s']) if t else '-'} |")
  cold_all = sum(k["cold_s"] for k in ours.values())
  nodes_all = sum(k["nodes_in"] for k in ours.values())
  lines = [f"## Symbolic simplification (`python benchmarks/bench_symbolic.py --fresh {args.fresh} --warm {args.warm}`)", "",
           f"Medians over {args.fresh} fresh builds (cold) and {args.warm} repeats (warm); tinygrad {TINYGRAD_VERSION} from PyPI in "
           "its own venv, same expressions. 'nodes out' is the size of the simplified graph (smaller is better).", "", *rows, "",
           f"- kc cold simplify over the corpus: {nodes_all / cold_all:,.0f} input nodes/s "
           f"(median per expression {us(statistics.median(k['cold_s'] for k in ours.values()))} µs)",
           f"- kc graph_rewrite throughput on one SINK of {tp_nodes} nodes (cold): {tp:,.0f} nodes/s"]
  if ratios: lines.append(f"- tinygrad/kc cold time ratio, median over the corpus: {statistics.median(ratios):.2f}x (above 1: kc is faster)")
  else: lines.append(f"- tinygrad anchor unavailable: {why}")
  body = "\n".join(lines)
  print(body)
  for name, k in ours.items(): print(f"  kc {name}: {k['render']}")
  if theirs:
    for name, t in theirs.items(): print(f"  tg {name}: {t['render']}")
  write_section("bench_symbolic", body)


if __name__ == "__main__":
  main()
