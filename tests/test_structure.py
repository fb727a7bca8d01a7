"""The shape of the code, read from the source with `ast` (so an import inside a function counts as much as one at the
top of a file): no import circle between the core's files, no layer of the core importing a higher one, and backend
plugins that reach kc only through `kc` and `kc.backend`."""
from __future__ import annotations
import ast, re, sys, tomllib
from dataclasses import dataclass
from importlib.metadata import packages_distributions
from pathlib import Path
import pytest

REPO = Path(__file__).resolve().parent.parent
CORE = REPO / "core"
PLUGINS = REPO / "plugins"


# ------------------------------------------------------------------------------------------------------ reading imports

@dataclass(frozen=True)
class ImportStatement:
  """One `import` or `from ... import` of a file, with its relative form resolved to an absolute module name."""
  importer: str                   # the module whose file holds the statement
  path: Path
  line: int
  module: str                     # `import a.b` -> "a.b"; `from a.b import c` -> "a.b"
  names: tuple[str, ...] | None   # `from a.b import c, d` -> ("c", "d"); None for a plain `import`
  in_function: bool               # runs only when the function is called
  type_checking: bool             # under `if TYPE_CHECKING:`: seen by type checkers, never run

  @property
  def where(self) -> str:
    lazy = " (in a function)" if self.in_function else " (under TYPE_CHECKING)" if self.type_checking else ""
    return f"{self.path.relative_to(REPO)}:{self.line}{lazy}"


def module_name(path: Path, root: Path) -> str:
  """core/kc/ir/uop.py -> kc.ir.uop; a package's __init__.py is the package itself."""
  parts = list(path.relative_to(root).with_suffix("").parts)
  if parts[-1] == "__init__": parts.pop()
  return ".".join(parts)


def resolve_relative(importer: str, is_package: bool, level: int, module: str | None) -> str:
  """The absolute module of `from <level dots><module> import ...` written in `importer`."""
  package = importer.split(".") if is_package else importer.split(".")[:-1]
  if level - 1 > len(package) - 1: raise ValueError(f"{importer}: relative import goes above its top package")
  base = package[:len(package) - (level - 1)]
  return ".".join(base + ([module] if module else []))


