"""The record of known compiler bugs (kc_clang.known_bugs): which flags a compiler gets where (pure functions over
fake --version output), that the kernels of both gcc 12 miscompiles come out right on CLANG at every level this host
runs with every compiler it has, and that CLANG's self-test catches a compiler that gets them wrong."""
import platform, shutil, stat
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
import kc
from kc import Buffer, Opt, OptOps, dtypes
from kc import ast as A
from kc.api import optimize
from kc.backend import PLUGIN_API_VERSION, BackendSpec, CompiledDevice, HostAllocator, register, unregister
from kc_clang import known_bugs
from kc_clang.compiler import ClangCompiler, compile_flags, compiler_id, parse_version_output
from kc_clang.doctor import self_test
from kc_clang.host import ISA_LEVELS, HostCPU, isa_level, psabi_level
from kc_clang.known_bugs import KNOWN_BUGS, workaround_flags
from kc_clang.renderer import ClangRenderer
from kc_clang.runtime import ClangProgram

X86 = platform.machine().lower() in ("x86_64", "amd64")
V3, V4 = (tuple(sorted(alts[0] for alts in ISA_LEVELS[name].needs)) for name in ("avx2", "avx512f"))  # the features
IF_CONVERT, SLP = "-fno-tree-loop-if-convert", "-fno-tree-slp-vectorize"
GCC12 = "gcc (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright (C) 2022 Free Software Foundation, Inc.\n"
CLANG14 = "Debian clang version 14.0.6\nTarget: x86_64-pc-linux-gnu\nThread model: posix\n"


# ------------------------------------------------------------------------------------------ which compiler, which flags

@pytest.mark.parametrize("text, family, major", [
  (GCC12, "gcc", 12),
  ("cc (GCC) 11.4.1 20231218 (Red Hat 11.4.1-3)\nCopyright (C) 2021 Free Software Foundation, Inc.", "gcc", 11),
  ("x86_64-linux-gnu-gcc-13 (Ubuntu 13.2.0-23ubuntu4) 13.2.0\n", "gcc", 13),
  ("gcc-12 (Homebrew GCC 12.3.0) 12.3.0\n", "gcc", 12),
  (CLANG14, "clang", 14),
  ("Apple clang version 15.0.0 (clang-1500.3.9.4)\nTarget: arm64-apple-darwin23.4.0\n", "clang", 15),
  ("Intel(R) oneAPI DPC++/C++ Compiler 2024.0.0 (2024.0.0.20231017)\n", None, None),
  ("tcc version 0.9.27 (x86_64 Linux)\n", None, None),
])
def test_the_compiler_and_its_major_version_from_version_output(text, family, major):
  found = parse_version_output(text)
  assert (found.family, found.major) == (family, major) and found.line == text.splitlines()[0]


def _expected_flags(family, major, level):
  """The rule, spelled out per entry: gcc 12's if-conversion bug from x86-64-v3 up, its SLP bug from x86-64-v2 up."""
  gcc12 = family == "gcc" and major == 12
  return [f for f, levels in ((IF_CONVERT, ("x86-64-v3", "x86-64-v4")), (SLP, ("x86-64-v2", "x86-64-v3", "x86-64-v4")))
          if gcc12 and level in levels]


@given(family=st.sampled_from(["gcc", "clang", None]), major=st.one_of(st.none(), st.integers(4, 20)),
       level=st.sampled_from(["x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4", None]))
def test_workaround_flags_exactly_where_an_entry_matches(family, major, level):
  assert workaround_flags(family, major, level) == _expected_flags(family, major, level)


def _fake_compiler(tmp_path, name: str, version_output: str) -> str:
  """A compiler command that prints `version_output` for --version and accepts everything else (no real compile)."""
  path = tmp_path / name
  path.write_text("#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = --version ] && "
                  f"{{ printf '%s' '{version_output}'; exit 0; }}; done\nexit 0\n")
  path.chmod(path.stat().st_mode | stat.S_IXUSR)
  return str(path)


