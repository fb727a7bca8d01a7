"""How long the test suite and the conformance runs take on a fresh clone's empty compile cache: the README's test
command (pytest on every core) and `kc conformance -n auto` per device, each timed once (a run is minutes long; the
figure that matters is whether CI stays well under its budget on this machine).

  python benchmarks/bench_tests.py [--skip-tests] [--devices CLANG,OPENCL,EMU]"""
from __future__ import annotations
import argparse, os, pathlib, platform, subprocess, sys, tempfile, time
from results import write_section

ROOT = pathlib.Path(__file__).resolve().parent.parent


def timed(cmd: list[str], env: dict) -> tuple[float, int, str]:
  t0 = time.perf_counter()
  r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
  last = next((ln for ln in reversed(r.stdout.splitlines()) if " passed" in ln or " failed" in ln), r.stdout.strip()[-200:])
  return time.perf_counter() - t0, r.returncode, last.strip("= ")


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--skip-tests", action="store_true")
  ap.add_argument("--devices", default="CLANG,OPENCL,EMU")
  args = ap.parse_args()
  rows = []
  steps = ([] if args.skip_tests else
           [("tests (`python -m pytest -q -n auto`)", [sys.executable, "-m", "pytest", "-q", "-n", "auto", "-p", "no:cacheprovider"])])
  steps += [(f"`kc conformance --device {d} -n auto`", [sys.executable, "-m", "kc.tools.cli", "conformance", "--device", d, "-n", "auto"])
            for d in args.devices.split(",")]
  with tempfile.TemporaryDirectory(prefix="kc-cache-") as cache:  # empty, as on a fresh clone; removed at the end
    env = dict(os.environ, KC_CACHE_DIR=cache)
    for name, cmd in steps:
      seconds, rc, summary = timed(cmd, env)
      rows.append((name, seconds, rc, summary))
      print(f"{name:50s} {seconds:8.1f} s  rc={rc}  {summary}")
  body = ["## Test and conformance times on an empty compile cache (`python benchmarks/bench_tests.py`)", "",
          f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}); one empty KC_CACHE_DIR shared by the steps, in this order.", "",
          "| step | seconds | exit | outcome |", "|---|---:|---:|---|"]
  body += [f"| {n} | {s:.0f} | {rc} | {summary} |" for n, s, rc, summary in rows]
  write_section("bench_tests", "\n".join(body))
  return max(rc for _, _, rc, _ in rows)


if __name__ == "__main__": sys.exit(main())
