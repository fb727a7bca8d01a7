"""KC_CLANG_ISA: CLANG code for a chosen x86 ISA level (avx512f, avx2, sse2) instead of this CPU's (-march=native).
The flags, vector widths, register tiles, arch string and cache identity follow the level; kernels built for it
compute numpy's results and use no wider registers than it has; what cannot work here is a ConfigError."""
import os, platform, re, shutil, stat, subprocess, sys
import numpy as np
import pytest
import kc
from kc import Buffer, Opt, OptOps, dtypes
from kc import ast as A
from kc.api import optimize
from kc_clang.compiler import ClangCompiler, compile_flags
from kc_clang.host import ISA_LEVELS, HostCPU, host_cpu, isa_level
from kc_clang.renderer import ClangRenderer

X86 = platform.machine().lower() in ("x86_64", "amd64")
needs_x86 = pytest.mark.skipif(not X86, reason="ISA levels are x86-64 only")


def _host_has(name: str) -> bool:
  try: isa_level(name)
  except kc.ConfigError: return False
  return True


HOST_LEVELS = [name for name in ISA_LEVELS if X86 and _host_has(name)]
LACKED = [name for name in ISA_LEVELS if X86 and not _host_has(name)]
LANES = {"avx512f": 16, "avx2": 8, "sse2": 4}


@pytest.fixture
def no_target_env(monkeypatch):
  for var in ("KC_CLANG_ISA", "KC_CLANG_PORTABLE", "KC_CLANG_MARCH_NATIVE"): monkeypatch.delenv(var, raising=False)
  return monkeypatch


def _level_or_skip(name: str):
  if name not in HOST_LEVELS: pytest.skip(f"this host cannot run {name} code" if X86 else "not x86-64")


# ------------------------------------------------------------------------------------------- flags, widths, identity

@needs_x86
@pytest.mark.parametrize("name", list(ISA_LEVELS))
def test_flags_widths_and_arch_follow_the_level(name, no_target_env):
  _level_or_skip(name)
  no_target_env.setenv("KC_CLANG_ISA", name)
  march = {"avx512f": "-march=x86-64-v4", "avx2": "-march=x86-64-v3", "sse2": "-march=x86-64"}[name]
  comp, r = ClangCompiler(), ClangRenderer()
  assert march in comp.flags and "-march=native" not in comp.flags
  # no level enables AVX512-FP16, so gcc's half conversions stay correct without -mno-avx512fp16
  assert "-mno-avx512fp16" not in comp.flags
  assert comp.flags == compile_flags(isa=name) and comp.flags[:5] == compile_flags(native=False)
  assert r.vector_widths(dtypes.float32)[0] == LANES[name] and r.vector_widths(dtypes.float32)[-1] == 2
  assert r.arch == f"{host_cpu().machine} {name}" and not r.native
  assert ClangRenderer(isa=name).arch == r.arch and ClangRenderer(isa=name).float_lanes == LANES[name]


@needs_x86
def test_cache_identity_names_the_level(no_target_env, cache_dir):
  src = "void f(float* restrict a) { a[0] = 1.0f; }"
  native = ClangCompiler()
  keys = {"native": native.cache_key(src), "portable": ClangCompiler(flags=compile_flags(native=False)).cache_key(src)}
  for name in HOST_LEVELS:
    no_target_env.setenv("KC_CLANG_ISA", name)
    comp = ClangCompiler()
    keys[name] = comp.cache_key(src)
    # code for a level runs on every CPU that has it: keyed on the flags and the architecture, not this CPU's model
    assert ISA_LEVELS[name].march in comp.identity() and host_cpu().describe() not in comp.identity()
  assert len(set(keys.values())) == len(keys), keys


@needs_x86
def test_register_tile_fits_the_levels_registers():
  """The hand-coded matmul tile: rows*cols vector accumulators + cols loaded vectors + 1 splat within the registers
  of the level, 16 for AVX2 and SSE2, 32 for AVX-512 (192 is divisible by every tile the heuristics try)."""
  n = 192
  a, b = A.arg(1, dtypes.float32, (n, n)), A.arg(2, dtypes.float32, (n, n))
  tiles = {}
  for name in ISA_LEVELS:
    k = optimize(kc.Kernel(A.sink(A.store(0, a @ b)), ClangRenderer(isa=name) if name in HOST_LEVELS else _renderer_for(name)), "hand")
    ups = [o.amt for o in k.applied_opts if o.op is OptOps.UPCAST]
    assert ups[0] == LANES[name], (name, k.applied_opts)
    cols, rows = ups[1], ups[2]
    tiles[name] = rows * cols + cols + 1
    assert tiles[name] <= (32 if name == "avx512f" else 16), (name, k.applied_opts)
  assert tiles["avx512f"] > 16  # the wider tile that needs AVX-512's 32 registers


