"""What a conformance case is: a builder of one kernel's AST, its inputs and numpy's answer, plus what the case needs
from a device and which optimization choices it is run under.

Integer division and remainder follow C (truncation), as every kc backend does."""
from __future__ import annotations
import functools
from dataclasses import dataclass, field
from typing import Callable, Optional
import numpy as np
from kc import DType, KcError, Ops, UOp, dtypes
from kc import ast as A

# which optimization choices (see specs.py) a case is run under
FULL = "full"     # none, hand, every single candidate opt, seeded random sequences (and tensor cores for matmuls)
BASIC = "basic"   # none and hand
HAND = "hand"     # hand only: the case is about a dtype or an op, not about optimizations
TENSOR = "tensor" # none, hand and the tensor-core levels: the case is about a tensor core's dtypes, not about opts


@dataclass
class Setup:
  """One instance of a case: the AST, the inputs by buffer index, numpy's outputs and the Variables' values.
  bfloat16 data is given as float32 values that bfloat16 holds exactly. `images` maps a buffer index to the ImageDType
  it is allocated as (its data is float32 in the image's row-major texel order)."""
  sink: UOp
  inputs: dict[int, np.ndarray]
  expected: dict[int, np.ndarray]
  var_vals: dict[str, int] = field(default_factory=dict)
  images: dict[int, DType] = field(default_factory=dict)

  @functools.cached_property
  def dtypes(self) -> dict[int, DType]:
    """Every buffer's dtype by index, as the AST declares it."""
    return {u.arg: u.dtype.base for u in self.sink.toposort if u.op is Ops.DEFINE_GLOBAL}


@dataclass(frozen=True)
class Case:
  """name: unique, used in test ids. kind: the tolerance class of its outputs (kc.testing.tolerance). specs: FULL, BASIC or
  HAND. tensor_core: the (dtype_in, dtype_out) a tensor core needs to run this matmul (tensor-core specs only then).
  needs: capabilities beyond the dtypes of its buffers (which are always needed). tolerance: a per-case override,
  {dtype name: Tolerance}, for a case whose numerics differ from its class (say why where it is declared).
  tc_tolerance: the override that applies under the tensor-core specs on top of `tolerance` (a float32 tensor core
  may round its inputs to tf32).
  vector_access: the render tier also checks that the Program's loads and stores are vectors under an opt that
  upcasts the last axis by 4 (only meaningful with needs=("float4",))."""
  name: str
  build: Callable[[np.random.Generator], Setup]
  kind: str
  specs: str = FULL
  tensor_core: Optional[tuple[DType, DType]] = None
  needs: tuple[str, ...] = ()
  tolerance: Optional[dict] = None
  tc_tolerance: Optional[dict] = None
  group: str = ""
  vector_access: bool = False  # under a spec that upcasts its last axis by 4, the Program must load and store vectors


  def overrides(self, tensor_core: bool = False) -> Optional[dict]:
    """The tolerance overrides of this case when run with (tensor_core=True) or without a tensor core."""
    if not (tensor_core and self.tc_tolerance): return self.tolerance
    return {**(self.tolerance or {}), **self.tc_tolerance}


CASES: dict[str, Case] = {}


def register(c: Case) -> Case:
  if c.name in CASES: raise KcError(f"two conformance cases are named {c.name}")
  CASES[c.name] = c
  return c


def case(kind: str, group: str, **kw):
  """Decorator: the function's name is the case's name."""
  def wrap(fn: Callable[[np.random.Generator], Setup]) -> Callable:
    register(Case(fn.__name__, fn, kind, group=group, **kw))
    return fn
  return wrap


def setup_of(name: str, seed: int = 0) -> Setup:
  """The case's instance for `seed`: the same arrays on every machine and every run."""
  return CASES[name].build(np.random.default_rng(seed))


# ----------------------------------------------------------------------------------------------------- helpers for builders

def arg(i: int, shape, dt: DType = dtypes.float32): return A.arg(i, dt, tuple(shape) if not isinstance(shape, int) else (shape,))


def uniform(rng, shape, lo=-2.0, hi=2.0, dt=np.float32) -> np.ndarray: return rng.uniform(lo, hi, shape).astype(dt)


def ints(rng, shape, lo, hi, dt) -> np.ndarray: return rng.integers(lo, hi, shape, endpoint=True).astype(dt)


def nonzero(x: np.ndarray) -> np.ndarray: return np.where(x == 0, np.ones_like(x), x)


def single(sink, inputs, expected, **var_vals) -> Setup: return Setup(sink, inputs, expected, var_vals)
