"""torch.compile(model, backend="kc") against torch eager: forward and backward of the models kc-torch promises to run
with no fallback, in float32 and bfloat16, on CLANG.

Tolerance (the README's): float32 outputs and gradients within rtol 1e-4 and atol 1e-5 times the largest magnitude of
eager's tensor (sums are added in another order). bfloat16 rounds every intermediate to 8 bits, and kc and torch round
at different points (fused chains, sums in another order), so a deep backward differs by several bfloat16 ulps
between two correct implementations: there kc's largest error against a float64 run of the model is at most twice
eager's bfloat16 error against the same run (or 1e-2 of the tensor's magnitude, whichever is larger)."""
from __future__ import annotations
import copy
import pytest
import torch
import torch.nn as nn
import kc_torch

TOLERANCE = (1e-4, 1e-5)


def assert_matches(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
  rtol, atol = TOLERANCE
  scale = max(1.0, want.detach().abs().max().item()) if want.numel() else 1.0
  torch.testing.assert_close(got.detach().float(), want.detach().float(), rtol=rtol, atol=atol * scale,
                             msg=lambda m: f"{what}: {m}")


def assert_as_accurate(got: torch.Tensor, eager: torch.Tensor, exact: torch.Tensor, what: str) -> None:
  """kc's low-precision result is at most twice as far from the float64 result as eager's is."""
  exact = exact.detach().double()
  scale = max(1.0, exact.abs().max().item()) if exact.numel() else 1.0
  err_kc = (got.detach().double() - exact).abs().max().item() if exact.numel() else 0.0
  err_eager = (eager.detach().double() - exact).abs().max().item() if exact.numel() else 0.0
  assert err_kc <= max(2 * err_eager, 1e-2 * scale), f"{what}: kc is {err_kc:.3g} from float64, eager {err_eager:.3g}"


class CausalSelfAttention(nn.Module):
  """GPT's attention block, written out: q k^T, a causal mask, softmax, times v, heads merged."""
  def __init__(self, dim=32, heads=4):
    super().__init__()
    self.qkv, self.out, self.heads = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), heads

  def forward(self, x):
    B, T, C = x.shape
    q, k, v = self.qkv(x).split(C, dim=-1)
    q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
    scores = (q @ k.transpose(-2, -1)) / (C // self.heads) ** 0.5
    mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    weights = scores.masked_fill(mask.logical_not(), float("-inf")).softmax(-1)
    return self.out((weights @ v).transpose(1, 2).reshape(B, T, C))


class Activations(nn.Module):
  def forward(self, x):
    return nn.functional.gelu(x) + nn.functional.silu(x) * nn.functional.gelu(x, approximate="tanh") - x.sigmoid() * x.tanh()


class Softmaxes(nn.Module):
  def forward(self, x): return x.softmax(-1) * 3 + x.log_softmax(-1) + x.softmax(0)


class EmbeddingHead(nn.Module):
  def __init__(self, vocab=40, dim=16):
    super().__init__()
    self.embed, self.head = nn.Embedding(vocab, dim), nn.Linear(dim, vocab)

  def forward(self, ids): return self.head(self.embed(ids).tanh())


def _tokens(): return torch.randint(0, 40, (3, 7))


MODELS = {
  "mlp": (lambda: nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 5)), lambda: torch.randn(6, 12)),
  "layernorm": (lambda: nn.LayerNorm(24), lambda: torch.randn(5, 3, 24)),
  "rmsnorm": (lambda: nn.RMSNorm(24), lambda: torch.randn(5, 24)),
  "softmax": (Softmaxes, lambda: torch.randn(6, 20)),
  "gelu_silu": (Activations, lambda: torch.randn(4, 33)),
  "attention": (CausalSelfAttention, lambda: torch.randn(2, 9, 32)),
  "transformer": (lambda: nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True), lambda: torch.randn(2, 7, 32)),
  "embedding_head": (EmbeddingHead, _tokens),
  "conv_net": (lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 6, 3, stride=2),
                                     nn.Flatten(), nn.Linear(6 * 1 * 1, 3)), lambda: torch.randn(2, 3, 8, 8)),
}


