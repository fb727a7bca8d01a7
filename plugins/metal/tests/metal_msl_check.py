"""Syntax- and type-check rendered Metal kernels with the system C++ compiler (g++ or clang++), on any machine.

Every kernel of the conformance corpus that the Metal renderer declares it can run (every case under every spec whose
needs it meets) is rendered, and all of them go into a few translation units, each kernel in a namespace of its own,
after msl_shim.h (MSL's types, qualifiers and builtins as C++ declarations). One compiler call per core checks them.

What this proves: the source parses, every name it uses is declared, calls match a declaration, and the types and
conversions are ones C++ accepts. What it cannot: Metal's own rules (address spaces, attribute placement), overloads
only Metal has, and numbers (the EMU device and a Mac run those).

Run it as a script to check the whole corpus and print each failing kernel:  python plugins/metal/tests/metal_msl_check.py"""
from __future__ import annotations
import os, re, shutil, subprocess, sys, tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

SHIM = Path(__file__).with_name("msl_shim.h")
_PRELUDE_LINES = ("#include <metal_stdlib>",)  # the shim stands in for it, included once at the top


@dataclass(frozen=True)
class Kernel:
  label: str  # which case and spec it came from
  src: str


def cxx() -> Optional[str]:
  """The C++ compiler to check with: $CXX, else g++ or clang++ on PATH, else None."""
  for cand in (os.environ.get("CXX"), "g++", "clang++"):
    if cand and shutil.which(cand): return cand
  return None


def corpus_kernels(renderer) -> tuple[list[Kernel], list[str]]:
  """Every conformance kernel `renderer` declares it can run, rendered; and the labels the Kernel refused (NotApplicable)."""
  from kc_conformance.capabilities import capability_set, declared, missing
  from kc_conformance.checks import needs_of, render
  from kc_conformance.corpus import CASES, setup_of
  from kc_conformance.programs import programs_of
  from kc_conformance.specs import NotApplicable, specs_for
  have = capability_set(declared(renderer))
  kernels, refused = [], []
  for case in CASES.values():
    setup = setup_of(case.name, 0)
    for spec in specs_for(case):
      if missing(needs_of(case, setup, spec), have): continue
      label = f"{case.name}[{spec.name}]"
      try: _, prg = render(case, spec, renderer)
      except NotApplicable: refused.append(label); continue
      # a program of several kernels compiles each on its own (their names may repeat): a namespace each here too
      kernels.extend(Kernel(label, p.src) for p in programs_of(prg))
  return kernels, refused


def translation_unit(kernels: Iterable[Kernel]) -> str:
  """One C++ file: the shim, then each kernel in namespace kN (so kernels and their helpers never clash)."""
  parts = [f'#include "{SHIM}"']
  for i, k in enumerate(kernels):
    body = "\n".join(ln for ln in k.src.splitlines() if ln.strip() not in _PRELUDE_LINES)
    parts.append(f"// {k.label}\nnamespace k{i} {{\n{body}\n}}  // namespace k{i}")
  return "\n".join(parts) + "\n"


_LOCATION = re.compile(r"^(.+?):(\d+):\d+: (.*)$")


def _errors(stderr: str, unit: str, labels: dict[int, str]) -> list[str]:
  """The compiler's errors, each named by the kernel it is in. An error inside the shim (a static_assert of as_type,
  say) belongs to the kernel line that instantiated it, which GCC and clang print just before it."""
  out, last = [], "the shim"
  for line in stderr.splitlines():
    if not (m := _LOCATION.match(line)): continue
    if m.group(1) == unit: last = labels.get(int(m.group(2)), last)
    if m.group(3).startswith(("error: ", "fatal error: ")): out.append(f"{last}: {m.group(3).split(': ', 1)[1]}")
  return out


def _compile(compiler: str, kernels: list[Kernel], workdir: str, index: int) -> list[str]:
  """The errors of one translation unit, each named by the kernel it is in."""
  src = translation_unit(kernels)
  path = os.path.join(workdir, f"unit{index}.cpp")
  with open(path, "w") as f: f.write(src)
  res = subprocess.run([compiler, "-std=c++17", "-fsyntax-only", "-Wno-attributes", "-fmax-errors=50", path],
                       capture_output=True, text=True)
  if res.returncode == 0: return []
  # each line of the unit belongs to the kernel whose label comment last preceded it
  names, labels, current = {k.label for k in kernels}, {}, "the shim"
  for n, ln in enumerate(src.splitlines(), 1):
    if ln.startswith("// ") and ln[3:] in names: current = ln[3:]
    labels[n] = current
  return _errors(res.stderr, path, labels) or [res.stderr.strip()[-2000:]]


def check(kernels: list[Kernel], jobs: int = 2, compiler: Optional[str] = None) -> list[str]:
  """The C++ compiler's errors over `kernels` (empty when every kernel checks), in `jobs` parallel translation units."""
  compiler = compiler or cxx()
  if compiler is None: raise RuntimeError("no C++ compiler (g++ or clang++) on PATH; set CXX")
  if not kernels: return []
  chunks = [kernels[i::jobs] for i in range(jobs) if kernels[i::jobs]]
  with tempfile.TemporaryDirectory() as workdir, ThreadPoolExecutor(len(chunks)) as pool:
    results = pool.map(lambda ic: _compile(compiler, ic[1], workdir, ic[0]), enumerate(chunks))
    return [e for errs in results for e in errs]


def main() -> int:
  from kc_metal.renderer import MetalRenderer
  kernels, refused = corpus_kernels(MetalRenderer())
  errors = check(kernels, jobs=os.cpu_count() or 2)
  print(f"{len(kernels)} Metal kernels rendered ({len(refused)} case/spec pairs refused by the Kernel), {len(errors)} C++ errors")
  for e in errors: print("  " + e)
  return 1 if errors else 0


if __name__ == "__main__": sys.exit(main())