def _is_type_checking(test: ast.expr) -> bool:
  return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
         (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _ImportCollector(ast.NodeVisitor):
  """Every import statement of one file, remembering whether it sits in a function or under TYPE_CHECKING."""
  def __init__(self, importer: str, path: Path):
    self.importer, self.path, self.is_package = importer, path, path.name == "__init__.py"
    self.function_depth = self.type_checking_depth = 0
    self.found: list[ImportStatement] = []

  def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    self.function_depth += 1
    self.generic_visit(node)
    self.function_depth -= 1
  visit_AsyncFunctionDef = visit_FunctionDef

  def visit_If(self, node: ast.If) -> None:
    if not _is_type_checking(node.test): return self.generic_visit(node)
    self.type_checking_depth += 1
    for child in node.body: self.visit(child)
    self.type_checking_depth -= 1
    for child in node.orelse: self.visit(child)

  def visit_Import(self, node: ast.Import) -> None:
    for alias in node.names: self._add(node, alias.name, None)

  def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
    module = resolve_relative(self.importer, self.is_package, node.level, node.module) if node.level else node.module
    self._add(node, module, tuple(alias.name for alias in node.names))

  def _add(self, node: ast.stmt, module: str, names: tuple[str, ...] | None) -> None:
    self.found.append(ImportStatement(self.importer, self.path, node.lineno, module, names, self.function_depth > 0,
                                      self.type_checking_depth > 0))


def read_imports(path: Path, root: Path) -> list[ImportStatement]:
  collector = _ImportCollector(module_name(path, root), path)
  collector.visit(ast.parse(path.read_text(), filename=str(path)))
  return collector.found


def python_files(folder: Path) -> list[Path]:
  return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


# ------------------------------------------------------------------------------------------------------- the core's graph

@dataclass(frozen=True)
class Edge:
  """`statement` makes its file depend on the file of module `target`."""
  target: str
  statement: ImportStatement


def _is_ancestor(package: str, module: str) -> bool: return module.startswith(package + ".")


def _known_prefix(module: str, known: set[str]) -> str | None:
  """The deepest module of `known` that `module` is or lies in (an unknown kc.x counts as the package kc)."""
  parts = module.split(".")
  for n in range(len(parts), 0, -1):
    if (prefix := ".".join(parts[:n])) in known: return prefix
  return None


def edges_of(statement: ImportStatement, known: set[str]) -> list[Edge]:
  """The files of `known` that one statement depends on.

  The module a statement names is a dependency, and so is a package whose namespace it reads (`from kc import X`
  runs kc/__init__.py and needs X defined there). The parent packages that Python initialises on the way are a
  dependency too, except the importer's own ancestors: those are the packages whose import is running this file."""
  importer = statement.importer
  named: list[str] = []
  if statement.names is None: named.append(statement.module)
  else:
    for name in statement.names:
      submodule = f"{statement.module}.{name}"
      named.append(submodule if submodule in known else statement.module)
  targets: set[str] = set()
  for module in named:
    if (target := _known_prefix(module, known)) is None: continue
    targets.add(target)
    parts = target.split(".")
    targets.update(p for p in (".".join(parts[:n]) for n in range(1, len(parts))) if not _is_ancestor(p, importer))
  return [Edge(t, statement) for t in sorted(targets) if t != importer]


def core_modules() -> dict[str, Path]:
  return {module_name(p, CORE): p for p in python_files(CORE / "kc")}


def core_edges() -> dict[str, list[Edge]]:
  modules = core_modules()
  known = set(modules)
  return {name: [e for s in read_imports(path, CORE) for e in edges_of(s, known)] for name, path in modules.items()}


# ------------------------------------------------------------------------------------------------------------ (a) cycles

# The one import circle the core keeps on purpose, as (importer, imported): why it cannot be broken. Allowed only as a
# function-level import (at module level it would be a real circle at import time).
ALLOWED_CYCLE_EDGES = {
  ("kc.ir.uop", "kc.ir.symbolic"): "UOp.simplify needs the symbolic rules, which are built from UOps; both are the ir "
                                   "layer, and a setter that symbolic calls at import would hide the dependency",
}


def _counts_for_cycles(edge: Edge) -> bool:
  """Every import counts, TYPE_CHECKING ones included (a circle a type checker needs is still two modules that need
  each other); an allowed edge is skipped where it is lazy."""
  return not ((edge.statement.importer, edge.target) in ALLOWED_CYCLE_EDGES and edge.statement.in_function)


def strongly_connected(graph: dict[str, list[str]]) -> list[list[str]]:
  """Every group of two or more modules that reach each other (Tarjan's algorithm, iterative so that a long import
  chain cannot hit Python's recursion limit)."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  stack: list[str] = []
  on_stack: set[str] = set()
  groups: list[list[str]] = []
  for root in sorted(graph):
    if root in index: continue
    work = [(root, iter(graph[root]))]
    index[root] = low[root] = len(index)
    stack.append(root); on_stack.add(root)
    while work:
      node, children = work[-1]
      child = next(children, None)
      if child is not None:
        if child not in index:
          index[child] = low[child] = len(index)
          stack.append(child); on_stack.add(child)
          work.append((child, iter(graph.get(child, []))))
        elif child in on_stack: low[node] = min(low[node], index[child])
        continue
      work.pop()
      if work: low[work[-1][0]] = min(low[work[-1][0]], low[node])
      if low[node] == index[node]:
        group = []
        while True:
          member = stack.pop(); on_stack.discard(member); group.append(member)
          if member == node: break
        if len(group) > 1: groups.append(sorted(group))
  return groups


def one_cycle(group: list[str], edges: dict[str, list[Edge]]) -> list[Edge]:
  """A shortest circle through the group's first module, as the edges that make it (breadth-first within the group)."""
  start, members = group[0], set(group)
  came_by: dict[str, Edge] = {}
  frontier = [start]
  while frontier:
    following = []
    for node in frontier:
      for edge in edges[node]:
        if edge.target not in members or not _counts_for_cycles(edge) or edge.target in came_by: continue
        came_by[edge.target] = edge
        if edge.target == start:
          path, at = [edge], edge.statement.importer
          while at != start: path.append(came_by[at]); at = came_by[at].statement.importer
          return path[::-1]
        following.append(edge.target)
    frontier = following
  raise AssertionError(f"no circle through {start} in {group}")


def describe_cycle(cycle: list[Edge]) -> str:
  return "\n".join(f"    {e.statement.importer} -> {e.target}   [{e.statement.where}]" for e in cycle)


def import_cycles(edges: dict[str, list[Edge]]) -> list[tuple[list[str], list[Edge]]]:
  graph = {m: sorted({e.target for e in es if _counts_for_cycles(e)}) for m, es in edges.items()}
  return [(group, one_cycle(group, edges)) for group in strongly_connected(graph)]


def test_no_import_cycles_in_the_core():
  cycles = import_cycles(core_edges())
  report = [f"  files {', '.join(str(core_modules()[m].relative_to(REPO)) for m in group)}; one circle:\n"
            f"{describe_cycle(cycle)}" for group, cycle in cycles]
  assert not cycles, f"{len(cycles)} import circle(s) between the core's files:\n" + "\n".join(report)


def test_each_allowed_cycle_edge_is_a_function_level_import_that_still_exists():
  """An allowed exception that is gone, or that moved to module level, must leave the list (or the code) at once."""
  edges = core_edges()
  for (importer, target), reason in ALLOWED_CYCLE_EDGES.items():
    found = [e for e in edges.get(importer, []) if e.target == target]
    assert found, f"{importer} no longer imports {target}: drop the allowed cycle edge ({reason})"
    eager = [e.statement.where for e in found if not e.statement.in_function]
    assert not eager, f"{importer} imports {target} at module level ({', '.join(eager)}); allowed only inside a function"


# ------------------------------------------------------------------------------------------------------------ (b) layers

# A file may import its own layer or a lower one. `kc.x.*` is the package kc.x and everything in it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
  # kc.config: every environment knob, declared and read in one place (it imports kc.errors only); kc.enums: enum
  # classes whose members read fast
  ("base", ("kc.helpers", "kc.errors", "kc.config", "kc.enums")),
  ("ir", ("kc.ir.*",)),
  # what the checkers share (isolated workers, the tolerance table): BEAM's check in the search layer uses it
  ("testing", ("kc.testing.*",)),
  ("shape", ("kc.shape.*",)),
  ("renderer", ("kc.renderer.*",)),
  # codegen is a function of an optimized kernel AST and a renderer; the Kernel drives it (linearize, to_program)
  ("codegen", ("kc.codegen.*",)),
  ("kernel", ("kc.kernel.*",)),
  # the scheduler: how a program over arrays becomes kernels (movement on UOp graphs, the split of a large reduce)
  ("schedule", ("kc.schedule.*",)),
  ("search", ("kc.search.*",)),
  ("runtime", ("kc.runtime.*",)),
  # the EMU device, a backend that lives in the core: it builds on the runtime (CompiledDevice, HostAllocator, the plugin
  # API) and nothing below imports it; kc.Device finds it through the kc.backends entry point
  ("emu", ("kc.emu.*",)),
  # importing the package kc itself runs kc/__init__.py, which imports everything: it is the top layer, with the api,
  # the front end (kc.ast, the builder: its promotion tables and example programs), the backend contract and the tools
  # (the kc command, kc fuzz, the new-backend template)
  ("top", ("kc", "kc.api", "kc.backend", "kc.ast.*", "kc.tools.*")),
]


