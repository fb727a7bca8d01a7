"""The system C compiler as a kc Compiler: C source in, shared-object bytes out."""
from __future__ import annotations
import functools, importlib.util, os, re, shlex, shutil, subprocess, tempfile
from dataclasses import dataclass
from typing import Optional
from kc.backend import CompileError, Compiler, ConfigError, knob
from kc_clang import batch, host, known_bugs

CC = knob("KC_CC", str, "", "the C compiler command CLANG runs, with any arguments (split as a shell would)", __name__,
          default_doc="cc")


def compiler_command() -> list[str]:
  """$KC_CC split like a shell would (it may carry arguments), else `cc`."""
  return shlex.split(CC.get() or "cc")


def compile_flags(native: Optional[bool] = None, cmd: Optional[list[str]] = None, isa: Optional[str] = None) -> list[str]:
  """The flags every kernel is compiled by `cmd` (default: compiler_command()) with. The target: `isa`, a level of
  host.ISA_LEVELS, adds its -march; else `native` adds -march=native; with neither given, KC_CLANG_ISA
  (host.chosen_isa()) and then host.native_code() decide, as they do for the renderer."""
  # no -ffast-math: kernels must give the IEEE results numpy gives; -ffp-contract=off for the same reason: with
  #   FMA (-march=native) gcc fuses a*b+c across statements and clang within one, rounding once where numpy rounds twice
  #   (a sum of products is fused on purpose, by the renderer's FMA builtins: kc.codegen.fma)
  # -O2, not -O3: kc unrolls and vectorizes the kernels itself (explicit vector types), and -O3's extra loop
  #   vectorization and unrolling measured the same (within 5%, gcc 12 -march=native, one thread) on the anchor
  #   workloads of benchmarks/bench_clang.py: add, mul-add-exp, sum, matmul 512, softmax; conv2d varied with noise
  #   both ways. -O3 makes larger code for nothing measured
  # -fwrapv: signed overflow wraps as numpy's does (the renderer relies on it: ClangRenderer.signed_overflow_wraps)
  # no -fopenmp: threads come from the runtime (runtime.py), so gcc and clang work without an OpenMP library
  # -march=native: the host's vector width and FMA; the cache key then names the CPU (ClangCompiler.identity)
  # -march=x86-64-v3 (KC_CLANG_ISA=avx2, ...): that level's vector width, for every CPU that has the level
  # + the flags of the known compiler bugs (known_bugs.py) of this compiler at the level of the code
  cmd_t = tuple(cmd or compiler_command())
  base = ["-shared", "-fPIC", "-O2", "-fwrapv", "-ffp-contract=off"]
  level = host.isa_level(isa) if isa is not None else host.chosen_isa() if native is None else None
  if level is not None: target, psabi = isa_flags(cmd_t, level), level.march
  else:
    native = host.native_code() if native is None else native
    target, psabi = (native_flags(cmd_t), host.psabi_level()) if native else ([], host.baseline_level())
  return base + target + bug_workarounds(cmd_t, psabi)


def bug_workarounds(cmd: tuple[str, ...], psabi: Optional[str]) -> list[str]:
  """The flags that avoid the known bugs (known_bugs.KNOWN_BUGS) of compiler `cmd` in code for x86-64 psABI level
  `psabi`: none for a compiler that is not an affected version, for a level the bugs do not reach, or off x86."""
  found = compiler_id(cmd)
  return known_bugs.workaround_flags(found.family, found.major, psabi) if found is not None else []


def isa_flags(cmd: tuple[str, ...], level: host.IsaLevel) -> list[str]:
  """-march=<the level's>, once the compiler is known to accept it: x86-64-v3 and -v4 are new in gcc 11 and clang 12,
  and an older compiler that rejected the flag would fail every kernel with a message about the flag only. No
  -mno-avx512fp16 (native_flags): no level enables AVX512-FP16, so half converts through F16C and float as in portable
  code. A compiler that does not run at all is left to fail at its first compile, with the message that says so."""
  flag = f"-march={level.march}"
  if _version_line(cmd) is not None and not _accepts_flag(cmd, flag):
    raise ConfigError(f"KC_CLANG_ISA={level.name} needs {flag}, which the C compiler {' '.join(cmd)!r} ({_version_line(cmd)}) "
                      "does not accept: it is new in gcc 11 and clang 12; upgrade the compiler, point KC_CC at a newer one, "
                      "or unset KC_CLANG_ISA")
  return [flag]


