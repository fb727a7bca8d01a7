"""The Kernel as the hand-coded heuristics and get_optimized_ast read it.

kc.kernel.kernel.Kernel is the one class that has all of this; it imports the modules that run the heuristics and fold
the opts into the AST, so they name this protocol instead of importing the class back (an import circle)."""
from __future__ import annotations
from typing import Any, Optional, Protocol
from kc.ir.uop import UOp, sint
from kc.kernel.opt import Opt
from kc.renderer import Renderer, TensorCore
from kc.shape import ShapeTracker


class OptimizingKernel(Protocol):
  # fixed when the Kernel is made
  ast: UOp
  renderer: Renderer
  bufs: list[UOp]
  reduceops: list[UOp]
  broadcasts: list[UOp]
  full_buf_index: int
  # the optimization state as one value (a KernelState: taken with .copy() and put back to undo a step), and its fields
  state: Any
  sts: list[ShapeTracker]
  applied_opts: list[Opt]
  group_for_reduces: int
  upcasted: int
  local_dims: int
  tensor_core: Optional[TensorCore]
  dont_use_locals: bool

  @property
  def membufs(self) -> list[UOp]: ...
  @property
  def shape_len(self) -> int: ...
  @property
  def output_shape(self) -> tuple[sint, ...]: ...
  @property
  def full_shape(self) -> tuple[sint, ...]: ...
  @property
  def first_upcast(self) -> int: ...
  @property
  def full_unupcasted_shape(self) -> tuple[sint, ...]: ...
  @property
  def first_reduce(self) -> int: ...
  @property
  def reduceop(self) -> Optional[UOp]: ...
  @property
  def global_dims(self) -> int: ...
  @property
  def use_tensor_cores(self) -> int: ...
  def upcast_in_mid_reduce_axes(self) -> list[int]: ...
  def float4_axis(self, i: int) -> list[int]: ...
  def upcasted_axis(self, i: int) -> list[tuple[int, Optional[sint], bool]]: ...
  def upcast_reduces(self) -> list[bool]: ...
  def apply_opt(self, opt: Opt, append_opt: bool = True) -> None: ...
