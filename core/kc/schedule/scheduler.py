"""The scheduler: a program (a SINK of STOREs over a UOp graph) cut into kernels.

kc.ast builds a program graph in which every value is computed where it is used, as one kernel would compute it, and
marks with a BUFFER node each value that one kernel cannot carry further (a reduce result reshaped, or broadcast to a
size its reduce did not loop over, ...). The scheduler decides the kernels from that graph:

1. The program's outputs are grouped by the shape they are stored through: stores of one shape share a loop nest and
   are one kernel (today's one-kernel programs are exactly this group), stores of different shapes are separate kernels.
2. Every BUFFER is a kernel of its own that stores the value into an intermediate buffer; where the value is read, the
   kernel LOADs that buffer through the same view. Elementwise work and movement stay fused into the consumer: they
   are part of the consumer's graph and never materialised.
3. A kernel that the Kernel cannot run as one loop nest (reduces that nest over axes no load spans) has the values
   broadcast into its reduces materialised as well, innermost first, until it verifies.
   With share_transcendentals (kc.compile sets it for devices that compute exp2 and its kin in software), a value
   holding such an op that two of a kernel's loop nests would each compute (a softmax's exp in its sum's loop and in
   its quotient's) is materialised too, above a size (kc.schedule.recompute). On every device, so is a reduce's
   result that a kernel would compute again for each output of a reduce reading it (an RMSNorm's rstd[i], read in its
   weight gradient's sum over i, once per column). With broadcast_reduces_apart (kc.compile sets it for devices with
   work-groups, whose work-items each compute their own outputs), every value holding a reduce that a kernel reads
   broadcast is materialised: a softmax is three kernels (max, sum, quotient), not one whose every work-item computes
   its row's max and sum again.
4. Kernels that store through the same shape and do not depend on each other are merged (several outputs of one loop
   nest), then ordered so that every intermediate is written before it is read, and every caller's buffer is read by
   all its readers before a kernel writes it. A kernel whose shape differs from another's only by size-1 axes is
   moved into the wider shape to merge (an activation stored as (M, 1, N) and materialised for the next matmul as
   (M, 1, N, 1)).

5. An intermediate that the program also stores whole into a caller's buffer (a value the program returns and reads
   again: a layer norm's mean and rstd, saved for its backward and read by its output's kernel) lives in that buffer:
   its kernel writes the caller's buffer, the copy of it into that buffer is dropped, and its readers load it from
   there after its kernel ran. Only for a buffer the program writes once and never reads as an input (whose old
   value some kernel would otherwise have to read first).

Each kernel's buffers are renumbered 0..n-1 (the caller's buffers first, in index order, then the intermediates), so
a one-kernel program's AST is the program itself (its stores moved into one shape where rule 4 merged across size-1
axes): the same source, opts and cache keys as a single kernel. Opts for a one-kernel program apply to that AST
(kc.compile builds the kernel from it).
Intermediates are planned in one arena (kc.schedule.memory): allocated once per compiled program, reused by buffers
whose lifetimes do not overlap."""
from __future__ import annotations
import collections, dataclasses, functools, math
from dataclasses import dataclass
from typing import Optional
from kc.codegen.verify import st_arg, verify_ast
from kc.errors import InvalidASTError
from kc.ir.dtype import DType, dtypes
from kc.ir.uop import Ops, UOp, sint
from kc.schedule.memory import TempBuffer, aligned_arena, plan_arena
from kc.schedule.movement import Move, extents, kernel_nodes, move, shape_of
from kc.renderer import Renderer
from kc.schedule.recompute import computes_transcendentals_in_software, recomputed_reduces, recomputed_transcendentals
from kc.schedule.pack_operand import pack_operand
from kc.schedule.split_reduce import TEMP, split_reduce
from kc.shape import ShapeTracker
from kc.shape.view import fmt_shape


@dataclass(frozen=True)
class BufferRef:
  """One buffer of a scheduled kernel: the caller's buffer `index` (temp=False) or intermediate `index` (temp=True)."""
  temp: bool
  index: int

  def __repr__(self): return f"{'t' if self.temp else 'b'}{self.index}"


