"""Old module paths of the core, from before its folders showed the pipeline: `import kc.device` still works and gives
the module at its new place (kc.runtime.device), with a DeprecationWarning that names it."""
from __future__ import annotations
import importlib, importlib.abc, importlib.machinery, sys, warnings

MOVED = {"kc.dtype": "kc.ir.dtype", "kc.uop": "kc.ir.uop", "kc.rewrite": "kc.ir.rewrite", "kc.symbolic": "kc.ir.symbolic",
         "kc.transcendental": "kc.codegen.transcendental", "kc.lower": "kc.codegen.lower", "kc.graph": "kc.codegen.graph",
         "kc.linearize": "kc.codegen.linearize", "kc.device": "kc.runtime.device", "kc.plugins": "kc.runtime.plugins",
         "kc.emulator": "kc.runtime.emulator", "kc.cache": "kc.runtime.cache", "kc.arguments": "kc.runtime.arguments"}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  def find_spec(self, fullname, path=None, target=None):
    return importlib.machinery.ModuleSpec(fullname, self) if fullname in MOVED else None

  def create_module(self, spec):
    warnings.warn(f"{spec.name} moved to {MOVED[spec.name]}; import it from there (or the name from kc / kc.backend)",
                  DeprecationWarning, stacklevel=2)
    return importlib.import_module(MOVED[spec.name])

  def exec_module(self, module): pass  # the module at its new place is already executed


def install() -> None:
  if not any(isinstance(f, _MovedModules) for f in sys.meta_path): sys.meta_path.append(_MovedModules())
