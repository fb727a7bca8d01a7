"""The CUDA driver as kc sees it: whether a GPU can be opened here, what the selected one can do, one error
convention for every driver call, and the launch arguments cuLaunchKernel takes.

Importing this module is cheap and works anywhere: cuda.bindings (NVIDIA's cuda-bindings) is imported inside the
functions that call the driver, and the launch helpers at the end are plain Python and ctypes, so they are checked
on machines without a GPU.

Every cuda.bindings.driver call returns a tuple whose first element is a CUresult and whose other elements are the
call's outputs; `check` turns that tuple into the outputs or a typed kc error."""
from __future__ import annotations
import ctypes, functools, importlib.util, math, sys
from dataclasses import dataclass
from typing import Any, Optional, Sequence
from kc.backend import ConfigError, DeviceLostError, DeviceUnavailable, KcError, knob

ENV_DEVICE = "KC_CUDA_DEVICE"
ORDINAL = knob(ENV_DEVICE, int, 0, "the ordinal of the GPU the CUDA device opens (as the driver counts, "
               "CUDA_VISIBLE_DEVICES applied)", __name__)
INSTALL_HINT = "pip install kc-cuda"
# the shared memory any kernel may use; more needs the kernel's own opt-in (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
STATIC_SHARED_LIMIT = 48 * 1024
SUCCESS = 0
OUT_OF_MEMORY = "CUDA_ERROR_OUT_OF_MEMORY"
# errors after which the context is unusable: every later call in this process fails the same way
STICKY_ERRORS = frozenset({"CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_ILLEGAL_INSTRUCTION",
                           "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_INVALID_PC",
                           "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_ASSERT", "CUDA_ERROR_ECC_UNCORRECTABLE"})


class CUDAError(KcError):
  """A CUDA driver call failed. `call` is what was called, `result` the CUresult's name (CUDA_ERROR_...)."""
  call: str = ""
  result: str = ""


class CUDADeviceLost(CUDAError, DeviceLostError):
  """A sticky error (STICKY_ERRORS): a kernel faulted and the context is unusable for the rest of this process."""


class CUDAOutOfMemory(CUDAError, MemoryError):
  """The GPU has no room for an allocation (CUDA_ERROR_OUT_OF_MEMORY): kc's LRUAllocator frees its cache and retries."""


# ---------------------------------------------------------------------------------------------------------- errors

def result_name(result: Any) -> str:
  """The name of a CUresult (an enum member or a plain int), e.g. CUDA_ERROR_INVALID_VALUE."""
  if (name := getattr(result, "name", None)) is not None: return str(name)
  try:
    from cuda.bindings import driver as cu
    return cu.CUresult(int(result)).name
  except Exception:  # an int the bindings do not know, or no bindings at all
    return f"CUresult {int(result)}"


def error_string(result: Any) -> str:
  """The driver's own description of a CUresult (cuGetErrorString), or a note that the driver could not say."""
  try:
    from cuda.bindings import driver as cu
    err, text = cu.cuGetErrorString(result if isinstance(result, cu.CUresult) else cu.CUresult(int(result)))
  except Exception:  # the driver library is missing: the name alone has to do
    return "the driver gave no description"
  if int(err) != SUCCESS or not text: return "the driver gave no description"
  return text.decode(errors="replace") if isinstance(text, bytes) else str(text)


def error_for(result: Any, what: str, opening: bool = False) -> KcError:
  """The kc error for a failed driver call `what`: DeviceUnavailable while the device is being opened, CUDADeviceLost
  for a sticky error (a kc.DeviceLostError: a worker that sees it ends), CUDAOutOfMemory for CUDA_ERROR_OUT_OF_MEMORY,
  else CUDAError. The message names the call, the CUresult and the driver's description."""
  name = result_name(result)
  msg = f"{what} failed with {name}: {error_string(result)}"
  if name in STICKY_ERRORS:
    msg += (". A kernel faulted, which leaves the CUDA context unusable for the rest of this process: restart it, and run "
            "the failing kernel under compute-sanitizer to find the bad access")
  cls = (CUDADeviceLost if name in STICKY_ERRORS else DeviceUnavailable if opening else
         CUDAOutOfMemory if name == OUT_OF_MEMORY else CUDAError)
  err = cls(msg)
  err.call, err.result = what, name
  return err


