"""kc-metal on a Mac, in one command:  python plugins/metal/mac_check.py

What the tests elsewhere cannot see, checked on the Mac's own Metal: the compile options in effect and the OS, GPU
family and MSL version they came from; that what Metal's `new…` methods return is freed (retainCount, the device's
allocated size across an allocate/free loop) and that launches leak nothing (process memory across 100,000 of them);
IEEE float32 math (sin(25), exp2(60) and ranges of sin and exp2 against numpy); buffer views at odd offsets, taken
where legal and refused where a kernel's reads would be misaligned; the bfloat simdgroup-matrix helper compiled and run
on Apple9; a kernel Metal's compiler rejects and one that fails on the GPU, each reported as a kc error; then the
conformance suite's run tier (`kc conformance --device METAL --tier run`).

Each check prints PASS, FAIL, SKIP or INFO and a line of detail; the exit status is 1 when any check failed, 0
otherwise. Elsewhere (another OS, or a Mac without `kc-metal[runtime]`) it says why it cannot run and exits 0.
Options: --launches N (default 100000), --skip-conformance, -n N (conformance processes, needs pytest-xdist)."""
from __future__ import annotations
import argparse, gc, platform, resource, shutil, subprocess, sys, time
from dataclasses import dataclass
from typing import Any, Callable, Optional
import numpy as np

MB = 1 << 20


@dataclass
class Result:
  status: str  # PASS, FAIL, SKIP or INFO
  detail: str


def passed(ok: bool, detail: str) -> Result: return Result("PASS" if ok else "FAIL", detail)


# ----------------------------------------------------------------------------------------------- the checks

def check_setup(dev) -> Result:
  """The compile options Metal gets, read back from a fresh MTLCompileOptions, against what kc meant to set."""
  import objc
  from kc_metal.compiler import compile_options
  s = dev.settings
  with objc.autorelease_pool():
    o = compile_options(s)
    language = int(o.languageVersion())
    math: tuple
    if s.math_mode is not None: math, want = (int(o.mathMode()), int(o.mathFloatingPointFunctions())), (s.math_mode, s.math_functions)
    else: math, want = (bool(o.fastMathEnabled()),), (s.fast_math,)
  print(f"  macOS {platform.mac_ver()[0]} ({platform.machine()}), Python {platform.python_version()}, "
        f"pyobjc {objc.__version__}")
  print(f"  {dev.mtl.name()}: family {dev.family.name}, MSL {s.language}; compile options: {s.describe()}")
  return passed(language == s.language.mtl_value and math == want,
                f"read back languageVersion={language}, math={math} (wanted {s.language.mtl_value}, {want})")


def check_ownership(dev) -> Result:
  """retainCount of what `new…` returns, and the device's allocated size across 50 allocate/free rounds of 64 MB."""
  import Metal, objc
  counts = {}
  with objc.autorelease_pool():
    buf = dev.mtl.newBufferWithLength_options_(MB, Metal.MTLResourceStorageModeShared)
    counts["buffer"] = int(buf.retainCount())
    queue = dev.mtl.newCommandQueue()
    counts["command queue"] = int(queue.retainCount())
    del buf, queue
  gc.collect()
  before = int(dev.mtl.currentAllocatedSize())
  for _ in range(50):
    with objc.autorelease_pool():
      b = dev.mtl.newBufferWithLength_options_(64 * MB, Metal.MTLResourceStorageModeShared)
      del b
  gc.collect()
  grown = int(dev.mtl.currentAllocatedSize()) - before
  return passed(counts["buffer"] == 1 and grown < 64 * MB,
                f"retainCount {counts} (1 owned by kc); allocated size grew {grown / MB:.1f} MB over 50 x 64 MB allocate/free "
                "(pyobjc before 12.2.3 without kc's metadata: +3200 MB)")


def _rss() -> int:
  most = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return most if sys.platform == "darwin" else most * 1024  # bytes on macOS, KiB on Linux


# The checks below take a device name: on a Mac "METAL"; kc's tests run them on EMU impersonating METAL.

