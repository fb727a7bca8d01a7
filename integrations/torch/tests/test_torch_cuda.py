"""backend "kc" on CUDA: torch's CUDA tensors in and out of kc programs in place, on torch's current stream. Runs where
torch sees a GPU and kc-cuda is installed (plugins/cuda/gpu_check.sh runs it); skipped elsewhere."""
import pytest
import kc

torch = pytest.importorskip("torch")
import kc_torch  # noqa: E402  (after torch is known to import)

if not torch.cuda.is_available() or "CUDA" not in kc.Device.names():
  pytest.skip("needs a CUDA GPU visible to torch and kc-cuda", allow_module_level=True)


def test_mlp_forward_and_backward_on_cuda_match_eager():
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.LayerNorm(128),
                              torch.nn.Linear(128, 10)).cuda()
  x = torch.randn(32, 64, device="cuda")
  torch._dynamo.reset()
  kc_torch.clear_fallbacks()
  got = torch.compile(model, backend="kc", options={"device": "CUDA"})(x)
  got.square().sum().backward()
  got_grads = [p.grad.clone() for p in model.parameters()]
  model.zero_grad()
  want = model(x)
  want.square().sum().backward()
  assert kc_torch.fallbacks() == []
  torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
  for g, p in zip(got_grads, model.parameters()): torch.testing.assert_close(g, p.grad, rtol=1e-3, atol=1e-4)


def test_kernels_run_on_torchs_current_stream():
  """On a side stream, with no synchronisation between torch's op and kc's: the order comes from the stream."""
  fn = torch.compile(lambda x: (x * 2).exp().sum(-1), backend="kc", options={"device": "CUDA"})
  side = torch.cuda.Stream()
  with torch.cuda.stream(side):
    x = torch.randn(256, 1024, device="cuda") + 1  # queued on the side stream just before kc's kernels
    got = fn(x)
  side.synchronize()
  torch.testing.assert_close(got, (x * 2).exp().sum(-1), rtol=1e-4, atol=1e-3)


def test_regions_call_their_programs_by_device_address():
  """A region on one GPU's tensors runs by address (call_device), not through a DLPack import per tensor; an input
  that is a transposed view is read in place, one that is a strided slice through its contiguous copy."""
  from kc_torch.region import KcRegion
  fn = torch.compile(lambda x, y: (x.t() * 2 + y[:, ::2]).relu(), backend="kc", options={"device": "CUDA"})
  x, y = torch.randn(48, 32, device="cuda"), torch.randn(32, 96, device="cuda")
  torch._dynamo.reset()
  kc_torch.clear_fallbacks()
  KcRegion._programs.clear()
  got = fn(x, y)
  torch.testing.assert_close(got, (x.t() * 2 + y[:, ::2]).relu())
  assert kc_torch.fallbacks() == []
  plans = list(KcRegion._programs.values())
  assert plans and all(p.device_nbytes is not None and p.host_nbytes is None for p in plans)
