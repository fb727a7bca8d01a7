"""The rewrite engine: UPat patterns, PatternMatcher (dispatch by op) and graph_rewrite (fixed point).

kc's rule-based rewrites all run through this engine: symbolic simplification (ir/symbolic.py, behind
UOp.simplify, which the lowering calls on the indices and gates it builds) and the one walk over a lowered kernel in
codegen/graph.py (simplification, dead-gate removal, the ops a renderer lacks such as transcendentals, and the
renderer's own extra_matcher). Lowering itself (codegen/lower.py) is no set of rules: it is a direct walk of the
optimized AST that unrolls upcast axes as it goes, and the folding of scalar accesses into vector ones
(codegen/graph.py) is a direct walk too."""
from __future__ import annotations
import inspect, itertools
from typing import Any, Callable, Iterable, Optional, Union
from kc.ir.dtype import DType
from kc.errors import RewriteError, UOpError
from kc.ir.uop import GroupOp, Ops, UOp

_ANY = object()  # "match any arg"; None is a real arg value in the IR
_MEMO_IDS = itertools.count()


class UPat:
  """A pattern over UOps.

  op:    an Ops, a set/tuple of Ops, or None for any op
  dtype: a DType or a tuple of them, or None for any; a vector UOp matches its scalar type too
  src:   None (any sources); a tuple (sources in that order); a list (the sources in any order: for
         commutative ops); or one UPat that every source must match
  arg:   the exact arg to match (any arg when not given)
  name:  bind the matched UOp to this name for the callback; a name used twice must bind the same UOp
  """
  __slots__ = ("op", "dtype", "src", "arg", "name", "allow_any_len", "alternatives", "early_reject", "_src_mode", "_matcher")

  def __init__(self, op: Union[Ops, Iterable[Ops], None] = None, dtype: Union[DType, Iterable[DType], None] = None,
               src: Union[tuple, list, "UPat", None] = None, arg: Any = _ANY, name: Optional[str] = None,
               allow_any_len: bool = False, alternatives: Optional[tuple["UPat", ...]] = None):
    self.op: Optional[frozenset] = None if op is None else frozenset((op,) if isinstance(op, Ops) else op)
    self.dtype: Optional[frozenset] = None if dtype is None else frozenset((dtype,) if isinstance(dtype, DType) else dtype)
    self.arg, self.name, self.allow_any_len, self.alternatives = arg, name, allow_any_len, alternatives
    self._matcher: Optional[Callable] = None
    if src is None: self._src_mode = None
    elif isinstance(src, UPat): self._src_mode = "each"
    elif isinstance(src, list): self._src_mode = "permute"
    elif isinstance(src, tuple): self._src_mode = "ordered"
    else: raise UOpError(f"UPat src must be None, a UPat, a tuple or a list, got {type(src).__name__}")
    self.src = src
    # ops that must appear among the direct sources: a cheap test that rejects most candidates at once
    fixed = [] if src is None or isinstance(src, UPat) else [p.op for p in src if p.op is not None and len(p.op) == 1]
    self.early_reject = frozenset(next(iter(o)) for o in fixed)

  # ***** constructors *****

  @staticmethod
  def var(name: Optional[str] = None, dtype=None) -> "UPat": return UPat(dtype=dtype, name=name)

  @staticmethod
  def cvar(name: Optional[str] = None, dtype=None) -> "UPat": return UPat(Ops.CONST, dtype, name=name)

  @staticmethod
  def const(dtype, value) -> "UPat": return UPat(Ops.CONST, dtype, arg=value)

  @staticmethod
  def any(*alternatives: "UPat", name: Optional[str] = None) -> "UPat":
    """Matches when any of the alternatives matches (each tried in order)."""
    return UPat(name=name, alternatives=tuple(alternatives))

  def named(self, name: str) -> "UPat":
    return UPat(self.op, self.dtype, self.src, self.arg, name, self.allow_any_len, self.alternatives)

  # ***** building patterns with operators, like UOps *****

  def _alu(self, op: Ops, *src: "UPat") -> "UPat":
    pats = [self, *(s if isinstance(s, UPat) else UPat.const(None, s) for s in src)]
    return UPat(op, src=pats if op in GroupOp.Commutative else tuple(pats))

  def __add__(self, x): return self._alu(Ops.ADD, x)
  def __radd__(self, x): return self._alu(Ops.ADD, x)
  def __mul__(self, x): return self._alu(Ops.MUL, x)
  def __rmul__(self, x): return self._alu(Ops.MUL, x)
  def __floordiv__(self, x): return self._alu(Ops.IDIV, x)
  def __mod__(self, x): return self._alu(Ops.MOD, x)
  def __lt__(self, x): return self._alu(Ops.CMPLT, x)
  def __and__(self, x): return self._alu(Ops.AND, x)
  def __or__(self, x): return self._alu(Ops.OR, x)
  def ne(self, x): return self._alu(Ops.CMPNE, x)
  def maximum(self, x): return self._alu(Ops.MAX, x)
  def where(self, a, b): return self._alu(Ops.WHERE, a, b)

  def __repr__(self):
    ops = None if self.op is None else "{" + ", ".join(sorted(o.name for o in self.op)) + "}"
    return f"UPat({ops}, name={self.name!r}, src={self.src!r})"

  # ***** matching *****

  def match(self, uop: UOp, store: dict[str, UOp]) -> list[dict[str, UOp]]:
    """Every way this pattern matches `uop`, each as the bindings `store` extended with this pattern's names."""
    if self._matcher is None: self._matcher = _compile(self)
    return self._matcher(uop, store)


