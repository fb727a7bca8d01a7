"""Which GPU architecture kernels are generated and compiled for: the opened GPU's compute capability where there is
one, else KC_CUDA_ARCH (default sm_90), so that source renders and compiles to cubin on machines with no GPU."""
from __future__ import annotations
import re
from kc.backend import ConfigError, knob

ENV_ARCH = "KC_CUDA_ARCH"
DEFAULT_ARCH = "sm_90"
ARCH = knob(ENV_ARCH, str, DEFAULT_ARCH, "the CUDA arch (sm_XX) to render and compile for where no GPU can open",
            __name__)
_ARCH_RE = re.compile(r"(?:sm_|compute_)?(\d{2,3})\Z")


def parse_arch(text: str, where: str = ENV_ARCH) -> str:
  """'sm_89', '89' or '8.9' as 'sm_89'; anything else is a ConfigError naming `where`."""
  m = _ARCH_RE.match(text.strip().replace(".", ""))
  if m is None or int(m.group(1)) < 50:
    raise ConfigError(f"{where}={text!r} is not a CUDA architecture: use the form sm_90 (compute capability 9.0), sm_89 or sm_80")
  return f"sm_{m.group(1)}"


def capability(arch: str) -> int:
  """'sm_89' -> 89: compute capability major * 10 + minor, for comparing archs."""
  return int(parse_arch(arch, "arch")[3:])


def selected_arch() -> str:
  """The arch of the GPU kc opens (KC_CUDA_DEVICE), where one can open; else KC_CUDA_ARCH, else sm_90."""
  from kc_cuda.driver import device_props, selected_ordinal, unavailable_reason
  if unavailable_reason() is None: return device_props(selected_ordinal()).arch
  return parse_arch(ARCH.get())
