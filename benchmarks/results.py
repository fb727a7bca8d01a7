"""benchmarks/RESULTS.md is shared by every benchmark script: each one owns one section, between
markers, and rewrites only that section."""
from __future__ import annotations
import os, pathlib, platform, statistics, time
from typing import Callable

RESULTS = pathlib.Path(__file__).with_name("RESULTS.md")
HEADER = "# kc benchmark results\n\nEach section is written by the script it names; medians over repeated runs on a noisy machine.\n"


def write_section(name: str, body: str) -> None:
  """Replace (or append) the section `name` of RESULTS.md with `body` (markdown)."""
  start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
  text = RESULTS.read_text() if RESULTS.exists() else HEADER
  block = f"{start}\n{body.rstrip()}\n\n_{machine()}; written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}_\n{end}"
  if start in text and end in text:
    text = text[:text.index(start)] + block + text[text.index(end) + len(end):]
  else:
    text = text.rstrip() + "\n\n" + block + "\n"
  RESULTS.write_text(text)


SIMD = ("avx512f", "avx2", "avx", "sse4_2", "asimd", "neon", "sve")


def cpu() -> str:
  """The CPU model and its widest vector extensions, from /proc/cpuinfo where there is one."""
  model, flags = platform.processor() or platform.machine(), set()
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      key, _, value = line.partition(":")
      if key.strip() in ("model name", "Model") and model in ("", platform.machine(), platform.processor()): model = value.strip()
      if key.strip() in ("flags", "Features"): flags |= set(value.split())
  except OSError: pass
  isa = "+".join(f for f in SIMD if f in flags) or "no SIMD flags listed"
  return f"{model}, {platform.machine()} ({isa}), {os.cpu_count()} cores"


def machine() -> str:
  """What every section's figures ran on: the CPU and its vector extensions, the Python, the OS."""
  return f"{cpu()}, {platform.python_implementation()} {platform.python_version()}, {platform.system()}"


def median_time(fn: Callable[[], object], repeats: int = 7, number: int = 1) -> float:
  """Median seconds of one call of fn, over `repeats` timings of `number` calls each."""
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    for _ in range(number): fn()
    times.append((time.perf_counter() - t0) / number)
  return statistics.median(times)
