"""kc.compile and kc.run: a program (one or more kernels, kc.schedule decides) to a callable on a device."""
from __future__ import annotations
import functools, threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union
import numpy as np
from kc.runtime.device import Allocator, Buffer, Device, HostMemory, raw_buffers
from kc.errors import ConfigError, InvalidOptError, KcError, KernelOptError, OptsError, SymbolicError
from kc.config import debug_level, read
from kc.helpers import prod
from kc.ir.symbolic import sym_infer
from kc.kernel import Kernel, Opt
from kc.runtime.arguments import ArgumentError, array_fits, bits_dtype, buffer_specs, import_producers, overlaps
from kc.runtime.host_call import HostSlot, host_addresses
from kc.runtime.opt_cache import OptEntry, OptKey, opt_cache
from kc.runtime.program_cache import cached_program
from kc.renderer import Program
from kc.ir.uop import Ops, UOp
from kc.shape.view import fmt_shape
from kc.schedule.scheduler import schedule, schedule_for, with_split_reduces
from kc.runtime.arguments import BufferSpec
from kc.ir.dtype import dtypes

OptsArg = Union[str, Opt, Sequence[Opt], None]


class CompiledKernel:
  """A kernel compiled for one device. Call it with its buffers in buffer-index order (numpy arrays or kc.Buffers)
  and its Variables by name; each argument is checked against the kernel's declared shape and dtype (see
  kc.runtime.arguments). Numpy outputs are written in place: where the device's memory is the host's (its allocator's
  from_numpy lends the array) a C-contiguous, aligned array is used as the buffer itself, elsewhere it is copied in
  and back. Returns the kernel's run time in seconds (0.0 when the call writes no element: nothing is launched)."""

  def __init__(self, ast: UOp, kernel: Kernel, program: Program, device: str, handle):
    self.ast, self.kernel, self.program, self.device, self._handle = ast, kernel, program, device, handle
    dev = Device[device]
    # where the device's vector loads need aligned addresses, each buffer's widest vector access is its alignment
    self.specs = buffer_specs(ast, program.name, program.vector_bytes() if kernel.renderer.aligned_vectors else None)
    self._allocator = dev.allocator
    self._outputs = [s for s in self.specs if s.output]
    # without Variables the launch and the emptiness never change: decide them once
    self.vars: list[UOp] = list(kernel.vars)
    self._static = not self.vars
    self._dims = program.launch_dims({}) if self._static else None
    self._empty = self._static and all(s.elements_at({}) == 0 for s in self._outputs)
    # the launch takes buffers in the program's order; most programs use index order, which needs no reordering
    self._order = None if list(program.globals) == list(range(len(self.specs))) else tuple(program.globals)
    self._fast = self._plain_call(handle)
    self._fast_buffers = self._buffer_call()
    self._host = self._host_call(handle)
    self._buffer_launch = self._static_launch(handle)
    self._device_slots = self._device_call()

  _fast: Optional[tuple] = None  # (the program's launch_arrays, per buffer (numpy dtype, shape, output)); see _plain_call
  _fast_buffers: Optional[tuple] = None  # per buffer (dtype, elements, alignment); see _buffer_call
  _host: Optional[tuple] = None  # (the program's launch_addresses, per buffer a HostSlot); see _host_call
  _buffer_launch: Optional[Callable] = None  # the kc.Buffer fast path's launch of device handles; see _static_launch
  _device_slots: Optional[tuple] = None  # per buffer a HostSlot, where call_device runs the kernel; see _device_call

  def _host_call(self, handle) -> Optional[tuple]:
    """call_host's path, where there is one: a kernel without Variables on a program that takes host addresses
    (ProgramHandle.launch_addresses), whose buffers all have a known element count. The program gets the addresses
    in its parameters' order."""
    take = getattr(handle, "launch_addresses", None)
    if take is None or not self._static or self._empty or any(s.elements is None for s in self.specs): return None
    if (order := self._order) is not None:
      launch_addresses = take
      def take(addresses): return launch_addresses([addresses[g] for g in order])  # noqa: E306
    return take, _host_slots(self.specs)

  def _static_launch(self, handle) -> Optional[Callable]:
    """The kc.Buffer fast path's launch where the program does not take addresses: the program called on the
    buffers' device handles (in its parameters' order) with the launch sizes and waiting bound once, its run time
    returned."""
    if self._fast_buffers is None or self._host is not None: return None
    global_size, local_size = (None if d is None else tuple(d) for d in self._dims or (None, None))
    run = functools.partial(handle, global_size=global_size, local_size=local_size, vals=(), wait=True)
    if (order := self._order) is None: return lambda *handles: float(run(*handles) or 0.0)
    return lambda *handles: float(run(*[handles[g] for g in order]) or 0.0)

  @property
  def host_callable(self) -> bool:
    """Whether call_host runs this kernel: its device's memory is the host's and its program takes addresses (CLANG,
    LLVM), and it has no Variables."""
    return self._host is not None

  def call_host(self, *buffers: tuple[int, int]) -> float:
    """Run the kernel on host memory by address: each buffer an (address, nbytes) pair, in buffer-index order, whose
    memory holds a C-contiguous array of that buffer's dtype and declared shape (`.specs`). For frameworks that hold
    their tensors' memory and know its layout (kc-torch's regions: `(t.data_ptr(), t.nbytes)` of a contiguous CPU
    tensor): no array is made per tensor. Checked (ArgumentError): the count, ints, at least the bytes each buffer's
    shape needs, each address at its dtype's (or the device's vector) alignment, no output overlapping another
    buffer. What the pair says of the memory is taken as true, as with any DLPack producer. A KcError where the
    kernel is not host_callable. Returns the run time in seconds."""
    if (host := self._host) is None:
      raise KcError(f"{self.name} on {self.device} cannot be called by host address (host_callable is False): its device "
                    "keeps its own memory, its program takes no addresses, or it has Variables; call it with arrays")
    take, slots = host
    seconds = take(host_addresses(self.name, buffers, slots))
    if debug_level() >= 2: self._report(seconds, {})
    return seconds

  def _device_call(self) -> Optional[tuple[HostSlot, ...]]:
    """call_device's checks, where it runs the kernel: no Variables, every buffer's element count known, and a device
    whose allocator takes memory by address (Allocator.from_pointer: CUDA's device pointers, host memory)."""
    if not self._static or any(s.elements is None for s in self.specs): return None
    if type(self._allocator).from_pointer is Allocator.from_pointer: return None
    return _host_slots(self.specs)

  @property
  def device_callable(self) -> bool:
    """Whether call_device runs this kernel: its device takes memory by address and the kernel has no Variables."""
    return self._device_slots is not None

  @property
  def dlpack_device(self) -> Optional[tuple[int, int]]:
    """Where the kernel's buffers live, in DLPack's (device type, id) terms, as a tensor's __dlpack_device__ says it:
    (1, 0) host memory, (2, n) CUDA device n; None where other frameworks cannot address the device's memory. The
    memory that call_device's addresses point into."""
    return self._allocator.dlpack_device

  def call_device(self, *buffers: tuple[int, int], stream=None, wait: bool = True) -> Optional[float]:
    """Run the kernel on memory of its device given by address: each buffer an (address, nbytes) pair, in
    buffer-index order, holding a C-contiguous array of that buffer's dtype and declared shape, as call_host's pairs
    do; on CUDA the device pointers (`(t.data_ptr(), t.nbytes)` of a contiguous torch CUDA tensor). For frameworks
    that hold device memory themselves: no DLPack import per tensor (kc-torch's GPU regions call so). `stream` and
    `wait` as in a call. The same checks as call_host (ArgumentError); the pairs are taken as memory of this
    kernel's device, as a DLPack producer's are. A KcError where the kernel is not device_callable. Returns the run
    time in seconds (None with wait=False)."""
    if (slots := self._device_slots) is None:
      raise KcError(f"{self.name} on {self.device} cannot be called by device address (device_callable is False): its "
                    "device takes no memory by address, or the kernel has Variables; call it with arrays or kc.Buffers")
    self._check_wait(stream, wait)
    addresses = host_addresses(self.name, buffers, slots)  # the same checks as call_host's: integers say as much here
    if self._empty: return 0.0
    from_pointer = self._allocator.from_pointer
    handles = [from_pointer(a, pair[1], None) for a, pair in zip(addresses, buffers)]
    launch_stream = None if stream is None else self._allocator.dlpack_stream(stream)
    seconds = self._launch(handles, {}, *self.launch_dims({}), launch_stream, wait)
    if not wait: return None
    if debug_level() >= 2: self._report(seconds, {})
    return seconds

  def _check_wait(self, stream, wait: bool) -> None:
    """wait=False only with a framework's stream: kc's own stream is always waited for."""
    if not wait and stream is None:
      raise ArgumentError(f"{self.name}: wait=False queues the kernels on a framework's stream: pass stream= too "
                          "(kc's own stream is waited for)")

  def _buffer_call(self) -> Optional[tuple]:
    """The kc.Buffer call's fast path: for a kernel without Variables, a call whose arguments are all kc.Buffers that
    pass the checks (plain_buffers) is launched with them as they are, skipping the general path's conversions."""
    if not self._static or self._empty: return None
    return tuple((s.dtype, s.elements, s.alignment) for s in self.specs)

  def _plain_call(self, handle) -> Optional[tuple]:
    """The plain call's fast path, where there is one: a kernel without Variables, on a program that takes numpy arrays
    itself (ProgramHandle.launch_arrays: host memory), whose buffers all have a numpy dtype, a declared shape and no
    alignment beyond their elements'. A call with exactly such arrays (plain_arrays) then goes straight to the program:
    no per-call work that the checks below do not need. A program whose parameters are in another order than the
    buffer indices (a kernel of a schedule) gets them in its order."""
    take = getattr(handle, "launch_arrays", None)
    if take is None or not self._static or self._empty: return None
    if any(s.np_dtype is None or s.shape is None or s.alignment > 1 for s in self.specs): return None
    if (order := self._order) is not None:
      launch_arrays = take
      def take(args): return launch_arrays([args[g] for g in order])  # noqa: E306
    return take, tuple((np.dtype(s.np_dtype), s.shape, s.output) for s in self.specs)

  @property
  def name(self) -> str: return self.program.name

  def __repr__(self): return f"<CompiledKernel {self.name} on {self.device}>"

  def __call__(self, *args, stream=None, wait: bool = True, **var_vals) -> Optional[float]:
    """Run the kernel on `args` (numpy arrays, kc.Buffers or any DLPack producer: torch, cupy, jax arrays) with its
    Variables' values. `stream` (devices with streams: CUDA) is the stream to launch on, ordered after the work a
    framework queued there (a torch.cuda.Stream, a cupy stream, a raw handle, or "torch" for torch's current stream);
    None: the device's own. The call returns when the kernel finished, with its run time in seconds; with a `stream`
    and wait=False it returns None once the kernels are queued there, as the framework's own ops do: work queued on
    that stream later sees the outputs, the host sees them after it synchronizes (a call that had to copy an argument
    to and from a scratch buffer still waits). A framework's ops do not wait for each other: neither need kc's."""
    self._check_wait(stream, wait)
    if (fast := self._fast) is not None and stream is None and not var_vals and plain_arrays(args, fast[1]):
      seconds = fast[0](args)
      if debug_level() >= 2: self._report(seconds, {})
      return seconds
    if (wants := self._fast_buffers) is not None and stream is None and not var_vals and plain_buffers(args, wants, self.device):
      # host memory by address where the program takes addresses (call_host's path): plain_buffers checked them
      if self._host is not None: seconds = self._host[0]([a._buf.addr for a in args])
      elif (launch := self._buffer_launch) is not None: seconds = launch(*[a._buf for a in args])
      else: seconds = self._launch(list(args), {}, *self.launch_dims({}))
      if debug_level() >= 2: self._report(seconds, {})
      return seconds
    specs = self.specs
    if len(args) != len(specs):
      raise ArgumentError(f"{self.name} takes {len(specs)} buffers (indices 0..{len(specs) - 1}), got {len(args)}")
    launch_stream = None if stream is None else self._allocator.dlpack_stream(stream)
    args = import_producers(args, specs, self.device, self._allocator, launch_stream)
    if self._static:
      if var_vals: self._var_values(var_vals)  # raises: the kernel takes no Variables
      vals, empty = {}, self._empty
    else:
      vals = self._var_values(var_vals)
      empty = all(s.elements_at(vals) == 0 for s in self._outputs)
    global_size, local_size = self.launch_dims(vals)
    if empty:  # nothing to write: check the arguments, launch nothing
      for spec, arg in zip(specs, args): spec.check(arg, self.device, vals)
      return 0.0
    bufs, copies = [], []
    for i, (spec, arg) in enumerate(zip(specs, args)):
      handle, back = spec.handle(arg, vals, self.device, self._allocator, not (spec.output and overlaps(i, args)))
      bufs.append(handle)
      if back is not None: copies.append(back)
    # `args` holds every array a handle borrows until the launch returns; a scratch copy is read back after the kernel ran
    if not wait and not copies and launch_stream is not None:
      self._launch(bufs, vals, global_size, local_size, launch_stream, wait=False)
      return None
    seconds = self._launch(bufs, vals, global_size, local_size, launch_stream)
    for copy_back in copies: copy_back()
    if debug_level() >= 2: self._report(seconds, vals)
    return seconds

  def launch_dims(self, vals: dict[str, int]) -> tuple[Optional[list[int]], Optional[list[int]]]:
    """The program's global and local size with the Variables at `vals` (computed once where there are none)."""
    return self._dims if self._dims is not None else self.program.launch_dims(vals)

  def _launch(self, bufs: list, vals: dict[str, int], global_size, local_size, stream: Optional[int] = None,
              wait: bool = True) -> float:
    """Run the program on `bufs` (in buffer-index order) and wait for it; its run time in seconds (0.0 where it is
    only queued: wait=False, which a `stream` call alone passes). A `stream` (the allocator's handle for one) is passed
    to the program only when given: runtimes without streams never see it."""
    ordered = [vals[v.arg[0]] for v in self.program.vars] if vals else []
    if self._order is not None: bufs = [bufs[g] for g in self._order]
    on = {} if stream is None else {"stream": stream}
    return float(self._handle(*bufs, global_size=global_size, local_size=local_size, vals=ordered, wait=wait, **on) or 0.0)

  def _report(self, seconds: float, vals: dict[str, int]):
    ops, mem = (sym_infer(x, vals) for x in (self.program.op_estimate, self.program.mem_estimate))
    print(f"{self.device:8s} {self.name:40s} {seconds * 1e6:10.1f} us  {ops / max(seconds, 1e-9) / 1e9:8.2f} GFLOP/s  "
          f"{mem / max(seconds, 1e-9) / 1e9:8.2f} GB/s")

  def _var_values(self, var_vals: dict) -> dict[str, int]:
    wanted = {v.arg[0]: v for v in self.vars}
    unknown = set(var_vals) - set(wanted)
    if unknown: raise SymbolicError(f"{self.name} has no Variables {sorted(unknown)}; it takes {sorted(wanted)}")
    vals = {}
    for name, v in wanted.items():
      if name not in var_vals: raise SymbolicError(f"{self.name} needs a value for Variable {name!r} (range {v.arg[1]}..{v.arg[2]})")
      val = var_vals[name]
      if not isinstance(val, int) or isinstance(val, bool) or not v.arg[1] <= val <= v.arg[2]:
        raise SymbolicError(f"Variable {name!r} of {self.name} must be an int in {v.arg[1]}..{v.arg[2]}, got {val!r}")
      vals[name] = val
    return vals


