"""A fuzz case's kernel as plain data: a list of nodes, each one step written twice, once for kc.ast and once for numpy.

Keeping both spellings side by side means the reference is the same expression as the kernel by construction, and
the reproducer a failure writes is exactly the code that ran: `kc_lines` and `np_lines` are what the worker executes
and what the reproducer file contains.
"""
from __future__ import annotations
from dataclasses import dataclass, field, replace
from typing import Optional
import numpy as np
from kc.ir.codec import decode, encode, round_to
from kc.ir.dtype import dtypes

# ops whose result kc must match bit for bit when every float involved holds a small integer (an integral value is
# exact whatever the summation order, contraction or intermediate precision); every other float op is approximate
EXACT_OPS = frozenset({"input", "const", "add", "sub", "mul", "neg", "maximum", "minimum", "where", "cast", "sum", "max",
                       "min", "reshape", "permute", "expand", "pad", "shrink", "flip", "getitem", "cmp", "bitop", "not",
                       "idiv", "mod", "bitcast", "abs", "matmul", "prod", "floor", "ceil", "trunc", "rint", "round",
                       "sign", "square", "isnan", "isinf", "isfinite", "shift", "argmax", "argmin", "squeeze",
                       "flatten", "ravel", "windows"})
# float mantissa bits: integers up to 2**bits are exact
_MANTISSA = {"float16": 11, "float32": 24, "float64": 53, "bfloat16": 8, "fp8e4m3": 4, "fp8e5m2": 3}
# the float types numpy lacks: a node of one holds float32 values exact in its type (rounded once with kc's own codec,
# the fuzzer does not import ml_dtypes); kc takes and returns their raw bits
NARROW_FLOATS = ("bfloat16", "fp8e4m3", "fp8e5m2")


def narrow_round(x, name: str) -> np.ndarray:
  """float values rounded once to the narrow float type `name`, as float32 (NaN stays NaN, the sign of zeros stays)."""
  return round_to(np.asarray(x, dtype=np.float32), getattr(dtypes, name))


def narrow_bits(values: np.ndarray, name: str) -> np.ndarray:
  """float32 values of the narrow type `name` as the raw bits kc takes (uint16 for bfloat16, uint8 for fp8)."""
  return encode(values, getattr(dtypes, name))


def narrow_values(bits: np.ndarray, name: str) -> np.ndarray:
  """Raw bits of the narrow type `name` (as kc returns them) as float32 values."""
  return decode(bits, getattr(dtypes, name))


def value_dtype(v: np.ndarray, node: "Node") -> str:
  """The kc dtype name of a node's value: the node's own for a narrow float, else numpy's."""
  return node.dtype or ("bool" if v.dtype == np.bool_ else v.dtype.name)


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
  dtype: str = ""               # the kc dtype where numpy's value does not say it: a NARROW_FLOATS name (float32 values)


@dataclass(frozen=True)
class Recipe:
  """A kernel: nodes in topological order, the nodes stored (output i is buffer i) and the input arrays by node."""
  nodes: tuple[Node, ...]
  outputs: tuple[int, ...]
  data: dict[int, np.ndarray] = field(compare=False)
  seed: int = 0
  family: str = "classic"       # the generator that made it (kc.tools.fuzz.families); generate(seed, size, family) remakes it
  specials: bool = False        # NaN and infs may occur in the middle (numpy's IEEE answers are the reference)

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
    """The input arrays by buffer index, as kc takes them (a narrow float's as its raw bits)."""
    return {b: narrow_bits(self.data[n], self.nodes[n].dtype) if self.nodes[n].dtype else self.data[n]
            for n, b in self.buffer_index().items()}

  def output_dtypes(self) -> dict[int, str]:
    """The narrow float type of each output buffer that has one (kc returns its raw bits)."""
    return {b: self.nodes[o].dtype for b, o in enumerate(self.outputs) if self.nodes[o].dtype}

  def ops(self) -> list[str]:
    return [self.nodes[i].op for i in self.live()]

  def rewire(self, old: int, new: int) -> "Recipe":
    """Every use of node `old` (as an operand or an output) replaced by node `new`."""
    nodes = tuple(replace(n, srcs=tuple(new if s == old else s for s in n.srcs)) if old in n.srcs else n for n in self.nodes)
    outputs = tuple(dict.fromkeys(new if o == old else o for o in self.outputs))
    return replace(self, nodes=nodes, outputs=outputs)


