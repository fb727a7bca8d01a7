"""Which OpenCL device kc uses and what it can do. pyopencl is imported inside the functions, never at import
time, so `import kc_opencl` works (and says why the device is unavailable) where pyopencl or a platform is missing.

The device is `KC_OPENCL_DEVICE=platform:device` (indices into pyopencl's lists) when set; otherwise the first
GPU or accelerator of any platform, else the first device of the first platform that has one. It is available
only where its driver's compiler builds a trivial kernel for it (compiler_problem): a driver can list a device its
own compiler cannot target."""
from __future__ import annotations
import functools, importlib.util, threading
from dataclasses import dataclass
from typing import Any, Optional
from kc.backend import DeviceUnavailable, knob

ENV_DEVICE = "KC_OPENCL_DEVICE"
CHOICE = knob(ENV_DEVICE, str, "", "the OpenCL device as platform:device (indices into pyopencl's lists)", __name__,
              default_doc="the first GPU or accelerator, else the first device")
INSTALL_HINT = "pip install 'kc-opencl[pocl]' for PoCL's CPU device, or install your GPU vendor's OpenCL driver"


def list_platforms() -> list:
  """pyopencl's platforms. An ICD loader with no platform raises PLATFORM_NOT_FOUND_KHR instead of returning []."""
  import pyopencl as cl
  try: return list(cl.get_platforms())
  except cl.LogicError as e:
    if "PLATFORM_NOT_FOUND" in str(e): return []
    raise


def _devices_of(platform) -> list:
  import pyopencl as cl
  try: return list(platform.get_devices())
  except cl.LogicError as e:  # a platform without devices says DEVICE_NOT_FOUND rather than returning []
    if "DEVICE_NOT_FOUND" in str(e): return []
    raise


def _parse_choice(text: str) -> tuple[int, int]:
  try:
    p, d = text.split(":")
    return int(p), int(d)
  except ValueError:
    raise DeviceUnavailable(f"{ENV_DEVICE}={text!r} is not 'platform:device' (two indices, e.g. 0:1)") from None


def _describe(platforms: list) -> str:
  rows = [f"{i}:{j} {d.name.strip()} ({p.name.strip()})" for i, p in enumerate(platforms) for j, d in enumerate(_devices_of(p))]
  return ", ".join(rows) or "none"


def select_device() -> Any:
  """The pyopencl Device kc opens; DeviceUnavailable saying why when there is none (or the choice is wrong)."""
  if importlib.util.find_spec("pyopencl") is None: raise DeviceUnavailable(f"pyopencl is not installed: {INSTALL_HINT}")
  import pyopencl as cl
  platforms = list_platforms()
  if not platforms: raise DeviceUnavailable(f"no OpenCL platform is installed (the ICD loader found none): {INSTALL_HINT}")
  if (choice := CHOICE.get()):
    p, d = _parse_choice(choice)
    devices = _devices_of(platforms[p]) if 0 <= p < len(platforms) else []
    if not 0 <= d < len(devices):
      raise DeviceUnavailable(f"{ENV_DEVICE}={choice} names no device; the devices are {_describe(platforms)}")
    return devices[d]
  every = [d for p in platforms for d in _devices_of(p)]
  if not every: raise DeviceUnavailable(f"the OpenCL platforms ({', '.join(p.name.strip() for p in platforms)}) have no devices: {INSTALL_HINT}")
  fast = [d for d in every if d.type & (cl.device_type.GPU | cl.device_type.ACCELERATOR)]
  return (fast or every)[0]


def unavailable_reason() -> Optional[str]:
  """None when an OpenCL device can be opened here and its compiler builds kernels, else why not (and what to do)."""
  try: device = select_device()
  except DeviceUnavailable as e: return str(e)
  if (problem := compiler_problem(device)) is None: return None
  info = DeviceInfo.of(device)
  return (f"the OpenCL driver's compiler cannot build a trivial kernel for {info.name} ({info.platform}): {problem}. "
          f"Use the CLANG device instead (KC_DEVICE=CLANG), or an OpenCL implementation whose compiler supports this "
          f"{'CPU' if info.is_cpu else 'device'} ({ENV_DEVICE} picks another device where there is one)")


_probed: dict[DeviceInfo, Optional[str]] = {}  # a device's DeviceInfo (which names its driver): compiler_problem's answer
_probe_lock = threading.Lock()


def compiler_problem(device) -> Optional[str]:
  """None when the driver's compiler builds a trivial kernel for `device`, else its first error line. The build runs
  once per process and device (and driver); later calls only read the device's info."""
  info = DeviceInfo.of(device)
  with _probe_lock:  # held through the build: a second thread waits for the answer rather than build again
    if info not in _probed:
      from kc_opencl.compiler import build_problem  # imports pyopencl, which select_device found
      _probed[info] = build_problem(device, info)
    return _probed[info]


@dataclass(frozen=True)
class DeviceInfo:
  """What the renderer, compiler and runtime need to know about one OpenCL device."""
  name: str
  platform: str
  version: str                  # CL_DEVICE_VERSION: for PoCL it names the CPU the code is built for
  driver_version: str
  max_work_item_sizes: tuple[int, ...]
  max_work_group_size: int
  local_mem_size: int
  address_bits: int
  mem_base_addr_align: int      # bits: sub-buffer offsets must be multiples of this
  extensions: frozenset[str]
  image_support: bool
  correctly_rounded_divide_sqrt: bool
  is_cpu: bool = False          # CL_DEVICE_TYPE_CPU (PoCL's pthread device): work-items run as vector code on cores

  @property
  def has_fp16(self) -> bool: return "cl_khr_fp16" in self.extensions
  @property
  def has_fp64(self) -> bool: return "cl_khr_fp64" in self.extensions

  @classmethod
  def of(cls, dev) -> DeviceInfo:
    import pyopencl as cl
    return cls(name=dev.name.strip(), platform=f"{dev.platform.name.strip()} {dev.platform.version.strip()}", version=dev.version.strip(),
               driver_version=dev.driver_version.strip(), max_work_item_sizes=tuple(int(x) for x in dev.max_work_item_sizes),
               max_work_group_size=int(dev.max_work_group_size), local_mem_size=int(dev.local_mem_size),
               address_bits=int(dev.address_bits), mem_base_addr_align=int(dev.mem_base_addr_align),
               extensions=frozenset(dev.extensions.split()), image_support=bool(dev.image_support),
               correctly_rounded_divide_sqrt=bool(dev.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT),
               is_cpu=bool(dev.type & cl.device_type.CPU))


@functools.lru_cache(maxsize=None)
def _info_for(choice: str) -> DeviceInfo:
  return DeviceInfo.of(select_device())


def selected_info() -> DeviceInfo:
  """The DeviceInfo of the selected device (queried once per KC_OPENCL_DEVICE value); DeviceUnavailable if none."""
  return _info_for(CHOICE.get())