def layer_of(module: str) -> int | None:
  for number, (_, patterns) in enumerate(LAYERS):
    for pattern in patterns:
      if pattern.endswith(".*") and (module == pattern[:-2] or module.startswith(pattern[:-1])): return number
      if module == pattern: return number
  return None


def _layer_label(number: int) -> str: return f"layer {number} {LAYERS[number][0]}"


def test_every_core_file_has_a_layer():
  unplaced = [f"{m} ({p.relative_to(REPO)})" for m, p in core_modules().items() if layer_of(m) is None]
  assert not unplaced, "core files in no layer (add them to LAYERS in tests/test_structure.py):\n  " + "\n  ".join(unplaced)


def layer_violations(edges: dict[str, list[Edge]]) -> list[str]:
  found = []
  for importer, importer_edges in sorted(edges.items()):
    low = layer_of(importer)
    for edge in importer_edges:
      high = layer_of(edge.target)
      if low is not None and high is not None and high > low:
        found.append(f"  {importer} ({_layer_label(low)}) imports {edge.target} ({_layer_label(high)})   "
                     f"[{edge.statement.where}]")
  return found


def test_no_layer_imports_a_higher_layer():
  violations = layer_violations(core_edges())
  order = " <- ".join(name for name, _ in LAYERS)
  assert not violations, f"{len(violations)} import(s) of a higher layer (layers: {order}):\n" + "\n".join(violations)


