"""Expectation files: a backend's known failures, shipped with its plugin and passed with --kc-expect FILE.

JSON: {"kc_conformance_expectations": 1, "entries": [{"test": "run/add_f32/*", "outcome": "xfail",
"reason": "...", "link": "https://...", "arch": "regex"}]}. `test` is a glob over test ids (TIER/CASE/SPEC, or
render/opt_errors/CASE); `outcome` is xfail (the test runs; failing is expected) or skip (it does not run: for a
kernel that hangs the device); `reason` and `link` are required, so that every expected failure says why and where
it is tracked; `arch`, optional, is a regular expression the device's arch must match for the entry to apply.

An entry that matches no test of the suite is an error: a typo or a renamed test would otherwise silently stop
expecting anything."""
from __future__ import annotations
import fnmatch, json, re
from dataclasses import dataclass
from typing import Optional
from kc import KcError

FORMAT_VERSION = 1
OUTCOMES = ("xfail", "skip")


class ExpectationError(KcError):
  """An expectation file that cannot be read, or an entry that is malformed."""


@dataclass(frozen=True)
class Expectation:
  test: str
  outcome: str
  reason: str
  link: str
  arch: Optional[str] = None

  def matches(self, test_id: str) -> bool: return fnmatch.fnmatchcase(test_id, self.test)

  def applies_to(self, arch: str) -> bool: return self.arch is None or re.search(self.arch, arch or "") is not None


def load(path: str) -> list[Expectation]:
  try:
    with open(path) as f: data = json.load(f)
  except (OSError, json.JSONDecodeError) as e: raise ExpectationError(f"cannot read the expectation file {path}: {e}") from None
  if not isinstance(data, dict) or data.get("kc_conformance_expectations") != FORMAT_VERSION:
    raise ExpectationError(f"{path} is not a kc-conformance expectation file: it needs \"kc_conformance_expectations\": {FORMAT_VERSION}")
  out = []
  for i, e in enumerate(data.get("entries", [])):
    where = f"{path}, entry {i}"
    if not isinstance(e, dict): raise ExpectationError(f"{where}: an entry is an object, got {e!r}")
    unknown = set(e) - {"test", "outcome", "reason", "link", "arch"}
    if unknown: raise ExpectationError(f"{where}: unknown keys {sorted(unknown)}")
    for key in ("test", "reason", "link"):
      if not isinstance(e.get(key), str) or not e[key].strip(): raise ExpectationError(f"{where}: {key!r} is required (a non-empty string)")
    outcome = e.get("outcome", "xfail")
    if outcome not in OUTCOMES: raise ExpectationError(f"{where}: outcome {outcome!r} is not one of {OUTCOMES}")
    if (arch := e.get("arch")) is not None:
      try: re.compile(arch)
      except (re.error, TypeError) as err: raise ExpectationError(f"{where}: arch {arch!r} is not a regular expression: {err}") from None
    out.append(Expectation(e["test"], outcome, e["reason"], e["link"], arch))
  return out


def unmatched(entries: list[Expectation], test_ids: list[str]) -> list[Expectation]:
  """Entries whose pattern matches none of `test_ids` (every test the suite defines, whatever is selected)."""
  return [e for e in entries if not any(e.matches(t) for t in test_ids)]


def first_match(entries: list[Expectation], test_id: str, arch: str) -> Optional[Expectation]:
  return next((e for e in entries if e.matches(test_id) and e.applies_to(arch)), None)