def _renderer_for(name: str) -> ClangRenderer:
  """A renderer sized for a level this host lacks (rendering needs no CPU): the level's lanes on a native renderer."""
  r = ClangRenderer(native=True)
  r.float_lanes, r.arch = LANES[name], f"x86_64 {name}"
  return r


# --------------------------------------------------------------------------------------------- kernels run for a level

def _build(sink, name: str, opts):
  """The kernel rendered, compiled and loaded for level `name`: (its Program, the runtime program, the library)."""
  prg = optimize(kc.Kernel(sink, ClangRenderer(isa=name)), opts).to_program()
  lib = ClangCompiler(flags=compile_flags(isa=name)).compile(prg.src)
  return prg, kc.Device["CLANG"].runtime(prg.name, lib), lib


def _registers_used(lib: bytes, tmp_path) -> set[str]:
  """Which vector register files the library's code uses: xmm, ymm (AVX), zmm (AVX-512)."""
  if shutil.which("objdump") is None: pytest.skip("objdump is not installed")
  path = tmp_path / "kernel.so"
  path.write_bytes(lib)
  text = subprocess.run(["objdump", "-d", str(path)], capture_output=True, text=True, check=True).stdout
  return {reg for reg in ("xmm", "ymm", "zmm") if f"%{reg}" in text}


def _buf(arr: np.ndarray) -> Buffer: return Buffer("CLANG", arr.size, dtypes.from_numpy(arr.dtype)).copyin(arr)


@needs_x86
@pytest.mark.parametrize("name", ["avx2", "sse2"])
def test_matmul_for_a_level_matches_numpy(name, cache_dir, tmp_path):
  _level_or_skip(name)
  n = 96
  rng = np.random.default_rng(1)
  x, y = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
  a, b = A.arg(1, dtypes.float32, (n, n)), A.arg(2, dtypes.float32, (n, n))
  prg, fn, lib = _build(A.sink(A.store(0, a @ b)), name, "hand")
  assert f"float{LANES[name]} " in prg.src and f"float{2 * LANES[name]} " not in prg.src
  out = Buffer("CLANG", n * n, dtypes.float32).allocate()
  fn(out, _buf(x), _buf(y))
  np.testing.assert_allclose(out.numpy().reshape(n, n), x.astype(np.float64) @ y.astype(np.float64), rtol=1e-4, atol=1e-4)
  used = _registers_used(lib, tmp_path)
  assert "zmm" not in used and ("ymm" in used) == (name == "avx2"), used  # AVX2 code on 8-float ymm, SSE2 on xmm only


@needs_x86
@pytest.mark.parametrize("name", ["avx2", "sse2"])
def test_vector_exp2_for_a_level_matches_numpy(name, cache_dir, tmp_path):
  _level_or_skip(name)
  lanes = LANES[name]
  x = np.concatenate([np.linspace(-152, 130, 4096, dtype=np.float32), np.array([np.inf, -np.inf, np.nan, 0, -0.0, 1, -149.5, 128], np.float32)])
  prg, fn, lib = _build(A.sink(A.store(0, A.arg(1, dtypes.float32, (x.size,)).exp2())), name, [Opt(OptOps.UPCAST, 0, lanes)])
  assert f"kc_exp2_{lanes}(" in prg.src  # the vector function of the level's width, not exp2f lane by lane
  out = Buffer("CLANG", x.size, dtypes.float32).allocate()
  fn(out, _buf(x))
  got = out.numpy()
  with np.errstate(over="ignore"): want = np.exp2(x.astype(np.float64)).astype(np.float32)
  finite = np.isfinite(want) & (want != 0)
  assert np.array_equal(got[~finite], want[~finite], equal_nan=True)
  ulps = np.abs(got[finite].astype(np.float64) - want[finite]) / np.spacing(np.abs(want[finite])).astype(np.float64)
  assert ulps.max() <= 2
  assert "zmm" not in _registers_used(lib, tmp_path)


@needs_x86
def test_avx512f_level_converts_half_correctly(cache_dir):
  """(double)(_Float16)x rounds to half first with -march=x86-64-v4 too (what -mno-avx512fp16 guards under native)."""
  _level_or_skip("avx512f")
  x = np.random.default_rng(2).standard_normal(4096).astype(np.float32) * 1000
  _, fn, _ = _build(A.sink(A.store(0, A.arg(1, dtypes.float32, (x.size,)).cast(dtypes.float16).cast(dtypes.float64))), "avx512f", "hand")
  out = Buffer("CLANG", x.size, dtypes.float64).allocate()
  fn(out, _buf(x))
  np.testing.assert_array_equal(out.numpy(), x.astype(np.float16).astype(np.float64))


