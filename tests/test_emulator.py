"""The EMU device: exact dtype semantics, local memory and barriers, launch limits, impersonation, and the
errors that make it a checker (out-of-bounds accesses, skipped barriers, local races)."""
import pickle
import numpy as np
import pytest
import kc
from kc import Buffer, Kernel, Opt, OptOps, Ops, ShapeTracker, UOp, View, dtypes
from kc import ast as A
from kc.emu import (DEVICE, BarrierError, DataRaceError, EmuCompiler, EmuDevice, EmuProgram, EmuRenderer,
                    LaunchError, OutOfBoundsError, UnsupportedOpError, open_device, serialize)
from kc.runtime.plugins import PLUGIN_API_VERSION, BackendSpec
from kc.renderer.cstyle import CStyleLanguage

F = lambda i, *shape: A.arg(i, dtypes.float32, shape)  # noqa: E731
I32 = dtypes.int32


def handle_for(uops: list, name: str = "k") -> EmuProgram:
  """An EMU program from a hand-written linear UOp list, through the same compile path a Program takes."""
  dev = kc.Device[DEVICE]
  return dev.runtime(name, dev.compiler.compile(serialize(name, uops)))


def buffer(data: np.ndarray) -> Buffer:
  return Buffer(DEVICE, data.size, dtypes.from_numpy(data.dtype)).copyin(np.ascontiguousarray(data).reshape(-1))


def program_for(sink: UOp, opts=()) -> tuple[kc.Program, EmuProgram]:
  dev = kc.Device[DEVICE]
  k = Kernel(sink, dev.renderer)
  for o in opts: k.apply_opt(o)
  prg = k.to_program()
  return prg, dev.runtime(prg.name, dev.compiler.compile(prg.src))


# ---------------------------------------------------------------------------------------------------------- the device

def test_emu_is_registered_available_and_lowest_priority():
  assert DEVICE in kc.Device.names() and DEVICE in kc.Device.available()
  assert kc.Device.names()[-1] == DEVICE  # never the default while a real device can open
  assert kc.Device.spec(DEVICE).distribution == "kc-core"


def test_generic_renderer_declares_a_gpu_like_target(emu):
  r = emu.renderer
  assert isinstance(r, EmuRenderer) and emu.impersonating is None
  assert (r.has_local, r.has_shared, r.supports_float4) == (True, True, True)
  assert r.global_max == (65535, 65535, 65535) and r.local_max == (256, 256, 64) and r.shared_max == 32768
  assert kc.Device.renderer(DEVICE) is r


def test_source_is_a_readable_listing_that_compiles_back(emu):
  prg, _ = program_for(A.sink(A.store(0, F(1, 8, 16).sum(1))), [Opt(OptOps.GROUPTOP, 0, 4)])
  assert prg.src.startswith(f"# EMU program {prg.name}") and "DEFINE_LOCAL" in prg.src and "BARRIER" in prg.src
  assert prg.device == DEVICE and prg.local_size is not None


def test_compiler_rejects_what_is_not_an_emu_program():
  with pytest.raises(kc.CompileError, match="not an EMU program"): EmuCompiler().compile("void k() {}")
  with pytest.raises(kc.CompileError, match="damaged"): EmuCompiler().compile("kc-emu-1 !!!not base64!!!")
  # a payload that would call anything but UOp and dtype constructors is refused, never executed
  import base64, os, zlib
  evil = base64.b64encode(zlib.compress(pickle.dumps(os.getcwd))).decode()
  with pytest.raises(kc.CompileError, match="may only hold UOps"): EmuCompiler().compile(f"kc-emu-1 {evil}")


def test_an_op_emu_does_not_know_is_a_typed_error_naming_it():
  x = UOp.const(dtypes.float32, 1.0)
  uops = [x, UOp(Ops.CONTRACT, dtypes.float32, (x,), ())]
  with pytest.raises(UnsupportedOpError, match=r"uop 1 \(CONTRACT") as e: EmuCompiler().compile(serialize("strange", uops))
  assert "kernel strange" in str(e.value) and isinstance(e.value, kc.CompileError)


# ---------------------------------------------------------------------------------------------------------- results