_NO_MATCH: list = []


def _node_test(p: UPat) -> Callable[[UOp], bool]:
  """The test of a pattern's own op, dtype and arg on one UOp (its sources and name are the matcher's business)."""
  ops, dts, arg = p.op, p.dtype, p.arg
  any_arg = arg is _ANY
  def fits(u: UOp) -> bool:
    if ops is not None and u.op not in ops: return False
    if dts is not None and u.dtype not in dts and u.dtype.scalar() not in dts: return False
    return any_arg or arg == u.arg
  return fits


def _compile(p: UPat) -> Callable[[UOp, dict], list]:
  """A closure that matches one UPat. The checks a pattern does not need are left out of its closure, since
  matching runs for every node of every rewrite."""
  if p.alternatives is not None:
    alts = [_compile(a) for a in p.alternatives]
    name = p.name
    def match_any(u, store):
      out = [m for alt in alts for m in alt(u, store)]
      return [b for m in out for b in _bind(name, u, m)] if name is not None else out
    return match_any
  name, mode = p.name, p._src_mode
  fits = _node_test(p)

  def head(u, store):
    """The checks on the node itself; the bindings after them, or None."""
    if not fits(u): return None
    if name is not None:
      bound = store.get(name)
      if bound is None: return {**store, name: u}
      if bound is not u: return None
    return store

  if mode is None:
    def match_leaf(u, store):
      st = head(u, store)
      return _NO_MATCH if st is None else [st]
    return match_leaf
  if mode == "each":
    each = _compile(p.src)
    def match_each(u, store):
      st = head(u, store)
      if st is None: return _NO_MATCH
      stores = [st]
      for s in u.src:
        stores = [m for x in stores for m in each(s, x)]
        if not stores: break
      return stores
    return match_each
  subs = [_compile(x) for x in p.src]
  n, any_len = len(subs), p.allow_any_len
  orders = [subs] if mode == "ordered" else [list(o) for o in itertools.permutations(subs)]
  def match_src(u, store):
    src = u.src
    if len(src) != n and not (any_len and len(src) >= n): return _NO_MATCH
    st = head(u, store)
    if st is None: return _NO_MATCH
    out: list = []
    for order in orders:
      stores = [st]
      for sub, s in zip(order, src):
        stores = [m for x in stores for m in sub(s, x)]
        if not stores: break
      out.extend(stores)
    return out
  return match_src


def _compile_single(p: UPat) -> Optional[Callable[[UOp, dict], bool]]:
  """For a pattern that can match a UOp in at most one way (no source permutations, no alternatives anywhere in it):
  a test that fills `store` with the bindings in place and says whether it matched. None for other patterns, which
  keep the list-of-bindings matcher. Most rules are of this kind, and most tests fail: no lists, no copies."""
  if p.alternatives is not None or p._src_mode == "permute": return None
  subs: list = []
  if p._src_mode == "each": subs = [_compile_single(p.src)]
  elif p._src_mode == "ordered": subs = [_compile_single(x) for x in p.src]
  if any(x is None for x in subs): return None
  name, mode, n, any_len = p.name, p._src_mode, len(subs), p.allow_any_len
  fits = _node_test(p)

  def match(u: UOp, store: dict) -> bool:
    if not fits(u): return False
    if name is not None:
      bound = store.get(name)
      if bound is None: store[name] = u
      elif bound is not u: return False
    if mode is None: return True
    if mode == "each":
      each = subs[0]
      for s in u.src:
        if not each(s, store): return False
      return True
    src = u.src
    if len(src) != n and not (any_len and len(src) >= n): return False
    for sub, s in zip(subs, src):
      if not sub(s, store): return False
    return True
  return match


