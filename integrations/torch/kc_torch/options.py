"""The backend's options: torch.compile(model, backend="kc", options={...})."""
from __future__ import annotations
from dataclasses import dataclass, fields
from typing import Any, Optional
import kc


@dataclass(frozen=True)
class Options:
  device: Optional[str] = None   # a kc device name; None: kc.Device.DEFAULT (CLANG where kc-clang is installed)
  opts: str = "hand"             # "hand" (kc's heuristics), "beam" (BEAM search, cached), "none"
  report: bool = False           # print each fallback (op and reason) to stderr as a graph is compiled

  @classmethod
  def parse(cls, options: Optional[dict[str, Any]]) -> "Options":
    options = dict(options or {})
    names = {f.name for f in fields(cls)}
    if unknown := sorted(set(options) - names):
      raise kc.ConfigError(f"kc_torch: unknown option(s) {unknown}; the options are {sorted(names)}")
    out = cls(**options)
    if out.opts not in ("hand", "beam", "none"):
      raise kc.ConfigError(f"kc_torch: opts is 'hand', 'beam' or 'none', got {out.opts!r}")
    if out.device is not None and not isinstance(out.device, str):
      raise kc.ConfigError(f"kc_torch: device is a kc device name such as 'CLANG', got {out.device!r}")
    if not isinstance(out.report, bool): raise kc.ConfigError(f"kc_torch: report is True or False, got {out.report!r}")
    return out

  @property
  def device_name(self) -> str:
    return self.device or kc.Device.DEFAULT
