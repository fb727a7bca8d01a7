"""From an optimized Kernel to linear UOps and a Program: lower (views to index arithmetic), the graph rewrites
(expansion, accumulators, vectors, transcendentals), linearize, and program building through the renderer."""
from kc.codegen.program import Kernel, linearize_kernel, to_program

__all__ = ["Kernel", "linearize_kernel", "to_program"]
