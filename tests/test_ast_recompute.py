"""kc.ast's recompute guard on chains of matmuls: a layer whose result a later matmul broadcasts along a new axis of
more than RECOMPUTE_FACTOR elements (adding more than RECOMPUTE_ELEMENTS of reduce work) is a kernel of its own, in a
chain of any length and whatever sits between the layers (elementwise ops, bias adds, casts, permuted weights,
batched operands); a smaller layer is recomputed where it is read. The guard counts the reduce work of the value's own
kernel only: the kernel that computed a materialised layer before it is another kernel's work."""
import math
from dataclasses import dataclass
from typing import Optional
import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st
import kc
from kc import ast as A, dtypes
from kc.ast.builder import RECOMPUTE_ELEMENTS, RECOMPUTE_FACTOR
from kc.ir.uop import Ops
from kc.schedule import schedule

BETWEEN = ("none", "relu", "bias", "cast", "scale")  # what is applied to a layer's input before its matmul


@dataclass(frozen=True)
class Layer:
  n: int          # the layer's output columns
  between: str    # one of BETWEEN, applied to the layer's input
  permuted: bool  # the weight is stored (n, k) and read through a permute
  batched: bool   # the weight has the batch axis (a bmm); else one weight is shared by every batch


@dataclass(frozen=True)
class Chain:
  batch: Optional[int]  # the leading batch axis of the input (3-D operands), or None (2-D)
  rows: int
  k: int                # the input's columns
  layers: tuple[Layer, ...]


def build(chain: Chain, seed: int = 0):
  """The chain as a program, its inputs, and numpy's result for them."""
  rng = np.random.default_rng(seed)
  lead = () if chain.batch is None else (chain.batch,)
  rand = lambda shape, scale=1.0: (rng.standard_normal(shape) * scale).astype(np.float32)
  inputs = {1: rand(lead + (chain.rows, chain.k))}
  h, ha, width = A.arg(1, dtypes.float32, inputs[1].shape), inputs[1], chain.k
  for layer in chain.layers:
    if layer.between == "relu": h, ha = A.maximum(h, 0), np.maximum(ha, 0)
    elif layer.between == "scale": h, ha = h * 0.5, ha * 0.5
    elif layer.between == "cast": h, ha = h.astype(dtypes.float64), ha.astype(np.float64)
    elif layer.between == "bias":
      idx = len(inputs) + 1
      inputs[idx] = rand((width,))
      h, ha = h + A.arg(idx, dtypes.float32, (width,)), ha + inputs[idx]
    idx = len(inputs) + 1
    wlead = lead if layer.batched else ()
    stored = wlead + ((layer.n, width) if layer.permuted else (width, layer.n))
    inputs[idx] = rand(stored, 1 / math.sqrt(width))
    w, wa = A.arg(idx, dtypes.float32, stored), inputs[idx]
    if layer.permuted: w, wa = w.permute(*range(len(wlead)), len(wlead) + 1, len(wlead)), np.swapaxes(wa, -1, -2)
    h, ha, width = h @ w, ha @ wa, layer.n
  return A.sink(A.store(0, h)), inputs, ha


def expected(chain: Chain) -> tuple[int, int]:
  """The kernels and reduce work of the chain when every large layer is materialised and every small one is
  recomputed where the next layer reads it: the guard's rule, applied layer by layer. A layer's result is broadcast
  along the next layer's columns, which multiplies the loops of every reduce in its kernel by that size. Work is
  counted as reduce_work counts it: the loops a reduce's input spans, an inner reduce's included."""
  rows = chain.rows * (chain.batch or 1)
  kernels, total = 1, 0
  loops, reduces = rows * chain.k * chain.layers[0].n, 1  # the kernel the current layer is computed in
  for prev, layer in zip(chain.layers, chain.layers[1:]):
    work, grown = reduces * loops, reduces * loops * layer.n
    if grown > RECOMPUTE_FACTOR * work and grown - work > RECOMPUTE_ELEMENTS:
      kernels, total, loops, reduces = kernels + 1, total + work, rows * prev.n * layer.n, 1
    else: loops, reduces = loops * layer.n, reduces + 1
  return kernels, total + reduces * loops


