"""The system C compiler as a kc Compiler: C source in, shared-object bytes out."""
from __future__ import annotations
import functools, importlib.util, os, re, shlex, shutil, subprocess, tempfile
from typing import Optional
from kc.backend import CompileError, Compiler, env_value


def compiler_command() -> list[str]:
  """$KC_CC split like a shell would (it may carry arguments), else `cc`."""
  return shlex.split(env_value("KC_CC", "") or "cc")


def compile_flags() -> list[str]:
  # no -ffast-math: kernels must give the IEEE results numpy gives; -march=native is opt-in because the
  # binaries it makes do not run on other CPUs
  # -fopenmp: the renderer may split a kernel's outermost loop across threads (KC_CLANG_THREADS=1 turns that off)
  # -fwrapv: signed overflow wraps as numpy's does (the renderer relies on it: CLANGRenderer.signed_overflow_wraps)
  return ["-shared", "-fPIC", "-O2", "-fwrapv", "-fopenmp"] + (["-march=native"] if env_value("KC_CLANG_MARCH_NATIVE", 0) == 1 else [])


@functools.lru_cache(maxsize=None)
def _version_line(cmd: tuple[str, ...]) -> Optional[str]:
  """The first line of `cmd --version`, None when the compiler does not run."""
  try: r = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.SubprocessError): return None
  return (r.stdout.strip().splitlines() or ["(no version output)"])[0] if r.returncode == 0 else None


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
    self.flags = flags if flags is not None else compile_flags()

  def identity(self) -> str:
    # the resolved path and version line catch a compiler upgrade or a different `cc` on PATH
    return " | ".join([shutil.which(self.cmd[0]) or self.cmd[0], *self.cmd[1:], _version_line(tuple(self.cmd)) or "?", *self.flags])

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