# ------------------------------------------------------------------------------------------------------- (c) plugins

def _normalize(distribution: str) -> str: return re.sub(r"[-_.]+", "-", distribution).lower()


def _requirement_name(requirement: str) -> str:
  return _normalize(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))


def declared_distributions(pyproject: Path) -> set[str]:
  """Every distribution a plugin's pyproject.toml depends on, its optional extras included."""
  project = tomllib.loads(pyproject.read_text())["project"]
  requirements = list(project.get("dependencies", []))
  for extra in project.get("optional-dependencies", {}).values(): requirements += extra
  return {_requirement_name(r) for r in requirements}


def import_names(distributions: set[str]) -> set[str]:
  """The top-level modules these distributions provide: from the installed metadata, else the usual spelling."""
  provided = {name for name, dists in packages_distributions().items() if any(_normalize(d) in distributions for d in dists)}
  # pyobjc names its framework wrappers pyobjc-framework-<Framework> (module <Framework>), and its core pyobjc-core
  # (module objc), installed or not
  pyobjc = {d[len("pyobjc-framework-"):] for d in distributions if d.startswith("pyobjc-framework-")}
  if "pyobjc-core" in distributions: pyobjc.add("objc")
  return provided | {d.replace("-", "_") for d in distributions} | pyobjc


def plugin_packages() -> list[Path]:
  return sorted(p for p in PLUGINS.glob("*/kc_*") if p.is_dir() and (p / "__init__.py").exists())


PLUGIN_API = ("kc", "kc.backend")
# an integration embeds kc as any framework would: through kc and the modules kc's own namespace exports
PUBLIC_API = ("kc", "kc.ast", "kc.config")
INTEGRATIONS = REPO / "integrations"


def integration_packages() -> list[Path]:
  return sorted(p for p in INTEGRATIONS.glob("*/kc_*") if p.is_dir() and (p / "__init__.py").exists())


def disallowed_plugin_imports(package: Path, core: set[str], public: tuple[str, ...] = PLUGIN_API) -> list[str]:
  """Imports of a plugin (or integration) package that reach past `public` or into an undeclared distribution."""
  own = package.name
  third_party = import_names(declared_distributions(package.parent / "pyproject.toml") - {"kc"})
  found = []
  for path in python_files(package):
    for s in read_imports(path, package.parent):
      top = s.module.split(".")[0]
      if top == own or (top != "kc" and (top in sys.stdlib_module_names or top in third_party or top.lower() in third_party)): continue
      if top == "kc":
        # `from kc import ir` imports the submodule kc.ir: judge the submodules it names, not just `kc`
        reached = [s.module] if s.names is None else \
                  [f"{s.module}.{n}" if f"{s.module}.{n}" in core else s.module for n in s.names]
        bad = sorted({m for m in reached if m not in public})
        if not bad: continue
        found.append(f"  {', '.join(bad)}: only {', '.join(public)} are public   [{s.where}]")
      else: found.append(f"  {s.module}: neither the standard library nor declared in {package.parent.name}/pyproject.toml"
                         f"   [{s.where}]")
  return found