def check(result: tuple, what: str, opening: bool = False) -> Any:
  """The outputs of a driver call from its result tuple (None for none, the value for one, a tuple for more), or
  the call's typed error (see error_for) when its CUresult is not CUDA_SUCCESS."""
  if not isinstance(result, tuple) or not result:
    raise KcError(f"{what} returned {result!r}, not a (CUresult, ...) tuple: is cuda-bindings older than 12.6? {INSTALL_HINT}")
  status, *values = result
  if int(status) != SUCCESS: raise error_for(status, what, opening)
  return None if not values else values[0] if len(values) == 1 else tuple(values)


# ---------------------------------------------------------------------------------------------------------- availability

def driver_library_name() -> Optional[str]:
  """The file name of the NVIDIA driver's CUDA library on this OS; None where CUDA does not run (macOS)."""
  if sys.platform.startswith("linux"): return "libcuda.so.1"
  if sys.platform == "win32": return "nvcuda.dll"
  return None


def _bindings_missing() -> bool:
  try: return importlib.util.find_spec("cuda.bindings") is None
  except (ImportError, ValueError): return True  # no `cuda` package at all


def _driver_library_reason() -> Optional[str]:
  """Why the driver library cannot be loaded, found with ctypes before cuda.bindings is imported: that is cheap and
  says plainly what is missing, where the bindings would fail on their first call with a long search report."""
  if (lib := driver_library_name()) is None: return f"CUDA needs an NVIDIA GPU on Linux or Windows; this is {sys.platform}"
  try: ctypes.CDLL(lib)
  except OSError:
    return (f"no NVIDIA driver here ({lib} was not found): install the NVIDIA driver, or run where a GPU is visible "
            "(e.g. docker run --gpus all)")
  return None


def init_driver(opening: bool = True) -> None:
  """cuInit(0), as every process must before any other driver call (calling it again is harmless)."""
  from cuda.bindings import driver as cu
  check(cu.cuInit(0), "cuInit(0)", opening=opening)


def device_count() -> int:
  from cuda.bindings import driver as cu
  return int(check(cu.cuDeviceGetCount(), "cuDeviceGetCount()", opening=True))


def selected_ordinal() -> int:
  """The device ordinal kc opens: KC_CUDA_DEVICE (default 0), counted as the driver counts (CUDA_VISIBLE_DEVICES applied)."""
  ordinal = ORDINAL.get()
  if ordinal < 0: raise ConfigError(f"{ENV_DEVICE}={ordinal} is not a device ordinal: set it to 0, 1, ... or unset it for 0")
  return ordinal


@functools.cache
def _reason_for(ordinal: int) -> Optional[str]:
  if _bindings_missing(): return f"NVIDIA's cuda-bindings are not installed: {INSTALL_HINT}"
  if (why := _driver_library_reason()) is not None: return why
  try:
    init_driver()
    count = device_count()
  except DeviceUnavailable as e:
    return f"the NVIDIA driver cannot start CUDA ({e}); nvidia-smi shows whether the driver and the GPU are healthy"
  except Exception as e:  # the bindings failed to reach the driver their own way (e.g. a library search error)
    return f"cuda-bindings cannot use the NVIDIA driver ({type(e).__name__}: {e}): {INSTALL_HINT} into this Python, and check nvidia-smi"
  if count == 0: return "the NVIDIA driver sees no CUDA device: check nvidia-smi, and CUDA_VISIBLE_DEVICES if it is set"
  if ordinal >= count: return f"{ENV_DEVICE}={ordinal} names no device: the driver sees {count} (ordinals 0..{count - 1})"
  return None


def unavailable_reason() -> Optional[str]:
  """None when the selected CUDA GPU can be opened here, else one sentence saying why and what to do. Asks the
  driver once per process (per KC_CUDA_DEVICE value) and never raises."""
  try: return _reason_for(selected_ordinal())
  except KcError as e: return str(e)
  except Exception as e:  # the bindings or the driver failed in a way they do not document: report, never raise
    return f"the CUDA driver could not be queried ({type(e).__name__}: {e})"


# ---------------------------------------------------------------------------------------------------------- properties

