"""Programs: everyday numpy programs written in kc.ast, whose sinks kc.schedule may cut into several kernels, with
intermediates in one arena (kc_conformance.programs renders, compiles and runs them kernel by kernel).

Each case states how many kernels the scheduler makes of it, and its builder checks that count, so that a scheduling
change shows as a failing case rather than as a quietly different program: a one-kernel count means the scheduler
fuses the program (a reduce result broadcast back along the axes it reduced is recomputed per element, not stored),
more means values one kernel cannot carry (a reduce result reshaped, outputs of different shapes) are materialised.
numpy computes every reference in float64 from the float32 inputs, rounded once. The specs are none and hand: each
kernel is optimized on its own, as kc.compile optimizes a program's kernels.

Ops that kc.ast gains in parallel (Expr.cumsum, A.concatenate, A.stack) are certified once they exist: their cases are
registered only where kc.ast has them (`kc conformance --list` shows which are)."""
from __future__ import annotations
import math
import numpy as np
from kc import UOp
from kc import ast as A
from kc.schedule import schedule
from .case import BASIC, Setup, arg, case, uniform

EPS = 1e-5  # layernorm's epsilon


def program(sink: UOp, inputs: dict, expected: dict, kernels: int) -> Setup:
  """The Setup of a program that kc.schedule must cut into `kernels` kernels (a different count fails the case)."""
  plan = schedule(sink)
  if len(plan.kernels) != kernels:
    raise AssertionError(f"kc.schedule made {len(plan.kernels)} kernels of this program where the case expects "
                         f"{kernels}: " + "; ".join(plan.describe()))
  return Setup(sink, inputs, expected)


def program_case(kind: str):
  """A program case: group "program", run with the none and hand opts."""
  return case(kind, "program", specs=BASIC)


def f64(a: np.ndarray) -> np.ndarray: return a.astype(np.float64)


def f32(a) -> np.ndarray: return np.asarray(a).astype(np.float32)


# -------------------------------------------------------------------------------------- fused: a kernel per store shape

@program_case("reduce")
def program_layernorm(rng):
  # mean and var over the last axis broadcast back along it: recomputed per element, one kernel
  a, w, b = uniform(rng, (6, 16)), uniform(rng, (16,)), uniform(rng, (16,))
  x, wx, bx = arg(1, (6, 16)), arg(2, (16,)), arg(3, (16,))
  out = (x - x.mean(1, keepdims=True)) / (x.var(1, keepdims=True) + EPS).sqrt() * wx + bx
  want = (f64(a) - f64(a).mean(1, keepdims=True)) / np.sqrt(f64(a).var(1, keepdims=True) + EPS) * w + b
  return program(A.sink(A.store(0, out)), {1: a, 2: w, 3: b}, {0: f32(want)}, kernels=1)


@program_case("reduce")
def program_attention(rng):
  # softmax(q @ k.T / sqrt(d)) @ v with 4 queries over 6 keys: the scores' row max and sum stay in one kernel
  d = 8
  q, k, v = uniform(rng, (4, d), -1.0, 1.0), uniform(rng, (6, d), -1.0, 1.0), uniform(rng, (6, d), -1.0, 1.0)
  qx, kx, vx = arg(1, (4, d)), arg(2, (6, d)), arg(3, (6, d))
  s = qx @ kx.T / math.sqrt(d)
  e = (s - s.max(1, keepdims=True)).exp()
  out = e / e.sum(1, keepdims=True) @ vx
  sa = f64(q) @ f64(k).T / math.sqrt(d)
  ea = np.exp(sa - sa.max(1, keepdims=True))
  want = ea / ea.sum(1, keepdims=True) @ f64(v)
  return program(A.sink(A.store(0, out)), {1: q, 2: k, 3: v}, {0: f32(want)}, kernels=1)


