"""Values a kernel would compute more than once: a transcendental value read in two of a kernel's loop nests, and a
reduce's result read inside another reduce's loop that the kernel would compute again for each of that reduce's
outputs.

A kernel runs a loop nest per reduce (over the reduce's input) and one over its outputs, and computes a value in every
nest that reads it. A row softmax, exp(x - max) / sum(exp(x - max)), reads exp(x - max) in its sum's loop and in the
loop that stores the quotient: as one kernel it computes every exp twice. On a device that computes exp2, log2, sin
and pow in software (a host CPU: a polynomial of some twenty vector ops per element), storing such a value once and
reading it back is cheaper than computing it again once there are enough elements to pay for a second kernel (a
256x1024 softmax on one AVX-512 core: 230 us as one kernel, 166 us as two; an 8x128 one 3.2 against 4.8 us). A device
with work-groups (a GPU) has these functions in hardware and memory traffic is what it spends: it keeps one kernel."""
from __future__ import annotations
import math
from typing import Iterable, Optional
from kc.codegen.verify import preorder
from kc.ir.uop import Ops, UOp
from kc.renderer import Renderer
from kc.schedule.movement import shape_of

# what costs tens of operations per element where it is computed in software
TRANSCENDENTAL = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.POW})
# the fewest elements of a shared value stored once instead of computed again (the 8x128 softmax above: 1024)
MIN_ELEMENTS = 1 << 14


def computes_transcendentals_in_software(renderer: Optional[Renderer]) -> bool:
  """Whether `renderer`'s device computes transcendentals as sequences of ordinary ops: the host CPU backends, which
  are the ones without work-groups (a device without a renderer compiles nothing: no)."""
  return renderer is not None and not renderer.has_local


# where a loop nest's graph ends: a reduce's result is computed once, in a nest of its own; a BUFFER is another kernel's
_NEST_ENDS = frozenset({Ops.REDUCE_AXIS, Ops.BUFFER})


def _nest(root: UOp) -> dict[UOp, None]:
  """The nodes one loop nest computes for `root`, in walk order."""
  return dict.fromkeys(preorder(root, _NEST_ENDS))


def recomputed_transcendentals(values: Iterable[UOp]) -> list[UOp]:
  """The values a kernel storing `values` (one loop nest over its outputs) computes in two or more of its loop nests
  and that hold a transcendental op of their own nest, with at least MIN_ELEMENTS elements: the outermost of them
  only (a value inside another one found is stored with it)."""
  # the outputs' nest: in walk order (a UOp hashes by its address, so a set would order it differently each process)
  top = dict.fromkeys(u for v in values for u in _nest(v))
  nests_of: dict[UOp, int] = dict.fromkeys(top, 1)
  seen: set[UOp] = set()
  reduces = [u for u in top if u.op is Ops.REDUCE_AXIS]
  while reduces:
    r = reduces.pop()
    if r in seen: continue
    seen.add(r)
    inner = _nest(r.src[0])
    for u in inner: nests_of[u] = nests_of.get(u, 0) + 1
    reduces.extend(u for u in inner if u.op is Ops.REDUCE_AXIS)
  shapes: dict = {}
  found = []
  for u, count in nests_of.items():
    if count < 2 or u.op in (Ops.REDUCE_AXIS, Ops.BUFFER, Ops.LOAD, Ops.VIEW, Ops.CONST): continue
    if not any(x.op in TRANSCENDENTAL for x in _nest(u)): continue
    shape = shape_of(u, shapes)
    if shape is None or not all(isinstance(d, int) for d in shape) or math.prod(shape) < MIN_ELEMENTS: continue
    found.append(u)
  inside = {x for u in found for x in _nest(u) if x is not u}
  return [u for u in found if u not in inside]


# the fewest operations that recomputing a reduce's result costs before it is stored once instead
MIN_RECOMPUTED = 1 << 16


def _holds_reduce(u: UOp) -> bool:
  return any(x.op is Ops.REDUCE_AXIS for x in preorder(u, frozenset({Ops.BUFFER})))


def recomputed_reduces(values: Iterable[UOp]) -> list[UOp]:
  """The values holding a reduce of their own that a kernel storing `values` would compute again and again: V read
  (through a VIEW) inside the loop of a reduce R, varying along one of R's reduce axes (so V is computed inside R's
  loop, not before it), and not varying along some of R's other axes (so it is computed again for each of their
  indices). An RMSNorm's backward reads rstd[i] = 1/sqrt(mean_k x[i,k]^2) in its weight gradient sum_i g[i,j] x[i,j]
  rstd[i]: one kernel computed every row's rstd again for each of the 1024 columns j (a 64x1024 norm: 67M operations
  where storing rstd costs 65K). Those computed again at least MIN_RECOMPUTED operations' worth are returned."""
  shapes: dict = {}
  found: dict[UOp, None] = {}
  held: dict[UOp, bool] = {}
  for r in dict.fromkeys(u for v in values for u in preorder(v, frozenset({Ops.BUFFER}))):
    if r.op is not Ops.REDUCE_AXIS: continue
    shape = shape_of(r.src[0], shapes)
    if shape is None or not all(isinstance(d, int) for d in shape): continue
    axes = set(r.arg[1])
    for u in _nest(r.src[0]):
      if u.op is not Ops.VIEW or not u.src or u.src[0].op is Ops.BUFFER: continue
      if (inner := u.src[0]) not in held: held[inner] = _holds_reduce(inner)
      st = u.arg
      if not held[inner] or len(st.views) != 1 or st.shape != shape: continue
      varies = {a for a, (d, stride) in enumerate(zip(shape, st.views[0].strides)) if d != 1 and stride != 0}
      if not varies & axes: continue  # computed once per output of R, before R's loop
      repeats = math.prod(d for a, d in enumerate(shape) if a not in axes and a not in varies)
      if (repeats - 1) * _work(inner, shapes) >= MIN_RECOMPUTED: found[inner] = None
  return list(found)


def _work(u: UOp, shapes: dict) -> int:
  """The elements the reduces under `u` loop over, in its own loop nest: what computing u once costs."""
  total = 0
  for x in preorder(u, frozenset({Ops.BUFFER})):
    if x.op is Ops.REDUCE_AXIS and (shape := shape_of(x.src[0], shapes)) is not None:
      total += math.prod(d if isinstance(d, int) else 1 for d in shape)
  return total
