"""The OPENCL device (kc-opencl): the OpenCL C dialect, limits from the device, launches with work-groups, build
errors, buffers, and every opt (GROUP/GROUPTOP/LOCAL included) giving numpy's numbers. Runs on PoCL in CI.

Render-tier tests and the unavailable-device tests run everywhere; the rest skip when no OpenCL device opens."""
import importlib.util, re, subprocess, sys
import numpy as np
import pytest
import kc
from kc import Buffer, Opt, OptOps, ShapeTracker, UOp, Ops, dtypes
from kc import ast as A
from kc.ir.dtype import fp8_to_float32
from kc.runtime.device import DeviceRegistry
from kc.errors import CompileError, DeviceUnavailable, KcError
from kc.runtime.plugins import PluginTable
import kc_opencl
from kc_opencl import platform as clplatform
from kc_opencl.platform import DeviceInfo
from kc_opencl.renderer import DEFAULT_LOCAL_MAX, DEFAULT_LOCAL_MEM, OpenCLRenderer

REASON = kc_opencl.unavailable_reason()
needs_device = pytest.mark.skipif(REASON is not None, reason=f"OPENCL cannot open here: {REASON}")
needs_pyopencl = pytest.mark.skipif(importlib.util.find_spec("pyopencl") is None, reason="pyopencl is not installed")

F = lambda i, *shape: A.arg(i, dtypes.float32, shape)  # noqa: E731
O = OptOps


# every compile lands in a fresh cache directory (the cache_dir fixture of this folder's conftest.py)
pytestmark = pytest.mark.usefixtures("cache_dir")


@pytest.fixture
def cl_dev():
  return kc.Device["OPENCL"]


def fake_info(**changes) -> DeviceInfo:
  base = dict(name="Fake GPU", platform="Fake 1.0", version="OpenCL 3.0", driver_version="1", max_work_item_sizes=(512, 128, 32),
              max_work_group_size=256, local_mem_size=65536, address_bits=32, mem_base_addr_align=1024,
              extensions=frozenset({"cl_khr_fp64"}), image_support=True, correctly_rounded_divide_sqrt=True)
  return DeviceInfo(**{**base, **changes})


def render(sink, opts=(), renderer=None) -> str:
  k = kc.Kernel(sink, opts=renderer or OpenCLRenderer())
  for o in opts: k.apply_opt(o)
  return k.to_program().src


def run(sink, inputs, opts, **var_vals):
  return kc.run(sink, inputs, device="OPENCL", opts=opts, **var_vals)[0]


# ---------------------------------------------------------------------------------------------------------- plugin

def test_opencl_is_registered_through_its_entry_point():
  spec = kc.Device.spec("opencl")
  assert "OPENCL" in kc.Device.names() and "opencl" not in kc.Device.errors()
  assert spec.distribution == "kc-opencl" and spec.version == kc_opencl.__version__ and spec.priority == kc_opencl.PRIORITY
  assert spec.priority < kc.Device.spec("CLANG").priority  # PoCL must not take the default from CLANG


def test_importing_kc_opencl_does_not_import_pyopencl():
  code = "import sys, kc, kc_opencl; kc.Device.names(); assert 'pyopencl' not in sys.modules, 'pyopencl imported'; print('ok')"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
  assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@needs_pyopencl
def test_no_platform_registers_an_unavailable_device_that_says_why(monkeypatch):
  monkeypatch.setattr(clplatform, "list_platforms", lambda: [])
  monkeypatch.delenv("KC_OPENCL_DEVICE", raising=False)
  reason = kc_opencl.unavailable_reason()
  assert "no OpenCL platform" in reason and "kc-opencl[pocl]" in reason
  reg = DeviceRegistry(PluginTable(entry_points=lambda: []))
  reg.table.register(kc_opencl.kc_backends()[0])
  assert "OPENCL" in reg.names() and "OPENCL" not in reg.available()
  assert reg.unavailable_reason("OPENCL") == reason
  with pytest.raises(DeviceUnavailable, match="no OpenCL platform"):
    reg["OPENCL"]
  # the render tier still works: a renderer with limits every OpenCL 1.2 device meets
  r = reg.renderer("OPENCL")
  assert isinstance(r, OpenCLRenderer) and r.info is None
  assert r.local_max == DEFAULT_LOCAL_MAX and r.shared_max == DEFAULT_LOCAL_MEM and r.has_local and r.has_shared
  assert "__kernel void" in render(A.sink(A.store(0, F(1, 16) + 1.0)), renderer=r)