def test_there_are_plugins_to_check(): assert plugin_packages(), f"no plugins/*/kc_* package under {PLUGINS}"


@pytest.mark.parametrize("package", plugin_packages(), ids=lambda p: p.name)
def test_plugin_imports_only_kc_kc_backend_and_its_dependencies(package):
  found = disallowed_plugin_imports(package, set(core_modules()))
  assert not found, f"{package.name} imports what it may not:\n" + "\n".join(found)


def test_there_are_integrations_to_check():
  assert integration_packages(), f"no integrations/*/kc_* package under {INTEGRATIONS}"


@pytest.mark.parametrize("package", integration_packages(), ids=lambda p: p.name)
def test_integration_imports_only_kcs_public_api_and_its_dependencies(package):
  found = disallowed_plugin_imports(package, set(core_modules()), PUBLIC_API)
  assert not found, f"{package.name} imports what it may not:\n" + "\n".join(found)


# ----------------------------------------------------------------------------------------------- (d) environment knobs

CONFIG_MODULE = CORE / "kc" / "config.py"
_READS_ENVIRONMENT = re.compile(r"\bos\.environ\b|\bgetenv\b|\bfrom os import [^\n]*\b(environ|getenv)\b")


def test_only_the_config_module_reads_the_environment():
  """Every knob of the core is declared and read in kc.config; nothing else in the core looks at os.environ."""
  found = [f"  {p.relative_to(REPO)}:{n}: {line.strip()}" for p in python_files(CORE / "kc") if p != CONFIG_MODULE
           for n, line in enumerate(p.read_text().splitlines(), 1) if _READS_ENVIRONMENT.search(line)]
  assert not found, "the environment is read outside kc/config.py (declare a knob there and read it with " \
                    "kc.config.read):\n" + "\n".join(found)


def _names_a_knob(node: ast.AST) -> bool:
  return isinstance(node, ast.Constant) and isinstance(node.value, str) and \
    (node.value.startswith("KC_") or node.value == "DEBUG")


def _is_environ(node: ast.AST) -> bool: return isinstance(node, ast.Attribute) and node.attr == "environ"


