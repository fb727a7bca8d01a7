"""A fuzz run: N random kernels x the chosen opts modes on every chosen device, checked against numpy.

Each device gets its own worker process (and a thread here that feeds it), so devices run side by side and a crash
on one costs one case. Failures are then minimized, each within a shared time budget per device, and written out as
reproducers.
"""
from __future__ import annotations
import threading, time
from dataclasses import dataclass
from itertools import chain, zip_longest
from typing import Callable, Optional
from kc.runtime.device import Device
from kc.errors import ConfigError, KcError
from kc.tools.fuzz.check import FAILURES, Reference, Verdict, check, reference
from kc.tools.fuzz.families import FAMILIES, pick_family
from kc.tools.fuzz.generate import case_seed, generate
from kc.tools.fuzz.minimize import minimize, same_failure
from kc.tools.fuzz.recipe import Recipe
from kc.tools.fuzz.report import Result, write_reproducer
from kc.tools.fuzz.worker import DeviceWorker

MODES = ("none", "hand", "random")


@dataclass
class FuzzConfig:
  devices: tuple[str, ...]
  n: int = 100
  seed: int = 0
  modes: tuple[str, ...] = MODES
  timeout: float = 60.0               # seconds one case may take on a device before it counts as a hang
  out_dir: str = "kc-fuzz-failures"
  minimize_tries: int = 30            # candidate runs per failure
  minimize_seconds: float = 120.0     # per device, for all its failures together; later ones are written as found
  families: tuple[str, ...] = ()      # generate only kernels of these families (kc.tools.fuzz.families.FAMILIES); () is all

  def validate(self) -> "FuzzConfig":
    if not self.devices: raise ConfigError("kc fuzz needs at least one device")
    self.devices = tuple(dict.fromkeys(Device.spec(d).name for d in self.devices))
    for d in self.devices:
      if (why := Device.unavailable_reason(d)) is not None: raise ConfigError(f"device {d} cannot open here: {why}")
    bad = [m for m in self.modes if m not in MODES]
    if bad or not self.modes: raise ConfigError(f"unknown opts mode {', '.join(bad) or '(none given)'}: use some of {', '.join(MODES)}")
    if self.n < 0: raise ConfigError(f"--n must be >= 0, got {self.n}")
    if self.timeout <= 0: raise ConfigError(f"--timeout must be > 0, got {self.timeout}")
    if (bad := [f for f in self.families if f not in FAMILIES]):
      raise ConfigError(f"unknown fuzz family {', '.join(bad)}: use some of {', '.join(FAMILIES)}")
    return self


@dataclass
class _Case:
  index: int
  recipe: Recipe
  ref: Reference


def cases(seed: int, n: int, families: tuple[str, ...] = ()) -> list[_Case]:
  """The run's kernels with their numpy answers (deterministic in seed and families)."""
  out = []
  for i in range(n):
    cs = case_seed(seed, i)
    r = generate(cs, family=pick_family(cs, families) if families else None)
    if (ref := reference(r)) is None: raise KcError(f"the fuzz generator made an unsound case {i} of seed {seed}")
    out.append(_Case(i, r, ref))
  return out


def _device_run(cfg: FuzzConfig, device: str, todo: list[_Case], results: list[Result], log: Callable[[str], None]) -> None:
  failed: list[tuple[Result, _Case, Verdict]] = []
  with DeviceWorker(device, cfg.timeout) as w:
    for n, c in enumerate(todo, 1):
      for mode in cfg.modes:
        v = check(w, c.recipe, c.ref, mode, opt_seed=c.recipe.seed)
        res = Result(c.index, c.recipe.seed, device, mode, v.opts, v.outcome, v.message, v.stage, c.recipe.ops(), family=c.recipe.family)
        results.append(res)
        if v.outcome in FAILURES: failed.append((res, c, v))
      if n % 50 == 0 or n == len(todo): log(f"{device}: {n}/{len(todo)} cases, {len(failed)} failures")
    _write_failures(cfg, w, failed, log)


def _write_failures(cfg: FuzzConfig, w: DeviceWorker, failed: list, log: Callable[[str], None]) -> None:
  # one outcome after another, so that the budget reaches every kind of failure before it runs out
  by_outcome: dict[str, list] = {}
  for f in failed: by_outcome.setdefault(f[0].outcome, []).append(f)
  order = [f for f in chain.from_iterable(zip_longest(*by_outcome.values())) if f is not None]
  deadline = time.monotonic() + cfg.minimize_seconds
  done: dict[int, tuple[Recipe, Verdict]] = {}   # case -> a minimized recipe (reused for the case's other modes)
  for res, c, v in order:
    r, opts = c.recipe, v.opts
    if c.index in done and same_failure(done[c.index][1], v) and isinstance(opts, str):
      small = done[c.index][0]
      if (ref := reference(small)) is not None and same_failure(v, check(w, small, ref, opts, 0)): r = small
    elif time.monotonic() < deadline:
      r, opts = minimize(w, c.recipe, v, cfg.minimize_tries)
      done.setdefault(c.index, (r, v))
    ref = reference(r) or c.ref
    res.ops = r.ops()
    # random opts are drawn from the case's seed in the run, and from 0 in the checks of a smaller recipe
    res.reproducer = write_reproducer(cfg.out_dir, res, r, ref, opts, c.recipe.seed if r is c.recipe else 0)
  if failed: log(f"{w.device}: wrote {len(failed)} reproducers to {cfg.out_dir}")


def fuzz(cfg: FuzzConfig, log: Optional[Callable[[str], None]] = None) -> list[Result]:
  """Run the campaign; results are ordered by device, case and mode."""
  cfg.validate()
  log = log or (lambda s: None)
  todo = cases(cfg.seed, cfg.n, cfg.families)
  per_device: dict[str, list[Result]] = {d: [] for d in cfg.devices}
  errors: dict[str, BaseException] = {}

  def work(d: str):
    try: _device_run(cfg, d, todo, per_device[d], log)
    except BaseException as e:  # noqa: BLE001 (re-raised below, in the caller's thread)
      errors[d] = e
  threads = [threading.Thread(target=work, args=(d,), name=f"kc-fuzz-{d}") for d in cfg.devices]
  for t in threads: t.start()
  for t in threads: t.join()
  for e in errors.values(): raise e
  return [r for d in cfg.devices for r in per_device[d]]
