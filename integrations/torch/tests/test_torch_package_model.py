"""A model shipped in a PyPI package, compiled by backend "kc": GPT-2 from transformers, built from a config (random
weights, nothing downloaded), in inference. Its fallbacks are reported, and its logits match eager."""
import pytest
import torch
import kc_torch

transformers = pytest.importorskip("transformers")  # CI installs it (.ci/run); the core's tests never need it


def test_gpt2_logits_match_eager_and_fallbacks_are_reported():
  torch.manual_seed(0)
  config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=32, bos_token_id=0,
                                   eos_token_id=0, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
  model = transformers.GPT2LMHeadModel(config).eval()
  ids = torch.randint(0, 64, (2, 12))
  torch._dynamo.reset()
  kc_torch.clear_fallbacks()
  with torch.no_grad():
    got = torch.compile(model, backend="kc", options={"device": "CLANG"})(ids).logits
    want = model(ids).logits
  torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * max(1.0, want.abs().max().item()))
  # every op of GPT-2's forward has a kc lowering: the report is the proof that kc ran the whole model
  assert kc_torch.fallbacks() == [], kc_torch.fallbacks()
  assert kc_torch.region_programs() > 0
