"""The kernel layer: verify_ast, the Kernel and its optimizations, get_optimized_ast.

The Kernel here holds the optimization state only; kc.Kernel (kc.codegen.Kernel) is the same class with the
codegen steps added (linearize, to_program), which this layer cannot reach."""
from kc.kernel.opt import Opt, OptOps
from kc.kernel.verify import verify_ast
from kc.kernel.kernel import Kernel, KernelState, TensorCoreOptions, get_contraction, can_pad
from kc.kernel.optimized_ast import KernelInfo, get_optimized_ast
from kc.kernel.naming import to_function_name

__all__ = ["Opt", "OptOps", "verify_ast", "Kernel", "KernelState", "TensorCoreOptions", "get_contraction", "can_pad", "KernelInfo", "get_optimized_ast",
           "to_function_name"]
