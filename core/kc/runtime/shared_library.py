"""A compiled shared library loaded into this process, unloaded when dropped: how host backends (CLANG, a plugin made
by `kc new-backend`) hold a kernel's code.

ctypes loads a library and never unloads it, so a process that loads kernels for hours (a test suite, a search, a
server compiling new shapes) would keep every one mapped: each library maps 4 or 5 regions of memory, and Linux
gives a process 65530 (vm.max_map_count), after which every mmap fails. A SharedLibrary closes its handle (dlclose,
FreeLibrary) once it is garbage. Its owner must call its functions only through objects that keep it alive: once
the last reference is gone, the code is unmapped."""
from __future__ import annotations
import _ctypes, ctypes, os, sys, tempfile
from typing import Optional
from kc.errors import KcError

_CLOSE = getattr(_ctypes, "dlclose", None) or getattr(_ctypes, "FreeLibrary", None)


class SharedLibrary:
  """The library in `image` (the bytes of a .so, .dylib or .dll) of the kernel `name`, loaded from a temporary file
  that is removed at once (the mapping outlives the file). Raises KcError when the loader refuses it."""

  def __init__(self, image: bytes, name: str, suffix: str = ".so"):
    self.name = name
    fd, path = tempfile.mkstemp(prefix=f"kc-{name}-", suffix=suffix)
    try:
      with os.fdopen(fd, "wb") as f: f.write(image)
      try: self.lib: Optional[ctypes.CDLL] = ctypes.CDLL(path)
      except OSError as e: raise KcError(f"cannot load the compiled library of kernel {name!r}: {e}") from None
    finally: os.unlink(path)

  def address(self, symbol: str) -> Optional[int]:
    """The address of `symbol` (dlsym), None when the library has none."""
    try: return ctypes.cast(self._open()[symbol], ctypes.c_void_p).value  # item access finds any name, even __x
    except AttributeError: return None

  def function(self, symbol: str):
    """`symbol` as a ctypes function (it keeps this library's CDLL alive, not this object: keep this object too)."""
    try: return getattr(self._open(), symbol)
    except AttributeError: raise KcError(f"the compiled library has no function named {symbol!r}") from None

  def _open(self) -> ctypes.CDLL:
    if self.lib is None: raise KcError(f"the library of kernel {self.name!r} was closed: its code is no longer loaded")
    return self.lib

  def close(self, unload=_CLOSE, finalizing=sys.is_finalizing) -> None:
    """Unload the library now (its code must not run again). Not at interpreter exit: the process's mappings go
    with it. The defaults are bound at definition, as module globals may be None by then."""
    lib, self.lib = getattr(self, "lib", None), None  # no lib: __init__ raised
    if lib is not None and unload is not None and not finalizing(): unload(lib._handle)

  __del__ = close
