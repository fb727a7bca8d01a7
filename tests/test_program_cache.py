"""The Program cache (kc.runtime.program_cache): a process compiles a kernel an earlier process compiled without
rendering it; the key changes with everything the rendered Program depends on (the AST, the opts, the tensor-core
level, the renderer and its settings, kc's code); a damaged entry is rendered again; a cached Program is the one
rendering gives."""
from __future__ import annotations
import json, pickle, sqlite3, subprocess, sys
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
import kc
from kc import Opt, OptOps, ast as A, dtypes
from kc.kernel import Kernel
from kc.runtime import program_cache
from kc.runtime.cache import DB_NAME
from kc.runtime.program_cache import KEY_PREFIX, NotCanonical, cached_program, canonical, program_key

needs_clang = pytest.mark.skipif("CLANG" not in kc.Device.available(), reason="CLANG cannot open here")
F = lambda i, *shape: A.arg(i, dtypes.float32, shape)  # noqa: E731
H = lambda i, *shape: A.arg(i, dtypes.float16, shape)  # noqa: E731


def matmul(M, K, N): return A.sink(A.store(0, (F(1, M, K).reshape(M, K, 1) * F(2, K, N).reshape(1, K, N)).sum(1)))


def half_matmul(M, K, N): return A.sink(A.store(0, (H(1, M, K).reshape(M, K, 1) * H(2, K, N).reshape(1, K, N)).cast(dtypes.float).sum(1)))


def program_rows(cache_dir) -> dict:
  with sqlite3.connect(cache_dir / DB_NAME) as db:
    return {k: blob for k, blob in db.execute("SELECT key, blob FROM entries") if k.startswith(KEY_PREFIX)}


def same_program(a, b) -> bool:
  return (a.src, a.name, a.device, a.global_size, a.local_size, a.globals, a.outs, a.vars) == \
    (b.src, b.name, b.device, b.global_size, b.local_size, b.globals, b.outs, b.vars) and a.uops == b.uops


# ------------------------------------------------------------------------------------------- a second process renders nothing

CHILD = """
import json, sys
import numpy as np
import kc, kc.kernel.kernel
from kc import ast as A, dtypes
def refuse(*a, **kw): raise AssertionError("rendered a kernel the disk cache holds")
kc.kernel.kernel.Kernel.to_program = refuse
kc.kernel.kernel.render_program = refuse
import kc.codegen.program
kc.codegen.program.render_program = refuse
F = lambda i, *s: A.arg(i, dtypes.float32, s)
sink = A.sink(A.store(0, (F(1, 24, 40).reshape(24, 40, 1) * F(2, 40, 20).reshape(1, 40, 20)).sum(1)))
ck = kc.compile(sink, device="CLANG", opts=json.loads(sys.argv[1]))
rng = np.random.default_rng(0)
a, b = rng.random((24, 40), dtype=np.float32), rng.random((40, 20), dtype=np.float32)
out = np.empty((24, 20), np.float32)
ck(out, a, b)
np.testing.assert_allclose(out, a @ b, rtol=1e-5)
print(json.dumps({"src": ck.program.src, "global_size": ck.program.global_size}))
"""


def run_child(opts) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", CHILD, json.dumps(opts)], capture_output=True, text=True)


@needs_clang
@pytest.mark.parametrize("opts", ["hand", "none"])
def test_a_second_process_compiles_without_rendering(cache_dir, opts):
  sink = matmul(24, 40, 20)
  first = kc.compile(sink, device="CLANG", opts=opts).program
  assert len(program_rows(cache_dir)) == 1
  child = run_child(opts)
  assert child.returncode == 0, child.stderr
  got = json.loads(child.stdout.strip().splitlines()[-1])
  assert got == {"src": first.src, "global_size": first.global_size}


@needs_clang
def test_the_child_renders_when_the_cache_is_off_or_cold(cache_dir, monkeypatch):
  # the child above fails when it must render: what makes the previous test prove something
  assert "rendered a kernel the disk cache holds" in run_child("hand").stderr
  monkeypatch.setenv("KC_CACHE_DIR", "")
  kc.compile(matmul(24, 40, 20), device="CLANG", opts="hand")
  assert "rendered a kernel the disk cache holds" in run_child("hand").stderr


# ------------------------------------------------------------------------------------------------------------ the key

def keys_of(kernels) -> list:
  keys = [program_key(k) for k in kernels]
  assert all(k is not None and k.startswith(KEY_PREFIX) for k in keys)
  return keys


def test_the_key_is_the_same_for_the_same_kernel(minic):
  a, b = Kernel(matmul(16, 16, 16), minic).hand_coded_optimizations(), Kernel(matmul(16, 16, 16), minic).hand_coded_optimizations()
  assert program_key(a) == program_key(b)


