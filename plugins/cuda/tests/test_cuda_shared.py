"""Shared memory in CUDA C, compiled with NVRTC: locals whose 16-byte-aligned total passes 48 KiB become dynamic shared
memory (ptxas pads each __align__(16) array, so the raw byte sum is not what it checks), and vector pointers into
shared memory are plain pointers (a __shared__ qualifier in a cast is NVRTC warning #1835-D on every access)."""
import re
import pytest
from hypothesis import given, settings, strategies as st
from kc import Opt, OptOps, dtypes
from kc import ast as A
from kc.backend import Ops, UOp
from kc.kernel import Kernel
from kc_cuda.compiler import NVRTCCompiler, unpack_library
from kc_cuda.renderer import DYNAMIC_SHARED_MARKER, STATIC_SHARED_MAX, CUDARenderer

I32 = dtypes.int32
SHARED_DTYPES = (dtypes.float32, dtypes.uint8, dtypes.float16, dtypes.float64, dtypes.int16)


def padded(n: int) -> int: return (n + 15) // 16 * 16


def locals_kernel(buffers: list) -> list:
  """UOps of a one-warp kernel that declares one local buffer per (dtype, count), writes element 0 of each, and
  sums the elements back into data0[lidx0]."""
  out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(), (), 0)
  lid, zero = UOp(Ops.SPECIAL, I32, (), ("lidx0", 32)), UOp.const(I32, 0)
  uops, stores, locs = [out, lid, zero], [], []
  for i, (dt, n) in enumerate(buffers):
    loc = UOp(Ops.DEFINE_LOCAL, dt.ptr(local=True, size=n), (), (f"temp{i}", n))
    idx, val = UOp(Ops.INDEX, loc.dtype, (loc, zero)), lid.cast(dt)
    stores.append(UOp(Ops.STORE, dtypes.void, (idx, val)))
    uops += [loc, val, idx, stores[-1]]
    locs.append(loc)
  bar = UOp(Ops.BARRIER, dtypes.void, tuple(stores))
  uops.append(bar)
  total = None
  for loc in locs:
    ld = UOp(Ops.LOAD, loc.dtype.base, (UOp(Ops.INDEX, loc.dtype, (loc, zero)), bar))
    as_float = ld.cast(dtypes.float32)
    uops += [ld.src[0], ld, as_float]
    if total is not None: uops.append(total := total + as_float)
    else: total = as_float
  out_idx = UOp(Ops.INDEX, out.dtype, (out, lid))
  return uops + [out_idx, UOp(Ops.STORE, dtypes.void, (out_idx, total))]


def compile_locals(buffers: list) -> tuple[str, dict]:
  src = CUDARenderer("sm_90").render("locals", locals_kernel(buffers))
  meta, cubin = unpack_library(NVRTCCompiler("sm_90").compile_uncached(src))
  assert cubin[:4] == b"\x7fELF"
  return src, meta


def test_the_padded_edge_becomes_dynamic_shared_memory():
  # 49148 + 4 bytes is exactly 48 KiB raw, but the uchar array starts 16-aligned after the float one: 0xc004 bytes
  # static, which ptxas refused ("too much shared data")
  src, meta = compile_locals([(dtypes.float32, 12287), (dtypes.uint8, 4)])
  assert "extern __shared__" in src and f"{DYNAMIC_SHARED_MARKER} 49156" in src
  assert meta["dynamic_shared"] == 49156


def test_locals_that_fit_padded_stay_static():
  src, meta = compile_locals([(dtypes.float32, 12284), (dtypes.uint8, 16)])  # 49136 + 16: exactly 48 KiB padded
  assert "extern __shared__" not in src and meta["dynamic_shared"] == 0


@settings(max_examples=20, deadline=None)
@given(others=st.lists(st.tuples(st.sampled_from(SHARED_DTYPES), st.integers(1, 40)), min_size=1, max_size=3),
       slack=st.integers(0, 48), first=st.sampled_from((dtypes.float32, dtypes.uint8)))
def test_any_locals_near_48k_compile_static_or_dynamic_by_padded_size(others, slack, first):
  """Locals whose raw bytes sum to at most 48 KiB, near the edge: NVRTC and ptxas accept every one, static where the
  padded total fits and dynamic (with the padded layout's size) where it does not."""
  rest = sum(dt.itemsize * n for dt, n in others)
  n_first = (STATIC_SHARED_MAX - slack - rest) // first.itemsize
  buffers = [(first, n_first), *others]
  src, meta = compile_locals(buffers)
  total = sum(padded(dt.itemsize * n) for dt, n in buffers)
  assert ("extern __shared__" in src) == (total > STATIC_SHARED_MAX)
  if total <= STATIC_SHARED_MAX: assert meta["dynamic_shared"] == 0
  else: assert STATIC_SHARED_MAX < meta["dynamic_shared"] <= total


def grouped_sum(upcast: int, dt=dtypes.float32) -> Kernel:
  """A grouped reduce whose partial sums go through shared memory as `upcast`-wide vectors."""
  k = Kernel(A.sink(A.store(0, A.arg(1, dt, (64, 1024)).sum(1))), CUDARenderer("sm_90"))
  for o in (Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.GROUPTOP, 0, 64), Opt(OptOps.UPCAST, 0, upcast)): k.apply_opt(o)
  return k


@pytest.mark.parametrize("upcast", [2, 4])
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float16])
def test_vector_shared_loads_compile_without_warnings(upcast, dt):
  src = grouped_sum(upcast, dt).to_program().src
  # a vector access into shared memory, cast plainly
  assert re.search(rf"\*\(\((?:float|kc_\w+){upcast}\*\)\(temp", src), src
  assert "(__shared__" not in src
  _, log = NVRTCCompiler("sm_90").compile_with_log(src)
  assert "warning" not in log, log