@dataclass(frozen=True)
class ScheduledKernel:
  """One kernel of a program: its AST (buffers numbered 0..n-1) and, per buffer index, the buffer it stands for."""
  ast: UOp
  buffers: tuple[BufferRef, ...]

  @property
  def outputs(self) -> tuple[BufferRef, ...]: return tuple(self.buffers[s.src[0].arg] for s in self.ast.src)

  @property
  def shape(self) -> tuple[sint, ...]: return st_arg(self.ast.src[0]).shape

  def describe(self) -> str:
    reads = sorted({self.buffers[u.src[0].arg] for u in self.ast.toposort if u.op is Ops.LOAD
                    and u.src[0].op is Ops.DEFINE_GLOBAL}, key=lambda r: (r.temp, r.index))
    return f"{fmt_shape(self.shape)} writes {list(self.outputs)} reads {reads}"


@dataclass(frozen=True)
class Schedule:
  """A program's kernels in launch order and its intermediate buffers, laid out in one arena of `peak_bytes`."""
  sink: UOp
  kernels: tuple[ScheduledKernel, ...]
  temps: tuple[TempBuffer, ...]
  peak_bytes: int

  @property
  def single(self) -> bool:
    """One kernel and no intermediate: the program is that kernel (kc.compile's one-kernel path)."""
    return len(self.kernels) == 1 and not self.temps

  def aligned_to(self, alignment: int) -> "Schedule":
    """This schedule with every intermediate at a multiple of `alignment` bytes as well as of the arena's own
    ALIGNMENT: the same kernels, the arena planned again where the device's buffer views need more (Allocator.
    view_alignment: 512 bytes on NVIDIA's OpenCL)."""
    temps, peak = aligned_arena(self.temps, self.peak_bytes, alignment)
    return self if temps is self.temps else dataclasses.replace(self, temps=temps, peak_bytes=peak)

  def describe(self) -> list[str]:
    lines = [f"kernel {i}: {k.describe()}" for i, k in enumerate(self.kernels)]
    if self.temps: lines.append(f"{len(self.temps)} intermediates, {self.peak_bytes} bytes at peak")
    return lines


def realize(value: UOp, shape: tuple[sint, ...], logical: Optional[tuple] = None) -> UOp:
  """The BUFFER that holds `value` (of kernel shape `shape`), stored contiguously; `logical` is its numpy shape."""
  ptr = value.dtype.ptr(size=math.prod(shape)) if all(isinstance(d, int) for d in shape) else value.dtype.ptr()
  return UOp(Ops.BUFFER, ptr, (value, ShapeTracker.from_shape(shape).to_uop()), tuple(shape if logical is None else logical))




# ***** a kernel under construction: its stores, each to a caller's buffer (a DEFINE_GLOBAL) or to a BUFFER *****

@dataclass(frozen=True)
class _Store:
  target: UOp  # DEFINE_GLOBAL (the caller's) or BUFFER (an intermediate)
  view: UOp
  value: UOp
  arg: object  # the STORE's arg: the numpy shape of what is stored

  @property
  def shape(self) -> tuple: return self.view.arg.shape


def _reads(stores: list[_Store]) -> dict[UOp, None]:
  """The BUFFERs a kernel reads, in the order its graph is walked: a UOp hashes by its address, so a set of them
  would iterate in another order in every process, and the kernels found from it (and a list of opts given per
  kernel) with it."""
  return dict.fromkeys(u for s in stores for u in kernel_nodes(s.value) if u.op is Ops.BUFFER)


def _caller_reads(stores: list[_Store]) -> set[int]:
  return {u.src[0].arg for s in stores for u in kernel_nodes(s.value) if u.op is Ops.LOAD and u.src[0].op is Ops.DEFINE_GLOBAL}


