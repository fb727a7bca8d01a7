"""Loading and launching compiled CLANG kernels with cffi (ABI mode: no compiler needed for the binding)."""
from __future__ import annotations
import ctypes, ctypes.util, os, tempfile, threading, time
from typing import Optional, Sequence
import cffi
from kc.backend import HostMemory, KcError, int32_values, raw_buffers


_OPENMP_RUNTIME = None


def pin_openmp_runtime() -> None:
  """Load the OpenMP runtime once and keep it for the life of the process. Kernels built with -fopenmp link it;
  without this pin, unloading the last such kernel would unload the runtime under its idle worker threads."""
  global _OPENMP_RUNTIME
  if _OPENMP_RUNTIME is not None: return
  for name in ("gomp", "omp", "iomp5"):
    if (path := ctypes.util.find_library(name)) is not None:
      try: _OPENMP_RUNTIME = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
      except OSError: continue
      return


class ClangProgram:
  """One kernel function in a shared object. Kernels loop over their whole domain, so global and local
  sizes are accepted (for the common launch protocol) and ignored.

  The C signature is `void name(T* data0, ..., const int var0, ...)`: every buffer is passed as a pointer
  (pointer types share one calling convention, so declaring them void* is exact) and every variable as an int."""

  def __init__(self, name: str, lib: bytes):
    pin_openmp_runtime()
    self.name = name
    self._ffi = cffi.FFI()
    fd, path = tempfile.mkstemp(prefix=f"kc-{name}-", suffix=".so")
    try:
      with os.fdopen(fd, "wb") as f: f.write(lib)
      try: self._lib = self._ffi.dlopen(path)
      except OSError as e: raise KcError(f"cannot load the compiled library of kernel {name!r}: {e}") from None
      self._check_symbol(path)
    finally: os.unlink(path)  # the loaded mapping outlives the file; nothing is left behind in /tmp
    self._fn = None
    self._arity: Optional[tuple[int, int]] = None
    self._declare_lock = threading.Lock()

  def _check_symbol(self, path: str):
    probe = cffi.FFI()
    probe.cdef(f"void {self.name}(void);")
    try: getattr(probe.dlopen(path), self.name)
    except AttributeError: raise KcError(f"the compiled library has no function named {self.name!r}") from None

  def _function(self, nbufs: int, nvals: int):
    """The kernel, declared on first call with the number of buffers and variables it is called with."""
    with self._declare_lock:
      if self._arity is None:
        self._ffi.cdef(f"void {self.name}({', '.join(['void*'] * nbufs + ['int'] * nvals) or 'void'});")
        self._fn, self._arity = getattr(self._lib, self.name), (nbufs, nvals)
    if self._arity != (nbufs, nvals):
      raise KcError(f"kernel {self.name} takes {self._arity[0]} buffers and {self._arity[1]} variable values, "
                    f"called with {nbufs} and {nvals}")
    return self._fn

  def __call__(self, *bufs, global_size: Sequence[int] = (1, 1, 1), local_size: Optional[Sequence[int]] = (1, 1, 1),
               vals: Sequence[int] = (), wait: bool = False) -> Optional[float]:
    fn = self._fn if self._arity == (len(bufs), len(vals)) else self._function(len(bufs), len(vals))
    # from_buffer points at the memory without asking numpy for its address (which costs more than the pointer)
    from_buffer, ptrs = self._ffi.from_buffer, []
    for i, b in enumerate(raw_buffers(bufs)):
      if not isinstance(b, HostMemory): raise KcError(f"buffer {i} of kernel {self.name} is {type(b).__name__}, not CLANG host memory")
      ptrs.append(from_buffer(b.data))
    ints = int32_values(vals, self.name) if vals else ()
    start = time.perf_counter()
    fn(*ptrs, *ints)
    return time.perf_counter() - start if wait else None

  def __repr__(self): return f"<ClangProgram {self.name}>"

