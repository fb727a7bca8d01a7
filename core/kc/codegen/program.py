"""From an optimized Kernel to a Program: get_optimized_ast -> lower -> graph rewrites -> linearize -> render.

This module sits above lower/linearize and above the renderer it calls. The kernel layer's Kernel only holds the
optimization state; the Kernel here (kc.Kernel) is that class with the steps of this layer added: linearize and
to_program."""
from __future__ import annotations
from typing import Optional
from kc.errors import KernelOptError
from kc.config import debug_level
from kc.kernel import kernel
from kc.kernel.naming import to_function_name
from kc.kernel.verify import st_arg
from kc.codegen.graph import rewrite_lowered
from kc.codegen.linearize import linearize
from kc.codegen.lower import lower
from kc.renderer import Program
from kc.ir.uop import Ops, UOp


def linearize_kernel(k: kernel.Kernel) -> list[UOp]:
  """The linear UOps of a Kernel with its applied opts."""
  return linearize(rewrite_lowered(lower(k.get_optimized_ast(), k.opts), k.opts))


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


def to_program(k: kernel.Kernel, name_override: Optional[str] = None) -> Program:
  """The Program of a Kernel with its applied opts: lowered, linearized and rendered by its renderer (`k.opts`)."""
  uops = linearize_kernel(k)
  name = to_function_name(name_override if name_override is not None else k.name)
  if debug_level() >= 5: print_uops(name, uops)
  src = k.opts.render(name, uops)
  if debug_level() >= 4: print(src)
  prg = Program(name, src, k.opts.device, uops, mem_estimate=mem_estimate(k.ast))
  _check_launch_limits(prg, k.opts)
  return prg


def print_uops(name: str, uops: list[UOp]) -> None:
  """One line per UOp: position, op, dtype, the positions of its sources, arg."""
  pos = {u: i for i, u in enumerate(uops)}
  print(f"{name}: {len(uops)} uops")
  for i, u in enumerate(uops):
    print(f"{i:4d} {u.op.name:14s} {str(u.dtype.name if hasattr(u.dtype, 'name') else u.dtype):16s} {[pos.get(s, '-') for s in u.src]!s:24s} {u.arg!r}")


def _check_launch_limits(prg: Program, renderer) -> None:
  """Launch sizes never exceed what the renderer declared: an invariant of get_grouped_dims, checked here."""
  for sizes, limits, what in ((prg.global_size, renderer.global_max, "global"), (prg.local_size, renderer.local_max, "local")):
    if sizes is None or limits is None: continue
    for s, m in zip(sizes, limits):
      top = s if isinstance(s, int) else int(s.vmax)
      if top > m: raise KernelOptError(f"{prg.name}: {what} size {sizes} exceeds the renderer's {what}_max {limits}")



class Kernel(kernel.Kernel):
  """kc.Kernel: a kernel under optimization (every opt of the kernel layer's Kernel) that also builds its Program."""

  def linearize(self) -> list[UOp]:
    """The linear UOps of this kernel with its applied opts, as the renderer receives them."""
    return linearize_kernel(self)

  def to_program(self, name_override: Optional[str] = None) -> Program:
    """The kc.Program of this kernel with its applied opts: lowered, linearized and rendered by `opts`."""
    return to_program(self, name_override)