def native_flags(cmd: tuple[str, ...]) -> list[str]:
  """-march=native, and for gcc:
  - -mno-avx512fp16 where the CPU has AVX512-FP16 (and gcc knows the flag): gcc 12 vectorizes `(double)(_Float16)x`
    of float x into one float->double conversion, dropping the rounding to half (conformance np_astype); without
    AVX512-FP16 instructions half converts through F16C and computes in float, as in portable code. clang keeps them:
    it converts correctly, and clang before 15 has _Float16 on x86 only with them.
  - -mtune=generic where gcc does not know the CPU it runs on (tuning_misses_cpu)."""
  flags, cpu = ["-march=native"], host.host_cpu()
  if is_clang(cmd): return flags
  if "avx512_fp16" in cpu.features and _accepts_flag(cmd, "-mno-avx512fp16"): flags.append("-mno-avx512fp16")
  if tuning_misses_cpu(cmd, cpu): flags.append("-mtune=generic")
  return flags


def tuning_misses_cpu(cmd: tuple[str, ...], cpu: host.HostCPU) -> bool:
  """Whether gcc's -march=native tunes for a CPU without the AVX-512 this one has: gcc before 13 knows AMD's CPUs up
  to Zen 3 and takes a Zen 4 (the first AMD CPU with AVX-512) for one (-mtune=znver3). That cost model, written for
  256-bit registers, folds the loads of a register tile's operands into its 512-bit FMAs, one load per FMA instead of
  one per operand: x @ W.T at 64x512x1024 (16 FMAs per 8 loaded vectors) ran at 46 GFLOP/s on one core where
  -mtune=generic runs it at 104, and the other matmul and conv kernels measured the same with either."""
  found = compiler_id(cmd)
  return found is not None and found.family == "gcc" and found.major is not None and found.major < 13 and cpu.x86 \
    and "avx512f" in cpu.features and cpu.model.upper().startswith("AMD")


def is_clang(cmd: tuple[str, ...]) -> bool:
  """Whether the compiler is clang (its --version says so, whatever the command is called: cc may be either)."""
  found = compiler_id(cmd)
  return found is not None and found.family == "clang"


@dataclass(frozen=True)
class CompilerId:
  """Which C compiler a command runs, as its --version says."""
  family: Optional[str]   # "gcc", "clang", or None for a compiler kc does not recognize
  major: Optional[int]    # the major version (12 for gcc 12.2.0), None when the output names none
  line: str               # the first line of the output, for messages

  def describe(self) -> str:
    return f"{self.family or 'an unrecognized compiler'} {self.major if self.major is not None else '?'} ({self.line})"


_VERSION = re.compile(r"(?<![\w.+-])(\d+)\.(\d+)(?:\.(\d+))?(?![\w.])")


def parse_version_output(text: str) -> CompilerId:
  """The compiler and its major version from `cc --version` output. clang says "clang version X.Y.Z" (Apple's, Debian's
  and others' prefix it), gcc "NAME (PACKAGE) X.Y.Z" on its first line, whatever the command is called (cc, gcc-12,
  x86_64-linux-gnu-gcc; a date and more may follow), and "Free Software Foundation" in its copyright line."""
  lines = text.strip().splitlines()
  first = lines[0].strip() if lines else ""
  if m := re.search(r"clang version (\d+)\.", text): return CompilerId("clang", int(m[1]), first)
  if "clang" in first.lower(): return CompilerId("clang", None, first)
  if "Free Software Foundation" in text or re.search(r"\b(gcc|GCC)\b", first):
    m = _VERSION.search(first[first.find(")") + 1:])  # after "(PACKAGE)", which may hold other versions
    return CompilerId("gcc", int(m[1]) if m else None, first)
  return CompilerId(None, None, first)


def compiler_id(cmd: tuple[str, ...]) -> Optional[CompilerId]:
  """Which compiler `cmd` runs (parse_version_output of its --version), None when it does not run."""
  out = _version_output(cmd)
  return parse_version_output(out) if out is not None else None


@functools.lru_cache(maxsize=None)
def _accepts_flag(cmd: tuple[str, ...], flag: str) -> bool:
  """Whether the compiler runs with `flag` (an older one rejects what it does not know), asked once per process."""
  try: r = subprocess.run([*cmd, flag, "-fsyntax-only", "-x", "c", "-"], input="int kc_probe;\n", capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.SubprocessError): return False
  return r.returncode == 0


