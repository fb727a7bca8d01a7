"""A kc region: a subgraph of supported ATen ops run as one kc program (kc's scheduler decides its kernels).

The program is built for the concrete shapes, dtypes and layouts of a call's inputs and cached under them (in this
process, for every region with the same graph code; kc's own compile cache on disk keeps the compiled kernels across
processes). Tensors cross without copies: an input laid out as a permutation of a contiguous array (what a transpose
or permute gives) is read in its memory order and permuted back in the program; an output is allocated with the
strides torch's FakeTensor gave it and written in its memory order, so the eager ops after a region see the layout
they would have seen. Anything else is made contiguous first (torch copies it). An output that is a view of an input
or of another output (ALIASES) is that view, made by torch on the call's tensors: no kernel copies it.

A matmul's or convolution's result, and anything computed from it, that more than one node reads, one of them a
reduction (directly or through views), is realized: one kernel computes it into an intermediate that every reader
loads. kc.ast fuses each reader's use into the reader's
kernel otherwise, and a backward pass reads a layer's masked gradient three times (its bias gradient's sum, its
weight gradient's matmul through a transpose, the input gradient's matmul): three kernels would each redo the matmul."""
from __future__ import annotations
import math, threading
from dataclasses import dataclass
from typing import Any, Callable, Optional
import torch
import torch.fx
import kc
from kc import ast as A
from kc_torch import report
from kc_torch.dtypes import to_kc
from kc_torch.lowering import LOWERINGS, meta
from kc_torch.options import Options

aten = torch.ops.aten
# the ops whose results cost a long reduce per element: worth computing once where several nodes read them
CONTRACTIONS = frozenset({aten.mm.default, aten.bmm.default, aten.matmul.default, aten.addmm.default, aten.baddbmm.default,
                          aten.convolution.default, aten.convolution_backward.default})
# readers that reduce what they read: each would be a kernel of its own around the contraction it reads
REDUCTIONS = CONTRACTIONS | frozenset({aten.sum.default, aten.sum.dim_IntList, aten.mean.default, aten.mean.dim, aten.amax.default,
                                       aten.amin.default, aten.var.correction, aten.std.correction})
# readers that only view what they read (a weight gradient's transpose before its matmul)
VIEWS = frozenset({aten.t.default, aten.permute.default, aten.view.default, aten._unsafe_view.default, aten.reshape.default,
                   aten.transpose.int, aten.expand.default, aten.squeeze.dim, aten.unsqueeze.default})


# ops whose result is a view of their first argument (or, reshape, the same values): an output that is such a view of
# an input or of another output is returned as that view, made by torch, not written by a kernel. A training
# forward returns each Linear's W.t() (saved for the backward) and a ReLU's alias: kernels copying them cost as much
# as the layer's matmul on a small batch
ALIASES = frozenset({aten.permute.default, aten.t.default, aten.transpose.int, aten.view.default, aten._unsafe_view.default,
                     aten.reshape.default, aten.alias.default, aten.expand.default, aten.squeeze.dim, aten.squeeze.dims,
                     aten.squeeze.default, aten.unsqueeze.default, aten.slice.Tensor, aten.select.int})


def view_chain(node: torch.fx.Node) -> tuple[torch.fx.Node, tuple[torch.fx.Node, ...]]:
  """(the node `node` is a view of, through ALIASES ops whose other arguments are no nodes; the ops, first applied
  first). A node that is no such view is its own source, with no ops."""
  chain = []
  while node.op == "call_function" and node.target in ALIASES and isinstance(node.args[0], torch.fx.Node) and \
        not any(isinstance(a, torch.fx.Node) for a in (*node.args[1:], *node.kwargs.values())):
    chain.append(node)
    node = node.args[0]
  return node, tuple(reversed(chain))


def replay(x: torch.Tensor, chain: tuple[torch.fx.Node, ...]) -> torch.Tensor:
  """`x` through the view ops of `chain` (view_chain's), as torch runs them."""
  for n in chain: x = n.target(x, *n.args[1:], **n.kwargs)
  return x


def reduces_it(reader: torch.fx.Node) -> bool:
  """Whether a node reduces what it reads, directly or through views: kc.ast would compute a contraction it reads
  once more inside that reduction's kernel. Elementwise readers (a GELU's two reads of its input) merge back into one
  value, which the next reduction reads as a whole."""
  if reader.target in REDUCTIONS: return True
  return reader.target in VIEWS and any(reduces_it(u) for u in reader.users)