def plain_arrays(args: tuple, wants: tuple) -> bool:
  """Whether a call's arguments are exactly what a kernel's fast path takes (CompiledKernel._plain_call): numpy arrays
  of the buffers' dtypes and declared shapes, C-contiguous and aligned (so host memory uses them in place), outputs
  writeable and sharing memory with no other argument (such an output is written to a copy by the general path).
  Anything else takes the general path, which checks, converts or refuses it."""
  if len(args) != len(wants): return False
  owners = 0  # how many arguments own their memory (numpy allocated it): two such arrays never share any
  for a, (dt, shape, out) in zip(args, wants):
    # numpy's builtin dtypes are singletons: `is` decides the common case without a dtype comparison
    if type(a) is not np.ndarray or a.shape != shape or (a.dtype is not dt and a.dtype != dt): return False
    flags = a.flags
    if not (flags.c_contiguous and flags.aligned) or (out and not flags.writeable): return False
    owners += flags.owndata
  if owners == len(args) and len({id(a) for a in args}) == len(args): return True
  for i, (a, want) in enumerate(zip(args, wants)):
    if want[2]:
      for j, b in enumerate(args):
        if j != i and np.may_share_memory(a, b): return False
  return True


def plain_buffers(args: tuple, wants: tuple, device: str) -> bool:
  """Whether a call's arguments are all kc.Buffers that the general path would take as they are: each of its buffer's
  dtype, on the kernel's device, allocated (or allocatable) with at least the elements the kernel reaches, at an offset
  its vector accesses allow, and not over another framework's memory (whose address the general path checks)."""
  if len(args) != len(wants): return False
  for a, (dt, elements, alignment) in zip(args, wants):
    if type(a) is not Buffer or (a.dtype is not dt and a.dtype != dt) or a.device != device or a.size < elements: return False
    if a.offset % alignment or a.base._foreign: return False
  for a in args: a.allocate()  # as the general path's handle does: a Buffer not yet allocated is allocated now
  return True


