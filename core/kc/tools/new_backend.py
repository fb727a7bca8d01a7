"""`kc new-backend NAME`: write a complete out-of-tree backend plugin to start a new backend from.

The package it writes is the worked example of docs/BACKENDS.md, small enough to read in one sitting: device NAME
(upper case) renders kernels as plain C (a CStyleLanguage subclass), compiles them with the system C compiler through
kc's cached Compiler base, and runs them on the host with ctypes, so it passes every conformance tier as written.
The generated code imports only `kc` and `kc.backend`, the contract a plugin may rely on.

The templates live here as strings rather than as data files so that a plain (non-editable) install of kc carries
them without any packaging configuration."""
from __future__ import annotations
import re, string, warnings
from dataclasses import dataclass
from pathlib import Path
from kc.errors import KcError
from kc.helpers import distribution_version

_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")


class NewBackendError(KcError, ValueError):
  """A backend name or target folder `kc new-backend` cannot use; the message says what to choose instead."""


@dataclass(frozen=True)
class BackendNames:
  """Every spelling of one backend's name: device TOY, entry point toy, package kc_toy, distribution kc-toy, classes Toy*."""
  name: str

  @property
  def entry_point(self) -> str: return self.name.lower()
  @property
  def device(self) -> str: return self.name.upper()
  @property
  def package(self) -> str: return f"kc_{self.entry_point}"
  @property
  def distribution(self) -> str: return f"kc-{self.entry_point}"
  @property
  def class_prefix(self) -> str: return "".join(part.capitalize() for part in self.entry_point.split("_"))


def backend_names(name: str) -> BackendNames:
  """`name` checked: it becomes a device name and part of a Python package name, so it must be an identifier that
  starts with a letter, as device names do."""
  if not isinstance(name, str) or not _NAME_RE.match(name):
    raise NewBackendError(f"{name!r} cannot name a backend: use letters, digits and _, starting with a letter "
                          "(it becomes the device name in upper case and the package kc_<name> in lower case)")
  return BackendNames(name)


def compatible_range(version: str, project: str = "kc-core") -> str:
  """The requirement a plugin built against `version` of `project` states: the same minor series before 1.0
  (0.1.x -> >=0.1,<0.2), the same major series after (1.4.x -> >=1.4,<2)."""
  m = re.match(r"(\d+)\.(\d+)", version)
  major, minor = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
  upper = f"{major}.{minor + 1}" if major == 0 else f"{major + 1}"
  return f"{project}>={major}.{minor},<{upper}"


# ------------------------------------------------------------------------------------------------------------ templates
# string.Template placeholders: ${device} ${entry_point} ${package} ${dist} ${cls} ${kc_requirement}
# ${conformance_requirement}. A stray $ in a template is an error when it is filled in, never silent.

_PYPROJECT = '''\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "${dist}"
version = "0.1.0"
description = "kc backend ${device}: kernels as C, compiled by the system C compiler, run on the host with ctypes"
readme = "README.md"
requires-python = ">=3.10"
# kc's plugin API may change between minor releases before 1.0: state the series this plugin was written for (kc's
# distribution is kc-core; its import name is kc)
dependencies = ["${kc_requirement}"]

[project.optional-dependencies]
# the conformance suite follows kc's versions: the same series certifies this plugin against the kc it supports
test = ["pytest>=7", "${conformance_requirement}"]

# how kc finds the plugin: group "kc.backends", name = the device name in lower case, value = the module whose
# kc_backends() hook returns the BackendSpec
[project.entry-points."kc.backends"]
${entry_point} = "${package}"

[tool.setuptools]
packages = ["${package}"]
'''

_INIT = '''\
"""${dist}: the ${device} device for kc. Kernels are rendered as C, compiled by the system C compiler into a
shared library and run on the host with ctypes.

kc finds this module through its entry point (pyproject.toml, group "kc.backends") the first time kc.Device is
used, and calls kc_backends(). Keep importing it cheap: a backend with a heavy runtime library (a GPU driver
binding) imports that inside open_device(), never at the top of a module."""
from __future__ import annotations
from kc.backend import PLUGIN_API_VERSION, BackendSpec, CompiledDevice, HostAllocator, distribution_version, hookimpl
from ${package}.compiler import ${cls}Compiler, unavailable_reason
from ${package}.renderer import ${cls}Renderer
from ${package}.runtime import ${cls}Program

__version__ = distribution_version("${dist}")  # "0.0.0+unknown" when imported from a source tree

DEVICE = "${device}"
# kc.Device.DEFAULT is the available device of highest priority (CLANG 10, OPENCL 5, EMU -1000): 1 keeps this
# device from becoming the default until it is meant to be
PRIORITY = 1


def make_renderer() -> ${cls}Renderer:
  """The renderer alone, without opening the device: the render and compile tiers use it on any machine."""
  return ${cls}Renderer()


def open_device() -> CompiledDevice:
  """Called once, on first use of the device. The compiler gets this plugin's name and version: they are part of
  the compile cache key, so a new release never runs binaries an older release built."""
  return CompiledDevice(DEVICE, HostAllocator(), make_renderer(), ${cls}Compiler(f"${dist} {__version__}"), ${cls}Program)


@hookimpl
def kc_backends() -> list[BackendSpec]:
  return [BackendSpec(name=DEVICE, api_version=PLUGIN_API_VERSION, priority=PRIORITY, available=unavailable_reason,
                      open=open_device, renderer=make_renderer, distribution="${dist}", version=__version__)]


__all__ = ["DEVICE", "PRIORITY", "make_renderer", "open_device", "kc_backends", "__version__"]
'''