def _returned_and_read(node: torch.fx.Node) -> bool:
  """Whether the region returns the node's value and another node reads it, none of them a convolution: a forward's
  mean and rstd (saved for the backward, and read by the normalized output) are then computed once, into the
  region's outputs (kc.schedule's rule 5), where the output's kernel computed them again. A convolution reads its
  input padded: from a buffer, through loads masked at the border, which cost it more than computing the value again
  into a padded intermediate (a max pool's values read by the next convolution: 111 -> 683 us)."""
  readers = [u for u in node.users if u.op != "output"]
  return len(readers) < len(node.users) and bool(readers) and not any(u.target is aten.convolution.default for u in readers)


def _holds_reduce(value: A.Expr) -> bool:
  return any(u.op is kc.Ops.REDUCE_AXIS for u in value.uop.toposort)


def memory_order(shape, strides) -> Optional[tuple[int, ...]]:
  """The axes from outermost to innermost in memory, where the layout is a permutation of a contiguous array (dense,
  no overlap); None where it is not (expanded, sliced with a step, overlapping)."""
  order = tuple(sorted(range(len(shape)), key=lambda d: (-strides[d], d)))
  expect = 1
  for d in reversed(order):
    if shape[d] != 1 and strides[d] != expect: return None
    expect *= shape[d]
  return order


def _inverse(order: tuple[int, ...]) -> tuple[int, ...]:
  inv = [0] * len(order)
  for i, d in enumerate(order): inv[d] = i
  return tuple(inv)


@dataclass(frozen=True)
class OutputPlan:
  shape: tuple[int, ...]
  strides: tuple[int, ...]
  dtype: torch.dtype
  order: tuple[int, ...]   # memory order: the program writes value.permute(order) into the buffer, contiguous


@dataclass(frozen=True)
class Plan:
  program: Callable[..., Any]                 # the compiled kc program: outputs, then inputs, by buffer index
  inputs: tuple[Optional[tuple[int, ...]], ...]   # per region input: its memory order (tensors), None (ints)
  used: tuple[int, ...]                       # the region inputs the program reads, in buffer order
  outputs: tuple[OutputPlan, ...]
  results: tuple[int, ...]                    # per result of the region: which value (duplicates share one)
  # per value: ("out", k, ()) the program's output k; ("in", i, ops) a view of region input i; ("view", k, ops) a view
  # of output k (view_chain's ops, replayed by torch)
  values: tuple[tuple[str, int, tuple], ...]

  # what each call does to its tensors, decided when the plan is built: per output, the permute that is its buffer
  # (None: the output itself); per input read, "contiguous" (a copy), a permute, or None (the input itself)
  out_permutes: tuple[Optional[tuple[int, ...]], ...]
  in_views: tuple[tuple[int, Any], ...]
  on_cpu: bool                                # every tensor of the signature on the CPU
  # the program's buffers' byte counts, outputs then inputs read, where it runs on host addresses (call_host: every
  # tensor on the CPU and a host_callable program), else None (numpy views, or torch's stream on a GPU)
  host_nbytes: Optional[tuple[int, ...]] = None
  direct: bool = False                        # the results are the program's outputs, in order: nothing to replay
  # the same byte counts where the program runs on device addresses instead (call_device: every tensor in the memory
  # of the program's device, a GPU's, and a device_callable program), queued on torch's current stream
  device_nbytes: Optional[tuple[int, ...]] = None


def _is_identity(order: tuple[int, ...]) -> bool: return order == tuple(range(len(order)))


class Unsupported(Exception):
  """A node the lowering table refuses for these inputs (the region then runs in torch)."""


def _input_key(x) -> Any:
  # shape and strides decide the memory order the plan reads a tensor in (memory_order), so they key it as they are:
  # the order itself is computed once, when the plan is built, not on every call
  if isinstance(x, torch.Tensor): return (x.shape, x.stride(), x.dtype, x.device)
  return ("v", x)


_MISSING = object()


