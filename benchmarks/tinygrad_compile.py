"""Times tinygrad 0.10.0's Kernel -> Program (every kernel its scheduler makes for the case: softmax is several)
(hand-coded opts, CLANG and OpenCL renderers) on benchmarks/compile_cases.py.
Runs inside the benchmark's own venv as a process bench_compile.py asks for one case at a time (serve), so that the
two sides' compiles alternate case by case; answers in JSON. kc never imports tinygrad."""
import json, os, sys, time
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


RENDERERS = {"CLANG": ClangRenderer(), "GPU": OpenCLRenderer()}


def compile_case(rname: str, name: str, i: int) -> dict:
  """One compile of case `name` at size index i with renderer `rname`: its seconds, kernels and linear UOps."""
  kind, shape = CASES[name](i)
  asts = [si.ast for si in create_schedule([build(kind, shape).lazydata]) if si.ast.op is Ops.SINK]
  t0 = time.perf_counter()
  programs = []
  for ast in asts:
    k = Kernel(ast, opts=RENDERERS[rname]); k.hand_coded_optimizations(); programs.append(k.to_program())
  # the linear UOps rendered, every kernel together
  return {"s": time.perf_counter() - t0, "kernels": len(asts), "uops": sum(len(p.uops) for p in programs)}


def warm_up() -> None:
  for rname in RENDERERS:  # every case once, untimed, as in bench_compile.py
    for name in CASES: compile_case(rname, name, WARMUP)


def serve():
  """bench_compile's interleaved measurement: after the warm-up, for each line `RENDERER CASE N` read from stdin the
  case compiled at size indices 0 .. N-1, their JSON list on one line of stdout."""
  warm_up()
  print("ready", flush=True)
  for line in sys.stdin:
    rname, name, n = line.split()
    print(json.dumps([compile_case(rname, name, i) for i in range(int(n))]), flush=True)


if __name__ == "__main__":
  serve()
