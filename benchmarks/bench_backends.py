"""Benchmark: kc's kernels on CLANG and OPENCL (hand-coded opts) next to numpy, a plain C loop and tinygrad 0.10.0.

Five programs: elementwise add (GB/s over the three arrays), a full sum (GB/s over its input), a 1024x1024 matmul
(GFLOP/s), and a softmax and a layernorm (no affine) over the rows of a 1024x1024 array (GB/s over input and
output). Every figure is the median wall time of a whole call, result ready (OPENCL waits on its
event); every result is checked against numpy before it is timed. Run: python benchmarks/bench_backends.py
(--quick: smaller arrays and fewer repeats, for a smoke run)."""
from __future__ import annotations
import argparse, contextlib, ctypes, importlib.util, os, pathlib, shutil, subprocess, sys, tempfile
sys.path.insert(0, str(pathlib.Path(__file__).parent))
from anchors import run_tinygrad  # noqa: E402
from results import median_time, write_section  # noqa: E402
import numpy as np  # noqa: E402
import kc  # noqa: E402
from kc import Buffer, dtypes  # noqa: E402
from kc import ast as A  # noqa: E402

KINDS = ("add", "sum", "matmul", "softmax", "layernorm")
C_KINDS = ("add", "sum", "matmul")  # the plain C loops
DEVICES = ("CLANG", "OPENCL")

C_LOOPS = r"""
void add(float* restrict c, const float* restrict a, const float* restrict b, int n) { for (int i = 0; i < n; i++) c[i] = a[i] + b[i]; }
float sum(const float* restrict a, int n) { float s = 0.0f; for (int i = 0; i < n; i++) s += a[i]; return s; }
/* i-k-j order: the inner loop runs along rows of b and c, which is what a C programmer writes first */
void matmul(float* restrict c, const float* restrict a, const float* restrict b, int n) {
  for (int i = 0; i < n * n; i++) c[i] = 0.0f;
  for (int i = 0; i < n; i++) for (int k = 0; k < n; k++) { float x = a[i * n + k]; for (int j = 0; j < n; j++) c[i * n + j] += x * b[k * n + j]; }
}
"""


def sinks(n_add: int, n_sum: int, mm: int) -> dict:
  F = lambda i, *shape: A.arg(i, dtypes.float32, shape)  # noqa: E731
  rows = F(1, mm, mm)
  e = (rows - rows.max(1, keepdims=True)).exp()
  centred = rows - rows.mean(1, keepdims=True)
  return {"add": A.sink(A.store(0, F(1, n_add) + F(2, n_add))),
          "sum": A.sink(A.store(0, F(1, n_sum).sum())),
          "matmul": A.sink(A.store(0, (F(1, mm, mm).reshape(mm, mm, 1) * F(2, mm, mm).reshape(1, mm, mm)).sum(1))),
          "softmax": A.sink(A.store(0, e / e.sum(1, keepdims=True))),
          "layernorm": A.sink(A.store(0, centred / ((centred * centred).mean(1, keepdims=True) + 1e-5).sqrt()))}


def numpy_rows(kind: str, x: np.ndarray) -> np.ndarray:
  if kind == "softmax":
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)
  c = x - x.mean(1, keepdims=True)
  return c / np.sqrt((c * c).mean(1, keepdims=True) + np.float32(1e-5))


def work(kind: str, n_add: int, n_sum: int, mm: int) -> float:
  """Bytes moved (add, sum) or flops (matmul) of one call: the numerator of GB/s and GFLOP/s."""
  return {"add": 3 * 4 * n_add, "sum": 4 * n_sum, "matmul": 2 * mm ** 3, "softmax": 2 * 4 * mm * mm, "layernorm": 2 * 4 * mm * mm}[kind]