@pytest.mark.skipif(not X86, reason="the entries are for x86-64 levels")
@pytest.mark.parametrize("version_output, isa, expected", [
  (GCC12, "avx512f", [IF_CONVERT, SLP]), (GCC12, "avx2", [IF_CONVERT, SLP]), (GCC12, "sse2", []),
  (CLANG14, "avx512f", []), (CLANG14, "avx2", []), (CLANG14, "sse2", []),
  (GCC12.replace("12.2.0", "13.2.0"), "avx2", []), (GCC12.replace("12.2.0", "11.4.0"), "avx2", []),
])
def test_compile_flags_add_the_workarounds_of_matching_entries(tmp_path, monkeypatch, version_output, isa, expected):
  cmd = [_fake_compiler(tmp_path, "cc", version_output)]
  # the level is checked against the host only to run its code here: a host with every extension builds for any level
  monkeypatch.setattr("kc_clang.host.host_cpu", lambda: HostCPU("x86_64", "Any", V4))
  flags = compile_flags(cmd=cmd, isa=isa)
  base = ["-shared", "-fPIC", "-O2", "-fwrapv", "-ffp-contract=off"]
  assert flags == [*base, f"-march={ISA_LEVELS[isa].march}", *expected]
  assert ClangCompiler(cmd=cmd).flags[-len(expected):] == expected if expected else True


@pytest.mark.skipif(not X86, reason="the entries are for x86-64 levels")
@pytest.mark.parametrize("features, level", [
  ((), "x86-64"), (("cx16", "popcnt", "sse4_1", "sse4_2", "ssse3"), "x86-64-v2"),
  (V3, "x86-64-v3"), (V4, "x86-64-v4")])
def test_native_code_is_at_the_hosts_level(tmp_path, monkeypatch, features, level):
  """-march=native code gets the workarounds of the host's psABI level: gcc 12 on a CPU without SSE4.1 needs none."""
  cpu = HostCPU("x86_64", "Some CPU", tuple(sorted(features)))
  assert psabi_level(cpu) == level
  monkeypatch.setattr("kc_clang.host.host_cpu", lambda: cpu)
  flags = compile_flags(cmd=[_fake_compiler(tmp_path, "cc", GCC12)], native=True)
  assert flags[flags.index("-march=native") + 1:] == _expected_flags("gcc", 12, level)
  assert psabi_level(HostCPU("aarch64", "Neoverse", ("asimd",))) is None


@pytest.mark.skipif(not X86, reason="the entries are for x86-64 levels")
def test_the_workaround_flags_are_part_of_the_cache_identity(tmp_path, monkeypatch):
  gcc12, gcc13 = (_fake_compiler(tmp_path, f"cc{v}", GCC12.replace("12.2.0", f"{v}.2.0")) for v in (12, 13))
  monkeypatch.setattr("kc_clang.host.host_cpu", lambda: HostCPU("x86_64", "Any", V3))
  monkeypatch.setenv("KC_CLANG_ISA", "avx2")
  assert IF_CONVERT in ClangCompiler(cmd=[gcc12]).identity() and IF_CONVERT not in ClangCompiler(cmd=[gcc13]).identity()
  # the same compiler and source without the flags (an older kc-clang's binary) is another cache entry
  with_flags = ClangCompiler(cmd=[gcc12])
  without = ClangCompiler(cmd=[gcc12], flags=[f for f in with_flags.flags if f not in (IF_CONVERT, SLP)])
  assert with_flags.cache_key("void f(void) {}") != without.cache_key("void f(void) {}")


def test_every_entry_is_complete():
  assert len({bug.name for bug in KNOWN_BUGS}) == len(KNOWN_BUGS)
  for bug in KNOWN_BUGS:
    assert bug.family in ("gcc", "clang") and bug.versions[0] <= bug.versions[1] and bug.flag.startswith("-")
    assert bug.levels and bug.levels <= {"x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"} and bug.reason.strip()


# ----------------------------------------------------------------------- the miscompiled kernels, every level, every cc

def _targets() -> list[str]:
  """native, and each KC_CLANG_ISA level this host runs (x86-64 only)."""
  levels = []
  for name in ISA_LEVELS if X86 else ():
    try: isa_level(name)
    except kc.ConfigError: continue
    levels.append(name)
  return ["native", *levels]


CASES = [(cc, target) for cc in ("gcc", "clang") for target in _targets()]