def _bind(name: str, uop: UOp, store: dict) -> list[dict]:
  bound = store.get(name)
  if bound is None: return [{**store, name: uop}]
  return [store] if bound is uop else []


def _wants_ctx(fxn: Callable) -> bool:
  try: return "ctx" in inspect.signature(fxn).parameters
  except (TypeError, ValueError): return False


class PatternMatcher:
  """An ordered list of (UPat, callback) rules, dispatched by the op of the UOp being rewritten.

  A callback gets the pattern's named bindings as keyword arguments (and `ctx` if it declares it) and
  returns a replacement UOp, or None to decline. The first rule whose callback returns a new UOp wins."""

  def __init__(self, patterns: list[tuple[UPat, Callable]], memoize: bool = False, _parts: Optional[list["PatternMatcher"]] = None):
    """memoize: the rules are pure functions of the UOp (no ctx, no outside state), so a rewritten result can be
    remembered on the UOp itself and reused by every later graph_rewrite with this matcher."""
    self.patterns = list(patterns)
    self.memo_key: Optional[str] = f"_rw{next(_MEMO_IDS)}" if memoize else None
    # a sum of matchers keeps its parts: a UOp that an earlier rewrite found to be a fixed point of a memoizing part
    # (its sources unchanged since) needs none of that part's rules tried again
    self.parts: list[PatternMatcher] = _parts if _parts is not None else [self]
    # op -> [(memo key of the part, [(pattern, callback, ops its sources must include, wants ctx), ...]), ...]
    self.pdict: dict[Ops, list[tuple[Optional[str], list[tuple[UPat, Callable, frozenset, bool]]]]] = {}
    for part in self.parts:
      by_op: dict[Ops, list] = {}
      for pat, fxn in part.patterns:
        if not isinstance(pat, UPat) or not callable(fxn): raise UOpError(f"a rule is (UPat, callable), got ({pat!r}, {fxn!r})")
        single = _compile_single(pat)
        for op in _pattern_ops(pat): by_op.setdefault(op, []).append((pat, fxn, pat.early_reject, _wants_ctx(fxn), single))
      for op, rules in by_op.items(): self.pdict.setdefault(op, []).append((part.memo_key, rules))

  def __add__(self, other: "PatternMatcher") -> "PatternMatcher":
    """Both rule lists, this one's first; the sum memoizes when both parts are pure."""
    return PatternMatcher(self.patterns + other.patterns, memoize=self.memo_key is not None and other.memo_key is not None,
                          _parts=self.parts + other.parts)

  def rewrite(self, uop: UOp, ctx: Any = None) -> Optional[UOp]:
    """One step: the replacement that the first applicable rule gives for `uop`, or None."""
    segments = self.pdict.get(uop.op)
    if not segments: return None
    src_ops = None
    known = uop.__dict__
    for part_key, rules in segments:
      if part_key is not None and known.get(part_key) is True: continue
      for pat, fxn, early, wants_ctx, single in rules:
        if early:
          if src_ops is None: src_ops = {s.op for s in uop.src}
          if not early <= src_ops: continue
        if single is not None:
          if not single(uop, store := {}): continue
          matches: list = [store]
        else: matches = pat.match(uop, {})
        for bindings in matches:
          ret = fxn(ctx=ctx, **bindings) if wants_ctx else fxn(**bindings)
          if ret is not None and ret is not uop:
            if type(ret) is not UOp: raise RewriteError(f"the rule for {pat!r} returned {type(ret).__name__} {ret!r}, not a UOp or None")
            return ret
    return None


def _pattern_ops(pat: UPat) -> Iterable[Ops]:
  if pat.alternatives is not None:
    return {op for alt in pat.alternatives for op in _pattern_ops(alt)}
  return pat.op if pat.op is not None else list(Ops)


