"""The interpreter: a program prepared as a _Plan, run by _Run over a _Batch of whole work-groups in lock-step, with
each buffer's _Memory, checking bounds, alignment, barriers and data races as it goes."""
from __future__ import annotations
from dataclasses import dataclass
from typing import Callable, Optional, Sequence
import numpy as np
from kc.ir.codec import decode, encode, round_to, storage_np, value_np
from kc.ir.dtype import DType, ImageDType, dtypes
from kc.helpers import prod
from kc.ir.uop import GroupOp, Ops, UOp
from kc.emu.errors import (BarrierError, DataRaceError, EmulatorError, LaunchError, MisalignedAccessError, OutOfBoundsError,
                           UnsupportedOpError)
from kc.emu.renderer import fragment_layout
from kc.emu.values import _IN_FLOAT32, _where, alu_function, bitcast_function, cast_function, const_value, gep_function, shuffle_function, vectorize


_INDEX_NP = np.dtype(np.int32)  # a launch index's dtype, unless the kernel has wide (int64) indices


# ---------------------------------------------------------------------------------------------------------- the plan


_DEFINITIONS = {Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.DEFINE_LOCAL, Ops.CONST, Ops.SPECIAL}
_VALUE_OPS = GroupOp.ALU | {Ops.CAST, Ops.BITCAST, Ops.VECTORIZE, Ops.GEP, Ops.SHUFFLE}
_KNOWN = _VALUE_OPS | {Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.DEFINE_LOCAL, Ops.CONST, Ops.SPECIAL, Ops.RANGE, Ops.ENDRANGE,
                       Ops.DEFINE_ACC, Ops.ASSIGN, Ops.INDEX, Ops.LOAD, Ops.STORE, Ops.IF, Ops.ENDIF, Ops.BARRIER, Ops.NOOP, Ops.WMMA}