class CompiledProgram(CompiledKernel):
  """A program of several kernels (kc.schedule.Schedule) compiled for one device, called exactly as a CompiledKernel:
  the program's buffers in buffer-index order (numpy arrays, kc.Buffers or DLPack producers) and its Variables by
  name, each checked against the program's declared shapes and dtypes. Its kernels run in the schedule's order, each
  compiled once here; the intermediates live in one arena on the device, allocated here and never visible to the
  caller. `.kernels` holds each kernel's CompiledKernel, `.programs` their Programs, `.schedule` the plan; `.program`
  and `.kernel` are the first kernel's. A call returns the kernels' run times' sum. Calls share the arena: one
  CompiledProgram must not be called from two threads at once (compile one per thread)."""

  def __init__(self, sink: UOp, plan, kernels: list[CompiledKernel], device: str):
    # the intermediates are views of one arena: each must start where the device's views may (OpenCL's base alignment)
    plan = plan.aligned_to(Device[device].allocator.view_alignment)
    self.ast, self.schedule, self.kernels, self.device = sink, plan, kernels, device
    self.kernel, self.program, self._handle = kernels[0].kernel, kernels[0].program, None
    self.programs = tuple(p for ck in kernels for p in getattr(ck, "programs", (ck.program,)))
    self.specs = _program_specs(plan, kernels)
    self._allocator = Device[device].allocator
    self._outputs = [s for s in self.specs if s.output]
    self.vars = sorted({v.arg[0]: v for ck in kernels for v in ck.vars}.values(), key=lambda v: v.arg)
    self._static = not self.vars
    self._dims, self._order = None, None
    self._empty = self._static and all(s.elements_at({}) == 0 for s in self._outputs)
    self._fast_buffers = self._buffer_call()
    arena = Buffer(device, plan.peak_bytes, dtypes.uint8).allocate() if plan.peak_bytes else None
    self._temps = [Buffer(device, t.size, t.dtype, base=arena, offset=t.offset).allocate() for t in plan.temps]
    self._fast = self._plain_program_call()
    self._host = self._host_program_call()
    self._device_slots = self._device_call()
    if debug_level() >= 2:
      for line, ck in zip(plan.describe(), kernels): print(f"{device:8s} schedule {ck.name:32s} {line}")
      if plan.temps: print(f"{device:8s} schedule {plan.describe()[-1]}")

  _times: list[float] = []  # each kernel's time in the last call (DEBUG=2 prints them)
  _queued_on: Optional[int] = None  # the stream of the last call that queued the kernels without waiting

  def _plain_program_call(self) -> Optional[tuple]:
    """The plain call's fast path of a program in host memory: where every kernel has its own (_plain_call) and the
    intermediates are numpy views of the arena (DLPack of host memory), a call with plain arrays (plain_arrays, against
    the program's specs) runs each kernel's launch_arrays on the caller's arrays and those views, skipping the general
    path's per-buffer handles (a region of kc-torch calls its program so on every step)."""
    takes = [fast[0] for ck in self.kernels if (fast := ck._fast) is not None]
    if not self._static or self._empty or len(takes) != len(self.kernels): return None
    if any(s.np_dtype is None or s.shape is None or s.alignment > 1 for s in self.specs): return None
    if self._allocator.dlpack_device != (1, 0): return None
    try: temps = [np.from_dlpack(t) for t in self._temps]
    except (KcError, TypeError, ValueError, BufferError): return None  # an intermediate numpy cannot view (bfloat16)
    steps = tuple((take, tuple(temps[r.index] if r.temp else r.index for r in sk.buffers))
                  for sk, take in zip(self.schedule.kernels, takes))

    def launch(args: tuple) -> float:
      self._times = [take([args[r] if type(r) is int else r for r in refs]) for take, refs in steps]
      return sum(self._times)
    return launch, tuple((np.dtype(s.np_dtype), s.shape, s.output) for s in self.specs)

  def _host_program_call(self) -> Optional[tuple]:
    """call_host's path of a program: where every kernel has its own (_host_call) and the intermediates are host
    memory (their addresses fixed: the arena lives as long as the program), each kernel gets the caller's addresses
    and the intermediates'."""
    takes = [host[0] for ck in self.kernels if (host := ck._host) is not None]
    if not self._static or self._empty or len(takes) != len(self.kernels): return None
    temps = raw_buffers(self._temps)
    if any(s.elements is None for s in self.specs) or not all(isinstance(t, HostMemory) for t in temps): return None
    # per kernel, per buffer: (True, the intermediate's address) or (False, the caller's buffer index)
    steps = tuple((take, tuple((True, temps[r.index].addr) if r.temp else (False, r.index) for r in sk.buffers))
                  for sk, take in zip(self.schedule.kernels, takes))

    def launch(addresses: list[int]) -> float:
      self._times = [take([ref if temp else addresses[ref] for temp, ref in refs]) for take, refs in steps]
      return sum(self._times)
    return launch, _host_slots(self.specs)

  @property
  def name(self) -> str: return "+".join(ck.name for ck in self.kernels)

  def __repr__(self): return f"<CompiledProgram of {len(self.kernels)} kernels ({self.name}) on {self.device}>"

  def launch_dims(self, vals: dict[str, int]) -> tuple[Optional[list[int]], Optional[list[int]]]: return None, None

  def _launch(self, bufs: list, vals: dict[str, int], global_size, local_size, stream: Optional[int] = None,
              wait: bool = True) -> float:
    if self._temps and stream != self._queued_on:
      # the intermediates may still be in use by kernels queued on another stream without waiting: this call's
      # kernels, on `stream`, must not overwrite them first (calls on one stream are in order by themselves)
      if self._queued_on is not None: Device[self.device].synchronize()
      self._queued_on = None
    times = []
    for sk, ck in zip(self.schedule.kernels, self.kernels):
      args = [self._temps[r.index] if r.temp else bufs[r.index] for r in sk.buffers]
      times.append(ck._launch(args, vals, *ck.launch_dims(vals), stream, wait))
    self._queued_on = None if wait else stream
    self._times = times
    return sum(times)

  def _report(self, seconds: float, vals: dict[str, int]):
    print(f"{self.device:8s} {self.name:40s} {seconds * 1e6:10.1f} us  ({len(self.kernels)} kernels)")
    # each kernel's own time (the last launch's), so that a slow program names its slow kernel
    for ck, t in zip(self.kernels, self._times): print(f"{self.device:8s}   {ck.name:38s} {t * 1e6:10.1f} us")


