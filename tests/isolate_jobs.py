"""Jobs for tests/test_testing_worker.py, in a plain module so that spawned workers can import them by name."""
import os, signal, tempfile, time
from kc.errors import DeviceLostError, KcError


def echo_handler(prefix: str = ""):
  """A worker setup: jobs are (what to do, argument)."""
  def handle(job, note):
    what, arg = job
    if what == "return": return prefix + arg
    if what == "kc-error": raise KcError(arg)
    if what == "value-error": raise ValueError(arg)
    if what == "lost-device":  # a sticky GPU fault, wrapped as a plugin might wrap it
      try: raise DeviceLostError(arg)
      except DeviceLostError as e: raise KcError("launching the kernel failed") from e
    if what == "segfault": os.kill(os.getpid(), signal.SIGSEGV)
    if what == "exit": os._exit(arg)
    if what == "hang": time.sleep(arg)
    if what == "note":
      note(arg)
      return "noted"
    if what == "unpicklable": return lambda: None
    if what == "tempfile":  # a temporary folder with a file in it, left behind: its path
      folder = tempfile.mkdtemp()
      with open(os.path.join(folder, "left"), "w") as f: f.write(arg)
      return folder
    if what == "sigint":
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(0.2)
      return "still here"
    raise AssertionError(what)
  return handle


def failing_setup():
  raise KcError("the device does not open here")