def test_elementwise_and_reductions_match_numpy(emu):
  rng = np.random.default_rng(0)
  x = rng.random((16, 64), dtype=np.float32)
  got = kc.run(A.sink(A.store(0, (F(1, 16, 64) * 2.0 + 1.0).sum(1))), {1: x}, device=DEVICE)[0]
  np.testing.assert_allclose(got.reshape(-1), (x * 2 + 1).sum(1), rtol=1e-5)


@pytest.mark.parametrize("opts", [[Opt(OptOps.GROUP, 0, 8)], [Opt(OptOps.GROUPTOP, 0, 16)], [Opt(OptOps.GROUPTOP, 0, 16), Opt(OptOps.LOCAL, 0, 4)],
                                  [Opt(OptOps.GROUP, 0, 4), Opt(OptOps.GROUP, 0, 4)], [Opt(OptOps.GROUP, 0, 4), Opt(OptOps.UPCAST, 0, 2)]],
                         ids=["group8", "grouptop16", "grouptop16-local4", "group4x2", "group4-upcast2"])
def test_grouped_reductions_go_through_local_memory(emu, opts):
  rng = np.random.default_rng(1)
  x = rng.standard_normal((8, 64)).astype(np.float32)
  sink = A.sink(A.store(0, F(1, 8, 64).sum(1)))
  prg, _ = program_for(sink, opts)
  assert any(u.op is Ops.DEFINE_LOCAL for u in prg.uops) and any(u.op is Ops.BARRIER for u in prg.uops)
  got = kc.run(sink, {1: x}, device=DEVICE, opts=opts)[0]
  np.testing.assert_allclose(got.reshape(-1), x.sum(1), rtol=1e-5, atol=1e-5)


def test_grouped_max_reduction(emu):
  x = np.random.default_rng(2).standard_normal((6, 48)).astype(np.float32)
  got = kc.run(A.sink(A.store(0, F(1, 6, 48).max(1))), {1: x}, device=DEVICE, opts=[Opt(OptOps.GROUPTOP, 0, 16)])[0]
  np.testing.assert_array_equal(got.reshape(-1), x.max(1))


@pytest.mark.parametrize("impersonate", [None, "CLANG"])
def test_matmul_64(emu, impersonate):
  emu.impersonate(impersonate)
  rng = np.random.default_rng(3)
  a, b = rng.random((64, 64), dtype=np.float32), rng.random((64, 64), dtype=np.float32)
  sink = A.sink(A.store(0, (F(1, 64, 64).reshape(64, 64, 1) * F(2, 64, 64).reshape(1, 64, 64)).sum(1)))
  for opts in ("none", "hand"):
    got = kc.run(sink, {1: a, 2: b}, device=DEVICE, opts=opts)[0]
    np.testing.assert_allclose(got.reshape(64, 64), a @ b, rtol=1e-5)


def test_output_loops_of_a_cpu_lowering_run_as_lanes(emu):
  # CLANG's lowering loops over the output axes; their iterations are independent, so EMU runs them side by side
  emu.impersonate("CLANG")
  prg, handle = program_for(A.sink(A.store(0, (F(1, 8, 16, 4).permute(1, 0, 2) * 2.0).sum(2))), ())
  assert [prg.uops[pc].arg[1] for pc in handle.plan.parallel_loops] == [0, 0]
  reduce_loop = [pc for pc, u in enumerate(prg.uops) if u.op is Ops.RANGE and pc not in handle.plan.parallel_loops]
  assert len(reduce_loop) == 1  # the reduce runs as a loop: its accumulator carries from one iteration to the next


def test_every_e2e_case_lowered_for_clang_runs_on_emu(emu):
  # the shared end-to-end catalogue, lowered exactly as CLANG lowers it, checked numerically by EMU
  from kc_conformance.capabilities import capability_set, declared
  from kc_conformance.checks import judge, needs_of, render
  from kc_conformance.corpus import CASES, setup_of
  from kc_conformance.harness import launch
  from kc_conformance.specs import SPECS
  emu.impersonate("CLANG")
  have = capability_set(declared(emu.renderer))
  for name, case in CASES.items():
    for spec in ("none", "hand"):
      if needs_of(case, setup_of(name), SPECS[spec]) - have: continue  # images: CLANG declares none
      setup, prg = render(case, SPECS[spec], emu.renderer)
      verdict = judge(case, setup, launch(DEVICE, prg, setup))
      assert verdict.ok, f"{name} with {spec}: {verdict.reason}"