_RENDERER = '''\
"""The ${device} dialect: plain C99 for the host. CStyleLanguage renders every kernel; this subclass declares what
the Kernel may do on this device (its limits and dtypes) and overrides the few spellings where C differs from the
base's defaults."""
from __future__ import annotations
import platform
from kc.backend import CStyleLanguage, DType, Ops, dtypes


def _math(name: str):
  """A math.h call in the precision of its dtype (expf for float, exp for double), as numpy computes it."""
  def render(x: str, dt: DType) -> str: return f"{name}f({x})" if dt.scalar() == dtypes.float32 else f"{name}({x})"
  return render


class ${cls}Renderer(CStyleLanguage):
  device = "${device}"
  arch = platform.machine()  # what the code is built for; expectation files may match on it
  # One thread and no work-groups: the global dims become loops (global_max None), there is no local memory, and
  # kernels are written without vector types. The Kernel offers only the optimizations these allow.
  has_local = False
  has_shared = False
  global_max = None
  local_max = None
  supports_float4 = False
  # half and bfloat16 have no C arithmetic every compiler accepts: kernels in them are not made for this device,
  # and the conformance suite skips their tests, naming the missing dtype. fp8 needs none: the base holds it as its
  # bits (fp8_as_bits), defines its conversions in C, and extra_matcher computes its arithmetic in float.
  supported_dtypes = frozenset({dtypes.bool, dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16,
                                dtypes.uint32, dtypes.uint64, dtypes.float32, dtypes.float64, dtypes.fp8e4m3, dtypes.fp8e5m2})
  extra_matcher = CStyleLanguage.fp8_in_float
  # built with -fwrapv (compiler.py): signed overflow wraps as in numpy, so int arithmetic is rendered as is
  signed_overflow_wraps = True
  # _Float16 (GCC 12+, Clang): a kernel on float32 buffers may still round through half (x.astype(float16))
  type_map = {dtypes.bool: "_Bool", dtypes.float16: "_Float16"}
  code_for_op = {**CStyleLanguage.code_for_op, Ops.EXP2: _math("exp2"), Ops.LOG2: _math("log2"), Ops.SIN: _math("sin"),
                 Ops.SQRT: _math("sqrt")}

  def render_kernel(self, function_name, body, params, uops, prefix=None) -> str:
    # math.h: the functions above, and INFINITY and NAN, the base's spellings of infinite and not-a-number constants
    return super().render_kernel(function_name, body, params, uops, ["#include <math.h>", *(prefix or [])])
'''

