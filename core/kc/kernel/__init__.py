"""The kernel layer: the Kernel (one kernel AST under optimization for one renderer), its opts, the hand-coded
heuristics, tensor cores and get_optimized_ast. The Kernel calls down into the codegen layer for its linear UOps
and its Program (linearize, to_program)."""
from kc.kernel.opt import Opt, OptOps
from kc.kernel.kernel import Kernel, KernelState, TensorCoreOptions, get_contraction, can_pad
from kc.kernel.optimized_ast import get_optimized_ast

__all__ = ["Opt", "OptOps", "Kernel", "KernelState", "TensorCoreOptions", "get_contraction", "can_pad", "get_optimized_ast"]
