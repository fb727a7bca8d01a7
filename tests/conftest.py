import pytest
from kc.renderer import Renderer


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
  """A fresh, empty compile cache for this test: KC_CACHE_DIR points at it."""
  monkeypatch.setenv("KC_CACHE_DIR", str(tmp_path))
  return tmp_path


class LimitsRenderer(Renderer):
  """A renderer that only declares limits: enough for the Kernel, which never renders."""
  device = "LIMITS"
  def __init__(self, **limits):
    for k, v in limits.items():
      if not hasattr(Renderer, k): raise AttributeError(k)
      setattr(self, k, v)
  def render(self, name, uops): return "\n".join(f"{i} {u.op} {u.dtype} {u.arg}" for i, u in enumerate(uops))


# The emulator's built-in tensor cores: small, and their fragments cover the matrices. TC_HALF: N=M=K=4, half in and
# float out, 4 threads with the rest of N and M upcast; TC_FLOAT: 2x2x2 in float, the threads cover N and M.
from kc.runtime.emulator import BUILTIN_TENSOR_CORES  # noqa: E402
TC_HALF, TC_FLOAT = BUILTIN_TENSOR_CORES


@pytest.fixture
def gpu():
  """A GPU-like target: locals, shared memory, launch limits."""
  return LimitsRenderer(has_local=True, has_shared=True, global_max=(65535, 65535, 65535), local_max=(1024, 1024, 64), shared_max=32768)


@pytest.fixture
def cpu():
  """A CPU-like target: no locals, loops for the global dims."""
  return LimitsRenderer(has_local=False, has_shared=False, global_max=None, local_max=None)


@pytest.fixture
def tc_gpu():
  return LimitsRenderer(has_local=True, has_shared=True, shared_max=49152, tensor_cores=[TC_HALF, TC_FLOAT])


from kc.renderer.cstyle import CStyleLanguage  # noqa: E402


class MiniC(CStyleLanguage):
  """A minimal C-like dialect with work-groups, local memory and the small test tensor cores: enough to render
  every kernel the Kernel tests build, including WMMA calls."""
  device = "MINIC"
  kernel_prefix, buffer_prefix, smem_prefix, barrier = "kernel ", "global ", "local ", "barrier();"
  code_for_workitem = {"g": lambda d: f"group_id({d})", "l": lambda d: f"local_id({d})", "i": lambda d: f"global_id({d})"}
  float4 = "(float4)"
  global_max, local_max, shared_max = (65535, 65535, 65535), (1024, 1024, 64), 49152
  tensor_cores = [TC_HALF, TC_FLOAT]


@pytest.fixture
def minic(): return MiniC()