def test_missing_pyopencl_is_the_reason(monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyopencl" else real(name, *a))
  assert "pyopencl is not installed" in kc_opencl.unavailable_reason()


@needs_pyopencl
def test_platform_without_devices_and_bad_device_choice(monkeypatch):
  class NoDevices:
    name = "Empty Platform"
    def get_devices(self): return []
  monkeypatch.setattr(clplatform, "list_platforms", lambda: [NoDevices()])
  monkeypatch.delenv("KC_OPENCL_DEVICE", raising=False)
  assert "Empty Platform" in kc_opencl.unavailable_reason() and "have no devices" in kc_opencl.unavailable_reason()
  monkeypatch.setenv("KC_OPENCL_DEVICE", "0:3")
  assert "KC_OPENCL_DEVICE=0:3 names no device" in kc_opencl.unavailable_reason()
  monkeypatch.setenv("KC_OPENCL_DEVICE", "gpu")
  assert "not 'platform:device'" in kc_opencl.unavailable_reason()


# ---------------------------------------------------------------------------------------------------------- renderer

def test_renderer_limits_come_from_the_device_info():
  r = OpenCLRenderer(fake_info())
  assert r.local_max == (256, 128, 32)  # item sizes capped by the work-group size
  assert r.shared_max == 65536 and r.max_work_group_size == 256
  assert r.global_max == (2**31 - 1,) * 3  # 32 address bits, but kernels index in int
  assert OpenCLRenderer(fake_info(local_mem_size=0)).has_shared is False


@needs_device
def test_limits_are_read_from_the_opened_device(cl_dev):
  import pyopencl as cl
  dev = clplatform.select_device()
  r = cl_dev.renderer
  assert r.local_max == tuple(min(s, dev.max_work_group_size) for s in dev.max_work_item_sizes[:3])
  assert r.shared_max == dev.local_mem_size and r.max_work_group_size == dev.max_work_group_size
  assert r.has_fp16 == ("cl_khr_fp16" in dev.extensions) and r.has_images == bool(dev.image_support)
  assert kc.Device.renderer("OPENCL").local_max == r.local_max  # the factory agrees with the opened device
  assert isinstance(cl_dev.context, cl.Context)


def test_render_group_reduce_uses_local_memory_and_barriers():
  src = render(A.sink(A.store(0, F(1, 64, 256).sum(1))), [Opt(O.GROUPTOP, 0, 16)])
  # (the name gets a counter suffix when other tests built the same kernel first)
  assert re.match(r"__kernel void r_64_16_16(n\d+)?\(__global float\* data0, __global float\* data1\)", src)
  assert "get_group_id(0)" in src and "get_local_id(0)" in src
  assert "__attribute__((aligned(16))) __local float temp" in src and "barrier(CLK_LOCAL_MEM_FENCE);" in src
  assert src.index("__local") < src.index("barrier") < src.rindex("data0")


def test_render_without_local_ids_reads_global_ids():
  # no lidx: the runtime lets the driver pick the work-group, so the group axes must be global ids
  src = render(A.sink(A.store(0, F(1, 5, 7) * 2.0)))
  assert "get_global_id(0)" in src and "get_group_id" not in src


def test_render_float4_and_dialect_spellings():
  src = render(A.sink(A.store(0, F(1, 8, 16) * 3.0)), [Opt(O.UPCAST, 0, 4)])
  assert "*((__global float4*)(data0+" in src and "(float4)(" in src
  src = render(A.sink(A.store(0, F(1, 16, 64).sum(1))), [Opt(O.UNROLL, 0, 4)])
  assert "float4 val0 = *((__global float4*)(data1+" in src and "val0.s3" in src
  bits = render(A.sink(A.store(0, A.arg(1, dtypes.int32, (8,)).bitcast(dtypes.float32))))
  assert "as_float(" in bits
  mask = render(A.sink(A.store(0, F(1, 8) < 0.0)))
  assert "__global uchar* data0" in mask  # bool buffers hold numpy's bytes whatever sizeof(bool) is on the device
  big = render(A.sink(A.store(0, A.arg(1, dtypes.int64, (8,)) + A.const(2**40, dtypes.int64, (8,)))))
  assert "long" in big and f"{2**40}l" in big and "ll" not in big


def test_half_is_native_with_cl_khr_fp16_and_stored_half_computed_in_float_without():
  sink = A.sink(A.store(0, A.arg(1, dtypes.float16, (8,)) * 2.0))
  native = OpenCLRenderer(fake_info(extensions=frozenset({"cl_khr_fp16"})))
  src = render(sink, renderer=native)
  assert not native.half_in_float and native.supports_dtype(dtypes.float16)
  assert src.startswith("#pragma OPENCL EXTENSION cl_khr_fp16 : enable") and "__global half* data1" in src and "vload_half" not in src
  emulated = OpenCLRenderer(fake_info())
  assert emulated.half_in_float and emulated.supports_dtype(dtypes.float16) and "half in float" in repr(emulated)
  for renderer in (emulated, OpenCLRenderer()):  # no device to ask: no cl_khr_fp16 to rely on
    src = render(sink, renderer=renderer, opts=[Opt(OptOps.UPCAST, 0, 4)])
    assert "cl_khr_fp16" not in src and "__global half* data0, __global half* data1" in src  # buffers stay half
    assert "vload_half4(0, data1+" in src and "vstore_half4(" in src and "float4 val0" in src and "(half4" not in src and "half4 " not in src
  scalar = render(sink, renderer=emulated)
  assert "vload_half(gidx0, data1)" in scalar and "vstore_half(" in scalar and "float val0" in scalar
  cast = render(A.sink(A.store(0, F(1, 8).cast(dtypes.float16))), renderer=emulated)
  assert "__kc_rh(" in cast and "static inline float __kc_rh" in cast  # a cast to half rounds, in float
  # the builder bitcasts scalars only; a lowering that made half2 <-> float would get a clear error, not wrong bits
  with pytest.raises(CompileError, match="native half"): emulated.render_bitcast(dtypes.float32, dtypes.float16.vec(2), "v")


def test_double_needs_cl_khr_fp64():
  sink = A.sink(A.store(0, A.arg(1, dtypes.float64, (8,)) * 2.0))
  assert "#pragma OPENCL EXTENSION cl_khr_fp64 : enable" in render(sink, renderer=OpenCLRenderer(fake_info()))
  with pytest.raises(CompileError, match="cl_khr_fp64"):
    render(sink, renderer=OpenCLRenderer(fake_info(extensions=frozenset())))


# ---------------------------------------------------------------------------------------------------------- runtime

IDS = """
__kernel void ids(__global int* data0, __global int* data1, __global int* data2, const int base) {
  int i = get_global_id(0) + get_global_size(0) * get_global_id(1);
  data0[i] = get_group_id(0) + 100 * get_group_id(1) + base;
  data1[i] = get_local_id(0);
  data2[i] = get_local_size(0);
}
"""


@needs_device
def test_launch_global_size_counts_work_groups(cl_dev):
  prg = cl_dev.runtime("ids", cl_dev.compiler.compile(IDS))
  groups, local = Buffer("OPENCL", 24, dtypes.int32), Buffer("OPENCL", 24, dtypes.int32)
  sizes = Buffer("OPENCL", 24, dtypes.int32)
  seconds = prg(groups, local, sizes, global_size=(2, 3, 1), local_size=(4, 1, 1), vals=(1000,), wait=True)
  assert isinstance(seconds, float) and seconds > 0
  i = np.arange(24)
  x, y = i % 8, i // 8  # an NDRange of (2*4, 3*1)
  np.testing.assert_array_equal(groups.numpy(), x // 4 + 100 * y + 1000)
  np.testing.assert_array_equal(local.numpy(), x % 4)
  assert (sizes.numpy() == 4).all()
  # local_size None: global_size is the NDRange and the driver picks the work-group
  assert prg(groups, local, sizes, global_size=(24, 1, 1), local_size=None, vals=(0,)) is None
  cl_dev.synchronize()
  assert (groups.numpy() < 24).all() and sorted(set(groups.numpy() * sizes.numpy() + local.numpy())) == list(range(24))


@needs_device
def test_launch_errors_are_typed(cl_dev):
  prg = cl_dev.runtime("ids", cl_dev.compiler.compile(IDS))
  bufs = [Buffer("OPENCL", 4, dtypes.int32) for _ in range(3)]
  too_many = cl_dev.renderer.max_work_group_size + 1
  with pytest.raises(KcError, match="cannot run"):
    prg(*bufs, global_size=(1, 1, 1), local_size=(too_many, 1, 1), vals=(0,))
  with pytest.raises(KcError, match="takes 4 arguments"):
    prg(*bufs, vals=())
  with pytest.raises(KcError, match="outside int32"):
    prg(*bufs, vals=(2**31,))
  with pytest.raises(KcError, match="not OPENCL memory"):
    prg(np.zeros(4, np.int32), *bufs[1:], vals=(0,))
  with pytest.raises(KcError, match="no kernel named 'nosuch'"):
    cl_dev.runtime("nosuch", cl_dev.compiler.compile(IDS))


@needs_device
def test_build_failure_is_a_compile_error_with_the_build_log(cl_dev):
  bad = "__kernel void broken(__global float* data0) { data0[0] = undeclared_name; }"
  with pytest.raises(CompileError) as info:
    cl_dev.compiler.compile(bad)
  err = info.value
  assert err.src == bad and "undeclared_name" in err.log and "undeclared_name" in str(err)
  assert str(err).startswith(f"OpenCL build failed on {cl_dev.renderer.info.name}")


@needs_device
def test_binaries_are_cached_on_disk_and_programs_loaded_once(cl_dev, cache_dir, monkeypatch):
  calls = []
  real = cl_dev.compiler.compile_uncached
  monkeypatch.setattr(cl_dev.compiler, "compile_uncached", lambda src: calls.append(src) or real(src))
  lib = cl_dev.compiler.compile(IDS)
  assert cl_dev.compiler.compile(IDS) == lib and len(calls) == 1
  from kc.runtime.cache import compile_cache
  assert compile_cache().keys() == [cl_dev.compiler.cache_key(IDS)]
  assert cl_dev.load_program(lib) is cl_dev.load_program(lib)
  # the key names the device and driver: a binary is never handed to another device
  from kc_opencl.compiler import OpenCLCompiler
  other = OpenCLCompiler(cl_dev.context, cl_dev.cl_device, fake_info(), cl_dev.compiler.plugin_version)
  assert other.cache_key(IDS) != cl_dev.compiler.cache_key(IDS)


@needs_device
def test_buffers_copy_to_and_from_numpy():
  rng = np.random.default_rng(1)
  for dt in (dtypes.float32, dtypes.int8, dtypes.uint16, dtypes.int64, dtypes.float64, dtypes.bool):
    arr = (rng.standard_normal(37) * 50).astype(dt.np)
    np.testing.assert_array_equal(Buffer("OPENCL", 37, dt).copyin(arr).numpy(), arr)
  assert Buffer("OPENCL", 0, dtypes.float32).allocate().numpy().size == 0


@needs_device
def test_views_are_sub_buffers_on_aligned_offsets(cl_dev):
  align = cl_dev.info.mem_base_addr_align // 8
  n = align // 4
  base = Buffer("OPENCL", 4 * n, dtypes.float32).copyin(np.zeros(4 * n, np.float32))
  view = base.view(n, dtypes.float32, offset=align)
  view.copyin(np.arange(n, dtype=np.float32))
  expect = np.zeros(4 * n, np.float32)
  expect[n:2 * n] = np.arange(n)
  np.testing.assert_array_equal(base.numpy(), expect)
  with pytest.raises(KcError, match=f"multiple of {align} bytes"):
    base.view(4, dtypes.float32, offset=4).allocate()


# ---------------------------------------------------------------------------------------------------------- end to end

REDUCE_OPTS = [
  "none", "hand", [Opt(O.GROUP, 0, 16)], [Opt(O.GROUPTOP, 0, 16)], [Opt(O.LOCAL, 0, 16)], [Opt(O.LOCAL, 0, 8), Opt(O.GROUP, 0, 8)],
  [Opt(O.GROUPTOP, 0, 32), Opt(O.UNROLL, 0, 4)], [Opt(O.UPCAST, 0, 4), Opt(O.GROUP, 0, 4), Opt(O.LOCAL, 0, 4)],
  [Opt(O.NOLOCALS, 0, None)], [Opt(O.UNROLL, 0, 4), Opt(O.UPCAST, 0, 4)], [Opt(O.LOCAL, 0, 8), Opt(O.GROUPTOP, 0, 8), Opt(O.UPCAST, 0, 4)],
]


@needs_device
@pytest.mark.parametrize("opts", REDUCE_OPTS, ids=str)
def test_row_sum_every_opt(opts):
  x = np.random.default_rng(0).random((64, 256), dtype=np.float32)
  out = run(A.sink(A.store(0, F(1, 64, 256).sum(1))), {1: x}, opts)
  np.testing.assert_allclose(out, x.sum(1), rtol=1e-5)


@needs_device
@pytest.mark.parametrize("opts", ["none", "hand", [Opt(O.GROUPTOP, 0, 256)], [Opt(O.GROUP, 0, 64), Opt(O.UNROLL, 0, 4)]], ids=str)
def test_full_sum_and_max(opts):
  y = np.random.default_rng(2).standard_normal(1 << 14).astype(np.float32)
  np.testing.assert_allclose(run(A.sink(A.store(0, F(1, 1 << 14).sum())), {1: y}, opts), y.sum().reshape(1), rtol=1e-4, atol=1e-3)
  np.testing.assert_array_equal(run(A.sink(A.store(0, F(1, 1 << 14).max())), {1: y}, opts), y.max().reshape(1))


def check_matmul(M, K, N, opts, seed):
  rng = np.random.default_rng(seed)
  a, b = rng.random((M, K), dtype=np.float32), rng.random((K, N), dtype=np.float32)
  sink = A.sink(A.store(0, (F(1, M, K).reshape(M, K, 1) * F(2, K, N).reshape(1, K, N)).sum(1)))
  np.testing.assert_allclose(run(sink, {1: a, 2: b}, opts).reshape(M, N), a @ b, rtol=1e-5)


MATMUL_OPTS = [
  "none", "hand", [Opt(O.LOCAL, 0, 8), Opt(O.LOCAL, 1, 8)], [Opt(O.UPCAST, 0, 4), Opt(O.UPCAST, 1, 4), Opt(O.LOCAL, 0, 4)],
  [Opt(O.GROUP, 0, 8)], [Opt(O.GROUPTOP, 0, 16), Opt(O.LOCAL, 1, 4)], [Opt(O.UNROLL, 0, 4), Opt(O.LOCAL, 0, 16), Opt(O.UPCAST, 1, 4)],
]


@needs_device
@pytest.mark.parametrize("opts", MATMUL_OPTS, ids=str)
def test_matmul_every_opt(opts): check_matmul(64, 48, 80, opts, seed=3)


@needs_device
@pytest.mark.parametrize("opts", ["hand", [Opt(O.PADTO, 0, 32), Opt(O.LOCAL, 0, 8)], [Opt(O.PADTO, 2, 32), Opt(O.GROUP, 0, 8)],
                                  [Opt(O.PADTO, 1, 16), Opt(O.LOCAL, 1, 16), Opt(O.UPCAST, 0, 3)]], ids=str)
def test_odd_matmul_with_padding(opts): check_matmul(30, 20, 10, opts, seed=4)


@needs_device
@pytest.mark.parametrize("opts", ["none", "hand", [Opt(O.LOCAL, 0, 4)], [Opt(O.UPCAST, 0, 4), Opt(O.UNROLL, 0, 4)],
                                  [Opt(O.LOCAL, 0, 8), Opt(O.UNROLL, 0, 8)]], ids=str)
def test_softmax_like_fused_chain(opts):
  x = np.random.default_rng(5).standard_normal((16, 64)).astype(np.float32)
  X = F(1, 16, 64)
  sink = A.sink(A.store(0, (X - X.max(1, keepdims=True)).exp2().sum(1)))
  np.testing.assert_allclose(run(sink, {1: x}, opts), np.exp2(x - x.max(1, keepdims=True)).sum(1), rtol=1e-5)


@needs_device
def test_symbolic_shapes_pass_variables():
  n = kc.Variable("n", 1, 100)
  w = np.random.default_rng(6).random((4, 37), dtype=np.float32)
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (4, n)).sum(1)))
  for opts in ("none", "hand"):
    np.testing.assert_allclose(run(sink, {1: w}, opts, n=37), w.sum(1), rtol=1e-5)