# ---------------------------------------------------------------------------------------------------------- dtype semantics

def run1(expr, inputs: dict, out_dtype=None) -> np.ndarray:
  return kc.run(A.sink(A.store(0, expr)), inputs, device=DEVICE, opts="none")[0].reshape(-1)


def test_int32_wraps_around(emu):
  a = np.array([2**31 - 1, -2**31, 123456789], np.int32)
  got = run1(A.arg(1, I32, (3,)) + 1, {1: a})
  np.testing.assert_array_equal(got, (a.astype(np.int64) + 1).astype(np.int32))
  got = run1(A.arg(1, I32, (3,)) * 3, {1: a})
  np.testing.assert_array_equal(got, (a.astype(np.int64) * 3).astype(np.int32))


def test_int8_and_uint8_wrap_around(emu):
  a = np.array([127, -128, 100], np.int8)
  np.testing.assert_array_equal(run1(A.arg(1, dtypes.int8, (3,)) * 2, {1: a}), np.array([-2, 0, -56], np.int8))
  u = np.array([250, 3, 0], np.uint8)
  np.testing.assert_array_equal(run1(A.arg(1, dtypes.uint8, (3,)) + 10, {1: u}), np.array([4, 13, 10], np.uint8))


def test_integer_division_floors_like_numpy(emu):
  # the IR's IDIV/MOD truncate as C does (tests/test_semantics.py); kc.ast's // and % are numpy's
  a = np.array([-7, 7, -7, 7, -1, 0, 5], np.int32)
  b = np.array([2, -2, -2, 2, 3, 5, 0], np.int32)
  x, y = A.arg(1, I32, (7,)), A.arg(2, I32, (7,))
  np.testing.assert_array_equal(run1(x // y, {1: a, 2: b}), [-4, -4, 3, 3, -1, 0, 0])
  np.testing.assert_array_equal(run1(x % y, {1: a, 2: b}), [1, -1, -1, 1, 2, 0, 0])


def test_float16_rounds_every_operation(emu):
  a = np.array([2048.0, 1.0 / 3.0, 65504.0, 1e-4], np.float16)
  got = run1(A.arg(1, dtypes.float16, (4,)) + 1.0, {1: a})
  want = a + np.float16(1.0)  # 2048 + 1 is 2048 in half; 65504 + 1 stays 65504
  np.testing.assert_array_equal(got, want)
  assert got[0] == 2048.0
  f = np.array([1.0 / 3.0, 65519.0, 1e-8, 0.1], np.float32)  # 65519 still rounds down to 65504
  np.testing.assert_array_equal(run1(F(1, 4).cast(dtypes.float16), {1: f}), f.astype(np.float16))


def test_float_to_int_casts_truncate_and_bools_test_nonzero(emu):
  f = np.array([-2.7, -0.5, 0.0, 0.5, 2.7, 1e3], np.float32)
  np.testing.assert_array_equal(run1(F(1, 6).cast(I32), {1: f}), [-2, 0, 0, 0, 2, 1000])
  np.testing.assert_array_equal(run1(F(1, 6).cast(dtypes.bool), {1: f}), f != 0)


def test_bitcast_reinterprets_bits(emu):
  f = np.array([1.0, -2.5, 0.0, np.inf], np.float32)
  np.testing.assert_array_equal(run1(F(1, 4).bitcast(I32), {1: f}), f.view(np.int32))
  i = f.view(np.int32)
  np.testing.assert_array_equal(run1(A.arg(1, I32, (4,)).bitcast(dtypes.float32), {1: i}).view(np.int32), i)


def test_bfloat16_rounds_to_nearest_even(emu):
  # 1 + 2^-8 is halfway between two bfloat16s (1 and 1 + 2^-7): ties go to the even one, 1
  f = np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, 3.14159, -1e30, np.nan], np.float32)
  out = Buffer(DEVICE, 5, dtypes.bfloat16)
  k = kc.compile(A.sink(A.store(0, F(1, 5).cast(dtypes.bfloat16))), device=DEVICE, opts="none")
  k(out, buffer(f))
  raw = bytearray(10)
  out.copyout(memoryview(raw))
  bits = np.frombuffer(raw, np.uint16)
  assert bits[0] == 0x3F80 and bits[1] == 0x3F82  # 1.0, and 1 + 3*2^-8 rounded up to 1 + 2^-6
  assert bits[2] == 0x4049 and bits[3] == (np.float32(-1e30).view(np.uint32) + 0x8000) >> 16
  assert (bits[4] & 0x7F80) == 0x7F80 and (bits[4] & 0x7F) != 0  # still a NaN