def _run(expr, x: np.ndarray, opts, cc: str, target: str) -> np.ndarray:
  """numpy's answer check: the kernel of `expr` built by compiler `cc` for `target` (native or a KC_CLANG_ISA level)
  with the flags CLANG gives that compiler there, run on input `x`; returns its output."""
  if shutil.which(cc) is None: pytest.skip(f"{cc} is not installed")
  renderer = ClangRenderer(native=True) if target == "native" else ClangRenderer(isa=target)
  flags = compile_flags(cmd=[cc], native=True) if target == "native" else compile_flags(cmd=[cc], isa=target)
  prg = optimize(kc.Kernel(A.sink(A.store(0, expr)), renderer), opts).to_program()
  fn = kc.Device["CLANG"].runtime(prg.name, ClangCompiler(cmd=[cc], flags=flags).compile(prg.src))
  out = Buffer("CLANG", max(1, int(np.prod(expr.shape))), expr.dtype).allocate()
  fn(out, Buffer("CLANG", x.size, dtypes.from_numpy(x.dtype)).copyin(x))
  return out.numpy().reshape(expr.shape)


def _values(dtype: np.dtype, n: int, seed: int) -> np.ndarray:
  """Values that fill `dtype`'s range; floats are whole numbers below 2^10, so that a sum of up to 2^14 of them is
  exact in float32 whatever the order of the additions."""
  rng = np.random.default_rng(seed)
  if dtype == np.bool_: return rng.integers(0, 2, n).astype(bool)
  if dtype.kind == "f": return rng.integers(-2**10, 2**10, n).astype(dtype)
  info = np.iinfo(dtype)
  return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)


# guarded loads of a padded reduce loop (gcc12-masked-load-mask-width): the loop unrolled u times and padded to a
# multiple of p, so its last iterations load nothing. gcc 12 got 32- and 64-bit integer sums wrong (every unroll of 2
# to 16, PADTO 4 and 8; int64 from x86-64-v3 with unroll 16, from znver tuning under -march=native with any); 8- and
# 16-bit and float sums came out right, as did x86-64-v2 and x86-64 code and clang 14
PADDED_SUMS = [("int64", 8, 4), ("int32", 2, 4), ("uint32", 4, 8), ("int64", 16, 8), ("uint64", 16, 4), ("int16", 8, 4)]


def _padded_sum(dtype: str, unroll: int, padto: int, iterations: int, case) -> tuple:
  x = _values(np.dtype(dtype), unroll * iterations, seed=iterations)
  expr = A.arg(1, dtypes.from_numpy(x.dtype), x.shape).sum(axis=0)
  got = _run(expr, x, [Opt(OptOps.UNROLL, 0, unroll), Opt(OptOps.PADTO, 0, padto)], *case)
  return got, x.sum(axis=0, dtype=got.dtype)


@pytest.mark.parametrize("cc, target", CASES)
def test_padded_sums_are_right_everywhere(cc, target, cache_dir):
  for dtype, unroll, padto in PADDED_SUMS:
    got, want = _padded_sum(dtype, unroll, padto, 625, (cc, target))  # 625 iterations: PADTO 4 and 8 both pad
    assert got == want, (dtype, unroll, padto, cc, target)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dtype=st.sampled_from(["int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float32", "float64"]),
       unroll=st.sampled_from([2, 4, 8, 16]), padto=st.sampled_from([4, 8]), padded=st.integers(1, 3),
       case=st.sampled_from(CASES))
def test_padded_sums_property(dtype, unroll, padto, padded, case, cache_dir):
  """Any padded unrolled sum, by any compiler for any target here: the loop leaves `padded` iterations to padding."""
  got, want = _padded_sum(dtype, unroll, padto, padto * 20 + padto - padded, case)
  assert got == want, (dtype, unroll, padto, padded, case)


# truth reduces (gcc12-slp-bool-byte-mask), cast to an int: gcc 12 gave 255 for any() and all() of 5 to 32 int8 or
# uint8 elements (but 12 and 20) from x86-64-v2 up, cast to any integer; max/min, bool and wider ints came out right
TRUTH_REDUCES = [("int8", "any", 9, "int64"), ("uint8", "any", 13, "int64"), ("int8", "all", 5, "int32"),
                 ("uint8", "all", 32, "uint8"), ("int8", "any", 24, "int64"), ("bool", "any", 9, "int64"),
                 ("int16", "max", 9, "int64"), ("uint8", "min", 12, "int32")]


def _truth_reduce(dtype: str, red: str, n: int, cast: str, flipped: int, case) -> tuple:
  """`red` of n elements that are all 0 (any, max) or all 1 (all, min) but the one at `flipped`, cast to `cast`."""
  x = np.zeros(n, dtype) if red in ("any", "max") else np.ones(n, dtype)
  x[flipped % n] = not x[flipped % n]
  expr = getattr(A.arg(1, dtypes.from_numpy(x.dtype), x.shape), red)().cast(dtypes.from_numpy(np.dtype(cast)))
  return _run(expr, x, "hand", *case), getattr(x, red)().astype(cast)