def _host_slots(specs) -> tuple[HostSlot, ...]:
  return tuple(HostSlot(s.elements * s.dtype.itemsize, max(s.alignment, s.dtype.itemsize), s.output) for s in specs)


def _program_specs(plan, kernels: list[CompiledKernel]) -> list:
  """The program's BufferSpec per caller's buffer index, from its kernels' specs: an output where a kernel writes it,
  with the shape that kernel declares; the views of every kernel; the strictest alignment."""
  by_index: dict[int, list] = {}
  for sk, ck in zip(plan.kernels, kernels):
    for spec in ck.specs:
      if not (ref := sk.buffers[spec.index]).temp: by_index.setdefault(ref.index, []).append(spec)
  name = "+".join(ck.name for ck in kernels)
  specs = []
  for i in range(len(by_index)):
    found = by_index[i]
    main = next((s for s in found if s.output), found[0])
    shapes = {s.shape for s in found if s.shape is not None and s.output == main.output}
    spec = BufferSpec(name, i, main.dtype, main.output, main.shape if len(shapes) <= 1 else None,
                      tuple(v for s in found for v in s.views), main.declared)
    spec.alignment = max(s.alignment for s in found)
    specs.append(spec)
  return specs


class SplitCompiledKernel(CompiledProgram):
  """One kernel that a scheduler rule compiled as two, called exactly as a CompiledKernel, with the original AST's
  buffers. A large reduce with few outputs (kc.schedule.split_reduce): a partial kernel that reduces chunks of the
  reduce axis in parallel into an intermediate, and a combine kernel that reduces the partials and computes what
  followed the reduce. A large matmul on a host CPU (kc.schedule.pack_operand): a kernel that packs its second operand
  into panels, and the product. `.partial` and `.combine` are the two CompiledKernels in launch order (for a packed
  matmul, the pack and the product), `.programs` both programs; `.program`, `.kernel` and `.name` are those of the one
  that does the work (the larger loop nest: the partial, the product)."""

  def __init__(self, sink: UOp, plan, kernels: list[CompiledKernel], device: str):
    super().__init__(sink, plan, kernels, device)
    sizes = [prod(ck.kernel.full_shape) for ck in kernels]
    main = kernels[sizes.index(max(sizes))] if all(isinstance(n, int) for n in sizes) else kernels[0]
    self.kernel, self.program = main.kernel, main.program

  @property
  def partial(self) -> CompiledKernel: return self.kernels[0]
  @property
  def combine(self) -> CompiledKernel: return self.kernels[1]
  @property
  def name(self) -> str: return self.program.name

  def __repr__(self): return f"<SplitCompiledKernel {self.partial.name} + {self.combine.name} on {self.device}>"

  def _report(self, seconds: float, vals: dict[str, int]):
    print(f"{self.device:8s} split into {self.partial.name} and {self.combine.name}")
    CompiledKernel._report(self, seconds, vals)