class KcRegion(torch.nn.Module):
  """Runs `gm` (a partition of supported nodes) as kc programs, one per input signature; falls back to `gm` itself,
  reported, where a signature cannot be built or compiled."""

  _programs: dict[Any, Plan] = {}   # shared by every region of the process: same code and signature, same program
  _lock = threading.Lock()

  def __init__(self, gm: torch.fx.GraphModule, options: Options, graph_name: str):
    super().__init__()
    self.gm, self.options, self.graph_name = gm, options, graph_name
    # the device is decided when the region is made, as torch.compile's options are: kc.Device.DEFAULT asks every
    # plugin whether it can open, which cost a call tens of microseconds
    self.device = options.device_name
    self.code = gm.code
    # this region's plans by its inputs' signature (None: the signature runs in torch), in front of the process's
    # shared _programs: a call then computes one small key
    self._plans: dict[Any, Optional[Plan]] = {}
    out = next(n for n in gm.graph.nodes if n.op == "output")
    self._tuple_out = isinstance(out.args[0], (tuple, list))

  def forward(self, *args):
    signature = tuple(map(_input_key, args))
    plan = self._plans.get(signature, _MISSING)
    if plan is None: return self.gm(*args)
    if isinstance(plan, Plan): return self._run(plan, args)
    key = (self.code, self.device, self.options.opts, signature)
    if (plan := self._programs.get(key)) is not None:
      self._plans[signature] = plan
      return self._run(plan, args)
    try:
      plan = self._build(args)
      results = self._run(plan, args)
    except (kc.KcError, Unsupported, ValueError, TypeError, IndexError) as e:
      self._plans[signature] = None
      ops = sorted({str(n.target) for n in self.gm.graph.nodes if n.op == "call_function"})
      report.record(report.Fallback(self.graph_name, f"region of {len(ops)} op kinds ({', '.join(ops[:6])}"
                                    f"{', ...' if len(ops) > 6 else ''})", f"{type(e).__name__}: {e}"),
                    self.options.report)
      return self.gm(*args)
    with self._lock: self._programs[key] = plan
    self._plans[signature] = plan
    return results

  # ------------------------------------------------------------------------------------------------------- build

  def _values(self, args, index_of: dict[int, int], n_out: int) -> dict[torch.fx.Node, Any]:
    """Interpret the graph with kc.ast values: input i becomes A.arg(n_out + index_of[i]) read in memory order."""
    env: dict[torch.fx.Node, Any] = {}
    placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
    for i, (node, x) in enumerate(zip(placeholders, args)):
      if not isinstance(x, torch.Tensor):
        env[node] = x
        continue
      order = memory_order(tuple(x.shape), x.stride()) if x.dim() else ()
      physical = tuple(x.shape) if order is None else tuple(x.shape[d] for d in order)
      value = A.arg(n_out + index_of.get(i, 0), to_kc(x.dtype), physical)
      env[node] = value if order is None or order == tuple(range(x.dim())) else value.permute(_inverse(order))
    holds_contraction: set[torch.fx.Node] = set()  # values computed from a contraction's result, not realized yet
    for node in self.gm.graph.nodes:
      if node.op != "call_function": continue
      lower = LOWERINGS.get(node.target)
      if lower is None: raise Unsupported(f"{node.target} has no kc lowering")
      load = lambda a: env[a] if isinstance(a, torch.fx.Node) else a  # noqa: E731
      fargs = torch.fx.node.map_aggregate(node.args, load)
      fkwargs = torch.fx.node.map_aggregate(node.kwargs, load)
      value = lower.fn(node, *fargs, **fkwargs)
      if node.target in CONTRACTIONS or any(a in holds_contraction for a in node.all_input_nodes):
        # the region's outputs are stored by the program itself, once: only the nodes that compute from it count
        readers = [u for u in node.users if u.op != "output"]
        if isinstance(value, A.Expr) and len(readers) > 1 and any(reduces_it(u) for u in readers): value = value.realize()
        else: holds_contraction.add(node)
      if isinstance(value, A.Expr) and _returned_and_read(node) and _holds_reduce(value): value = value.realize()
      env[node] = value
    return env

  def _build(self, args) -> Plan:
    out_node = next(n for n in self.gm.graph.nodes if n.op == "output")
    results = list(out_node.args[0]) if self._tuple_out else [out_node.args[0]]
    distinct = list(dict.fromkeys(results))
    values, computed = self._values_of(distinct, args)
    n_out = len(computed)
    tensors = [i for i, x in enumerate(args) if isinstance(x, torch.Tensor)]
    index_of = {i: k for k, i in enumerate(tensors)}
    env = self._values(args, index_of, n_out)
    stores, outputs = self._stores(env, computed)
    read = {u.arg for s in stores for u in s.toposort if u.op is kc.Ops.DEFINE_GLOBAL and u.arg >= n_out}
    used = tuple(i for i in tensors if n_out + index_of[i] in read)
    if len(used) != len(tensors):  # inputs only some shapes came from: number the buffers the program reads 0..n-1
      index_of = {i: k for k, i in enumerate(used)}
      env = self._values(args, index_of, n_out)
      stores, outputs = self._stores(env, computed)
    program = kc.compile(A.sink(*stores), device=self.device, opts=self.options.opts)
    inputs = tuple((memory_order(tuple(x.shape), x.stride()) if x.dim() else ()) if isinstance(x, torch.Tensor) else None
                   for x in args)
    out_permutes = tuple(None if _is_identity(o.order) else o.order for o in outputs)
    in_views = tuple((i, "contiguous" if inputs[i] is None else None if _is_identity(inputs[i]) else inputs[i]) for i in used)
    on_cpu = all(x.device.type == "cpu" for x in args if isinstance(x, torch.Tensor))
    nbytes = tuple(math.prod(o.shape) * o.dtype.itemsize for o in outputs) + tuple(args[i].numel() * args[i].element_size() for i in used)
    host_nbytes = nbytes if on_cpu and program.host_callable else None
    # a GPU's tensors by address only where each is in the memory kc's device addresses (the same GPU): an address
    # means nothing on another one
    on_device = not on_cpu and program.device_callable and all(
      x.__dlpack_device__() == program.dlpack_device for x in args if isinstance(x, torch.Tensor))
    result_values = tuple(distinct.index(r) for r in results)
    direct = values == tuple(("out", k, ()) for k in range(len(outputs))) and result_values == tuple(range(len(outputs)))
    return Plan(program, inputs, used, tuple(outputs), result_values, values, out_permutes, in_views, on_cpu,
                host_nbytes=host_nbytes, direct=direct, device_nbytes=nbytes if on_device else None)

  def _values_of(self, distinct: list[torch.fx.Node], args) -> tuple[tuple, list[torch.fx.Node]]:
    """(Plan.values, the outputs the program computes): a result that is a view of a tensor input, or of a computed
    output, is that view (view_chain); every other result is computed. With nothing else to compute the views are
    computed too (a program stores something)."""
    placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
    chains = {node: view_chain(node) for node in distinct}
    def from_input(node):  # noqa: E306
      src, ops = chains[node]
      return bool(ops) and src.op == "placeholder" and isinstance(args[placeholders.index(src)], torch.Tensor)
    # (a view chain ends at a node that is no view: an output that is such a source is computed)
    computed = [n for n in distinct if not from_input(n) and not (chains[n][1] and chains[n][0] in distinct)]
    if not computed: return tuple(("out", k, ()) for k in range(len(distinct))), distinct
    values = []
    for node in distinct:
      src, ops = chains[node]
      if node in computed: values.append(("out", computed.index(node), ()))
      elif from_input(node): values.append(("in", placeholders.index(src), ops))
      else: values.append(("view", computed.index(src), ops))
    return tuple(values), computed

  def _stores(self, env, distinct: list[torch.fx.Node]):
    stores, outputs = [], []
    for k, node in enumerate(distinct):
      value = env[node]
      if not isinstance(value, A.Expr): raise Unsupported(f"output {node.name} is not a tensor value")
      fake = meta(node)
      shape = tuple(int(s) for s in value.shape)
      strides = tuple(fake.stride()) if all(isinstance(s, int) for s in fake.stride()) else None
      order = memory_order(shape, strides) if strides is not None and len(strides) == len(shape) and shape else None
      if order is None: order, strides = tuple(range(len(shape))), tuple(torch.empty(shape, device="meta").stride())
      dtype = fake.dtype
      if to_kc(dtype) != value.dtype: value = value.astype(to_kc(dtype))
      stores.append(A.store(k, value.permute(order) if order != tuple(range(len(shape))) else value))
      outputs.append(OutputPlan(shape, strides, dtype, order))
    return stores, outputs

  # --------------------------------------------------------------------------------------------------------- run

  def _run(self, plan: Plan, args):
    if plan.host_nbytes is not None: return self._run_host(plan, args)
    return self._run_device(plan, args) if plan.device_nbytes is not None else self._run_arrays(plan, args)

  def _run_arrays(self, plan: Plan, args):
    # the signature keyed the plan on the tensors' devices: a CPU plan's tensors are all on the one CPU device
    device = _CPU if plan.on_cpu else next((x.device for x in args if isinstance(x, torch.Tensor)), _CPU)
    outs = [torch.empty_strided(o.shape, o.strides, dtype=o.dtype, device=device) for o in plan.outputs]
    buffers = [out if p is None else out.permute(p) for out, p in zip(outs, plan.out_permutes)]
    for i, view in plan.in_views:
      # AOTAutograd owns the autograd of the graph: its inputs are plain data here (DLPack refuses a tensor that
      # requires grad, and numpy() too)
      x = args[i]
      if x.requires_grad: x = x.detach()
      buffers.append(x if view is None else x.contiguous() if view == "contiguous" else x.permute(view))
    if device.type == "cpu":  # numpy views of the same memory: kc's numpy path costs a fifth of a DLPack import
      plan.program(*(_host_view(b) for b in buffers))
    else:  # on a GPU the kernels are queued on torch's current stream, as torch's own ops are: ordered after torch's
      # work there and before what torch queues next; the host does not wait for them (torch synchronizes where it
      # needs the values, as it does for its own ops)
      plan.program(*buffers, stream="torch", wait=False)
    return self._results(plan, args, outs)

  def _run_host(self, plan: Plan, args):
    """A CPU plan on a host_callable program: the tensors' addresses straight to kc (call_host). An output's buffer
    is its memory in memory order and an input read permuted is its own memory: either's address is the tensor's.
    The signature fixed every shape, stride and dtype, so the byte counts are the plan's."""
    outs = [torch.empty_strided(o.shape, o.strides, dtype=o.dtype) for o in plan.outputs]
    tensors = outs + [args[i].contiguous() if view == "contiguous" else args[i] for i, view in plan.in_views]
    try: plan.program.call_host(*((t.data_ptr(), n) for t, n in zip(tensors, plan.host_nbytes)))
    except kc.ArgumentError:  # a view at an address the kernel cannot take as it is: the array path copies it
      return self._run_arrays(plan, args)
    return self._results(plan, args, outs)

  def _run_device(self, plan: Plan, args):
    """A GPU plan on a device_callable program: the tensors' device addresses straight to kc (call_device), queued
    on torch's current stream without waiting, as the array path is (no DLPack import per tensor). The addresses are
    the tensors' as in _run_host; a temporary (an input's contiguous copy) goes back to torch's allocator after this
    call, which reuses its memory only for work queued after these kernels on the same stream."""
    device = next(x.device for x in args if isinstance(x, torch.Tensor))
    outs = [torch.empty_strided(o.shape, o.strides, dtype=o.dtype, device=device) for o in plan.outputs]
    tensors = outs + [args[i].contiguous() if view == "contiguous" else args[i] for i, view in plan.in_views]
    try:
      plan.program.call_device(*((t.data_ptr(), n) for t, n in zip(tensors, plan.device_nbytes)),
                               stream=torch.cuda.current_stream(device).cuda_stream, wait=False)
    except kc.ArgumentError:  # a view at an address the kernel cannot take as it is: the array path copies it
      return self._run_arrays(plan, args)
    return self._results(plan, args, outs)

  def _results(self, plan: Plan, args, outs: list):
    if plan.direct: return tuple(outs) if self._tuple_out else outs[0]
    values = [outs[k] if kind == "out" else replay(args[k] if kind == "in" else outs[k], ops) for kind, k, ops in plan.values]
    results = tuple(values[r] for r in plan.results)
    return results if self._tuple_out else results[0]


_CPU = torch.device("cpu")


def _host_view(t: torch.Tensor):
  """A CPU tensor as a numpy array over its memory (bfloat16 as its uint16 bits, which kc takes for bfloat16)."""
  return t.view(torch.uint16).numpy() if t.dtype == torch.bfloat16 else t.numpy()


def program_count() -> int:
  """How many kc programs the regions of this process have built (one per region graph and input signature)."""
  with KcRegion._lock: return len(KcRegion._programs)
