"""The Program cache: rendered Programs on disk, so that compiling a kernel an earlier process compiled renders nothing.

Rendering (lowering, the rewrites, linearizing, the renderer) is most of a compile once the binary is in the compile
cache: 40 ms and more for a searched matmul, and every process paid it again for every kernel. The Programs are kept
in the compile cache itself (kc.runtime.cache, its one sqlite file), as pickles under keys "program:<sha256>" that
never meet a binary's key.

The key must change whenever the rendered Program could differ, and be the same in every process that would render
the same one, so it is a sha256 of text that does not depend on the process (UOps hash by identity, strings by a
per-process seed, object reprs name addresses):
- the kernel's AST, node by node in toposort order (op, dtype, arg, the positions of its sources);
- the Kernel's whole optimization state (kc.kernel.KernelState: its trackers, applied opts, tensor core and
  tensor-core level) and the function name it renders under;
- the renderer: its class, device, render_env(), its instance attributes and its class's plain-data attributes;
- a digest of the code that renders (every .py file of kc and of the renderer class's top-level package, read once a
  process), kc's version and Python's.
A value without a canonical text (a repr naming an address, a lambda) in the AST or the renderer's instance
attributes means the kernel is not cached on disk: rendering it is slower, never wrong. A renderer's class attributes
that are code (methods, tables of lambdas) are covered by the code digest instead.

An entry that does not unpickle to the expected Program (its name and device) is a miss, replaced by the fresh render.
With KC_CACHE_DIR empty there is no disk cache and every Program is rendered."""
from __future__ import annotations
import dataclasses, enum, functools, hashlib, os, pickle, sys, threading, types
from typing import Any, Optional
from kc.config import debug_level
from kc.codegen.naming import to_function_name
from kc.helpers import distribution_version
from kc.ir.dtype import DType
from kc.ir.uop import UOp
from kc.kernel import Kernel
from kc.renderer import Program, Renderer
from kc.runtime.cache import compile_cache_dir, lookup, store

KEY_PREFIX = "program:"  # binaries are keyed by bare sha256 digests: a Program's key can never be one


class NotCanonical(Exception):
  """A value whose text would differ between processes (or say too little): the kernel is not cached on disk."""


_PLAIN = (type(None), bool, int, float, str, bytes)


def canonical(value: Any) -> str:
  """A text of `value` that is equal in every process for equal values and names its type, so 1, 1.0 and True
  differ. Containers are written element by element (sets sorted, as their order follows per-process hashes);
  dataclasses field by field; UOps as their op, dtype, arg and sources; enums, classes and named functions by their
  qualified names (their code is in the code digest). Raises NotCanonical for anything else whose repr names an
  address, and for lambdas and nested functions (a name that does not say which one)."""
  if isinstance(value, _PLAIN): return f"{type(value).__name__}:{value!r}"
  if isinstance(value, enum.Enum): return f"{_qualified(type(value))}.{value.name}"
  if isinstance(value, DType): return f"DType:{value!r}"
  if isinstance(value, (tuple, list)): return f"{type(value).__name__}(" + ",".join(canonical(v) for v in value) + ")"
  if isinstance(value, (set, frozenset)): return f"{type(value).__name__}{{" + ",".join(sorted(canonical(v) for v in value)) + "}"
  if isinstance(value, dict):
    return "dict{" + ",".join(sorted(f"{canonical(k)}:{canonical(v)}" for k, v in value.items())) + "}"
  if isinstance(value, UOp):
    return f"UOp({value.op.name},{canonical(value.dtype)},{canonical(value.arg)},{canonical(value.src)})"
  if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)): return _qualified(value)
  if dataclasses.is_dataclass(value):
    return _qualified(type(value)) + "(" + ",".join(f"{f.name}={canonical(getattr(value, f.name))}" for f in dataclasses.fields(value)) + ")"
  text = repr(value)
  if " at 0x" in text: raise NotCanonical(f"{type(value).__name__}: {text[:80]}")
  return f"{_qualified(type(value))}:{text}"


def _qualified(obj: Any) -> str:
  name = f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', '?')}"
  if "<" in name: raise NotCanonical(f"{name} does not say which object it is")
  return name


# --------------------------------------------------------------------------------------------------------- the key

def ast_text(sink: UOp) -> str:
  """The AST node by node in toposort order (a deterministic walk: each node's sources in order), each as its op,
  dtype, arg and the positions of its sources, so a shared subexpression is written once."""
  nodes = list(sink.toposort)
  position = {u: i for i, u in enumerate(nodes)}
  return "\n".join(f"{u.op.name}|{canonical(u.dtype)}|{canonical(u.arg)}|{[position[s] for s in u.src]}" for u in nodes)


def kernel_state_text(k: Kernel) -> str:
  """Every field of the Kernel's optimization state (what get_optimized_ast folds into the AST), UOps in it named by
  their position in the AST, the tensor-core use it renders with and the function name it renders under."""
  position = {u: i for i, u in enumerate(k.ast.toposort)}
  def text(value: Any) -> str:
    if isinstance(value, dict):
      return "dict{" + ",".join(sorted(f"{text(key)}:{text(v)}" for key, v in value.items())) + "}"
    if isinstance(value, UOp) and value in position: return f"node{position[value]}"
    return canonical(value)
  fields = [f"{f.name}={text(getattr(k.state, f.name))}" for f in dataclasses.fields(k.state)]
  return "\n".join(fields + [f"use_tensor_cores={k.use_tensor_cores!r}", f"name={to_function_name(k.name)!r}"])


