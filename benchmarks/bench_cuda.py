"""Benchmark: kc on a CUDA GPU, next to what the same GPU does without kc.

- elementwise add of 2**26 floats in GB/s (three arrays moved), next to a device-to-device copy of the same array
  (cuMemcpyDtoDAsync on kc's stream, read + write counted): the ratio says how close kc's add is to the copy engine;
- matmuls at 4096 and 8192 in TFLOP/s: float32 with the hand-coded opts, and half->float and bfloat16->float through
  the tensor cores (apply_tensor_cores with its hand-coded follow-ups), each next to torch.matmul on the same GPU when
  torch is importable, and as a fraction of the GPU's datasheet peak where the GPU is in PEAKS.

Every figure is the median kernel time over repeated launches, as CUDA events measure it (what kc.compile'd kernels
return), after one warm-up launch; every result is checked against numpy first (the matmuls on a slice of rows).
--json is rewritten after every row, so a timeout keeps the rows before it; a wrong result or a kc error is that
row's "error" and the others still run (exit 1 at the end). Without a CUDA GPU it says why and exits 0.
Run: python benchmarks/bench_cuda.py [--json PATH] [--quick]
(--quick: small sizes, no RESULTS.md section)."""
from __future__ import annotations
import argparse, json, pathlib, re, statistics, sys
from typing import Callable, Optional
sys.path.insert(0, str(pathlib.Path(__file__).parent))
from results import write_section  # noqa: E402
import numpy as np  # noqa: E402
import kc  # noqa: E402
from kc import Buffer, Kernel, dtypes  # noqa: E402
from kc import ast as A  # noqa: E402
from kc.ir.codec import decode, encode  # noqa: E402

DEVICE = "CUDA"
# dense datasheet peaks (no sparsity): float32 on the CUDA cores, 16-bit inputs with float32 accumulation on the tensor
# cores, DRAM bandwidth; matched against the device name in this order (the first pattern that matches wins)
PEAKS: list[tuple[str, dict[str, float]]] = [
  (r"H200", {"fp32": 67e12, "tc16": 989e12, "bandwidth": 4.8e12}),
  (r"H100.*PCIe", {"fp32": 51e12, "tc16": 756e12, "bandwidth": 2.0e12}),
  (r"H100", {"fp32": 67e12, "tc16": 989e12, "bandwidth": 3.35e12}),   # SXM (H100 80GB HBM3)
  (r"A100.*40GB", {"fp32": 19.5e12, "tc16": 312e12, "bandwidth": 1.555e12}),
  (r"A100", {"fp32": 19.5e12, "tc16": 312e12, "bandwidth": 2.039e12}),
  (r"\bL4\b", {"fp32": 30.3e12, "tc16": 121e12, "bandwidth": 0.3e12}),
  (r"RTX 4090", {"fp32": 82.6e12, "tc16": 165.2e12, "bandwidth": 1.008e12}),
]
MATMULS = {"f32": (dtypes.float32, "fp32"), "f16->f32": (dtypes.float16, "tc16"), "bf16->f32": (dtypes.bfloat16, "tc16")}


def peaks_for(name: str) -> Optional[dict[str, float]]:
  return next((p for pattern, p in PEAKS if re.search(pattern, name, re.IGNORECASE)), None)


def median_kernel_time(run: Callable[[], float], repeats: int) -> float:
  """Median of `run()`'s own timings (seconds) after one warm-up."""
  run()
  return statistics.median(run() for _ in range(repeats))


def event_time(dev, launch: Callable[[], None]) -> float:
  """Seconds `launch` takes on the device's stream, between two CUDA events."""
  from cuda.bindings import driver as cu
  from kc_cuda.driver import check
  dev.activate()
  start, end = dev.new_event(), dev.new_event()
  try:
    check(cu.cuEventRecord(start, dev.stream), "cuEventRecord")
    launch()
    check(cu.cuEventRecord(end, dev.stream), "cuEventRecord")
    check(cu.cuEventSynchronize(end), "cuEventSynchronize")
    return float(check(cu.cuEventElapsedTime(start, end), "cuEventElapsedTime")) * 1e-3
  finally:
    for e in (start, end): cu.cuEventDestroy(e)


def to_device(arr: np.ndarray, dt) -> Buffer:
  return Buffer(DEVICE, arr.size, dt).copyin(memoryview(np.ascontiguousarray(arr).reshape(-1).view(np.uint8)))


class WrongResult(Exception):
  """A kernel's result that numpy disagrees with: the row is reported as an error, never timed."""


def relative_error(got: np.ndarray, ref: np.ndarray) -> float:
  return float(np.abs(got - ref).max() / max(1.0, float(np.abs(ref).max())))


# ---------------------------------------------------------------------------------------------------------- elementwise

