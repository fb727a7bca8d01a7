"""The host CPU the C compiler builds for: its model and the ISA extensions `-march=native` may use, read once per
process. The compiler keys its disk cache on them (a binary built for one CPU must never load on another that
lacks an instruction it uses) and the renderer picks its vector widths from them."""
from __future__ import annotations
import functools, platform, re, subprocess
from dataclasses import dataclass
from typing import Optional
from kc.backend import env_value

# x86 flags that name instruction-set extensions a compiler may emit with -march=native (cpuinfo also lists
# features of the platform such as "constant_tsc" or "hypervisor"; those do not change the code and stay out of the key)
_X86_ISA = re.compile(r"^(sse\w*|ssse3|avx\w*|fma\w*|f16c|bmi\w*|amx\w*|abm|lzcnt|popcnt|movbe|aes|vaes|pclmulqdq|vpclmulqdq|"
                      r"sha\w*|gfni|adx|xop|tbm|rdrand|rdseed|clflushopt|clwb|serialize|prefetchw?\w*|cx16)$")
_X86 = ("x86_64", "amd64", "i386", "i686")
_ARM = ("aarch64", "arm64")


def native_code() -> bool:
  """Whether kernels are built for this CPU (-march=native, the default) rather than for any CPU of its architecture.
  KC_CLANG_PORTABLE=1 asks for portable code; KC_CLANG_MARCH_NATIVE, the older spelling, still works: 0 is portable."""
  if env_value("KC_CLANG_PORTABLE", 0) != 0: return False
  return env_value("KC_CLANG_MARCH_NATIVE", 1) != 0


@dataclass(frozen=True)
class HostCPU:
  machine: str                 # platform.machine(): x86_64, aarch64, arm64, ...
  model: str                   # the CPU's model name, as the OS reports it
  features: tuple[str, ...]    # the ISA extensions it has, sorted (only those a compiler may use)

  @property
  def isa(self) -> str:
    """The widest vector extension: avx512f, avx2, avx, sse2 on x86; neon on 64-bit ARM; else empty."""
    if self.machine.lower() in _X86:
      return next((f for f in ("avx512f", "avx2", "avx") if f in self.features), "sse2")
    return "neon" if self.machine.lower() in _ARM else ""

  @property
  def vector_bytes(self) -> int:
    """The width of one vector register of the widest extension: 64 for AVX-512, 32 for AVX/AVX2, else 16 (SSE, NEON)."""
    return {"avx512f": 64, "avx2": 32, "avx": 32}.get(self.isa, 16)

  def describe(self) -> str:
    """One line that tells CPUs apart for the compile cache: model and ISA extensions."""
    return f"{self.machine} {self.model} [{' '.join(self.features)}]"


def _cpuinfo_fields(text: str) -> dict[str, str]:
  """The `key : value` lines of the first processor block of /proc/cpuinfo (every core reports the same ISA)."""
  fields: dict[str, str] = {}
  for line in text.splitlines():
    if not line.strip():
      if fields: break
      continue
    key, sep, value = line.partition(":")
    if sep: fields.setdefault(key.strip().lower(), value.strip())
  return fields


def _linux(machine: str) -> Optional[tuple[str, tuple[str, ...]]]:
  try:
    with open("/proc/cpuinfo") as f: fields = _cpuinfo_fields(f.read())
  except OSError: return None
  # x86 says "model name" and "flags"; ARM says "Features" and names the core by implementer and part numbers
  model = fields.get("model name") or " ".join(f"{k} {fields[k]}" for k in ("cpu implementer", "cpu part", "cpu variant") if k in fields)
  flags = (fields.get("flags") or fields.get("features") or "").split()
  if machine.lower() in _X86: flags = [f for f in flags if _X86_ISA.match(f)]
  return model or platform.processor(), tuple(sorted(set(flags)))


def _sysctl(name: str) -> str:
  try: r = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=10)
  except (OSError, subprocess.SubprocessError): return ""
  return r.stdout.strip() if r.returncode == 0 else ""


def _macos(machine: str) -> tuple[str, tuple[str, ...]]:
  model = _sysctl("machdep.cpu.brand_string") or platform.processor()
  if machine.lower() in _ARM: return model, ("neon",)  # every Apple silicon core has NEON; the model names the rest
  flags = f"{_sysctl('machdep.cpu.features')} {_sysctl('machdep.cpu.leaf7_features')}".lower().replace(".", "_").split()
  return model, tuple(sorted({f for f in flags if _X86_ISA.match(f)}))


@functools.lru_cache(maxsize=None)
def host_cpu() -> HostCPU:
  """This machine's CPU, read once: /proc/cpuinfo on Linux, sysctl on macOS, platform.processor() elsewhere."""
  machine, system = platform.machine(), platform.system()
  found = _linux(machine) if system == "Linux" else _macos(machine) if system == "Darwin" else None
  model, features = found if found is not None else (platform.processor() or "unknown", ())
  return HostCPU(machine, model, features)