def renderer_text(renderer: Renderer) -> str:
  """The renderer's class, device and render_env(), its instance attributes (an attribute that holds one of its
  classes' attributes is named as that one) and the plain-data attributes of its classes (the limits, vector widths
  and tensor cores a test or a plugin may set at run time). A per-render scratch space (threading.local) is no
  setting and is left out."""
  cls = type(renderer)
  lines = [f"class={_qualified(cls)}", f"device={renderer.device!r}", f"render_env={canonical(renderer.render_env())}"]
  class_attrs: dict[str, Any] = {}
  for klass in reversed(cls.__mro__[:-1]):  # the most derived class's attribute wins, as attribute lookup does
    class_attrs.update((name, value) for name, value in vars(klass).items() if not name.startswith("__"))
  for name, value in sorted(vars(renderer).items()):
    if isinstance(value, threading.local): continue
    owner = next((f"{_qualified(klass)}.{attr}" for klass in cls.__mro__ for attr, v in vars(klass).items() if v is value
                  and not isinstance(value, _PLAIN)), None)
    lines.append(f"self.{name}={owner if owner is not None else canonical(value)}")
  for name, value in sorted(class_attrs.items()):
    try: lines.append(f"class.{name}={canonical(value)}")
    except NotCanonical: pass  # code (a method, a table of lambdas): the code digest covers it
  return "\n".join(lines)


_KC_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # core/kc
_DIGESTS: dict[str, str] = {}
_DIGESTS_LOCK = threading.Lock()


def code_digest(renderer: Renderer) -> Optional[str]:
  """A sha256 of the source of kc and of the renderer class's top-level package (each read once a process), or None
  when the renderer's code is not in a file (a class made in `python -c`): then nothing is cached."""
  top = sys.modules.get(type(renderer).__module__.split(".")[0])
  roots: list[str] = [_KC_ROOT]
  if top is not None and getattr(top, "__path__", None): roots += list(top.__path__)
  elif top is not None and (file := getattr(top, "__file__", None)): roots.append(file)
  else: return None
  folders = dict.fromkeys(os.path.abspath(r) for r in roots)  # kc's own renderers: kc once
  return hashlib.sha256("".join(_source_digest(r) for r in folders).encode()).hexdigest()


def _source_digest(root: str) -> str:
  """The sha256 of every .py file under the folder `root` (or of the file `root`): names and contents, in sorted order."""
  with _DIGESTS_LOCK:
    if (hit := _DIGESTS.get(root)) is not None: return hit
  files = [root] if os.path.isfile(root) else \
    sorted(os.path.join(d, f) for d, _, names in os.walk(root) for f in names if f.endswith(".py"))
  h = hashlib.sha256()
  for path in files:
    with open(path, "rb") as fh: data = fh.read()
    h.update(f"{os.path.relpath(path, root)}\0{len(data)}\0".encode() + data)
  with _DIGESTS_LOCK: return _DIGESTS.setdefault(root, h.hexdigest())


@functools.lru_cache(maxsize=None)
def _versions() -> str:
  """kc's version, Python's and pickle's protocol (read once a process: the metadata lookup takes milliseconds)."""
  return f"kc {distribution_version('kc-core')} python {sys.version_info[:2]} pickle {pickle.HIGHEST_PROTOCOL}"


def program_key(k: Kernel) -> Optional[str]:
  """The cache key of the Program `k.to_program()` renders, or None when some part of it has no canonical text."""
  digest = code_digest(k.renderer)
  if digest is None: return None
  try:
    text = "\n\n".join((_versions(),
                        f"code {digest}", renderer_text(k.renderer), kernel_state_text(k), ast_text(k.ast)))
  except NotCanonical: return None
  return KEY_PREFIX + hashlib.sha256(text.encode()).hexdigest()


# --------------------------------------------------------------------------------------------------------- the cache

def load(key: str, name: str, device: str) -> Optional[Program]:
  """The Program stored under `key` when there is one that unpickles to a Program of this name and device."""
  if (blob := lookup(key)) is None: return None
  try: prg = pickle.loads(blob)
  except Exception: return None  # a damaged or foreign entry (any error unpickling it): the caller renders anew
  return prg if isinstance(prg, Program) and prg.name == name and prg.device == device else None


def cached_program(k: Kernel) -> Program:
  """`k.to_program()`, from the disk cache when an earlier process rendered it; rendered and stored otherwise. With
  the cache off, a kernel without a canonical key, or DEBUG >= 4 (which prints what rendering makes), it renders."""
  if compile_cache_dir() is None or debug_level() >= 4 or (key := program_key(k)) is None: return k.to_program()
  if (prg := load(key, to_function_name(k.name), k.renderer.device)) is not None: return prg
  prg = k.to_program()
  store(key, pickle.dumps(prg, protocol=pickle.HIGHEST_PROTOCOL))
  return prg


__all__ = ["KEY_PREFIX", "NotCanonical", "cached_program", "canonical", "code_digest", "program_key"]