def _number(stores: list[_Store], temp_ids: dict[UOp, int], in_place: Optional[dict[UOp, UOp]] = None) -> ScheduledKernel:
  """The kernel's AST with its buffers numbered 0..n-1: the caller's in index order, then the intermediates. An
  intermediate in `in_place` is the caller's buffer it maps to (its DEFINE_GLOBAL, rule 5)."""
  in_place = in_place or {}
  nodes = [u for s in stores for u in kernel_nodes(s.value)]
  bufs = {u for u in nodes if u.op is Ops.BUFFER} | {s.target for s in stores if s.target.op is Ops.BUFFER}
  callers = sorted({u.arg for u in nodes if u.op is Ops.DEFINE_GLOBAL} | {s.target.arg for s in stores if s.target.op is Ops.DEFINE_GLOBAL}
                   | {in_place[b].arg for b in bufs if b in in_place})
  temps = sorted((b for b in bufs if b not in in_place), key=lambda b: temp_ids[b])
  refs = [BufferRef(False, i) for i in callers] + [BufferRef(True, temp_ids[b]) for b in temps]
  new_index = {r: i for i, r in enumerate(refs)}

  def buffer(b: UOp) -> UOp:  # an intermediate's DEFINE_GLOBAL in this kernel
    if (caller := in_place.get(b)) is not None: return caller.replace(arg=new_index[BufferRef(False, caller.arg)])
    return UOp(Ops.DEFINE_GLOBAL, b.dtype, (), new_index[BufferRef(True, temp_ids[b])])
  mapping: dict[UOp, UOp] = {}
  for u in nodes:
    if u.op is Ops.DEFINE_GLOBAL: mapping[u] = u.replace(arg=new_index[BufferRef(False, u.arg)])
    elif u.op is Ops.BUFFER: mapping[u] = buffer(u)

  def target(s: _Store) -> UOp:
    if s.target.op is Ops.DEFINE_GLOBAL: return s.target.replace(arg=new_index[BufferRef(False, s.target.arg)])
    return buffer(s.target)
  out = [UOp(Ops.STORE, dtypes.void, (target(s), s.view, _substitute(s.value, mapping)), s.arg) for s in stores]
  return ScheduledKernel(UOp(Ops.SINK, dtypes.void, tuple(out)), tuple(refs))


def _substitute(root: UOp, mapping: dict[UOp, UOp]) -> UOp:
  """`root` with the keys of `mapping` replaced, walking one kernel only (a BUFFER's own graph is another kernel)."""
  memo: dict[UOp, UOp] = dict(mapping)
  for node in kernel_nodes(root):
    if node in memo: continue
    if node.op is Ops.BUFFER: memo[node] = node; continue  # another kernel's value: read as it is
    new_src = tuple(memo[s] for s in node.src)
    memo[node] = node if new_src == node.src else UOp(node.op, node.dtype, new_src, node.arg)
  return memo[root]


def _verified(stores: list[_Store]) -> Optional[InvalidASTError]:
  """None where the stores are one kernel the Kernel can run, else why not."""
  temp_ids = {b: i for i, b in enumerate(dict.fromkeys([*_reads(stores), *(s.target for s in stores if s.target.op is Ops.BUFFER)]))}
  try: verify_ast(_number(stores, temp_ids).ast)
  except InvalidASTError as e: return e
  return None


# ***** making a kernel verify: materialise what is broadcast into its reduces *****

def _holding_reduces(order: list[UOp]) -> dict[UOp, bool]:
  held: dict[UOp, bool] = {}
  for u in order: held[u] = u.op is Ops.REDUCE_AXIS or any(held.get(x, False) for x in u.src if x.op is not Ops.BUFFER)
  return held


def _nested_values(stores: list[_Store]) -> list[UOp]:
  """The computed values (those holding a reduce) read inside another reduce, innermost first: each becomes a BUFFER."""
  order = [u for s in stores for u in kernel_nodes(s.value)]
  held = _holding_reduces(order)
  found: dict[UOp, None] = {}
  for r in order:
    if r.op is not Ops.REDUCE_AXIS: continue
    for u in kernel_nodes(r.src[0]):
      # a broadcast VIEW of a reduce result, or a reduce result itself, inside this reduce's input
      if u.op is Ops.VIEW and u.src and held.get(u.src[0]): found[u.src[0]] = None
      elif u.op is Ops.REDUCE_AXIS: found[u] = None
  return [u for u in found if not any(v in found and v is not u for v in kernel_nodes(u) if v.op is Ops.REDUCE_AXIS)]


