"""Shrinking a failing case while it keeps failing the same way: smaller shapes, fewer outputs, fewer ops, fewer opts.

Greedy and bounded: every candidate costs a compile and a run in the device's worker, so at most `tries` candidates
are run (a hang costs the whole timeout, so hangs get only a few).
"""
from __future__ import annotations
from dataclasses import replace
from kc.tools.fuzz.check import Verdict, check, reference
from kc.tools.fuzz.generate import generate
from kc.tools.fuzz.recipe import Recipe, evaluate, input_node, value_dtype
from kc.tools.fuzz.worker import DeviceWorker, OptsSpec

_HANG_TRIES = 3


def same_failure(a: Verdict, b: Verdict) -> bool:
  """b fails as a did: the same outcome, and for an internal or untyped error the same exception type."""
  return a.outcome == b.outcome and (a.outcome not in ("internal-error", "untyped-error") or a.etype == b.etype)


def as_input(r: Recipe, i: int, value) -> Recipe:
  """Node i replaced by a buffer that holds its numpy value: everything it was computed from drops out."""
  import numpy as np
  dt = value_dtype(value, r.nodes[i])
  node = input_node(dt, tuple(value.shape))
  nodes = r.nodes[:i] + (node,) + r.nodes[i + 1:]
  return replace(r, nodes=nodes, data={**r.data, i: np.ascontiguousarray(value).copy()})


class Minimizer:
  def __init__(self, worker: DeviceWorker, failure: Verdict, tries: int):
    self.worker, self.failure = worker, failure
    self.left = min(tries, _HANG_TRIES) if failure.outcome == "hang" else tries

  def fails(self, r: Recipe, opts: OptsSpec) -> bool:
    if self.left <= 0 or (ref := reference(r)) is None: return False
    self.left -= 1
    return same_failure(self.failure, check(self.worker, r, ref, opts, 0))

  def run(self, r: Recipe, opts: OptsSpec) -> tuple[Recipe, OptsSpec]:
    for size in (0.25, 0.5):   # the same seed at a smaller size: much the same kernel with smaller shapes
      if self.fails(cand := generate(r.seed, size, r.family), opts):
        r = cand
        break
    changed = True
    while changed and self.left > 0:
      changed = False
      for o in r.outputs if len(r.outputs) > 1 else ():
        if self.fails(cand := replace(r, outputs=tuple(x for x in r.outputs if x != o)), opts): r, changed = cand, True
      r, c1 = self._bypass(r, opts)
      r, c2 = self._collapse(r, opts)
      changed = changed or c1 or c2
      if isinstance(opts, list):
        for o in list(opts):
          if o in opts and self.fails(r, cand_opts := [x for x in opts if x != o]): opts, changed = cand_opts, True
    return r, opts

  def _bypass(self, r: Recipe, opts: OptsSpec) -> tuple[Recipe, bool]:
    """Drop ops: a node replaced by one of its operands of the same shape and dtype, nearest the outputs first."""
    changed = False
    values = evaluate(r)
    for i in reversed(r.live()):
      if i not in values: continue   # dropped by an earlier change in this pass
      for s in r.nodes[i].srcs:
        if values[s].shape == values[i].shape and values[s].dtype == values[i].dtype and self.fails(cand := r.rewire(i, s), opts):
          r, changed, values = cand, True, evaluate(cand)
          break
    return r, changed

  def _collapse(self, r: Recipe, opts: OptsSpec) -> tuple[Recipe, bool]:
    """Replace a subexpression by a buffer holding its value, largest subexpressions first."""
    changed = False
    values = evaluate(r)
    for i in reversed(r.live()):
      if i in values and r.nodes[i].op != "input" and i not in r.outputs and self.fails(cand := as_input(r, i, values[i]), opts):
        r, changed, values = cand, True, evaluate(cand)
    return r, changed


def minimize(worker: DeviceWorker, r: Recipe, failure: Verdict, tries: int = 30) -> tuple[Recipe, OptsSpec]:
  """The smallest variant of `r` (and of its opts) found that still fails as `failure` says."""
  return Minimizer(worker, failure, tries).run(r, failure.opts)
