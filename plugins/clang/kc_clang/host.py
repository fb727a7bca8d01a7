"""The host CPU the C compiler builds for: its model and the ISA extensions `-march=native` may use, read once per
process. The compiler keys its disk cache on them (a binary built for one CPU must never load on another that
lacks an instruction it uses) and the renderer picks its vector widths from them. KC_CLANG_ISA names an x86 ISA
level to build for instead (IsaLevel): code for a fleet of CPUs, or to measure what an AVX2 machine would see."""
from __future__ import annotations
import functools, os, platform, re, subprocess
from dataclasses import dataclass
from typing import Optional
from kc.backend import ConfigError, knob

# CLANG's environment knobs (kc config lists them), declared here: every import of kc_clang imports this module
ISA = knob("KC_CLANG_ISA", str, "", "an x86 ISA level to build kernels for instead of this CPU: avx512f, avx2 or sse2",
           __name__, default_doc="this CPU's")
PORTABLE = knob("KC_CLANG_PORTABLE", bool, False, "1: build for any CPU of this architecture, not -march=native",
                __name__)
MARCH_NATIVE = knob("KC_CLANG_MARCH_NATIVE", bool, True, "the older spelling of KC_CLANG_PORTABLE: 0 is portable",
                    __name__)
THREADS = knob("KC_CLANG_THREADS", int, None, "threads a big kernel's outermost output loop is split across (1 to 4 "
               "per core, at least 256)", "kc_clang.renderer", default_doc="every core")
SPIN_US = knob("KC_CLANG_SPIN_US", int, 1000, "microseconds CLANG's kernel threads poll for the next split kernel before "
               "they sleep (0: at once; polling keeps a core busy, while waking a sleeping thread costs tens to hundreds of "
               "microseconds)", "kc_clang.thread_pool")
OPENMP = knob("KC_CLANG_OPENMP", bool, True, "split kernels run on the threads of an OpenMP runtime another library "
              "loaded into the process (torch's), which poll after that library's ops, instead of CLANG's own (0: CLANG's own)",
              "kc_clang.thread_pool")

# Set in a child forked after kc_clang was imported: the threads of an OpenMP runtime the parent ran are not in the
# child, and that runtime's next parallel region from the forking thread waits for them forever (torch's own ops hang
# there too), so a forked child never shares them (thread_pool.KernelPool.openmp)
_forked_child = False


def _note_fork() -> None:
  global _forked_child
  _forked_child = True


os.register_at_fork(after_in_child=_note_fork)


@functools.lru_cache(None)
def _worker_process() -> bool:
  import multiprocessing  # only when a split kernel first asks
  return multiprocessing.parent_process() is not None


def forked_child() -> bool:
  """Whether this process was forked after kc_clang was imported, or is a multiprocessing worker (forked before
  kc_clang was imported in it, perhaps, as a DataLoader's are): where another library's threads may be missing."""
  return _forked_child or _worker_process()


# x86 flags that name instruction-set extensions a compiler may emit with -march=native (cpuinfo also lists
# features of the platform such as "constant_tsc" or "hypervisor"; those do not change the code and stay out of the key)
_X86_ISA = re.compile(r"^(sse\w*|ssse3|avx\w*|fma\w*|f16c|bmi\w*|amx\w*|abm|lzcnt|popcnt|movbe|aes|vaes|pclmulqdq|vpclmulqdq|"
                      r"sha\w*|gfni|adx|xop|tbm|rdrand|rdseed|clflushopt|clwb|serialize|prefetchw?\w*|cx16)$")
_X86 = ("x86_64", "amd64", "i386", "i686")
_ARM = ("aarch64", "arm64")


# the x86 ISA levels KC_CLANG_ISA may name, each a -march every gcc >= 11 and clang >= 12 knows (x86-64-v3/-v4 are
# the psABI's levels; -march=x86-64 is the baseline every x86-64 CPU runs). `needs` lists the cpuinfo flags the
# level's code may use, each as alternatives: Linux says "abm" for LZCNT where macOS says "lzcnt", macOS "avx1_0" for "avx"
@dataclass(frozen=True)
class IsaLevel:
  name: str                            # what KC_CLANG_ISA says: avx512f, avx2, sse2
  march: str                           # the compiler's -march for it
  vector_bytes: int                    # one vector register: 64 (AVX-512), 32 (AVX2), 16 (SSE2)
  needs: tuple[tuple[str, ...], ...]   # the ISA extensions a CPU must have to run the code, each as alternatives


_V2 = (("ssse3",), ("sse4_1",), ("sse4_2",), ("popcnt",), ("cx16",))
_V3 = _V2 + (("avx", "avx1_0"), ("avx2",), ("bmi1",), ("bmi2",), ("f16c",), ("fma",), ("movbe",), ("lzcnt", "abm"))
_V4 = _V3 + (("avx512f",), ("avx512bw",), ("avx512cd",), ("avx512dq",), ("avx512vl",))
ISA_LEVELS = {level.name: level for level in (IsaLevel("avx512f", "x86-64-v4", 64, _V4), IsaLevel("avx2", "x86-64-v3", 32, _V3),
                                              IsaLevel("sse2", "x86-64", 16, ()))}
