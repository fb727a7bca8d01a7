"""Every case on every available device, under no opts, the hand-coded opts, each legal single opt from the
candidate list, and a few seeded random legal sequences; numpy is the oracle (tolerances in tolerance.py).

A wrong result here is a bug in kc (or the backend), never something to tolerate."""
from __future__ import annotations
import pytest
from kc import Opt, OptOps
from .cases import CASES, setup_of
from .harness import CANDIDATES, RANDOM_SEEDS, execute, missing_dtypes, random_opts, refusal
from .tolerance import assert_close


def _opt_id(o: Opt) -> str: return f"{o.op.name}-{o.axis}-{o.amt}" if o.axis is not None else o.op.name


SPECS: dict[str, object] = {"none": "none", "hand": "hand", **{_opt_id(o): [o] for o in CANDIDATES},
                            **{f"random{s}": s for s in RANDOM_SEEDS},
                            # a tensor core at each level (KC_TC), where the device has one that fits the kernel
                            **{f"tc{level}": ("tc", level) for level in (1, 2, 3)}}


@pytest.mark.parametrize("spec", list(SPECS))
@pytest.mark.parametrize("name", list(CASES))
def test_kernel(device, name, spec, monkeypatch):
  setup = setup_of(name)
  if lacking := missing_dtypes(setup, device): pytest.skip(f"{device} declares no support for {', '.join(lacking)}")
  opts = SPECS[spec]
  if isinstance(opts, tuple):
    monkeypatch.setenv("KC_TC", str(opts[1]))
    opts = [Opt(OptOps.TC, 0, 2)]
    if (why := refusal(setup, device, opts)) is not None: pytest.skip(f"no tensor core here: {why}")
  elif isinstance(opts, int):
    opts = random_opts(setup, device, seed=opts)
    if not opts: pytest.skip(f"no candidate opt applies to {name} on {device}")
  elif isinstance(opts, list) and (why := refusal(setup, device, opts)) is not None:
    pytest.skip(f"not legal here: {why}")
  outs = execute(setup, device, opts)
  for i, want in setup.expected.items():
    assert_close(outs[i], want, setup.dtypes[i], CASES[name].kind, f"{name} on {device} with opts {opts}, output {i}")
