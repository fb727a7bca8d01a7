"""Loading and launching compiled LLVM kernels: the object file is linked into this process by LLVM's ORC JIT
(LLJIT, one a process), which resolves its calls into the C library (the math functions) from the process's own
symbols, and the kernel is called through ctypes, which releases the GIL while it runs. Linking, disposing and
running kernels take kc_llvm.target.LOCK, so no JIT library changes while a kernel runs.

A kernel the renderer split (its global kc_parts_<name> is 1) takes its part and the number of parts after its
Variables; a call runs every part at once on kc's kernel threads (kc.backend.run_parts), as CLANG's does."""
from __future__ import annotations
import ctypes, functools, itertools, os, sys, time
from typing import Optional, Sequence
from kc.backend import HostMemory, KcError, SplitChoice, int32_values, raw_buffers, run_parts
from kc_llvm.renderer import split_symbol, threads
from kc_llvm.target import LOCK, chosen_target, initialized, target_machine

_JIT: Optional[tuple[int, object]] = None
_LIBRARY_NUMBER = itertools.count()
# The JIT's libraries change (link, dispose) only while no kernel of this process runs: kernels run under LOCK too,
# one call at a time (a split call still uses every kernel thread). A dropped program's library is released under
# LOCK: its tracker waits here when the lock is busy (a garbage collection inside a running call, or in a kernel
# thread, must not block on a lock its own call holds)
_RETIRED: list = []


def _release_retired() -> None:
  """Dispose the libraries of dropped programs (the caller holds LOCK)."""
  while _RETIRED: _RETIRED.pop()


def _jit():
  """This process's LLJIT (a forked child makes its own: the parent's JIT state is not the child's to use)."""
  global _JIT
  import llvmlite.binding as llvm
  if _JIT is None or _JIT[0] != os.getpid():
    initialized()
    _JIT = (os.getpid(), llvm.create_lljit_compiler(target_machine(chosen_target(), 2)))
  return _JIT[1]


@functools.lru_cache(maxsize=None)
def _signature(nbufs: int, nints: int):
  return ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nbufs + [ctypes.c_int32] * nints))


def _array_address(a) -> int:
  """The address of a C-contiguous numpy array's first byte. ctypes reads a writable array's buffer in a fifth of the
  time __array_interface__ takes (0.2 against 0.9 us: a call passes three); a read-only or empty array goes through
  __array_interface__."""
  try: return ctypes.addressof(ctypes.c_char.from_buffer(a))
  except (TypeError, ValueError): return a.__array_interface__["data"][0]


class LLVMProgram:
  """One kernel in an object file, linked into this process. Kernels loop over their whole domain, so global and
  local sizes are accepted (for the common launch protocol) and ignored.

  The signature is `void name(ptr data0, ..., i32 var0, ...)`, plus `i32 kc_part, i32 kc_parts` for a split kernel.
  LLVM's `ptr` and `i32` arguments follow the platform's C calling convention, as C's `void*` and `int` do."""

  def __init__(self, name: str, lib: bytes):
    import llvmlite.binding as llvm
    self.name = name
    with LOCK:
      _release_retired()
      try:
        builder = llvm.JITLibraryBuilder().add_object_img(lib).add_current_process().export_symbol(name)
        self._tracker = builder.export_symbol(split_symbol(name)).link(_jit(), f"kc-{name}-{next(_LIBRARY_NUMBER)}")
        self._address = self._tracker[name]
      except RuntimeError as e: raise KcError(f"cannot load the compiled object of kernel {name!r}: {e}") from None
      self.split = ctypes.c_int32.from_address(self._tracker[split_symbol(name)]).value == 1
    self._choice = SplitChoice() if self.split else None  # whether a call wakes the threads: timed on its calls
    if not self._address: raise KcError(f"the compiled object has no function named {name!r}")
    self._fns: dict[tuple[int, int], object] = {}

  def _function(self, nbufs: int, nints: int):
    fn = self._fns.get((nbufs, nints))
    if fn is None: fn = self._fns[(nbufs, nints)] = _signature(nbufs, nints)(self._address)
    return fn

  def __call__(self, *bufs, global_size: Sequence[int] = (1, 1, 1), local_size: Optional[Sequence[int]] = (1, 1, 1),
               vals: Sequence[int] = (), wait: bool = False) -> Optional[float]:
    ptrs = []
    for i, b in enumerate(raw_buffers(bufs)):
      if not isinstance(b, HostMemory): raise KcError(f"buffer {i} of kernel {self.name} is {type(b).__name__}, not LLVM host memory")
      ptrs.append(b.addr)
    ints = int32_values(vals, self.name) if vals else []
    seconds = self._run(ptrs, ints)
    return seconds if wait else None

  def launch_arrays(self, arrays: Sequence) -> float:
    """The kernel on C-contiguous, aligned numpy arrays (its buffers, in order) and no variable values: what a plain
    kc call of a kernel without Variables passes. Returns the run time in seconds."""
    return self.launch_addresses([_array_address(a) for a in arrays])

  def launch_addresses(self, addresses: Sequence[int]) -> float:
    """The kernel on host memory at `addresses` (its buffers, in order) and no variable values: kc's call_host
    (kc.api checked them). Returns the run time in seconds."""
    return self._run(addresses, ())

  def _run(self, ptrs: Sequence, ints: Sequence) -> float:
    """The kernel on `ptrs` and `ints` (a split kernel on the threads or whole on this thread, as its SplitChoice
    says); its run time in seconds."""
    with LOCK:
      _release_retired()
      if (choice := self._choice) is None:
        fn = self._function(len(ptrs), len(ints))
        start = time.perf_counter()
        fn(*ptrs, *ints)
        return time.perf_counter() - start
      n, fn = threads(), self._function(len(ptrs), len(ints) + 2)
      return choice.timed(n, lambda threaded: run_parts(fn, (*ptrs, *ints), n if threaded else 1))

  def __del__(self, retired=_RETIRED, lock=LOCK, finalizing=sys.is_finalizing):
    # the defaults are bound at definition: at interpreter exit this module's globals may already be None; the
    # library is then left queued, as the process's JIT goes with the process
    tracker = self.__dict__.pop("_tracker", None)
    if tracker is None: return
    retired.append(tracker)
    del tracker
    if not finalizing() and lock.acquire(blocking=False):
      try: _release_retired()
      finally: lock.release()

  def __repr__(self): return f"<LLVMProgram {self.name}>"
