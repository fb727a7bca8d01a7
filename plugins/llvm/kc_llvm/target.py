"""The machine LLVM builds kernels for: this CPU (its LLVM name and features, the default), an x86-64 ISA level
(KC_LLVM_ISA), or any CPU of this architecture (KC_LLVM_PORTABLE=1). The renderer sizes its vectors from the
target's widest vector registers and writes its triple and data layout into each module; the compiler builds for
it and keys its cache on it. llvmlite is imported only inside functions: `import kc_llvm` stays cheap."""
from __future__ import annotations
import functools, platform, threading
from dataclasses import dataclass
from typing import Optional
from kc.backend import ConfigError, knob

# LLVM's environment knobs (kc config lists them), declared here: every import of kc_llvm imports this module
ISA = knob("KC_LLVM_ISA", str, "", "an x86-64 ISA level to build kernels for instead of this CPU: avx512f, avx2 or sse2",
           __name__, default_doc="this CPU's")
PORTABLE = knob("KC_LLVM_PORTABLE", bool, False, "1: build for any CPU of this architecture, not this CPU's model",
                __name__)
THREADS = knob("KC_LLVM_THREADS", int, None, "threads a big kernel's outermost output loop is split across (1 to 4 "
               "per core, at least 256)", "kc_llvm.renderer", default_doc="every core")
OPT = knob("KC_LLVM_OPT", int, 2, "the optimization level of LLVM's pass pipeline and code generator: 2 or 3",
           "kc_llvm.compiler", choices=(2, 3))

# LLVM's global context, pass builders and JIT are used by one thread at a time in a process (a compile takes
# milliseconds, a load less; parallel compiles use processes, as kc's BEAM executor does)
LOCK = threading.RLock()

# x86-64 ISA levels as LLVM CPU names (the psABI levels), each with the features a CPU must have to run its code
_LEVELS = {"avx512f": ("x86-64-v4", 64, ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx2", "fma", "f16c")),
           "avx2": ("x86-64-v3", 32, ("avx", "avx2", "bmi", "bmi2", "fma", "f16c", "lzcnt", "movbe")),
           "sse2": ("x86-64", 16, ())}
_X86 = ("x86_64", "amd64")


@dataclass(frozen=True)
class Target:
  triple: str         # LLVM's target triple of this process
  cpu: str            # the LLVM CPU name code is tuned and built for ("generic" where portable)
  features: str       # the LLVM feature string ("+avx2,+fma,..."); empty for an ISA level or portable code
  vector_bytes: int   # the widest vector register the code may use: 64 (AVX-512), 32 (AVX, AVX2) or 16

  @property
  def has_fma(self) -> bool:
    """Whether the code may use fused multiply-add instructions (llvm.fma is then one instruction, elsewhere a
    library call): a CPU with FMA3, an ISA level that includes it, or any 64-bit ARM."""
    return "+fma" in self.features.split(",") or self.cpu in ("x86-64-v3", "x86-64-v4") or self.triple.startswith(("aarch64", "arm64"))

  def describe(self) -> str:
    """One line naming everything that decides the machine code: the compile cache keys on it."""
    return " ".join(x for x in (self.triple, self.cpu, self.features) if x)


@functools.lru_cache(maxsize=None)
def initialized() -> None:
  """LLVM's native target and assembly printer, registered once a process."""
  import llvmlite.binding as llvm
  with LOCK:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


@functools.lru_cache(maxsize=None)
def host_features() -> frozenset[str]:
  """The features this CPU has, as LLVM names them (avx2, fma, neon, ...)."""
  import llvmlite.binding as llvm
  initialized()
  return frozenset(name for name, on in llvm.get_host_cpu_features().items() if on)


def _host_vector_bytes(features: frozenset[str]) -> int:
  return 64 if "avx512f" in features else 32 if "avx" in features else 16


@functools.lru_cache(maxsize=None)
def _target(isa: str, portable: bool) -> Target:
  import llvmlite.binding as llvm
  initialized()
  triple = llvm.get_process_triple()
  if isa:
    level = _LEVELS.get(isa.strip().lower())
    if platform.machine().lower() not in _X86:
      raise ConfigError(f"KC_LLVM_ISA={isa!r}: ISA levels ({' | '.join(_LEVELS)}) are x86-64 only and this machine is "
                        f"{platform.machine()}; unset it to build for this CPU")
    if level is None: raise ConfigError(f"KC_LLVM_ISA={isa!r} is not an ISA level LLVM's backend knows: use one of {' | '.join(_LEVELS)}")
    if portable: raise ConfigError(f"KC_LLVM_ISA={isa} and KC_LLVM_PORTABLE=1 ask for different code: unset one")
    cpu, width, needs = level
    if missing := [f for f in needs if f not in host_features()]:
      raise ConfigError(f"KC_LLVM_ISA={isa}: this CPU lacks {', '.join(missing)}, so code for {cpu} could not run here")
    return Target(triple, cpu, "", width)
  # portable code: the architecture's baseline CPU (SSE2's or NEON's 16-byte vectors)
  if portable: return Target(triple, "x86-64" if platform.machine().lower() in _X86 else "generic", "", 16)
  features = ",".join(f"+{f}" for f in sorted(host_features()))
  return Target(triple, llvm.get_host_cpu_name(), features, _host_vector_bytes(host_features()))


def chosen_target(isa: Optional[str] = None, portable: Optional[bool] = None) -> Target:
  """The target of KC_LLVM_ISA and KC_LLVM_PORTABLE (or the arguments, where given): this CPU by default."""
  return _target(ISA.get() if isa is None else isa, PORTABLE.get() if portable is None else portable)


@functools.lru_cache(maxsize=None)
def target_machine(target: Target, opt: int):
  """llvmlite's TargetMachine for `target` at optimization level `opt`, made once a process per target. Position
  independent code: an object file loads at any address."""
  import llvmlite.binding as llvm
  initialized()
  with LOCK:  # made and first used by whichever thread compiles first, while others may compile or load
    return llvm.Target.from_triple(target.triple).create_target_machine(cpu=target.cpu, features=target.features,
                                                                       opt=opt, reloc="pic", codemodel="default")


def data_layout(target: Target) -> str:
  """The `target datalayout` string of `target`, as its TargetMachine gives it."""
  with LOCK: return str(target_machine(target, 2).target_data)
