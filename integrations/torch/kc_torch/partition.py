"""Which nodes of an ATen graph kc runs, grouped into regions (torch's capability-based partitioner), and the report
of the rest."""
from __future__ import annotations
import operator
from typing import Optional
import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupport
from kc_torch import report
from kc_torch.lowering import LOWERINGS, dtypes_check, meta
from kc_torch.options import Options
from kc_torch.region import KcRegion

aten = torch.ops.aten
# ops that only rename or reshape memory: a region of nothing else is left to torch (a view there costs nothing)
VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default, aten.t.default,
         aten.transpose.int, aten.expand.default, aten.unsqueeze.default, aten.squeeze.dims, aten.squeeze.dim,
         aten.squeeze.default, aten.select.int, aten.slice.Tensor, aten.alias.default, aten.split_with_sizes.default,
         aten.split.Tensor, operator.getitem}


def _is_tensor_valued(node: torch.fx.Node) -> bool:
  val = meta(node)
  if not isinstance(val, (tuple, list)): return isinstance(val, torch.Tensor)
  # a multi-result op may leave out results it was asked not to compute (convolution_backward's output_mask): None
  return any(isinstance(v, torch.Tensor) for v in val) and all(v is None or isinstance(v, torch.Tensor) for v in val)


def why_not(node: torch.fx.Node) -> Optional[str]:
  """None where kc runs `node` exactly, else the reason it runs in torch."""
  if node.op != "call_function": return "not an op"
  if not _is_tensor_valued(node): return "a value that is not a tensor (sizes, Python numbers)"
  lower = LOWERINGS.get(node.target)
  if lower is None: return "no kc lowering"
  if (why := dtypes_check(node)) is not None: return why
  return lower.check(node)


def _reported(node: torch.fx.Node) -> bool:
  """An unsupported node worth a line in the report: a tensor op, not size arithmetic."""
  return node.op == "call_function" and _is_tensor_valued(node) and node.target is not operator.getitem


class _Support(OperatorSupport):
  def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
    if node.target is operator.getitem:  # a result of a multi-result op goes where the op goes
      return why_not(node.args[0]) is None if isinstance(node.args[0], torch.fx.Node) else False
    return why_not(node) is None


def compile_graph(gm: torch.fx.GraphModule, options: Options, graph_name: str) -> torch.fx.GraphModule:
  """`gm` with every region of supported nodes replaced by a KcRegion; each unsupported tensor op reported."""
  for node in gm.graph.nodes:
    if _reported(node) and node.target is not operator.getitem and (why := why_not(node)) is not None:
      report.record(report.Fallback(graph_name, str(node.target), why), options.report)
  partitioner = CapabilityBasedPartitioner(gm, _Support(), allows_single_node_partition=True)
  partitions = [p for p in partitioner.propose_partitions()
                if any(n.target not in VIEWS for n in p.nodes)]  # a region of views alone stays in torch
  fused = partitioner.fuse_partitions(partitions, prefix="kc_region_")
  for node in fused.graph.nodes:
    if node.op == "call_module" and node.target.startswith("kc_region_"):
      region = KcRegion(getattr(fused, node.target), options, graph_name)
      setattr(fused, node.target, region)
      # called as a function, not as a submodule: nn.Module.__call__'s hook dispatch cost each region 1-2 us a call,
      # a tenth of a small region's time
      node.op, node.target = "call_function", region.forward
  fused.recompile()
  return fused
