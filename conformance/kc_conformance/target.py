"""The device a conformance run certifies, and the three tiers run against it.

Creating a Target touches nothing; its renderer is made (and a device queried, where the plugin asks it for limits)
on first use, during the first test, never at import or collection."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional
import numpy as np
import pytest
import kc
from kc import KcError, Kernel, KernelOptError, Opt, OptOps, Ops
from .capabilities import capability_set, declared, missing
from .case import Case, Setup
from .checks import judge, limit_violations, needs_of, render
from .corpus import CASES, setup_of
from .programs import ScheduledPrograms, programs_of
from .specs import CANDIDATES, SPECS, NotApplicable, Spec, opt_id
from kc.testing.compare import compare
from kc.testing.tolerance import tolerance
from kc.testing.worker import HANG, Outcome
from .worker import Worker, in_process_call


@dataclass
class Target:
  device: str
  timeout: float = 120.0
  isolate: bool = True
  _renderer: Any = None
  _programs: dict = field(default_factory=dict)
  _worker: Optional[Worker] = None
  setup_error: Optional[str] = None
  _prefetched: set = field(default_factory=set)

  # ***** what the device is *****

  @property
  def spec(self): return kc.Device.spec(self.device)

  @property
  def unavailable(self) -> Optional[str]: return kc.Device.unavailable_reason(self.device)

  @property
  def renderer(self):
    if self._renderer is None: self._renderer = kc.Device.renderer(self.device)
    return self._renderer

  @property
  def capabilities(self) -> dict: return declared(self.renderer)

  @property
  def have(self) -> frozenset[str]: return capability_set(self.capabilities)

  @property
  def arch(self) -> str: return self.renderer.arch or ""

  def describe(self) -> dict:
    """The report's `device` section; as much as is known when something fails on the way."""
    out: dict = {"name": self.device}
    try:
      spec = self.spec
      out.update(distribution=spec.distribution or "(in-process)", version=spec.version or "", available=self.unavailable is None,
                 unavailable_reason=self.unavailable)
      r = self.renderer
      out.update(renderer=type(r).__name__, arch=self.arch, impersonates=getattr(r, "impersonates", None), capabilities=self.capabilities)
    except Exception as e:  # the report says what it could find out; the error itself is the run's setup_error
      out.setdefault("error", f"{type(e).__name__}: {e}")
    return out

  # ***** isolation *****

  def _call(self, kind: str, *args):
    if not self.isolate: return in_process_call(kind, *args)
    if self._worker is None:
      spec = self.spec
      in_process = [spec] if not spec.distribution else []  # entry-point plugins load in the worker by themselves
      self._worker = Worker(in_process, self.timeout)
    return self._worker.call(kind, *args)

  def close(self):
    if self._worker is not None: self._worker.stop()

  # ***** the tiers *****

  def _case(self, case_name: str, spec_name: str) -> tuple[Case, Spec, Setup]:
    case, spec = CASES[case_name], SPECS[spec_name]
    setup = setup_of(case_name)
    if lacking := missing(needs_of(case, setup, spec), self.have):
      pytest.skip(f"capability: needs {', '.join(lacking)}, which {self.device} does not declare")
    return case, spec, setup

  def program(self, case: Case, spec: Spec, record):
    """(setup, Program), computed once per case and spec and shared by the tiers; a refused spec skips."""
    key = (case.name, spec.name)
    if key not in self._programs:
      try: self._programs[key] = render(case, spec, self.renderer)
      except NotApplicable as e: self._programs[key] = e
      except KcError as e: self._programs[key] = _Failed(type(e).__name__, str(e))
    got = self._programs[key]
    if isinstance(got, NotApplicable): pytest.skip(f"not applicable: {got}")
    if isinstance(got, _Failed): fail(record, got.type, got.message, f"rendering failed: {got.type}: {got.message}")
    return got

  def _needs_device(self, tier: str):
    if tier == "compile" and self.spec.compiler is not None: return  # the plugin's compiler works without the device
    if (reason := self.unavailable) is not None:
      pytest.skip(f"unavailable: {self.device} cannot open here ({reason}); the {tier} tier needs the device's "
                  + ("compiler, which its plugin gives only with the device" if tier == "compile" else "runtime"))

  def render_tier(self, case_name: str, spec_name: str, record) -> None:
    case, spec, _ = self._case(case_name, spec_name)
    setup, prg = self.program(case, spec, record)
    record("kc_program", _program_json(prg))
    if bad := [v for p in programs_of(prg) for v in limit_violations(p, self.renderer)]:
      fail(record, "LimitViolation", "; ".join(bad), source=prg.src)
    if case.vector_access and spec.opt is not None and spec.opt.op is OptOps.UPCAST and spec.opt.axis == 1 and spec.opt.amt == 4:
      widths = {u.op.name: u.dtype.count for u in prg.uops if u.op in (Ops.LOAD, Ops.STORE) and u.dtype.count > 1}
      if not widths and not any(u.op is Ops.STORE and u.src[1].dtype.count > 1 for u in prg.uops):
        fail(record, "NoVectorAccess", "the renderer declares float4, but an UPCAST of the contiguous last axis by 4 gave no vector loads or "
             "stores", source=prg.src)

  def compile_tier(self, case_name: str, spec_name: str, record) -> None:
    case, spec, _ = self._case(case_name, spec_name)
    self._needs_device("compile")
    self._prefetch()
    _, prg = self.program(case, spec, record)
    for p in programs_of(prg): self._outcome(self._call("compile", self.device, p.src), record, "compiling", p.src)

  def run_tier(self, case_name: str, spec_name: str, record) -> None:
    case, spec, _ = self._case(case_name, spec_name)
    self._needs_device("run")
    setup, prg = self.program(case, spec, record)
    outs = self._outcome(self._call("run", self.device, prg, setup), record, "running", prg.src)
    verdict = judge(case, setup, outs, tensor_core=spec.kind == "tc")
    record("kc_errors", [c.to_json() for c in verdict.comparisons])
    if not verdict.ok:
      record("kc_mismatches", mismatch_sample(case, setup, outs, tensor_core=spec.kind == "tc"))
      fail(record, "WrongResult", verdict.reason, f"wrong result: {verdict.reason}", source=prg.src)

  def _prefetch(self, chunk: int = 64) -> None:
    """Build every kernel rendered so far and not yet built, with the device compiler's compile_many (batches of
    kernels in one compiler run, into the compile cache), before the first of their compile tests: the tiers run in
    order (every render test, then every compile test), so this is the whole run's kernels that this process
    rendered. Each compile test still compiles its own kernel (a cache hit now) and judges that; a batch that crashed
    or hung only costs the time it took, as its kernels are then built one by one."""
    srcs = [p.src for got in self._programs.values() if isinstance(got, tuple) for p in programs_of(got[1])]
    srcs = [src for src in dict.fromkeys(srcs) if src not in self._prefetched]
    self._prefetched.update(srcs)
    for start in range(0, len(srcs), chunk): self._call("compile_many", self.device, srcs[start:start + chunk])

  def _outcome(self, got: Outcome, record, doing: str, src: str):
    if got.raised: fail(record, got.etype, got.message, f"{doing} raised {got.etype}: {got.message}", source=src)
    if not got.ok:  # a crash or a hang
      reason = f"{'timeout' if got.kind == HANG else 'crash'}: {got.message}"
      record("kc_crash", reason)
      fail(record, "Crash", reason, f"{doing} the kernel ended the worker ({reason}); the run continues with a fresh worker",
           source=src)
    return got.value

  def opt_errors(self, case_name: str, record) -> None:
    """The error contract: every opt the Kernel refuses raises KernelOptError and leaves the Kernel as it was (its
    shapes, its applied opts, and the program it renders)."""
    case = CASES[case_name]
    setup = setup_of(case_name)
    if lacking := missing(needs_of(case, setup, SPECS["none"]), self.have):
      pytest.skip(f"capability: needs {', '.join(lacking)}, which {self.device} does not declare")
    # the candidates, and opts no kernel can take: an axis past the shape, an amount that divides nothing, a tensor
    # core after other opts
    illegal = [*CANDIDATES, Opt(OptOps.UPCAST, 40, 2), Opt(OptOps.UNROLL, 40, 2), Opt(OptOps.LOCAL, 0, 7919),
               Opt(OptOps.UPCAST, 0, 1), Opt(OptOps.TC, 0, 2)]
    refused = 0
    for start in ("none", "hand"):
      source_checked = False
      k = Kernel(setup.sink, self.renderer)
      if start == "hand": k.hand_coded_optimizations()
      before = _snapshot(k)
      for o in illegal:
        trial = k.copy()
        try:
          trial.apply_opt(o)  # a TC opt at the Kernel's default tensor-core level, 1
        except KernelOptError:
          refused += 1
          if (after := _snapshot(trial)) != before:
            fail(record, "OptContract", f"{opt_id(o)} was refused on the {start} kernel but changed it: {before} -> {after}")
          # the first refused trial renders exactly what the untouched Kernel renders (once: lowering is not cheap)
          if not source_checked and (source_checked := True) and _source(trial) != _source(k):
            fail(record, "OptContract", f"{opt_id(o)} was refused on the {start} kernel but changed the program it lowers to")
        except KcError as e:
          fail(record, "OptContract", f"{opt_id(o)} on the {start} kernel raised {type(e).__name__}, not KernelOptError: {e}")
    record("kc_refused", refused)
    if refused == 0: fail(record, "OptContract", "no opt was refused: the illegal ones (an axis past the shape) must be")


