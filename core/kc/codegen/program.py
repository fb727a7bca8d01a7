"""From an optimized kernel AST to a Program: lower -> graph rewrites -> linearize -> render.

The Kernel (kc.kernel) drives this layer: its get_optimized_ast folds the applied opts into the AST, and its
linearize and to_program call linearize_ast and render_program here with that AST and its renderer. Nothing here
needs the Kernel itself, so the kernel layer sits above this one and imports it."""
from __future__ import annotations
import contextlib, gc, threading
from kc.errors import InvalidASTError, KernelOptError
from kc.config import debug_level
from kc.codegen.verify import st_arg
from kc.codegen.graph import rewrite_lowered
from kc.codegen.linearize import linearize
from kc.codegen.lower import lower
from kc.renderer import Program, Renderer
from kc.ir.uop import Ops, UOp


_pause_lock = threading.Lock()
_pauses = 0  # codegen calls in progress, in any thread, under one pause of the cyclic collector
_resume = False  # whether the collector was on when the first of them began


@contextlib.contextmanager
def collector_paused():
  """The cyclic garbage collector off while codegen runs, and on again (if it was on) when the last codegen call in
  progress returns. Codegen keeps tens of thousands of UOps and memo entries alive until it returns, and as they
  pile up the collector's automatic runs walk them, and the whole heap besides, again and again (an eighth to a
  third of an AVX-512 conv2d's codegen time) to find nothing: UOps form no cycles (their memo entries refer to other
  UOps, never back; the passes cache no toposort on the graphs they drop), so reference counting frees what
  codegen drops."""
  global _pauses, _resume
  with _pause_lock:
    if _pauses == 0: _resume = gc.isenabled()
    _pauses += 1
    gc.disable()
  try: yield
  finally:
    with _pause_lock:
      _pauses -= 1
      if _pauses == 0 and _resume: gc.enable()


def linearize_ast(optimized: UOp, renderer: Renderer) -> list[UOp]:
  """The linear UOps of an optimized kernel AST (Kernel.get_optimized_ast) for `renderer`."""
  with collector_paused(): return linearize(rewrite_lowered(lower(optimized, renderer), renderer))


def mem_estimate(ast: UOp) -> int:
  """Bytes of global memory a launch touches: for each buffer and direction, the most any view addresses."""
  most: dict[tuple, int] = {}
  for u in ast.toposort:
    if u.op in (Ops.LOAD, Ops.STORE) and u.src[0].op is Ops.DEFINE_GLOBAL:
      key = (u.op, u.src[0].arg)
      size = st_arg(u).real_size()
      nbytes = u.src[0].dtype.base.itemsize * (size if isinstance(size, int) else int(size.vmax))
      most[key] = max(most.get(key, 0), nbytes)
  return sum(most.values())


def render_program(optimized: UOp, renderer: Renderer, name: str, ast: UOp) -> Program:
  """The Program named `name` (a function name, kc.codegen.naming.to_function_name) of an optimized kernel AST:
  lowered, linearized and rendered by `renderer`. `ast` is the kernel's AST before optimization, whose views say
  how much memory a launch touches."""
  with collector_paused():
    uops = linearize_ast(optimized, renderer)
    if debug_level() >= 5: print_uops(name, uops)
    src = renderer.render(name, uops)
  if debug_level() >= 4: print(src)
  prg = Program(name, src, renderer.device, uops, mem_estimate=mem_estimate(ast))
  _check_launch_limits(prg, renderer)
  check_argument_count(len(prg.globals), len(prg.vars), renderer)
  return prg


def check_argument_count(buffers: int, variables: int, renderer) -> None:
  """An InvalidASTError where a kernel of this many buffers and Variables (those it reads) takes more arguments than
  the renderer's max_kernel_args: its device could not launch it."""
  if (most := getattr(renderer, "max_kernel_args", None)) is None or (n := buffers + variables) <= most: return
  raise InvalidASTError(f"the kernel takes {n} arguments ({buffers} buffers and {variables} Variables), more than "
                        f"the {most} that {type(renderer).__name__}'s kernels can take (max_kernel_args): compute it "
                        "in kernels of fewer inputs")


def print_uops(name: str, uops: list[UOp]) -> None:
  """One line per UOp: position, op, dtype, the positions of its sources, arg."""
  pos = {u: i for i, u in enumerate(uops)}
  print(f"{name}: {len(uops)} uops")
  for i, u in enumerate(uops):
    dtype_name = str(u.dtype.name if hasattr(u.dtype, 'name') else u.dtype)
    print(f"{i:4d} {u.op.name:14s} {dtype_name:16s} {[pos.get(s, '-') for s in u.src]!s:24s} {u.arg!r}")


def _check_launch_limits(prg: Program, renderer) -> None:
  """Launch sizes never exceed what the renderer declared: an invariant of get_grouped_dims, checked here."""
  for sizes, limits, what in ((prg.global_size, renderer.global_max, "global"), (prg.local_size, renderer.local_max, "local")):
    if sizes is None or limits is None: continue
    for s, m in zip(sizes, limits):
      top = s if isinstance(s, int) else int(s.vmax)
      if top > m: raise KernelOptError(f"{prg.name}: {what} size {sizes} exceeds the renderer's {what}_max {limits}")


