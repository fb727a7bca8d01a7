"""The ATen set kc lowers: torch's core ATen decompositions, plus the composite ops whose decompositions are plain
elementwise math and reductions (layer norm, softmax, gelu...), so each ends in ops the lowering table has; and the
backward of scaled dot-product attention's CPU kernel (one opaque op otherwise) in math form."""
from __future__ import annotations
import math
import torch
from torch._decomp import core_aten_decompositions, decompositions as torch_decompositions, get_decompositions

aten = torch.ops.aten
_EXTRA = [aten.native_layer_norm, aten.native_layer_norm_backward, aten._softmax, aten._log_softmax,
          aten._softmax_backward_data, aten._log_softmax_backward_data, aten.gelu, aten.gelu_backward, aten.silu,
          aten.silu_backward, aten.sigmoid_backward, aten.tanh_backward, aten.embedding, aten.native_group_norm,
          aten.native_group_norm_backward, aten._native_batch_norm_legit_no_training, aten.rms_norm,
          aten.embedding_dense_backward, aten.hardtanh, aten.leaky_relu, aten.elu, aten.mse_loss,
          aten.threshold_backward]


def decompositions() -> dict:
  table = dict(core_aten_decompositions())
  table.update(get_decompositions(_EXTRA))
  table[aten._scaled_dot_product_flash_attention_for_cpu_backward.default] = sdpa_cpu_backward
  table[aten._softmax.default] = softmax
  return table


def softmax(x, dim: int, half_to_float: bool):
  """torch's decomposition of softmax, each row scaled by its sum's reciprocal (as torch's CPU kernel does) instead of
  divided by its sum: one division a row instead of one an element. An empty tensor takes torch's decomposition."""
  if x.numel() == 0: return torch_decompositions._softmax(x, dim, half_to_float)
  compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
  y = x.to(compute)
  unnormalized = torch.exp(y - y.amax(dim, keepdim=True))
  out = unnormalized * unnormalized.sum(dim, keepdim=True).reciprocal()
  return out if half_to_float else out.to(x.dtype)


def sdpa_cpu_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None, scale=None):
  """The gradients of scaled dot-product attention, from the probabilities recomputed in the math form. The forward's
  decomposition (torch's) returns the probabilities where the CPU kernel returns a log-sum-exp, so the `logsumexp`
  argument is not read: the softmax is recomputed from q and k (in float32 for halves, as torch's math does)."""
  if dropout_p > 0 or query.size(1) != key.size(1): return NotImplemented
  compute = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
  q, k, v, g = (t.to(compute) for t in (query, key, value, grad_out))
  scale = 1 / math.sqrt(query.size(-1)) if scale is None else scale
  scores = q @ k.transpose(-2, -1) * scale
  if is_causal:
    keep = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(keep.logical_not(), float("-inf"))
  if attn_mask is not None:
    scores = scores.masked_fill(attn_mask.logical_not(), float("-inf")) if attn_mask.dtype == torch.bool else \
      scores + attn_mask.to(compute)
  p = torch.softmax(scores, dim=-1)
  grad_v = p.transpose(-2, -1) @ g
  grad_p = g @ v.transpose(-2, -1)
  grad_scores = p * (grad_p - (grad_p * p).sum(-1, keepdim=True))
  grad_q = grad_scores @ k * scale
  grad_k = grad_scores.transpose(-2, -1) @ q * scale
  return grad_q.to(query.dtype), grad_k.to(key.dtype), grad_v.to(value.dtype)