def input_node(dtype: str, shape: tuple[int, ...]) -> Node:
  """A buffer of `dtype` and `shape`: a narrow float's numpy side decodes the bits kc takes."""
  if dtype in NARROW_FLOATS:
    return Node("input", f"A.arg({{idx}}, dtypes.{dtype}, {shape})", f"decode(inputs[{{idx}}], {dtype!r})", dtype=dtype)
  return Node("input", f"A.arg({{idx}}, dtypes.{dtype}, {shape})", "inputs[{idx}]")


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
  ns = {**NP_NAMES, **{f"n{s}": values[s] for s in n.srcs}}
  with np.errstate(all="ignore"):
    return np.asarray(eval(n.np.format(*(f"n{s}" for s in n.srcs), idx=-1), ns))  # noqa: S307 (our own templates)


# the names numpy templates use: numpy, and kc's codec for the float types numpy lacks (a reproducer imports the same)
NP_NAMES = {"np": np, "rnd": narrow_round, "decode": narrow_values}
NP_IMPORTS = "from kc.tools.fuzz.recipe import narrow_round as rnd, narrow_values as decode  # noqa: F401"


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
  return v.dtype.kind != "f" or is_integral(v, value_dtype(v, n))


def is_integral(v: np.ndarray, dtype: str = "") -> bool:
  """Every number in `v` is an integer its float type holds exactly; NaN and infs count as exact too (IEEE defines
  what an exact op makes of them)."""
  if v.dtype.kind != "f": return True
  bits = _MANTISSA.get(dtype or v.dtype.name, 0)
  with np.errstate(all="ignore"):
    w = np.where(np.isfinite(v), v, 0)
    return bool(np.all(w == np.round(w)) and np.all(np.abs(w) <= 2 ** bits))


def soundness_problem(r: Recipe, values: dict[int, np.ndarray]) -> Optional[str]:
  """Why numpy's answer could legitimately differ from a correct kernel's, or None. A compare or a float->int cast of
  an inexact float may flip on one rounding; a NaN or inf in the middle propagates differently through max and casts."""
  exact = exact_nodes(r, values)
  for i in r.live():
    n, v = r.nodes[i], values[i]
    if v.dtype.kind == "f" and not r.specials and not np.all(np.isfinite(v)): return f"node {i} ({n.op}) is not finite"
    if n.needs_exact and any(values[s].dtype.kind == "f" and s not in exact for s in n.srcs):
      return f"node {i} ({n.op}) needs exact float operands"
    if (why := special_problem(r, n, v, values)) is not None: return f"node {i} ({n.op}) {why}"
  return None


def special_problem(r: Recipe, n: Node, v: np.ndarray, values: dict[int, np.ndarray]) -> Optional[str]:
  """Why a step over NaN or infs has no one right answer, or None: a float->int cast of one is undefined in C, and a
  NaN computed in the middle has no defined payload for a bitcast to read."""
  floats = [s for s in n.srcs if values[s].dtype.kind == "f"]
  with np.errstate(all="ignore"):
    if n.op == "cast" and v.dtype.kind in "iu" and any(not np.all(np.isfinite(values[s])) for s in floats):
      return "casts a NaN or inf to an int"
    if n.op == "bitcast" and any(r.nodes[s].op != "input" and np.isnan(values[s]).any() for s in floats):
      return "bitcasts a computed NaN"
  return None
