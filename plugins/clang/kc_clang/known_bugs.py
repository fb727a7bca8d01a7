"""The record of C compiler bugs known to miscompile kc's kernels: which compiler, which versions and which x86-64
levels show each one, the flag that avoids it, and a kernel that reproduces it.

The compiler (compiler.compile_flags) adds an entry's flag only where the compiler it runs (family and major version,
read from `cc --version`) and the level of the code it builds (an x86-64 psABI level: KC_CLANG_ISA's, the host's for
-march=native, x86-64 for portable code) match the entry, so clang and the levels a bug does not reach build exactly
as before. `kc doctor` runs every entry's reproducer and the CANARIES through CLANG's normal compile path and compares
them with numpy (doctor.py), so a compiler outside an entry's range that has the bug all the same is caught there.

Everything here is plain data (no kc, no numpy): doctor.build turns a KernelSpec into a kernel and its numpy answer."""
from __future__ import annotations
from dataclasses import dataclass
from typing import Optional, Union

# the levels from x86-64-v2 up: SSE4.1's byte instructions, which gcc's SLP vectorizer reaches for
FROM_V2 = frozenset({"x86-64-v2", "x86-64-v3", "x86-64-v4"})
# the levels with masked vector loads (AVX's vpmaskmov, AVX-512's mask registers)
FROM_V3 = frozenset({"x86-64-v3", "x86-64-v4"})


@dataclass(frozen=True)
class KernelSpec:
  """One kernel in plain data. Input 1 has `dtype` (a numpy name) and `shape`, and holds `values`: ("integers", low,
  high) draws integers in [low, high) with numpy's generator seeded 0, ("normal",) standard normal numbers, anything
  else is the values themselves (repeated to fill the shape). `expr` is an expression in `x` (and `np`) that means
  the same for a numpy array as for a kc.ast expression (kc.ast is numpy's meaning): evaluated on the array it is
  the answer, on kc.ast.arg(1, ...) it is the kernel. `opts`: "hand", "none", or (OptOps name, axis, amount) steps."""
  dtype: str
  shape: tuple[int, ...]
  values: tuple
  expr: str
  opts: Union[str, tuple[tuple[str, int, int], ...]] = "hand"

  def describe(self) -> str:
    opts = self.opts if isinstance(self.opts, str) else ", ".join(f"{op} {axis} {amt}" for op, axis, amt in self.opts)
    return f"x = {self.dtype}{list(self.shape)}, {self.expr}, opts {opts}"


@dataclass(frozen=True)
class KnownBug:
  """A compiler bug that gives kc's kernels wrong results, and the flag that avoids it."""
  name: str                        # short, unique: what doctor and the tests call it
  family: str                      # "gcc" or "clang", as compiler.CompilerId.family says
  versions: tuple[int, int]        # the first and last major version known to have it, inclusive
  levels: frozenset[str]           # the x86-64 psABI levels of code it shows in (host.PSABI_LEVELS' names)
  flag: str                        # the compiler flag that avoids it
  reason: str                      # what goes wrong, in a sentence
  reproducer: KernelSpec           # a kernel it miscompiles (at the levels above, without the flag)

  def matches(self, family: Optional[str], major: Optional[int], level: Optional[str]) -> bool:
    """Whether code for psABI level `level` built by compiler `family` `major` needs this entry's flag."""
    in_range = major is not None and self.versions[0] <= major <= self.versions[1]
    return family == self.family and in_range and level in self.levels


KNOWN_BUGS: tuple[KnownBug, ...] = (
  KnownBug(
    name="gcc12-masked-load-mask-width",
    family="gcc", versions=(12, 12), levels=FROM_V3, flag="-fno-tree-loop-if-convert",
    reason="loop if-conversion turns the guarded loads `c?(*(p+i)):0` of a padded (PADTO) loop into masked vector "
           "loads and gives two 64-bit loads one mask made for the 32-bit lanes of the condition (AVX2 vpmaskmovq, "
           "AVX-512 k-registers), so the second load reads lanes it must skip and skips lanes it must read",
    reproducer=KernelSpec("int64", (5000,), ("integers", 2**40, 2**41), "x.sum(axis=0)",
                          (("UNROLL", 0, 8), ("PADTO", 0, 4)))),
  KnownBug(
    name="gcc12-slp-bool-byte-mask",
    family="gcc", versions=(12, 12), levels=FROM_V2, flag="-fno-tree-slp-vectorize",
    reason="the SLP vectorizer computes `(unsigned char)(v != 0)` as a vector compare and keeps its all-ones lanes "
           "(0xFF) where C gives 1, so any() or all() of int8 or uint8 elements gives 255 or 254 (which counts, from 5 "
           "to 32, depends on how the max is written: 8, 16 and 32 with b<a?a:b)",
    reproducer=KernelSpec("int8", (8,), (0, 0, 0, 0, 1, 0, 0, 0), "x.any().astype(np.int64)")),
)

# kernels that any working compiler gets right, run by the self-test next to the reproducers: vector float
# arithmetic and reduces, narrow integers that wrap, half rounding (what gcc's -mno-avx512fp16 guards) and the
# guarded loads of a padded loop. Inputs are small integers where the answer must be exact in float
CANARIES: tuple[KernelSpec, ...] = (
  KernelSpec("float32", (48, 40), ("integers", -4, 5), "x @ x.T"),
  KernelSpec("float32", (64, 33), ("integers", -8, 9), "(x - x.max(axis=1, keepdims=True)).sum(axis=1)"),
  KernelSpec("int8", (1000,), ("integers", -128, 128), "x * x + x"),
  KernelSpec("uint16", (999,), ("integers", 0, 2**16), "x.min() + x.max()"),
  KernelSpec("float32", (4096,), ("normal",), "x.astype(np.float16).astype(np.float64)"),
  KernelSpec("int32", (1000,), ("integers", -2**31, 2**31), "x.sum(axis=0)", (("UNROLL", 0, 4), ("PADTO", 0, 8))),
)


def workaround_flags(family: Optional[str], major: Optional[int], level: Optional[str]) -> list[str]:
  """The flags of every entry of KNOWN_BUGS that matches the compiler and the level (KnownBug.matches), each once."""
  return list(dict.fromkeys(bug.flag for bug in KNOWN_BUGS if bug.matches(family, major, level)))
