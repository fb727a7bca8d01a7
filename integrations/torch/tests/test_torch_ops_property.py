"""Random elementwise ops, dtypes and operands (specials included) under backend "kc" against eager: torch's result
dtype always, eager's bits for the exact ops (+ - * / comparisons, where, min/max, abs, neg, rounding), a few float32
ulps for the transcendental ones; an op kc cannot match exactly runs in torch (reported), never a wrong answer."""
from __future__ import annotations
import operator
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
import kc_torch

FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
INTS = [torch.int32, torch.int64, torch.int8, torch.uint8, torch.int16]
EXACT_BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "maximum": torch.maximum,
                "minimum": torch.minimum, "lt": operator.lt, "le": operator.le, "eq": operator.eq, "ne": operator.ne,
                "where": lambda a, b: torch.where(a > b, a, b)}
FLOAT_BINARY = {"div": operator.truediv}
EXACT_UNARY = {"neg": operator.neg, "abs": torch.abs, "relu": torch.relu, "floor": torch.floor, "ceil": torch.ceil,
               "trunc": torch.trunc, "round": torch.round, "sign": torch.sign, "isnan": torch.isnan}
FLOAT_UNARY = {"exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
               "sin": torch.sin, "rsqrt": torch.rsqrt, "erf": torch.erf}
SPECIALS = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.5, 1e-3, 65504.0, float("inf"), float("-inf"), float("nan")]


def _operand(draw, dtype: torch.dtype, n: int) -> torch.Tensor:
  if dtype.is_floating_point:
    values = draw(st.lists(st.one_of(st.sampled_from(SPECIALS), st.floats(-50, 50, width=32)), min_size=n, max_size=n))
    return torch.tensor(values, dtype=torch.float64).to(dtype)
  info = torch.iinfo(dtype)
  return torch.tensor(draw(st.lists(st.integers(max(info.min, -1000), min(info.max, 1000)), min_size=n, max_size=n)), dtype=dtype)


@st.composite
def cases(draw):
  kind = draw(st.sampled_from(["exact_binary", "float_binary", "exact_unary", "float_unary"]))
  floats_only = kind in ("float_binary", "float_unary")
  dtype = draw(st.sampled_from(FLOATS if floats_only else FLOATS + INTS))
  table = {"exact_binary": EXACT_BINARY, "float_binary": FLOAT_BINARY, "exact_unary": EXACT_UNARY, "float_unary": FLOAT_UNARY}[kind]
  name = draw(st.sampled_from(sorted(table)))
  if name in ("floor", "ceil", "trunc", "round", "sign", "isnan") and not dtype.is_floating_point and name != "sign":
    dtype = torch.float32
  n = draw(st.integers(1, 9))
  if "unary" in kind: operands = [_operand(draw, dtype, n)]
  else:
    # the second operand of another dtype (torch's promotion: an int64 rounds to a half result's dtype first), a 0-d
    # tensor (which torch's half kernels read as a scalar), and either one first
    other = _operand(draw, draw(st.sampled_from([dtype, torch.float32, torch.int64])), n)
    if draw(st.booleans()): other = other[0]
    operands = [_operand(draw, dtype, n), other]
    if draw(st.booleans()): operands.reverse()
  scalar = draw(st.none() | st.sampled_from([2, -3, 0.5, 1.7]))
  return kind, name, table[name], operands, scalar


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_elementwise_ops_match_eager(case):
  kind, name, op, operands, scalar = case
  def fn(*xs):
    out = op(*xs)
    return out * scalar if scalar is not None and not out.dtype == torch.bool else out
  try:
    want = fn(*operands)
  except (RuntimeError, TypeError):
    return  # an op/dtype pair torch itself refuses (uint8 neg, bool arithmetic)
  torch._dynamo.reset()
  kc_torch.clear_fallbacks()
  got = torch.compile(fn, backend="kc", options={"device": "CLANG"})(*operands)
  assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, want.dtype)
  if kc_torch.fallbacks(): return  # ran in torch by choice: the reason is in the report, the answer is eager's
  if kind.startswith("exact") or name == "div" or not want.dtype.is_floating_point:
    assert torch.equal(got.isnan(), want.isnan()) if want.dtype.is_floating_point else True
    ok = got.isnan() & want.isnan() if want.dtype.is_floating_point else torch.zeros_like(got, dtype=torch.bool)
    assert torch.equal(torch.where(ok, 0, got.double()), torch.where(ok, 0, want.double())), (name, operands, got, want)
  else:
    ulp = {torch.float32: 2 ** -21, torch.float64: 2 ** -21, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}[want.dtype]
    torch.testing.assert_close(got, want, rtol=4 * ulp, atol=4 * ulp, equal_nan=True, check_dtype=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_erf_of_half_is_computed_in_float32(dtype):
  x = torch.linspace(-4, 4, 401, dtype=dtype)
  torch._dynamo.reset()
  kc_torch.clear_fallbacks()
  got = torch.compile(torch.erf, backend="kc", options={"device": "CLANG"})(x)
  assert kc_torch.fallbacks() == []
  torch.testing.assert_close(got, torch.erf(x), rtol=0, atol=float(torch.finfo(dtype).eps))
