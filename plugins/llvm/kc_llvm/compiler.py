"""LLVM IR in, object code out, in this process: llvmlite parses and verifies the module, runs LLVM's new pass
manager's default pipeline at O2 (KC_LLVM_OPT=3: O3) and emits the object file for the target. No C compiler, no
child process. The compile cache (Compiler.compile) keys the object on the IR, the target and LLVM's version."""
from __future__ import annotations
from typing import Optional
from kc.backend import CompileError, Compiler
from kc_llvm.target import LOCK, OPT, Target, chosen_target, target_machine


def llvm_version() -> str:
  import llvmlite
  import llvmlite.binding as llvm
  return f"LLVM {'.'.join(map(str, llvm.llvm_version_info))} (llvmlite {llvmlite.__version__})"


class LLVMCompiler(Compiler):
  """Compiles a kernel's LLVM IR to a relocatable object file for `target` (default: KC_LLVM_ISA / this CPU)."""

  def __init__(self, plugin_version: str = "", target: Optional[Target] = None, opt: Optional[int] = None):
    super().__init__(plugin_version)
    self.target = target or chosen_target()
    self.opt = OPT.get() if opt is None else opt

  def identity(self) -> str:
    # the object's machine code depends on the LLVM that built it, the CPU and features it was built for and the level
    return f"{llvm_version()} | {self.target.describe()} | O{self.opt}"

  def compile_uncached(self, src: str) -> bytes:
    with LOCK: return target_machine(self.target, self.opt).emit_object(self._optimized(src))

  def assembly(self, src: str) -> str:
    """The target's assembly of `src`, as compile_uncached builds it: what a kernel's machine code is."""
    with LOCK: return target_machine(self.target, self.opt).emit_assembly(self._optimized(src))

  def _optimized(self, src: str):
    """The module of `src`, verified and run through the level's default pipeline (the caller holds LOCK)."""
    import llvmlite.binding as llvm
    try:
      mod = llvm.parse_assembly(src)
      mod.verify()
    except RuntimeError as e: raise CompileError(f"LLVM rejected the kernel's IR: {str(e).strip()}", src=src, log=str(e)) from None
    # the default pipeline of the level: mem2reg first (the accumulators' allocas become phis), then LLVM's loop and
    # SLP vectorizers, unroller and instruction selection for the target's vector width. No pass fuses a separate
    # fmul and fadd: the TargetMachine's default FP fusion fuses only llvm.fmuladd, which the renderer never emits
    pb = llvm.create_pass_builder(target_machine(self.target, self.opt), llvm.create_pipeline_tuning_options(speed_level=self.opt))
    pb.getModulePassManager().run(mod, pb)
    return mod
