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


def _softmax_program(rows: int, cols: int):
  # three kernels (the row max, the sum of exps, the division) with intermediates in the program's arena
  x = A.arg(1, dtypes.float32, (rows, cols))
  e = (x - x.max(1, keepdims=True)).exp()
  return kc.compile(A.sink(A.store(0, e / e.sum(1, keepdims=True))), device="CUDA")


def test_a_program_queued_without_waiting_is_ordered_on_torchs_stream():
  # wait=False returns once the kernels are queued: torch's later ops on the stream see the outputs, and each call's
  # kernels run after the previous call's, which share the intermediates
  p = _softmax_program(64, 1024)
  assert len(p.kernels) > 1
  xs = [torch.randn(64, 1024, device="cuda") * (i + 1) for i in range(6)]
  outs = [torch.empty(64, 1024, device="cuda") for _ in xs]
  torch.cuda.synchronize()
  for x, out in zip(xs, outs): assert p(out, x, stream="torch", wait=False) is None
  sums = [out.sum(1) for out in outs]  # queued after the kernels on the same stream
  torch.cuda.synchronize()
  for x, out, s in zip(xs, outs, sums):
    torch.testing.assert_close(out, x.softmax(1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s, torch.ones(64, device="cuda"), rtol=1e-4, atol=1e-4)


def test_a_program_queued_on_one_stream_then_called_on_another_waits_for_the_first():
  # the intermediates are the program's own: a call on a second stream must not overwrite them under the first's
  p = _softmax_program(256, 4096)
  a, b = torch.cuda.Stream(), torch.cuda.Stream()
  x, y = torch.randn(256, 4096, device="cuda"), torch.randn(256, 4096, device="cuda") * 3
  out_x, out_y = torch.empty_like(x), torch.empty_like(y)
  torch.cuda.synchronize()
  for _ in range(3):
    with torch.cuda.stream(a): p(out_x, x, stream="torch", wait=False)
    with torch.cuda.stream(b): p(out_y, y, stream="torch", wait=False)
  torch.cuda.synchronize()
  torch.testing.assert_close(out_x, x.softmax(1), rtol=1e-5, atol=1e-6)
  torch.testing.assert_close(out_y, y.softmax(1), rtol=1e-5, atol=1e-6)


def test_call_device_runs_on_torchs_memory_by_address():
  # device pointers and byte counts, no DLPack: a kernel timed on kc's stream, a program queued on torch's
  k = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (1000,)) * 2 + A.arg(2, dtypes.float32, (1000,)))), device="CUDA")
  assert k.device_callable and k.dlpack_device == torch.empty(1, device="cuda").__dlpack_device__()
  x, y, out = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda"), torch.empty(1000, device="cuda")
  torch.cuda.synchronize()
  assert k.call_device(*((t.data_ptr(), t.nbytes) for t in (out, x, y))) > 0
  torch.testing.assert_close(out, x * 2 + y)
  p = _softmax_program(64, 1024)
  xs = [torch.randn(64, 1024, device="cuda") * (i + 1) for i in range(4)]
  outs = [torch.empty_like(x) for x in xs]
  for x, o in zip(xs, outs):
    assert p.call_device((o.data_ptr(), o.nbytes), (x.data_ptr(), x.nbytes), stream="torch", wait=False) is None
  torch.cuda.synchronize()
  for x, o in zip(xs, outs): torch.testing.assert_close(o, x.softmax(1), rtol=1e-5, atol=1e-6)
  with pytest.raises(kc.ArgumentError, match="needs 4000 bytes"):
    k.call_device((out.data_ptr(), 40), (x.data_ptr(), x.nbytes), (y.data_ptr(), y.nbytes))
  with pytest.raises(kc.ArgumentError, match="shares memory"):
    k.call_device((x.data_ptr(), x.nbytes), (x.data_ptr(), x.nbytes), (y.data_ptr(), y.nbytes))
