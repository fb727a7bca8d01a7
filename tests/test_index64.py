"""Index arithmetic past 2^31: a kernel's indices are int64 exactly where some value of its index arithmetic can leave
int32's range (kc.codegen.lower.index_dtype), and such kernels compute what numpy computes on CLANG, EMU and OPENCL.
Devices that cannot hold a buffer say so with a kc.AllocationError before the launch."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
import kc
from kc import ShapeTracker, UOp, dtypes
from kc import ast as A
from kc.api import optimize
from kc.codegen.lower import INT64_MAX, _bounded_in, index_dtype, view_index_dtype
from kc.errors import ShapeError
from kc.ir.uop import Ops
from kc.runtime.device import HostAllocator

INT32_MAX = 2**31 - 1
# sizes that mix everyday dims with ones whose products, strides or offsets pass 2^31
SIZES = [1, 2, 3, 7, 64, 1000, 2**15 + 64, 2**16, 2**17 + 3, 2**20, 2**31 - 1, 2**31, 2**32 + 5]
PADS = [0, 1, 3, 5, 2**20, 2**31]
STEPS = [1, 2, 3, -1, 1048577]


def available(dev: str) -> bool: return kc.Device.unavailable_reason(dev) is None


# ------------------------------------------------------------ the rule

def wide_index(tracker: ShapeTracker) -> tuple[UOp, UOp]:
  """The index and validity of a view over int64 loops: nothing in them wraps before 2^63."""
  return tracker.to_indexed_uops(tuple(UOp.range(dtypes.int64, 0, s, i) for i, s in enumerate(tracker.shape)))


def leaves_int32(tracker: ShapeTracker) -> bool:
  """Some value of the view's index arithmetic can leave int32's range: a node of its index or validity, or of the
  loops over its shape, by vmin/vmax; or a mask bound of a view as the index is built from it (the tracker simplified,
  its inner views minified), which the validity compares with before it simplifies: a bound of 2^31 that a
  coordinate never reaches leaves no node of the simplified validity, yet in int32 it wraps and the check with it."""
  loops = [UOp.range(dtypes.int64, 0, s, i) for i, s in enumerate(tracker.shape)]  # the kernel runs them all
  nodes = [u for e in (*wide_index(tracker), *loops) for u in e.toposort if u.dtype in dtypes.ints]
  views = tracker.simplify().views
  bounds = [b for i, v in enumerate(views) for m in ((v if i == len(views) - 1 else v.minify()).mask or ()) for b in m]
  return any(not -INT32_MAX <= int(x) <= INT32_MAX for u in nodes for x in (u.vmin, u.vmax)) or \
    any(not -INT32_MAX <= int(b) <= INT32_MAX for b in bounds if isinstance(b, int))


@st.composite
def trackers(draw) -> ShapeTracker:
  """A view built by a random chain of movement ops from a contiguous buffer: expands to big dims, reshapes that
  flatten them (several views), shrinks, pads, flips and strides."""
  t = ShapeTracker.from_shape(tuple(draw(st.lists(st.sampled_from(SIZES), min_size=1, max_size=3))))
  for _ in range(draw(st.integers(0, 4))):
    shape = t.shape
    op = draw(st.sampled_from(["expand", "permute", "flatten", "shrink", "pad", "flip", "stride"]))
    if op == "expand" and 1 in shape: t = t.expand(tuple(draw(st.sampled_from(SIZES)) if s == 1 else s for s in shape))
    elif op == "permute": t = t.permute(tuple(draw(st.permutations(range(len(shape))))))
    elif op == "flatten" and len(shape) > 1: t = t.reshape((int(np.prod(shape, dtype=object)),))
    elif op == "shrink":
      bounds = [sorted((draw(st.integers(0, s)), draw(st.integers(0, s)))) for s in shape]
      t = t.shrink(tuple((b, e) if b < e else (0, s) for (b, e), s in zip(bounds, shape)))
    elif op == "pad": t = t.pad(tuple((draw(st.sampled_from(PADS)), draw(st.sampled_from(PADS))) for _ in shape))
    elif op == "flip": t = t.flip(tuple(i for i in range(len(shape)) if draw(st.booleans())))
    elif op == "stride": t = t._with_last(t.views[-1].stride(tuple(draw(st.sampled_from(STEPS)) for _ in shape)))
  return t


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trackers())
def test_index_dtype_is_int64_exactly_where_an_index_can_leave_int32(tracker):
  if not _bounded_in(tracker, INT64_MAX):
    # past int64 (a flat view of 2^67 positions): the int64 oracle above would wrap, and kc refuses the view
    with pytest.raises(ShapeError, match="can pass 2"): view_index_dtype(tracker)
    return
  assert view_index_dtype(tracker) == (dtypes.int64 if leaves_int32(tracker) else dtypes.int32)


def test_a_mask_bound_past_int32_that_no_coordinate_reaches_still_needs_int64():
  # hypothesis found it: the inner view's mask runs to 2^31, the flat index only to 2, and the simplified int64
  # validity holds no 2^31; built in int32 the bound wraps and the validity is false where it is true (at 2)
  from kc.shape.view import View
  t = ShapeTracker((View.create((2**31 + 1, 1, 2), (1, 0, 0), -1, ((1, 2**31), (0, 1), (0, 1))), View.create((3,))))
  assert leaves_int32(t) and view_index_dtype(t) == dtypes.int64


def test_a_view_past_int64_is_a_shape_error_and_one_within_it_is_int64():
  n = 1 << 31
  huge = ShapeTracker.from_shape((1 << 20, 1)).expand((1 << 20, n)).reshape((1 << 20, n, 1)).expand((1 << 20, n, 1 << 16))
  with pytest.raises(ShapeError, match="2\\^63"): view_index_dtype(huge.reshape(((1 << 67),)))  # the flat index of 2^67 positions
  assert view_index_dtype(huge) == dtypes.int64  # a dim of 2^31: its loop bound leaves int32, the index does not
  assert view_index_dtype(ShapeTracker.from_shape((1 << 20, 1 << 20))) == dtypes.int64
  big = A.sink(A.store(0, A.arg(1, dtypes.float32, (1 << 20, 1)).expand((1 << 20, n)).reshape((1 << 51,)).expand((1 << 51,))
                        .reshape((1 << 20, n)).sum(axis=1)))
  assert kc.Kernel(big, kc.Device.renderer("EMU")).ast is not None  # builds: int64 covers it


@pytest.mark.parametrize("shape, want", [((1 << 16, (1 << 15) + 64), dtypes.int64), ((1 << 16, 1 << 15), dtypes.int32),
                                         ((2**31 - 1,), dtypes.int32), ((2**31,), dtypes.int64),
                                         ((46341, 46341), dtypes.int64)])
def test_index_dtype_at_the_int32_boundary(shape, want):
  # the last index of a contiguous view is size - 1; a loop bound (a dim) must fit too
  assert view_index_dtype(ShapeTracker.from_shape(shape)) == want


def test_an_expand_of_a_small_buffer_keeps_int32_until_its_index_grows():
  n = 1 << 16
  big = ShapeTracker.from_shape((n, 1)).expand((n, n))  # 2^32 positions, indices below 2^16
  assert view_index_dtype(big) == dtypes.int32
  assert view_index_dtype(big.reshape((n * n,))) == dtypes.int64  # the flat index is unravelled from up to 2^32


def test_variable_bounds_decide():
  n = kc.Variable("n", 1, 2**30)
  assert view_index_dtype(ShapeTracker.from_shape((n, 4))) == dtypes.int64
  assert view_index_dtype(ShapeTracker.from_shape((kc.Variable("m", 1, 1000), 4))) == dtypes.int32


def kernel_index_dtypes(sink, renderer, opts="hand") -> set:
  """The dtypes of the loop counters and launch indices of a compiled kernel."""
  k = optimize(kc.Kernel(sink, renderer), opts)
  return {u.dtype for u in k.linearize() if u.op in (Ops.RANGE, Ops.SPECIAL)}


def test_every_index_uop_of_a_wide_kernel_is_int64():
  x = A.arg(1, dtypes.int8, (1 << 16, (1 << 15) + 64))
  sink = A.sink(A.store(0, x + 1))
  r = kc.Device.renderer("CLANG")
  k = optimize(kc.Kernel(sink, r), "hand")
  assert index_dtype(k.get_optimized_ast()) == dtypes.int64
  uops = k.linearize()
  offsets = [u.src[1] for u in uops if u.op is Ops.INDEX]
  assert offsets and all(o.dtype == dtypes.int64 for o in offsets)
  assert {u.dtype for u in uops if u.op is Ops.RANGE} == {dtypes.int64}
  # every ALU on the way from a loop counter to an offset
  chain = {s for o in offsets for s in o.toposort if s.op not in (Ops.CONST, Ops.DEFINE_VAR)}
  assert all(u.dtype == dtypes.int64 for u in chain if u.dtype in dtypes.ints)


def test_small_kernels_keep_int32_indices():
  x = A.arg(1, dtypes.float32, (64, 32))
  sink = A.sink(A.store(0, x.sum(1)))
  for dev in ("CLANG", "EMU"):
    assert kernel_index_dtypes(sink, kc.Device.renderer(dev)) == {dtypes.int32}


def test_lowering_gives_int64_launch_indices_on_a_gpu_target():
  n, m = kc.Variable("n", 1, 60000), kc.Variable("m", 1, 60000)
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (n, m)).sum(1)))
  uops = optimize(kc.Kernel(sink, kc.Device.renderer("EMU")), "hand").linearize()
  assert {u.dtype for u in uops if u.op in (Ops.RANGE, Ops.SPECIAL)} == {dtypes.int64}
  # the Variable, an int32 kernel argument, is converted once where it meets the index arithmetic
  assert any(u.op is Ops.CAST and u.src[0].op is Ops.DEFINE_VAR and u.dtype == dtypes.int64 for u in uops)


# ------------------------------------------------------------ rendered source

def variable_rows_sink():
  """Rows of 4 floats, n of them with n up to 2^30: offsets up to 2^32 while the buffers at run time are small."""
  n = kc.Variable("n", 1, 2**30)
  return A.sink(A.store(0, (A.arg(1, dtypes.float32, (n, 4)) * 2).sum(1)))


def rendered(renderer, sink, opts="hand") -> str:
  return optimize(kc.Kernel(sink, renderer), opts).to_program().src


def test_c_renders_int64_loops_and_offsets():
  src = rendered(kc.Device.renderer("CLANG"), variable_rows_sink())
  assert "for (long ridx0" in src and "*4ll" in src and "for (int " not in src


def test_opencl_renders_int64_launch_indices():
  from kc_opencl.renderer import OpenCLRenderer
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (kc.Variable("n", 1, 60000), 65536)).sum(1)))
  src = optimize(kc.Kernel(sink, OpenCLRenderer()), [kc.Opt(kc.OptOps.GROUP, 0, 16)]).to_program().src
  assert "long gidx0 = get_group_id(0);" in src and "long lidx0 = get_local_id(0);" in src and "int " not in src


def test_small_kernels_render_int_indices():
  src = rendered(kc.Device.renderer("CLANG"), A.sink(A.store(0, A.arg(1, dtypes.float32, (64, 32)).sum(1))))
  assert "for (int ridx0" in src and "long" not in src


# ------------------------------------------------------------ running

def run_variable_rows(dev: str, rows: int, opts: str):
  sink = variable_rows_sink()
  k = kc.compile(sink, device=dev, opts=opts)
  x = np.random.default_rng(0).random((rows, 4), dtype=np.float32)
  out = np.zeros(rows, np.float32)
  k(out, x, n=rows)
  np.testing.assert_allclose(out, (x * 2).sum(1), rtol=1e-6)


@pytest.fixture
def emu_as_clang():
  """EMU lowering as CLANG does (loops, no launch limits: EMU's own cannot take 2^30 rows), put back afterwards."""
  emu = kc.Device["EMU"]
  before = emu.impersonating
  yield emu.impersonate("CLANG")
  emu.impersonate(before)


@pytest.mark.parametrize("opts", ["none", "hand"])
@pytest.mark.parametrize("dev", ["CLANG", "EMU", "OPENCL"])
def test_int64_kernels_with_small_buffers_match_numpy(dev, opts, request):
  if not available(dev): pytest.skip(f"{dev} is not available here")
  if dev == "EMU": request.getfixturevalue("emu_as_clang")
  run_variable_rows(dev, 37, opts)


@pytest.mark.parametrize("dev", ["EMU", "OPENCL"])
def test_int64_launch_indices_with_locals_match_numpy(dev):
  # work-groups and their threads over int64 indices: up to 65535 rows of 32781, so offsets pass 2^31
  if not available(dev): pytest.skip(f"{dev} is not available here")
  n, m = kc.Variable("n", 1, 65535), 32781  # padded to 32784 = 16 * 2049 columns
  x = A.arg(1, dtypes.float32, (n, m))
  sink = A.sink(A.store(0, (x.pad(((0, 0), (1, 2))) + 1).max(1)))  # a padded view: its gates compare int64 indices
  xv = np.random.default_rng(1).random((3, m), dtype=np.float32)
  grouped = [kc.Opt(kc.OptOps.GROUP, 0, 16)]  # 16 threads share each row's reduce: EMU runs them as lanes, fast
  for opts in ([grouped] if dev == "EMU" else ["none", "hand", grouped]):
    k = kc.compile(sink, device=dev, opts=opts)
    assert {u.dtype for u in k.program.uops if u.op in (Ops.RANGE, Ops.SPECIAL)} == {dtypes.int64}
    out = np.zeros(3, np.float32)
    k(out, xv, n=3)
    np.testing.assert_allclose(out, (np.pad(xv, ((0, 0), (1, 2))) + 1).max(1))


def test_clang_threads_split_an_int64_loop(monkeypatch):
  # the split loop's bounds are computed in long long and its counter stays long: each thread runs its part
  monkeypatch.setenv("KC_CLANG_THREADS", "2")
  src = rendered(kc.Device.renderer("CLANG"), variable_rows_sink())
  assert "long ridx0_lo = (long)__kc_part_start(" in src
  run_variable_rows("CLANG", 100_003, "hand")


def expand_strided_sink(n: int = 1 << 16):
  """A (1, n) row broadcast to (n, n), flattened (2^32 positions) and read every 1048583-th: 4096 values whose flat
  index (up to 2^32) unravels to a column; then reshaped to (64, 64) and reduced."""
  x = A.arg(1, dtypes.float32, (1, n))
  picked = x.expand(n, n).reshape(n * n)[::1048583]
  return A.sink(A.store(0, picked.reshape(64, 64).sum(1))), picked.shape


@pytest.mark.parametrize("dev", ["CLANG", "EMU", "OPENCL"])
def test_an_expand_to_2_to_the_32_positions_reduced_matches_numpy(dev):
  if not available(dev): pytest.skip(f"{dev} is not available here")
  n = 1 << 16
  sink, (picked,) = expand_strided_sink(n)
  xv = np.random.default_rng(2).random((1, n), dtype=np.float32)
  out = kc.run(sink, {1: xv}, device=dev)[0]
  want = xv.reshape(-1)[(np.arange(picked, dtype=np.int64) * 1048583) % n].reshape(64, 64).sum(1)
  np.testing.assert_allclose(out, want, rtol=1e-5)


def test_a_reduce_over_2_to_the_32_positions_of_a_small_buffer_on_clang():
  # the loops run 2^16 x 2^16 times: bounds and counters fit int32, only the positions' count does not
  n = 1 << 16
  x = A.arg(1, dtypes.int32, (n, 1))
  sink = A.sink(A.store(0, x.expand(n, n).sum(1).sum(0)))  # numpy's int32 sum accumulates in int64
  xv = np.arange(n, dtype=np.int32).reshape(n, 1) % 7
  assert view_index_dtype(ShapeTracker.from_shape((n, 1)).expand((n, n))) == dtypes.int32
  assert int(kc.run(sink, {1: xv}, device="CLANG")[0]) == int((n * xv.astype(np.int64)).sum())


def available_memory() -> int:
  """Bytes of memory available to new allocations (MemAvailable), 0 where it cannot be read."""
  try:
    with open("/proc/meminfo") as f:
      return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
  except (OSError, StopIteration, ValueError): return 0


@pytest.mark.skipif(available_memory() < 7 * 2**30, reason="needs about 7 GiB free: two 2 GiB buffers and the checks")
def test_a_buffer_of_more_than_2_to_the_31_elements_on_clang():
  shape = (1 << 16, (1 << 15) + 64)  # 2^31 + 2^22 int8 elements: the flat index passes int32 (was a segfault)
  arr = np.ones(shape, np.int8)
  arr[-1, -1], arr[0, 0] = 5, -128
  out = kc.run(A.sink(A.store(0, A.arg(1, dtypes.int8, shape) + 1)), {1: arr}, device="CLANG")[0]
  assert out[-1, -1] == 6 and out[0, 0] == -127
  for start in range(0, shape[0], 1024):  # compared in slices: no 2 GiB temporaries
    assert np.array_equal(out[start:start + 1024], arr[start:start + 1024] + np.int8(1)), f"rows {start}.."


# ------------------------------------------------------------ devices that cannot hold a buffer

def test_an_allocation_over_the_device_cap_is_a_typed_error():
  alloc = HostAllocator()
  alloc.max_alloc, alloc.max_alloc_source = 1000, "a test's cap"
  with pytest.raises(kc.AllocationError, match=r"1001 bytes.*at most 1000 bytes.*a test's cap"): alloc.alloc(1001)
  assert alloc.alloc(1000).nbytes == 1000
  assert issubclass(kc.AllocationError, kc.KcError) and issubclass(kc.AllocationError, MemoryError)


def test_opencl_refuses_a_buffer_over_its_max_alloc_before_the_launch(monkeypatch):
  if not available("OPENCL"): pytest.skip("OPENCL is not available here")
  from kc_opencl.runtime import OpenCLProgram
  dev = kc.Device["OPENCL"]
  assert dev.allocator.max_alloc == dev.cl_device.max_mem_alloc_size  # the device's own CL_DEVICE_MAX_MEM_ALLOC_SIZE
  monkeypatch.setattr(dev.allocator, "max_alloc", 1 << 20)  # a device that holds 1 MiB per buffer
  launched = []
  monkeypatch.setattr(OpenCLProgram, "__call__", lambda self, *a, **kw: launched.append(self))
  sink = A.sink(A.store(0, A.arg(1, dtypes.int8, (1 << 11, 1 << 10)) + 1))
  cap = rf"{1 << 21} bytes.*at most {1 << 20} bytes.*CL_DEVICE_MAX_MEM_ALLOC_SIZE"  # the size, the limit and its source
  with pytest.raises(kc.AllocationError, match=cap):
    kc.run(sink, {1: np.ones((1 << 11, 1 << 10), np.int8)}, device="OPENCL")
  assert launched == []


def test_a_global_size_over_the_renderer_limit_is_a_kernel_opt_error():
  from kc_opencl.renderer import OpenCLRenderer
  r = OpenCLRenderer()
  r.global_max = (1000, 1000, 1000)
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (1009 * 1013 * 1019 * 7,)) + 1))  # no factor fits an axis
  with pytest.raises(kc.KernelOptError, match="launch limit"): optimize(kc.Kernel(sink, r), "none").to_program()


def test_emu_runs_int64_output_loops_as_lanes(emu_as_clang):
  # a loop to a Variable converted to int64 is still an output loop whose iterations EMU runs side by side
  from kc.emu.interpreter import _Plan
  k = kc.compile(variable_rows_sink(), device="EMU", opts="none")
  plan = _Plan(k.program.name, k.program.uops)
  assert [plan.uops[pc].dtype for pc in plan.parallel_loops] == [dtypes.int64]
  run_variable_rows("EMU", 20_000, "none")