def check(kind: str, got: np.ndarray, ref: np.ndarray, who: str):
  tol = {"add": 0, "sum": 1e-3, "matmul": 1e-4, "softmax": 1e-5, "layernorm": 1e-4}[kind]
  err = float(np.abs(got.reshape(ref.shape) - ref).max() / max(1.0, float(np.abs(ref).max())))
  if err > tol: raise SystemExit(f"{who} {kind} is wrong: relative error {err:.2e} > {tol}")


def time_kc(device: str, kind: str, sink, inputs: list[np.ndarray], ref: np.ndarray, repeats: int) -> tuple[float, str]:
  ck = kc.compile(sink, device=device, opts="hand")
  out = Buffer(device, ref.size, dtypes.float32).allocate()
  bufs = [out] + [Buffer(device, x.size, dtypes.float32).copyin(x) for x in inputs]
  ck(*bufs)
  check(kind, out.numpy(), ref, f"kc {device}")
  # a program of several kernels (a softmax on a device with work-groups: its max, its sum, its quotient) names each one's
  opts = " + ".join(", ".join(f"{o.op.name}{o.axis},{o.amt}" for o in k.kernel.applied_opts) or "none" for k in getattr(ck, "kernels", [ck]))
  return median_time(lambda: ck(*bufs), repeats=repeats), opts


