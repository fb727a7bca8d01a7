import pytest
from kc import Ops, UOp, UPat, PatternMatcher, graph_rewrite, Variable, dtypes, RewriteError, UOpError
from kc.ir.rewrite import _Rewriter

x, y = Variable("x", 0, 10), Variable("y", 0, 10)
c2 = UOp.const(dtypes.int32, 2)


def names(matches): return [{k: v for k, v in m.items()} for m in matches]


def test_match_op_dtype_arg():
  assert UPat(Ops.ADD).match(x + y, {}) == [{}]
  assert UPat((Ops.ADD, Ops.MUL)).match(x * y, {}) == [{}]
  assert UPat(Ops.ADD).match(x * y, {}) == []
  assert UPat(dtype=dtypes.int32).match(x, {}) == [{}] and UPat(dtype=dtypes.float32).match(x, {}) == []
  assert UPat(Ops.CONST, arg=2).match(c2, {}) == [{}] and UPat(Ops.CONST, arg=3).match(c2, {}) == []
  v4 = UOp(Ops.VECTORIZE, dtypes.int32.vec(4), (x,) * 4)
  assert UPat(dtype=dtypes.int32, name="v").match(v4, {}) == [{"v": v4}]  # a vector matches its scalar dtype


def test_match_ordered_and_permuted_sources():
  e = x + c2
  ordered = UPat(Ops.ADD, src=(UPat(Ops.CONST, name="c"), UPat(name="v")))
  assert ordered.match(e, {}) == []
  permuted = UPat(Ops.ADD, src=[UPat(Ops.CONST, name="c"), UPat(name="v")])
  assert permuted.match(e, {}) == [{"c": c2, "v": x}]
  both = UPat(Ops.ADD, src=[UPat(name="a"), UPat(name="b")]).match(x + y, {})
  assert {(m["a"], m["b"]) for m in both} == {(x, y), (y, x)}


def test_a_name_used_twice_must_bind_the_same_uop():
  p = UPat(Ops.ADD, src=(UPat(name="a"), UPat(name="a")))
  assert p.match(x + x, {}) == [{"a": x}] and p.match(x + y, {}) == []


def test_each_source_and_any_len_and_alternatives():
  all_const = UPat(Ops.ADD, src=UPat(Ops.CONST))
  assert all_const.match(c2 + c2, {}) == [{}] and all_const.match(x + c2, {}) == []
  prefix = UPat(Ops.WHERE, src=(UPat(name="c"),), allow_any_len=True)
  w = (x < 3).where(x, y)
  assert prefix.match(w, {}) == [{"c": x < 3}]
  alt = UPat.any(UPat(Ops.MUL, name="m"), UPat(Ops.ADD, name="m"))
  assert alt.match(x + y, {}) == [{"m": x + y}] and alt.match(x // 2, {}) == []


def test_operator_built_patterns():
  p = UPat.var("a") * 1
  assert p.match(x * 1, {}) == [{"a": x}] and p.match(UOp(Ops.MUL, dtypes.int32, (UOp.const(dtypes.int32, 1), x)), {}) == [{"a": x}]


def test_pattern_matcher_dispatch_first_rule_wins():
  seen = []
  pm = PatternMatcher([
    (UPat(Ops.MUL, name="m"), lambda m: seen.append("mul") or None),  # declines
    (UPat(Ops.MUL, src=(UPat(name="a"), UPat(Ops.CONST, arg=2))), lambda a: a + a),
    (UPat(Ops.MUL, name="m"), lambda m: m.src[0]),
  ])
  assert pm.rewrite(x * 2) is x + x and seen == ["mul"]
  assert pm.rewrite(x + 2) is None  # no rules for ADD: dispatch by op, not a scan
  assert Ops.ADD not in pm.pdict


def test_ctx_is_passed_to_callbacks_that_ask():
  pm = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda ctx, v: ctx.get(v))])
  assert graph_rewrite(x + y, pm, ctx={x: c2}) is c2 + y


def test_graph_rewrite_reaches_a_fixed_point_bottom_up():
  # x*2 -> x+x and x+x -> (x<<1): each replacement is rewritten again
  pm = PatternMatcher([
    (UPat(Ops.MUL, src=(UPat(name="a"), UPat(Ops.CONST, arg=2))), lambda a: a + a),
    (UPat(Ops.ADD, src=(UPat(name="a"), UPat(name="a"))), lambda a: a << 1),
  ])
  e = (x * 2) * 2
  assert graph_rewrite(e, pm) is (x << 1) << 1


