"""Code generation that used to give wrong answers or fail late: chains of reduces over different axes (loop
nesting), outputs of one size but different shapes, tensor cores with an extra UNROLL, the matvec heuristic on
size-1 reduces, zero-size work, buffers read through another view than they are written with or with two dtypes,
work-groups beyond the device's size. Numbers are checked against numpy on every device that opens here."""
import random
import numpy as np
import pytest
import kc
from kc.schedule import schedule
from kc import ast as A, dtypes, Ops, UOp, ShapeTracker, InvalidASTError, KernelOptError
from kc import Kernel
from kc.kernel import Opt, OptOps
from kc.codegen import verify_ast

f32 = dtypes.float32


def _opencl_reason():
  try:
    import kc_opencl
    return kc_opencl.unavailable_reason()
  except ImportError as e: return str(e)


DEVICES = ["CLANG", "EMU", pytest.param("OPENCL", marks=pytest.mark.skipif(_opencl_reason() is not None, reason="no OpenCL device"))]
X = lambda *s, i=1, dt=f32: A.arg(i, dt, s)  # noqa: E731


def rand(*shape, seed=0): return np.random.default_rng(seed).uniform(0.5, 1.5, shape).astype(np.float32)


def run(sink, inputs, device, opts="none"): return kc.run(sink, inputs, device=device, opts=opts)[0]


# ***** 1. reduces of reduces *****

CHAINS = {
  "sum0.sum1": ((2, 3), lambda x: x.sum(0, keepdims=True).sum(1, keepdims=True), lambda a: a.sum(0, keepdims=True).sum(1, keepdims=True)),
  "max0.sum1": ((4, 6), lambda x: x.max(0, keepdims=True).sum(1, keepdims=True), lambda a: a.max(0, keepdims=True).sum(1, keepdims=True)),
  "prod0.sum1": ((3, 5), lambda x: x.prod(0, keepdims=True).sum(1, keepdims=True), lambda a: a.prod(0, keepdims=True).sum(1, keepdims=True)),
  "max02.sum13": ((2, 2, 2, 4), lambda x: x.max((0, 2), keepdims=True).sum((1, 3), keepdims=True),
                  lambda a: a.max((0, 2), keepdims=True).sum((1, 3), keepdims=True)),
  "sum01+sum1": ((4, 2), lambda x: x.sum((0, 1), keepdims=True) + x.sum(1, keepdims=True), lambda a: a.sum() + a.sum(1, keepdims=True)),
  "(x-sum1).max0": ((3, 4), lambda x: (x - x.sum(1, keepdims=True)).max(0, keepdims=True),
                    lambda a: (a - a.sum(1, keepdims=True)).max(0, keepdims=True)),
}


def _chain(name):
  shape, build, ref = CHAINS[name]
  a = rand(*shape)
  return A.sink(A.store(0, build(X(*shape)))), a, ref(a)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CHAINS))
