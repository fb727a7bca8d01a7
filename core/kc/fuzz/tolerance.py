"""How close a fuzzed kernel's output must be to numpy's.

The per-op bounds come from the core's one tolerance table (kc.testing.tolerance, which the conformance suite uses too),
for the float types the fuzzer generates. A fuzzed output is a chain of ops, so its bound
grows with the chain: it uses the least precise float type and the loosest op class in the chain, an absolute term
scaled by the largest float magnitude met on the way (cancellation in a sum loses digits of its inputs, not of its
result), and a factor for the number of inexact steps. Exact values (integers, bools, and floats that stay small
integers) must match bit for bit. NaN matches only NaN and an inf only the same inf, whatever the bound: a bound
relative to an infinite answer would let anything pass.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Optional
import numpy as np
from kc.ir.dtype import dtypes
from kc.testing.tolerance import TABLE as CORE_TABLE
from kc.fuzz.recipe import Recipe, exact_nodes, value_dtype

_ORDER = ("arith", "reduce", "transcendental")   # loosest last


@dataclass(frozen=True)
class Bound:
  """|got - want| <= atol + rtol * |want|, elementwise; (0, 0) is bit-exact."""
  rtol: float = 0.0
  atol: float = 0.0
  ulp: Optional[float] = None

  @property
  def exact(self) -> bool: return self.rtol == 0 and self.atol == 0 and self.ulp is None


FLOATS = ("float32", "float16", "bfloat16", "fp8e4m3", "fp8e5m2")   # most precise first
# dtype name -> kind -> the core table's bound for one op of that kind, for the float types the fuzzer generates
TABLE: dict[str, dict[str, Bound]] = {name: {kind: Bound(t.rtol, t.atol, t.ulp) for kind, t in CORE_TABLE[getattr(dtypes, name)].items()}
                                      for name in FLOATS}
# one ulp at 1.0: 2^-mantissa bits
_EPS = {name: 2.0 ** -dtypes.finfo(getattr(dtypes, name))[1] for name in FLOATS}


def one_rounding(dt: str, scale: float = 1.0) -> Bound:
  """The bound of a result rounded once to `dt` from a float32 computation (the core table's arith bound), its
  absolute term scaled by the magnitude of what was added up."""
  base = TABLE[dt]["arith"]
  return Bound(rtol=max(base.rtol, (base.ulp or 0) * _EPS[dt]), atol=base.atol * max(1.0, scale))


def finite_max(v: np.ndarray) -> float:
  """The largest finite magnitude in `v` (0 for none)."""
  w = np.abs(v.astype(np.float64))
  return float(w[np.isfinite(w)].max(initial=0.0))


def output_bound(r: Recipe, values: dict[int, np.ndarray], out: int) -> Bound:
  """The bound for output node `out` given every live node's numpy value."""
  exact = exact_nodes(r, values)
  seen, stack, inexact = set(), [out], []
  while stack:
    i = stack.pop()
    if i in seen: continue
    seen.add(i)
    stack.extend(r.nodes[i].srcs)
    if i not in exact and values[i].dtype.kind == "f": inexact.append(i)
  if not inexact: return Bound()
  dt = max((value_dtype(values[i], r.nodes[i]) for i in inexact), key=lambda d: FLOATS.index(d) if d in FLOATS else 0)
  if dt not in TABLE: dt = "float32"
  kind = max((r.nodes[i].kind for i in inexact), key=_ORDER.index)
  base = TABLE[dt][kind]
  steps = len(inexact)
  scale = max([1.0] + [finite_max(values[i]) for i in seen if values[i].dtype.kind == "f" and values[i].size])
  # a ulp bound is an rtol of ulp * eps; one step's error passes on to the next relative to the values it meets
  rtol = max(base.rtol, (base.ulp or 0) * _EPS[dt])
  return Bound(rtol=rtol * steps, atol=base.atol * scale * steps)


@dataclass
class Mismatch:
  """What differs in one output: how many elements, the worst one, and the bound."""
  output: int
  count: int
  size: int
  max_abs: float
  where: tuple
  got: object
  want: object
  bound: Bound

  def describe(self) -> str:
    b = "exact" if self.bound.exact else f"rtol {self.bound.rtol:.2g} atol {self.bound.atol:.2g}"
    return (f"output {self.output}: {self.count} of {self.size} elements differ ({b}); worst at {self.where}: "
            f"kc {self.got!r}, numpy {self.want!r} (|diff| {self.max_abs:.3g})")


def compare(output: int, got: np.ndarray, want: np.ndarray, bound: Bound) -> Optional[Mismatch]:
  """None when `got` matches `want` within `bound`. NaN matches NaN, an inf only the same inf, and a number within the
  bound only a number (-0.0 equals 0.0, as numpy's == says)."""
  if got.shape != want.shape or got.dtype != want.dtype:
    return Mismatch(output, want.size, want.size, float("inf"), (), f"{got.dtype}{got.shape}", f"{want.dtype}{want.shape}", bound)
  if want.dtype.kind in "biu":
    bad = got != want
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
  else:
    g, w = got.astype(np.float64), want.astype(np.float64)
    with np.errstate(all="ignore"):
      diff = np.abs(g - w)
      same = (np.isnan(g) & np.isnan(w)) | (g == w)
      bad = ~same & ~(np.isfinite(g) & np.isfinite(w) & (diff <= bound.atol + bound.rtol * np.abs(w)))
    diff = np.where(same, 0.0, np.where(np.isnan(diff), np.inf, diff))
  if not bad.any(): return None
  worst = np.unravel_index(int(np.argmax(np.where(bad, diff, -1.0))), want.shape)
  return Mismatch(output, int(bad.sum()), int(want.size), float(diff[worst]), tuple(int(i) for i in worst),
                  got[worst].item(), want[worst].item(), bound)