def test_max_propagates_nan_like_numpy(emu):
  a = np.array([np.nan, 1.0, np.nan, 2.0], np.float32)
  b = np.array([1.0, np.nan, np.nan, 3.0], np.float32)
  np.testing.assert_array_equal(run1(F(1, 4).maximum(F(2, 4)), {1: a, 2: b}), np.maximum(a, b))


def test_vector_loads_and_stores(emu):
  x = np.arange(32, dtype=np.float32)
  sink = A.sink(A.store(0, F(1, 8, 4) * 2.0))
  prg, _ = program_for(sink, [Opt(OptOps.UPCAST, 0, 4)])
  assert any(u.op is Ops.LOAD and u.dtype.count == 4 for u in prg.uops)  # float4 folding happened
  got = kc.run(sink, {1: x.reshape(8, 4)}, device=DEVICE, opts=[Opt(OptOps.UPCAST, 0, 4)])[0]
  np.testing.assert_array_equal(got.reshape(-1), x * 2)


# ---------------------------------------------------------------------------------------------------------- launch limits

class SmallGPU(CStyleLanguage):
  """A GPU with tiny launch limits, so global dims must be split and merged to fit."""
  device = "SMALLGPU"
  has_local, has_shared = True, True
  global_max, local_max, shared_max = (8, 8, 8), (4, 4, 4), 1024
  barrier = "barrier();"
  code_for_workitem = {"g": lambda d: f"gid({d})", "l": lambda d: f"lid({d})", "i": lambda d: f"id({d})"}


@pytest.fixture
def small_gpu():
  kc.runtime.plugins.register(BackendSpec("SMALLGPU", PLUGIN_API_VERSION, -2000, lambda: "no such hardware", lambda: None, renderer=SmallGPU))
  yield "SMALLGPU"
  kc.runtime.plugins.unregister("SMALLGPU")


def test_global_dims_are_split_to_fit_a_small_global_max(emu, small_gpu):
  emu.impersonate(small_gpu)
  assert emu.impersonating == "SMALLGPU" and emu.renderer.global_max == (8, 8, 8) and emu.renderer.local_max == (4, 4, 4)
  x = np.random.default_rng(4).random((16, 32), dtype=np.float32)
  sink = A.sink(A.store(0, F(1, 16, 32) * 3.0 - 1.0))
  for opts in ("none", "hand", [Opt(OptOps.LOCAL, 0, 4)]):
    k = kc.compile(sink, device=DEVICE, opts=opts)
    assert all(g <= 8 for g in k.program.global_size)
    if opts == "none": assert sorted(k.program.global_size) == [8, 8, 8]  # 512 work-groups: one dim of 512 split in three
    out = np.zeros((16, 32), np.float32)
    k(out, x)
    np.testing.assert_allclose(out, x * 3 - 1, rtol=1e-6)


def test_launch_beyond_the_renderer_limits_is_refused(emu, small_gpu):
  emu.impersonate(small_gpu)
  prg, handle = program_for(A.sink(A.store(0, F(1, 8) + 1.0)))
  x, out = buffer(np.zeros(8, np.float32)), Buffer(DEVICE, 8, dtypes.float32)
  with pytest.raises(LaunchError, match="counts 8"):  # the launch must give the sizes the SPECIALs count
    handle(out, x, global_size=[4, 1, 1], local_size=prg.local_size)
  # a kernel without SPECIALs launched over more work-groups than the impersonated renderer allows
  dst = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(), (), 0)
  st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, dst.dtype, (dst, UOp.const(I32, 0))), UOp.const(dtypes.float32, 1.0)))
  wide = handle_for([dst, st.src[0].src[1], st.src[0], st.src[1], st], "wide")
  wide(out, global_size=[8, 1, 1], local_size=[4, 1, 1])
  with pytest.raises(LaunchError, match=r"kernel wide: global size \[16, 1, 1\] exceeds the global_max \(8, 8, 8\) of the SMALLGPU renderer"):
    wide(out, global_size=[16, 1, 1], local_size=[4, 1, 1])
  with pytest.raises(LaunchError, match="local_max"): wide(out, global_size=[1, 1, 1], local_size=[8, 1, 1])