def test_the_key_changes_with_the_ast(minic):
  sinks = [matmul(16, 16, 16), matmul(16, 16, 8), matmul(16, 8, 16), A.sink(A.store(0, F(1, 16, 16) + F(2, 16, 16))),
           A.sink(A.store(0, F(1, 16, 16) * F(2, 16, 16))), A.sink(A.store(0, F(1, 16, 16) + 1.0)),
           A.sink(A.store(0, F(1, 16, 16) + 2.0)), A.sink(A.store(0, (F(1, 16, 16) + 1).cast(dtypes.int32)))]
  assert len(set(keys_of(Kernel(s, minic) for s in sinks))) == len(sinks)


def test_the_key_changes_with_the_opts(minic):
  kernels = [Kernel(matmul(16, 16, 16), minic) for _ in range(5)]
  kernels[1].apply_opt(Opt(OptOps.UPCAST, 0, 4))
  kernels[2].apply_opt(Opt(OptOps.UPCAST, 1, 4))
  kernels[3].apply_opt(Opt(OptOps.LOCAL, 0, 4))
  kernels[4].hand_coded_optimizations()
  assert len(set(keys_of(kernels))) == 5


@pytest.mark.parametrize("opt", [None, Opt(OptOps.TC, 0, 0)])
def test_the_key_changes_with_the_tensor_core_level(minic, opt):
  kernels = []
  for level in (1, 2, 3):
    k = Kernel(half_matmul(32, 32, 32), minic, tc_level=level)
    if opt is not None: k.apply_opt(opt)
    kernels.append(k)
  assert len(set(keys_of(kernels))) == 3
  if opt is not None: assert len({k.to_program().src for k in kernels}) == 3  # the levels do render differently


@needs_clang
def test_the_key_changes_with_a_setting_the_renderer_reads(monkeypatch):
  keys = []
  for threads in ("1", "2"):
    monkeypatch.setenv("KC_CLANG_THREADS", threads)  # read at render time: render_env()
    keys.append(program_key(Kernel(matmul(64, 64, 64), kc.Device.renderer("CLANG")).hand_coded_optimizations()))
  for isa in ("sse2", "avx2"):
    monkeypatch.setenv("KC_CLANG_ISA", isa)  # read when the renderer is made: its instance attributes
    ren = kc.Device.renderer("CLANG")
    if isa not in ren.arch: pytest.skip(f"this CPU cannot build for {isa}")
    keys.append(program_key(Kernel(matmul(64, 64, 64), ren)))
  assert None not in keys and len(set(keys)) == 4


def test_the_key_changes_with_the_renderer(minic):
  renderers = [minic, kc.Device.renderer("EMU")] + \
    [kc.Device.renderer(d) for d in ("CLANG", "OPENCL") if d in kc.Device.available()]
  assert len(set(keys_of(Kernel(matmul(16, 16, 16), r) for r in renderers))) == len(renderers)


def test_the_key_changes_with_a_renderer_attribute(minic, monkeypatch):
  before = program_key(Kernel(matmul(16, 16, 16), minic))
  minic.shared_max = 1024  # an instance attribute
  after_instance = program_key(Kernel(matmul(16, 16, 16), minic))
  monkeypatch.setattr(type(minic), "local_max", (64, 64, 64))  # a class attribute
  after_class = program_key(Kernel(matmul(16, 16, 16), minic))
  assert len({before, after_instance, after_class}) == 3


def test_the_key_changes_with_the_code(minic, monkeypatch):
  k = Kernel(matmul(16, 16, 16), minic)
  before = program_key(k)
  monkeypatch.setattr(program_cache, "code_digest", lambda renderer: "another codegen")
  assert program_key(k) not in (before, None)


def test_the_key_changes_with_kcs_version(minic, monkeypatch):
  k = Kernel(matmul(16, 16, 16), minic)
  before = program_key(k)
  monkeypatch.setattr(program_cache, "_versions", lambda: "kc 99.0")
  assert program_key(k) not in (before, None)


def test_the_code_digest_covers_kc_and_the_renderers_package(minic, tmp_path):
  # the digest of a folder is read from its files: another file content is another digest
  (tmp_path / "a.py").write_text("x = 1\n")
  one = program_cache._source_digest(str(tmp_path))
  (tmp_path / "a.py").write_text("x = 2\n")
  program_cache._DIGESTS.clear()
  assert program_cache._source_digest(str(tmp_path)) != one
  # MiniC lives in tests/target_renderers.py: that file is hashed along with kc
  program_cache._DIGESTS.clear()
  assert program_cache.code_digest(minic) is not None and len(program_cache._DIGESTS) == 2