def check_launches(device: str, launches: int) -> Result:
  """Process memory across `launches` launches of a small kernel (each a command buffer and an encoder)."""
  import kc
  from kc import dtypes, ast as A
  dev = kc.Device[device]
  k = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (256,)) + 1.0)), device=device)
  x, out = kc.Buffer(device, 256, dtypes.float32).allocate(), kc.Buffer(device, 256, dtypes.float32).allocate()
  x.copyin(np.zeros(256, np.float32))
  for _ in range(1000): k(out, x)
  dev.synchronize()
  rss0, t0 = _rss(), time.perf_counter()
  for i in range(launches):
    k(out, x)
    if i % 1000 == 999: dev.synchronize()
  dev.synchronize()
  grown, took = _rss() - rss0, time.perf_counter() - t0
  return passed(grown < 64 * MB, f"peak memory grew {grown / MB:.1f} MB over {launches} launches ({grown / max(launches, 1):.0f} B each, "
                                 f"{took / max(launches, 1) * 1e6:.0f} us each); a few KB each would be a leak")


def check_math(device: str) -> Result:
  """float32 sin and exp2 against numpy (float64, rounded), within kc's transcendental tolerance."""
  import kc
  from kc import dtypes, ast as A
  from kc.testing.compare import compare
  from kc.testing.tolerance import tolerance
  probes = {"sin": (np.append(np.linspace(-20, 20, 4001), 25.0), np.sin), "exp2": (np.append(np.linspace(-60, 60, 4001), 60.0), np.exp2)}
  lines, ok = [], True
  for name, (xs, ref) in probes.items():
    x = xs.astype(np.float32)
    k = kc.compile(A.sink(A.store(0, getattr(A.arg(1, dtypes.float32, x.shape), name)())), device=device)
    got = np.empty_like(x)
    k(got, x)
    c = compare(0, got, ref(x.astype(np.float64)).astype(np.float32), dtypes.float32, tolerance(dtypes.float32, "transcendental"))
    ok &= c.ok
    lines.append(f"{name}({x[-1]:g}) = {got[-1]!r} (numpy {ref(np.float64(x[-1])).astype(np.float32)!r}), worst {c.max_ulp} ulp over "
                 f"[{x[0]:g}, {x[-2]:g}], {c.mismatches} outside {c.tolerance}")
  return passed(ok, "; ".join(lines))


def check_views(device: str) -> Result:
  """Views at odd offsets: byte data anywhere, wider data at multiples of what the kernel reads, refused elsewhere
  (by kc's argument check for vectors, by the launch for scalars; EMU faults where Metal's launch refuses)."""
  import kc
  from kc import ArgumentError, Opt, OptOps, dtypes, ast as A
  from kc.emu import MisalignedAccessError
  from kc_metal.launch import LaunchError
  base = kc.Buffer(device, 4096, dtypes.uint8).allocate()
  raw = np.arange(4096, dtype=np.uint32).astype(np.uint8)
  base.copyin(raw)
  outcomes, ok = [], True
  # (dtype, upcast, byte offset, legal?)
  for dt, upcast, offset, legal in ((dtypes.int8, 1, 1, True), (dtypes.int8, 1, 3, True), (dtypes.float16, 1, 2, True),
                                    (dtypes.float16, 1, 1, False), (dtypes.float32, 1, 4, True), (dtypes.float32, 4, 4, False),
                                    (dtypes.float32, 4, 16, True), (dtypes.int64, 1, 4, False), (dtypes.int64, 1, 8, True)):
    n = 64
    opts = [Opt(OptOps.UPCAST, 0, upcast)] if upcast > 1 else "none"
    k = kc.compile(A.sink(A.store(0, A.arg(1, dt, (n,)) + A.arg(1, dt, (n,)))), device=device, opts=opts)
    view = base.view(n, dt, offset=offset)
    out = np.zeros(n, dt.np)
    try: k(out, view)
    except (ArgumentError, LaunchError, MisalignedAccessError) as e: took, why = False, type(e).__name__
    else: took, why = True, ""
    if took:
      x = raw[offset:offset + n * dt.itemsize].view(dt.np)  # any bytes: float data may hold NaNs and infs
      with np.errstate(all="ignore"): took_right = bool(np.array_equal(out, (x + x).astype(dt.np), equal_nan=dt.np.kind == "f"))
    else: took_right = True
    good = took == legal and took_right
    ok &= good
    outcomes.append(f"{dt.name}{'x' + str(upcast) if upcast > 1 else ''}@{offset}: {'ran' if took else 'refused ' + why}"
                    f"{'' if good else ' (WRONG)'}")
  return passed(ok, ", ".join(outcomes))


