"""Integer folding where values wrap: the comparison and division rules reason about y from y*k, y+k, ... only where
those cannot wrap. The oracle evaluates the tree on Python ints and wraps every node to its dtype (C's and numpy's
two's-complement arithmetic), independent of kc's evaluator, over every value of a narrow variable."""
import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st
import kc
from kc import ast as A, dtypes
from kc.ir.uop import UOp

DTYPES = [dtypes.int8, dtypes.uint8, dtypes.int16]


def wrap(dtype, v: int) -> int:
  bits = 8 * dtype.itemsize
  lo = 0 if dtypes.is_unsigned(dtype) else -(1 << (bits - 1))
  return (v - lo) % (1 << bits) + lo


def c_div(p, q):
  r = abs(p) // abs(q)
  return r if (p >= 0) == (q > 0) else -r


def ref_eval(t, x: int, dtype):
  if isinstance(t, str): return x
  if isinstance(t, int): return wrap(dtype, t)
  op, *args = t
  v = [ref_eval(a, x, dtype) for a in args]
  if op in ("<", "!=", "=="): return {"<": v[0] < v[1], "!=": v[0] != v[1], "==": v[0] == v[1]}[op]
  r = {"+": lambda: v[0] + v[1], "-": lambda: v[0] - v[1], "*": lambda: v[0] * v[1],
       "//": lambda: c_div(v[0], v[1]), "%": lambda: v[0] - v[1] * c_div(v[0], v[1])}[op]()
  return wrap(dtype, r)


def to_uop(t, var: UOp):
  if isinstance(t, str): return var
  if isinstance(t, int): return UOp.const(var.dtype, wrap(var.dtype, t))
  op, *args = t
  a = [to_uop(s, var) for s in args]
  return {"+": lambda: a[0] + a[1], "-": lambda: a[0] - a[1], "*": lambda: a[0] * a[1], "//": lambda: a[0] // a[1],
          "%": lambda: a[0] % a[1], "<": lambda: a[0] < a[1], "!=": lambda: a[0].ne(a[1]),
          "==": lambda: a[0].ne(a[1]).ne(UOp.const(dtypes.bool, True))}[op]()


consts = st.sampled_from([1, 2, 3, 5, 7, 85, 127, 128, 255, -1, -3, -128])
nonzero = consts
values = st.recursive(st.one_of(st.just("x"), consts),
                      lambda c: st.one_of(st.tuples(st.sampled_from(["+", "-", "*"]), c, consts),
                                          st.tuples(st.sampled_from(["//", "%"]), c, nonzero)), max_leaves=4)
trees = st.tuples(st.sampled_from(["<", "!=", "=="]), values, st.one_of(consts, st.integers(-300, 300)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(DTYPES), trees)
def test_folded_comparisons_of_wrapping_values_are_exact(dtype, tree):
  lo, hi = dtypes.min(dtype), dtypes.max(dtype)
  var = UOp.variable("x", lo, hi, dtype)
  op, lhs, rhs = tree
  rhs = wrap(dtype, rhs)
  simple = to_uop((op, lhs, rhs), var).simplify()
  xs = range(lo, hi + 1) if hi - lo < 512 else range(lo, hi + 1, 97)
  for x in xs:
    want = ref_eval((op, lhs, rhs), x, dtype)
    got = kc.sym_infer(simple, {var: x})
    assert got == want, f"{simple.render(simplify=False)} at x={x}: {got} != {want} ({tree}, {dtype})"


def test_a_wrapped_product_compared_with_a_constant_matches_numpy():
  # int8: -85 * 3 = -255 wraps to 1, so x*3 != 1 is False there (it was folded to True: 1 % 3 != 0)
  x = A.arg(1, dtypes.int8, (4,))
  data = np.array([-85, 1, 2, 43], np.int8)
  for device in ("EMU", "CLANG"):
    out = kc.run(A.sink(A.store(0, (x * 3) != 1)), {1: data}, device=device)[0]
    np.testing.assert_array_equal(out, (data * np.int8(3)) != 1)
    out = kc.run(A.sink(A.store(0, (x * 3) < 2)), {1: data}, device=device)[0]
    np.testing.assert_array_equal(out, (data * np.int8(3)) < 2)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(DTYPES), values)
def test_folded_wrapping_values_are_exact(dtype, tree):
  lo, hi = dtypes.min(dtype), dtypes.max(dtype)
  var = UOp.variable("x", lo, hi, dtype)
  simple = to_uop(tree, var).simplify()
  for x in (range(lo, hi + 1) if hi - lo < 512 else range(lo, hi + 1, 97)):
    want = ref_eval(tree, x, dtype)
    got = kc.sym_infer(simple, {var: x})
    assert got == want, f"{simple.render(simplify=False)} at x={x}: {got} != {want} ({tree}, {dtype})"
