"""The conformance corpus on every available device, in this process, through the same functions `kc conformance`
runs (kc_conformance.target): every case under none/hand/each legal single opt/seeded random sequences/tensor cores,
numpy as the oracle, the same tolerance table. A wrong result here is a bug in kc or a backend.

`kc conformance` adds the render and compile tiers, the error contract, isolation and the report; CI runs it for
every device (.ci/run)."""
from __future__ import annotations
import pytest
from kc_conformance.target import Target
from kc_conformance.test_suite import CHECKS


_TARGETS: dict[str, Target] = {}  # one per device: its renderer (and the rule sets built for it) serves every check


@pytest.mark.parametrize("check", CHECKS)
def test_kernel(device, check, record_property):
  case, spec = check.split("/")
  target = _TARGETS.setdefault(device, Target(device, isolate=False))
  target.run_tier(case, spec, record_property)
