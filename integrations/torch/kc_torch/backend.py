"""torch.compile's backend "kc": Dynamo's graph through AOTAutograd (forward and backward, decomposed to the ATen set
kc lowers), each graph partitioned into kc regions and torch ops."""
from __future__ import annotations
import itertools
from typing import Any, Optional
import torch
from torch._functorch.aot_autograd import aot_module_simplified
from functorch.compile import make_boxed_func
from kc_torch.decompositions import decompositions
from kc_torch.options import Options
from kc_torch.partition import compile_graph

_graph_numbers = itertools.count()


def kc_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], options: Optional[dict[str, Any]] = None):
  """The backend torch.compile calls (registered as "kc" through the torch_dynamo_backends entry point):
  torch.compile(model, backend="kc", options={"device": "CLANG", "opts": "hand", "report": False})."""
  opts = Options.parse(options)
  number = next(_graph_numbers)

  def compiler(kind: str):
    def compile_aten(aten_gm: torch.fx.GraphModule, inputs):
      return make_boxed_func(compile_graph(aten_gm, opts, f"{kind} {number}"))
    return compile_aten

  return aot_module_simplified(gm, example_inputs, fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                               inference_compiler=compiler("inference"), decompositions=decompositions())