@program_case("reduce")
def program_var_std_rows(rng):
  # outputs of one shape share a kernel: var, std and var with ddof=1 of each row
  a = uniform(rng, (6, 16))
  x = arg(1, (6, 16))
  sink = A.sink(A.store(0, x.var(1)), A.store(2, x.std(1)), A.store(3, x.var(1, ddof=1)))
  want = {0: f32(f64(a).var(1)), 2: f32(f64(a).std(1)), 3: f32(f64(a).var(1, ddof=1))}
  return program(sink, {1: a}, want, kernels=1)


@program_case("reduce")
def program_standardize(rng):
  # (x - x.mean()) / x.std() over the whole array: the two reduces to a scalar broadcast back, one kernel
  a = uniform(rng, (6, 16))
  x = arg(1, (6, 16))
  want = (f64(a) - f64(a).mean()) / f64(a).std()
  return program(A.sink(A.store(0, (x - x.mean()) / x.std())), {1: a}, {0: f32(want)}, kernels=1)


@program_case("exact")
def program_argmax_argmin_rows(rng):
  # small integers as floats: ties in most rows, where numpy's answer is the first index
  a = rng.integers(-3, 3, (7, 12), endpoint=True).astype(np.float32)
  x = arg(1, (7, 12))
  sink = A.sink(A.store(0, x.argmax(1)), A.store(2, x.argmin(1)))
  return program(sink, {1: a}, {0: a.argmax(1), 2: a.argmin(1)}, kernels=1)


@program_case("exact")
def program_reduce_broadcast_other_axis(rng):
  # x.T - x.max(1): each row's max broadcast along the columns of the transpose
  a = uniform(rng, (6, 6))
  x = arg(1, (6, 6))
  return program(A.sink(A.store(0, x.T - x.max(1))), {1: a}, {0: a.T - a.max(1)}, kernels=1)


@program_case("reduce")
def program_reduce_of_reduce(rng):
  # a max over axis 0 of a sum over axis 2, and a row sum of x.T - x.max(1): each output's reduces nest in one kernel,
  # and the outputs' shapes differ, (4,) and (6,): two kernels
  a = uniform(rng, (3, 4, 5))
  x, y = arg(1, (3, 4, 5)), arg(2, (6, 6))
  b = uniform(rng, (6, 6))
  sink = A.sink(A.store(0, x.sum(2).max(0)), A.store(3, (y.T - y.max(1)).sum(1)))
  want = {0: f32(f64(a).sum(2).max(0)), 3: f32((f64(b).T - b.max(1)).sum(1))}
  return program(sink, {1: a, 2: b}, want, kernels=2)


@program_case("reduce")
def program_outputs_of_three_shapes(rng):
  a = uniform(rng, (4, 6))
  x = arg(3, (4, 6))
  sink = A.sink(A.store(0, x.sum(0)), A.store(1, x.sum(1)), A.store(2, x * 2))
  return program(sink, {3: a}, {0: f32(f64(a).sum(0)), 1: f32(f64(a).sum(1)), 2: a * np.float32(2)}, kernels=3)


# ------------------------------------------------------------------------------------------- intermediates in the arena

@program_case("reduce")
def program_reduce_reshaped(rng):
  # a reduce result reshaped, then computed with: the reshape regroups the reduce's output, an intermediate
  a = uniform(rng, (4, 6))
  x = arg(1, (4, 6))
  want = f64(a).sum(0).reshape(2, 3) + 1
  return program(A.sink(A.store(0, x.sum(0).reshape(2, 3) + 1)), {1: a}, {0: f32(want)}, kernels=2)


@program_case("reduce")
def program_reduce_of_reshaped_reduce(rng):
  a = uniform(rng, (3, 4, 5))
  x = arg(1, (3, 4, 5))
  sink = A.sink(A.store(0, x.sum(2).reshape(12).max()), A.store(2, x.sum(0).reshape(2, 10).sum(1)))
  want = {0: f32(f64(a).sum(2).reshape(12).max()), 2: f32(f64(a).sum(0).reshape(2, 10).sum(1))}
  # each output: its inner reduce into an intermediate, then the outer reduce
  return program(sink, {1: a}, want, kernels=4)