# every x86-64 psABI level, highest first, with the extensions its code may use: which level -march=native code on a
# CPU reaches, for compiler bugs that show only from some level up (known_bugs.py). x86-64-v2 is no KC_CLANG_ISA
# level (its 16-byte vectors are SSE2's), but gcc's vectorizer uses its SSE4.1 byte instructions (pextrb) there
PSABI_LEVELS = (("x86-64-v4", _V4), ("x86-64-v3", _V3), ("x86-64-v2", _V2), ("x86-64", ()))


def psabi_level(cpu: Optional["HostCPU"] = None) -> Optional[str]:
  """The highest x86-64 psABI level (x86-64-v4 .. x86-64) whose every extension `cpu` (default: this host) has:
  the level -march=native code there may use. None on a machine that is not x86-64."""
  cpu = cpu or host_cpu()
  if cpu.machine.lower() not in _X86: return None
  return next(march for march, needs in PSABI_LEVELS if all(any(a in cpu.features for a in alts) for alts in needs))


def baseline_level(cpu: Optional["HostCPU"] = None) -> Optional[str]:
  """The psABI level of portable code (no -march): x86-64 on x86-64 machines, None elsewhere."""
  return "x86-64" if (cpu or host_cpu()).machine.lower() in _X86 else None


def isa_level(name: str, cpu: Optional["HostCPU"] = None) -> IsaLevel:
  """The ISA level `name` (a key of ISA_LEVELS), checked against `cpu` (default: this host): it must be x86 and have
  every extension the level's code may use, since the kernels run here. Anything else is a ConfigError."""
  cpu = cpu or host_cpu()
  choices = " | ".join(ISA_LEVELS)
  if cpu.machine.lower() not in _X86:
    raise ConfigError(f"KC_CLANG_ISA={name!r}: ISA levels ({choices}) are x86-64 only and this machine is {cpu.machine}; "
                      "unset KC_CLANG_ISA to build for this CPU, or set KC_CLANG_PORTABLE=1 for any CPU of its architecture")
  level = ISA_LEVELS.get(name.strip().lower())
  if level is None: raise ConfigError(f"KC_CLANG_ISA={name!r} is not an ISA level CLANG knows: use one of {choices}, or unset it for this CPU's")
  missing = [alts[0] for alts in level.needs if not any(a in cpu.features for a in alts)]
  if missing:
    seen = "its ISA extensions could not be read" if not cpu.features else f"its widest vector ISA is {cpu.isa}"
    raise ConfigError(f"KC_CLANG_ISA={level.name}: this CPU ({cpu.model}) lacks {', '.join(missing)}, so code built for "
                      f"-march={level.march} could not run here ({seen}); choose a lower level of {choices}")
  return level


def chosen_isa() -> Optional[IsaLevel]:
  """The level KC_CLANG_ISA names, checked (isa_level), or None when it is unset: then native_code() decides. Set
  together with KC_CLANG_PORTABLE=1 (or KC_CLANG_MARCH_NATIVE=0) it is a ConfigError: the two ask for different
  code, and taking either silently would build what the user did not ask for."""
  name = ISA.get()
  if not name: return None
  if not native_code():
    raise ConfigError(f"KC_CLANG_ISA={name} and KC_CLANG_PORTABLE=1 (or KC_CLANG_MARCH_NATIVE=0) ask for different code: "
                      f"unset one (KC_CLANG_ISA=sse2 is the portable x86-64 baseline with SSE2 vectors)")
  return isa_level(name)


def native_code() -> bool:
  """Whether kernels are built for this CPU (-march=native, the default) rather than for any CPU of its architecture.
  KC_CLANG_PORTABLE=1 asks for portable code; KC_CLANG_MARCH_NATIVE, the older spelling, still works: 0 is portable."""
  if PORTABLE.get(): return False
  return MARCH_NATIVE.get()


@dataclass(frozen=True)
class HostCPU:
  machine: str                 # platform.machine(): x86_64, aarch64, arm64, ...
  model: str                   # the CPU's model name, as the OS reports it
  features: tuple[str, ...]    # the ISA extensions it has, sorted (only those a compiler may use)

  @property
  def x86(self) -> bool: return self.machine.lower() in _X86

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
  # extfeatures says LZCNT, which ISA_LEVELS' x86-64-v3 needs
  names = " ".join(_sysctl(f"machdep.cpu.{key}") for key in ("features", "leaf7_features", "extfeatures"))
  flags = names.lower().replace(".", "_").split()
  return model, tuple(sorted({f for f in flags if _X86_ISA.match(f)}))


@functools.lru_cache(maxsize=None)
def host_cpu() -> HostCPU:
  """This machine's CPU, read once: /proc/cpuinfo on Linux, sysctl on macOS, platform.processor() elsewhere."""
  machine, system = platform.machine(), platform.system()
  found = _linux(machine) if system == "Linux" else _macos(machine) if system == "Darwin" else None
  model, features = found if found is not None else (platform.processor() or "unknown", ())
  return HostCPU(machine, model, features)