def _side_by_side_values(stores: list[_Store]) -> list[UOp]:
  """Reduce chains side by side over axes no one load spans (x.argmax(1) + x.max(1).argmax(), x.sum(0) * x.sum(1)
  broadcast together): every chain but the one over the most elements, each as the values it is read through (its
  top reduce, and the broadcast VIEWs' sources that hold it), so that each chain stays whole in a kernel of its own."""
  order = list(dict.fromkeys(u for s in stores for u in kernel_nodes(s.value)))
  under = {v for r in order if r.op is Ops.REDUCE_AXIS for v in kernel_nodes(r.src[0]) if v is not r}
  top = sorted((r for r in order if r.op is Ops.REDUCE_AXIS and r not in under), key=lambda r: -_elements(r.src[0]))
  if len(top) < 2: return []
  moved, kept = set(top[1:]), top[0]
  out: dict[UOp, None] = {}
  for u in order:
    if u.op is Ops.VIEW and u.src:
      inside = kernel_nodes(u.src[0])
      if any(r in inside for r in moved) and kept not in inside: out[u.src[0]] = None
  out.update((r, None) for r in top[1:])
  return list(out)


def _elements(u: UOp) -> int:
  """How many elements the loads under a value span (the size of the loop nest a reduce of it runs)."""
  return math.prod(d if isinstance(d, int) else 1 for d in extents(u))


def _materialise(stores: list[_Store], values: list[UOp]) -> list[_Store]:
  """The stores with each of `values` read from a BUFFER of its own: VIEW(value) becomes a LOAD through the view."""
  shapes = _shapes(stores)
  mapping: dict[UOp, UOp] = {}
  bufs = {v: realize(v, shapes[v]) for v in values}
  for s in stores:
    for u in kernel_nodes(s.value):
      if u.op is Ops.VIEW and u.src and u.src[0] in bufs: mapping[u] = UOp(Ops.LOAD, u.dtype, (bufs[u.src[0]], u.arg.to_uop()), shapes[u.src[0]])
  for v, b in bufs.items(): mapping.setdefault(v, UOp(Ops.LOAD, v.dtype, (b, ShapeTracker.from_shape(shapes[v]).to_uop()), shapes[v]))
  return [_Store(s.target, s.view, _substitute(s.value, mapping), s.arg) for s in stores]


def _shapes(stores: list[_Store]) -> dict[UOp, tuple]:
  cache: dict = {}
  out = {}
  for s in stores:
    for u in kernel_nodes(s.value):
      if u.op is Ops.BUFFER: cache[u] = None; continue
      out[u] = shape_of(u, cache)
  return out


def _legal(stores: list[_Store]) -> list[_Store]:
  """The stores, with values materialised until they are one kernel the Kernel can run."""
  err = _verified(stores)
  while err is not None:
    # chains side by side go to kernels of their own whole where that is enough; else the innermost nested values
    if (side := _side_by_side_values(stores)) and _verified(candidate := _materialise(stores, side)) is None: return candidate
    values = _nested_values(stores) or side
    if not values: raise err
    stores = _materialise(stores, values)
    err = _verified(stores)
  return stores


# ***** the schedule *****

def _groups(stores: list[_Store]) -> list[list[_Store]]:
  """Stores of one shape are one kernel (one loop nest), in the order their first store was given."""
  groups: dict[tuple, list[_Store]] = {}
  for s in stores: groups.setdefault(s.shape, []).append(s)
  return list(groups.values())


def _split_illegal(group: list[_Store]) -> list[list[_Store]]:
  """A group that does not verify as one kernel even with its reduces materialised is run store by store."""
  if len(group) == 1 or _verified(group) is None: return [group]
  return [[s] for s in group]


def _check_program(sink: UOp) -> list[_Store]:
  if not isinstance(sink, UOp) or sink.op is not Ops.SINK or not sink.src or any(x.op is not Ops.STORE for x in sink.src):
    raise InvalidASTError(f"a program is a SINK of STOREs, got {getattr(sink, 'op', sink)!r}")
  for s in sink.src:
    if len(s.src) != 3 or s.src[0].op is not Ops.DEFINE_GLOBAL or s.src[1].op is not Ops.VIEW:
      raise InvalidASTError(f"STORE is (DEFINE_GLOBAL, VIEW, value), got {[x.op for x in s.src]}")
  dts: dict[int, DType] = {}
  for u in sink.toposort:
    if u.op is Ops.DEFINE_GLOBAL and dts.setdefault(u.arg, u.dtype.base) != u.dtype.base:
      raise InvalidASTError(f"buffer {u.arg} is used as {dts[u.arg].name} and as {u.dtype.base.name}; one buffer has one dtype")
  return [_Store(s.src[0], s.src[1], s.src[2], s.arg) for s in sink.src]