def bench_add(dev, n: int, repeats: int) -> dict:
  rng = np.random.default_rng(0)
  x, y = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
  F = lambda i: A.arg(i, dtypes.float32, (n,))  # noqa: E731
  ck = kc.compile(A.sink(A.store(0, F(1) + F(2))), device=DEVICE, opts="hand")
  out, bx, by = Buffer(DEVICE, n, dtypes.float32).allocate(), to_device(x, dtypes.float32), to_device(y, dtypes.float32)
  ck(out, bx, by)
  if (err := relative_error(out.numpy(), x + y)) != 0:
    raise WrongResult(f"kc CUDA add is wrong: relative error {err:.2e}")
  add_s = median_kernel_time(lambda: ck(out, bx, by), repeats)
  copy = lambda: dev.allocator.copy_device(out._buf, bx._buf, 4 * n, wait=False)  # noqa: E731
  copy_s = statistics.median(event_time(dev, copy) for _ in range(repeats + 1))
  add_gbs, copy_gbs = 3 * 4 * n / add_s / 1e9, 2 * 4 * n / copy_s / 1e9
  return {"n": n, "kc_add_s": add_s, "kc_add_GBps": add_gbs, "memcpy_dtod_s": copy_s, "memcpy_dtod_GBps": copy_gbs,
          "ratio_to_memcpy": add_gbs / copy_gbs, "opts": opts_text(ck.kernel.applied_opts)}


# ---------------------------------------------------------------------------------------------------------- matmuls

def opts_text(opts) -> str: return ", ".join(f"{o.op.name}{o.axis},{o.amt}" for o in opts) or "none"


def matmul_sink(n: int, dt_in):
  x, y = A.arg(1, dt_in, (n, n)).reshape(n, n, 1), A.arg(2, dt_in, (n, n)).reshape(1, n, n)
  prod = x * y if dt_in == dtypes.float32 else x.cast(dtypes.float32) * y.cast(dtypes.float32)
  return A.sink(A.store(0, prod.sum(1)))


def compile_matmul(sink, dt_in, renderer):
  """fp32: the hand-coded opts; 16-bit inputs: a tensor core with apply_tensor_cores' own hand-coded follow-ups
  (tc_opt 1: the inputs are CASTs), falling back to the hand-coded opts where no tensor core fits."""
  if dt_in != dtypes.float32:
    k = Kernel(sink, renderer)
    if k.apply_tensor_cores(1, tc_opt=1): return kc.compile(sink, device=DEVICE, opts=list(k.applied_opts))
  return kc.compile(sink, device=DEVICE, opts="hand")


def bench_matmul(dev, n: int, kind: str, data: tuple[np.ndarray, np.ndarray], repeats: int, check_rows: int) -> dict:
  dt_in, peak_key = MATMULS[kind]
  a32, b32 = data
  a_dev, b_dev = encode(a32, dt_in), encode(b32, dt_in)  # bfloat16 as its bits: numpy has no bfloat16
  a_ref, b_ref = decode(a_dev[:check_rows], dt_in).astype(np.float32), decode(b_dev, dt_in).astype(np.float32)
  ck = compile_matmul(matmul_sink(n, dt_in), dt_in, dev.renderer)
  out, ba, bb = Buffer(DEVICE, n * n, dtypes.float32).allocate(), to_device(a_dev, dt_in), to_device(b_dev, dt_in)
  ck(out, ba, bb)
  got = out.numpy().reshape(n, n)[:check_rows]
  tol = 1e-3 if "TC" not in opts_text(ck.kernel.applied_opts) else 1e-2  # a float32 tensor core computes in tf32
  if (err := relative_error(got, a_ref @ b_ref)) > tol:
    raise WrongResult(f"kc CUDA {kind} matmul {n} is wrong on its first {check_rows} rows: "
                      f"relative error {err:.2e} > {tol}")
  s = median_kernel_time(lambda: ck(out, ba, bb), repeats)
  row = {"n": n, "kind": kind, "kc_s": s, "kc_TFLOPs": 2 * n ** 3 / s / 1e12, "opts": opts_text(ck.kernel.applied_opts),
         "tensor_cores": "TC" in opts_text(ck.kernel.applied_opts), "max_rel_error": err}
  if (peaks := peaks_for(dev.props.name)) is not None: row["fraction_of_peak"] = row["kc_TFLOPs"] * 1e12 / peaks[peak_key]
  return row


def torch_matmul(n: int, kind: str, data: tuple[np.ndarray, np.ndarray], tf32: bool, repeats: int) -> Optional[float]:
  """TFLOP/s of torch.matmul on the same GPU (16-bit inputs give a 16-bit output there, accumulated in float32)."""
  try: import torch
  except ImportError: return None
  if not torch.cuda.is_available(): return None
  dt = {"f32": torch.float32, "f16->f32": torch.float16, "bf16->f32": torch.bfloat16}[kind]
  torch.backends.cuda.matmul.allow_tf32 = tf32  # the same arithmetic as kc's kernel: tf32 only where kc used a tensor core
  a, b = (torch.from_numpy(x).to("cuda", dt) for x in data)
  start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
  def run() -> float:
    start.record()
    torch.matmul(a, b)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3
  return 2 * n ** 3 / median_kernel_time(run, repeats) / 1e12


# ---------------------------------------------------------------------------------------------------------- report

