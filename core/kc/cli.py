"""The `kc` command."""
from __future__ import annotations
import argparse, ast, sys
from typing import Optional, Sequence
import kc
from kc.errors import KcError, SymbolicError
from kc.uop import UOp, Variable

_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b}
_CMPOPS = {ast.Lt: lambda a, b: a < b, ast.Gt: lambda a, b: a > b, ast.LtE: lambda a, b: a <= b,
           ast.GtE: lambda a, b: a >= b, ast.NotEq: lambda a, b: a.ne(b), ast.Eq: lambda a, b: a.eq(b)}


def parse_expr(text: str, variables: dict[str, UOp]) -> UOp:
  """An integer expression in Python syntax (+ - * // % < <= > >= == != max min, ints, variables) as a UOp.
  `//` and `%` follow C: they truncate toward zero."""
  try: tree = ast.parse(text, mode="eval").body
  except SyntaxError as e: raise SymbolicError(f"cannot parse {text!r}: {e.msg}") from None

  def lift(x): return x if isinstance(x, UOp) else UOp.const(kc.dtypes.int32, x)

  def walk(n):
    if isinstance(n, ast.Constant) and type(n.value) is int: return lift(n.value)
    if isinstance(n, ast.Name):
      if n.id not in variables: raise SymbolicError(f"unknown variable {n.id!r}: declare it with --var {n.id}=MIN:MAX")
      return variables[n.id]
    if isinstance(n, ast.BinOp) and type(n.op) in _BINOPS: return _BINOPS[type(n.op)](lift(walk(n.left)), walk(n.right))
    if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub): return -lift(walk(n.operand))
    if isinstance(n, ast.Compare) and len(n.ops) == 1 and type(n.ops[0]) in _CMPOPS:
      return _CMPOPS[type(n.ops[0])](lift(walk(n.left)), walk(n.comparators[0]))
    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("max", "min") and len(n.args) == 2 and not n.keywords:
      a, b = lift(walk(n.args[0])), walk(n.args[1])
      return a.maximum(b) if n.func.id == "max" else a.minimum(b)
    raise SymbolicError(f"unsupported syntax in {text!r}: {ast.unparse(n)}")
  return lift(walk(tree))


def parse_var(spec: str) -> UOp:
  try:
    name, rng = spec.split("=")
    lo, hi = rng.split(":")
    return Variable(name.strip(), int(lo), int(hi))
  except ValueError: raise SymbolicError(f"--var takes NAME=MIN:MAX, got {spec!r}") from None


def cmd_simplify(args) -> int:
  variables = {v.arg[0]: v for v in map(parse_var, args.var)}
  expr = parse_expr(args.expr, variables)
  out = expr.simplify()
  print(f"input:      {expr.render(simplify=False)}")
  print(f"simplified: {out.render(simplify=False)}")
  print(f"range:      [{out.vmin}, {out.vmax}]")
  return 0


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="kc", description="kc: a pluggable kernel compiler runtime")
  p.add_argument("--version", action="version", version=f"kc {kc.__version__}")
  sub = p.add_subparsers(dest="command")
  s = sub.add_parser("simplify", help="simplify an integer index expression with kc's symbolic rules")
  s.add_argument("expr", help="e.g. '(x*4+y)//4' (// and %% truncate toward zero, as in C)")
  s.add_argument("--var", action="append", default=[], metavar="NAME=MIN:MAX", help="declare a variable and its range")
  s.set_defaults(fn=cmd_simplify)
  return p


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  if not getattr(args, "fn", None):
    parser.print_help()
    return 0
  try: return args.fn(args)
  except KcError as e:
    print(f"kc: error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