def test_local_memory_beyond_shared_max_is_refused():
  loc = UOp(Ops.DEFINE_LOCAL, dtypes.float32.ptr(local=True, size=16384), (), ("temp0", 16384))
  dev = EmuDevice()
  with pytest.raises(LaunchError, match="65536 bytes of local memory, more than the shared_max 32768 of the EMU renderer"):
    dev.runtime("big", dev.compiler.compile(serialize("big", [loc])))


# ---------------------------------------------------------------------------------------------------------- impersonation

def test_impersonating_clang_lowers_with_its_renderer(emu):
  emu.impersonate("CLANG")
  assert emu.impersonating == "CLANG" and emu.renderer.has_local is False and emu.renderer.global_max is None
  assert emu.renderer.device == DEVICE and kc.Device.renderer(DEVICE) is emu.renderer
  x = np.random.default_rng(5).random((5, 7), dtype=np.float32)
  k = kc.compile(A.sink(A.store(0, F(1, 5, 7).sum(1))), device=DEVICE)
  assert not any(u.op is Ops.SPECIAL for u in k.program.uops)  # loops, as CLANG would run them
  with pytest.raises(kc.KernelOptError):
    kc.compile(A.sink(A.store(0, F(1, 5, 8) * 2.0)), device=DEVICE, opts=[Opt(OptOps.LOCAL, 0, 2)])
  out = np.zeros((5, 1), np.float32)
  k(out, x)
  np.testing.assert_allclose(out.reshape(-1), x.sum(1), rtol=1e-6)


def test_impersonation_runs_the_exact_uops_the_impersonated_renderer_gets(emu):
  sink = A.sink(A.store(0, F(1, 4, 8).sum(1).sqrt()))
  clang_uops = Kernel(sink, kc.Device.renderer("CLANG")).hand_coded_optimizations().to_program().uops
  emu.impersonate("CLANG")
  assert Kernel(sink, emu.renderer).hand_coded_optimizations().to_program().uops == clang_uops


def test_impersonating_an_unknown_device_or_itself_is_an_error(emu):
  with pytest.raises(kc.KcError, match="NOPE"): emu.impersonate("NOPE")
  with pytest.raises(kc.KcError, match="itself"): emu.impersonate("emu")
  assert emu.impersonating is None
  emu.impersonate("CLANG").impersonate(None)
  assert isinstance(emu.renderer, EmuRenderer) and emu.impersonating is None


def test_kc_emulate_picks_the_renderer_when_the_device_opens(monkeypatch):
  monkeypatch.setenv("KC_EMULATE", "clang")
  assert open_device().impersonating == "CLANG"
  monkeypatch.setenv("KC_EMULATE", "")
  assert open_device().impersonating is None
  monkeypatch.setenv("KC_EMULATE", "NOPE")
  with pytest.raises(kc.KcError, match="cannot impersonate 'NOPE'"): open_device()


# ---------------------------------------------------------------------------------------------------------- the checker

def test_an_ast_reading_out_of_bounds_is_caught(emu):
  # a hand-made view that starts 4 elements into its buffer: 8 reads reach element 11
  view = ShapeTracker((View.create((8,), (1,), offset=4),))
  load = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(), (), 1), view.to_uop()))
  sink = A.sink(A.store(0, A.Expr(load, (8,)) + 1.0))
  prg, handle = program_for(sink)
  x, out = buffer(np.arange(8, dtype=np.float32)), Buffer(DEVICE, 8, dtypes.float32)
  with pytest.raises(OutOfBoundsError) as e:
    handle(out, x, global_size=prg.global_size, local_size=prg.local_size)
  msg = str(e.value)
  assert f"kernel {prg.name}" in msg and "LOAD" in msg and "data1" in msg and "element 8" in msg and "0..7" in msg


def test_a_store_out_of_bounds_is_caught(emu):
  prg, handle = program_for(A.sink(A.store(0, F(1, 16) * 2.0)))
  x, out = buffer(np.zeros(16, np.float32)), Buffer(DEVICE, 10, dtypes.float32)
  with pytest.raises(OutOfBoundsError, match=rf"kernel {prg.name}: uop \d+ \(STORE.*writes element 1\d of data0"):
    handle(out, x, global_size=prg.global_size, local_size=prg.local_size)


