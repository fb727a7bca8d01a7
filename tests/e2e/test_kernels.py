"""Every case on every available device, under no opts, the hand-coded opts, each legal single opt from the
candidate list, and a few seeded random legal sequences; numpy is the oracle (tolerances in tolerance.py).

A wrong result here is a bug in kc (or the backend), never something to tolerate: known ones are listed in
KNOWN_BUGS with their reproducer and run as strict xfails, so a fix shows up as an XPASS to remove."""
from __future__ import annotations
from dataclasses import dataclass
from typing import Callable
import pytest
from kc import Opt, OptOps
from .cases import CASES, setup_of
from .harness import CANDIDATES, RANDOM_SEEDS, execute, missing_dtypes, random_opts, refusal
from .tolerance import assert_close


def _opt_id(o: Opt) -> str: return f"{o.op.name}-{o.axis}-{o.amt}" if o.axis is not None else o.op.name


SPECS: dict[str, object] = {"none": "none", "hand": "hand", **{_opt_id(o): [o] for o in CANDIDATES},
                            **{f"random{s}": s for s in RANDOM_SEEDS}}


@dataclass(frozen=True)
class KnownBug:
  """A wrong result (or crash) kc gives today, with the smallest reproducer. On `fails_on` devices the matching
  tests run as strict xfails; on `crashes_on` devices they would take the whole process down, so they skip."""
  reason: str
  applies: Callable[[str, list[Opt]], bool]  # (case name, applied opts)
  fails_on: frozenset[str] = frozenset()
  crashes_on: frozenset[str] = frozenset()


PADTO_DIVIDES_BY_ZERO = (
  "core bug: PADTO on an elementwise axis also pads the divisor of an integer // or %, so the padded iterations "
  "divide by zero: C compilers may turn that into a trap (SIGILL), EMU reports DivisionByZeroError. Reproducer: "
  "x, y = A.arg(1, dtypes.int32, (9, 8)), A.arg(2, dtypes.int32, (9, 8)); "
  "k = kc.compile(A.sink(A.store(0, (x * y + x // y - x % y).maximum(x ^ y) | (x & 7))), device='CLANG', "
  "opts=[kc.Opt(kc.OptOps.PADTO, 0, 32)]); k(out, a, b) with b nonzero dies with SIGILL (the padded rows load y=0)")


def _pads(opts: list[Opt]) -> bool: return any(o.op is OptOps.PADTO for o in opts)


KNOWN_BUGS: list[KnownBug] = [
  KnownBug(PADTO_DIVIDES_BY_ZERO, lambda name, opts: name in ("i32_arith", "u8_arith", "i64_arith") and _pads(opts), fails_on=frozenset({"EMU"})),
  KnownBug(PADTO_DIVIDES_BY_ZERO, lambda name, opts: name == "i32_arith" and _pads(opts), crashes_on=frozenset({"CLANG"})),
]


def _mark_known_bugs(request, name: str, opts: list[Opt], device: str):
  for bug in KNOWN_BUGS:
    if not bug.applies(name, opts): continue
    if device in bug.crashes_on: pytest.skip(f"known crash: {bug.reason}")
    if device in bug.fails_on: request.applymarker(pytest.mark.xfail(strict=True, reason=bug.reason))


@pytest.mark.parametrize("spec", list(SPECS))
@pytest.mark.parametrize("name", list(CASES))
def test_kernel(device, name, spec, request):
  setup = setup_of(name)
  if lacking := missing_dtypes(setup, device): pytest.skip(f"{device} declares no support for {', '.join(lacking)}")
  opts = SPECS[spec]
  if isinstance(opts, int):
    opts = random_opts(setup, device, seed=opts)
    if not opts: pytest.skip(f"no candidate opt applies to {name} on {device}")
  elif isinstance(opts, list) and (why := refusal(setup, device, opts)) is not None:
    pytest.skip(f"not legal here: {why}")
  _mark_known_bugs(request, name, opts if isinstance(opts, list) else [], device)
  outs = execute(setup, device, opts)
  for i, want in setup.expected.items():
    assert_close(outs[i], want, setup.dtypes[i], CASES[name].kind, f"{name} on {device} with opts {opts}, output {i}")