def environment_knob_reads(path: Path) -> list[str]:
  """Where a file reads a kc knob past kc's config: env_value/getenv calls, os.environ["KC_..."] and
  os.environ.get("KC_...") (passing the whole environment on, or reading CUDA_HOME, is not a knob read)."""
  found = []
  for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
    if isinstance(node, ast.Call):
      func = node.func
      name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
      on_environ = isinstance(func, ast.Attribute) and _is_environ(func.value)
      if name in ("env_value", "getenv") or (on_environ and node.args and _names_a_knob(node.args[0])):
        found.append(f"  {path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    elif isinstance(node, ast.Subscript) and _is_environ(node.value) and _names_a_knob(node.slice):
      found.append(f"  {path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
  return found


@pytest.mark.parametrize("package", plugin_packages(), ids=lambda p: p.name)
def test_plugins_read_their_knobs_through_kc_config(package):
  found = [line for path in python_files(package) for line in environment_knob_reads(path)]
  assert not found, f"{package.name} reads kc knobs past kc.config (declare them with kc.backend.knob):\n" + \
                    "\n".join(found)


_KNOB_READ = re.compile(r"""\b(?:read|knob_named|read_knob|debug_level)\(\s*(?:"([A-Z][A-Z0-9_]*)")?""")


def test_every_knob_read_by_name_is_declared():
  """A read("NAME") of a knob nobody declared would be a ConfigError the first time that line runs: find them now."""
  import importlib
  import kc.config
  for package in plugin_packages(): importlib.import_module(package.name)  # a plugin declares its knobs when imported
  declared = {k.name for k in kc.config.knobs()}
  files = python_files(CORE / "kc") + [p for pkg in plugin_packages() for p in python_files(pkg)]
  reads = [(path, m.group(1)) for path in files for m in _KNOB_READ.finditer(path.read_text()) if m.group(1)]
  assert len(reads) >= 10, f"the reads were not found ({len(reads)}): is the pattern out of date?"
  unknown = sorted({f"  {path.relative_to(REPO)}: {name}" for path, name in reads if name not in declared})
  assert not unknown, "knobs read by name that no module declares:\n" + "\n".join(unknown)


# ---------------------------------------------------------------------------------------------------- test modules

def pytest_module_name(path: Path) -> str:
  """The name pytest's default import mode gives a test file: its basename, under the packages (folders with an
  __init__.py) that hold it."""
  parts, folder = [path.stem], path.parent
  while (folder / "__init__.py").exists(): parts.insert(0, folder.name); folder = folder.parent
  return ".".join(parts)


def test_test_modules_under_the_testpaths_have_distinct_names():
  """Two test files that import under one name break the collection of the whole run (plugin tests sit in folders of
  their own, all collected together from the repository root)."""
  testpaths = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"]
  files = [p for t in testpaths for p in sorted((REPO / t).rglob("*.py")) if re.fullmatch(r"test_.*|.*_test", p.stem)]
  by_name: dict[str, list[str]] = {}
  for path in files: by_name.setdefault(pytest_module_name(path), []).append(str(path.relative_to(REPO)))
  clashes = {name: paths for name, paths in by_name.items() if len(paths) > 1}
  assert not clashes, f"test modules that import under one name (rename one): {clashes}"


# ---------------------------------------------------------------------------------------------- the reader, on its own

def _write(root: Path, files: dict[str, str]) -> None:
  for name, text in files.items():
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)


def test_reader_resolves_relative_imports_and_marks_lazy_ones(tmp_path):
  _write(tmp_path, {"pkg/__init__.py": "from . import sub\n", "pkg/sub/__init__.py": "",
                    "pkg/sub/mod.py": "from ..b import c\nfrom typing import TYPE_CHECKING\n"
                                      "if TYPE_CHECKING: from .other import T\n"
                                      "def f():\n  import pkg.late\n"})
  init = read_imports(tmp_path / "pkg/__init__.py", tmp_path)
  assert [(s.module, s.names) for s in init] == [("pkg", ("sub",))]
  mod = read_imports(tmp_path / "pkg/sub/mod.py", tmp_path)
  assert [(s.module, s.in_function, s.type_checking) for s in mod] == \
         [("pkg.b", False, False), ("typing", False, False), ("pkg.sub.other", False, True), ("pkg.late", True, False)]


def test_edges_name_submodules_and_read_packages_but_not_own_ancestors():
  known = {"kc", "kc.ir", "kc.ir.uop", "kc.ir.dtype", "kc.shape", "kc.shape.view"}
  def targets(importer, module, names): return [e.target for e in edges_of(ImportStatement(importer, REPO, 1, module,
                                                                                           names, False, False), known)]
  assert targets("kc.ir.uop", "kc.ir", ("dtype",)) == ["kc.ir.dtype"]           # a sibling: not the own package
  assert targets("kc.ir.uop", "kc", ("dtypes",)) == ["kc"]                      # reads kc/__init__: the top layer
  assert targets("kc.shape.view", "kc.ir.uop", ("UOp",)) == ["kc.ir", "kc.ir.uop"]  # kc.ir's __init__ runs first


def test_cycle_finder_reports_each_circle_type_checking_edges_included():
  def stmt(importer, line, type_checking=False): return ImportStatement(importer, REPO / "x.py", line, "", None, False, type_checking)
  edges = {"a": [Edge("b", stmt("a", 1))], "b": [Edge("c", stmt("b", 2))], "c": [Edge("a", stmt("c", 3))],
           "d": [Edge("e", stmt("d", 4))], "e": [Edge("d", stmt("e", 5, type_checking=True))], "f": [Edge("a", stmt("f", 6))]}
  (group, cycle), (group2, cycle2) = sorted(import_cycles(edges))
  assert group == ["a", "b", "c"] and [(e.statement.importer, e.target) for e in cycle] == [("a", "b"), ("b", "c"), ("c", "a")]
  assert group2 == ["d", "e"] and [(e.statement.importer, e.target) for e in cycle2] == [("d", "e"), ("e", "d")]