@needs_x86
def test_the_device_builds_for_KC_CLANG_ISA(cache_dir):
  """The variable reaches the device a fresh process opens: its renderer, its flags and a kernel's result."""
  _level_or_skip("avx2")
  code = ("import numpy as np, kc\nfrom kc import dtypes, ast as A\ndev = kc.Device['CLANG']\n"
          "print(dev.renderer.arch, dev.renderer.float_lanes, ' '.join(dev.compiler.flags))\n"
          "x = A.arg(1, dtypes.float32, (64, 64))\nv = np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 4096\n"
          "out = kc.run(A.sink(A.store(0, x @ x)), {1: v}, device='CLANG')[0]\nprint(float(np.abs(out - v @ v).max()))\n")
  env = {**os.environ, "KC_CLANG_ISA": "avx2"}
  env.pop("KC_CLANG_PORTABLE", None)
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
  assert r.returncode == 0, r.stderr
  facts, err = r.stdout.strip().splitlines()[-2:]
  assert facts.startswith(f"{host_cpu().machine} avx2 8 ") and "-march=x86-64-v3" in facts and "-march=native" not in facts
  assert float(err) < 1e-3


# ----------------------------------------------------------------------------------------------- what is a ConfigError

@pytest.mark.parametrize("value", ["avx", "AVX-2", "x86-64-v3", "native", "neon"])
def test_unknown_level_is_a_config_error(value, no_target_env):
  if not X86: pytest.skip("on other machines every value is refused as not x86 (test_not_x86_is_a_config_error)")
  no_target_env.setenv("KC_CLANG_ISA", value)
  for make in (ClangRenderer, ClangCompiler):
    with pytest.raises(kc.ConfigError, match=re.escape("avx512f | avx2 | sse2")): make()


def test_levels_need_every_extension_of_the_level():
  sse_only = HostCPU("x86_64", "Old CPU", ("cx16", "popcnt", "sse", "sse2", "sse4_1", "sse4_2", "ssse3"))
  assert isa_level("sse2", sse_only).march == "x86-64"
  with pytest.raises(kc.ConfigError, match="lacks avx, avx2"): isa_level("avx2", sse_only)
  # AVX2 without BMI2 and LZCNT (some virtual CPUs hide them) cannot run -march=x86-64-v3 code either
  partial = HostCPU("x86_64", "VM", sse_only.features + ("avx", "avx2", "bmi1", "f16c", "fma", "movbe"))
  with pytest.raises(kc.ConfigError, match="lacks bmi2, lzcnt"): isa_level("avx2", partial)
  full = HostCPU("x86_64", "VM", partial.features + ("abm", "bmi2"))  # Linux names LZCNT "abm"
  assert isa_level("avx2", full).vector_bytes == 32
  with pytest.raises(kc.ConfigError, match="lacks avx512f"): isa_level("avx512f", full)


def test_not_x86_is_a_config_error():
  arm = HostCPU("aarch64", "Neoverse", ("asimd",))
  with pytest.raises(kc.ConfigError, match=r"x86-64 only.*aarch64") as e: isa_level("avx2", arm)
  assert all(name in str(e.value) for name in ISA_LEVELS)


@needs_x86
@pytest.mark.parametrize("name", ISA_LEVELS)
def test_a_level_this_host_lacks_is_a_config_error(name, no_target_env):
  if name not in LACKED: pytest.skip(f"this host has {name}")
  no_target_env.setenv("KC_CLANG_ISA", name)
  with pytest.raises(kc.ConfigError, match="could not run here"): ClangCompiler()
  with pytest.raises(kc.ConfigError, match="could not run here"): ClangRenderer()


@needs_x86
@pytest.mark.parametrize("portable", [("KC_CLANG_PORTABLE", "1"), ("KC_CLANG_MARCH_NATIVE", "0")])
def test_level_and_portable_together_is_a_config_error(portable, no_target_env):
  no_target_env.setenv("KC_CLANG_ISA", "sse2")
  no_target_env.setenv(*portable)
  for make in (ClangRenderer, ClangCompiler):
    with pytest.raises(kc.ConfigError, match="ask for different code"): make()
  no_target_env.setenv("KC_CLANG_ISA", "")  # blank is unset: portable code
  assert ClangRenderer().arch == host_cpu().machine and not any(f.startswith("-march") for f in ClangCompiler().flags)


@needs_x86
def test_a_compiler_without_the_level_flag_is_a_config_error(tmp_path):
  """gcc < 11 and clang < 12 reject -march=x86-64-v3: said at once, naming the versions, not at every compile."""
  _level_or_skip("avx2")
  fake = tmp_path / "oldcc"
  fake.write_text("#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in --version) echo 'gcc (Old) 10.2.1'; exit 0;;"
                  " -march=x86-64-v3|-march=x86-64-v4) echo \"error: bad value for -march\" >&2; exit 1;; esac; done\nexit 0\n")
  fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
  with pytest.raises(kc.ConfigError, match=r"does not accept.*gcc 11 and clang 12") as e: compile_flags(cmd=[str(fake)], isa="avx2")
  assert "10.2.1" in str(e.value)
  assert compile_flags(cmd=[str(fake)], isa="sse2")[-1] == "-march=x86-64"  # the baseline every compiler knows
