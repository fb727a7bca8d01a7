"""Several C-family kernel sources as one translation unit, for a backend whose compiler builds many kernels in one run
(kc-clang's cc, kc-opencl's clBuildProgram): each source's file-scope names renamed apart, so that two kernels of the
same name, or two copies of the same static helper, never meet.

A source's file-scope definitions (`static inline T name(`, `void name(`, `__kernel void name(`, `const int name =`)
are renamed by a #define before it and an #undef after (kcb<index>_<name>): the renames reach every use inside the
source and none outside it. Its preprocessor lines that the backend lets the batch hoist (#include, OpenCL's
`#pragma OPENCL EXTENSION`) are written once, before every member: they change what a unit may use, not what a
kernel that builds without them means. Any other preprocessor line could reach the members after it, so such a
source cannot join a batch (CompileError: the caller builds the sources one by one)."""
from __future__ import annotations
import re
from dataclasses import dataclass
from typing import Sequence
from kc.errors import CompileError

# a file-scope definition in kc's C-family sources: an optional `__attribute__((...))` (OpenCL's noinline helpers),
# an optional `static`, then words (types, qualifiers, `__kernel`) and stars, then the defined name before `(` or `=`
_ATTRIBUTE = r"__attribute__\(\([^()]*(?:\([^()]*\))?[^()]*\)\)\s*"
_DEFINITION = re.compile(rf"^(?:{_ATTRIBUTE})?(?P<static>static\s)?[A-Za-z_][\w\s*]*?(?<![\w])(?P<name>[A-Za-z_]\w*)\s*[(=]")


@dataclass(frozen=True)
class BatchMember:
  """One source of a batch: the preprocessor lines the batch writes first, the rest of its text wrapped in its
  renames, and its global (not static) names with their names in the batch."""
  hoisted: tuple[str, ...]
  text: str
  exported: dict[str, str]


def batch_member(index: int, src: str, hoist: Sequence[str] = ("#include",)) -> BatchMember:
  """Source `index` of a batch, its file-scope names prefixed by kcb<index>_. `hoist`: the starts of the preprocessor
  lines the batch may write once for all members. Raises CompileError for any other preprocessor line, and for a
  source that defines no global name (nothing of it could be called)."""
  renamed: dict[str, str] = {}
  exported: dict[str, str] = {}
  hoisted, body = [], []
  for line in src.splitlines():
    if line.startswith("#"):
      if not line.startswith(tuple(hoist)): raise CompileError(f"a batched kernel cannot have its own preprocessor line {line!r}", src=src)
      hoisted.append(line)
      continue
    body.append(line)
    if line.startswith(("typedef", " ", "\t", "}", "/")) or (m := _DEFINITION.match(line)) is None: continue
    name = m["name"]
    renamed[name] = f"kcb{index}_{name}"
    if not m["static"]: exported[name] = renamed[name]
  if not exported: raise CompileError("a batched kernel defines no global function", src=src)
  defines = "".join(f"#define {name} {new}\n" for name, new in renamed.items())
  undefs = "".join(f"#undef {name}\n" for name in renamed)
  return BatchMember(tuple(hoisted), defines + "\n".join(body) + "\n" + undefs, exported)


def batch_source(members: Sequence[BatchMember]) -> str:
  """The batch's one translation unit: every hoisted line once, in first-seen order, then each member."""
  return "\n".join([*dict.fromkeys(line for m in members for line in m.hoisted), *(m.text for m in members)]) + "\n"


__all__ = ["BatchMember", "batch_member", "batch_source"]