@pytest.mark.parametrize("cc, target", CASES)
def test_truth_reduces_are_right_everywhere(cc, target, cache_dir):
  for dtype, red, n, cast in TRUTH_REDUCES:
    got, want = _truth_reduce(dtype, red, n, cast, 3, (cc, target))
    assert got == want, (dtype, red, n, cast, cc, target)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dtype=st.sampled_from(["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]),
       red=st.sampled_from(["any", "all", "max", "min"]), n=st.integers(2, 40), flipped=st.integers(0, 39),
       cast=st.sampled_from(["int64", "int32", "uint8"]), case=st.sampled_from(CASES))
def test_truth_reduces_property(dtype, red, n, flipped, cast, case, cache_dir):
  got, want = _truth_reduce(dtype, red, n, cast, flipped, case)
  assert got == want, (dtype, red, n, cast, case)


# ------------------------------------------------------------------------------------------------------ the self-test

class CorruptingProgram(ClangProgram):
  """A CLANG program whose output's first byte is flipped after each call: a device that computes wrong answers."""
  def __call__(self, *bufs, **kwargs):
    result = super().__call__(*bufs, **kwargs)
    (bufs[0]._buf if isinstance(bufs[0], Buffer) else bufs[0]).array[0] ^= 0x40
    return result

  def launch_arrays(self, arrays):  # a plain call's entry (kc.api's fast path) computes wrong answers too
    result = super().launch_arrays(arrays)
    arrays[0].reshape(-1).view("uint8")[0] ^= 0x40
    return result


@pytest.fixture
def wrong_device():
  """Device CLANGWRONG: CLANG's renderer, compiler and flags, and a runtime that corrupts every output."""
  def open_device():
    return CompiledDevice("CLANGWRONG", HostAllocator(), ClangRenderer(), ClangCompiler("test"), CorruptingProgram)
  register(BackendSpec("CLANGWRONG", PLUGIN_API_VERSION, -2000, lambda: None, open_device), replace=True)
  yield "CLANGWRONG"
  unregister("CLANGWRONG")


def test_self_test_passes_on_clang(cache_dir):
  results = self_test("CLANG")
  assert set(results) >= {f"known bug {bug.name}" for bug in KNOWN_BUGS}
  assert len(results) == len(KNOWN_BUGS) + len(known_bugs.CANARIES)
  assert all(problem is None for problem in results.values()), results


def test_self_test_names_the_compiler_flags_and_entry_of_a_wrong_result(wrong_device, cache_dir):
  results = self_test(wrong_device)
  assert all(problem is not None for problem in results.values()), results
  comp = kc.Device[wrong_device].compiler
  for bug in KNOWN_BUGS:
    problem = results[f"known bug {bug.name}"]
    assert bug.name in problem and bug.reason in problem and " ".join(comp.flags) in problem
    assert repr(" ".join(comp.cmd)) in problem and "where numpy gives" in problem


@pytest.mark.skipif(not X86, reason="the entries are for x86-64 levels")
def test_self_test_catches_gcc12_without_the_workarounds(cache_dir):
  """The record's reproducers do reproduce: gcc 12 at this host's level without the flags fails the self-test, and
  the problem says the record covers the compiler but the flag is missing."""
  found = compiler_id(("gcc",))
  affected = [bug for bug in KNOWN_BUGS if found and bug.matches(found.family, found.major, psabi_level())]
  if not affected: pytest.skip("gcc here is not a version the record lists for this host's level")
  flags = [f for f in compile_flags(cmd=["gcc"], native=True) if f not in {bug.flag for bug in KNOWN_BUGS}]

  def open_device(): return CompiledDevice("CLANGRAW", HostAllocator(), ClangRenderer(native=True),
                                           ClangCompiler("test", cmd=["gcc"], flags=flags), ClangProgram)
  register(BackendSpec("CLANGRAW", PLUGIN_API_VERSION, -2000, lambda: None, open_device), replace=True)
  try: results = self_test("CLANGRAW")
  finally: unregister("CLANGRAW")
  for bug in affected:
    assert "but " + bug.flag + " is not in the flags" in results[f"known bug {bug.name}"], results