def reduce_work(sink) -> tuple[int, int]:
  """The kernels of the program's schedule and their reduce work: every reduce's input extent (the largest size its
  loads have on each axis), summed over the reduces of every kernel."""
  plan, total = schedule(sink), 0
  for k in plan.kernels:
    for r in k.ast.toposort:
      if r.op is not Ops.REDUCE_AXIS: continue
      shapes = [u.src[1].arg.shape for u in r.src[0].toposort if u.op is Ops.LOAD]
      total += math.prod(max(dims) for dims in zip(*shapes))
  return len(plan.kernels), total


BATCHES = st.one_of(st.none(), st.integers(2, 3))


def layers(sizes, batch: Optional[int]):
  batched = st.booleans() if batch else st.just(False)
  return st.lists(st.builds(Layer, sizes, st.sampled_from(BETWEEN), st.booleans(), batched), min_size=2, max_size=5)


@st.composite
def chains(draw, sizes, rows):
  """Chains of 2 to 5 layers of `sizes`, 2-D or batched (3-D) with shared or batched weights."""
  batch = draw(BATCHES)
  return Chain(batch, draw(rows), draw(sizes), tuple(draw(layers(sizes, batch))))


def assert_no_recompute(chain: Chain, sink):
  kernels, work = reduce_work(sink)
  want_kernels, want_work = expected(chain)
  assert kernels <= want_kernels and work <= want_work, \
    f"{chain}: {kernels} kernels, reduce work {work}; materialising every large layer gives {want_kernels}, {want_work}"


@settings(max_examples=60, deadline=None)
@given(chain=chains(st.sampled_from([2, 3, 4, 16, 64, 256, 512, 1024]), st.sampled_from([1, 4, 64])))
def test_no_kernel_recomputes_a_large_layer(chain):
  """Any chain, with sizes from 2 (recomputed) to 1024 (materialised): its schedule does no more reduce work, in no
  more kernels, than materialising every large layer; scheduled only (the large ones would take seconds to run)."""
  assert_no_recompute(chain, build(chain)[0])


# three layers materialised (four kernels), with each kind of step between them; and a batched chain of bmms
MATERIALISED = (Chain(None, 8, 64, (Layer(64, "none", True, False), Layer(64, "bias", False, False),
                                    Layer(48, "relu", True, False), Layer(16, "cast", False, False))),
                Chain(2, 8, 48, (Layer(64, "scale", False, True), Layer(64, "relu", True, True), Layer(5, "bias", False, False))))


@settings(max_examples=15, deadline=None)
@given(chain=chains(st.sampled_from([2, 3, 5, 16, 48, 64]), st.integers(1, 8)))
@example(chain=MATERIALISED[0])
@example(chain=MATERIALISED[1])
def test_matmul_chains_mean_what_numpy_means(chain):
  """Small chains, large enough that some layers are materialised (8 x 64 x 64 is 32K of reduce work, broadcast 64
  times), run on CLANG against numpy."""
  sink, inputs, want = build(chain, seed=len(chain.layers))
  assert_no_recompute(chain, sink)
  np.testing.assert_allclose(kc.run(sink, inputs, "CLANG")[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("depth", [2, 3, 4])
def test_an_mlp_is_a_kernel_per_layer(depth):
  """A relu MLP of 64 x 512 -> 1024 -> ... -> 512: each layer is a kernel that reduces its own matmul once (three
  layers were two kernels, the second recomputing layer 2 for each of layer 3's 512 columns)."""
  dims = [512] + [1024] * (depth - 1) + [512]
  chain = Chain(None, 64, 512, tuple(Layer(n, "relu" if i else "none", False, False) for i, n in enumerate(dims[1:])))
  kernels, work = reduce_work(build(chain)[0])
  assert kernels == depth
  assert work == sum(64 * k * n for k, n in zip(dims, dims[1:]))