def _stored_in_place(stores: list[_Store]) -> tuple[list[_Store], dict[UOp, _Store]]:
  """Rule 5: (the stores without those that store an intermediate's value whole into a caller's buffer, {that
  intermediate's BUFFER: that store, whose target is the caller's DEFINE_GLOBAL it lives in}). kc.ast stores a
  realized value read whole and in order as the value itself, through the BUFFER's own view: such a store has the
  BUFFER's sources. The caller's buffer qualifies where no other store writes it and no kernel reads it (its old
  value is nobody's input)."""
  nodes = [u for s in stores for u in s.value.toposort]
  read = {u.arg for u in nodes if u.op is Ops.DEFINE_GLOBAL}
  buffers = {u.src[:2]: u for u in nodes if u.op is Ops.BUFFER}
  writes = collections.Counter(s.target.arg for s in stores)
  kept, in_place = [], {}
  for s in stores:
    b = buffers.get((s.value, s.view))
    if b is not None and b not in in_place and writes[s.target.arg] == 1 and s.target.arg not in read and \
       b.dtype.base == s.target.dtype.base:
      in_place[b] = s
      continue
    kept.append(s)
  return kept, in_place


def _shared_once(stores: list[_Store]) -> list[_Store]:
  """The stores with the transcendental values two of their loop nests would compute materialised."""
  values = recomputed_transcendentals(s.value for s in stores)
  return _materialise(stores, values) if values else stores


def _reduces_once(stores: list[_Store]) -> list[_Store]:
  """The stores with every reduce's result that a kernel would compute again for each output of a reduce reading it
  materialised (rule 3, kc.schedule.recompute.recomputed_reduces)."""
  values = recomputed_reduces(s.value for s in stores)
  return _materialise(stores, values) if values else stores


def _broadcasts(st: ShapeTracker) -> bool:
  """Whether a view repeats elements: a dim of more than one element with stride 0."""
  return any(stride == 0 and not (isinstance(d, int) and d == 1) for v in st.views for d, stride in zip(v.shape, v.strides))


def _broadcast_reduces_apart(stores: list[_Store]) -> list[_Store]:
  """The stores with every value that holds a reduce and is read through a broadcast VIEW materialised (rule 3, on
  devices with work-groups): such a value is read by many of the kernel's outputs, and where outputs run on separate
  work-items each would compute it again (every element of a softmax's row its row's max and its sum)."""
  order = list(dict.fromkeys(u for s in stores for u in kernel_nodes(s.value)))
  held = _holding_reduces(order)
  values = list(dict.fromkeys(u.src[0] for u in order if u.op is Ops.VIEW and u.src and held.get(u.src[0]) and _broadcasts(u.arg)))
  return _materialise(stores, values) if values else stores