class Unnamed:
  """A value whose repr names its address."""


def test_values_without_a_canonical_text_keep_the_kernel_off_the_disk(minic):
  assert canonical(frozenset({dtypes.float32, dtypes.int8, dtypes.half})) == canonical(frozenset({dtypes.half, dtypes.int8, dtypes.float32}))
  assert len({canonical(1), canonical(1.0), canonical(True)}) == 3
  for bad in (Unnamed(), lambda: 0, [Unnamed()]):
    with pytest.raises(NotCanonical): canonical(bad)
  minic.scratch = Unnamed()
  assert program_key(Kernel(matmul(16, 16, 16), minic)) is None


@needs_clang
def test_a_renderer_setting_without_a_canonical_text_renders_every_time(cache_dir):
  ren = kc.Device["CLANG"].renderer
  ren.scratch = Unnamed()
  try:
    kc.compile(matmul(8, 8, 8), device="CLANG", opts="none")
    assert program_rows(cache_dir) == {}
  finally: del ren.scratch


# ------------------------------------------------------------------------------------------------ damaged entries

def store_damaged(key: str, payload: bytes):
  from kc.runtime.cache import store
  store(key, payload)


@pytest.mark.parametrize("payload", [b"not a pickle", pickle.dumps("a string"), "wrong name"])
def test_a_damaged_entry_is_rendered_again_and_replaced(cache_dir, minic, payload):
  k = Kernel(matmul(16, 16, 16), minic).hand_coded_optimizations()
  key = program_key(k)
  fresh = k.to_program()
  if payload == "wrong name":
    other = Kernel(matmul(16, 16, 8), minic).to_program()
    payload = pickle.dumps(other)
  store_damaged(key, payload)
  got = cached_program(k)
  assert same_program(got, fresh)
  assert pickle.loads(program_rows(cache_dir)[key][64 + 32:]).src == fresh.src  # the entry now holds the fresh render


def test_the_cache_off_stores_nothing(cache_dir, minic, monkeypatch):
  monkeypatch.setenv("KC_CACHE_DIR", "")
  k = Kernel(matmul(16, 16, 16), minic)
  assert same_program(cached_program(k), k.to_program())
  assert not (cache_dir / DB_NAME).exists()


# ------------------------------------------------------------------------------------------- cached == freshly rendered

DTYPES = [dtypes.float32, dtypes.float16, dtypes.int32, dtypes.uint8]


@st.composite
def small_programs(draw):
  dt = draw(st.sampled_from(DTYPES))
  shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
  x, args = A.arg(1, dt, shape), 1
  def another(like):  # buffers are numbered 0..n-1 with none missing
    nonlocal args
    args += 1
    return A.arg(args, like.dtype, like.shape)
  for _ in range(draw(st.integers(1, 3))):
    step = draw(st.sampled_from(["add", "mul", "max", "permute", "flip", "pad", "sum", "maxred", "cast"]))
    if step == "add": x = x + another(x)
    elif step == "mul": x = x * 3
    elif step == "max": x = x.maximum(another(x))
    elif step == "permute": x = x.permute(tuple(reversed(range(x.ndim))))
    elif step == "flip": x = x.flip(draw(st.integers(0, x.ndim - 1)))
    elif step == "pad": x = x.pad(tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(x.ndim)))
    elif step == "cast": x = x.cast(draw(st.sampled_from(DTYPES)))
    elif x.ndim > 1:
      axis = draw(st.integers(0, x.ndim - 1))
      x = x.sum(axis) if step == "sum" else x.max(axis)
  return A.sink(A.store(0, x)), draw(st.sampled_from(["none", "hand"]))


@pytest.fixture(scope="module")
def property_cache(tmp_path_factory):
  return tmp_path_factory.mktemp("program-cache")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(small_programs(), st.sampled_from(["minic", "EMU", "CLANG"]))
def test_a_cached_program_is_the_one_rendering_gives(property_cache, minic, monkeypatch, program, renderer_name):
  sink, opts = program
  monkeypatch.setenv("KC_CACHE_DIR", str(property_cache))
  if renderer_name != "minic" and renderer_name not in kc.Device.available(): renderer_name = "minic"
  ren = minic if renderer_name == "minic" else kc.Device[renderer_name].renderer
  def kernel():
    k = Kernel(sink, ren)
    return k.hand_coded_optimizations() if opts == "hand" else k
  first = cached_program(kernel())                 # rendered (or, for an AST drawn before, read) and stored
  fresh = kernel().to_program()
  stored = program_cache.load(program_key(kernel()), fresh.name, fresh.device)
  assert stored is not None and same_program(stored, fresh) and same_program(first, fresh)
  assert same_program(cached_program(kernel()), fresh)