def time_c_loops(inputs: dict, refs: dict, mm: int, repeats: int) -> dict[str, float]:
  cc = os.environ.get("KC_CC", "cc").split()
  with tempfile.TemporaryDirectory() as tmp:
    so = os.path.join(tmp, "loops.so")
    subprocess.run([*cc, "-O2", "-shared", "-fPIC", "-x", "c", "-", "-o", so], input=C_LOOPS.encode(), check=True)
    lib = ctypes.CDLL(so)
  ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
  lib.sum.restype = ctypes.c_float
  a, b = inputs["add"]
  c = np.empty_like(a)
  s = inputs["sum"][0]
  x, y = inputs["matmul"]
  z = np.empty((mm, mm), np.float32)
  calls = {"add": lambda: lib.add(ptr(c), ptr(a), ptr(b), a.size), "sum": lambda: lib.sum(ptr(s), s.size),
           "matmul": lambda: lib.matmul(ptr(z), ptr(x), ptr(y), mm)}
  calls["add"](); check("add", c, refs["add"], "C loop")
  check("sum", np.float32(calls["sum"]()), refs["sum"], "C loop")
  calls["matmul"](); check("matmul", z, refs["matmul"], "C loop")
  return {k: median_time(f, repeats=repeats if k != "matmul" else max(3, repeats // 3)) for k, f in calls.items()}


def ensure_clang() -> str:
  """tinygrad's CLANG device runs `clang`; install it from the distribution when it is missing and we may."""
  if shutil.which("clang"): return ""
  if shutil.which("apt-get") is None or os.geteuid() != 0: return "clang is not installed (tinygrad's CLANG device needs it)"
  env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
  r = subprocess.run(["apt-get", "install", "-y", "-q", "clang"], capture_output=True, text=True, env=env)
  if r.returncode != 0:
    subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env)
    r = subprocess.run(["apt-get", "install", "-y", "-q", "clang"], capture_output=True, text=True, env=env)
  return "" if shutil.which("clang") else f"could not install clang: {r.stderr.strip()[-200:]}"


@contextlib.contextmanager
def tinygrad_on_pocl_wheel():
  """Point tinygrad's GPU device (which dlopens libOpenCL by name) at the ICD loader and PoCL that pyopencl's wheel
  ships, so both frameworks run on the same OpenCL driver. Yields None, or why that is not possible."""
  spec = importlib.util.find_spec("pyopencl")
  libs = pathlib.Path(next(iter(spec.submodule_search_locations))) / ".libs" if spec and spec.submodule_search_locations else None
  loaders = sorted(libs.glob("libOpenCL*.so*")) if libs and libs.is_dir() else []
  if not loaders or not list(libs.glob("*.icd")):
    yield "pyopencl's wheel with its bundled OpenCL loader and PoCL is not installed"
    return
  saved = {k: os.environ.get(k) for k in ("LD_LIBRARY_PATH", "OCL_ICD_VENDORS")}
  with tempfile.TemporaryDirectory() as tmp:
    for name in ("libOpenCL.so", "libOpenCL.so.1", loaders[0].name): os.symlink(loaders[0], os.path.join(tmp, name))
    os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(x for x in (tmp, str(libs), saved["LD_LIBRARY_PATH"]) if x)
    os.environ["OCL_ICD_VENDORS"] = str(libs)
    try: yield None
    finally:
      for k, v in saved.items():
        if v is None: os.environ.pop(k, None)
        else: os.environ[k] = v


def fmt(kind: str, amount: float, seconds) -> str:
  if seconds is None: return "n/a"
  return f"{amount / seconds / 1e9:.1f}"


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--quick", action="store_true")
  args = ap.parse_args()
  n_add, n_sum, mm, repeats = (1 << 20, 1 << 20, 256, 3) if args.quick else (1 << 24, 1 << 24, 1024, 9)
  rng = np.random.default_rng(0)
  inputs = {"add": [rng.random(n_add, dtype=np.float32), rng.random(n_add, dtype=np.float32)], "sum": [rng.random(n_sum, dtype=np.float32)],
            "matmul": [rng.random((mm, mm), dtype=np.float32), rng.random((mm, mm), dtype=np.float32)]}
  inputs.update({k: [rng.standard_normal((mm, mm), dtype=np.float32)] for k in ("softmax", "layernorm")})
  refs = {"add": inputs["add"][0] + inputs["add"][1], "sum": inputs["sum"][0].astype(np.float64).sum().astype(np.float32).reshape(1),
          "matmul": inputs["matmul"][0] @ inputs["matmul"][1], **{k: numpy_rows(k, inputs[k][0]) for k in ("softmax", "layernorm")}}
  ks = sinks(n_add, n_sum, mm)
  times: dict[str, dict[str, float]] = {}
  opts_used: dict[str, dict[str, str]] = {}
  notes: list[str] = []
  # numpy and C first: PoCL's worker threads, once started, share the cores with whatever runs after them
  x, y = inputs["matmul"]
  out = np.empty_like(inputs["add"][0])
  times["numpy"] = {"add": median_time(lambda: np.add(*inputs["add"], out=out), repeats=repeats),
                    "sum": median_time(lambda: inputs["sum"][0].sum(), repeats=repeats),
                    "matmul": median_time(lambda: x @ y, repeats=repeats),
                    **{k: median_time(lambda k=k: numpy_rows(k, inputs[k][0]), repeats=repeats) for k in ("softmax", "layernorm")}}
  times["C loop (cc -O2, one thread)"] = time_c_loops(inputs, refs, mm, repeats)
  for dev in DEVICES:
    if (why := kc.Device.unavailable_reason(dev)) is not None:
      notes.append(f"kc {dev} not run: {why}")
      continue
    label = f"kc {dev}"
    if dev == "OPENCL": notes.append(f"kc OPENCL ran on {kc.Device[dev].info.name} ({kc.Device[dev].info.platform.split(',')[0].strip()})")
    times[label], opts_used[dev] = {}, {}
    for kind in KINDS:
      reps = repeats if kind != "matmul" else max(3, repeats // 3)
      times[label][kind], opts_used[dev][kind] = time_kc(dev, kind, ks[kind], inputs[kind], refs[kind], reps)
      print(f"{label} {kind}: {times[label][kind] * 1e3:.2f} ms ({opts_used[dev][kind]})", flush=True)
  tg_rows = {}
  if (why := ensure_clang()): notes.append(f"tinygrad CLANG not run: {why}")
  else:
    res, why = run_tinygrad("tinygrad_backends.py", "CLANG", n_add, n_sum, mm, repeats)
    if res is None: notes.append(f"tinygrad CLANG not run: {why}")
    else: tg_rows["tinygrad 0.10.0 CLANG"] = res
  with tinygrad_on_pocl_wheel() as why:
    if why is None: res, why = run_tinygrad("tinygrad_backends.py", "GPU", n_add, n_sum, mm, repeats)
    if why: notes.append(f"tinygrad GPU (OpenCL on PoCL) not run: {why}")
    else: tg_rows["tinygrad 0.10.0 GPU (PoCL)"] = res
  times.update(tg_rows)
  for label, row in times.items(): print(label, {k: f"{v * 1e3:.2f} ms" for k, v in row.items()})

  amount = {k: work(k, n_add, n_sum, mm) for k in KINDS}
  lines = ["## Backends: add, sum, matmul, softmax, layernorm (`python benchmarks/bench_backends.py`)", "",
           f"add: two float32 arrays of {n_add:,} elements into a third (GB/s over all three); sum: {n_sum:,} float32 to one "
           f"(GB/s over the input); matmul: float32 {mm}x{mm} @ {mm}x{mm} (GFLOP/s); softmax and layernorm (no affine, eps 1e-5) over "
           f"the rows of a float32 {mm}x{mm} array (GB/s over its input and output). Median wall time of a whole call with the "
           f"result ready, over {repeats} runs ({max(3, repeats // 3)} for the C and kc matmuls); every result checked against numpy "
           f"first. kc runs its hand-coded opts; {os.cpu_count()} CPU cores here: kc CLANG splits its outermost output loop over all "
           f"of them (a thread pool in its runtime), the C loop and tinygrad CLANG use one, PoCL and numpy's BLAS all of them.", "",
           "| implementation | add GB/s | sum GB/s | matmul GFLOP/s | softmax GB/s | layernorm GB/s |", "|---|---:|---:|---:|---:|---:|"]
  for label, row in times.items(): lines.append(f"| {label} | " + " | ".join(fmt(k, amount[k], row.get(k)) for k in KINDS) + " |")
  lines += ["", "Ratios (time of the second over time of the first; above 1: the first is faster):", ""]
  def ratio(a: str, b: str):
    ra, rb = next((v for k, v in times.items() if k.startswith(a)), None), next((v for k, v in times.items() if k.startswith(b)), None)
    if ra and rb: lines.append(f"- {a} vs {b}: " + ", ".join(f"{k} {rb[k] / ra[k]:.2f}x" for k in KINDS if k in ra and k in rb))
  ratio("kc CLANG", "tinygrad 0.10.0 CLANG")
  ratio("kc OPENCL", "tinygrad 0.10.0 GPU")
  ratio("kc OPENCL", "kc CLANG")
  ratio("kc CLANG", "C loop")
  ratio("kc OPENCL", "numpy")
  lines += ["", "Hand-coded opts kc applied:", ""]
  for dev, row in opts_used.items(): lines.append(f"- {dev}: " + "; ".join(f"{k} [{v}]" for k, v in row.items()))
  if notes: lines += [""] + [f"- {n}" for n in notes]
  lines += ["", "kc.compile splits a reduce this large with one output (kc.schedule.split_reduce) into a partial kernel over many "
            "work-groups (CLANG: threads) and a combine kernel, as tinygrad's scheduler does (split_reduceop); the figures "
            "are the two kernels together."]
  if any("GPU" in k for k in tg_rows):
    lines += ["", "tinygrad's GPU device is its OpenCL backend; it runs here on the same PoCL as kc OPENCL (the loader and "
              "driver pyopencl's wheel ships, found through LD_LIBRARY_PATH and OCL_ICD_VENDORS)."]
  if not args.quick: write_section("bench_backends", "\n".join(lines))
  print("\n".join(lines))


if __name__ == "__main__":
  main()