@functools.lru_cache(maxsize=256)
def schedule(sink: UOp, share_transcendentals: bool = False, broadcast_reduces_apart: bool = False) -> Schedule:
  """The kernels of a program, in launch order, and its intermediates' arena. See the module's docstring for the
  rules. Raises InvalidASTError for a graph that is not a program, or whose kernels cannot be ordered (a buffer of
  the caller's read after a kernel that writes it must run first). `share_transcendentals`: a transcendental value
  that two loop nests of a kernel would compute is computed once into an intermediate (rule 3).
  `broadcast_reduces_apart`: a reduce's result that a kernel reads broadcast is a kernel of its own (rule 3; for
  devices that run a kernel's outputs on separate work-items)."""
  passes = [_reduces_once] + [p for p, on in ((_shared_once, share_transcendentals), (_broadcast_reduces_apart, broadcast_reduces_apart)) if on]
  def prepare(stores: list[_Store]) -> list[_Store]:
    for p in passes: stores = p(stores)
    return stores
  units: list[list[_Store]] = []
  stores, in_place = _stored_in_place(_check_program(sink))
  for group in _groups(stores): units.extend(_split_illegal(_legal(prepare(group))))
  # every BUFFER read anywhere is a kernel that stores it (found breadth-first, so a value is one kernel even when
  # several kernels read it); one that lives in a caller's buffer is such a kernel even where nothing reads it
  seen: dict[UOp, None] = {}
  pending = [b for u in units for b in _reads(u)] + list(in_place)
  while pending:
    b = pending.pop(0)
    if b in seen: continue
    seen[b] = None
    # one that lives in a caller's buffer keeps the logical shape the program stored it as (kc.run's output's)
    unit = _legal(prepare([_Store(b, b.src[1], b.src[0], in_place[b].arg if b in in_place else b.arg)]))
    units.append(unit)
    pending.extend(x for x in _reads(unit) if x not in seen)
  ordered = _order(units)
  temp_ids: dict[UOp, int] = {}
  for u in ordered:
    for s in u:
      if s.target.op is Ops.BUFFER and s.target not in in_place: temp_ids[s.target] = len(temp_ids)
  kernels = tuple(_number(u, temp_ids, {b: s.target for b, s in in_place.items()}) for u in ordered)
  temps, peak = plan_arena(kernels, [_temp_of(b) for b in temp_ids])
  return Schedule(sink, kernels, temps, peak)


def schedule_for(sink: UOp, renderer: Optional[Renderer]) -> Schedule:
  """The schedule kc.compile runs on a device with `renderer` when one choice of opts is for every kernel: the
  transcendentals shared where the device computes them in software, the broadcast reduces apart where it has
  work-groups. (A list of opts is given per kernel of the plain schedule(sink).)"""
  return schedule(sink, share_transcendentals=computes_transcendentals_in_software(renderer),
                  broadcast_reduces_apart=renderer is not None and renderer.has_local)


def _temp_of(b: UOp) -> tuple[DType, sint]:
  return b.dtype.base, (b.dtype.size if b.dtype.size != -1 else math.prod(b.src[1].arg.shape))


def _after(units: list[list[_Store]]) -> list[set[int]]:
  """For each unit, the units it must follow: the writers of the intermediates it reads, and every other reader of a
  caller's buffer it writes (all reads of a caller's buffer see its value before the program ran)."""
  producer = {s.target: i for i, u in enumerate(units) for s in u if s.target.op is Ops.BUFFER}
  reads = [_caller_reads(u) for u in units]
  after: list[set[int]] = []
  for i, u in enumerate(units):
    written = {s.target.arg for s in u if s.target.op is Ops.DEFINE_GLOBAL}
    after.append({producer[b] for b in _reads(u)} | {j for j in range(len(units)) if j != i and reads[j] & written})
  return after


def _topological(after: list[set[int]], members: list[list[int]]) -> Optional[list[int]]:
  """An order of the groups `members` (lists of unit indices) that puts each after the groups its units must follow
  (the first ready group first, so outputs keep the order given), or None where they follow each other in a circle."""
  group_of = {i: g for g, m in enumerate(members) for i in m}
  needs = [{group_of[j] for i in m for j in after[i]} - {g} for g, m in enumerate(members)]
  order: list[int] = []
  done: set[int] = set()
  while len(order) < len(members):
    ready = next((g for g in range(len(members)) if g not in done and needs[g] <= done), None)
    if ready is None: return None
    order.append(ready); done.add(ready)
  return order


def _inserted(shape: tuple, target: tuple) -> Optional[Move]:
  """The Move that gives `target` from `shape` by inserting size-1 axes, where there is one; else None."""
  if len(target) <= len(shape): return None
  arg: list = []
  kept = 0  # the axes of `shape` placed so far
  for d in target:
    if kept < len(shape) and d == shape[kept]: arg, kept = arg + [kept], kept + 1
    elif isinstance(d, int) and d == 1: arg.append(None)
    else: return None
  return Move("insert", tuple(arg)) if kept == len(shape) else None