@dataclass
class _Failed:
  type: str
  message: str


def fail(record, kind: str, message: str, text: Optional[str] = None, source: Optional[str] = None):
  """Fail the test with `text` (default: the message), recording its cause (kind, message) for the report's grouping
  and, when there is one, the kernel source it failed on."""
  record("kc_cause", [kind, message])
  if source is not None: record("kc_source", source)
  pytest.fail(text if text is not None else message, pytrace=False)


def _plain(x) -> Any:
  """A numpy scalar as a plain Python value (reports and xdist carry only those)."""
  x = x.item() if hasattr(x, "item") else x
  return x if isinstance(x, (bool, int)) else float(x)


def mismatch_sample(case: Case, setup: Setup, outs: dict, limit: int = 5, tensor_core: bool = False) -> list[dict]:
  """Up to `limit` elements per output that are outside the tolerance, worst first: their index, numpy's value and
  the device's. Candidates are the elements with the largest absolute and relative errors; each is judged by the
  same comparison the test uses."""
  out = []
  for i, want in setup.expected.items():
    got, dt = np.asarray(outs[i]), setup.dtypes[i]
    if got.shape != want.shape: continue  # the comparison already says so; there are no matching indices
    tol = tolerance(dt, case.kind, case.overrides(tensor_core))
    g, w = got.reshape(-1), np.asarray(want).reshape(-1)
    with np.errstate(all="ignore"):
      diff = np.abs(g.astype(np.float64) - w.astype(np.float64))
      diff = np.where(np.isnan(diff), np.inf, diff)
      rel = diff / np.maximum(np.abs(w.astype(np.float64)), np.finfo(np.float64).tiny)
    candidates = dict.fromkeys([*np.argsort(-diff, kind="stable")[:8 * limit].tolist(), *np.argsort(-rel, kind="stable")[:8 * limit].tolist()])
    bad = [j for j in candidates if not compare(i, g[j:j + 1], w[j:j + 1], dt, tol).ok][:limit]
    out += [{"output": i, "index": [int(x) for x in np.unravel_index(j, want.shape)], "expected": _plain(w[j]), "actual": _plain(g[j])}
            for j in bad]
  return out


def _program_json(prg) -> dict:
  """The report's `program`: the kernel's name and launch dims; for a program of several kernels, each kernel's."""
  if not isinstance(prg, ScheduledPrograms):
    return {"name": prg.name, "global_size": _dims(prg.global_size), "local_size": _dims(prg.local_size)}
  return {"name": prg.name, "kernels": [_program_json(p) for p in prg.programs]}


def _dims(d) -> Optional[list]: return None if d is None else [x if isinstance(x, int) else x.render() for x in d]


def _snapshot(k: Kernel) -> tuple:
  return (tuple(k.full_shape), tuple(k.applied_opts), tuple(k.colored_shape()) if not isinstance(k.colored_shape(), str) else k.colored_shape())


def _source(k: Kernel) -> tuple:
  """What the Kernel lowers to: its linear UOps (hash-consed, so equal programs hold the same UOps) and launch dims.
  The source text is not compared: it carries the kernel's name, which is unique per Kernel."""
  prg = k.copy().to_program()
  return (tuple(prg.uops), _dims(prg.global_size), _dims(prg.local_size))


__all__ = ["Target"]
