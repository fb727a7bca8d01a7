"""The call path of a compiled kernel on every device that opens here (CLANG, LLVM, EMU, OPENCL, CUDA): what a call costs
around the kernel itself, with numpy arrays (used in place on host-memory devices, copied in and out elsewhere) and
with kc.Buffers, for a 4-element add (nothing but overhead) and a 1M-float add, against numpy's own call
(np.add(x, y, out=out)) in the same run. On CLANG, "copied" forces the copy-in/copy-out path a device-memory device
takes, to show what using the arrays in place saves. CLANG and LLVM kernels run on one thread (KC_CLANG_THREADS=1,
KC_LLVM_THREADS=1) so that thread scheduling on a shared machine does not drown the call path. Each result is checked against numpy first;
figures are medians of whole calls. Writes its section of benchmarks/RESULTS.md.
Run: python benchmarks/bench_call.py [--repeats 9] [--devices CLANG,LLVM,EMU,OPENCL,CUDA]"""
from __future__ import annotations
import argparse, os, pathlib, sys
os.environ.setdefault("KC_CLANG_THREADS", "1")
os.environ.setdefault("KC_LLVM_THREADS", "1")
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import numpy as np  # noqa: E402
import kc  # noqa: E402
from kc import Buffer, dtypes  # noqa: E402
from kc import ast as A  # noqa: E402
from results import cpu, median_time, write_section  # noqa: E402

def gpu_line(devices: list[str], skipped: dict) -> str:
  """The GPU (or OpenCL device) a CUDA or OPENCL row ran on, as its device names itself."""
  return "".join(f" {d}: {kc.Device[d]!r}." for d in ("CUDA", "OPENCL") if d in devices and d not in skipped)


DEVICES = ("CLANG", "LLVM", "EMU", "OPENCL", "CUDA")


def add_kernel(n: int, device: str) -> kc.CompiledKernel:
  return kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (n,)) + A.arg(2, dtypes.float32, (n,)))), device=device)


def measure(device: str, n: int, repeats: int, number: int) -> dict[str, tuple[float, float]]:
  """{way: (median seconds per call, median kernel seconds as the call reports them)}"""
  k = add_kernel(n, device)
  rng = np.random.default_rng(0)
  x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
  out = np.zeros(n, np.float32)
  bx, by, bo = (Buffer(device, n, dtypes.float32).allocate().copyin(a) for a in (x, y, out))
  k(out, x, y)
  k(bo, bx, by)
  assert np.array_equal(out, x + y) and np.array_equal(bo.numpy(), x + y), f"the add is wrong on {device}: figures would mean nothing"
  allocator = kc.Device[device].allocator
  ways = {"numpy arrays": lambda: k(out, x, y), "kc.Buffers": lambda: k(bo, bx, by)}
  if k.device_callable and not k.host_callable:  # a GPU's memory by address (call_device), as a framework holds it
    where = [(allocator.pointer(b.allocate()._buf), b.nbytes) for b in (bo, bx, by)]
    ways["device addresses"] = lambda: k.call_device(*where)
  runs = [*ways.items(), *([("numpy arrays, copied", ways["numpy arrays"])] if device == "CLANG" else [])]
  results = {}
  for way, call in runs:
    if way.endswith("copied"):  # as a device whose memory is not the host's: no in-place arrays, no fast path
      allocator.from_numpy, saved_fast, k._fast = (lambda arr: None), k._fast, None
    try:
      kernel_s: list[float] = []
      wall = median_time(lambda kernel_s=kernel_s, call=call: kernel_s.append(call()), repeats=repeats, number=number)
      results[way] = (wall, float(np.median(kernel_s)))
    finally:
      if way.endswith("copied"): allocator.__dict__.pop("from_numpy", None); k._fast = saved_fast
  return results


def numpy_call(n: int, repeats: int, number: int) -> float:
  rng = np.random.default_rng(0)
  x, y, out = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32), np.zeros(n, np.float32)
  return median_time(lambda: np.add(x, y, out=out), repeats=repeats, number=number)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--repeats", type=int, default=9)
  ap.add_argument("--devices", default=",".join(DEVICES), help="comma-separated; those that cannot open here are skipped")
  args = ap.parse_args()
  devices = [d for d in args.devices.split(",") if d]
  skipped = {d: r for d in devices if (r := kc.Device.unavailable_reason(d)) is not None}
  rows = []
  for label, n, number in (("4-element add", 4, 2000), ("1M-float add", 1 << 20, 20)):
    base = numpy_call(n, args.repeats, number)
    rows.append(("numpy", label, "np.add(x, y, out=out)", f"{base * 1e6:.1f} us", "", "", "1.00x"))
    for device in (d for d in devices if d not in skipped):
      slow = device in ("EMU", "OPENCL", "CUDA") and n > 4  # fewer calls where one takes milliseconds
      for way, (wall, kern) in measure(device, n, args.repeats, max(1, number // 10) if slow else number).items():
        rows.append((device, label, way, f"{wall * 1e6:.1f} us", f"{kern * 1e6:.1f} us", f"{(wall - kern) * 1e6:.1f} us", f"{wall / base:.2f}x"))
  for r in rows: print(f"{r[0]:7s} {r[1]:14s} {r[2]:22s} call {r[3]:>11s}  kernel {r[4]:>11s}  around it {r[5]:>11s}  vs numpy {r[6]:>8s}")
  body = (f"## bench_call: the call path of a kernel on each device (`python benchmarks/bench_call.py --repeats {args.repeats}`)\n\n"
          f"CPU: {cpu()}.{gpu_line(devices, skipped)} CLANG and LLVM kernels on one thread. \"call\" is the median wall time "
          "of `k(...)`, \"kernel\" the median "
          "time the call reports for the kernel alone, \"around it\" their difference: argument checks, handles, copies, "
          "the launch. \"vs numpy\" is the call against numpy's own `np.add(x, y, out=out)` of the same size, in the same "
          "run. On CLANG, \"copied\" forces the copy-in/copy-out path of a device-memory device; on a GPU, \"device "
          "addresses\" are the kc.Buffers' memory given by address (`call_device`), as a framework holding device memory calls.\n\n"
          "| device | kernel | arguments | call | kernel | around it | vs numpy |\n|---|---|---|---|---|---|---|\n" +
          "\n".join(f"| {' | '.join(r)} |" for r in rows) + "\n" +
          "".join(f"\n{d} not measured: {r}\n" for d, r in skipped.items()))
  # a run of some devices alone (gpu_check.sh's CUDA on a GPU machine) has a section of its own beside the full run's
  write_section("bench_call" if set(devices) == set(DEVICES) else "bench_call_" + "_".join(d.lower() for d in devices), body)


if __name__ == "__main__":
  main()
