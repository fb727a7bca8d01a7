"""The optimization choices a case runs under ("specs"): none, the hand-coded heuristics, each single candidate opt,
seeded random legal sequences, and tensor cores at tensor-core levels (Kernel's tc_level) 1, 2 and 3. A spec that
does not apply to a kernel (an opt the Kernel refuses) is not applicable there: the test skips and says why."""
from __future__ import annotations
import random
from dataclasses import dataclass
from typing import Optional
from kc.api import optimize as kc_optimize
from kc import KcError, Kernel, KernelOptError, Opt, OptOps, UOp
from .case import BASIC, FULL, HAND, TENSOR, Case

O = OptOps
# Single opts tried on every FULL case: together they cover every OptOps but TC (its own specs) and UPCASTMID (which
# only the Kernel's own tensor-core handling uses). UNROLL/GROUP/GROUPTOP count their axis from the first reduce axis.
CANDIDATES: list[Opt] = [
  Opt(O.UPCAST, 0, 4), Opt(O.UPCAST, 0, 2), Opt(O.UPCAST, 1, 4), Opt(O.UPCAST, 1, 3), Opt(O.UPCAST, 0, 0),
  Opt(O.UNROLL, 0, 4), Opt(O.UNROLL, 0, 0), Opt(O.UNROLL, 1, 2), Opt(O.UNROLL, 0, 3),
  Opt(O.LOCAL, 0, 2), Opt(O.LOCAL, 0, 8), Opt(O.LOCAL, 1, 4), Opt(O.LOCAL, 0, 0),
  Opt(O.GROUP, 0, 4), Opt(O.GROUP, 1, 2), Opt(O.GROUPTOP, 0, 8), Opt(O.GROUPTOP, 0, 3),
  Opt(O.PADTO, 0, 32), Opt(O.PADTO, 1, 8), Opt(O.PADTO, 2, 16),
  Opt(O.SWAP, 0, 1), Opt(O.SWAP, 0, 2), Opt(O.NOLOCALS),
]
RANDOM_SEEDS = (0, 1, 2)
TC_LEVELS = (1, 2, 3)
# what a single opt needs the renderer to declare: without it the Kernel must refuse the opt, so the test is a
# capability skip rather than a refusal
_OPT_NEEDS = {O.LOCAL: ("locals",), O.GROUP: ("locals", "shared"), O.GROUPTOP: ("locals", "shared"), O.NOLOCALS: ("locals",)}


class NotApplicable(Exception):
  """The spec does not apply to this kernel on this renderer (the Kernel refuses an opt, no candidate applies)."""


def opt_id(o: Opt) -> str: return f"{o.op.name}-{o.axis}-{o.amt}" if o.axis is not None else o.op.name


@dataclass(frozen=True)
class Spec:
  name: str
  kind: str                 # none | hand | single | random | tc
  opt: Optional[Opt] = None
  seed: int = 0
  level: int = 0

  @property
  def needs(self) -> tuple[str, ...]: return _OPT_NEEDS.get(self.opt.op, ()) if self.opt is not None else ()


SPECS: dict[str, Spec] = {"none": Spec("none", "none"), "hand": Spec("hand", "hand"),
                          **{opt_id(o): Spec(opt_id(o), "single", opt=o) for o in CANDIDATES},
                          **{f"random{s}": Spec(f"random{s}", "random", seed=s) for s in RANDOM_SEEDS},
                          **{f"tc{lv}": Spec(f"tc{lv}", "tc", level=lv) for lv in TC_LEVELS}}


def specs_for(case: Case) -> list[Spec]:
  if case.specs == HAND: return [SPECS["hand"]]
  if case.specs == BASIC: return [SPECS["none"], SPECS["hand"]]
  if case.specs == TENSOR:
    if case.tensor_core is None: raise KcError(f"case {case.name}: tensor-core specs without a tensor_core")
    return [SPECS["none"], SPECS["hand"], *(s for s in SPECS.values() if s.kind == "tc")]
  if case.specs != FULL: raise KcError(f"case {case.name}: unknown specs {case.specs!r}")
  return [s for s in SPECS.values() if s.kind != "tc" or case.tensor_core is not None]


def random_opts(sink: UOp, renderer, seed: int, most: int = 3) -> list[Opt]:
  """A seeded random sequence of up to `most` opts that the Kernel accepts one after the other: the candidates in a
  shuffled order (twice over, so an opt may repeat), each kept when it applies."""
  rng, k, applied = random.Random(seed), Kernel(sink, renderer), []
  for o in rng.sample(CANDIDATES, len(CANDIDATES)) + rng.sample(CANDIDATES, len(CANDIDATES)):
    try: k.apply_opt(o)
    except KernelOptError: continue
    applied.append(o)
    if len(applied) == most: break
  return applied


def optimized_kernel(sink: UOp, renderer, spec: Spec) -> Kernel:
  """The case's Kernel with the spec's opts applied; NotApplicable when the Kernel refuses them."""
  k = Kernel(sink, renderer, tc_level=spec.level if spec.kind == "tc" else 1)
  if spec.kind in ("none", "hand"): return kc_optimize(k, spec.kind)  # exactly what kc.compile(opts=...) does
  opts: list[Opt]
  if spec.kind == "random":
    if not (opts := random_opts(sink, renderer, spec.seed)): raise NotApplicable("no candidate opt applies to this kernel")
  elif spec.kind == "single": opts = [spec.opt]
  else: opts = [Opt(O.TC, 0, 2)]
  for o in opts:
    try: k.apply_opt(o)
    except KernelOptError as e: raise NotApplicable(f"the Kernel refuses {opt_id(o)}: {e}") from None
  return k