OPTS_CHOICES = "'hand', 'none', 'beam', a kc.Opt or a list of kc.Opt"


def optimize(k: Kernel, opts: OptsArg) -> Kernel:
  """Apply `opts` to a Kernel: "hand" (the hand-coded heuristics), "none" (only what the target requires), one
  kc.Opt, or a list (or tuple) of kc.Opt. "beam" needs the device it times on: it is resolved by kc.compile (or
  beam_opts) into a list of kc.Opt first. A value that is none of these is an OptsError (an Opt with fields of the
  wrong type an InvalidOptError); an Opt this kernel refuses a KernelOptError that says which one."""
  if opts is None: return k.hand_coded_optimizations()
  if isinstance(opts, str):
    if opts == "hand": return k.hand_coded_optimizations()
    if opts == "none": return k.required_optimizations()  # what the target cannot do without (images: whole texels)
    if opts == "beam":
      raise OptsError("opts='beam' searches on a device: use kc.compile(sink, device, opts='beam') or kc.api.beam_opts")
    raise OptsError(f"opts must be {OPTS_CHOICES}, got {opts!r}")
  one = isinstance(opts, Opt)
  opt_list = [opts] if isinstance(opts, Opt) else opts
  if not isinstance(opt_list, (list, tuple)):
    raise OptsError(f"opts must be {OPTS_CHOICES}, got {type(opts).__name__} {opts!r}")
  if (bad := next((i for i, o in enumerate(opt_list) if not isinstance(o, Opt)), None)) is not None:
    raise OptsError(f"opts must be {OPTS_CHOICES}, got {type(opts).__name__} {opts!r}: opts[{bad}] is "
                    f"{type(opt_list[bad]).__name__} {opt_list[bad]!r}, not a kc.Opt")
  for i, o in enumerate(opt_list):
    where = "opts" if one else f"opts[{i}]"
    try: k.apply_opt(o)
    except InvalidOptError as e: raise InvalidOptError(f"{where}: {e}") from None  # the message names the Opt already
    except KernelOptError as e: raise KernelOptError(f"{where} = {o!r} does not apply: {e}") from None
  return k