@dataclass(frozen=True)
class DeviceProps:
  """What the renderer, compiler and runtime need to know about one CUDA device. Memory sizes are bytes, clock
  rates kHz; the optional figures are None where the driver does not report them."""
  name: str
  ordinal: int
  compute_capability: tuple[int, int]
  multiprocessor_count: int
  max_threads_per_block: int
  max_block_dims: tuple[int, int, int]
  max_grid_dims: tuple[int, int, int]
  shared_per_block: int                # what a kernel may use without opting in (48 KiB)
  shared_per_block_optin: int          # the most a kernel may use after opting in (227 KiB on sm_90)
  total_memory: int
  driver_version: int                  # 1000 * major + 10 * minor, as cuDriverGetVersion gives it
  warp_size: int = 32
  clock_rate_khz: Optional[int] = None
  memory_clock_rate_khz: Optional[int] = None
  memory_bus_width_bits: Optional[int] = None
  l2_cache_size: Optional[int] = None

  @property
  def arch(self) -> str:
    """The NVRTC target, e.g. sm_90 (never the arch-specific sm_90a: kc's kernels use no wgmma/TMA)."""
    return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

  @property
  def driver_version_text(self) -> str: return f"{self.driver_version // 1000}.{self.driver_version % 1000 // 10}"

  @property
  def memory_bandwidth(self) -> Optional[float]:
    """The theoretical DRAM bandwidth in bytes/s (double data rate), where the driver reports clock and bus width."""
    if not self.memory_clock_rate_khz or not self.memory_bus_width_bits: return None
    return 2 * self.memory_clock_rate_khz * 1e3 * self.memory_bus_width_bits / 8


def _attribute(dev, name: str, optional: bool = False) -> Optional[int]:
  from cuda.bindings import driver as cu
  attr = getattr(cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}", None)
  if attr is None:
    if optional: return None
    raise KcError(f"cuda-bindings has no CU_DEVICE_ATTRIBUTE_{name}: {INSTALL_HINT} for a supported version")
  try: value = int(check(cu.cuDeviceGetAttribute(attr, dev), f"cuDeviceGetAttribute({attr.name})", opening=not optional))
  except KcError:
    if optional: return None  # newer drivers drop some (CLOCK_RATE and MEMORY_CLOCK_RATE in CUDA 13)
    raise
  return value if value or not optional else None


@functools.cache
def device_props(ordinal: int) -> DeviceProps:
  """The properties of device `ordinal`, asked from the driver once per process (cuInit is called first)."""
  from cuda.bindings import driver as cu
  init_driver()
  dev = check(cu.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})", opening=True)
  raw_name = check(cu.cuDeviceGetName(256, dev), "cuDeviceGetName", opening=True)
  name = raw_name.split(b"\0", 1)[0].decode(errors="replace").strip()
  a = functools.partial(_attribute, dev)
  return DeviceProps(
    name=name, ordinal=ordinal,
    compute_capability=(a("COMPUTE_CAPABILITY_MAJOR"), a("COMPUTE_CAPABILITY_MINOR")),
    multiprocessor_count=a("MULTIPROCESSOR_COUNT"), max_threads_per_block=a("MAX_THREADS_PER_BLOCK"),
    max_block_dims=(a("MAX_BLOCK_DIM_X"), a("MAX_BLOCK_DIM_Y"), a("MAX_BLOCK_DIM_Z")),
    max_grid_dims=(a("MAX_GRID_DIM_X"), a("MAX_GRID_DIM_Y"), a("MAX_GRID_DIM_Z")),
    shared_per_block=a("MAX_SHARED_MEMORY_PER_BLOCK"),
    shared_per_block_optin=a("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", optional=True) or a("MAX_SHARED_MEMORY_PER_BLOCK"),
    total_memory=int(check(cu.cuDeviceTotalMem(dev), "cuDeviceTotalMem", opening=True)),
    driver_version=int(check(cu.cuDriverGetVersion(), "cuDriverGetVersion", opening=True)),
    warp_size=a("WARP_SIZE"), clock_rate_khz=a("CLOCK_RATE", optional=True),
    memory_clock_rate_khz=a("MEMORY_CLOCK_RATE", optional=True), memory_bus_width_bits=a("GLOBAL_MEMORY_BUS_WIDTH", optional=True),
    l2_cache_size=a("L2_CACHE_SIZE", optional=True))


# ---------------------------------------------------------------------------------------------------------- launch arguments

def _dims3(dims: Optional[Sequence[int]], what: str, kernel: str) -> tuple[int, int, int]:
  """`dims` as (x, y, z), missing axes 1; a KcError for anything but up to three ints >= 0."""
  if dims is None: return (1, 1, 1)
  try: out = [int(d) for d in dims]
  except (TypeError, ValueError):
    raise KcError(f"kernel {kernel}: {what} {dims!r} is not a sequence of ints") from None
  if len(out) > 3 or any(d < 0 for d in out):
    raise KcError(f"kernel {kernel}: {what} {list(dims)} must be at most three sizes >= 0 (x, y, z)")
  return tuple(out + [1] * (3 - len(out)))  # type: ignore[return-value]


# threads per block kc picks for a kernel that leaves its block to the runtime: enough to fill a warp many times over,
# few enough that any GPU runs it
AUTO_BLOCK_THREADS = 256