def check_bfloat_simdgroup(device: str) -> Result:
  """The bfloat -> float simdgroup-matrix helper (MSL 3.1, Apple9) compiled and run against numpy."""
  import kc
  from kc import Opt, OptOps, dtypes, ShapeTracker, UOp, Ops
  from kc_metal.renderer import MetalRenderer
  renderer: Any = kc.Device[device].renderer  # a MetalRenderer, or EMU's impersonation of one
  if not any(tc.dtype_in == dtypes.bfloat16 for tc in renderer.tensor_cores):
    return Result("SKIP", f"{renderer.family.name} with MSL {renderer.language} has no bfloat simdgroup matrices (Apple9, MSL 3.1)")
  M = K = N = 16
  def load(i, st): return UOp(Ops.LOAD, dtypes.bfloat16, (UOp(Ops.DEFINE_GLOBAL, dtypes.bfloat16.ptr(), (), i), st.to_uop()))
  mul = (load(1, ShapeTracker.from_shape((M, K, 1)).expand((M, K, N))) * load(2, ShapeTracker.from_shape((1, K, N)).expand((M, K, N))))
  red = UOp(Ops.REDUCE_AXIS, dtypes.float32, (mul.cast(dtypes.float32),), (Ops.ADD, (1,)))
  sink = UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(), (), 0),
                                                                   ShapeTracker.from_shape((M, 1, N)).to_uop(), red)),))
  k = kc.compile(sink, device=device, opts=[Opt(OptOps.TC, 0, 0)])
  src = MetalRenderer(renderer.family, renderer.language).render(k.program.name, k.program.uops)  # the MSL of those UOps
  if "simdgroup_matrix<bfloat" not in src: return Result("FAIL", "the kernel did not use the bfloat simdgroup helper")
  rng = np.random.default_rng(0)
  a, b = [(rng.standard_normal(s).astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32) for s in ((M, K), (K, N))]
  bufs = []
  for x in (a, b):
    bufs.append(kc.Buffer(device, x.size, dtypes.bfloat16).allocate())
    bufs[-1].copyin((x.view(np.uint32) >> 16).astype(np.uint16).tobytes())  # no numpy bfloat16: its bits
  out = np.empty((M, N), np.float32)
  k(out, *bufs)
  err = float(np.abs(out - a @ b).max())
  return passed(err < 1e-3, f"{k.program.name} compiled with simdgroup_matrix<bfloat, 8, 8>; max error {err:.2e} against numpy")


def check_rejected(dev) -> Result:
  """A kernel Metal's compiler rejects is a kc.CompileError with Metal's log; one past 31 arguments is refused first."""
  import kc
  from kc import CompileError, InvalidASTError, dtypes, ast as A
  src = "#include <metal_stdlib>\nusing namespace metal;\nkernel void kc_rejected(device float* d [[buffer(0)]]) { d[0] = frobnicate(1.0f); }"
  try: dev.compiler.compile_uncached(src)
  except CompileError as e: compiled, log = False, e.log
  else: compiled, log = True, ""
  x = A.arg(1, dtypes.float32, (8,))
  for i in range(2, 32): x = x + A.arg(i, dtypes.float32, (8,))
  try: kc.compile(A.sink(A.store(0, x)), device="METAL")
  except InvalidASTError: limit = "refused"
  else: limit = "accepted"
  return passed(not compiled and "frobnicate" in log and limit == "refused",
                f"CompileError: {log.strip().splitlines()[0] if log.strip() else '(no log)'}; a 32-argument kernel {limit}")


