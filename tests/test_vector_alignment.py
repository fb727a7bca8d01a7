"""Vector loads and stores on devices whose vector types need aligned addresses (Renderer.aligned_vectors: CUDA's
float4, OpenCL's and Metal's vectors): a kc.Buffer view at another byte offset is refused at the call for a kernel that
accesses it as vectors, a numpy array at such an address is copied, and EMU, impersonating such a device, faults on a
misaligned vector access as the GPU would. CLANG declares its vector types aligned to the scalar: any view works."""
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st
import kc
from kc import ArgumentError, Opt, OptOps, ast as A, dtypes
from kc.emu import MisalignedAccessError

ALIGNED = ["CUDA", "OPENCL", "METAL"]  # impersonated by EMU: their renderers, EMU's interpreter


def _doubled(n: int, dt, upcast: int):
  sink = A.sink(A.store(0, A.arg(1, dt, (n,)) * 2))
  return sink, [Opt(OptOps.UPCAST, 0, upcast)] if upcast > 1 else []


def test_every_gpu_dialect_needs_aligned_vectors_and_clang_does_not():
  for name in ALIGNED: assert kc.Device.renderer(name).aligned_vectors, name
  assert not kc.Device.renderer("CLANG").aligned_vectors and not kc.Device.renderer("EMU").aligned_vectors


def test_program_vector_bytes_names_each_buffer_and_its_widest_access(emu):
  emu.impersonate("CUDA")
  sink, opts = _doubled(64, dtypes.float16, 4)
  assert kc.compile(sink, device="EMU", opts=opts).program.vector_bytes() == {0: 8, 1: 8}  # half4
  assert kc.compile(sink, device="EMU", opts="none").program.vector_bytes() == {}


@pytest.mark.parametrize("target", ALIGNED)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # emu: set per example
@given(offset=st.integers(0, 7), upcast=st.sampled_from([1, 2, 4]), half=st.booleans())
@example(offset=1, upcast=4, half=False)  # refused
@example(offset=4, upcast=4, half=False)  # float4 at 16 bytes: fine
def test_a_view_is_refused_exactly_when_its_offset_misaligns_a_vector_access(emu, target, offset, upcast, half):
  emu.impersonate(target)
  dt = dtypes.float16 if half else dtypes.float32
  n, item = 32, dt.itemsize
  sink, opts = _doubled(n, dt, upcast)
  k = kc.compile(sink, device="EMU", opts=opts)
  vector = k.program.vector_bytes().get(1, 0)
  base = kc.Buffer("EMU", n + 8, dt).allocate().copyin(np.arange(n + 8).astype(dt.np))
  view = base.view(n, dt, offset=offset * item)
  out = np.zeros(n, dt.np)
  if vector and (offset * item) % vector:
    with pytest.raises(ArgumentError, match=f"byte offset {offset * item}.*{vector}-byte vectors"): k(out, view)
    # past the check, EMU faults where the GPU would
    with pytest.raises(MisalignedAccessError, match="misaligned|odd byte offset"):
      k._handle(kc.Buffer("EMU", n, dt).allocate(), view, global_size=k.program.global_size, local_size=k.program.local_size, wait=True)
  else:
    k(out, view)
    np.testing.assert_array_equal(out, (np.arange(offset, offset + n) * 2).astype(dt.np))


@pytest.mark.parametrize("target", ALIGNED)
def test_numpy_arrays_at_any_address_are_copied_where_vectors_need_alignment(emu, target):
  emu.impersonate(target)
  sink, opts = _doubled(32, dtypes.float32, 4)
  k = kc.compile(sink, device="EMU", opts=opts)
  src, dst = np.arange(40, dtype=np.float32), np.zeros(40, np.float32)
  for start in range(5):  # 4-byte steps: only every fourth start is 16-byte aligned (numpy's own base is)
    dst[:] = 0
    k(dst[start:start + 32], src[start:start + 32])
    np.testing.assert_array_equal(dst[start:start + 32], src[start:start + 32] * 2)  # the output is copied back


@pytest.mark.parametrize("device", ["CLANG", "EMU"])
def test_host_dialects_load_vectors_from_views_at_any_offset(device):
  sink, opts = _doubled(32, dtypes.float32, 4)
  k = kc.compile(sink, device=device, opts=opts)
  base = kc.Buffer(device, 40, dtypes.float32).allocate().copyin(np.arange(40, dtype=np.float32))
  for offset in range(0, 32, 4):
    out = np.zeros(32, np.float32)
    k(out, base.view(32, dtypes.float32, offset=offset))
    np.testing.assert_array_equal(out, np.arange(offset // 4, offset // 4 + 32, dtype=np.float32) * 2)