def test_gated_off_lanes_are_not_checked(emu):
  # padding reads nothing where it pads: the gated-off loads may point anywhere
  x = np.arange(4, dtype=np.float32)
  got = kc.run(A.sink(A.store(0, F(1, 4).pad(((3, 5),)) + 1.0)), {1: x}, device=DEVICE)[0]
  np.testing.assert_array_equal(got, np.pad(x, (3, 5)) + 1)


def _lane_program(body) -> list:
  """A kernel of 8 threads in one work-group: data0 (float32) and the thread index, then `body(out, lid)`."""
  out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(), (), 0)
  lid = UOp(Ops.SPECIAL, I32, (), ("lidx0", 8))
  return [out, lid, *body(out, lid)]


def _run_lanes(uops, n_out=8) -> np.ndarray:
  out = Buffer(DEVICE, n_out, dtypes.float32).allocate()
  handle_for(uops, "lanes")(out, global_size=[1, 1, 1], local_size=[8, 1, 1])
  return out.numpy()


def _local(size):
  return UOp(Ops.DEFINE_LOCAL, dtypes.float32.ptr(local=True, size=size), (), ("temp0", size))


def test_a_local_buffer_used_beyond_its_declared_size_is_caught(emu):
  def body(out, lid):
    loc = _local(4)
    st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, loc.dtype, (loc, lid)), lid.cast(dtypes.float32)))
    return [loc, lid.cast(dtypes.float32), UOp(Ops.INDEX, loc.dtype, (loc, lid)), st]
  with pytest.raises(OutOfBoundsError, match=r"kernel lanes: uop \d+ \(STORE.*writes element 4 of local temp0 \(4 x float32\).*thread \(4,0,0\)"):
    _run_lanes(_lane_program(body))


def _exchange(with_barrier: bool):
  """Each thread writes its index to local memory and reads its neighbour's."""
  def body(out, lid):
    loc = _local(8)
    val = lid.cast(dtypes.float32)
    st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, loc.dtype, (loc, lid)), val))
    nxt = (lid + 1) % 8
    bar = UOp(Ops.BARRIER, dtypes.void, (st,))
    ld = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, loc.dtype, (loc, nxt)),) + ((bar,) if with_barrier else ()))
    one, eight = UOp.const(I32, 1), UOp.const(I32, 8)
    out_st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, lid)), ld))
    return [loc, val, st.src[0], st, *([bar] if with_barrier else []), one, lid + 1, eight, nxt, ld.src[0], ld, out_st.src[0], out_st]
  return _lane_program(body)


def test_local_memory_is_shared_by_the_threads_of_a_group(emu):
  np.testing.assert_array_equal(_run_lanes(_exchange(with_barrier=True)), (np.arange(8) + 1) % 8)


def test_a_missing_barrier_is_a_race(emu):
  with pytest.raises(DataRaceError, match="wrote with no BARRIER in between"): _run_lanes(_exchange(with_barrier=False))


def test_reading_local_memory_nobody_wrote_is_caught(emu):
  def body(out, lid):
    loc = _local(8)
    ld = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, loc.dtype, (loc, lid)),))
    st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, lid)), ld))
    return [loc, ld.src[0], ld, st.src[0], st]
  with pytest.raises(DataRaceError, match="which no thread of the work-group wrote"): _run_lanes(_lane_program(body))


def test_a_thread_that_skips_a_barrier_its_group_reaches_is_caught(emu):
  def body(out, lid):
    four = UOp.const(I32, 4)
    gate = lid < four
    iff = UOp(Ops.IF, dtypes.void, (gate,))
    return [four, gate, iff, UOp(Ops.BARRIER, dtypes.void, ()), UOp(Ops.ENDIF, dtypes.void, (iff,))]
  with pytest.raises(BarrierError, match=r"kernel lanes: uop \d+ \(BARRIER.*thread \(0,0,0\) reaches the BARRIER but .*thread \(4,0,0\)"):
    _run_lanes(_lane_program(body))