def run(model: nn.Module, x: torch.Tensor, dtype: torch.dtype, compiled: bool):
  """The model's output and gradients (of the parameters and a float input), under backend "kc" or eagerly."""
  model = copy.deepcopy(model).to(dtype)
  x = x.detach().to(dtype).requires_grad_() if x.is_floating_point() else x
  fn = torch.compile(model, backend="kc", options={"device": "CLANG"}) if compiled else model
  model.zero_grad(set_to_none=True)
  y = fn(x)
  (y.double() * torch.linspace(-1, 1, y.numel(), dtype=torch.float64).reshape(y.shape)).sum().backward()  # not all ones
  grads = {n: p.grad.clone() for n, p in model.named_parameters()}
  if x.requires_grad: grads["input"] = x.grad.clone()
  return y.detach().clone(), grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(MODELS))
def test_forward_and_backward_match_eager_with_no_fallbacks(name, dtype):
  torch.manual_seed(0)
  make_model, make_input = MODELS[name]
  torch._dynamo.reset()
  kc_torch.clear_fallbacks()
  model, x = make_model(), make_input()
  got, got_grads = run(model, x, dtype, compiled=True)
  assert kc_torch.fallbacks() == [], f"{name} ran ops in torch: {kc_torch.fallbacks()}"
  want, want_grads = run(model, x, dtype, compiled=False)
  assert got.dtype == want.dtype and got.shape == want.shape and got_grads.keys() == want_grads.keys()
  if dtype == torch.float32:
    assert_matches(got, want, f"{name} output")
    for key in want_grads: assert_matches(got_grads[key], want_grads[key], f"{name} gradient of {key}")
  else:
    exact, exact_grads = run(model, x, torch.float64, compiled=False)
    assert_as_accurate(got, want, exact, f"{name} output")
    for key in want_grads: assert_as_accurate(got_grads[key], want_grads[key], exact_grads[key], f"{name} gradient of {key}")


def test_inference_runs_in_kc_and_matches():
  """In eval mode without grad, nn.TransformerEncoderLayer takes torch's fused fast path (one opaque op, which runs in
  torch and is reported); with the fast path off it is ops kc lowers, and nothing falls back."""
  torch.manual_seed(1)
  model, x = MODELS["transformer"][0]().eval(), MODELS["transformer"][1]()
  with torch.no_grad():
    want = model(x)
    torch._dynamo.reset()
    kc_torch.clear_fallbacks()
    assert_matches(torch.compile(model, backend="kc", options={"device": "CLANG"})(x), want, "fast path")
    assert [f.op for f in kc_torch.fallbacks()] == ["aten._transformer_encoder_layer_fwd.default"]
    torch._dynamo.reset()
    kc_torch.clear_fallbacks()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
      got = torch.compile(model, backend="kc", options={"device": "CLANG"})(x)
    finally:
      torch.backends.mha.set_fastpath_enabled(True)
  assert kc_torch.fallbacks() == []
  assert_matches(got, want, "transformer inference")


def test_a_model_with_copies_of_itself_shares_programs():
  """Two compiled copies of one model run the same kc programs: the second compiles no kernel."""
  torch.manual_seed(2)
  model, x = MODELS["mlp"][0](), MODELS["mlp"][1]()
  torch._dynamo.reset()
  with torch.no_grad():
    torch.compile(model, backend="kc", options={"device": "CLANG"})(x)
    before = kc_torch.region_programs()
    torch._dynamo.reset()
    torch.compile(copy.deepcopy(model), backend="kc", options={"device": "CLANG"})(x)
  assert before > 0 and kc_torch.region_programs() == before
