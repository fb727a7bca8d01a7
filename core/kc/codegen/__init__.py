"""From an optimized kernel AST to linear UOps and a Program: lower (views to index arithmetic), the graph rewrites
(expansion, accumulators, vectors, transcendentals), linearize, and program building through the renderer. verify_ast
states the rules a kernel AST follows; the Kernel (kc.kernel) optimizes an AST and calls down into this layer."""
from kc.codegen.verify import verify_ast
from kc.codegen.lower import KernelInfo
from kc.codegen.naming import to_function_name
from kc.codegen.program import linearize_ast, render_program

__all__ = ["verify_ast", "KernelInfo", "to_function_name", "linearize_ast", "render_program"]