FAULT_SRC = """#include <metal_stdlib>
using namespace metal;
kernel void kc_gpu_fault(device float* data0 [[buffer(0)]], uint3 __kc_tid [[thread_position_in_grid]]) {
  data0[(ulong)__kc_tid.x * 0x10000000ul + 0x400000000ul] = 1.0f;  // 16 GB and more past a 4 KB buffer
}"""


def check_gpu_failure(dev) -> Result:
  """A kernel that faults on the GPU raises at the next synchronize, naming it; the device then runs kernels again."""
  import kc
  from kc import dtypes, ast as A
  from kc_metal.launch import GPUError
  prg = dev.runtime("kc_gpu_fault", dev.compiler.compile_uncached(FAULT_SRC))
  buf = kc.Buffer("METAL", 1024, dtypes.float32).allocate()
  prg(buf, global_size=(1024, 1, 1), local_size=None)
  try: dev.synchronize()
  except GPUError as e: raised = str(e)
  else: raised = ""
  k = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (8,)) * 2.0)), device="METAL")
  out = np.zeros(8, np.float32)
  k(out, np.arange(8, dtype=np.float32))
  again = bool(np.array_equal(out, np.arange(8, dtype=np.float32) * 2))
  return passed("kc_gpu_fault" in raised and again,
                f"synchronize raised: {raised or '(nothing: Metal reported no error)'}; the device runs kernels after it: {again}")


def check_conformance(jobs: Optional[str]) -> Result:
  """The conformance suite's run tier on METAL, in a process of its own."""
  import importlib.util
  if importlib.util.find_spec("kc_conformance") is None:
    return Result("SKIP", "kc-conformance is not installed: python -m pip install -e conformance (from the kc checkout)")
  kc_cli = shutil.which("kc")
  cmd = [kc_cli] if kc_cli else [sys.executable, "-c", "import sys; from kc.tools.cli import main; sys.exit(main())"]
  cmd += ["conformance", "--device", "METAL", "--tier", "run", "--require-tier", "run"] + (["-n", jobs] if jobs else [])
  print(f"  $ {' '.join(cmd)}", flush=True)
  rc = subprocess.call(cmd)
  return passed(rc == 0, f"kc conformance exited {rc}")


# ----------------------------------------------------------------------------------------------- the run

def run_checks(checks: list[tuple[str, Callable[[], Result]]]) -> int:
  failed = 0
  for name, check in checks:
    print(f"{name} ...", flush=True)
    try: r = check()
    except Exception as e:  # a check that crashes is a failure to report, not the end of the run
      r = Result("FAIL", f"{type(e).__name__}: {e}")
    failed += r.status == "FAIL"
    print(f"{r.status:4s} {name}: {r.detail}", flush=True)
  print(f"mac_check: {failed} of {len(checks)} checks failed" if failed else f"mac_check: all {len(checks)} checks passed or skipped")
  return 1 if failed else 0


def main(argv: Optional[list[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--launches", type=int, default=100_000, help="launches in the memory check (default 100000)")
  parser.add_argument("--skip-conformance", action="store_true", help="leave out the conformance run tier")
  parser.add_argument("-n", dest="jobs", default=None, help="conformance processes (needs pytest-xdist)")
  args = parser.parse_args(argv)
  import kc, kc_metal
  if (why := kc_metal.unavailable_reason()) is not None:
    print(f"mac_check: nothing to check here: {why}")
    return 0
  dev = kc.Device["METAL"]
  checks: list[tuple[str, Callable[[], Result]]] = [
    ("compile options", lambda: check_setup(dev)), ("ownership of new… objects", lambda: check_ownership(dev)),
    ("memory across launches", lambda: check_launches("METAL", args.launches)), ("float32 math", lambda: check_math("METAL")),
    ("views at odd offsets", lambda: check_views("METAL")), ("bfloat simdgroup matrix", lambda: check_bfloat_simdgroup("METAL")),
    ("a kernel Metal rejects", lambda: check_rejected(dev)), ("a kernel that fails on the GPU", lambda: check_gpu_failure(dev))]
  if not args.skip_conformance: checks.append(("conformance run tier", lambda: check_conformance(args.jobs)))
  return run_checks(checks)


if __name__ == "__main__": sys.exit(main())
