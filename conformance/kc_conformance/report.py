"""The conformance report: one JSON document per run (validated against report.schema.json before it is written),
the same as an HTML page a person reads (a capability matrix and a table of failures).

Failures are also grouped by cause (the same exception type and the same message once numbers are taken out), so a
backend author sees "one bug, 40 tests" rather than 40 rows: each group has its count, its test ids, and one
failing case in full (kernel source, mismatching elements, errors against the tolerance, the command that reruns it).

Outcomes are kept apart: pass, fail, crash (the kernel ended the worker), error (the test could not be set up),
skip (with its reason's category: capability, not applicable, unavailable, expected), xfail, xpass."""
from __future__ import annotations
import html, json, math, os, platform, re, shlex
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Optional
from . import REPORT_SCHEMA_VERSION, SUITE_VERSION, TIERS

OUTCOMES = ("pass", "fail", "crash", "error", "skip", "xfail", "xpass")
FAILED = ("fail", "crash", "error")


def schema() -> dict:
  return json.loads(resources.files(__package__).joinpath("report.schema.json").read_text())


def skip_category(reason: Optional[str]) -> str:
  """capability / not applicable / unavailable / expected (an expectation file's skip) / other."""
  head = (reason or "").split(":", 1)[0].strip()
  return head if head in ("capability", "not applicable", "unavailable", "expected") else "other"


@dataclass
class TestRecord:
  id: str
  nodeid: str
  tier: str
  outcome: str = "pass"
  reason: Optional[str] = None
  duration: float = 0.0
  link: Optional[str] = None
  extra: dict = field(default_factory=dict)
  cause: Optional[tuple[str, str]] = None  # (type, message) as the test stated it, for grouping
  source: Optional[str] = None             # the kernel source of a failing test (only in its group's example)

  def to_json(self) -> dict:
    out = {"id": self.id, "nodeid": self.nodeid, "tier": self.tier, "outcome": self.outcome, "reason": self.reason,
           "duration": round(self.duration, 6), **self.extra}
    if self.link: out["link"] = self.link
    if self.outcome in FAILED: out["cause"] = cause_of(self)[0]
    return out


_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|inf|nan)(?![\w])")
_TYPE_PREFIX = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Crash|Failed))\s*:\s*(.*)$", re.S)


def normalize(message: str) -> str:
  """The first line of `message` with every number replaced by N: what stays the same across the tests one bug fails."""
  first = (message or "").strip().splitlines()[0] if (message or "").strip() else ""
  return _NUMBER.sub("N", first).strip()


def cause_of(t: TestRecord) -> tuple[str, str]:
  """(type, normalized message) of a failed test: the cause the test recorded, else read off its reason."""
  if t.cause is not None: return t.cause[0], normalize(t.cause[1])
  reason = t.reason or ""
  if (m := _TYPE_PREFIX.match(reason.strip())) is not None: return m.group(1).rsplit(".", 1)[-1], normalize(m.group(2))
  return {"crash": "Crash", "error": "SetupError"}.get(t.outcome, "Failure"), normalize(reason)


def rerun_command(t: TestRecord, device: Optional[str], expectations: Optional[str]) -> str:
  """The one command that runs test `t` again on `device`."""
  name = t.nodeid.split("::")[-1]
  parts = ["kc", "conformance", "--device", device or "DEVICE"]
  if expectations: parts += ["--expect", expectations]
  # a setup problem (an unknown device, a bad expectation file) is not a test to select: the whole run shows it again
  return " ".join(shlex.quote(p) for p in parts + ([] if t.tier == "setup" else ["-k", name]))


def failure_groups(tests: list[TestRecord], device: Optional[str], expectations: Optional[str] = None) -> list[dict]:
  """The failed, crashed and errored tests grouped by cause, biggest group first; each with one example in full."""
  groups: dict[tuple[str, str], list[TestRecord]] = {}
  for t in tests:
    if t.outcome in FAILED: groups.setdefault(cause_of(t), []).append(t)
  out = []
  for (kind, message), members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
    # the example: a test that kept its source when one did, so the author sees the kernel
    ex = next((t for t in members if t.source), members[0])
    example = {"id": ex.id, "nodeid": ex.nodeid, "outcome": ex.outcome, "reason": ex.reason, "source": ex.source,
               "errors": [e for e in ex.extra.get("errors", []) if not e.get("ok", True)], "mismatches": ex.extra.get("mismatches", []),
               "command": rerun_command(ex, device, expectations)}
    out.append({"cause": kind, "message": message, "count": len(members), "outcomes": dict(Counter(t.outcome for t in members)),
                "tests": [t.id for t in members], "example": example})
  return out