def test_a_barrier_every_thread_skips_is_fine(emu):
  def body(out, lid):
    zero = UOp.const(I32, 0)
    gate = lid < zero
    iff = UOp(Ops.IF, dtypes.void, (gate,))
    st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, lid)), UOp.const(dtypes.float32, 7.0)))
    return [zero, gate, iff, UOp(Ops.BARRIER, dtypes.void, ()), UOp(Ops.ENDIF, dtypes.void, (iff,)), st.src[1], st.src[0], st]
  np.testing.assert_array_equal(_run_lanes(_lane_program(body)), np.full(8, 7.0, np.float32))


def test_threads_storing_different_values_to_one_element_race(emu):
  def body(out, lid):
    zero = UOp.const(I32, 0)
    st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, zero)), lid.cast(dtypes.float32)))
    return [zero, st.src[1], st.src[0], st]
  with pytest.raises(DataRaceError, match="store different values to element 0 of data0"): _run_lanes(_lane_program(body))


def test_integer_division_by_zero_is_zero_as_in_numpy(emu):
  # kc defines x // 0 == x % 0 == 0 (numpy's answer) and every backend renders it, so EMU computes it too
  a, b = np.array([4, -5, 7, -2**31], np.int32), np.array([2, 0, 0, -1], np.int32)
  x, y = A.arg(2, I32, (4,)), A.arg(3, I32, (4,))
  out = kc.run(A.sink(A.store(0, x // y), A.store(1, x % y)), {2: a, 3: b}, device=DEVICE)
  np.testing.assert_array_equal(out[0], np.array([2, 0, 0, -2**31], np.int32))
  np.testing.assert_array_equal(out[1], np.zeros(4, np.int32))


def _per_thread_loop(with_barrier: bool):
  """out[lid] = 0 + 1 + ... + (lid-1): a loop whose bound differs per thread, so threads leave it one by one."""
  def body(out, lid):
    zero, zerof = UOp.const(I32, 0), UOp.const(dtypes.float32, 0.0)
    rng = UOp(Ops.RANGE, I32, (zero, lid), (0, 1))
    acc = UOp(Ops.DEFINE_ACC, dtypes.float32, (zerof, rng), (0,))
    step = acc + rng.cast(dtypes.float32)
    assign = UOp(Ops.ASSIGN, dtypes.float32, (acc, step))
    st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, lid)), assign))
    inner = [UOp(Ops.BARRIER, dtypes.void, ())] if with_barrier else []
    return [zero, zerof, acc, rng, *inner, step.src[1], step, assign, UOp(Ops.ENDRANGE, dtypes.void, (rng,)), st.src[0], st]
  return _lane_program(body)


def test_loops_whose_bounds_differ_per_thread(emu):
  lid = np.arange(8)
  np.testing.assert_array_equal(_run_lanes(_per_thread_loop(with_barrier=False)), lid * (lid - 1) / 2)


def test_a_barrier_in_a_loop_some_threads_left_is_caught(emu):
  with pytest.raises(BarrierError, match="skips it"): _run_lanes(_per_thread_loop(with_barrier=True))


def test_uops_that_repeat_in_the_list_are_followed_by_position(emu):
  # the linearizer emits one IF block per gated store, and the same gate makes the same (hash-consed) IF UOp
  x = np.arange(20, dtype=np.float32)
  sink = A.sink(A.store(0, F(2, 20) + 1.0), A.store(1, F(2, 20) * 2.0))
  prg, _ = program_for(sink, [Opt(OptOps.PADTO, 0, 32)])
  ifs = [u for u in prg.uops if u.op is Ops.IF]
  assert len(ifs) == 2 and ifs[0] is ifs[1]
  outs = kc.run(sink, {2: x}, device=DEVICE, opts=[Opt(OptOps.PADTO, 0, 32)])
  np.testing.assert_array_equal(outs[0], x + 1)
  np.testing.assert_array_equal(outs[1], x * 2)


# ***** tensor cores: WMMA with the fragment layout of the built-in tensor cores *****

def _tc_matmul(dt, M, K, N):
  a, b = A.arg(1, dt, (M, K)), A.arg(2, dt, (K, N))
  prod = a.reshape(M, K, 1) * b.reshape(1, K, N)
  if dt != dtypes.float: prod = prod.cast(dtypes.float)
  return A.sink(A.store(0, prod.sum(1)))