_COMPILER = '''\
"""The system C compiler as a kc Compiler: C source in, shared library bytes out. kc's Compiler base keeps the bytes
in its disk cache, keyed on the source, identity(), kc's version and this plugin's version."""
from __future__ import annotations
import functools, os, shutil, subprocess, tempfile
from typing import Optional, Sequence
from kc.backend import CompileError, Compiler, batch_member, batch_source

CC = "cc"
# a batched compile's library for one of its kernels: this tag, the kernel's name in the batch, a NUL, the library
BATCH_TAG = b"${package}-batch\\0"
# no -ffast-math: kernels must give the IEEE results numpy gives; -fwrapv: signed overflow wraps (renderer.py relies on it)
FLAGS = ("-shared", "-fPIC", "-O2", "-fwrapv")


@functools.lru_cache(maxsize=None)
def version_line(cc: str) -> Optional[str]:
  """The first line of `cc --version`, None when the compiler does not run."""
  try: r = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.SubprocessError): return None
  return (r.stdout.strip().splitlines() or ["(no version output)"])[0] if r.returncode == 0 else None


def unavailable_reason() -> Optional[str]:
  """None when the device can run here, else why not: `kc devices` and `kc doctor` print it. Keep it cheap."""
  if shutil.which(CC) is None: return f"no C compiler: {CC!r} is not on PATH; install gcc or clang"
  if version_line(CC) is None: return f"the C compiler {CC!r} does not run ({CC} --version fails)"
  return None


class ${cls}Compiler(Compiler):
  def identity(self) -> str:
    # everything besides the source that decides the binary: which compiler (its path and version) and the flags.
    # Leave something out and a cached binary from another compiler would be reused.
    return " | ".join([shutil.which(CC) or CC, version_line(CC) or "?", *FLAGS])

  def compile_uncached(self, src: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="${dist}-") as tmp:
      out = os.path.join(tmp, "kernel.so")
      argv = [CC, *FLAGS, "-x", "c", "-", "-o", out, "-lm"]
      try: r = subprocess.run(argv, input=src.encode(), capture_output=True, timeout=600)
      except (OSError, subprocess.SubprocessError) as e: raise CompileError(f"cannot run {' '.join(argv)}: {e}", src=src) from None
      if r.returncode != 0:
        # a CompileError carries the source and the whole log; its message is the first error line
        log = r.stderr.decode(errors="replace")
        first = next((line for line in log.splitlines() if "error" in line), log.strip()[:200])
        raise CompileError(f"{CC} failed to compile the kernel (exit {r.returncode}): {first}", src=src, log=log)
      with open(out, "rb") as f: return f.read()

  def compile_batch_uncached(self, srcs: Sequence[str]) -> list[bytes]:
    # many kernels from one compiler run (kc's Compiler.compile_many calls this; the conformance suite builds every
    # kernel it rendered so): starting the compiler and reading math.h are most of a small kernel's compile. Each
    # source's file-scope names are renamed apart; every member gets the batch's library, tagged with its kernel's
    # name there. Raising CompileError makes compile_many build the sources one by one instead.
    members = [batch_member(i, src) for i, src in enumerate(srcs)]
    if any(len(m.exported) != 1 for m in members): raise CompileError("a batched kernel must define exactly one global function")
    lib = self.compile_uncached(batch_source(members))
    return [BATCH_TAG + next(iter(m.exported.values())).encode() + b"\\0" + lib for m in members]
'''

_RUNTIME = '''\
"""Loading and launching compiled ${device} kernels with ctypes. Buffers live in host memory (kc's HostAllocator
hands out HostMemory), so a kernel is passed the address of each buffer."""
from __future__ import annotations
import ctypes, time
from typing import Optional, Sequence
from kc.backend import HostMemory, KcError, SharedLibrary, int32_values, raw_buffers
from ${package}.compiler import BATCH_TAG


class ${cls}Program:
  """One kernel function in a shared library. kc calls ${cls}Program(name, lib) once per compiled kernel and then
  calls the object for each launch: the program protocol (kc.backend.ProgramHandle).

  The C signature is `void name(T* data0, ..., const int var0, ...)`: buffers first, then the int32 values of the
  kernel's variables. The kernel loops over its whole domain, so global_size and local_size are accepted and ignored."""

  def __init__(self, name: str, lib: bytes):
    self.name = name
    entry = name
    if lib.startswith(BATCH_TAG):  # a batched compile's library: the kernel has another name there
      tagged, _, lib = lib[len(BATCH_TAG):].partition(b"\\0")
      entry = tagged.decode()
    # loaded into this process; unloaded when this program is dropped, so a long-lived process keeps only the
    # kernels it still holds mapped
    self._lib = SharedLibrary(lib, name)
    self._fn = self._lib.function(entry)
    self._fn.restype = None

  def __call__(self, *bufs, global_size: Sequence[int] = (1, 1, 1), local_size: Optional[Sequence[int]] = (1, 1, 1),
               vals: Sequence[int] = (), wait: bool = False) -> Optional[float]:
    args = []
    for i, buf in enumerate(raw_buffers(bufs)):
      if not isinstance(buf, HostMemory): raise KcError(f"buffer {i} of kernel {self.name} is {type(buf).__name__}, not host memory")
      args.append(ctypes.c_void_p(buf.addr))
    args += [ctypes.c_int(v) for v in int32_values(vals, self.name)]
    start = time.perf_counter()
    self._fn(*args)  # synchronous: when it returns, the outputs are written
    return time.perf_counter() - start if wait else None

  def __repr__(self): return f"<${cls}Program {self.name}>"
'''