DEFAULT_BEAM_WIDTH = 2


def beam_width_from_env() -> int:
  """KC_BEAM: the beam width that opts=None (the default) searches with; 0 or unset: hand-coded opts."""
  width = read("KC_BEAM")
  if width < 0:
    raise ConfigError(f"KC_BEAM={width} is not a beam width: set it to a number of candidates kept per round (> 0), "
                      "or 0 for hand-coded opts")
  return width


def resolve_opts(opts: OptsArg) -> OptsArg:
  """What opts=None means now: a beam search of width KC_BEAM when that is > 0, else the hand-coded opts."""
  if opts is None: return "beam" if beam_width_from_env() > 0 else "hand"
  return opts


def beam_executor():
  """The compile executor KC_BEAM_CLUSTER names (a Dask scheduler address, or 'local'), or None: the local process pool."""
  if not (address := read("KC_BEAM_CLUSTER")): return None
  from kc.search.dask_executor import shared_executor
  return shared_executor(address)


@dataclass(frozen=True)
class BeamChoice:
  """What BEAM chose for one kernel: its opts, the Kernel with them applied, the figures (stored or just measured) and
  the search's full kc.search.SearchResult (None when the choice came from the opt cache)."""
  opts: tuple[Opt, ...]
  kernel: Kernel
  entry: OptEntry
  result: Optional[object] = None

  @property
  def cached(self) -> bool: return self.result is None


