"""A fuzz case's kernel as plain data: a list of nodes, each one step written twice, once for kc.ast and once for numpy.

Keeping both spellings side by side means the reference is the same expression as the kernel by construction, and
the reproducer a failure writes is exactly the code that ran: `kc_lines` and `np_lines` are what the worker executes
and what the reproducer file contains.
"""
from __future__ import annotations
from dataclasses import dataclass, field, replace
from typing import Optional
import numpy as np

# ops whose result kc must match bit for bit when every float involved holds a small integer (an integral value is
# exact whatever the summation order, contraction or intermediate precision); every other float op is approximate
EXACT_OPS = frozenset({"input", "const", "add", "sub", "mul", "neg", "maximum", "minimum", "where", "cast", "sum", "max",
                       "min", "reshape", "permute", "expand", "pad", "shrink", "flip", "getitem", "cmp", "bitop", "not",
                       "idiv", "mod", "bitcast", "abs", "matmul", "prod"})
# float mantissa bits: integers up to 2**bits are exact
_MANTISSA = {"float16": 11, "float32": 24, "float64": 53}


@dataclass(frozen=True)
class Node:
  """One value of the kernel. `kc` and `np` are format templates over the operands' names ({0}, {1}, ...); an input's
  templates also take {idx}, its buffer index, which is assigned when the kernel is rendered."""
  op: str                       # what kind of step this is (also the failure signature's vocabulary)
  kc: str
  np: str
  srcs: tuple[int, ...] = ()
  kind: str = "arith"           # tolerance class when not exact: arith | reduce | transcendental
  needs_exact: bool = False     # a compare or float->int cast: only sound when its float operands are exact


@dataclass(frozen=True)
class Recipe:
  """A kernel: nodes in topological order, the nodes stored (output i is buffer i) and the input arrays by node."""
  nodes: tuple[Node, ...]
  outputs: tuple[int, ...]
  data: dict[int, np.ndarray] = field(compare=False)
  seed: int = 0

  def live(self) -> list[int]:
    """The nodes the outputs depend on, in order."""
    seen: set[int] = set()
    stack = list(self.outputs)
    while stack:
      i = stack.pop()
      if i not in seen:
        seen.add(i)
        stack.extend(self.nodes[i].srcs)
    return sorted(seen)

  def buffer_index(self) -> dict[int, int]:
    """Outputs are buffers 0..k-1 in order; live inputs follow, numbered by node (kc needs indices without gaps)."""
    idx = {}
    for i in self.live():
      if self.nodes[i].op == "input": idx[i] = len(self.outputs) + len(idx)
    return idx

  def inputs(self) -> dict[int, np.ndarray]:
    """The input arrays by buffer index."""
    return {b: self.data[n] for n, b in self.buffer_index().items()}

  def ops(self) -> list[str]:
    return [self.nodes[i].op for i in self.live()]

  def rewire(self, old: int, new: int) -> "Recipe":
    """Every use of node `old` (as an operand or an output) replaced by node `new`."""
    nodes = tuple(replace(n, srcs=tuple(new if s == old else s for s in n.srcs)) if old in n.srcs else n for n in self.nodes)
    outputs = tuple(dict.fromkeys(new if o == old else o for o in self.outputs))
    return replace(self, nodes=nodes, outputs=outputs)


def _fill(r: Recipe, i: int, template: str, prefix: str, bufs: dict[int, int]) -> str:
  n = r.nodes[i]
  return template.format(*(f"{prefix}{s}" for s in n.srcs), idx=bufs.get(i, len(r.outputs)))


def kc_lines(r: Recipe) -> list[str]:
  """Python that builds the kernel with kc.ast (names A, dtypes) and leaves it in `sink`."""
  bufs = r.buffer_index()
  lines = [f"k{i} = {_fill(r, i, r.nodes[i].kc, 'k', bufs)}" for i in r.live()]
  stores = ", ".join(f"A.store({b}, k{o})" for b, o in enumerate(r.outputs))
  return lines + [f"sink = A.sink({stores})"]


def np_lines(r: Recipe) -> list[str]:
  """Python that computes every live node with numpy (names np, inputs: {buffer index: array})."""
  bufs = r.buffer_index()
  return [f"n{i} = {_fill(r, i, r.nodes[i].np, 'n', bufs)}" for i in r.live()]


def eval_node(r: Recipe, i: int, values: dict[int, np.ndarray]) -> np.ndarray:
  """One node's numpy value from its operands' values (the generator calls this as it grows a recipe)."""
  n = r.nodes[i]
  if n.op == "input": return r.data[i]
  ns = {"np": np, **{f"n{s}": values[s] for s in n.srcs}}
  with np.errstate(all="ignore"):
    return np.asarray(eval(n.np.format(*(f"n{s}" for s in n.srcs), idx=-1), ns))  # noqa: S307 (our own templates)


def evaluate(r: Recipe) -> dict[int, np.ndarray]:
  """Every live node's numpy value."""
  values: dict[int, np.ndarray] = {}
  for i in r.live(): values[i] = eval_node(r, i, values)
  return values


def exact_nodes(r: Recipe, values: dict[int, np.ndarray]) -> set[int]:
  """Nodes whose value kc must reproduce bit for bit: integers and bools always; floats when the op is exact and every
  float it is computed from holds small integers (inputs and constants are exact as stored)."""
  exact: set[int] = set()
  for i in r.live():
    if is_exact(r.nodes[i], values[i], exact): exact.add(i)
  return exact


def is_exact(n: Node, v: np.ndarray, exact: set[int]) -> bool:
  """One step of exact_nodes: `exact` holds the operands already known exact."""
  if n.op in ("input", "const"): return True
  if n.op not in EXACT_OPS or not all(s in exact for s in n.srcs): return False
  return v.dtype.kind != "f" or is_integral(v)


def is_integral(v: np.ndarray) -> bool:
  if v.dtype.kind != "f": return True
  bits = _MANTISSA.get(v.dtype.name, 0)
  with np.errstate(all="ignore"):
    return bool(np.all(np.isfinite(v)) and np.all(v == np.round(v)) and np.all(np.abs(v) <= 2 ** bits))


def soundness_problem(r: Recipe, values: dict[int, np.ndarray]) -> Optional[str]:
  """Why numpy's answer could legitimately differ from a correct kernel's, or None. A compare or a float->int cast of
  an inexact float may flip on one rounding; a NaN or inf in the middle propagates differently through max and casts."""
  exact = exact_nodes(r, values)
  for i in r.live():
    n, v = r.nodes[i], values[i]
    if v.dtype.kind == "f" and not np.all(np.isfinite(v)): return f"node {i} ({n.op}) is not finite"
    if n.needs_exact and any(values[s].dtype.kind == "f" and s not in exact for s in n.srcs):
      return f"node {i} ({n.op}) needs exact float operands"
  return None
