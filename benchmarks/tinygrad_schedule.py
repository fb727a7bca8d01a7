"""tinygrad 0.10.0's side of bench_schedule.py: for each program, the kernels Tensor.schedule() makes of its outputs
and the median time of a warm realize on tinygrad's CLANG device (the graph built and scheduled anew each call, as a
user's code runs) and of a TinyJit replay (the captured kernels alone). Runs in the benchmark's own venv (tinygrad only,
no numpy): the inputs come as raw float32 files that bench_schedule.py wrote, and the outputs of one realize go
back as raw files, so that bench_schedule.py checks them against numpy (the same program, not just the same name).
Usage: tinygrad_schedule.py SPEC.json, where SPEC is {"repeats": R, "programs": {name: {"inputs": [[path, shape],
...], "outputs": [path, ...]}}}. Prints JSON {name: {"kernels", "copies", "seconds", "jit_seconds", "outputs":
[[path, fmt, shape]]} or {"error": why}} on stdout."""
import json, math, sys
from tinygrad import Device, Tensor, TinyJit, dtypes
from tinygrad.helpers import GlobalCounters
from tinygrad.ops import Ops
from tinygrad_backends import median_call  # the benchmarks' one timing loop for tinygrad (this folder is on sys.path)


def softmax_rows(x): return x.softmax(1)
def layernorm(x, w, b):
  return (x - x.mean(1, keepdim=True)) / (x.var(1, keepdim=True, correction=0) + 1e-5).sqrt() * w + b
def attention(q, k, v): return (q @ k.T / math.sqrt(q.shape[1])).softmax(1) @ v
def standardize(x): return (x - x.mean()) / x.std(correction=0)
def argmax_rows(x): return x.argmax(1)
def matmul_bias_relu(x, w, b): return (x @ w + b).relu()
def sum_both_axes(x): return x.sum(0), x.sum(1)
def cumsum_rows(x): return x.cumsum(1)
def concatenate(a, b): return a.exp().cat(b * 2, dim=1)
def var_std_rows(x): return x.var(1, correction=0), x.std(1, correction=0)

# the same programs as bench_schedule.PROGRAMS, by name: numpy's meaning (population var and std: correction=0)
PROGRAMS = {"softmax": softmax_rows, "layernorm": layernorm, "attention": attention, "standardize": standardize,
            "argmax": argmax_rows, "matmul_bias_relu": matmul_bias_relu, "sum_axis0_axis1": sum_both_axes,
            "cumsum": cumsum_rows, "concatenate": concatenate, "var_std": var_std_rows}


def load(path: str, shape) -> Tensor:
  with open(path, "rb") as f: raw = f.read()
  return Tensor(raw, dtype=dtypes.float32).reshape(*shape).to("CLANG").realize()


def outputs_of(name: str, xs) -> tuple:
  out = PROGRAMS[name](*xs)
  return out if isinstance(out, tuple) else (out,)


def kernel_count(name: str, xs) -> tuple[int, int]:
  """(kernels, copies) of one schedule of the program's outputs: a schedule item whose AST is a SINK is a kernel; the
  rest move buffers (COPY, BUFFER_VIEW, EMPTY)."""
  outs = outputs_of(name, xs)
  items = outs[0].schedule(*outs[1:])
  kernels = sum(1 for si in items if si.ast.op is Ops.SINK)
  return kernels, len(items) - kernels


def realize(name: str, xs) -> None:
  outs = outputs_of(name, xs)
  outs[0].realize(*outs[1:])
  Device["CLANG"].synchronize()


def save_outputs(name: str, xs, paths: list) -> list:
  """Realize the program once (compiling its kernels) and write its outputs to `paths`. The outputs must not outlive
  this call: tinygrad's lazy cache would hand a later build of the same expression their realized buffers, and the
  timed realize would run no kernel."""
  saved = []
  for path, t in zip(paths, outputs_of(name, xs)):
    with open(path, "wb") as f: f.write(bytes(t.data()))
    saved.append([path, t.dtype.fmt, list(t.shape)])
  return saved


def launches(name: str, xs) -> int:
  """Kernels one realize of a fresh graph launches (a check that the timed realize computes, not reuses)."""
  before = GlobalCounters.kernel_count
  realize(name, xs)
  return GlobalCounters.kernel_count - before


def jit_seconds(name: str, xs, repeats: int) -> float:
  """A TinyJit of the program: the first call runs it, the second captures its kernels, later calls replay them."""
  jitted = TinyJit(lambda *ts: tuple(t.realize() for t in outputs_of(name, ts)))
  def call():
    jitted(*xs)
    Device["CLANG"].synchronize()
  for _ in range(3): call()
  return median_call(call, repeats)


def run(name: str, spec: dict, repeats: int) -> dict:
  xs = [load(path, shape) for path, shape in spec["inputs"]]
  kernels, copies = kernel_count(name, xs)
  saved = save_outputs(name, xs, spec["outputs"])
  if (launched := launches(name, xs)) != kernels:
    raise RuntimeError(f"a realize launched {launched} kernels where the schedule has {kernels}")
  return {"kernels": kernels, "copies": copies, "seconds": median_call(lambda: realize(name, xs), repeats),
          "jit_seconds": jit_seconds(name, xs, repeats), "outputs": saved}


def main(spec_path: str):
  Device.DEFAULT = "CLANG"
  with open(spec_path) as f: spec = json.load(f)
  result = {}
  for name, program in spec["programs"].items():
    try: result[name] = run(name, program, spec["repeats"])
    except Exception as e:  # one program's failure is reported with the others' results, not fatal to them
      result[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
  print(json.dumps(result))


if __name__ == "__main__":
  main(sys.argv[1])
