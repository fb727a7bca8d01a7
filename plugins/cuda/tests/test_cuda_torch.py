"""kc beside torch on a real GPU (gpu_check.sh runs these with the plugin tests; here they skip): torch's CUDA tensors in
and out of a kc kernel without copies, the kernel on torch's current stream after torch's own work there, and a kc
Buffer read by torch in place. torch is the oracle."""
import pytest
import kc
from kc import ast as A, dtypes
from kc_cuda.driver import unavailable_reason

torch = pytest.importorskip("torch")
REASON = unavailable_reason() or (None if torch.cuda.is_available() else "torch sees no CUDA device")
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no CUDA GPU for torch and kc here: {REASON}")

DTYPES = [(dtypes.float32, torch.float32), (dtypes.float16, torch.float16), (dtypes.bfloat16, torch.bfloat16)]


@pytest.mark.parametrize("kc_dt,torch_dt", DTYPES, ids=lambda d: str(d))
def test_torch_cuda_tensors_in_and_out_on_torchs_stream(kc_dt, torch_dt):
  n = 1 << 20
  x = torch.randn(n, device="cuda", dtype=torch_dt)
  sink = A.sink(A.store(0, A.arg(1, kc_dt, (n,)) * 2 + 1))
  k = kc.compile(sink, device="CUDA")
  stream = torch.cuda.Stream()
  with torch.cuda.stream(stream):
    y = x.mul(3)  # queued on `stream`: kc's kernel must run after it
    out = torch.empty_like(x)
    ptr = out.data_ptr()
    k(out, y, stream="torch")  # torch's current stream
  stream.synchronize()
  assert out.data_ptr() == ptr  # written in place
  torch.testing.assert_close(out, (x * 3) * 2 + 1, rtol=1e-2, atol=1e-2)


def test_torch_reads_a_kc_buffer_in_place():
  buf = kc.Buffer("CUDA", 1024, dtypes.float32).allocate()
  t = torch.from_dlpack(buf)
  t.copy_(torch.arange(1024, device="cuda", dtype=torch.float32))
  k = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (1024,)) + 1)), device="CUDA")
  out = torch.empty(1024, device="cuda")
  k(out, buf)
  torch.testing.assert_close(out, torch.arange(1024, device="cuda", dtype=torch.float32) + 1)
  assert t.data_ptr() == buf._buf.ptr  # torch's view is kc's memory
  wrapped = kc.from_dlpack(out, device="CUDA")  # and kc wraps torch's memory the same way
  assert wrapped._buf.ptr == out.data_ptr() and wrapped.size == 1024