def _run_kernel_on_emu(k, *arrays):
  dev = kc.Device["EMU"]
  prg = k.to_program()
  bufs = [kc.Buffer("EMU", a.size, dtypes.from_numpy(a.dtype)).allocate().copyin(np.ascontiguousarray(a)) for a in arrays]
  g, l = prg.launch_dims({})
  dev.runtime(prg.name, dev.compiler.compile(prg.src))(*[bufs[i] for i in prg.globals], global_size=g, local_size=l)
  return bufs[0].numpy()


@pytest.mark.parametrize("level", [1, 2, 3])
@pytest.mark.parametrize("dt,M,K,N", [(dtypes.float, 8, 8, 8), (dtypes.half, 16, 16, 16), (dtypes.half, 30, 22, 18), (dtypes.float, 6, 10, 4)])
@pytest.mark.parametrize("follow_ups", ["bare", "hand"])
def test_tensor_core_matmul_matches_numpy(level, dt, M, K, N, follow_ups):
  k = kc.Kernel(_tc_matmul(dt, M, K, N), kc.Device["EMU"].renderer)
  assert k.apply_tensor_cores(level, tc_opt=2, extra_opts=[] if follow_ups == "bare" else None)
  assert (any(u.op is kc.Ops.WMMA for u in k.get_optimized_ast().toposort)) == (level == 1)
  rng = np.random.default_rng(0)
  x, y = rng.standard_normal((M, K)).astype(dt.np), rng.standard_normal((K, N)).astype(dt.np)
  out = _run_kernel_on_emu(k, np.zeros(M * N, np.float32), x, y).reshape(M, N)
  want = x.astype(np.float32) @ y.astype(np.float32)
  # level 1 multiplies in the accumulator's precision (as the hardware does); 2 and 3 round each half product first
  tol = 1e-5 if level == 1 or dt == dtypes.float else 4e-3
  assert np.allclose(out, want, atol=tol * np.abs(want).max(), rtol=0)


def test_a_warp_split_by_a_gate_is_an_error():
  # a hand-made WMMA inside an IF that only some threads of the warp take
  from kc.emu import EmuProgram, serialize
  from kc.emu import BUILTIN_TENSOR_CORES
  from kc.renderer import WMMAArg
  tc = BUILTIN_TENSOR_CORES[1]
  lid = kc.UOp(kc.Ops.SPECIAL, dtypes.int32, (), ("lidx0", 4))
  x = kc.UOp.const(dtypes.float.vec(2), 1.0)
  gate = lid < 2
  wmma = kc.UOp(kc.Ops.WMMA, dtypes.float, (x, x, kc.UOp.const(dtypes.float, 0.0)),
                WMMAArg(str(tc), tc.dims, tc.dtype_in, tc.dtype_out, "EMU", 4, (((3, 2),), ((3, 2),), ()), (3,)))
  buf = kc.UOp(kc.Ops.DEFINE_GLOBAL, dtypes.float.ptr(), (), 0)
  st = kc.UOp(kc.Ops.STORE, dtypes.void, (kc.UOp(kc.Ops.INDEX, buf.dtype, (buf, lid, gate)), wmma))
  iff = kc.UOp(kc.Ops.IF, dtypes.void, (gate,))
  uops = [buf, lid, kc.UOp.const(dtypes.int32, 2), gate, iff, kc.UOp.const(dtypes.float, 1.0), x, kc.UOp.const(dtypes.float, 0.0), wmma,
          kc.UOp(kc.Ops.INDEX, buf.dtype, (buf, lid, gate)), st, kc.UOp(kc.Ops.ENDIF, dtypes.void, (iff,))]
  from kc.emu import Limits, BarrierError
  prg = EmuProgram("split_warp", EmuCompiler().compile(serialize("split_warp", uops)),
                   Limits("EMU", None, (4, 1, 1), 1024, tuple(BUILTIN_TENSOR_CORES)))
  out = kc.Buffer("EMU", 4, dtypes.float).allocate()
  with pytest.raises(BarrierError, match="only some threads of a warp"): prg(out, global_size=(1, 1, 1), local_size=(4, 1, 1))


def test_impersonation_does_not_claim_images():
  from kc.emu import impersonating
  from kc.renderer.cstyle import CStyleLanguage
  class WithImages(CStyleLanguage):
    device = "IMG"
    has_images = True
  r = impersonating(WithImages())
  assert r.has_images is False and r.impersonates == "IMG" and r.device == "EMU"