class _Plan:
  """A program prepared for interpretation: source positions (uses of an ASSIGN read its accumulator), matching
  block starts and ends, the numpy function of each value op, and the kernel's buffers, variables and indices."""

  def __init__(self, name: str, uops: list[UOp]):
    self.name, self.uops = name, uops
    self.srcs: list[tuple[int, ...]] = []
    self.jump: dict[int, int] = {}
    seen: dict[UOp, int] = {}  # where each UOp's value lives: a UOp may appear more than once (an IF per gated store)
    opened: list[int] = []
    for pc, u in enumerate(uops):
      if u.op not in _KNOWN:
        raise UnsupportedOpError(self.where(pc, f"EMU cannot run {u.op.name}: it interprets {', '.join(sorted(o.name for o in _KNOWN))}"))
      if isinstance(u.dtype, ImageDType): raise UnsupportedOpError(self.where(pc, "EMU does not emulate images"))
      self.srcs.append(self._sources(pc, u, seen))
      if u.op in (Ops.RANGE, Ops.IF): opened.append(pc)
      elif u.op in (Ops.ENDRANGE, Ops.ENDIF):
        if not opened or not u.src or uops[opened[-1]] is not u.src[0]:
          raise UnsupportedOpError(self.where(pc, f"{u.op.name} does not close the innermost open block"))
        start = opened.pop()
        self.jump[start], self.jump[pc] = pc, start
      if u.op not in _DEFINITIONS or u not in seen: seen[u] = pc  # a definition keeps its first place (one buffer, one value)
    if opened: raise UnsupportedOpError(self.where(opened[-1], f"{uops[opened[-1]].op.name} is never closed"))
    firsts = set(seen.values())
    self.fns: dict[int, Callable] = {pc: self._function(pc, u) for pc, u in enumerate(uops) if u.op in _VALUE_OPS}
    self.consts = {pc: const_value(u) for pc, u in enumerate(uops) if u.op is Ops.CONST}
    self.globals = [pc for pc, u in enumerate(uops) if u.op is Ops.DEFINE_GLOBAL and pc in firsts]
    self.vars = sorted((pc for pc, u in enumerate(uops) if u.op is Ops.DEFINE_VAR and pc in firsts), key=lambda pc: uops[pc].arg)
    self.locals = [pc for pc, u in enumerate(uops) if u.op is Ops.DEFINE_LOCAL and pc in firsts]
    self.specials = [pc for pc, u in enumerate(uops) if u.op is Ops.SPECIAL and pc in firsts]
    self.local_bytes = sum(uops[pc].arg[1] * uops[pc].dtype.base.itemsize for pc in self.locals)
    self.parallel_loops = self._parallel_loops()

  def _parallel_loops(self) -> list[int]:
    """The outermost RANGEs over output axes of a program without launch indices (a CPU-style lowering). Their
    iterations are independent by construction (a GPU lowering launches them as threads), so EMU runs them as
    lanes in lock-step rather than one after another. Only loops from 0 to a constant or a Variable qualify, and
    only while nothing with a lasting effect (an accumulator, a store, a block) comes before them."""
    if self.specials: return []
    loops: list[int] = []
    for pc, u in enumerate(self.uops):
      if u.op is Ops.RANGE:
        start, end = (self.uops[s] for s in self.srcs[pc])
        if not (isinstance(u.arg, tuple) and len(u.arg) == 2 and u.arg[1] == 0): break  # kind 0: an output axis
        if start.op is not Ops.CONST or start.arg != 0: break
        if end.op is not Ops.CONST and _loop_variable(end) is None: break
        loops.append(pc)
      elif u.op in (Ops.DEFINE_ACC, Ops.ASSIGN, Ops.STORE, Ops.IF, Ops.ENDIF, Ops.ENDRANGE, Ops.BARRIER, Ops.DEFINE_LOCAL): break
    return loops

  def _sources(self, pc: int, u: UOp, seen: dict[UOp, int]) -> tuple[int, ...]:
    """Where the values of u's sources live. A use of an ASSIGN reads its accumulator; a DEFINE_ACC lists the loops
    it accumulates over, which come later, but only its identity value is read."""
    srcs = u.src[:1] if u.op is Ops.DEFINE_ACC else u.src
    out = []
    for s in srcs:
      target = s.src[0] if s.op is Ops.ASSIGN else s
      if target not in seen: raise UnsupportedOpError(self.where(pc, f"uses a {s.op.name} that does not come earlier in the program"))
      out.append(seen[target])
    return tuple(out)

  def where(self, pc: int, msg: str) -> str:
    """`msg` prefixed with the kernel and the UOp it is about."""
    u = self.uops[pc]
    return f"kernel {self.name}: uop {pc} ({u.op.name} {u.dtype}): {msg}"

  def _function(self, pc: int, u: UOp) -> Callable:
    try:
      if u.op in GroupOp.ALU: return alu_function(u.op, u.dtype, u.src[0].dtype)
      if u.op is Ops.CAST: return cast_function(u.src[0].dtype, u.dtype)
      if u.op is Ops.BITCAST: return bitcast_function(u.src[0].dtype, u.dtype)
      if u.op is Ops.VECTORIZE: return vectorize
      if u.op is Ops.SHUFFLE: return shuffle_function(u.arg)
      return gep_function(tuple(u.arg))
    except UnsupportedOpError as e: raise UnsupportedOpError(self.where(pc, str(e))) from None


def _loop_variable(end: UOp) -> Optional[UOp]:
  """The Variable a loop bound is: itself, or converted to int64 indices (a CAST); None for any other bound."""
  if end.op is Ops.CAST and end.src[0].op is Ops.DEFINE_VAR: end = end.src[0]
  return end if end.op is Ops.DEFINE_VAR else None


# ---------------------------------------------------------------------------------------------------------- launch geometry

