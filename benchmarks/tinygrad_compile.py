"""Times tinygrad 0.10.0's Kernel -> Program (every kernel its scheduler makes for the case: softmax is several)
(hand-coded opts, CLANG and OpenCL renderers) on benchmarks/compile_cases.py.
Runs inside the benchmark's own venv; prints JSON. kc never imports tinygrad."""
import json, os, statistics, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_cases import CASES, WARMUP  # noqa: E402
from tinygrad import Tensor  # noqa: E402
from tinygrad.engine.schedule import create_schedule  # noqa: E402
from tinygrad.codegen.kernel import Kernel  # noqa: E402
from tinygrad.renderer.cstyle import ClangRenderer, OpenCLRenderer  # noqa: E402
from tinygrad.ops import Ops  # noqa: E402


def build(kind, shape):
  if kind == "matmul": M, K, N = shape; return Tensor.empty(M, K) @ Tensor.empty(K, N)
  if kind == "add": return Tensor.empty(*shape) + Tensor.empty(*shape)
  if kind == "rowsum": return Tensor.empty(*shape).sum(1)
  if kind == "softmax": return Tensor.empty(*shape).softmax(1)
  if kind == "conv2d":
    cin, cout, H, W, k = shape
    return Tensor.empty(1, cin, H, W).conv2d(Tensor.empty(cout, cin, k, k), padding=1)
  raise ValueError(kind)


def main(repeats):
  out = {}
  renderers = (("CLANG", ClangRenderer()), ("GPU", OpenCLRenderer()))
  for _, ren in renderers:  # every case once, untimed, as in bench_compile.py
    for case in CASES.values():
      for si in create_schedule([build(*case(WARMUP)).lazydata]):
        if si.ast.op is Ops.SINK: k = Kernel(si.ast, opts=ren); k.hand_coded_optimizations(); k.to_program()
  for rname, ren in renderers:
    for name, case in CASES.items():
      times, uops = [], 0
      for i in range(repeats):
        kind, shape = case(i)
        asts = [si.ast for si in create_schedule([build(kind, shape).lazydata]) if si.ast.op is Ops.SINK]
        t0 = time.perf_counter()
        programs = []
        for ast in asts:
          k = Kernel(ast, opts=ren); k.hand_coded_optimizations(); programs.append(k.to_program())
        times.append(time.perf_counter() - t0)
        uops = sum(len(p.uops) for p in programs)  # the linear UOps rendered, every kernel together
      out[f"{rname}/{name}"] = {"median_s": statistics.median(times), "kernels": len(asts), "uops": uops}
  print(json.dumps(out))


if __name__ == "__main__":
  main(int(sys.argv[1]))