def summarize(tests: list[TestRecord]) -> dict:
  counts = Counter(t.outcome for t in tests)
  by_tier: dict[str, dict[str, int]] = {}
  for t in tests: by_tier.setdefault(t.tier, Counter())[t.outcome] += 1
  return {"total": len(tests), "passed": counts["pass"], "failed": counts["fail"], "crashed": counts["crash"], "errors": counts["error"],
          "skipped": counts["skip"], "xfailed": counts["xfail"], "xpassed": counts["xpass"],
          "skipped_by_reason": dict(Counter(skip_category(t.reason) for t in tests if t.outcome == "skip")),
          "by_tier": {tier: dict(c) for tier, c in by_tier.items()}}


NOT_APPLICABLE = ("capability", "not applicable")  # skips that say the case does not apply to the device


def _device_skip(t: TestRecord) -> bool:
  """A skip that leaves the device uncertified for this test: the case applies, but the tier did not run (the device
  cannot open here, an expectation file skips it, ...)."""
  return t.outcome == "skip" and skip_category(t.reason) not in NOT_APPLICABLE


def _why(skips: list[TestRecord]) -> str:
  """The most common reason of these skips, without its tier-specific tail (what comes after the first ';')."""
  return Counter((t.reason or "no reason given").split(";")[0].strip() for t in skips).most_common(1)[0][0]


def _listed(names: list[str]) -> str:
  return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def coverage_line(tests: list[TestRecord], tiers: list[str]) -> str:
  """Which of the selected tiers ran, for the summary: a run whose compile and run tests were all skipped (a device
  that cannot open here) certifies nothing beyond rendering, and says so rather than passing quietly."""
  ran, skipped = [], []
  for tier in tiers:
    mine = [t for t in tests if t.tier == tier]
    if any(t.outcome != "skip" for t in mine): ran.append(tier)
    if (skips := [t for t in mine if _device_skip(t)]): skipped.append((tier, skips, len(mine)))
  if not ran: return f"certified: nothing; no test ran{' (' + _why(skipped[0][1]) + ')' if skipped else ''}"
  line = f"certified: {_listed(ran)} tier{'s' if len(ran) > 1 else ''}" + (" only" if len(ran) < len(tiers) else "")
  never = [tier for tier, _, _ in skipped if tier not in ran]
  if never:
    why = _why([t for tier, skips, _ in skipped if tier in never for t in skips])
    were = "tiers were" if len(never) > 1 else "tier was"
    line += f"; the {_listed(never)} {were} skipped because {why.removeprefix('unavailable: ')}"
  for tier, skips, total in skipped:
    if tier in ran: line += f"; {len(skips)} of {total} {tier} tests were skipped ({_why(skips)})"
  return line


def unmet_requirement(tests: list[TestRecord], tier: str) -> list[tuple[str, str]]:
  """(test id, why) for each selected case whose `tier` test did not run: it was not selected, or it was skipped for a
  reason other than the case not applying to the device. The cases are the CASE/SPEC checks of any selected test."""
  by_id = {t.id: t for t in tests}
  cases = [t for t in tests if t.tier in TIERS and not t.id.startswith("render/opt_errors/")]
  checks = dict.fromkeys(t.id.split("/", 1)[1] for t in cases)
  unmet = []
  for check in checks:
    t = by_id.get(want := f"{tier}/{check}")
    if t is None: unmet.append((want, "not selected"))
    elif _device_skip(t): unmet.append((want, t.reason or "skipped"))
  return unmet


def _finite(x: Any) -> Any:
  """JSON has no inf or NaN: such errors are written as strings."""
  if isinstance(x, float) and not math.isfinite(x): return str(x)
  if isinstance(x, dict): return {k: _finite(v) for k, v in x.items()}
  if isinstance(x, list): return [_finite(v) for v in x]
  return x


def build(*, device: dict, tests: list[TestRecord], tiers: list[str], seed: int, started: str, finished: str,
          setup_error: Optional[str], expectations: Optional[str], kc_version: str) -> dict:
  return _finite({"schema_version": REPORT_SCHEMA_VERSION, "suite_version": SUITE_VERSION, "kc_version": kc_version,
                  "python": platform.python_version(), "started": started, "finished": finished, "tiers": tiers, "seed": seed,
                  "device": device, "setup_error": setup_error, "expectations": expectations,
                  "summary": {**summarize(tests), "certified": coverage_line(tests, tiers)},
                  "failure_groups": failure_groups(tests, device.get("name"), expectations),
                  "tests": [t.to_json() for t in tests]})