@functools.lru_cache(maxsize=None)
def has_float16(cmd: tuple[str, ...], flags: tuple[str, ...]) -> bool:
  """Whether the compiler has the _Float16 type with `flags`, asked once per process: gcc 12 has it on x86 with SSE2,
  clang from 15 on; clang 14 has it on x86 only where the target has AVX512-FP16. A compiler that does not run
  counts as having it (its first compile then fails and says why)."""
  try: r = subprocess.run([*cmd, *flags, "-fsyntax-only", "-x", "c", "-"], input="_Float16 kc_probe;\n", capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.SubprocessError): return True
  return r.returncode == 0 or _version_line(cmd) is None


@functools.lru_cache(maxsize=None)
def _version_output(cmd: tuple[str, ...]) -> Optional[str]:
  """What `cmd --version` prints, asked once per process; None when the compiler does not run."""
  try: r = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.SubprocessError): return None
  return r.stdout if r.returncode == 0 else None


def _version_line(cmd: tuple[str, ...]) -> Optional[str]:
  """The first line of `cmd --version`, None when the compiler does not run."""
  out = _version_output(cmd)
  return None if out is None else (out.strip().splitlines() or ["(no version output)"])[0]


def unavailable_reason() -> Optional[str]:
  """None when a C compiler runs and cffi is installed, else what is missing and how to get it."""
  cmd = compiler_command()
  if shutil.which(cmd[0]) is None:
    return f"no C compiler: {cmd[0]!r} is not on PATH; install gcc or clang, or point KC_CC at a C compiler"
  if _version_line(tuple(cmd)) is None: return f"the C compiler {' '.join(cmd)!r} does not run ({' '.join(cmd)} --version fails)"
  if importlib.util.find_spec("cffi") is None: return "cffi is not installed: pip install cffi"
  return None


def source_context(src: str, message: str, around: int = 2) -> str:
  """The source lines around the line a `<stdin>:LINE:COL: error` message points at, numbered, the line marked."""
  m = re.search(r"<stdin>:(\d+):", message)
  if m is None: return ""
  line, lines = int(m.group(1)), src.splitlines()
  shown = range(max(1, line - around), min(len(lines), line + around) + 1)
  return "\n" + "\n".join(f"{'>' if n == line else ' '}{n:4d} | {lines[n - 1]}" for n in shown)


class ClangCompiler(Compiler):
  """Runs the C compiler on the source (from stdin) and returns the shared object's bytes."""

  def __init__(self, plugin_version: str = "", cmd: Optional[list[str]] = None, flags: Optional[list[str]] = None):
    super().__init__(plugin_version)
    self.cmd = cmd if cmd is not None else compiler_command()
    self.flags = flags if flags is not None else compile_flags(cmd=self.cmd)

  def identity(self) -> str:
    # the resolved path and version line catch a compiler upgrade or a different `cc` on PATH; a binary built for
    # this CPU (-march=native) is keyed on its model and ISA extensions, so a cache copied to another CPU misses
    # instead of loading code with instructions that CPU lacks; portable code and code for an ISA level
    # (-march=x86-64-v3, ...: the flags name the level) are keyed on the architecture only, as any such CPU runs them
    cpu = host.host_cpu()
    target = cpu.describe() if "-march=native" in self.flags else cpu.machine
    return " | ".join([shutil.which(self.cmd[0]) or self.cmd[0], *self.cmd[1:], _version_line(tuple(self.cmd)) or "?", *self.flags, target])

  def compile_uncached(self, src: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="kc-clang-") as tmp:
      out = os.path.join(tmp, "kernel.so")
      argv = [*self.cmd, *self.flags, "-x", "c", "-", "-o", out, "-lm"]
      try: r = subprocess.run(argv, input=src.encode(), capture_output=True, timeout=600)
      except FileNotFoundError:
        raise CompileError(f"C compiler {self.cmd[0]!r} not found: install gcc or clang, or set KC_CC", src=src) from None
      except subprocess.TimeoutExpired as e:
        raise CompileError(f"{' '.join(argv)} ran for more than {e.timeout} seconds", src=src) from None
      log = (r.stderr + r.stdout).decode(errors="replace")
      if r.returncode != 0:
        first = next((ln for ln in log.splitlines() if "error" in ln), log.strip().splitlines()[0] if log.strip() else "")
        raise CompileError(f"{self.cmd[0]} failed to compile the kernel (exit {r.returncode}): {first}{source_context(src, first)}", src=src, log=log)
      with open(out, "rb") as f: return f.read()

  def compile_batch_uncached(self, srcs) -> list[bytes]:
    # one compiler run for all of them where the linker can split the result (kc_clang.batch); else one by one
    if not batch.batching_supported(): return super().compile_batch_uncached(srcs)
    return batch.build(self.cmd, self.flags, srcs)