@pytest.mark.parametrize("opts", ["none", "hand", [Opt(OptOps.UNROLL, 0, 0)], [Opt(OptOps.UNROLL, 1, 0)]], ids=str)
def test_reduce_of_reduce(name, opts, device):
  sink, a, ref = _chain(name)
  try: got = run(sink, {1: a}, device, opts)
  except KernelOptError: return  # an opt list that does not fit this kernel is refused before anything runs
  np.testing.assert_allclose(got.reshape(-1), ref.reshape(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_every_single_opt_on_reduce_chains(device):
  """Every opt that applies to a chain gives numpy's answer (the rest are refused by the Kernel)."""
  ren = kc.Device[device].renderer
  for name in ("max0.sum1", "max02.sum13", "(x-sum1).max0"):
    sink, a, ref = _chain(name)
    for op in (OptOps.UPCAST, OptOps.UNROLL, OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.PADTO):
      for axis in range(3):
        for amt in (0, 2, 3, 4):
          try: Kernel(sink, ren).apply_opt(Opt(op, axis, amt))
          except KernelOptError: continue
          got = run(sink, {1: a}, device, [Opt(op, axis, amt)])
          np.testing.assert_allclose(got.reshape(-1), ref.reshape(-1), rtol=1e-5, atol=1e-5, err_msg=f"{name} {Opt(op, axis, amt)}")


def test_group_of_a_reduce_chain_is_refused():
  k = Kernel(A.sink(A.store(0, X(4, 16).sum(0, keepdims=True).sum(1, keepdims=True))), kc.Device["EMU"].renderer)
  with pytest.raises(KernelOptError, match="can't group a kernel with 2 reduces"): k.apply_opt(Opt(OptOps.GROUP, 0, 4))


NP_REDUCE = {"sum": np.sum, "max": np.max, "prod": np.prod}


def _random_chain(rng: random.Random):
  nd = rng.randint(1, 4)
  shape = tuple(rng.randint(1, 5) for _ in range(nd))
  steps = [(rng.choice(list(NP_REDUCE)), tuple(sorted(rng.sample(range(nd), rng.randint(1, nd)))), rng.choice(["", "add", "mul", "sub"]))
           for _ in range(rng.randint(2, 3))]
  x = X(*shape)
  e = x
  for op, axes, mid in steps:
    e = e + 0.5 if mid == "add" else e * x if mid == "mul" else e - x.max(axes[0], keepdims=True) if mid == "sub" else e
    e = getattr(e, op)(axes, keepdims=True)

  def ref(a):
    r = a
    for op, axes, mid in steps:
      r = r + np.float32(0.5) if mid == "add" else r * a if mid == "mul" else r - a.max(axes[0], keepdims=True) if mid == "sub" else r
      r = NP_REDUCE[op](r, axis=axes, keepdims=True)
    return r
  return shape, A.sink(A.store(0, e)), ref


def _random_opts(k: Kernel, rng: random.Random) -> list:
  for _ in range(12):
    if len(k.applied_opts) >= 3: break
    try: k.apply_opt(Opt(rng.choice([OptOps.UPCAST, OptOps.UNROLL, OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.PADTO]),
                         rng.randint(0, 3), rng.choice([0, 2, 3, 4])))
    except KernelOptError: pass
  return list(k.applied_opts)


@pytest.mark.parametrize("device", ["CLANG", "EMU"])
def test_random_reduce_chains_with_random_opts(device):
  ren = kc.Device[device].renderer
  for seed in range(40):
    rng = random.Random(seed)
    shape, sink, ref = _random_chain(rng)
    a = rand(*shape, seed=seed)
    want = ref(a)
    for opts in ("none", "hand", _random_opts(Kernel(sink, ren), rng)):
      got = run(sink, {1: a}, device, opts)
      np.testing.assert_allclose(got.reshape(-1), want.reshape(-1), rtol=1e-4, atol=1e-5, err_msg=f"seed {seed} {opts}")


# ***** 2. outputs of one size and different shapes *****

@pytest.mark.parametrize("device", DEVICES)
def test_outputs_that_reduce_different_axes_are_separate_kernels(device):
  x, a = X(4, 4), rand(4, 4)
  sink = A.sink(A.store(0, x.sum(1, keepdims=True)), A.store(2, x.sum(0, keepdims=True)))
  assert len(schedule(sink).kernels) == 2
  outs = kc.run(sink, {1: a}, device=device, opts="hand")
  np.testing.assert_allclose(outs[0], a.sum(1, keepdims=True), rtol=1e-5)
  np.testing.assert_allclose(outs[2], a.sum(0, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_outputs_of_one_shape_still_work(device):
  x, a = X(4, 4), rand(4, 4)
  outs = kc.run(A.sink(A.store(0, x.sum(1, keepdims=True)), A.store(2, x.max(1, keepdims=True))), {1: a}, device=device, opts="hand")
  np.testing.assert_allclose(outs[0].reshape(-1), a.sum(1), rtol=1e-5)
  np.testing.assert_allclose(outs[2].reshape(-1), a.max(1), rtol=1e-6)


# ***** 5. tensor core with an UNROLL of the rest of K *****

@pytest.mark.parametrize("level", ["1", "2", "3"])
@pytest.mark.parametrize("extra", [[], [Opt(OptOps.UNROLL, 0, 2)], [Opt(OptOps.UNROLL, 0, 0)]], ids=str)
def test_float_tensor_core_with_unroll_on_emu(level, extra, monkeypatch):
  monkeypatch.setenv("KC_TC", level)
  a, b = rand(4, 8), rand(8, 4, seed=1)
  sink = A.sink(A.store(0, (X(4, 8).reshape(4, 8, 1) * X(8, 4, i=2).reshape(1, 8, 4)).sum(1, keepdims=True)))
  k = Kernel(sink, kc.Device["EMU"].renderer, tc_level=int(level))
  k.apply_opt(Opt(OptOps.TC, 0, 0))
  assert k.tensor_core is not None and k.tensor_core.dtype_in == f32 and k.use_tensor_cores == int(level)
  got = run(sink, {1: a, 2: b}, "EMU", [Opt(OptOps.TC, 0, 0)] + extra)
  np.testing.assert_allclose(got.reshape(4, 4), a @ b, rtol=1e-5)


# ***** 6. matvec heuristic when every reduce axis has size 1 *****

@pytest.mark.parametrize("device", DEVICES)
def test_matvec_heuristic_with_size_one_reduce(device):
  a, b = rand(1, 1, 8), rand(2, 1, 1, seed=1)
  got = run(A.sink(A.store(0, (X(1, 1, 8) * X(2, 1, 1, i=2)).sum(1, keepdims=True))), {1: a, 2: b}, device, "hand")
  np.testing.assert_allclose(got, (a * b).sum(1, keepdims=True), rtol=1e-6)


# ***** 7. a broadcast of a dim no reduce reduced *****

def test_broadcast_along_an_unreduced_dim_is_refused():
  ld = lambda i, *s: UOp(Ops.LOAD, f32, (UOp(Ops.DEFINE_GLOBAL, f32.ptr(), (), i), ShapeTracker.from_shape(s).to_uop()))  # noqa: E731
  r = UOp(Ops.REDUCE_AXIS, f32, (ld(1, 1, 5),), (Ops.ADD, (1,)))
  grown = UOp(Ops.VIEW, f32, (r,), ShapeTracker.from_shape((1, 1)).expand((4, 1)))
  st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.DEFINE_GLOBAL, f32.ptr(), (), 0), ShapeTracker.from_shape((4, 1)).to_uop(), grown * ld(2, 4, 1)))
  with pytest.raises(InvalidASTError, match=r"VIEW: expands \(1, 1\) -> \(4, 1\) along dims \[0\] that no reduce below it reduced"):
    verify_ast(UOp(Ops.SINK, dtypes.void, (st,)))


@pytest.mark.parametrize("device", DEVICES)
def test_broadcast_of_a_size_one_reduce_from_the_builder(device):
  a, b = rand(1, 5), rand(4, 1, seed=1)
  got = run(A.sink(A.store(0, X(1, 5).sum(1, keepdims=True) * X(4, 1, i=2))), {1: a, 2: b}, device, "hand")
  np.testing.assert_allclose(got, a.sum(1, keepdims=True) * b, rtol=1e-6)


# ***** 8. zero-size work *****

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opts", ["none", "hand"])
def test_zero_size_work_does_nothing(device, opts):
  sink = A.sink(A.store(0, X(0, 4) * 2.0))
  assert run(sink, {1: np.zeros((0, 4), np.float32)}, device, opts).shape == (0, 4)
  prg = Kernel(sink, kc.Device[device].renderer).to_program()
  assert not any(u.op in (Ops.LOAD, Ops.STORE) for u in prg.uops)
  with pytest.raises(KernelOptError, match="axis 0 has size 0"): Kernel(sink, kc.Device[device].renderer).apply_opt(Opt(OptOps.UPCAST, 0, 4))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op,ident", [("sum", 0.0), ("prod", 1.0), ("max", -np.inf)])
def test_empty_reduce_is_its_identity(device, op, ident):
  got = run(A.sink(A.store(0, getattr(X(3, 0), op)(1, keepdims=True))), {1: np.zeros((3, 0), np.float32)}, device, "hand")
  np.testing.assert_array_equal(got.reshape(-1), np.full(3, ident, np.float32))


# ***** 10, 11. buffers: one view when read and written, one dtype; work-group size; opt messages *****

def test_buffer_read_through_another_view_than_written_is_refused():
  with pytest.raises(InvalidASTError, match="buffer 0 is written through the view"): A.sink(A.store(0, X(4, i=0).flip(0)))
  A.sink(A.store(0, X(4, i=0) * 2.0))  # read and written through one view: each lane reads its element first


def test_buffer_with_two_dtypes_is_refused():
  with pytest.raises(InvalidASTError, match="buffer 1 is used as float32 and as int32"):
    A.sink(A.store(0, X(4) + X(4, dt=dtypes.int32).cast(f32)))


class _SmallGroups(kc.Renderer):
  device, has_local, has_shared, local_max, max_work_group_size = "SMALLGROUPS", True, True, (100, 100, 100), 64
  def render(self, name, uops): return ""


def test_work_group_beyond_the_device_limit_is_refused():
  k = Kernel(A.sink(A.store(0, X(16, 16).permute(1, 0) * 2.0)), _SmallGroups())  # two axes that cannot merge
  k.apply_opt(Opt(OptOps.LOCAL, 0, 16))
  with pytest.raises(KernelOptError, match=r"work-group of 128 threads \(local dims \(16, 8\)\) exceeds the device's max work-group size 64"):
    k.apply_opt(Opt(OptOps.LOCAL, 0, 8))
  k.apply_opt(Opt(OptOps.LOCAL, 0, 4))
  small = _SmallGroups()
  small.local_max, small.max_work_group_size = (4, 4, 2), None
  with pytest.raises(KernelOptError,
                     match=r"work-group of 64 threads \(local dims \(64,\)\) exceeds the renderer's local_max \(4, 4, 2\) \(32 threads\)"):
    Kernel(A.sink(A.store(0, X(64, 4) * 2.0)), small).apply_opt(Opt(OptOps.LOCAL, 0, 64))


def test_opt_errors_say_why_in_numbers():
  with pytest.raises(KernelOptError, match=r"3 does not divide 16 \(axis 0\)"):
    Kernel(A.sink(A.store(0, X(16) * 2.0)), kc.Device["EMU"].renderer).apply_opt(Opt(OptOps.UPCAST, 0, 3))


@pytest.mark.skipif(_opencl_reason() is not None, reason="no OpenCL device")
def test_opencl_local_beyond_the_max_work_group_size_is_refused():
  ren = kc.Device["OPENCL"].renderer
  n = ren.max_work_group_size * 2
  with pytest.raises(KernelOptError, match=f"work-group of {n} threads .* max work-group size {ren.max_work_group_size}"):
    Kernel(A.sink(A.store(0, X(n, 2).permute(1, 0) * 2.0)), ren).apply_opt(Opt(OptOps.LOCAL, 1, n))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fn", [lambda x: x * 2.0, A.exp, A.sin])
def test_the_padding_element_of_a_computed_value_indexed_to_0d_is_zero(device, fn):
  # x(1,) -> f -> pad ((1, 0),) -> [0]: the one element is padding, so 0; the 0-d view used to drop the empty mask
  x = A.arg(1, f32, (1,))
  got = kc.run(A.sink(A.store(0, fn(x).pad(((1, 0),))[0])), {1: np.array([0.7], np.float32)}, device=device, opts="none")[0]
  assert got.shape == () and got == 0.0


@pytest.mark.parametrize("device", DEVICES)
def test_a_reduce_result_padded_past_the_reduced_size_is_materialised(device):
  # one kernel can broadcast a reduced axis back to 1 or its reduced size only: a pad to 2 reads an intermediate
  x, a = A.arg(1, f32, (3, 1)), rand(3, 1)
  e = x.sum(0, keepdims=True).pad(((1, 0), (0, 0)))
  sink = A.sink(A.store(0, e))
  assert e.shape == (2, 1) and (x - x.sum(0, keepdims=True)).shape == (3, 1)
  np.testing.assert_allclose(kc.run(sink, {1: a}, device=device)[0], np.pad(a.sum(0, keepdims=True), ((1, 0), (0, 0))), rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_a_pad_of_an_empty_input_is_all_zeros(device):
  # the padded view covers no element of the buffer: a kernel that read it read outside a zero-size buffer
  x = A.arg(1, f32, (0,))
  got = kc.run(A.sink(A.store(0, x.pad(((0, 1),)))), {1: np.zeros(0, np.float32)}, device=device, opts="none")[0]
  assert got.tolist() == [0.0]


def test_reshape_after_an_index_keeps_every_element():
  # x[0] hides the indexed size-1 axis; a reshape that moves the kernel shape used to keep it hidden, so
  # sin(x)[0].reshape(-1) of a (1, 2, 2) input was 0-d instead of (4,)
  x, a = A.arg(1, f32, (1, 2, 2)), np.arange(4, dtype=np.float32).reshape(1, 2, 2)
  e = A.sin(x)[0].reshape(-1)
  assert e.shape == (4,)
  buf = kc.Buffer("EMU", 4, f32).allocate().copyin(memoryview(a.reshape(-1).view(np.uint8)))
  got = kc.run(A.sink(A.store(0, e)), {1: buf}, device="EMU")[0]
  np.testing.assert_allclose(got, np.sin(a)[0].reshape(-1), rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_reduces_nested_across_axes_no_load_covers_are_scheduled(device):
  # x.T - x.max(1) broadcasts the row maxima along axis 0 (numpy's right-aligned rule), so a softmax of it nests a max
  # per element: no load spans that kernel's full shape, and the scheduler materialises the inner values
  x, a = A.arg(1, f32, (4, 4)), rand(4, 4)
  e = (x.T - x.max(1)).exp2()
  sink = A.sink(A.store(0, e / e.sum(1)))
  ea = np.exp2(a.T - a.max(1))
  np.testing.assert_allclose(kc.run(sink, {1: a}, device=device)[0], ea / ea.sum(1), rtol=1e-5)