def beam_opts(sink: UOp, device: Optional[str] = None, width: Optional[int] = None, *, cache: bool = True, seed: int = 0,
              executor=None, progress=None, tc_level: Optional[int] = None) -> BeamChoice:
  """BEAM search's choice of opts for `sink` on `device` with beam `width` (default KC_BEAM, else 2), its tensor-core
  opts applied at `tc_level` (default KC_TC). With `cache` a stored choice is used when its opts still apply (then
  nothing is searched); every search's result is stored. `executor` defaults to KC_BEAM_CLUSTER's (else the search's
  local process pool); `progress` receives the search's kc.search.SearchEvents."""
  dev = Device[Device.DEFAULT if device is None else device]
  if width is None: width = beam_width_from_env() or DEFAULT_BEAM_WIDTH
  if not isinstance(width, int) or isinstance(width, bool) or width < 1:
    raise ConfigError(f"the beam width (kernels kept per round) must be an int >= 1, got {width!r}")
  if tc_level is None: tc_level = read("KC_TC")
  # verifies the AST: an invalid one fails here, with the error about its shapes
  base = Kernel(sink, dev.renderer, tc_level=tc_level)
  key, store = OptKey.of(sink, dev.renderer, dev.name, width, tc_level), opt_cache()
  if cache and (entry := store.get(key)) is not None:
    try: return BeamChoice(entry.opts, optimize(base.copy(), list(entry.opts)), entry)
    except KernelOptError: pass  # stored by a kc whose opts meant something else: a miss, searched again
  # imported here: the search brings its process pool and timing code, which a kc.compile without BEAM never needs
  from kc import search
  res = search.beam_search(base.copy(), dev, width, seed=seed, progress=progress,
                           executor=executor if executor is not None else beam_executor())
  entry = OptEntry(tuple(res.opts), res.seconds, res.hand_seconds, res.elapsed)
  store.put(key, entry)
  return BeamChoice(entry.opts, optimize(base, list(res.opts)), entry, res)


def compile(sink: UOp, device: Optional[str] = None, opts: OptsArg = None, split_reduce: bool = True) -> CompiledKernel:  # noqa: A001
  """Schedule, optimize, render and compile a program (a kc.ast sink, or one kernel AST) for `device` (default:
  kc.Device.DEFAULT). A program of one kernel is a CompiledKernel; one that kc.schedule cuts into several is a
  CompiledProgram, called the same way, with `opts` applied to each kernel: "hand", "none" and "beam" (each kernel
  searched and cached on its own), or one entry per kernel in a list (each an opts value for that kernel).

  opts: "hand" (the hand-coded heuristics), "none", "beam" (BEAM search of width KC_BEAM, default 2, on the device;
  its result is kept in the opt cache, so compiling the same kernel again searches nothing), a kc.Opt or a list of
  them. None (the default) is "beam" when KC_BEAM > 0 is set, else "hand". A tensor-core opt applies at the level
  KC_TC gives (read once per compile; see kc.config).

  With the hand-coded opts, a large reduce with few outputs (a full sum) becomes two kernels that use every core
  or compute unit (a SplitCompiledKernel, see kc.schedule.split_reduce), and on a host CPU a large matmul becomes a
  kernel that packs its second operand into panels and the product (kc.schedule.pack_operand); `split_reduce=False` or
  KC_SPLIT_REDUCE=0 keeps each one kernel. Explicit and searched opts always compile the one kernel they were chosen for."""
  dev = Device[Device.DEFAULT if device is None else device]
  if not (isinstance(sink, UOp) and sink.op is Ops.SINK): return _compile_one(sink, dev, resolve_opts(opts), read("KC_TC"))
  # the rule of kc.schedule.recompute for one choice of opts for every kernel; a list of opts was given per kernel of
  # the plain schedule (kc.schedule.schedule(sink).kernels)
  plan = schedule_for(sink, dev.renderer) if opts is None or isinstance(opts, str) else schedule(sink)
  one_kernel = plan.single
  per_kernel = [resolve_opts(o) for o in _per_kernel_opts(opts, len(plan.kernels))] if not plan.single else [resolve_opts(opts)]
  if split_reduce and read("KC_SPLIT_REDUCE"):
    # the split-reduce rule: a kernel compiled with the hand-coded opts becomes a partial and a combine kernel
    hand = {i for i, o in enumerate(per_kernel) if isinstance(o, str) and o == "hand"}
    split = with_split_reduces(plan, dev.renderer, hand)
    per_kernel = [per_kernel[i] for i in split.origin]
    plan = split.schedule
  if plan.single: return _compile_schedule_kernel(plan.kernels[0].ast, dev, per_kernel[0])
  kernels = [_compile_schedule_kernel(k.ast, dev, o) for k, o in zip(plan.kernels, per_kernel)]
  # one kernel the split-reduce rule made two: the same object as always for it
  return (SplitCompiledKernel if one_kernel else CompiledProgram)(sink, plan, kernels, dev.name)


def _per_kernel_opts(opts: OptsArg, n: int) -> list:
  """`opts` for each of a program's n kernels: one choice for all ("hand", "none", "beam", None), or a list of n."""
  if opts is None or isinstance(opts, str): return [opts] * n
  if not (isinstance(opts, (list, tuple)) and opts and all(isinstance(o, (str, list, tuple)) or o is None for o in opts)):
    raise OptsError(f"opts={opts!r} are the opts of one kernel, and this program is {n} kernels (kc.schedule): give "
                    f"'hand', 'none' or 'beam' for all of them, or a list of {n} entries, one per kernel")
  if len(opts) != n:
    raise OptsError(f"opts has {len(opts)} entries for a program of {n} kernels: give one per kernel, in schedule order "
                    "(kc.schedule.schedule(sink).kernels)")
  return list(opts)


def _compile_schedule_kernel(ast: UOp, dev, opts: OptsArg) -> CompiledKernel:
  """One kernel of a schedule with its (resolved) opts: "beam" searches it (or takes the opt cache's choice)."""
  tc_level = read("KC_TC")
  if isinstance(opts, str) and opts == "beam": return _compile_kernel(ast, beam_opts(ast, dev.name, tc_level=tc_level).kernel, dev)
  return _compile_one(ast, dev, opts, tc_level)