_TEST = '''\
"""Certification: kc's conformance suite against device ${device}, exactly as `kc conformance --device ${device}` runs it
(render, compile and run tiers, and the error contract)."""
import subprocess, sys


def test_the_conformance_suite_passes_on_${entry_point}():
  r = subprocess.run([sys.executable, "-m", "kc.tools.cli", "conformance", "--device", "${device}"], capture_output=True, text=True)
  assert r.returncode == 0, f"kc conformance --device ${device} failed:\\n{r.stdout[-6000:]}\\n{r.stderr[-3000:]}"
'''

_README = '''\
# ${dist}

The `${device}` device for [kc](https://pypi.org/project/kc/): kernels rendered as C, compiled by the system C
compiler into a shared library, and run on the host with ctypes. It was written by `kc new-backend ${entry_point}`
as a starting point: it works as it is, and each file is the place to change one part of the backend.

| file | what it is |
|---|---|
| `pyproject.toml` | the distribution `${dist}`; its entry point `${entry_point}` in the group `kc.backends` is how kc finds it |
| `${package}/__init__.py` | the `kc_backends` hook: a `BackendSpec` naming the device, its priority, its availability check, \
and the factories of its renderer and device |
| `${package}/renderer.py` | `${cls}Renderer`, a `CStyleLanguage`: the device's limits, dtypes and C spellings |
| `${package}/compiler.py` | `${cls}Compiler`, a kc `Compiler`: source to shared library with `cc`; `identity()` keys the compile cache |
| `${package}/runtime.py` | `${cls}Program`: loads a compiled kernel with ctypes and launches it on host memory |
| `tests/test_conformance.py` | runs kc's conformance suite on the device and asserts it passes |

## Install

```sh
python -m pip install -e .          # from this folder; kc finds the plugin through its entry point
kc devices                          # ${device} is listed, with its renderer's limits
kc run matmul --device ${device}    # one kernel, checked against numpy
```

## Certify

```sh
python -m pip install kc-conformance
kc conformance --device ${device} --report report.json --report report.html
python -m pytest tests              # the same, as a test
```

The suite renders, compiles and runs its kernels on the device and compares them with numpy. `--tier render` or
`--tier compile` stops early, which is how a backend is certified on a machine that cannot run it; `--expect FILE`
lists the backend's known failures, each with a reason and a link. kc's `docs/BACKENDS.md` explains each tier.
'''

_FILES = {
  "pyproject.toml": _PYPROJECT,
  "README.md": _README,
  "${package}/__init__.py": _INIT,
  "${package}/renderer.py": _RENDERER,
  "${package}/compiler.py": _COMPILER,
  "${package}/runtime.py": _RUNTIME,
  "tests/test_conformance.py": _TEST,
}


def render_files(name: str) -> dict[str, str]:
  """The generated package: relative path -> file text, for backend `name`."""
  n = backend_names(name)
  kc_version = distribution_version("kc-core")
  values = {"device": n.device, "entry_point": n.entry_point, "package": n.package, "dist": n.distribution, "cls": n.class_prefix,
            "kc_requirement": compatible_range(kc_version), "conformance_requirement": compatible_range(kc_version, "kc-conformance")}
  return {string.Template(path).substitute(values): string.Template(text).substitute(values) for path, text in _FILES.items()}


def _check_name_is_free(n: BackendNames) -> None:
  """A device that is registered already would clash with the new one when both are installed: refuse it now."""
  from kc.runtime.device import Device
  from kc.runtime.plugins import PluginWarning
  with warnings.catch_warnings():  # a broken unrelated plugin is `kc devices`' business, not this command's
    warnings.simplefilter("ignore", PluginWarning)
    names = Device.names()
  if n.device in names:
    raise NewBackendError(f"device {n.device} is already registered by {Device.spec(n.device).origin}: "
                          f"pick another name (registered: {', '.join(names)})")


def write_backend(name: str, directory: str | Path = ".") -> Path:
  """Write the plugin package for backend `name` into `directory`/kc-<name>/ and return that folder. The folder
  must not exist or be empty: nothing is ever overwritten."""
  n = backend_names(name)
  _check_name_is_free(n)
  root = Path(directory) / n.distribution
  if root.exists() and not root.is_dir():
    raise NewBackendError(f"{root} exists and is not a folder: remove it or choose another --dir")
  if root.is_dir() and any(root.iterdir()):
    raise NewBackendError(f"{root} exists and is not empty: choose another --dir, or remove the folder to write it again")
  files = render_files(name)
  try:
    for rel, text in files.items():
      path = root / rel
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(text)
  except OSError as e:
    raise NewBackendError(f"cannot write the backend into {root}: {e}") from None
  return root


__all__ = ["NewBackendError", "BackendNames", "backend_names", "compatible_range", "render_files", "write_backend"]
