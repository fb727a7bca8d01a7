"""kc.compile and kc.run: one kernel AST to a callable on a device."""
from __future__ import annotations
from typing import Optional, Sequence, Union
import numpy as np
from kc.device import Buffer, Device
from kc.errors import KcError, SymbolicError
from kc.helpers import debug_level
from kc.symbolic import sym_infer
from kc.kernel import Kernel, Opt
from kc.kernel.verify import st_arg
from kc.renderer import Program
from kc.shape import ShapeTracker
from kc.uop import Ops, UOp

OptsArg = Union[str, Sequence[Opt], None]


class CompiledKernel:
  """A kernel compiled for one device. Call it with its buffers in buffer-index order (numpy arrays or kc.Buffers)
  and its Variables by name; numpy outputs are written back in place. Returns the kernel's run time in seconds."""

  def __init__(self, ast: UOp, kernel: Kernel, program: Program, device: str, handle):
    self.ast, self.kernel, self.program, self.device, self._handle = ast, kernel, program, device, handle
    self._needs = _buffer_needs(ast)

  @property
  def name(self) -> str: return self.program.name

  def __repr__(self): return f"<CompiledKernel {self.name} on {self.device}>"

  def __call__(self, *args, **var_vals) -> float:
    if len(args) != len(self._needs):
      raise KcError(f"{self.name} takes {len(self._needs)} buffers (indices {sorted(self._needs)}), got {len(args)}")
    vals = self._var_values(var_vals)
    bufs, copies = [], []
    for i, arg in enumerate(args):
      dtype, views = self._needs[i]
      n = _elements(views, vals)
      if isinstance(arg, Buffer):
        if arg.dtype != dtype: raise KcError(f"buffer {i} of {self.name} must be {dtype.name}, got a Buffer of {arg.dtype.name}")
        if arg.size < n: raise KcError(f"buffer {i} of {self.name} needs {n} elements, the Buffer has {arg.size}")
        if arg.device != self.device: raise KcError(f"buffer {i} of {self.name} is on {arg.device}, the kernel runs on {self.device}")
        bufs.append(arg if arg.is_allocated() else arg.allocate())
        continue
      if not isinstance(arg, np.ndarray): raise KcError(f"buffer {i} of {self.name} must be a numpy array or a kc.Buffer, got {type(arg).__name__}")
      if arg.dtype != dtype.np: raise KcError(f"buffer {i} of {self.name} must be {dtype.np}, got {arg.dtype}; convert with .astype")
      if arg.size < n: raise KcError(f"buffer {i} of {self.name} needs {n} elements, the array has {arg.size}")
      buf = Buffer(self.device, arg.size, dtype).allocate().copyin(np.ascontiguousarray(arg).reshape(-1).view(np.uint8).data)
      bufs.append(buf)
      if i in self.program.outs:
        if not (arg.flags.c_contiguous and arg.flags.writeable): raise KcError(f"output {i} of {self.name} must be a writeable C-contiguous array")
        copies.append((arg, buf))
    global_size, local_size = self.program.launch_dims(vals)
    ordered = [vals[v.arg[0]] for v in self.program.vars]
    seconds = self._handle(*[bufs[g] for g in self.program.globals], global_size=global_size, local_size=local_size, vals=ordered, wait=True)
    for arr, buf in copies: buf.copyout(arr.reshape(-1).view(np.uint8).data)
    seconds = float(seconds or 0.0)
    if debug_level() >= 2:
      ops = sym_infer(self.program.op_estimate, vals) if not isinstance(self.program.op_estimate, int) else self.program.op_estimate
      mem = sym_infer(self.program.mem_estimate, vals) if not isinstance(self.program.mem_estimate, int) else self.program.mem_estimate
      print(f"{self.device:8s} {self.name:40s} {seconds * 1e6:10.1f} us  {ops / max(seconds, 1e-9) / 1e9:8.2f} GFLOP/s  {mem / max(seconds, 1e-9) / 1e9:8.2f} GB/s")
    return seconds

  def _var_values(self, var_vals: dict) -> dict[str, int]:
    wanted = {v.arg[0]: v for v in self.kernel.vars}
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


def _eval(x, vals: dict) -> int:
  from kc.symbolic import sym_infer
  return sym_infer(x, vals)


def _elements(views: list[ShapeTracker], vals: dict[str, int]) -> int:
  """The elements a buffer must hold: the most any of its views reaches with the Variables at their values."""
  most = 0
  for st in views:
    if st.vars():
      subst = {v: UOp.const(v.dtype, vals[v.arg[0]]) for v in st.vars()}
      st = ShapeTracker(tuple(view.substitute(subst) for view in st.views))
    most = max(most, int(st.real_size()))
  return most


def _buffer_needs(ast: UOp) -> dict[int, tuple]:
  """For each buffer index: its dtype and the views it is read and written through."""
  needs: dict[int, tuple] = {}
  for u in ast.toposort:
    if u.op in (Ops.LOAD, Ops.STORE) and u.src[0].op is Ops.DEFINE_GLOBAL:
      i, dt = u.src[0].arg, u.src[0].dtype.base
      if i in needs and needs[i][0] != dt: raise KcError(f"buffer {i} is used as {needs[i][0].name} and as {dt.name}")
      needs.setdefault(i, (dt, []))[1].append(st_arg(u).unbind()[0])
  if sorted(needs) != list(range(len(needs))):
    raise KcError(f"buffer indices must be 0..{len(needs) - 1} with none missing, got {sorted(needs)}")
  return needs


def optimize(k: Kernel, opts: OptsArg) -> Kernel:
  """Apply `opts` to a Kernel: "hand" (the hand-coded heuristics), "none" (only what the target requires), or a list
  of kc.Opt."""
  if opts is None or opts == "hand": return k.hand_coded_optimizations()
  if opts == "none": return k.required_optimizations()  # what the target cannot do without (images: whole texels)
  if isinstance(opts, str): raise KcError(f"opts must be 'hand', 'none' or a list of kc.Opt, got {opts!r}")
  for o in opts: k.apply_opt(o)
  return k


def compile(sink: UOp, device: Optional[str] = None, opts: OptsArg = "hand") -> CompiledKernel:  # noqa: A001
  """Optimize, render and compile one kernel AST for `device` (default: kc.Device.DEFAULT)."""
  name = device or Device.DEFAULT
  dev = Device[name]
  k = optimize(Kernel(sink, dev.renderer), opts)
  prg = k.to_program()
  handle = dev.runtime(prg.name, dev.compiler.compile(prg.src))
  return CompiledKernel(sink, k, prg, dev.name, handle)


def run(sink: UOp, inputs: dict[int, np.ndarray], device: Optional[str] = None, opts: OptsArg = "hand", **var_vals) -> dict[int, np.ndarray]:
  """Compile and run once; the outputs are allocated here (shaped like each store's view) and returned by index."""
  ck = compile(sink, device, opts)
  args: list = []
  outs: dict[int, np.ndarray] = {}
  stores = {s.src[0].arg: s for s in sink.src}
  for i in range(len(ck._needs)):
    if i in stores:
      st = st_arg(stores[i])
      shape = tuple(int(_eval(s, var_vals)) if isinstance(s, UOp) else s for s in st.shape)
      outs[i] = np.zeros(shape, dtype=ck._needs[i][0].np)
      args.append(outs[i])
    elif i in inputs: args.append(inputs[i])
    else: raise KcError(f"kc.run needs an input for buffer {i}")
  ck(*args, **var_vals)
  return outs
