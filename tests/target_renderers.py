"""Renderers that stand for a target in the Kernel and lowering tests: LimitsRenderer only declares limits (the Kernel
never renders), MiniC is a small C-like dialect that renders everything the Kernel tests build, WMMA calls included.
A plain module, so that tests import it by name; conftest.py wraps the usual targets in fixtures."""
from kc.renderer import Renderer
from kc.renderer.cstyle import CStyleLanguage
from kc.emu import BUILTIN_TENSOR_CORES

# The emulator's built-in tensor cores: small, and their fragments cover the matrices. TC_HALF: N=M=K=4, half in and
# float out, 4 threads with the rest of N and M upcast; TC_FLOAT: 2x2x2 in float, the threads cover N and M.
TC_HALF, TC_FLOAT = BUILTIN_TENSOR_CORES


class LimitsRenderer(Renderer):
  """A renderer that only declares limits: enough for the Kernel, which never renders."""
  device = "LIMITS"
  def __init__(self, **limits):
    for k, v in limits.items():
      if not hasattr(Renderer, k): raise AttributeError(k)
      setattr(self, k, v)
  def render(self, name, uops): return "\n".join(f"{i} {u.op} {u.dtype} {u.arg}" for i, u in enumerate(uops))


def gpu_limits() -> LimitsRenderer:
  """A GPU-like target: locals, shared memory, launch limits."""
  return LimitsRenderer(has_local=True, has_shared=True, global_max=(65535, 65535, 65535), local_max=(1024, 1024, 64), shared_max=32768)


def cpu_limits() -> LimitsRenderer:
  """A CPU-like target: no locals, loops for the global dims."""
  return LimitsRenderer(has_local=False, has_shared=False, global_max=None, local_max=None)


def tensor_core_gpu_limits() -> LimitsRenderer:
  """A GPU-like target with the two small tensor cores."""
  return LimitsRenderer(has_local=True, has_shared=True, shared_max=49152, tensor_cores=[TC_HALF, TC_FLOAT])


class MiniC(CStyleLanguage):
  """A minimal C-like dialect with work-groups, local memory and the small test tensor cores: enough to render
  every kernel the Kernel tests build, including WMMA calls."""
  device = "MINIC"
  kernel_prefix, buffer_prefix, smem_prefix, barrier = "kernel ", "global ", "local ", "barrier();"
  code_for_workitem = {"g": lambda d: f"group_id({d})", "l": lambda d: f"local_id({d})", "i": lambda d: f"global_id({d})"}
  float4 = "(float4)"
  global_max, local_max, shared_max = (65535, 65535, 65535), (1024, 1024, 64), 49152
  tensor_cores = [TC_HALF, TC_FLOAT]
