"""The typed errors of kc. Every failure a user can cause is one of these, never a bare assert."""


class KcError(Exception):
  """Base class of every error kc raises on purpose."""


class UOpError(KcError, TypeError):
  """A UOp that breaks the IR's typing rules (wrong dtype for its op, wrong arity, bad arg)."""


class SymbolicError(KcError, ValueError):
  """A symbolic expression that cannot be built or evaluated (Variable min > max, unbound variable, undecidable)."""


class RewriteError(KcError, RuntimeError):
  """A graph rewrite that does not reach a fixed point (rules that undo each other or grow without end)."""


class InvalidASTError(KcError, ValueError):
  """An AST that breaks the rules of a kernel; the message names the offending op and shapes."""


class ShapeError(InvalidASTError):
  """A movement op that does not apply to the shape it is given (the message names both)."""


class KernelOptError(KcError):
  """An optimization that cannot be applied to this kernel; the Kernel is left unchanged."""


class OptsError(KcError, ValueError):
  """An `opts` value kc cannot use: not "hand", "none", "beam", a kc.Opt or a list of kc.Opt; the message names the
  value and what would be valid."""


class InvalidOptError(OptsError, KernelOptError):
  """A kc.Opt that no kernel can take: its op is not a kc.OptOps, or its axis or amount is not an int >= 0. Bad input
  (an OptsError), and, like every opt Kernel.apply_opt refuses, a KernelOptError."""


class CompileError(KcError):
  """The backend compiler failed; carries the source and the compiler's message."""
  def __init__(self, msg: str, src: str = "", log: str = ""):
    super().__init__(msg)
    self.src, self.log = src, log


class DeviceUnavailable(KcError):
  """A known device that cannot be opened on this machine; the message says why."""


class PluginError(KcError):
  """A plugin failed to load or speaks another plugin API version."""


class DTypeError(KcError, TypeError):
  """A dtype that does not exist, cannot be mapped, or cannot hold a value."""


class ConfigError(KcError, ValueError):
  """An environment variable or setting whose value kc cannot use; the message names the variable and the value."""


class UnknownDeviceError(KcError, LookupError):
  """A device name no installed plugin registers; the message lists the registered ones."""


class AllocationError(KcError, MemoryError):
  """A buffer larger than the device can allocate in one piece (OpenCL's CL_DEVICE_MAX_MEM_ALLOC_SIZE, Metal's
  maxBufferLength, a GPU's memory); the message names the size asked for and the device's limit."""


class ArgumentError(KcError, ValueError):
  """A call's argument that does not match what the kernel declares; the message names the buffer index, what
  the kernel expects and what was given."""


class DeviceLostError(KcError):
  """The device faulted in a way that leaves it unusable for the rest of this process (a GPU's sticky error: an
  illegal or misaligned address in a kernel); every later call on it fails the same way. A worker process that sees
  one reports it as the crash of the job that caused it and ends, so that the next job gets a fresh device."""
