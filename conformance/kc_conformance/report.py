"""The conformance report: one JSON document per run (validated against report.schema.json before it is written),
the same as an HTML page a person reads (a capability matrix and a table of failures).

Outcomes are kept apart: pass, fail, crash (the kernel ended the worker), error (the test could not be set up),
skip (with its reason's category: capability, not applicable, unavailable, expected), xfail, xpass."""
from __future__ import annotations
import html, json, math, os, platform
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Optional
from . import REPORT_SCHEMA_VERSION, SUITE_VERSION, TIERS

OUTCOMES = ("pass", "fail", "crash", "error", "skip", "xfail", "xpass")


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

  def to_json(self) -> dict:
    out = {"id": self.id, "nodeid": self.nodeid, "tier": self.tier, "outcome": self.outcome, "reason": self.reason,
           "duration": round(self.duration, 6), **self.extra}
    if self.link: out["link"] = self.link
    return out


def summarize(tests: list[TestRecord]) -> dict:
  counts = Counter(t.outcome for t in tests)
  by_tier: dict[str, dict[str, int]] = {}
  for t in tests: by_tier.setdefault(t.tier, Counter())[t.outcome] += 1
  return {"total": len(tests), "passed": counts["pass"], "failed": counts["fail"], "crashed": counts["crash"], "errors": counts["error"],
          "skipped": counts["skip"], "xfailed": counts["xfail"], "xpassed": counts["xpass"],
          "skipped_by_reason": dict(Counter(skip_category(t.reason) for t in tests if t.outcome == "skip")),
          "by_tier": {tier: dict(c) for tier, c in by_tier.items()}}


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
                  "device": device, "setup_error": setup_error, "expectations": expectations, "summary": summarize(tests),
                  "tests": [t.to_json() for t in tests]})


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
code{font-size:90%}"""


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
  out.append("<h2>Summary</h2><table><tr>" + "".join(f"<th>{k}</th>" for k in ("total", "passed", "failed", "crashed", "errors", "skipped", "xfailed", "xpassed")) + "</tr><tr>"
             + "".join(f"<td>{s[k]}</td>" for k in ("total", "passed", "failed", "crashed", "errors", "skipped", "xfailed", "xpassed")) + "</tr></table>")
  out.append("<p>skipped by reason: " + (", ".join(f"{_e(k)} {v}" for k, v in sorted(s["skipped_by_reason"].items())) or "none") + "</p>")
  out.append("<table><tr><th>tier</th>" + "".join(f"<th>{o}</th>" for o in OUTCOMES) + "</tr>")
  for tier in TIERS + ("setup",):
    if tier in s["by_tier"]: out.append(f"<tr><td>{tier}</td>" + "".join(f"<td>{s['by_tier'][tier].get(o, 0)}</td>" for o in OUTCOMES) + "</tr>")
  out.append("</table><h2>Capability matrix</h2><table><tr><th>capability</th><th>device</th><th>tests skipped for it</th></tr>")
  out += _capability_rows(doc)
  caps = dev.get("capabilities") or {}
  out.append("</table><p>" + ", ".join(f"{k} <code>{_e(caps.get(k))}</code>" for k in ("global_max", "local_max", "shared_max")) + "</p>")
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
    out += [f"<tr><td><code>{_e(t['id'])}</code></td><td>{_e(t['reason'])}</td><td><a href='{_e(t.get('link'))}'>{_e(t.get('link'))}</a></td></tr>" for t in xf]
    out.append("</table>")
  out.append("</body></html>\n")
  return "\n".join(out)
