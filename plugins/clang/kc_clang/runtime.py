"""Loading and launching compiled CLANG kernels with cffi (ABI mode: no compiler needed for the binding).

A kernel the renderer split (renderer.py: it defines the int kc_parts_<name>) takes two more ints, its part and the
number of parts: a call runs it once per chunk of its loop, on the calling thread and CLANG's native kernel threads
(thread_pool.py), through the kernel's entry point kc_entry_<name>. The GIL is released while C runs; nothing needs
OpenMP. Whether a call of a split kernel wakes the threads at all is the kernel's own SplitChoice: a kernel that runs
faster whole on the calling thread is called with part 0 of 1 there."""
from __future__ import annotations
import functools, threading, time
from typing import Optional, Sequence
import cffi
from kc.backend import HostMemory, KcError, SharedLibrary, SplitChoice, int32_values, raw_buffers
from kc_clang.renderer import split_symbol, threads
from kc_clang.thread_pool import entry_symbol, pool


# one FFI for every kernel: a signature's C type is parsed (by pycparser: 1.5 ms) once a process, not once a kernel
_FFI = cffi.FFI()


@functools.lru_cache(maxsize=None)
def _signature(nbufs: int, nints: int, by_address: bool = False):
  """The kernel's C type with `nbufs` buffers and `nints` ints; by_address declares the buffers uintptr_t, so that a call
  passes Python ints (launch_addresses): C passes a pointer and a uintptr_t alike on every ABI kc-clang builds for
  (x86-64 System V and Windows, AArch64: an integer register or stack slot of the same size), and cffi converts an int
  to uintptr_t without the pointer object a void* parameter needs (a quarter microsecond apiece)."""
  buffer = "uintptr_t" if by_address else "void*"
  return _FFI.typeof(f"void(*)({', '.join([buffer] * nbufs + ['int'] * nints) or 'void'})")


class ClangProgram:
  """One kernel function in a shared object. Kernels loop over their whole domain, so global and local
  sizes are accepted (for the common launch protocol) and ignored.

  The C signature is `void name(T* data0, ..., const int var0, ...)`: every buffer is passed as a pointer
  (pointer types share one calling convention, so declaring them void* is exact) and every variable as an int;
  a split kernel takes `const int kc_part, const int kc_parts` after those."""

  def __init__(self, name: str, lib: bytes):
    self.name = name
    self._lib = SharedLibrary(lib, name)  # unloaded when this program is dropped
    address = self._lib.address(name)
    if address is None: raise KcError(f"the compiled library has no function named {name!r}")
    self._address = address
    self.split = self._lib.address(split_symbol(name)) is not None
    self._entry = None
    self._choice = SplitChoice() if self.split else None
    if self.split:
      if (entry := self._lib.address(entry_symbol(name))) is None:
        raise KcError(f"the split kernel {name!r} has no entry point {entry_symbol(name)!r} (thread_pool.entry_source writes it)")
      self._entry = _FFI.cast("void*", entry)
    self._fn = self._fn_by_address = None
    self._arity: Optional[tuple[int, int]] = None
    self._declare_lock = threading.Lock()

  def _function(self, nbufs: int, nvals: int):
    """The kernel as a function of the number of buffers and variables of its first call: its address cast to the
    signature of that arity (a type parsed once a process for every kernel of that arity)."""
    with self._declare_lock:
      if self._arity is None:
        ints = nvals + (2 if self.split else 0)  # a split kernel's part and number of parts come last
        self._fn, self._arity = _FFI.cast(_signature(nbufs, ints), self._address), (nbufs, nvals)
        self._fn_by_address = _FFI.cast(_signature(nbufs, ints, by_address=True), self._address)
    if self._arity != (nbufs, nvals):
      raise KcError(f"kernel {self.name} takes {self._arity[0]} buffers and {self._arity[1]} variable values, "
                    f"called with {nbufs} and {nvals}")
    return self._fn

  def __call__(self, *bufs, global_size: Sequence[int] = (1, 1, 1), local_size: Optional[Sequence[int]] = (1, 1, 1),
               vals: Sequence[int] = (), wait: bool = False) -> Optional[float]:
    fn = self._fn if self._arity == (len(bufs), len(vals)) else self._function(len(bufs), len(vals))
    # from_buffer points at the memory without asking numpy for its address (which costs more than the pointer)
    from_buffer, ptrs = _FFI.from_buffer, []
    for i, b in enumerate(raw_buffers(bufs)):
      if not isinstance(b, HostMemory): raise KcError(f"buffer {i} of kernel {self.name} is {type(b).__name__}, not CLANG host memory")
      ptrs.append(from_buffer(b.data))
    ints = int32_values(vals, self.name) if vals else ()
    seconds = self._run(fn, ptrs, ints)
    return seconds if wait else None

  def launch_arrays(self, arrays: Sequence) -> float:
    """The kernel on C-contiguous, aligned numpy arrays (its buffers, in order) and no variable values: what a plain
    kc call of a kernel without Variables passes (kc.api.plain_arrays checked them). Returns the run time in seconds."""
    from_buffer = _FFI.from_buffer
    return self._launch_pointers([from_buffer(a) for a in arrays])

  def launch_addresses(self, addresses: Sequence[int]) -> float:
    """The kernel on host memory at `addresses` (its buffers, in order) and no variable values: kc's call_host
    (kc.api checked them). Returns the run time in seconds."""
    if self._arity != (len(addresses), 0): self._function(len(addresses), 0)
    return self._run(self._fn_by_address, addresses, (), by_address=True)

  def _launch_pointers(self, ptrs: list) -> float:
    fn = self._fn if self._arity == (len(ptrs), 0) else self._function(len(ptrs), 0)
    return self._run(fn, ptrs, ())

  def _run(self, fn, ptrs: Sequence, ints, by_address: bool = False) -> float:
    """The kernel on `ptrs` (pointers, or ints where `by_address`: fn is then the uintptr_t declaration) and `ints`:
    a split kernel on the threads or whole on this thread, as its SplitChoice says. Returns the run time in seconds."""
    if (choice := self._choice) is None:
      start = time.perf_counter()
      fn(*ptrs, *ints)
      return time.perf_counter() - start
    n = threads()
    def run(threaded: bool) -> None:  # noqa: E306
      # the threads' entry takes void* buffers
      if threaded: pool(_FFI).run(self._entry, [_FFI.cast("void *", a) for a in ptrs] if by_address else ptrs, ints, n)
      else: fn(*ptrs, *ints, 0, 1)
    return choice.timed(n, run)

  def __repr__(self): return f"<ClangProgram {self.name}>"