def summary_lines(groups: list[dict], limit: int = 10) -> list[str]:
  """The failure groups for the end of a terminal run: count, cause, and how to rerun one."""
  lines = []
  for g in groups[:limit]:
    lines.append(f"{g['count']:5d} x {g['cause']}: {g['message']}")
    lines.append(f"        e.g. {g['example']['id']}: {g['example']['command']}")
  if len(groups) > limit: lines.append(f"        ... and {len(groups) - limit} more causes (see the report)")
  return lines


def validate(doc: dict) -> None:
  """Raise jsonschema.ValidationError when `doc` breaks the schema (a bug in the suite, never in the backend)."""
  import jsonschema
  jsonschema.validate(doc, schema())


def write(doc: dict, path: str) -> None:
  """Write the report as JSON or HTML, chosen by the file's extension."""
  validate(doc)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  text = to_html(doc) if path.lower().endswith((".html", ".htm")) else json.dumps(doc, indent=1) + "\n"
  with open(path, "w") as f: f.write(text)


# ***** HTML *****

_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}th{background:#f3f3f3}
.yes{background:#e6f4e6}.no{background:#f8e8e8}.fail,.crash,.error{color:#a00;font-weight:bold}.pass{color:#070}
code{font-size:90%}pre{background:#f6f6f6;padding:.5em;overflow:auto}"""


def _e(x: Any) -> str: return html.escape("" if x is None else str(x))


def _capability_rows(doc: dict) -> list[str]:
  caps = doc["device"].get("capabilities")
  if not caps: return ["<tr><td colspan=3>unknown: the renderer could not be made</td></tr>"]
  skipped_for = Counter()
  for t in doc["tests"]:
    if t["outcome"] == "skip" and (t["reason"] or "").startswith("capability:"):
      for need in t["reason"].split(":", 1)[1].split(", which")[0].replace("needs", "").split(","): skipped_for[need.strip()] += 1
  from kc import dtypes
  rows = []
  for flag in ("locals", "shared", "float4", "images"):
    rows.append((flag, caps[flag], skipped_for[flag]))
  for dt in dtypes.all: rows.append((f"dtype:{dt.name}", dt.name in caps["dtypes"], skipped_for[f"dtype:{dt.name}"]))
  for tc in caps["tensor_cores"]: rows.append((f"tensor_cores:{tc}", True, 0))
  tc_skips = {k: v for k, v in skipped_for.items() if k.startswith("tensor_cores:") and k.split(":", 1)[1] not in caps["tensor_cores"]}
  rows += [(k, False, v) for k, v in sorted(tc_skips.items())]
  return [f"<tr><td>{_e(name)}</td><td class={'yes' if ok else 'no'}>{'declared' if ok else 'not declared'}</td><td>{n}</td></tr>"
          for name, ok, n in rows]


def _group_html(groups: list[dict]) -> list[str]:
  out = [f"<h2>Failures by cause ({len(groups)})</h2>"]
  if not groups: return out + ["<p class=pass>none</p>"]
  for n, g in enumerate(groups):
    ex = g["example"]
    out.append(f"<h3 id=cause-{n}>{g['count']} &times; <span class=fail>{_e(g['cause'])}</span>: <code>{_e(g['message'])}</code></h3>")
    out.append(f"<details><summary>{g['count']} tests</summary><p>" + ", ".join(f"<code>{_e(t)}</code>" for t in g["tests"]) + "</p></details>")
    out.append(f"<p>example <code>{_e(ex['id'])}</code> ({ex['outcome']}): {_e(ex['reason'])}</p>")
    out.append(f"<p>rerun: <code>{_e(ex['command'])}</code></p>")
    if ex["errors"]:
      out.append("<table><tr><th>output</th><th>dtype</th><th>mismatches</th><th>max abs error</th><th>max rel error</th><th>tolerance</th></tr>")
      out += [f"<tr><td>{c['output']}</td><td>{_e(c['dtype'])}</td><td>{c['mismatches']} of {c['elements']}</td><td>{_e(c['max_abs'])}</td>"
              f"<td>{_e(c['max_rel'])}</td><td>{_e(c['tolerance'])}</td></tr>" for c in ex["errors"]]
      out.append("</table>")
    if ex["mismatches"]:
      out.append("<table><tr><th>output</th><th>index</th><th>expected</th><th>actual</th></tr>")
      out += [f"<tr><td>{m['output']}</td><td>{_e(tuple(m['index']))}</td><td>{_e(m['expected'])}</td><td>{_e(m['actual'])}</td></tr>"
              for m in ex["mismatches"]]
      out.append("</table>")
    if ex["source"]: out.append(f"<details><summary>kernel source</summary><pre>{_e(ex['source'])}</pre></details>")
  return out


def to_html(doc: dict) -> str:
  dev, s = doc["device"], doc["summary"]
  bad = [t for t in doc["tests"] if t["outcome"] in ("fail", "crash", "error", "xpass")]
  out = ["<!doctype html><html><head><meta charset=utf-8>", f"<title>kc conformance: {_e(dev.get('name'))}</title>",
         f"<style>{_STYLE}</style></head><body>",
         f"<h1>kc conformance: {_e(dev.get('name'))}</h1>",
         f"<p>suite {_e(doc['suite_version'])}, kc {_e(doc['kc_version'])}, plugin {_e(dev.get('distribution'))} {_e(dev.get('version'))}, "
         f"arch <code>{_e(dev.get('arch'))}</code>{', impersonating ' + _e(dev['impersonates']) if dev.get('impersonates') else ''}; "
         f"tiers {', '.join(doc['tiers'])}; {_e(doc['started'])} to {_e(doc['finished'])}</p>"]
  if doc["setup_error"]: out.append(f"<p class=error>setup failed: {_e(doc['setup_error'])}</p>")
  totals = ("total", "passed", "failed", "crashed", "errors", "skipped", "xfailed", "xpassed")
  out.append("<h2>Summary</h2><table><tr>" + "".join(f"<th>{k}</th>" for k in totals) + "</tr><tr>"
             + "".join(f"<td>{s[k]}</td>" for k in totals) + "</tr></table>")
  if s.get("certified"): out.append(f"<p>{_e(s['certified'])}</p>")
  out.append("<p>skipped by reason: " + (", ".join(f"{_e(k)} {v}" for k, v in sorted(s["skipped_by_reason"].items())) or "none") + "</p>")
  out.append("<table><tr><th>tier</th>" + "".join(f"<th>{o}</th>" for o in OUTCOMES) + "</tr>")
  for tier in TIERS + ("setup",):
    if tier in s["by_tier"]: out.append(f"<tr><td>{tier}</td>" + "".join(f"<td>{s['by_tier'][tier].get(o, 0)}</td>" for o in OUTCOMES) + "</tr>")
  out.append("</table><h2>Capability matrix</h2><table><tr><th>capability</th><th>device</th><th>tests skipped for it</th></tr>")
  out += _capability_rows(doc)
  caps = dev.get("capabilities") or {}
  out.append("</table><p>" + ", ".join(f"{k} <code>{_e(caps.get(k))}</code>" for k in ("global_max", "local_max", "shared_max")) + "</p>")
  out += _group_html(doc.get("failure_groups", []))
  out.append(f"<h2>Failures ({len(bad)})</h2>")
  if bad:
    out.append("<table><tr><th>test</th><th>tier</th><th>outcome</th><th>reason</th><th>max abs / rel error</th></tr>")
    for t in bad:
      errs = "<br>".join(f"out {c['output']}: {_e(c['max_abs'])} / {_e(c['max_rel'])} ({_e(c['tolerance'])})" for c in t.get("errors", []))
      out.append(f"<tr><td><code>{_e(t['id'])}</code></td><td>{t['tier']}</td><td class={t['outcome']}>{t['outcome']}</td>"
                 f"<td>{_e(t['reason'])}</td><td>{errs}</td></tr>")
    out.append("</table>")
  else: out.append("<p class=pass>none</p>")
  xf = [t for t in doc["tests"] if t["outcome"] == "xfail"]
  if xf:
    out.append(f"<h2>Expected failures ({len(xf)})</h2><table><tr><th>test</th><th>reason</th><th>link</th></tr>")
    out += [f"<tr><td><code>{_e(t['id'])}</code></td><td>{_e(t['reason'])}</td>"
            f"<td><a href='{_e(t.get('link'))}'>{_e(t.get('link'))}</a></td></tr>" for t in xf]
    out.append("</table>")
  out.append("</body></html>\n")
  return "\n".join(out)
