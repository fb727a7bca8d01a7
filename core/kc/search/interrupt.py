"""A Ctrl-C during a search is never lost.

Python raises KeyboardInterrupt in whatever Python code runs when the signal arrives, and that can be a finalizer (a
UOp's __del__, a weakref callback), where an exception is printed as "Exception ignored" and dropped: the search went
on waiting for its compiles as if no Ctrl-C had come. While a search runs in the main thread under Python's default
SIGINT handler, `watched()` installs a handler that also leaves a mark (and keeps Python from printing the swallowed
one as an error); the executors' wait loops, which wake at least every POLL_S seconds, call `raise_if_interrupted()`,
which turns a mark that no except clause consumed into a KeyboardInterrupt there. Code that catches the
KeyboardInterrupt calls `consume()`, so it is not raised twice."""
from __future__ import annotations
import contextlib, signal, sys, threading
from typing import Iterator

POLL_S = 0.25  # the longest a wait loop sleeps before it looks for a lost Ctrl-C
_pending = threading.Event()


def _mark_and_raise(signum, frame):
  _pending.set()
  raise KeyboardInterrupt


@contextlib.contextmanager
def watched() -> Iterator[None]:
  """While the block runs: a Ctrl-C (SIGINT) raises KeyboardInterrupt as before and leaves a mark. Only in the main
  thread and only over Python's default handler: a program's own SIGINT handler is left alone."""
  install = threading.current_thread() is threading.main_thread() and \
    signal.getsignal(signal.SIGINT) is signal.default_int_handler
  previous_hook = sys.unraisablehook

  def quiet_hook(unraisable) -> None:
    # the finalizer's "Exception ignored ... KeyboardInterrupt" is no error: the mark raises it again
    if not (isinstance(unraisable.exc_value, KeyboardInterrupt) and _pending.is_set()): previous_hook(unraisable)

  if install: signal.signal(signal.SIGINT, _mark_and_raise); sys.unraisablehook = quiet_hook
  try: yield
  finally:
    if install: signal.signal(signal.SIGINT, signal.default_int_handler); sys.unraisablehook = previous_hook
    _pending.clear()


def raise_if_interrupted() -> None:
  """Raise KeyboardInterrupt when a Ctrl-C came that no except clause has consumed (one a finalizer swallowed)."""
  if _pending.is_set():
    _pending.clear()
    raise KeyboardInterrupt


def consume() -> None:
  """The caller handles the KeyboardInterrupt it caught: its mark is spent."""
  _pending.clear()