@dataclass(frozen=True)
class Limits:
  """What the renderer a program was lowered for promised about launches."""
  renderer: str
  global_max: Optional[tuple[int, ...]]
  local_max: Optional[tuple[int, ...]]
  shared_max: int
  tensor_cores: tuple = ()  # the renderer's TensorCores: WMMA runs with their fragment layouts
  aligned_vectors: bool = False  # an access needs an address that is a multiple of its size (float4, Metal's long)


def _dims(x: Optional[Sequence[int]], what: str, name: str) -> tuple[int, int, int]:
  if x is None: return (1, 1, 1)
  dims = tuple(int(v) for v in x) + (1,) * (3 - len(x))
  if len(dims) != 3 or any(d < 1 for d in dims): raise LaunchError(f"kernel {name}: {what} size {list(x)} must be 1 to 3 positive ints")
  return dims  # type: ignore[return-value]


class _Batch:
  """A run of whole work-groups in lock-step: lanes are group-major, x fastest within a group."""

  def __init__(self, groups: np.ndarray, local: tuple[int, int, int], iterations: Optional[np.ndarray] = None):
    self.groups, self.local = groups, local                  # groups: (G, 3) work-group coordinates
    self.iterations = iterations                             # (G, loops): the parallel-loop indices each group runs
    self.threads = prod(local)
    self.num_groups = len(groups)
    self.lanes = self.num_groups * self.threads
    tid = np.arange(self.threads)
    self.thread_coords = np.stack([tid % local[0], tid // local[0] % local[1], tid // (local[0] * local[1])], axis=1)
    self.group_of_lane = np.repeat(np.arange(self.num_groups), self.threads)
    self.thread_of_lane = np.tile(tid, self.num_groups)

  def special(self, name: str, dtype: np.dtype = _INDEX_NP) -> np.ndarray:
    """The launch index `name` of every lane, in the SPECIAL's dtype (int32, or int64 in a kernel with wide indices)."""
    axis = int(name[-1])
    gid = np.repeat(self.groups[:, axis], self.threads).astype(dtype)
    lid = np.tile(self.thread_coords[:, axis], self.num_groups).astype(dtype)
    if name.startswith("gidx"): return gid
    if name.startswith("lidx"): return lid
    return (gid * self.local[axis] + lid).astype(dtype)

  def lane_name(self, lane: int) -> str:
    if self.iterations is not None: return f"loop iteration ({','.join(str(int(i)) for i in self.iterations[lane // self.threads])})"
    g, t = self.groups[lane // self.threads], self.thread_coords[lane % self.threads]
    return f"work-group ({g[0]},{g[1]},{g[2]}) thread ({t[0]},{t[1]},{t[2]})"


# ---------------------------------------------------------------------------------------------------------- memory

class _Memory:
  """One buffer the kernel addresses: its elements (in storage dtype) and, for local memory, one row per
  work-group plus who wrote each element since the last barrier (-2 nobody yet, -1 published by a barrier)."""

  def __init__(self, label: str, data: np.ndarray, dtype: DType, size: int, local: bool, batch: _Batch):
    self.label, self.data, self.dtype, self.size, self.local = label, data, dtype, size, local
    self.writer = np.full(data.shape, -2, dtype=np.int32) if local else None
    self.batch = batch

  def flat(self, lanes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    return self.batch.group_of_lane[lanes][:, None] * self.size + offsets if self.local else offsets

  def publish(self, groups: np.ndarray):
    """A barrier the threads of `groups` passed: what they wrote is now everyone's to read."""
    rows = self.writer.reshape(self.batch.num_groups, self.size)[groups]
    rows[rows >= 0] = -1
    self.writer.reshape(self.batch.num_groups, self.size)[groups] = rows


# ---------------------------------------------------------------------------------------------------------- the interpreter

class _Run:
  """One batch of work-groups executing the plan."""

  def __init__(self, plan: _Plan, batch: _Batch, buffers: list[tuple[np.ndarray, DType]], var_vals: list[int], limits: Optional[Limits] = None):
    self.plan, self.batch = plan, batch
    self.tensor_cores = limits.tensor_cores if limits is not None else ()
    self.aligned_vectors = limits is not None and limits.aligned_vectors
    self.vals: list = [None] * len(plan.uops)
    self.memory: dict[int, _Memory] = {}
    for i, (pc, (data, dt)) in enumerate(zip(plan.globals, buffers)):
      self.memory[pc] = _Memory(f"data{plan.uops[pc].arg} (argument {i}, {len(data)} x {dt.name})", data, dt, len(data), False, batch)
    for pc in plan.locals:
      u = plan.uops[pc]
      size = u.arg[1]
      data = np.zeros(batch.num_groups * size, dtype=storage_np(u.dtype.base))
      self.memory[pc] = _Memory(f"local {u.arg[0]} ({size} x {u.dtype.base.name})", data, u.dtype.base, size, True, batch)
    for pc, v in zip(plan.vars, var_vals): self.vals[pc] = np.asarray(v, dtype=np.int32)
    for pc, v in plan.consts.items(): self.vals[pc] = v
    for pc in plan.specials: self.vals[pc] = batch.special(plan.uops[pc].arg[0], value_np(plan.uops[pc].dtype))
    self.lane_loop_blocks: set[int] = set()  # the RANGE/ENDRANGE of parallel loops run as lanes: nothing to do there
    if batch.iterations is not None:
      for k, pc in enumerate(plan.parallel_loops):
        self.vals[pc] = np.repeat(batch.iterations[:, k], batch.threads).astype(value_np(plan.uops[pc].dtype))
        self.lane_loop_blocks.update((pc, plan.jump[pc]))

  def error(self, cls: type, pc: int, msg: str, lane: Optional[int] = None) -> EmulatorError:
    who = f" ({self.batch.lane_name(lane)})" if lane is not None else ""
    return cls(self.plan.where(pc, msg + who))

  def run(self):
    plan, vals, uops, srcs, fns = self.plan, self.vals, self.plan.uops, self.plan.srcs, self.plan.fns
    mask: Optional[np.ndarray] = None   # the active lanes, None when all are
    frames: list = []                   # per open block: (kind, pc, mask before it, loop end)
    pc, n = 0, len(uops)
    skip = self.lane_loop_blocks
    while pc < n:
      op = uops[pc].op
      if pc in skip: pass
      elif pc in fns:
        vals[pc] = fns[pc](*[vals[s] for s in srcs[pc]])
      elif op is Ops.INDEX:
        s = srcs[pc]
        vals[pc] = (s[0], vals[s[1]], vals[s[2]] if len(s) > 2 else None)
      elif op is Ops.LOAD: vals[pc] = self.load(pc, mask)
      elif op is Ops.STORE: self.store(pc, mask)
      elif op is Ops.DEFINE_ACC: vals[pc] = vals[srcs[pc][0]]
      elif op is Ops.ASSIGN:
        acc, new = srcs[pc]
        vals[acc] = new_val = vals[new] if mask is None else _where(mask, vals[new], vals[acc])
        vals[pc] = new_val
      elif op is Ops.RANGE:
        start, end = vals[srcs[pc][0]], vals[srcs[pc][1]]
        counter_np = value_np(uops[pc].dtype)  # int32, or int64 in a kernel with wide indices
        if np.size(start) == 1 and np.size(end) == 1:  # bounds every lane shares: one counter
          counter, end = np.asarray(start, dtype=counter_np).reshape(()), int(np.asarray(end).reshape(()))
          if int(counter) >= end:
            pc = plan.jump[pc] + 1
            continue
          frames.append(("range", pc, mask, end))
        else:  # bounds that differ per lane: lanes leave the loop as they reach their end
          counter = np.broadcast_to(np.asarray(start, dtype=counter_np), (self.batch.lanes,)).copy()
          active = counter < end if mask is None else mask & (counter < end)
          if not active.any():
            pc = plan.jump[pc] + 1
            continue
          frames.append(("range", pc, mask, end))
          mask = active
        vals[pc] = counter
      elif op is Ops.ENDRANGE:
        _, start_pc, outer, end = frames[-1]
        counter = (vals[start_pc] + 1).astype(vals[start_pc].dtype)
        if isinstance(end, int):
          if int(counter) < end:
            vals[start_pc], pc = counter, start_pc + 1
            continue
        else:
          active = counter < end if outer is None else outer & (counter < end)
          if active.any():
            vals[start_pc], mask, pc = counter, active, start_pc + 1
            continue
        frames.pop()
        mask = outer
      elif op is Ops.IF:
        gate = np.asarray(vals[srcs[pc][0]], dtype=bool)
        active = gate if mask is None else mask & gate
        frames.append(("if", pc, mask, None))
        if not active.any():
          pc = plan.jump[pc]  # to the ENDIF, which closes the block
          continue
        mask = None if active.all() and np.size(active) in (1, self.batch.lanes) else np.broadcast_to(active, (self.batch.lanes,))
      elif op is Ops.ENDIF: mask = frames.pop()[2]
      elif op is Ops.BARRIER: self.barrier(pc, mask)
      elif op is Ops.WMMA: vals[pc] = self.wmma(pc, mask)
      # DEFINE_GLOBAL / DEFINE_VAR / DEFINE_LOCAL / CONST / SPECIAL were set up front; NOOP does nothing
      pc += 1

  def wmma(self, pc: int, mask: Optional[np.ndarray]) -> np.ndarray:
    """D = A*B + C for every warp: each warp's lanes put their fragments into the matrices where the tensor core's
    layout says, the warp multiplies, and each lane takes its slots of D back. Where a layout gives one element to
    several lanes (hardware never does; the small built-in tensor cores do), the lowest lane's copy is the one used:
    the others may differ in padding a PADTO added. A warp that runs with only some of its threads is an error."""
    u = self.plan.uops[pc]
    name, (N, M, K), dt_out, threads = u.arg.name, u.arg.dims, u.arg.dtype_out, u.arg.num_threads
    tc = next((t for t in self.tensor_cores if str(t) == name), None)
    if tc is None: raise self.error(UnsupportedOpError, pc, f"{name} is not a tensor core of the renderer this program was lowered for")
    lay = fragment_layout(tc)
    if self.batch.threads % threads:
      raise self.error(LaunchError, pc, f"a work-group of {self.batch.threads} threads is not whole warps of {threads}")
    if mask is not None and not np.all(np.asarray(mask).reshape(-1, threads).all(1) | ~np.asarray(mask).reshape(-1, threads).any(1)):
      raise self.error(BarrierError, pc, "WMMA runs with only some threads of a warp")
    lanes = self.batch.lanes
    a, b, c = (np.broadcast_to(np.asarray(self.vals[s]), (lanes, self.plan.uops[s].dtype.count)) for s in self.plan.srcs[pc])
    acc_np = np.float64 if dt_out == dtypes.float64 else np.float32
    warps = lanes // threads
    def matrix(frag, where, rows, cols):
      out = np.zeros((warps, rows, cols), dtype=acc_np)
      vals = frag.astype(acc_np).reshape(warps, threads, -1)
      for lane, slots in reversed(list(enumerate(where))):  # lower lanes last: their copy stays
        for slot, (r, q) in enumerate(slots): out[:, r, q] = vals[:, lane, slot]
      return out
    d = matrix(a, lay.a, M, K) @ matrix(b, lay.b, K, N) + matrix(c, lay.c, M, N)
    res = np.empty((warps, threads, len(lay.c[0])), dtype=acc_np)
    for lane, slots in enumerate(lay.c):
      for slot, (r, q) in enumerate(slots): res[:, lane, slot] = d[:, r, q]
    out = res.reshape(lanes, -1)
    return round_to(out.astype(np.float32), dt_out) if dt_out in _IN_FLOAT32 else out.astype(value_np(dt_out))

  # -- memory ---------------------------------------------------------------------------------------------------------

  def _active_lanes(self, mask: Optional[np.ndarray], gate) -> Optional[np.ndarray]:
    """Indices of the lanes that perform an access, None when all of them do."""
    if gate is not None:
      g = np.broadcast_to(np.asarray(gate, dtype=bool), (self.batch.lanes,))
      mask = g if mask is None else mask & g
    if mask is None: return None
    return np.flatnonzero(mask)

  def _addresses(self, pc: int, mem: _Memory, offsets, lanes: Optional[np.ndarray], width: int, verb: str) -> tuple[np.ndarray, np.ndarray]:
    """(lanes, element offsets of shape (k, width)) of an access, checked against the buffer's bounds."""
    all_offsets = np.broadcast_to(np.asarray(offsets, dtype=np.int64), (self.batch.lanes,))
    if lanes is None: lanes = np.arange(self.batch.lanes)
    off = all_offsets[lanes]
    bad = (off < 0) | (off + width > mem.size)
    if bad.any():
      i = int(np.argmax(bad))
      span = f"elements {off[i]}..{off[i] + width - 1}" if width > 1 else f"element {off[i]}"
      raise self.error(OutOfBoundsError, pc, f"{verb} {span} of {mem.label}, which has elements 0..{mem.size - 1}", int(lanes[i]))
    if width > 1 and (misaligned := off % width != 0).any():
      i = int(np.argmax(misaligned))
      raise self.error(OutOfBoundsError, pc, f"a {width}-wide vector access at element {off[i]} of {mem.label} is not {width}-aligned", int(lanes[i]))
    # a GPU reads a value (a scalar as much as a vector) only at a multiple of its size: a view at an odd offset faults
    if self.aligned_vectors and not mem.local and (size := width * mem.data.itemsize) > 1:
      if (start := mem.data.ctypes.data % size) != 0:  # element offsets are width-aligned: the buffer's start decides
        what = "vector access" if width > 1 else "access"
        raise self.error(MisalignedAccessError, pc, f"a {size}-byte {what} of {mem.label}, which starts {start} bytes "
                         f"past a multiple of {size} (a view at an odd byte offset): the impersonated device faults here", int(lanes[0]))
    return lanes, off[:, None] + np.arange(width)

  def load(self, pc: int, mask: Optional[np.ndarray]) -> np.ndarray:
    u = self.plan.uops[pc]
    buf_pc, offsets, gate = self.vals[self.plan.srcs[pc][0]]
    mem, width = self.memory[buf_pc], u.dtype.count
    lanes = self._active_lanes(mask, gate)
    shape = (self.batch.lanes, width) if width > 1 else (self.batch.lanes,)
    out = np.zeros(shape, dtype=value_np(u.dtype))  # gated-off lanes read 0
    if lanes is not None and len(lanes) == 0: return out
    lanes, addr = self._addresses(pc, mem, offsets, lanes, width, "reads")
    flat = mem.flat(lanes, addr)
    if mem.local: self._check_local_read(pc, mem, lanes, flat)
    data = decode(mem.data[flat], mem.dtype)
    out[lanes] = data if width > 1 else data[:, 0]
    return out

  def store(self, pc: int, mask: Optional[np.ndarray]):
    u = self.plan.uops[pc]
    buf_pc, offsets, gate = self.vals[self.plan.srcs[pc][0]]
    mem, width = self.memory[buf_pc], u.src[1].dtype.count
    lanes = self._active_lanes(mask, gate)
    if lanes is not None and len(lanes) == 0: return
    lanes, addr = self._addresses(pc, mem, offsets, lanes, width, "writes")
    shape = (self.batch.lanes, width) if width > 1 else (self.batch.lanes,)
    value = encode(np.broadcast_to(self.vals[self.plan.srcs[pc][1]], shape)[lanes], mem.dtype).reshape(len(lanes), width)
    flat = mem.flat(lanes, addr)
    self._check_store_conflicts(pc, mem, lanes, flat, value)
    if mem.local:
      self._check_local_write(pc, mem, lanes, flat)
      mem.writer[flat] = self.batch.thread_of_lane[lanes][:, None]
    mem.data[flat] = value

  def _check_store_conflicts(self, pc: int, mem: _Memory, lanes, flat, value):
    """Two threads storing different values to one element at the same store: on a real device either may win."""
    f, v = flat.reshape(-1), value.reshape(-1)
    if len(f) < 2: return
    order = np.argsort(f, kind="stable")
    fs, bits = f[order], np.ascontiguousarray(v[order]).view(f"u{v.dtype.itemsize}") if v.dtype != np.bool_ else v[order]
    clash = (fs[1:] == fs[:-1]) & (bits[1:] != bits[:-1])
    if clash.any():
      i = int(np.argmax(clash))
      a, b = (int(lanes[order[j] // flat.shape[1]]) for j in (i, i + 1))
      raise self.error(DataRaceError, pc, f"{self.batch.lane_name(a)} and {self.batch.lane_name(b)} store different values to "
                                          f"element {self._element(mem, fs[i])} of {mem.label} at the same time", None)

  def _element(self, mem: _Memory, flat: int) -> int: return int(flat) % mem.size if mem.local and mem.size else int(flat)

  def _check_local_read(self, pc: int, mem: _Memory, lanes, flat):
    writer, me = mem.writer[flat], self.batch.thread_of_lane[lanes][:, None]
    if (never := writer == -2).any():
      i = int(np.argmax(never.any(axis=1)))
      raise self.error(DataRaceError, pc, f"reads element {self._element(mem, flat[i][never[i]][0])} of {mem.label}, which no thread "
                                          "of the work-group wrote", int(lanes[i]))
    if (race := (writer >= 0) & (writer != me)).any():
      i = int(np.argmax(race.any(axis=1)))
      j = int(np.argmax(race[i]))
      raise self.error(DataRaceError, pc, f"reads element {self._element(mem, flat[i, j])} of {mem.label} that thread "
                                          f"{self._thread_name(int(writer[i, j]))} wrote with no BARRIER in between", int(lanes[i]))

  def _check_local_write(self, pc: int, mem: _Memory, lanes, flat):
    writer, me = mem.writer[flat], self.batch.thread_of_lane[lanes][:, None]
    if (race := (writer >= 0) & (writer != me)).any():
      i = int(np.argmax(race.any(axis=1)))
      j = int(np.argmax(race[i]))
      raise self.error(DataRaceError, pc, f"overwrites element {self._element(mem, flat[i, j])} of {mem.label} that thread "
                                          f"{self._thread_name(int(writer[i, j]))} wrote with no BARRIER in between", int(lanes[i]))

  def _thread_name(self, t: int) -> str:
    c = self.batch.thread_coords[t]
    return f"({c[0]},{c[1]},{c[2]})"

  def barrier(self, pc: int, mask: Optional[np.ndarray]):
    b = self.batch
    if mask is None: reached = np.ones(b.num_groups, dtype=bool)
    else:
      per_group = np.broadcast_to(mask, (b.lanes,)).reshape(b.num_groups, b.threads)
      reached, partial = per_group.all(axis=1), per_group.any(axis=1) & ~per_group.all(axis=1)
      if partial.any():
        g = int(np.argmax(partial))
        row = per_group[g]
        there, away = int(np.argmax(row)), int(np.argmax(~row))
        raise self.error(BarrierError, pc, f"{b.lane_name(g * b.threads + there)} reaches the BARRIER but "
                                           f"{b.lane_name(g * b.threads + away)} of the same work-group skips it")
    for pcl in self.plan.locals: self.memory[pcl].publish(reached)
