"""The three tiers as functions of a case, a spec and a device, shared by the pytest suite and kc's own tests.

render: the Kernel with the spec's opts lowers, the Renderer returns source, and the Program stays inside the
renderer's declared global/local/shared maxima. compile: the device's compiler accepts the source. run: the
outputs match numpy within the tolerance table."""
from __future__ import annotations
from dataclasses import dataclass
from typing import Optional
import numpy as np
from kc import Ops, Program, UOp
from .capabilities import dtype_need, tensor_core_need
from .case import Case, Setup
from .corpus import CASES, setup_of
from .programs import AnyProgram, render_scheduled, several_kernels
from .specs import Spec, optimized_kernel
from kc.testing.compare import Comparison, compare
from kc.testing.tolerance import tolerance

SEED = 0  # every case's inputs come from this seed: the same arrays on every machine


def needs_of(case: Case, setup: Setup, spec: Spec) -> set[str]:
  """Everything a (case, spec) test needs the device to declare."""
  out = {dtype_need(dt) for dt in setup.dtypes.values()} | set(case.needs) | set(spec.needs)
  if spec.kind == "tc": out.add(tensor_core_need(*case.tensor_core))
  if setup.images: out.add("images")
  return out


def render(case: Case, spec: Spec, renderer) -> tuple[Setup, AnyProgram]:
  """The case's Program for `renderer` under `spec` (NotApplicable when the Kernel refuses the spec); for a sink that
  kc.schedule cuts into several kernels, each kernel's Program (kc_conformance.programs)."""
  setup = setup_of(case.name, SEED)
  if (plan := several_kernels(setup.sink)) is not None: return setup, render_scheduled(plan, renderer, spec)
  return setup, optimized_kernel(setup.sink, renderer, spec).to_program()


def _worst(size) -> int:
  """A launch dim at its largest: symbolic sizes at their Variables' maxima."""
  return int(size.vmax) if isinstance(size, UOp) else int(size)


def limit_violations(prg: Program, renderer) -> list[str]:
  """How the Program breaks the renderer's declarations: empty source, launch dims past global_max/local_max, work-
  groups on a renderer without locals, local memory past shared_max."""
  out = []
  if not isinstance(prg.src, str) or not prg.src.strip(): out.append("the renderer returned no source")
  for what, dims, limit in (("global", prg.global_size, renderer.global_max), ("local", prg.local_size, renderer.local_max)):
    if dims is None: continue
    worst = [_worst(d) for d in dims]
    if what == "local" and not renderer.has_local and any(d != 1 for d in worst):
      out.append(f"local size {worst} on a renderer that declares no locals")
    if limit is None: continue
    if len(worst) > len(limit) and any(d != 1 for d in worst[len(limit):]):
      out.append(f"{what} size {worst} has more dims than {what}_max {tuple(limit)}")
    over = [i for i, (d, m) in enumerate(zip(worst, limit)) if d > m]
    if over: out.append(f"{what} size {worst} exceeds the declared {what}_max {tuple(limit)} in dim {over[0]}")
  local_bytes = sum(u.dtype.size * u.dtype.base.itemsize for u in prg.uops if u.op is Ops.DEFINE_LOCAL)
  if local_bytes > renderer.shared_max: out.append(f"{local_bytes} bytes of local memory exceed the declared shared_max {renderer.shared_max}")
  return out


def comparisons(case: Case, setup: Setup, outs: dict[int, np.ndarray], tensor_core: bool = False) -> list[Comparison]:
  """Each output against numpy's; `tensor_core`: the kernel ran with a tensor core (Case.tc_tolerance applies)."""
  over = case.overrides(tensor_core)
  return [compare(i, outs[i], want, setup.dtypes[i], tolerance(setup.dtypes[i], case.kind, over)) for i, want in setup.expected.items()]


@dataclass
class Verdict:
  """A run-tier result: ok, the per-output comparisons, and a one-line reason when not ok."""
  ok: bool
  comparisons: list[Comparison]
  reason: Optional[str] = None


def judge(case: Case, setup: Setup, outs: dict[int, np.ndarray], tensor_core: bool = False) -> Verdict:
  comps = comparisons(case, setup, outs, tensor_core)
  bad = [c for c in comps if not c.ok]
  return Verdict(not bad, comps, "; ".join(c.describe() for c in bad) or None)


__all__ = ["CASES", "SEED", "Verdict", "comparisons", "judge", "limit_violations", "needs_of", "render"]
