"""The backend contract: everything a kc backend plugin imports, in one module.

A backend makes kc run kernels on one more kind of device. It is a Python distribution of its own (kc-clang,
kc-opencl, kc-cuda, kc-metal and kc-llvm in this repository's plugins/ are five) that imports only `kc` and `kc.backend`, plus
its own modules and its own dependencies. Nothing else in kc is part of the contract; everything here is, and keeps working within one
PLUGIN_API_VERSION.

What a backend provides
-----------------------
- a Renderer: subclass CStyleLanguage for a C-like dialect, or Renderer for anything else (kc-llvm's emits LLVM
  IR; docs/BACKENDS.md). It declares the device's limits (has_local, has_shared, supports_float4, global_max,
  local_max, shared_max), its TensorCores, and turns a kernel's linear UOps into source, in whatever language its
  Compiler reads, with `render(name, uops) -> str`. The UOp names a renderer
  matches on (Ops, UOp, UPat, PatternMatcher, GroupOp, DType, PtrDType, ImageDType, dtypes) are re-exported here.
- a Compiler: subclass it and implement `compile_uncached(src) -> bytes` (raise CompileError with the compiler's
  log) and `identity()` (what besides the source decides the binary). `Compiler.compile` keeps kc's disk cache.
- an Allocator: subclass Allocator (or LRUAllocator, which recycles freed buffers of the same size); host-memory
  devices use HostAllocator and HostMemory as they are.
- a program loader: `runtime(name, lib)` returns a ProgramHandle, a callable that launches the kernel. Pass its
  buffers through `raw_buffers` and its variable values through `int32_values`. A host backend whose renderer
  splits a kernel's outer loop into parts (`splits_loop` says which loop, `thread_count` into how many) runs
  them at once on kc's kernel threads with `run_parts`.
- a CompiledDevice bundling the four, and a BackendSpec saying how to check, open and render for the device.

How it is registered
--------------------
The distribution declares an entry point in the group `kc.backends` (ENTRY_POINT_GROUP), named after the device
in lower case, whose object (usually the package module) has a `kc_backends` hook, as specified by BackendHooks:

    # pyproject.toml
    [project.entry-points."kc.backends"]
    mydev = "kc_mydev"

    # kc_mydev/__init__.py
    from kc.backend import PLUGIN_API_VERSION, BackendSpec, hookimpl

    def open_device():                 # called the first time kc.Device["MYDEV"] is used
      from kc_mydev.runtime import open_mydev   # import the heavy driver bindings here, never at module level
      return open_mydev()              # -> a CompiledDevice

    def make_renderer():               # renders (and compiles) on machines without the device
      from kc_mydev.renderer import MyDevRenderer
      return MyDevRenderer()

    @hookimpl
    def kc_backends() -> list[BackendSpec]:
      return [BackendSpec(name="MYDEV", api_version=PLUGIN_API_VERSION, priority=50, available=lambda: None,
                          open=open_device, renderer=make_renderer)]

kc discovers plugins the first time kc.Device is used, never at `import kc`. Each plugin is loaded, registered with
kc's pluggy PluginManager (which checks the hook's signature against BackendHooks) and asked for its devices on its
own: whatever one plugin gets wrong is recorded against its distribution in `kc.Device.errors()` (and warned about
once), and the other plugins load regardless. `KC_STRICT_PLUGINS=1` makes such a failure raise kc.PluginError,
which is what a plugin's own CI should set. `kc devices` and `kc doctor` show what was found and what failed.

Plugin API versions
-------------------
Every BackendSpec declares the plugin API it was written for: pass PLUGIN_API_VERSION (an ApiVersion, MAJOR.MINOR)
as imported from this module. `api_compatible(version)` is the rule kc applies: the same major as this kc's
PLUGIN_API_VERSION and a minor no newer than its minor, so a plugin built for an older minor (which adds to the API
only) keeps loading. A spec outside that range is refused with a kc.PluginError naming the plugin's distribution, its
version, both API versions and the range; the plugin's other devices and the other plugins still load. A plugin's own
pyproject.toml should also depend on a kc version range that speaks its API version (kc-clang: "kc-core>=0.1,<0.2").
`KC_DISABLE_PLUGINS=name,...` leaves plugins unloaded without uninstalling them.

Environment knobs
-----------------
A plugin's environment variables are declared, so that kc lists them with its own (`kc config`, docs/CONFIG.md):
`ARCH = knob("KC_MYDEV_ARCH", str, "", "the arch to compile for", __name__)` at module level in a module the package
imports, read with `ARCH.get()` or `read_knob(name)` (a scoped kc.Context override wins over the environment; a bad
value is a ConfigError naming the variable). `env_value(name, default)` is plugin API 1.0's read, kept for plugins
built for it.

For a device defined inside a program or a test, `register(spec)` adds it to kc.Device without a distribution or
an entry point, and `unregister(name)` removes it."""
from kc.errors import AllocationError, CompileError, ConfigError, DeviceLostError, DeviceUnavailable, KcError, PluginError
from kc.config import Knob, env_value, knob, read as read_knob
from kc.helpers import distribution_version
from kc.ir.dtype import DType, ImageDType, PtrDType, dtypes
from kc.ir.rewrite import PatternMatcher, UPat
from kc.ir.uop import GroupOp, Ops, UOp
from kc.renderer import Program, Renderer, TensorCore, WMMAArg, estimate_ops
from kc.renderer.cstyle import CStyleLanguage
from kc.renderer.batch import BatchMember, batch_member, batch_source
from kc.kernel.tc_layout import FragmentLayout, derive_fragment_layout, layout_mismatch
from kc.runtime.device import (Allocator, CompiledDevice, Compiler, HostAllocator, HostMemory, InvalidBufferError, LRUAllocator,
                               ProgramHandle, int32_values, raw_buffers)