def _moved(unit: list[_Store], target: tuple) -> Optional[list[_Store]]:
  """The unit's stores through `target`, its shape with size-1 axes inserted (each value moved as a reshape would),
  or None where that is not such a shape or a value cannot be moved in one kernel."""
  out = []
  for s in unit:
    if (mv := _inserted(s.shape, target)) is None: return None
    try: out.append(_Store(s.target, s.view.arg.reshape(target).to_uop(), move(s.value, mv, s.shape), s.arg))
    except InvalidASTError: return None
  return out


def _merge(units: list[list[_Store]], after: list[set[int]]) -> list[list[int]]:
  """Units that store through one shape become one kernel where the merged kernel verifies and no order of the
  kernels would then have to run one before itself (directly or through others); each group as unit indices. A unit
  whose shape differs from a group's only by size-1 axes is moved into the wider shape to join it (an output of a
  Linear layer's activation, stored as (M, 1, N), and the same value materialised for the next matmul as (M, 1, N,
  1): one loop nest, the product computed once). Moved units are replaced in `units`."""
  groups: list[list[int]] = []
  for i, u in enumerate(units):
    rest = [[j] for j in range(i + 1, len(units))]
    for g in groups:
      if i in {j for k in g for j in after[k]} or any(k in after[i] for k in g): continue
      shape, members = units[g[0]][0].shape, {k: units[k] for k in g + [i]}
      if u[0].shape != shape:  # the narrower side moved into the wider one's shape, else no merge
        wide = u[0].shape if len(u[0].shape) > len(shape) else shape
        moved = {k: m if m[0].shape == wide else _moved(m, wide) for k, m in members.items()}
        if any(m is None for m in moved.values()): continue
        members = moved  # type: ignore[assignment]
      trial = [h + [i] if h is g else h for h in groups]
      if _topological(after, trial + rest) is not None and _verified([s for k in g + [i] for s in members[k]]) is None:
        for k, m in members.items(): units[k] = m
        g.append(i)
        break
    else: groups.append([i])
  return groups


def _order(units: list[list[_Store]]) -> list[list[_Store]]:
  """The units merged into kernels, in a launch order: producers of intermediates before their readers, readers of a
  caller's buffer before its writer."""
  after = _after(units)
  if _topological(after, [[i] for i in range(len(units))]) is None:
    raise InvalidASTError("the program reads a buffer of the caller's after writing it in another kernel (an output "
                          "index that is also an input of a later step); use separate input and output indices")
  groups = _merge(units, after)
  order = _topological(after, groups)
  assert order is not None, "merging kept the kernels acyclic"
  return [[s for i in groups[g] for s in units[i]] for g in order]


@dataclass(frozen=True)
class SplitSchedule:
  """A schedule after the split-reduce rule, and for each of its kernels the index of the kernel it came from."""
  schedule: Schedule
  origin: tuple[int, ...]


def with_split_reduces(plan: Schedule, renderer, which: set[int]) -> SplitSchedule:
  """The rules that make one hand-coded kernel two, for `renderer`'s device, applied to the kernels of `plan` whose
  indices are in `which`: a large reduce with few outputs becomes a partial kernel, which reduces chunks of it in
  parallel into a new intermediate, and a combine kernel (kc.schedule.split_reduce); on a host CPU a large matmul
  becomes a kernel that packs its second operand into panels and the product reading them
  (kc.schedule.pack_operand). The arena is planned again with the new intermediates in it."""
  kernels: list[ScheduledKernel] = []
  origin: list[int] = []
  temps = [(t.dtype, t.size) for t in plan.temps]
  for i, k in enumerate(plan.kernels):
    two = (split_reduce(k.ast, renderer) or pack_operand(k.ast, renderer)) if i in which else None
    if two is None:
      kernels.append(k); origin.append(i)
      continue
    made = BufferRef(True, len(temps))
    temps.append((two.temp_dtype, two.temp_size))
    refs = lambda order, k=k, made=made: tuple(made if b == TEMP else k.buffers[b] for b in order)
    kernels += [ScheduledKernel(two.first, refs(two.first_buffers)), ScheduledKernel(two.second, refs(two.second_buffers))]
    origin += [i, i]
  if len(kernels) == len(plan.kernels): return SplitSchedule(plan, tuple(origin))
  placed, peak = plan_arena(kernels, temps)
  return SplitSchedule(Schedule(plan.sink, tuple(kernels), placed, peak), tuple(origin))

