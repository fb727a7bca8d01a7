"""kc fuzz's oracle keeps only steps whose answer does not depend on what kc may choose: a float product's order (any
order's partial products stay normal floats), and an ill-conditioned op's input away from 0 by more than the error
the fuzz bound grants it. Checked on the recipes the generator makes, by reordering and by the chain's own scale."""
import re
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from kc.tools.fuzz import case_seed, generate
from kc.tools.fuzz.classic import products_stay_normal
from kc.tools.fuzz.recipe import evaluate, exact_nodes

RECIPES = [generate(case_seed(seed, i)) for seed in (11, 12, 13, 14) for i in range(400)]


def _axes(np_code: str, ndim: int):
  """The axes a numpy reduce step names (axis=None: all of them)."""
  m = re.search(r"axis=(None|\([^)]*\)|-?\d+)", np_code)
  got = eval(m.group(1)) if m else None  # noqa: S307 (the generator's own text)
  if got is None: return tuple(range(ndim))
  return tuple(a % ndim for a in ((got,) if isinstance(got, int) else got))


def test_products_stay_normal():
  big = np.array([300.0] * 20 + [0.0], dtype=np.float32)  # 300**20 overflows float32 before or after the 0
  assert not products_stay_normal(big, None)
  assert products_stay_normal(big[:12], None)
  assert not products_stay_normal(np.full(40, 1e-4, np.float32), None)  # underflows in any order
  rows = np.stack([np.full(8, 1e6, np.float32), np.ones(8, np.float32)])
  assert products_stay_normal(rows, (0,)) and not products_stay_normal(rows, (1,))  # only row 0's 8 factors pile up
  assert products_stay_normal(np.arange(1, 100, dtype=np.int32), None)  # ints wrap alike in any order
  assert products_stay_normal(np.array([np.inf, np.nan, 2.0], np.float32), None)  # specials are no partial products


def _pairwise_product(x: np.ndarray) -> np.float32:
  while x.size > 1: x = np.concatenate([x[0:-1:2] * x[1::2], x[-1:] if x.size % 2 else x[:0]])
  return x[0] if x.size else np.float32(1)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([-1.0, 1.0]), st.integers(-40, 40), st.booleans()), min_size=1, max_size=64))
def test_where_products_stay_normal_every_order_gives_the_same_kind_of_answer(factors):
  # forward (numpy's loop), reversed and pairwise: finite in every order, and 0 exactly where a factor is 0
  x = np.array([0.0 if zero and i % 7 == 3 else sign * 2.0 ** e for i, (sign, e, zero) in enumerate(factors)], np.float32)
  if not products_stay_normal(x, None): return
  with np.errstate(all="ignore"):
    answers = [np.prod(x), np.prod(x[::-1]), _pairwise_product(x)]
  assert all(np.isfinite(a) for a in answers)
  assert all((a == 0) == bool(np.any(x == 0)) for a in answers)


def test_every_float_product_is_the_same_in_another_order():
  # numpy multiplies in its loop's order; the same factors reversed (a kernel's order is its own) must give the same
  # special values: an inf or NaN in one order and not the other is the order's answer, not the kernel's
  found = 0
  for r in RECIPES:
    values = evaluate(r)
    for i in r.live():
      node = r.nodes[i]
      if node.op not in ("prod", "cumprod") or values[node.srcs[0]].dtype.kind != "f": continue
      src = values[node.srcs[0]].astype(np.float32)
      axes = _axes(node.np, src.ndim)
      with np.errstate(all="ignore"):
        forward, backward = src.prod(axis=axes), np.flip(src, axis=axes).prod(axis=axes)
      assert np.array_equal(np.isnan(forward), np.isnan(backward)) and np.array_equal(np.isinf(forward), np.isinf(backward)), kc_text(r)
      found += 1
  assert found >= 15  # the generator makes float products (else this tests nothing)


def test_the_generators_ask_the_product_rule(monkeypatch):
  # with the rule refusing every product, no float prod or cumprod is generated (classic and families alike); with
  # it as it is, some are (the checks above then see them)
  from kc.tools.fuzz import classic, families
  def float_products(recipes):
    return sum(1 for r in recipes for i, v in evaluate(r).items() if i in r.live() and r.nodes[i].op in ("prod", "cumprod")
               and v.dtype.kind == "f")
  assert float_products(RECIPES) > 0
  monkeypatch.setattr(classic, "products_stay_normal", lambda x, axes: x.dtype.kind != "f")
  monkeypatch.setattr(families, "products_stay_normal", lambda x, axes: x.dtype.kind != "f")
  assert float_products([generate(case_seed(seed, i)) for seed in (11, 12, 13, 14) for i in range(400)]) == 0


ILL_CONDITIONED = {"log2": 2.0 ** -6, "log": 2.0 ** -6, "sqrt": 0.0, "recip": 0.25}


@pytest.mark.parametrize("op", sorted(ILL_CONDITIONED))
def test_ill_conditioned_ops_take_inexact_values_only_away_from_zero(op):
  # an inexact value's error is taken to scale with the largest magnitude on its way (kc.tools.fuzz.tolerance); a
  # log, square root or reciprocal of one closer to 0 than 2**-6 of that turns its error into one no bound holds
  found = 0
  for r in RECIPES:
    values = evaluate(r)
    exact = exact_nodes(r, values)
    for i in r.live():
      node = r.nodes[i]
      if node.op != op or (x := node.srcs[0]) in exact or values[x].dtype.kind != "f": continue
      scale, stack, seen = 1.0, [x], set()
      while stack:
        if (j := stack.pop()) in seen: continue
        seen.add(j)
        v = values[j]
        if v.dtype.kind == "f" and v.size: scale = max(scale, float(np.nanmax(np.abs(np.where(np.isfinite(v), v, 0)).astype(np.float64))))
        stack.extend(r.nodes[j].srcs)
      fin = values[x][np.isfinite(values[x])].astype(np.float64)
      # the values whose error such an op amplifies: a log's positive ones (of the rest NaN and -inf are exact
      # answers), a reciprocal's nonzero ones (1/0 is an inf of the zero's sign), every one of a square root's
      near = fin[fin > 0] if op in ("log", "log2") else fin[fin != 0] if op == "recip" else fin
      assert near.size == 0 or np.abs(near).min() >= max(ILL_CONDITIONED[op], 2.0 ** -6 * scale) * (1 - 1e-9), kc_text(r)
      found += 1
  assert found >= 1 or op == "log"  # (log only where the feature is drawn)


def kc_text(r) -> str:
  from kc.tools.fuzz import kc_lines
  return "\n".join(kc_lines(r))
