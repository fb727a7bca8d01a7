"""The conformance tests. Collected by `pytest --pyargs kc_conformance`; the parameters are the static corpus (no
device is touched to list them). Test ids are TIER/CASE/SPEC, and render/opt_errors/CASE for the error contract."""
from __future__ import annotations
import pytest
from .case import FULL
from .corpus import CASES
from .specs import specs_for

CHECKS = [f"{c.name}/{s.name}" for c in CASES.values() for s in specs_for(c)]
# the error contract is checked on the kernels that are about optimizations
CONTRACT = [c.name for c in CASES.values() if c.specs == FULL]
ALL_IDS = [f"{tier}/{check}" for tier in ("render", "compile", "run") for check in CHECKS] + [f"render/opt_errors/{c}" for c in CONTRACT]


def _split(check: str) -> tuple[str, str]:
  case, spec = check.split("/")
  return case, spec


@pytest.mark.kc_tier("render")
@pytest.mark.parametrize("check", CHECKS)
def test_render(kc_target, check, kc_record):
  kc_target.render_tier(*_split(check), kc_record)


@pytest.mark.kc_tier("compile")
@pytest.mark.parametrize("check", CHECKS)
def test_compile(kc_target, check, kc_record):
  kc_target.compile_tier(*_split(check), kc_record)


@pytest.mark.kc_tier("run")
@pytest.mark.parametrize("check", CHECKS)
def test_run(kc_target, check, kc_record):
  kc_target.run_tier(*_split(check), kc_record)


@pytest.mark.kc_tier("render")
@pytest.mark.parametrize("check", [f"opt_errors/{c}" for c in CONTRACT])
def test_opt_errors(kc_target, check, kc_record):
  kc_target.opt_errors(check.split("/")[1], kc_record)