@program_case("reduce")
def program_std_of_rows_over_std(rng):
  # x.std(1) / x.std(): a reduce to a scalar nested in the rows' reduce, materialised first
  a = uniform(rng, (6, 16))
  x = arg(1, (6, 16))
  return program(A.sink(A.store(0, x.std(1) / x.std())), {1: a}, {0: f32(f64(a).std(1) / f64(a).std())}, kernels=2)


@program_case("reduce")
def program_two_intermediates_combined(rng):
  # two reduce results, each reshaped into an intermediate of its own, live together in the arena
  a = uniform(rng, (6, 8))
  x = arg(1, (6, 8))
  out = x.sum(0).reshape(2, 4) + x.max(1)[:2].reshape(2, 1)
  want = f64(a).sum(0).reshape(2, 4) + a.max(1)[:2].reshape(2, 1)
  return program(A.sink(A.store(0, out)), {1: a}, {0: f32(want)}, kernels=3)


@program_case("reduce")
def program_realize(rng):
  # Expr.realize: the row means computed by a kernel of their own and read back
  a = uniform(rng, (6, 8))
  x = arg(1, (6, 8))
  out = x - x.mean(1, keepdims=True).realize()
  return program(A.sink(A.store(0, out)), {1: a}, {0: f32(f64(a) - f64(a).mean(1, keepdims=True))}, kernels=2)


@program_case("reduce")
def program_chain_of_intermediates(rng):
  # each step's (4, 4) intermediate is read only by the next: the arena reuses the bytes of finished ones
  a = uniform(rng, (16, 16), -0.5, 0.5)
  x = arg(1, (16, 16))
  y, ya = x, f64(a)
  for _ in range(3):
    y, ya = (y.sum(0).reshape(4, 4) + 1.0).reshape(16, 1) * x, (ya.sum(0).reshape(4, 4) + 1.0).reshape(16, 1) * f64(a)
  return program(A.sink(A.store(0, y)), {1: a}, {0: f32(ya)}, kernels=4)


# ----------------------------------------------------------------------------------------------------- ops kc.ast gains

if hasattr(A.Expr, "cumsum"):
  @program_case("reduce")
  def program_cumsum_rows(rng):
    a = uniform(rng, (4, 12))
    return program(A.sink(A.store(0, arg(1, (4, 12)).cumsum(1))), {1: a}, {0: f32(f64(a).cumsum(1))}, kernels=1)

  @program_case("reduce")
  def program_cumsum_long_rows(rng):
    # 300 elements: past kc.ast.scan's BLOCKED_FROM, a scan within blocks and one of the block totals
    a = uniform(rng, (3, 300), -1.0, 1.0)
    return program(A.sink(A.store(0, arg(1, (3, 300)).cumsum(1))), {1: a}, {0: f32(f64(a).cumsum(1))}, kernels=4)


if hasattr(A, "concatenate"):
  @program_case("reduce")
  def program_concatenate_computed(rng):
    # computed parts, one a reduce result (materialised), joined along the rows
    a, b = uniform(rng, (5, 6)), uniform(rng, (5, 3))
    x, y = arg(1, (5, 6)), arg(2, (5, 3))
    out = A.concatenate([x.exp(), y * 2, x.sum(1, keepdims=True)], 1)
    want = np.concatenate([np.exp(f64(a)), f64(b) * 2, f64(a).sum(1, keepdims=True)], 1)
    return program(A.sink(A.store(0, out)), {1: a, 2: b}, {0: f32(want)}, kernels=2)


if hasattr(A, "stack"):
  @program_case("reduce")
  def program_stack_of_reduces(rng):
    a = uniform(rng, (5, 6))
    x = arg(1, (5, 6))
    out = A.stack([x.sum(1), x.max(1), x.std(1)], 1)
    want = np.stack([f64(a).sum(1), f64(a).max(1), f64(a).std(1)], 1)
    return program(A.sink(A.store(0, out)), {1: a}, {0: f32(want)}, kernels=2)