from kc.runtime.host_parts import (PARALLEL_MIN_OPS, KernelThreads, SplitChoice, kernel_threads, max_threads, run_parts,
                                  splits_loop, thread_count)
from kc.runtime.shared_library import SharedLibrary
from kc.runtime.plugins import (ENTRY_POINT_GROUP, PLUGIN_API_VERSION, ApiVersion, BackendHooks, BackendSpec,
                                PluginWarning, api_compatible, hookimpl, hookspec, register, unregister)

__all__ = [
  # registering a backend
  "ENTRY_POINT_GROUP", "PLUGIN_API_VERSION", "ApiVersion", "api_compatible", "hookspec", "hookimpl", "BackendHooks",
  "BackendSpec", "register", "unregister", "PluginWarning",
  # a backend's environment knobs
  "Knob", "knob", "read_knob",
  # what a backend subclasses or returns
  "Renderer", "TensorCore", "WMMAArg", "Program", "CStyleLanguage", "Compiler", "Allocator", "LRUAllocator", "HostAllocator",
  "HostMemory", "CompiledDevice", "ProgramHandle", "raw_buffers", "int32_values", "estimate_ops", "env_value",
  "distribution_version",
  # running a split kernel's parts at once on persistent threads (host backends)
  "run_parts", "kernel_threads", "KernelThreads", "SplitChoice", "splits_loop", "thread_count", "max_threads", "PARALLEL_MIN_OPS",
  # a compiled shared library in this process, unloaded when dropped (host backends)
  "SharedLibrary",
  # many C-family kernels in one compiler run, their file-scope names renamed apart (Compiler.compile_batch_uncached)
  "BatchMember", "batch_member", "batch_source",
  # checking a TensorCore's declared layout against the instruction's documented one
  "FragmentLayout", "derive_fragment_layout", "layout_mismatch",
  # the UOp-level names a renderer matches on
  "Ops", "UOp", "UPat", "PatternMatcher", "GroupOp", "DType", "PtrDType", "ImageDType", "dtypes",
  # the errors a backend raises
  "KcError", "CompileError", "DeviceUnavailable", "ConfigError", "PluginError", "InvalidBufferError", "AllocationError",
  "DeviceLostError",
]
