"""How close a fuzzed kernel's output must be to numpy's.

The per-op bounds come from the one tolerance table (kc.testing.tolerance, which the conformance suite and BEAM's
check use too), and outputs are judged by the one comparison (kc.testing.compare: NaN matches only NaN and an inf only
the same inf, whatever the bound). A fuzzed output is a chain of ops, so its bound grows with the chain: it uses the
least precise float type and the loosest op class in the chain, an absolute term scaled by the largest float
magnitude met on the way (cancellation in a sum loses digits of its inputs, not of its result), and a factor for the
number of inexact steps. Exact values (integers, bools, and floats that stay small integers) must match bit for bit.
"""
from __future__ import annotations
import numpy as np
from kc.ir.dtype import dtypes
from kc.testing.tolerance import EXACT, Tolerance, tolerance
from kc.tools.fuzz.recipe import Recipe, exact_nodes, value_dtype

_ORDER = ("arith", "reduce", "transcendental")   # loosest last
FLOATS = ("float32", "float16", "bfloat16", "fp8e4m3", "fp8e5m2")   # most precise first


def chain_bound(dt: str, kind: str, steps: int, scale: float) -> Tolerance:
  """The bound of a chain of `steps` inexact ops in the float type `dt`, the loosest of `kind`, over values of
  magnitude up to `scale`: one op's bound from the table, a ulp bound as an rtol (one step's error passes on to the
  next relative to the values it meets), times the steps, its absolute term scaled."""
  base = tolerance(getattr(dtypes, dt), kind)
  rtol = max(base.rtol, (base.ulp or 0) * 2.0 ** -dtypes.finfo(getattr(dtypes, dt))[1])
  return Tolerance(rtol=rtol * steps, atol=base.atol * scale * steps)


def finite_max(v: np.ndarray) -> float:
  """The largest finite magnitude in `v` (0 for none)."""
  w = np.abs(v.astype(np.float64))
  return float(w[np.isfinite(w)].max(initial=0.0))


def output_bound(r: Recipe, values: dict[int, np.ndarray], out: int) -> Tolerance:
  """The bound for output node `out` given every live node's numpy value."""
  exact = exact_nodes(r, values)
  seen, stack, inexact = set(), [out], []
  while stack:
    i = stack.pop()
    if i in seen: continue
    seen.add(i)
    stack.extend(r.nodes[i].srcs)
    if i not in exact and values[i].dtype.kind == "f": inexact.append(i)
  if not inexact: return EXACT
  dt = max((value_dtype(values[i], r.nodes[i]) for i in inexact), key=lambda d: FLOATS.index(d) if d in FLOATS else 0)
  if dt not in FLOATS: dt = "float32"
  kind = max((r.nodes[i].kind for i in inexact), key=_ORDER.index)
  scale = max([1.0] + [finite_max(values[i]) for i in seen if values[i].dtype.kind == "f" and values[i].size])
  return chain_bound(dt, kind, len(inexact), scale)
