"""CLANG's self-test (BackendSpec.self_test, run by `kc doctor`): every known compiler bug's reproducer and the
canary kernels of known_bugs.py, compiled through the device's normal path (kc.compile: renderer, flags, compile
cache) and checked against numpy. A wrong answer names the compiler, its version, the flags and the entry, so the
record can gain an entry (or a wider version range) where a compiler it does not cover has the bug too."""
from __future__ import annotations
from typing import Optional
import numpy as np
import kc
from kc_clang import compiler as cc, host, known_bugs
from kc_clang.known_bugs import KernelSpec, KnownBug


def build(spec: KernelSpec):
  """(the kernel's sink, its input, numpy's answer) for `spec`."""
  x = _input(spec)
  namespace = {"np": np}
  # the same expression on the array and on the kernel's argument (eval: known_bugs.py's own strings, never user input)
  want = np.asarray(eval(spec.expr, namespace, {"x": x}))
  expr = eval(spec.expr, namespace, {"x": kc.ast.arg(1, kc.dtypes.from_numpy(x.dtype), spec.shape)})
  return kc.ast.sink(kc.ast.store(0, expr)), x, want


def _input(spec: KernelSpec) -> np.ndarray:
  dtype, size = np.dtype(spec.dtype), int(np.prod(spec.shape))
  rng = np.random.default_rng(0)
  if spec.values[:1] == ("integers",): flat = rng.integers(spec.values[1], spec.values[2], size)
  elif spec.values[:1] == ("normal",): flat = rng.standard_normal(size)
  else: flat = np.resize(np.array(spec.values), size)
  return flat.astype(dtype).reshape(spec.shape)


def _opts(spec: KernelSpec):
  return spec.opts if isinstance(spec.opts, str) else [kc.Opt(kc.OptOps[op], axis, amt) for op, axis, amt in spec.opts]


def wrong_answer(spec: KernelSpec, device: str) -> Optional[str]:
  """None when `spec`'s kernel on `device` gives numpy's answer, else what it gave instead."""
  sink, x, want = build(spec)
  got = kc.run(sink, {1: x}, device=device, opts=_opts(spec))[0]
  if got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got, want, equal_nan=got.dtype.kind == "f"):
    return None
  wrong = np.flatnonzero(np.asarray(got != want).reshape(-1)) if got.shape == want.shape else np.arange(0)
  if wrong.size == 0: return f"gave {got.dtype}{list(got.shape)} where numpy gives {want.dtype}{list(want.shape)}"
  i = int(wrong[0])
  return f"gave {got.reshape(-1)[i]} where numpy gives {want.reshape(-1)[i]} ({wrong.size} of {want.size} values wrong)"


def _compiler_facts(device: str) -> str:
  """The compiler, its version, the flags and the target level of `device`'s compiler, for a problem's message."""
  comp = kc.Device[device].compiler
  cmd = tuple(getattr(comp, "cmd", cc.compiler_command()))
  found = cc.compiler_id(cmd)
  flags = " ".join(getattr(comp, "flags", []))
  which = found.describe() if found else "does not run"
  return f"compiler {' '.join(cmd)!r}: {which}, flags {flags!r}, target {_level(comp)}"


def _level(comp) -> Optional[str]:
  """The x86-64 psABI level the compiler's flags build for (None off x86 or without -march)."""
  marches = [f.split("=", 1)[1] for f in getattr(comp, "flags", []) if f.startswith("-march=")]
  if not marches: return host.baseline_level()
  return host.psabi_level() if marches[-1] == "native" else marches[-1]


def _bug_problem(bug: KnownBug, wrong: str, device: str) -> str:
  comp = kc.Device[device].compiler
  cmd = tuple(getattr(comp, "cmd", cc.compiler_command()))
  found = cc.compiler_id(cmd)
  covered = found is not None and bug.matches(found.family, found.major, _level(comp))
  if covered and bug.flag in getattr(comp, "flags", []):
    why = f"the record covers this compiler and level and {bug.flag} is in the flags, yet it is still wrong"
  elif covered: why = f"the record covers this compiler and level, but {bug.flag} is not in the flags"
  else:
    why = (f"the record's entry covers {bug.family} {bug.versions[0]}-{bug.versions[1]} at "
           f"{', '.join(sorted(bug.levels))}, not this compiler and level: widen the entry in kc_clang/known_bugs.py, "
           f"or add the flag yourself: KC_CC=\"{' '.join(cmd)} {bug.flag}\"")
  return (f"known compiler bug {bug.name} ({bug.reason}) shows on {device}: its reproducer "
          f"[{bug.reproducer.describe()}] {wrong}; {_compiler_facts(device)}; {why}")


def _canary_problem(spec: KernelSpec, wrong: str, device: str) -> str:
  return f"canary kernel [{spec.describe()}] {wrong} on {device}; {_compiler_facts(device)}"


def self_test(device: str = "CLANG") -> dict[str, Optional[str]]:
  """Each check's name -> None when it passed, else the problem in a sentence: the reproducer of every entry of
  known_bugs.KNOWN_BUGS (whatever the compiler: an unlisted one may have the bug too) and every canary, on `device`."""
  results: dict[str, Optional[str]] = {}
  for bug in known_bugs.KNOWN_BUGS:
    wrong = _wrong_or_failed(bug.reproducer, device)
    results[f"known bug {bug.name}"] = None if wrong is None else _bug_problem(bug, wrong, device)
  for spec in known_bugs.CANARIES:
    wrong = _wrong_or_failed(spec, device)
    results[f"canary {spec.expr} ({spec.dtype})"] = None if wrong is None else _canary_problem(spec, wrong, device)
  return results


def _wrong_or_failed(spec: KernelSpec, device: str) -> Optional[str]:
  """wrong_answer(spec, device), with a kc error on the way (a compile that fails) said as what happened instead."""
  try: return wrong_answer(spec, device)
  except kc.KcError as e: return f"failed: {type(e).__name__}: {e}"
