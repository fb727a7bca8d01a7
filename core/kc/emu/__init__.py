"""The EMU device: runs the exact linear UOps a Renderer receives with numpy, so that the lowering for any backend
(a GPU dialect, any plugin) can be checked numerically on a CPU.

The "source" EMU compiles is the UOp list itself (serialized by EmuRenderer.render); its runtime interprets it.
All threads of a batch of work-groups run in lock-step: each UOp's value is a numpy array over the lanes
(shape (lanes,), or (lanes, n) for an n-wide vector; a value every lane shares may stay a 0-d array). RANGE
loops repeat their body, IF blocks and per-lane loop bounds narrow the mask of active lanes, DEFINE_LOCAL memory
is kept per work-group, and BARRIER checks that every thread of a group reaches it. A CPU-style lowering (no
launch indices) has its output axes as loops instead; their iterations are independent, so EMU runs those as
lanes too.

EMU doubles as a checker. Where real hardware would silently misbehave it raises an EmulatorError naming the
kernel and the UOp: out-of-bounds or misaligned accesses, a thread that skips a barrier its group reaches, a
local read of an element another thread wrote since the last barrier (or that nobody wrote), two threads
storing different values to one element, launch sizes beyond the renderer's limits, an op it does not know.

`KC_EMULATE=NAME` or `kc.Device["EMU"].impersonate(NAME)` makes EMU lower kernels with the registered device
NAME's Renderer (its limits, locals, float4, tensor cores and dialect rewrites); only the final rendering step
is EMU's. Without it EMU uses EmuRenderer, a generic GPU-like target with locals.

The parts, one file each: errors (what EMU raises), program_format (the serialized UOp list), renderer (EmuRenderer,
impersonating), values (the numpy function of each value UOp), interpreter (the plan, batches of work-groups, memory,
the run) and device (the compiler, the program handle, EmuDevice and the `kc_backends` hook the entry point names)."""
from kc.emu.errors import (BarrierError, DataRaceError, EmulatorError, LaunchError, MisalignedAccessError, OutOfBoundsError,
                           UnsupportedOpError)
from kc.emu.program_format import FORMAT, load_program, serialize
from kc.emu.renderer import BUILTIN_TENSOR_CORES, DEVICE, EmuRenderer, impersonating
from kc.emu.interpreter import Limits
from kc.emu.device import PRIORITY, EmuCompiler, EmuDevice, EmuProgram, backend_spec, open_device

__all__ = ["EmuDevice", "EmuRenderer", "EmuCompiler", "EmuProgram", "EmulatorError", "OutOfBoundsError", "BarrierError",
           "DataRaceError", "MisalignedAccessError", "LaunchError", "UnsupportedOpError", "impersonating", "serialize", "load_program",
           "DEVICE", "PRIORITY", "FORMAT", "Limits", "BUILTIN_TENSOR_CORES", "open_device", "backend_spec"]