def test_rewrite_cycle_is_an_error_not_a_hang():
  pm = PatternMatcher([
    (UPat(Ops.ADD, src=(UPat(name="a"), UPat(name="b"))), lambda a, b: UOp(Ops.MUL, a.dtype, (a, b))),
    (UPat(Ops.MUL, src=(UPat(name="a"), UPat(name="b"))), lambda a, b: UOp(Ops.ADD, a.dtype, (a, b))),
  ])
  with pytest.raises(RewriteError, match="cycle"): graph_rewrite(x + y, pm)


def test_runaway_growth_is_an_error(monkeypatch):
  monkeypatch.setattr(_Rewriter, "MAX_STEPS", 500)
  pm = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda v: UOp.variable(v.arg[0] + "'", 0, 1))])
  with pytest.raises(RewriteError, match="without end"): graph_rewrite(x, pm)


def test_callbacks_must_return_uops():
  pm = PatternMatcher([(UPat(Ops.DEFINE_VAR), lambda: 3)])
  with pytest.raises(RewriteError, match="not a UOp"): graph_rewrite(x, pm)
  with pytest.raises(UOpError): PatternMatcher([("not a pattern", lambda: None)])


def test_deep_graphs_fall_back_to_iteration():
  e = x
  for _ in range(3000): e = UOp(Ops.ADD, dtypes.int32, (e, UOp.const(dtypes.int32, 1)))
  pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat(Ops.ADD, src=(UPat(name="a"), UPat(Ops.CONST, name="c1"))), UPat(Ops.CONST, name="c2"))),
                        lambda a, c1, c2: a + (c1.arg + c2.arg))])
  out = graph_rewrite(e, pm)
  assert out.src[0] is x and out.src[1].op is Ops.CONST


def test_memoizing_matcher_reuses_results_across_calls():
  calls = []
  pm = PatternMatcher([(UPat(Ops.MUL, src=(UPat(name="a"), UPat(Ops.CONST, arg=1))), lambda a: calls.append(a) or a)], memoize=True)
  e = (x * 1) + (y * 1)
  assert graph_rewrite(e, pm) is x + y and len(calls) == 2
  assert graph_rewrite(e, pm) is x + y and graph_rewrite((x * 1) * 3, pm) is x * 3 and len(calls) == 2
  # with a ctx the rules may depend on it: no memo
  graph_rewrite(e, pm, ctx=object())
  assert len(calls) == 4


def test_one_way_patterns_match_exactly_as_the_general_matcher():
  """Patterns without permutations or alternatives get an in-place matcher: it must agree with the general one on
  every rule kc has and on every node of some real graphs (index math, lowered kernels)."""
  from kc.ir.rewrite import _compile_single
  from kc.codegen.graph import simplify_all, lowered_rules
  from kc.codegen.transcendental import transcendental_rules
  from kc import ast as A, Kernel
  from kc.codegen.lower import lower
  from target_renderers import LimitsRenderer
  pats = [p for p, _ in simplify_all.patterns + transcendental_rules(frozenset())]
  pats += [p for p, _ in lowered_rules(frozenset(), None).patterns]
  cpu = LimitsRenderer(has_local=False, has_shared=False, global_max=None, local_max=None)
  xs = A.arg(1, dtypes.float32, (8, 16))
  k = Kernel(A.sink(A.store(0, (xs - xs.max(1, keepdims=True)).exp2().sum(1))), cpu).hand_coded_optimizations()
  nodes = list(lower(k.get_optimized_ast(), cpu).toposort)
  nodes += list((((x * 4 + y) // 8) % 3 + (x < 5).where(x, y * 2) - 7).toposort) + [x + x, c2 * 1, x + 0, (x < y).ne(True)]
  singles = 0
  for p in pats:
    if (single := _compile_single(p)) is None: continue
    singles += 1
    for u in nodes:
      store: dict = {}
      want = p.match(u, {})
      assert len(want) <= 1, p
      assert single(u, store) == bool(want) and (not want or store == want[0]), (p, u.op)
  assert singles > 20  # most rules are of this kind