def _compile_one(sink: UOp, dev, opts: OptsArg, tc_level: int) -> CompiledKernel:
  return _compile_kernel(sink, optimize(Kernel(sink, dev.renderer, tc_level=tc_level), opts), dev)


# what compiling one kernel with one set of opts for one device made: its Program and the loaded binary. A kernel is
# often compiled again in one process (a framework that recompiles per call, a repeated opts="beam" compile), and
# rendering is most of a compile from the caches (40 ms for a searched matmul's 512 lanes). Keyed by the AST (UOps are
# hash-consed: an equal AST is the same object), the device, its renderer object and what it reads from the
# environment (Renderer.render_env), the applied opts and the tensor-core level they were applied at; bounded. On a
# miss the Program comes from the disk cache when an earlier process rendered it (kc.runtime.program_cache), so a
# warm process renders nothing, and the binary from the compile cache.
# Its reads and writes take a lock (kernels are compiled from several threads at once: a hit must not be evicted
# between finding and refreshing it); a miss compiles outside it.
_LOADED: OrderedDict = OrderedDict()
_LOADED_MAX = 256
_LOADED_LOCK = threading.Lock()


def _compile_kernel(sink: UOp, k: Kernel, dev) -> CompiledKernel:
  key = (sink, dev.name, dev.renderer, dev.renderer.render_env(), tuple(k.applied_opts), k.use_tensor_cores)
  with _LOADED_LOCK:
    if (hit := _LOADED.get(key)) is not None: _LOADED.move_to_end(key)
  if hit is None:
    prg = cached_program(k)
    hit = (prg, dev.runtime(prg.name, dev.compiler.compile(prg.src)))
    with _LOADED_LOCK:
      _LOADED[key] = hit
      evicted = _LOADED.popitem(last=False) if len(_LOADED) > _LOADED_MAX else None
    del evicted  # released here, outside the lock: freeing a loaded binary may take its backend's own lock
  return CompiledKernel(sink, k, hit[0], dev.name, hit[1])


def _output_np_dtype(dt, specs, inputs: dict[int, np.ndarray]) -> np.dtype:
  """numpy's dtype for an output of `dt`; for a dtype numpy lacks, the array type an input of `dt` came in (an
  ml_dtypes type, found without importing it), else the raw bits."""
  if (bits := bits_dtype(dt)) is None: return dt.np
  given = [a.dtype for s in specs if not s.output and s.dtype == dt and isinstance(a := inputs.get(s.index), np.ndarray)]
  return next((g for g in given if g != bits and array_fits(dt, g)), bits)


def _indices(xs) -> str: return "[" + ", ".join(map(str, sorted(xs))) + "]"


def _described(spec) -> str:
  return f"{spec.dtype.name}, shape {fmt_shape(spec.shape)}" if spec.shape is not None else spec.dtype.name


def _unread_inputs(ck: CompiledKernel, inputs: dict) -> None:
  """An entry of `inputs` that the kernel never reads is a mistake (a wrong index, an output): say so."""
  reads = {s.index for s in ck.specs if not s.output}
  in_order = lambda i: (0, i) if isinstance(i, int) else (1, repr(i))  # noqa: E731  (ints first, by value)
  if (extra := sorted((i for i in inputs if i not in reads), key=in_order)):
    outs = {s.index for s in ck.specs if s.output}
    what = "an output (kc.run allocates and returns it)" if extra[0] in outs else "not a buffer of the kernel"
    raise ArgumentError(f"kc.run: `inputs` has buffer {extra[0]!r}, {what}; {ck.name} reads buffers {_indices(reads)}")


def run(sink: UOp, inputs: dict[int, np.ndarray], device: Optional[str] = None, opts: OptsArg = None, **var_vals) -> dict[int, np.ndarray]:
  """Compile and run once; the outputs are allocated here (shaped like each store) and returned by index. An output
  of a dtype numpy lacks (bfloat16, fp8) comes back in the type its inputs of that dtype were given in (ml_dtypes'),
  else as its raw bits (uint16, uint8). `opts` as kc.compile's."""
  if not isinstance(inputs, dict):
    raise ArgumentError(f"kc.run takes its inputs as a dict of buffer index -> array, got {type(inputs).__name__}")
  ck = compile(sink, device, opts)
  _unread_inputs(ck, inputs)
  vals = ck._var_values(var_vals)
  args: list = []
  outs: dict[int, np.ndarray] = {}
  for spec in ck.specs:
    if spec.output:
      shape = spec.shape_at(vals)  # numpy's shape where kc.ast recorded it (x.sum(1) is (M,), not the kernel's (M, 1))
      outs[spec.index] = np.zeros(shape if shape is not None else spec.elements_at(vals), dtype=_output_np_dtype(spec.dtype, ck.specs, inputs))
      args.append(outs[spec.index])
    elif spec.index in inputs: args.append(inputs[spec.index])
    else:
      reads = _indices(s.index for s in ck.specs if not s.output)
      raise ArgumentError(f"kc.run needs an input for buffer {spec.index} ({_described(spec)}): {ck.name} reads "
                          f"buffers {reads}, and `inputs` has {_indices(inputs)}")
  ck(*args, **var_vals)
  return outs
