"""Fakes for the BEAM search tests, in a plain module so that spawned compile workers can import them by name (the
search's worker processes unpickle a compiler by its module and class)."""
import threading, time
from kc.backend import CompileError, Compiler


class FakeCompiler(Compiler):
  """'compiles' a source to its own bytes; a source containing HANG sleeps for `hang` seconds first, one containing
  ERROR fails as a compiler would."""

  def __init__(self, hang: float = 60.0):
    super().__init__("fake 1")
    self.hang = hang

  def compile(self, src: str) -> bytes: return self.compile_uncached(src)  # no disk cache: every call compiles

  def compile_uncached(self, src: str) -> bytes:
    if "HANG" in src: time.sleep(self.hang)
    if "ERROR" in src: raise CompileError("fake compiler: the source says ERROR", src=src)
    return b"LIB:" + src.encode()


class UnpicklableCompiler(FakeCompiler):
  """A FakeCompiler that holds a lock, as OpenCL's compiler holds its context: it cannot be pickled."""

  def __init__(self, hang: float = 60.0):
    super().__init__(hang)
    self.lock = threading.Lock()


class BatchingCompiler(FakeCompiler):
  """A FakeCompiler that builds batches in one run (compile_batch_uncached), marking what it built so: b"BATCH<n>:"
  and the source. It keeps kc's cached compile(), so compile_many batches its misses."""

  compile = Compiler.compile

  def compile_batch_uncached(self, srcs):
    if any("HANG" in s for s in srcs): time.sleep(self.hang)
    if any("ERROR" in s for s in srcs): raise CompileError("fake compiler: a source of the batch says ERROR")
    return [f"BATCH{len(srcs)}:{s}".encode() for s in srcs]


class ConfigReportingCompiler(FakeCompiler):
  """'compiles' a source to the configuration it is compiled under: b"<KC_CACHE_DIR>|<DEBUG>"."""

  def compile_uncached(self, src: str) -> bytes:
    from kc.config import read
    return f"{read('KC_CACHE_DIR')}|{read('DEBUG')}".encode()


class UnpicklableConfigReportingCompiler(ConfigReportingCompiler):
  def __init__(self):
    super().__init__()
    self.lock = threading.Lock()