def graph_rewrite(sink: UOp, pm: PatternMatcher, ctx: Any = None) -> UOp:
  """Rewrite the graph under `sink` to a fixed point: sources first, then the node, and every replacement is
  itself rewritten until no rule applies. Each distinct UOp is rewritten once (memoised). Rules that undo
  each other raise RewriteError instead of looping."""
  return _Rewriter(pm, ctx).run(sink)


_IN_PROGRESS: Any = object()  # the mark of a UOp whose rewrite has started and not finished: meeting it again is a cycle


class _Rewriter:
  # the most rewrite steps one graph_rewrite may take: far above any real graph, low enough to stop a runaway rule set
  MAX_STEPS = 1_000_000

  def __init__(self, pm: PatternMatcher, ctx: Any):
    self.pm, self.ctx = pm, ctx
    self.done: dict[UOp, UOp] = {}
    self.steps = 0
    self.memo_key = pm.memo_key if ctx is None else None

  def remembered(self, node: UOp) -> Optional[UOp]:
    """The result an earlier graph_rewrite with a memoizing matcher left on `node`."""
    if self.memo_key is None or (ret := node.__dict__.get(self.memo_key)) is None: return None
    ret = node if ret is True else ret
    self.done[node] = ret
    return ret

  def finish(self, node: UOp, ret: UOp) -> None:
    self.done[node] = ret
    if self.memo_key is not None:
      node.__dict__[self.memo_key] = True if ret is node else ret  # True, not a reference to itself: no cycle to collect
      ret.__dict__[self.memo_key] = True

  def run(self, sink: UOp) -> UOp:
    # recursion is the fast path; a graph too deep for Python's stack continues iteratively from the same memo
    try: return self.rewrite_recursive(sink)
    except RecursionError:
      for node in [n for n, r in self.done.items() if r is _IN_PROGRESS]: del self.done[node]
      return self.rewrite_iterative(sink)

  def cycle(self, node: UOp) -> RewriteError:
    return RewriteError(f"rules rewrite {node.op} back into itself (a rewrite cycle); the rules undo each other:\n{node.render(simplify=False)}")

  def step(self) -> None:
    self.steps += 1
    if self.steps > self.MAX_STEPS: raise RewriteError(f"graph_rewrite took more than {self.MAX_STEPS} steps: the rules grow the graph without end")

  def rewrite_recursive(self, node: UOp) -> UOp:
    if (ret := self.done.get(node)) is not None:
      if ret is _IN_PROGRESS: raise self.cycle(node)
      return ret
    if self.memo_key is not None and (ret := node.__dict__.get(self.memo_key)) is not None:
      ret = self.done[node] = node if ret is True else ret
      return ret
    self.done[node] = _IN_PROGRESS
    new_src = tuple([self.rewrite_recursive(s) for s in node.src])
    if new_src == node.src:  # element-wise identity: UOps are hash-consed
      repl = self.pm.rewrite(node, self.ctx)
      if repl is None: ret = node
      else:
        self.step()
        ret = self.rewrite_recursive(repl)
    else:
      self.step()
      ret = self.rewrite_recursive(UOp(node.op, node.dtype, new_src, node.arg))
    self.finish(node, ret)
    return ret

  def rewrite_iterative(self, sink: UOp) -> UOp:
    done = self.done
    # stack entries: (uop, stage, replacement); stage 0 = visit sources, 1 = rewrite the node, 2 = adopt the replacement's result
    stack: list[tuple[UOp, int, Optional[UOp]]] = [(sink, 0, None)]
    while stack:
      node, stage, repl = stack.pop()
      if stage == 0:
        if (ret := done.get(node)) is _IN_PROGRESS: raise self.cycle(node)
        if ret is not None or self.remembered(node) is not None: continue
        done[node] = _IN_PROGRESS
        stack.append((node, 1, None))
        stack.extend((s, 0, None) for s in reversed(node.src))
      elif stage == 1:
        new_src = tuple(done[s] for s in node.src)
        if new_src == node.src:
          repl = self.pm.rewrite(node, self.ctx)
          if repl is None:
            self.finish(node, node)
            continue
        else:
          repl = UOp(node.op, node.dtype, new_src, node.arg)
        self.step()
        stack.append((node, 2, repl))
        stack.append((repl, 0, None))
      else:
        self.finish(node, done[repl])
    return done[sink]