def markdown(fig: dict) -> str:
  dev = fig["device"]
  lines = [f"### CUDA: {dev['name']} ({dev['arch']}, driver {dev['driver']})", "",
           "Median kernel times from CUDA events; results checked against numpy first.", "",
           "| elementwise add, 2^26 floats | kc GB/s | cuMemcpyDtoD GB/s | kc / memcpy |", "|---|---|---|---|"]
  a = fig.get("add", {"error": "not run"})
  if "error" in a: lines.append(f"| error: {a['error']} | - | - | - |")
  else:
    lines.append(f"| {a['opts']} | {a['kc_add_GBps']:.0f} | {a['memcpy_dtod_GBps']:.0f} | {a['ratio_to_memcpy']:.2f} |")
  lines += ["", "| matmul | n | kc TFLOP/s | torch TFLOP/s | kc / torch | of peak | opts |", "|---|---|---|---|---|---|---|"]
  for r in fig["matmul"]:
    if "error" in r:
      lines.append(f"| {r['kind']} | {r['n']} | error: {r['error']} | - | - | - | - |")
      continue
    torch_s = f"{r['torch_TFLOPs']:.1f}" if r.get("torch_TFLOPs") else "-"
    ratio = f"{r['ratio_to_torch']:.2f}" if r.get("ratio_to_torch") else "-"
    peak = f"{r['fraction_of_peak']:.0%}" if "fraction_of_peak" in r else "-"
    lines.append(f"| {r['kind']} | {r['n']} | {r['kc_TFLOPs']:.1f} | {torch_s} | {ratio} | {peak} | {r['opts']} |")
  return "\n".join(lines)


def guarded(label: str, fields: dict, bench: Callable[[], dict]) -> dict:
  """bench()'s row, or `fields` and the error where the result was wrong or kc raised: the other rows still run."""
  try: return bench()
  except (WrongResult, kc.KcError) as e:
    print(f"{label}: {type(e).__name__}: {e}", flush=True)
    return {**fields, "error": f"{type(e).__name__}: {e}"}


def unavailable() -> Optional[str]:
  try: from kc_cuda.driver import unavailable_reason
  except ImportError: return "kc-cuda is not installed (pip install -e plugins/cuda)"
  return unavailable_reason()


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--json", default=None, metavar="PATH", help="write every figure to PATH as JSON")
  ap.add_argument("--quick", action="store_true", help="small sizes, fewer repeats, no RESULTS.md section")
  args = ap.parse_args()
  if (reason := unavailable()) is not None:
    print(f"CUDA is unavailable: {reason}")
    if args.json: pathlib.Path(args.json).write_text(json.dumps({"available": False, "reason": reason}, indent=2))
    return 0
  dev = kc.Device[DEVICE]
  p = dev.props
  n_add, sizes, repeats = (2**22, (512, 1024), 3) if args.quick else (2**26, (4096, 8192), 7)
  fig: dict = {"available": True, "device": {"name": p.name, "arch": p.arch, "driver": p.driver_version_text,
                                             "sms": p.multiprocessor_count, "memory_bandwidth_Bps": p.memory_bandwidth},
               "peaks": peaks_for(p.name)}
  def save():  # after every row: a timeout later keeps what was measured before it
    if args.json: pathlib.Path(args.json).write_text(json.dumps(fig, indent=2))
  fig["add"] = guarded(f"add {n_add}", {"n": n_add}, lambda: bench_add(dev, n_add, repeats))
  if "error" not in fig["add"]:
    add = fig["add"]
    print(f"add {n_add}: kc {add['kc_add_GBps']:.0f} GB/s, memcpy {add['memcpy_dtod_GBps']:.0f} GB/s", flush=True)
  fig["matmul"] = []
  save()
  rng = np.random.default_rng(1)
  big = max(sizes)
  a_all, b_all = (rng.random((big, big), dtype=np.float32) * 2 - 1 for _ in range(2))
  for n in sizes:
    data = (np.ascontiguousarray(a_all[:n, :n]), np.ascontiguousarray(b_all[:n, :n]))
    for kind in MATMULS:
      row = guarded(f"{kind} {n}", {"n": n, "kind": kind},
                    lambda n=n, kind=kind, data=data: bench_matmul(dev, n, kind, data, repeats, check_rows=min(n, 64)))
      if "error" not in row:
        if (t := torch_matmul(n, kind, data, row["tensor_cores"], repeats)) is not None:
          row["torch_TFLOPs"], row["ratio_to_torch"] = t, row["kc_TFLOPs"] / t
        print(f"{kind} {n}: kc {row['kc_TFLOPs']:.1f} TFLOP/s ({row['opts']})"
              + (f", torch {row['torch_TFLOPs']:.1f}" if "torch_TFLOPs" in row else ""), flush=True)
      fig["matmul"].append(row)
      save()
  text = markdown(fig)
  print(text)
  if not args.quick: write_section("bench_cuda", text)
  return 1 if any("error" in r for r in [fig["add"], *fig["matmul"]]) else 0


if __name__ == "__main__":
  sys.exit(main())