def auto_block(global_ids: tuple[int, int, int], props: DeviceProps) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
  """(grid, block) for a kernel with only global ids (local_size None, e.g. after NOLOCALS): the renderer computes a
  global id as blockIdx*blockDim+threadIdx with no bounds check, so each axis's block must divide its global size
  exactly; per axis, x first, the largest power of two that does, within AUTO_BLOCK_THREADS threads in all."""
  grid, block, room = [], [], min(AUTO_BLOCK_THREADS, props.max_threads_per_block)
  for g, most in zip(global_ids, props.max_block_dims):
    b = 1
    while g % (b * 2) == 0 and b * 2 <= min(room, most): b *= 2
    room //= b
    grid.append(g // b)
    block.append(b)
  return tuple(grid), tuple(block)  # type: ignore[return-value]


def launch_config(kernel: str, global_size: Optional[Sequence[int]], local_size: Optional[Sequence[int]],
                  props: DeviceProps) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
  """The (grid, block) of a launch in kc's terms: global_size counts blocks per axis and local_size is the block;
  local_size None means global_size counts threads and kc picks the block (auto_block).

  A launch with a 0 anywhere is empty (the caller runs nothing) and is not checked against the device's limits;
  anything else is, with a KcError that says which limit and what to change."""
  grid, block = _dims3(global_size, "global_size", kernel), _dims3(local_size, "local_size", kernel)
  if 0 in grid or 0 in block: return grid, block
  if local_size is None: grid, block = auto_block(grid, props)
  too_big = [f"{'xyz'[i]} {b} > {m}" for i, (b, m) in enumerate(zip(block, props.max_block_dims)) if b > m]
  if too_big or (threads := math.prod(block)) > props.max_threads_per_block:
    why = "; ".join(too_big) or f"{threads} threads > {props.max_threads_per_block}"
    raise KcError(f"kernel {kernel} asks for a block {list(block)} that {props.name} cannot run ({why}): use smaller LOCAL/GROUP opts")
  if over := [f"{'xyz'[i]} {g} > {m}" for i, (g, m) in enumerate(zip(grid, props.max_grid_dims)) if g > m]:
    raise KcError(f"kernel {kernel} asks for a grid {list(grid)} of blocks that {props.name} cannot launch ({'; '.join(over)}): "
                  "the renderer's global_max must match the device")
  return grid, block


def dynamic_shared_bytes(meta: dict, props: DeviceProps, kernel: str) -> int:
  """The dynamic shared memory a kernel's library asks for (meta["dynamic_shared"]), checked against the device."""
  need = meta.get("dynamic_shared", 0)
  if not isinstance(need, int) or isinstance(need, bool) or need < 0:
    raise KcError(f"kernel {kernel}: its library says dynamic_shared={need!r}, not a byte count: clear KC_CACHE_DIR and compile again")
  if need > props.shared_per_block_optin:
    raise KcError(f"kernel {kernel} needs {need} bytes of shared memory; {props.name} gives a block at most "
                  f"{props.shared_per_block_optin}: use smaller LOCAL/UPCAST opts or tensor-core tiles")
  return need


class KernelParams:
  """cuLaunchKernel's kernelParams: an array of pointers, one per kernel parameter, each to that parameter's value.
  Buffers are CUdeviceptr values (64-bit addresses) and come first, then the int32 variable values, in the order
  the renderer declares them. The object owns the storage; keep it alive until cuLaunchKernel returns (the driver
  copies the values when the launch is enqueued)."""
  __slots__ = ("values", "pointers")

  def __init__(self, device_pointers: Sequence[int], int32s: Sequence[int]):
    self.values: list = [ctypes.c_uint64(p) for p in device_pointers] + [ctypes.c_int32(v) for v in int32s]
    self.pointers = (ctypes.c_void_p * max(1, len(self.values)))(*(ctypes.addressof(v) for v in self.values))

  @property
  def address(self) -> int:
    """The void** to pass as kernelParams (0, i.e. NULL, for a kernel without parameters)."""
    return ctypes.addressof(self.pointers) if self.values else 0

  def __len__(self): return len(self.values)


__all__ = ["ENV_DEVICE", "INSTALL_HINT", "STATIC_SHARED_LIMIT", "CUDAError", "CUDAOutOfMemory", "DeviceProps", "KernelParams", "check",
           "error_for", "error_string", "result_name", "device_props", "device_count", "init_driver", "selected_ordinal",
           "unavailable_reason", "launch_config", "auto_block", "dynamic_shared_bytes", "driver_library_name"]
