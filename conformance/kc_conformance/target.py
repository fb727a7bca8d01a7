"""The device a conformance run certifies, and the three tiers run against it.

Creating a Target touches nothing; its renderer is made (and a device queried, where the plugin asks it for limits)
on first use, during the first test, never at import or collection."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional
import pytest
import kc
from kc import KcError, Kernel, KernelOptError, Opt, OptOps, Ops
from .capabilities import capability_set, declared, missing
from .case import Case, Setup
from .checks import judge, limit_violations, needs_of, render
from .corpus import CASES, setup_of
from .specs import CANDIDATES, SPECS, NotApplicable, Spec, opt_id, tc_level
from .worker import Crash, Raised, Worker, in_process_call


@dataclass
class Target:
  device: str
  timeout: float = 120.0
  isolate: bool = True
  _renderer: Any = None
  _programs: dict = field(default_factory=dict)
  _worker: Optional[Worker] = None
  setup_error: Optional[str] = None

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
  def arch(self) -> str: return getattr(self.renderer, "arch", "") or ""

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

  def program(self, case: Case, spec: Spec):
    """(setup, Program), computed once per case and spec and shared by the tiers; a refused spec skips."""
    key = (case.name, spec.name)
    if key not in self._programs:
      try: self._programs[key] = render(case, spec, self.renderer)
      except NotApplicable as e: self._programs[key] = e
      except KcError as e: self._programs[key] = _Failed(f"{type(e).__name__}: {e}")
    got = self._programs[key]
    if isinstance(got, NotApplicable): pytest.skip(f"not applicable: {got}")
    if isinstance(got, _Failed): pytest.fail(f"rendering failed: {got.message}", pytrace=False)
    return got

  def _needs_device(self, tier: str):
    if (reason := self.unavailable) is not None:
      pytest.skip(f"unavailable: {self.device} cannot open here ({reason}); the {tier} tier needs the device's "
                  + ("compiler, which its plugin gives only with the device" if tier == "compile" else "runtime"))

  def render_tier(self, case_name: str, spec_name: str, record) -> None:
    case, spec, _ = self._case(case_name, spec_name)
    setup, prg = self.program(case, spec)
    record("kc_program", {"name": prg.name, "global_size": _dims(prg.global_size), "local_size": _dims(prg.local_size)})
    if bad := limit_violations(prg, self.renderer): pytest.fail("; ".join(bad), pytrace=False)
    if case.vector_access and spec.opt is not None and spec.opt.op is OptOps.UPCAST and spec.opt.axis == 1 and spec.opt.amt == 4:
      widths = {u.op.name: u.dtype.count for u in prg.uops if u.op in (Ops.LOAD, Ops.STORE) and u.dtype.count > 1}
      if not widths and not any(u.op is Ops.STORE and u.src[1].dtype.count > 1 for u in prg.uops):
        pytest.fail("the renderer declares float4, but an UPCAST of the contiguous last axis by 4 gave no vector loads or stores", pytrace=False)

  def compile_tier(self, case_name: str, spec_name: str, record) -> None:
    case, spec, _ = self._case(case_name, spec_name)
    self._needs_device("compile")
    _, prg = self.program(case, spec)
    self._outcome(self._call("compile", self.device, prg.src), record, "compiling")

  def run_tier(self, case_name: str, spec_name: str, record) -> None:
    case, spec, _ = self._case(case_name, spec_name)
    self._needs_device("run")
    setup, prg = self.program(case, spec)
    outs = self._outcome(self._call("run", self.device, prg, setup), record, "running")
    verdict = judge(case, setup, outs)
    record("kc_errors", [c.to_json() for c in verdict.comparisons])
    if not verdict.ok: pytest.fail(f"wrong result: {verdict.reason}", pytrace=False)

  def _outcome(self, result, record, doing: str):
    if isinstance(result, Crash):
      record("kc_crash", result.reason)
      pytest.fail(f"{doing} the kernel ended the worker ({result.reason}); the run continues with a fresh worker", pytrace=False)
    if isinstance(result, Raised): pytest.fail(f"{doing} raised {result.type}: {result.message}", pytrace=False)
    return result

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
          with tc_level(1): trial.apply_opt(o)
        except KernelOptError:
          refused += 1
          if (after := _snapshot(trial)) != before:
            pytest.fail(f"{opt_id(o)} was refused on the {start} kernel but changed it: {before} -> {after}", pytrace=False)
          # the first refused trial renders exactly what the untouched Kernel renders (once: lowering is not cheap)
          if not source_checked and (source_checked := True) and _source(trial) != _source(k):
            pytest.fail(f"{opt_id(o)} was refused on the {start} kernel but changed the program it lowers to", pytrace=False)
        except KcError as e:
          pytest.fail(f"{opt_id(o)} on the {start} kernel raised {type(e).__name__}, not KernelOptError: {e}", pytrace=False)
    record("kc_refused", refused)
    if refused == 0: pytest.fail("no opt was refused: the illegal ones (an axis past the shape) must be", pytrace=False)


class _Failed:
  def __init__(self, message: str): self.message = message


def _dims(d) -> Optional[list]: return None if d is None else [x if isinstance(x, int) else x.render() for x in d]


def _snapshot(k: Kernel) -> tuple:
  return (tuple(k.full_shape), tuple(k.applied_opts), tuple(k.colored_shape()) if not isinstance(k.colored_shape(), str) else k.colored_shape())


def _source(k: Kernel) -> tuple:
  """What the Kernel lowers to: its linear UOps (hash-consed, so equal programs hold the same UOps) and launch dims.
  The source text is not compared: it carries the kernel's name, which is unique per Kernel."""
  prg = k.copy().to_program()
  return (tuple(prg.uops), _dims(prg.global_size), _dims(prg.local_size))


__all__ = ["Target"]