@needs_device
def test_integer_and_narrow_dtypes():
  rng = np.random.default_rng(7)
  i = rng.integers(-50, 50, (8, 8)).astype(np.int32)
  I = A.arg(1, dtypes.int32, (8, 8))
  out = run(A.sink(A.store(0, (I // 3 + I % 5).sum(1))), {1: i}, "hand")
  np.testing.assert_array_equal(out, (i // 3 + i % 5).sum(1))
  x = rng.integers(-60, 60, 64).astype(np.float32)
  for dt in (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int64, dtypes.float64):
    v = np.abs(x) if dtypes.is_unsigned(dt) else x
    sink = A.sink(A.store(0, (F(1, 64).cast(dt) * A.const(2, dt, (64,))).cast(dtypes.float32)))
    np.testing.assert_array_equal(run(sink, {1: v}, "hand"), (v.astype(dt.np) * 2).astype(np.float32), err_msg=str(dt))
  l = np.array([-2**63, 2**63 - 1, 5, -7] * 4, dtype=np.int64)
  sink = A.sink(A.store(0, A.arg(1, dtypes.int64, (16,)).maximum(A.const(-2**63, dtypes.int64, (16,)))))
  np.testing.assert_array_equal(run(sink, {1: l}, "none"), l)


@needs_device
def test_bool_buffers_bitcasts_and_bfloat16():
  x = np.random.default_rng(8).standard_normal(64).astype(np.float32)
  mask = x > 0
  sink = A.sink(A.store(0, A.arg(1, dtypes.bool, (64,)).where(F(2, 64), A.const(0.0, dtypes.float32, (64,)))))
  np.testing.assert_array_equal(run(sink, {1: mask, 2: x}, "hand"), np.where(mask, x, 0))
  np.testing.assert_array_equal(run(A.sink(A.store(0, F(1, 64) < 0.0)), {1: x}, "hand"), x < 0)
  bits = x.view(np.int32)
  np.testing.assert_array_equal(run(A.sink(A.store(0, A.arg(1, dtypes.int32, (64,)).bitcast(dtypes.float32))), {1: bits}, "hand"), x)
  # bfloat16 keeps float's exponent and 8 bits of mantissa: x rounded to bf16, doubled exactly, read back as float
  sink = A.sink(A.store(0, (F(1, 64).cast(dtypes.bfloat16) * A.const(2.0, dtypes.bfloat16, (64,))).cast(dtypes.float32)))
  rounded = ((x.view(np.uint32).astype(np.uint64) + 0x7FFF + ((x.view(np.uint32) >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32)
  np.testing.assert_array_equal(run(sink, {1: x}, "hand"), rounded * 2)


H = lambda i, *shape: A.arg(i, dtypes.float16, shape)  # noqa: E731


@needs_device
@pytest.mark.parametrize("opts", ["none", "hand"])
def test_half_add_scale_and_casts_match_numpy(cl_dev, opts):
  # exact: one rounding of an exact float result is what numpy's half arithmetic does too
  rng = np.random.default_rng(9)
  x, y = (rng.standard_normal(64) * 50).astype(np.float16), (rng.standard_normal(64) * 50).astype(np.float16)
  f = (rng.standard_normal(64) * 3000).astype(np.float32)
  i = rng.integers(-70000, 70000, 64).astype(np.int32)
  sink = A.sink(A.store(0, H(4, 64) + H(5, 64)), A.store(1, H(4, 64) * 2.0), A.store(2, F(6, 64).cast(dtypes.float16)),
                A.store(3, A.arg(7, dtypes.int32, (64,)).cast(dtypes.float16)))
  with np.errstate(over="ignore"): want = [x + y, x * np.float16(2), f.astype(np.float16), i.astype(np.float16)]
  out = kc.run(sink, {4: x, 5: y, 6: f, 7: i}, device="OPENCL", opts=opts)
  for k, w in enumerate(want): np.testing.assert_array_equal(out[k], w, err_msg=f"output {k}")


@needs_device
@pytest.mark.parametrize("opts", ["none", "hand", [Opt(O.GROUPTOP, 0, 16)]], ids=str)
def test_half_sum_matches_numpy(opts):
  x = np.random.default_rng(10).standard_normal((32, 256)).astype(np.float16)
  out = run(A.sink(A.store(0, H(1, 32, 256).sum(1))), {1: x}, opts)
  assert out.dtype == np.float16
  # half reduces accumulate in float32 (kc's contract), one rounding at the end
  np.testing.assert_allclose(out, x.astype(np.float32).sum(1).astype(np.float16), rtol=2e-3, atol=2e-3)


@needs_device
@pytest.mark.parametrize("opts", ["none", "hand"])
def test_half_matmul_matches_numpy(opts):
  rng = np.random.default_rng(11)
  a, b = rng.standard_normal((48, 64)).astype(np.float16), rng.standard_normal((64, 40)).astype(np.float16)
  out = run(A.sink(A.store(0, (H(1, 48, 64).reshape(48, 64, 1) * H(2, 64, 40).reshape(1, 64, 40)).sum(1))), {1: a, 2: b}, opts)
  np.testing.assert_allclose(out.reshape(48, 40), (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16), rtol=1e-2, atol=1e-2)


@needs_device
def test_half_bitcasts_keep_the_bits(cl_dev):
  x = np.random.default_rng(12).standard_normal(64).astype(np.float16)
  bits = x.view(np.int16)
  sink = A.sink(A.store(0, H(2, 64).bitcast(dtypes.int16)), A.store(1, A.arg(3, dtypes.int16, (64,)).bitcast(dtypes.float16)))
  out = kc.run(sink, {2: x, 3: bits}, device="OPENCL")
  np.testing.assert_array_equal(out[0], bits)
  np.testing.assert_array_equal(out[1].view(np.int16), bits)


def _image_copy_sink(img, shape, read_image: bool):
  """out = 2 * in, where `in` (read_image) or `out` is an image buffer; kc.ast builds pointer buffers only."""
  st = ShapeTracker.from_shape(shape).to_uop()
  src_dt, dst_dt = (img, dtypes.float32.ptr()) if read_image else (dtypes.float32.ptr(), img)
  val = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.DEFINE_GLOBAL, src_dt, (), 1), st)) * UOp.const(dtypes.float32, 2.0)
  return UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (UOp(Ops.DEFINE_GLOBAL, dst_dt, (), 0), st, val)),))


@needs_device
def test_images_read_and_write_texels(cl_dev):
  if not cl_dev.renderer.has_images: pytest.skip(f"{cl_dev.info.name} has no image support")
  img = dtypes.imagef((4, 8, 4))
  x = np.arange(128, dtype=np.float32)
  image_in = Buffer("OPENCL", 128, dtypes.float32, options=img).copyin(x)
  np.testing.assert_array_equal(image_in.numpy(), x)  # texels hold RGBA in row-major (y, x) order, as numpy does
  for opts in ("none", "hand"):
    k = kc.compile(_image_copy_sink(img, (4, 32), read_image=True), device="OPENCL", opts=opts)
    assert "read_imagef(data1, smp" in k.program.src and "read_only image2d_t data1" in k.program.src
    out = np.zeros(128, np.float32)
    k(out, image_in)
    np.testing.assert_array_equal(out, 2 * x)
  for opts in ("none", "hand"):  # "none" still gets the required texel upcast: an image is written 4 values at a time
    k = kc.compile(_image_copy_sink(img, (4, 32), read_image=False), device="OPENCL", opts=opts)
    assert "write_imagef(data0" in k.program.src
    image_out = Buffer("OPENCL", 128, dtypes.float32, options=img).allocate()
    k(image_out, x)
    np.testing.assert_array_equal(image_out.numpy(), 2 * x)
  # a Kernel whose explicit opts leave the texel axis scalar cannot render the writes
  bare = kc.Kernel(_image_copy_sink(img, (4, 32), read_image=False), opts=cl_dev.renderer)
  with pytest.raises(CompileError, match="whole texel"): bare.to_program()


def test_images_need_image_support():
  with pytest.raises(CompileError, match="no image support"):
    kc.Kernel(_image_copy_sink(dtypes.imagef((4, 8, 4)), (4, 32), True), opts=OpenCLRenderer(fake_info(image_support=False))).to_program()


def test_cpu_devices_compute_on_float4_and_gpus_lane_by_lane():
  # PoCL's CPU device compiles a work-item's float4 arithmetic to vector instructions: the lowering keeps a matmul's
  # upcast lanes as float4 accumulators there; a GPU's renderer keeps them scalar, as before
  n = 64
  a, b = A.arg(1, dtypes.float32, (n, n)), A.arg(2, dtypes.float32, (n, n))
  sink = A.sink(A.store(0, (a.reshape(n, n, 1) * b.reshape(1, n, n)).sum(1)))
  for is_cpu in (True, False):
    r = OpenCLRenderer(fake_info(is_cpu=is_cpu))
    assert r.vector_alu is is_cpu
    k = kc.Kernel(sink, opts=r).hand_coded_optimizations()
    accs = [u for u in k.linearize() if u.op is Ops.DEFINE_ACC]
    assert accs and all(u.dtype.count == (4 if is_cpu else 1) for u in accs)


@needs_device
def test_the_opened_device_says_whether_it_is_a_cpu(cl_dev):
  import pyopencl as cl
  assert cl_dev.renderer.vector_alu is bool(cl_dev.cl_device.type & cl.device_type.CPU)


FP8_MIN_OPTS = [Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UPCAST, 0, 3)]


def _fp8_min_sink():
  a, b = A.arg(1, dtypes.fp8e4m3, (2, 6, 4)), A.arg(2, dtypes.fp8e4m3, (2, 6, 4))
  return A.sink(A.store(0, a.minimum(b)))


def test_fp8_conversions_are_calls_on_a_cpu_device():
  # PoCL builds at the first launch; 24 inlined lanes of fp8 conversions took seconds there (kc fuzz saw a 60 s "hang")
  for is_cpu in (True, False):
    src = render(_fp8_min_sink(), FP8_MIN_OPTS, OpenCLRenderer(fake_info(is_cpu=is_cpu)))
    assert ("__attribute__((noinline)) static uchar __kc_f_to_fp8e4m3" in src) is is_cpu, src[:600]


@needs_device
def test_fp8_conversions_as_calls_give_numpy_numbers():
  n, sink, opts = 48, _fp8_min_sink(), FP8_MIN_OPTS
  rng = np.random.default_rng(0)
  x, y = (rng.integers(0, 256, n, dtype=np.uint8).reshape(2, 6, 4) for _ in range(2))
  got = run(sink, {1: x, 2: y}, opts)
  fx, fy = (fp8_to_float32(v, dtypes.fp8e4m3) for v in (x, y))
  np.testing.assert_array_equal(fp8_to_float32(got, dtypes.fp8e4m3), np.where(np.isnan(fx) | np.isnan(fy), np.nan, np.minimum(fx, fy)))


@needs_device
@pytest.mark.parametrize("source_payload", [True, False])
def test_a_program_kept_as_source_or_as_binary_loads_and_runs(cl_dev, source_payload):
  # PoCL's CPU device keeps sources (reading its binary compiles every kernel once more, for nothing); every other
  # driver's binary is the payload. Either kind, from either compiler, loads and runs on the device.
  from kc_opencl.compiler import SOURCE_PAYLOAD, OpenCLCompiler, payload_source
  compiler = OpenCLCompiler(cl_dev.context, cl_dev.cl_device, cl_dev.info, cl_dev.compiler.plugin_version, source_payload=source_payload)
  lib = compiler.compile(IDS)
  assert (payload_source(lib) == IDS) is source_payload and lib.startswith(SOURCE_PAYLOAD) is source_payload
  assert compiler.cache_key(IDS) != OpenCLCompiler(cl_dev.context, cl_dev.cl_device, cl_dev.info, cl_dev.compiler.plugin_version,
                                                   source_payload=not source_payload).cache_key(IDS)
  groups, local, sizes = (Buffer("OPENCL", 8, dtypes.int32) for _ in range(3))
  cl_dev.runtime("ids", lib)(groups, local, sizes, global_size=(2, 1, 1), local_size=(4, 1, 1), vals=(7,), wait=True)
  assert groups.numpy().tolist() == [7] * 4 + [8] * 4 and local.numpy().tolist() == [0, 1, 2, 3] * 2


def test_only_pocl_cpu_devices_keep_sources():
  from kc_opencl.compiler import keeps_source
  assert keeps_source(fake_info(platform="Portable Computing Language OpenCL 3.0 PoCL 3.0", is_cpu=True))
  assert not keeps_source(fake_info(platform="Portable Computing Language OpenCL 3.0 PoCL 3.0", is_cpu=False))
  assert not keeps_source(fake_info(platform="Intel(R) OpenCL", is_cpu=True))
