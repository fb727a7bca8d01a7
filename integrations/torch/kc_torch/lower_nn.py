"""Lowerings of torch's nn ops: convolutions (forward, transposed, backward), 2-D max and average pooling with their
backwards, adaptive average pooling, and the gather and scatter-add an embedding decomposes into.

Every op here is a windowed reduce: a convolution is the input padded and cut into windows (a view), multiplied by
the weight and summed over (input channels of a group, kernel axes) as one expression, so kc fuses the product into
the reduce and never materialises the (batch, channels, positions, kernel) product. The adjoints (grad_input, a
transposed convolution, the pooling backwards) read the gradient zero-dilated by the stride and padded, so that every
input position gathers from the windows that cover it: no scatter. Sums run in torch's accumulation dtype: float32
for float16 and bfloat16, rounded once at the end, as torch's CPU forward kernels (its backward kernels of halves
round partial sums too, so kc's are nearer the exact value); the order of a sum may differ from torch's, and with it
the last bit.

kc.ast has no gather: an embedding's rows are one-hot selections, whose work is (indices x table elements). Past
ONE_HOT_LIMIT such an op is left to torch."""
from __future__ import annotations
import math
from typing import Optional, Sequence
import torch
import torch.fx
from kc import ast as A
from kc_torch.dtypes import opmath, to_kc
from kc_torch.lowering import cast, lowering, meta, out_dtype

aten = torch.ops.aten
ONE_HOT_LIMIT = 2 ** 26   # index-table element pairs (one compare and select each) above which torch's gather runs


# ------------------------------------------------------------------------------------------------------- windows

def _per_dim(values, nd: int) -> tuple[int, ...]:
  """An ATen int list (one entry meaning all dims, as torch's expand_param_if_needed) as nd ints."""
  values = [int(v) for v in (values if isinstance(values, (list, tuple)) else [values])]
  return tuple(values * nd if len(values) == 1 else values)


def _spatial_pads(x, lows: Sequence[int], highs: Sequence[int], value=0.0):
  """x padded (or, for negative amounts, cut) on its last len(lows) axes by (low, high) each, filled with `value`."""
  lead = len(x.shape) - len(lows)
  cut = (slice(None),) * lead + tuple(slice(max(-lo, 0), x.shape[lead + i] - max(-hi, 0))
                                      for i, (lo, hi) in enumerate(zip(lows, highs)))
  x = x[cut]
  grow = ((0, 0),) * lead + tuple((max(lo, 0), max(hi, 0)) for lo, hi in zip(lows, highs))
  if not any(lo or hi for lo, hi in grow): return x
  padded = x.pad(grow)
  if value == 0: return padded
  inside = A.const(True, to_kc(torch.bool), tuple(x.shape)).pad(grow)
  return A.where(inside, padded, value)


def _patches(x, kernel, stride, dilation, lows, out, value=0.0):
  """The windows of x's last len(kernel) axes: an (*lead, *out, *kernel) view with
  result[..., o, k] = x[..., o * stride - low + k * dilation] (`value` outside x)."""
  lead = len(x.shape) - len(kernel)
  spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
  needed = [(o - 1) * s + span for o, s, span in zip(out, stride, spans)]
  highs = [need - n - lo for need, n, lo in zip(needed, x.shape[lead:], lows)]
  x = _spatial_pads(x, lows, highs, value)
  for i, span in enumerate(spans): x = x.windows(lead + i, span)
  steps = (slice(None),) * lead + tuple(slice(None, None, s) for s in stride) + \
    tuple(slice(None, None, d) for d in dilation)
  return x[steps] if any(s != 1 for s in stride) or any(d != 1 for d in dilation) else x


def _dilate(x, stride):
  """x with stride - 1 zeros between neighbours on its last len(stride) axes (the zero-dilation of a transposed
  convolution): length n becomes (n - 1) * stride + 1."""
  lead = len(x.shape) - len(stride)
  for i, s in enumerate(stride):
    if s == 1: continue
    axis = lead + i
    n = x.shape[axis]
    shape = tuple(x.shape)
    x = x.reshape(shape[:axis + 1] + (1,) + shape[axis + 1:])
    x = x.pad(((0, 0),) * (axis + 1) + ((0, s - 1),) + ((0, 0),) * (len(shape) - axis - 1))
    x = x.reshape(shape[:axis] + (n * s,) + shape[axis + 1:])
    x = x[(slice(None),) * axis + (slice(0, (n - 1) * s + 1),)]
  return x


# ----------------------------------------------------------------------------------------------- convolutions

def _correlate(x, w, groups: int, stride, dilation, lows, out):
  """The grouped cross-correlation torch calls convolution: x (N, C, *S), w (O, C / groups, *K) ->
  (N, O, *out), summed in the dtype x and w come in."""
  n, c = x.shape[0], x.shape[1]
  o, kernel = w.shape[0], tuple(w.shape[2:])
  nd = len(kernel)
  cg, og = c // groups, o // groups
  p = _patches(x, kernel, stride, dilation, lows, out)                       # (N, C, *out, *K)
  p = p.reshape((n, groups, 1, cg) + tuple(out) + kernel)                    # (N, G, 1, Cg, *out, *K)
  wk = w.reshape((1, groups, og, cg) + (1,) * nd + kernel)                   # (1, G, Og, Cg, 1.., *K)
  reduce_axes = (3,) + tuple(range(4 + nd, 4 + 2 * nd))
  return (p * wk).sum(reduce_axes).reshape((n, o) + tuple(out))


def _transposed_weight(w, groups: int):
  """A convolution weight (O, C / groups, *K) as the weight of its adjoint: (C, O / groups, *K), flipped in space."""
  o, cg, kernel = w.shape[0], w.shape[1], tuple(w.shape[2:])
  og = o // groups
  nd = len(kernel)
  w = w.reshape((groups, og, cg) + kernel).permute((0, 2, 1) + tuple(range(3, 3 + nd)))
  return w.flip(tuple(range(3, 3 + nd))).reshape((groups * cg, og) + kernel)


def _conv_shapes_check(x: torch.Tensor, w: torch.Tensor) -> Optional[str]:
  nd = w.dim() - 2
  if x.dim() != nd + 2:
    return f"a convolution of a {x.dim()}-D input with a {w.dim()}-D weight (kc lowers batched ones)"
  if nd not in (1, 2, 3): return f"a {nd}-D convolution"
  if x.dtype == torch.bool: return "a convolution of bool"
  return None


def _conv_check(node: torch.fx.Node) -> Optional[str]:
  return _conv_shapes_check(meta(node.args[0]), meta(node.args[1]))


def _conv_out(node: torch.fx.Node) -> tuple[int, ...]:
  return tuple(int(s) for s in meta(node).shape[2:])


@lowering(aten.convolution.default, check=_conv_check)
def _convolution(node, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
  nd = len(w.shape) - 2
  stride, padding, dilation = _per_dim(stride, nd), _per_dim(padding, nd), _per_dim(dilation, nd)
  out, dt = _conv_out(node), out_dtype(node)
  acc = opmath(dt)
  x, w = cast(x, acc), cast(w, acc)
  if transposed:
    kernel = tuple(w.shape[2:])
    lows = [d * (k - 1) - p for k, d, p in zip(kernel, dilation, padding)]
    y = _correlate(_dilate(x, stride), _transposed_weight(w, groups), groups, (1,) * nd, dilation, lows, out)
  else:
    y = _correlate(x, w, groups, stride, dilation, padding, out)
  if bias is not None: y = y + cast(bias, acc).reshape((-1,) + (1,) * nd)
  return cast(y, dt)


def _conv_input_grad(go, w, groups, stride, padding, dilation, size):
  """The gradient of conv(x, w) with respect to x (size: x's spatial shape): a stride-1 correlation of the
  zero-dilated gradient with the flipped, transposed weight."""
  kernel = tuple(w.shape[2:])
  lows = [d * (k - 1) - p for k, d, p in zip(kernel, dilation, padding)]
  flipped = _transposed_weight(w, groups)
  return _correlate(_dilate(go, stride), flipped, groups, (1,) * len(kernel), dilation, lows, size)


def _conv_weight_grad(x, go, groups, kernel, stride, padding, dilation):
  """The gradient of conv(x, w) with respect to w: sum over batch and output positions of the input's windows
  times the gradient. x (N, C, *S), go (N, O, *out) -> (O, C / groups, *K)."""
  n, c, o = x.shape[0], x.shape[1], go.shape[1]
  out, nd = tuple(go.shape[2:]), len(kernel)
  cg, og = c // groups, o // groups
  p = _patches(x, kernel, stride, dilation, padding, out).reshape((n, groups, 1, cg) + out + kernel)
  g = go.reshape((n, groups, og, 1) + out + (1,) * nd)
  return (p * g).sum((0,) + tuple(range(4, 4 + nd))).reshape((o, cg) + kernel)


def _conv_backward_check(node: torch.fx.Node) -> Optional[str]:
  return _conv_shapes_check(meta(node.args[1]), meta(node.args[2]))


@lowering(aten.convolution_backward.default, check=_conv_backward_check)
def _convolution_backward(node, go, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
                          output_mask):
  """(grad_input, grad_weight, grad_bias), None where output_mask is False."""
  nd = len(w.shape) - 2
  stride, padding, dilation = _per_dim(stride, nd), _per_dim(padding, nd), _per_dim(dilation, nd)
  kernel, size = tuple(w.shape[2:]), tuple(x.shape[2:])
  acc = opmath(out_dtype(node.args[0]))
  go_, x_, w_ = cast(go, acc), cast(x, acc), cast(w, acc)
  # the gradient stored once (unless it is already a plain buffer): both gradients read each of its values once per
  # window position, and a ReLU's mask or a pooling's spread in front of it would be computed again on every read
  if output_mask[0] or output_mask[1]: go_ = go_.realize()
  grads: list = [None, None, None]
  if output_mask[0]:
    if transposed:  # the adjoint of a transposed convolution is the convolution itself
      gi = _correlate(go_, w_, groups, stride, dilation, padding, size)
    else:
      gi = _conv_input_grad(go_, w_, groups, stride, padding, dilation, size)
    grads[0] = cast(gi, out_dtype(node, 0))
  if output_mask[1]:
    if transposed:  # the roles of input and gradient swap: windows of the gradient, weighted by the input
      gw = _conv_weight_grad(go_, x_, groups, kernel, stride, padding, dilation)   # (C_in, O / groups, *K)
    else:
      gw = _conv_weight_grad(x_, go_, groups, kernel, stride, padding, dilation)
    grads[1] = cast(gw, out_dtype(node, 1))
  if output_mask[2]:
    grads[2] = cast(go_.sum((0,) + tuple(range(2, 2 + nd))), out_dtype(node, 2))
  return tuple(grads)


# ------------------------------------------------------------------------------------------------------- pooling

def _pool_params(kernel_size, stride, padding, dilation=1):
  kernel = _per_dim(kernel_size, 2)
  stride = _per_dim(stride, 2) if stride else kernel  # [] means the kernel size
  return kernel, stride, _per_dim(padding, 2), _per_dim(dilation, 2)


def _lowest(dtype: torch.dtype):
  """The identity of max for `dtype`: -inf for floats, the smallest integer otherwise."""
  if dtype.is_floating_point: return -math.inf
  return False if dtype == torch.bool else torch.iinfo(dtype).min


def _positions(sizes, stride, dilation, padding, width: int, rank: int):
  """The flat index h * width + w (into the unpadded plane) of each element of (Ho, Wo, KH, KW) windows, as int64
  aligned to the last four of `rank` axes."""
  (ho, wo), (kh, kw) = sizes[:2], sizes[2:]
  lead = (1,) * (rank - 4)
  h = A.arange(ho).reshape(lead + (ho, 1, 1, 1)) * stride[0] + A.arange(kh).reshape(lead + (1, 1, kh, 1)) * dilation[0]
  w = A.arange(wo).reshape(lead + (1, wo, 1, 1)) * stride[1] + A.arange(kw).reshape(lead + (1, 1, 1, kw)) * dilation[1]
  return (h - padding[0]) * width + (w - padding[1])


def _index_dtype(plane: int):
  """The int type a pooling's window keys are computed in: int32 (kc computes it faster) while 4 * plane fits."""
  return A.dtypes.int32 if 4 * plane < 2 ** 31 else A.dtypes.int64


@lowering(aten.max_pool2d_with_indices.default)
def _max_pool2d_with_indices(node, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
  """(values, indices) as torch's CPU kernel: the max of each window (padding never wins); the index into the
  flattened input plane of the first element equal to it, or, where the window holds a NaN, of its last NaN (torch
  replaces its running max by every NaN it meets); the value is the element at that index (of -0.0 and 0.0, the
  first). Two reduces: the max, then one key per element whose largest names the index and, in its low bit, the
  sign of a zero there (the only case where the element at the index is not the max itself)."""
  kernel, stride, padding, dilation = _pool_params(kernel_size, stride, padding, dilation)
  out = tuple(int(s) for s in meta(node)[0].shape[-2:])
  height, width = x.shape[-2:]
  values = _patches(x, kernel, stride, dilation, padding, out, value=_lowest(out_dtype(node, 0)))
  inside = _patches(A.const(True, to_kc(torch.bool), (height, width)), kernel, stride, dilation, padding, out)
  top = values.max((-2, -1), keepdims=True)
  plane = height * width
  it = _index_dtype(plane)
  flat = _positions(out + kernel, stride, dilation, padding, width, len(values.shape)).astype(it)
  # one max finds both rules: a NaN's key (plane + index) beats every other, and the largest of them is the last NaN;
  # an element equal to the max has key plane - 1 - index, largest for the first one. Doubled, plus 1 for a -0.0
  negative_zero = _is_negative_zero(values).astype(it) if out_dtype(node, 0).is_floating_point else 0
  # the key as arithmetic on 0/1 flags, not as selects: C compilers branch on selects of float compares, and which
  # element of a window is its max is a coin toss on real data (a 2x2 pool of 8x16x32x32: 585 us on random values,
  # 230 on sorted ones, one thread). A NaN never equals the max, so at most one flag is set
  nan, hit = (inside & values.isnan()).astype(it), (inside & (values == top)).astype(it)
  key = nan * ((plane + flat) * 2 + 1) + hit * ((plane - 1 - flat) * 2 + negative_zero + 1) - 1
  best = key.max((-2, -1), keepdims=True)
  position = best >> 1
  index = A.where(position >= plane, position - plane, plane - 1 - position).astype(to_kc(out_dtype(node, 1)))
  if out_dtype(node, 0).is_floating_point:  # the element at the index: the max, or of -0.0 and 0.0 the first
    top = A.where(top == 0, A.where((best & 1) == 1, -0.0, 0.0), top)
  return top.reshape(top.shape[:-2]), index.reshape(index.shape[:-2])


def _gather_windows(per_output, kernel, stride, dilation, padding, size):
  """The adjoint of taking windows: for each input position (size: the spatial shape), the (KH, KW) entries of
  `per_output` (*lead, Ho, Wo) whose windows cover it, as a (*lead, H, W, KH, KW) view (0 where none does). An
  input position h is in window ho at kernel offset kh when ho * stride - padding + kh * dilation = h."""
  lows = [d * (k - 1) - p for k, d, p in zip(kernel, dilation, padding)]
  return _patches(_dilate(per_output, stride), kernel, (1,) * len(kernel), dilation, lows, size)


@lowering(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_backward(node, go, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
  """Each input position receives the gradients of the windows covering it whose index names it. The indices are
  those the forward gave (AOTAutograd saves them), so each lies in its own window: an index outside its window, which
  torch would scatter anyway, contributes nothing here."""
  kernel, stride, padding, dilation = _pool_params(kernel_size, stride, padding, dilation)
  height, width = x.shape[-2:]
  dt = out_dtype(node)
  it = _index_dtype(height * width)  # indices + 1 below, so that the zeros padding adds never name position 0
  out = tuple(go.shape[-2:])
  if tuple(stride) == tuple(kernel) and tuple(dilation) == (1, 1) and tuple(padding) == (0, 0) and \
     out[0] * kernel[0] <= height and out[1] * kernel[1] <= width:
    # windows that tile the plane: each input position is in at most one, so the backward is elementwise (a
    # window's gradient and index spread over its positions) instead of a reduce over the windows covering it
    lead = (1,) * (len(go.shape) - 2)
    rows, cols = A.arange(height).reshape(lead + (height, 1)), A.arange(width).reshape(lead + (1, width))
    named = _spread(indices.astype(it) + 1, kernel, (height, width))
    grads = cast(_where_else_zero(named == (rows * width + cols + 1).astype(it), _spread(cast(go, opmath(dt)), kernel, (height, width))), dt)
    # stored once: a convolution's backward reads each gradient KH * KW times and would otherwise recompute it per
    # read (conv_net's training step: 10.4 -> 9.4 ms)
    return grads.realize()
  grads = _gather_windows(cast(go, opmath(dt)), kernel, stride, dilation, padding, (height, width))
  named = _gather_windows(indices.astype(it) + 1, kernel, stride, dilation, padding, (height, width))
  lead = (1,) * (len(grads.shape) - 4)
  rows, cols = A.arange(height).reshape(lead + (height, 1, 1, 1)), A.arange(width).reshape(lead + (1, width, 1, 1))
  here = (rows * width + cols + 1).astype(it)
  return cast(_where_else_zero(named == here, grads).sum((-2, -1)), dt)


def _same_width_int(dtype):
  """The signed int dtype of a float's width: the one its bits are read as."""
  return getattr(A.dtypes, f"int{8 * dtype.itemsize}")


def _negative_zero_bits(dtype) -> int:
  """-0.0's bits as the same-width signed int: its smallest value, which no other float has."""
  return -(1 << (8 * dtype.itemsize - 1))


def _is_negative_zero(values):
  """Whether each float is -0.0, by one integer compare of its bits. 1 / x < 0 cost a division per element (a 2x2 pool
  with indices of 8x16x32x32, one thread: 317 -> 205 us); x == 0 and a sign-bit test, two compares (235 us)."""
  return values.bitcast(_same_width_int(values.dtype)) == _negative_zero_bits(values.dtype)


def _where_else_zero(cond, value):
  """where(cond, value, 0.0) of floats as eager's scatter into zeros gives it (0.0 + value: -0.0 becomes +0.0, NaN and
  infs stay), as an AND of the value's bits with a mask of cond (all ones, or none: +0.0) and an integer select for
  -0.0. C compilers branch on a select of floats, and which position of a window got its gradient is a coin toss on
  real data; integer masks and selects never branch (a 2x2 max pool's backward of 8x16x32x32 with the indices of
  random values, CLANG, one thread: 300 -> 65 us)."""
  bits = _same_width_int(value.dtype)
  masked = value.bitcast(bits) & -cond.astype(bits)
  return A.where(masked == _negative_zero_bits(value.dtype), 0, masked).bitcast(value.dtype)


def _spread(per_window, kernel, size):
  """(*lead, Ho, Wo) -> (*lead, H, W): each window's value on every position of its (KH, KW) window, for windows
  that tile the plane from its origin (stride = kernel, no padding), 0 past the last whole window."""
  (ho, wo), (kh, kw) = per_window.shape[-2:], kernel
  lead = tuple(per_window.shape[:-2])
  spread = per_window.reshape(lead + (ho, 1, wo, 1)).expand(lead + (ho, kh, wo, kw)).reshape(lead + (ho * kh, wo * kw))
  return spread.pad(((0, 0),) * len(lead) + ((0, size[0] - ho * kh), (0, size[1] - wo * kw)))


def _avg_divisors(x_size, out, kernel, stride, padding, count_include_pad, divisor_override):
  """torch's divisor of each (Ho, Wo) window: divisor_override, or the window's size clipped to the padded input
  (count_include_pad), or to the input itself; a Python int where it is the same for every window."""
  if divisor_override: return divisor_override
  counts = []
  for n, o, k, s, p in zip(x_size, out, kernel, stride, padding):
    starts = [i * s - p for i in range(o)]
    ends = [min(start + k, n + p) for start in starts]
    sizes = [e - b if count_include_pad else min(e, n) - max(b, 0) for b, e in zip(starts, ends)]
    counts.append(sizes[0] if len(set(sizes)) == 1 else None)
    if counts[-1] is None:  # windows at the edges are cut: the same formula on the output positions
      start = A.arange(o) * s - p
      end = A.minimum(start + k, n + p)
      counts[-1] = end - start if count_include_pad else A.minimum(end, n) - A.maximum(start, 0)
  rows, cols = counts
  return rows * cols if isinstance(rows, int) and isinstance(cols, int) else \
    (rows if isinstance(rows, int) else rows.reshape(-1, 1)) * cols


def _avg_check(node: torch.fx.Node) -> Optional[str]:
  return None if out_dtype(node).is_floating_point else f"an average pool of {out_dtype(node)}"


@lowering(aten.avg_pool2d.default, check=_avg_check)
def _avg_pool2d(node, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
  kernel, stride, padding, _ = _pool_params(kernel_size, stride, padding)
  out, dt = tuple(int(s) for s in meta(node).shape[-2:]), out_dtype(node)
  windows = _patches(cast(x, opmath(dt)), kernel, stride, (1, 1), padding, out)
  divisors = _avg_divisors(x.shape[-2:], out, kernel, stride, padding, count_include_pad, divisor_override)
  return cast(windows.sum((-2, -1)) / divisors, dt)


@lowering(aten.avg_pool2d_backward.default, check=_avg_check)
def _avg_pool2d_backward(node, go, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
  kernel, stride, padding, _ = _pool_params(kernel_size, stride, padding)
  out, dt = tuple(go.shape[-2:]), out_dtype(node)
  divisors = _avg_divisors(x.shape[-2:], out, kernel, stride, padding, count_include_pad, divisor_override)
  shares = cast(go, opmath(dt)) / divisors
  return cast(_gather_windows(shares, kernel, stride, (1, 1), padding, tuple(x.shape[-2:])).sum((-2, -1)), dt)


def _adaptive_windows(n: int, o: int):
  """torch's adaptive pooling windows along one axis: window i is [floor(i n / o), ceil((i + 1) n / o)), as an
  (o, n) bool membership and the (o,) window lengths."""
  i = A.arange(o)
  start, end = i * n // o, ((i + 1) * n + o - 1) // o
  at = A.arange(n)
  return (start.reshape(o, 1) <= at) & (at < end.reshape(o, 1)), end - start


@lowering(aten._adaptive_avg_pool2d.default, check=_avg_check)
def _adaptive_avg_pool2d(node, x, output_size):
  """The mean of each window, summed then divided by its height and by its width (torch's order). Where the output
  size divides the input's the windows tile it: a reshape; elsewhere they vary in size and may overlap, and each
  output sums the input under its (rows, columns) membership."""
  dt = out_dtype(node)
  (height, width), (ho, wo) = x.shape[-2:], tuple(int(s) for s in meta(node).shape[-2:])
  v = cast(x, opmath(dt))
  lead = tuple(x.shape[:-2])
  if height % ho == 0 and width % wo == 0:
    kh, kw = height // ho, width // wo
    return cast(v.reshape(lead + (ho, kh, wo, kw)).sum((-3, -1)) / kh / kw, dt)
  rows, row_len = _adaptive_windows(height, ho)
  cols, col_len = _adaptive_windows(width, wo)
  member = rows.reshape(ho, 1, height, 1) & cols.reshape(1, wo, 1, width)
  total = A.where(member, v.reshape(lead + (1, 1, height, width)), 0).sum((-2, -1))
  return cast(total / row_len.reshape(ho, 1) / col_len.reshape(1, wo), dt)


@lowering(aten._adaptive_avg_pool2d_backward.default, check=_avg_check)
def _adaptive_avg_pool2d_backward(node, go, x):
  dt = out_dtype(node)
  (height, width), (ho, wo) = x.shape[-2:], go.shape[-2:]
  g = cast(go, opmath(dt))
  lead = tuple(go.shape[:-2])
  if height % ho == 0 and width % wo == 0:
    kh, kw = height // ho, width // wo
    share = (g / kh / kw).reshape(lead + (ho, 1, wo, 1))
    return cast(share.expand(lead + (ho, kh, wo, kw)).reshape(lead + (height, width)), dt)
  rows, row_len = _adaptive_windows(height, ho)
  cols, col_len = _adaptive_windows(width, wo)
  share = g / row_len.reshape(ho, 1) / col_len.reshape(1, wo)                      # (*lead, Ho, Wo)
  member = rows.reshape(ho, 1, height, 1) & cols.reshape(1, wo, 1, width)          # (Ho, Wo, H, W)
  gathered = A.where(member, share.reshape(lead + (ho, wo, 1, 1)), 0)
  return cast(gathered.sum((-4, -3)), dt)


# ---------------------------------------------------------------------------------------------------- embeddings

def _one_hot_size(x: torch.Tensor, index: torch.Tensor) -> Optional[str]:
  work = x.numel() * index.numel()   # each index against each position of the axis, for every element of a row
  if work <= ONE_HOT_LIMIT: return None
  return f"a one-hot gather of {index.numel()} indices in a {tuple(x.shape)} tensor ({work} selects, over " \
    "kc_torch.lower_nn.ONE_HOT_LIMIT): kc.ast has no gather"


def _one_index(node: torch.fx.Node) -> Optional[str]:
  """None where the index list is one integer tensor after only None entries (x[:, :, idx]), else why not."""
  indices = node.args[1]
  tensors = [i for i in indices if i is not None]
  if len(tensors) != 1: return f"indexing with {len(tensors)} index tensors (kc lowers one)"
  if any(i is not None for i in indices[:-1]) or indices[-1] is None:
    return "an index tensor followed by other index entries (kc lowers x[:, ..., idx])"
  dt = meta(tensors[0]).dtype
  if dt.is_floating_point or dt in (torch.bool, torch.uint8): return f"indexing with a {dt} (mask) tensor"
  return _one_hot_size(meta(node.args[0]), meta(tensors[0]))


def _wrapped(index, n: int):
  """torch's reading of an index along an axis of length n: negative ones count from the end."""
  return A.where(index < 0, index + n, index)


def _select(x, axis: int, at, dt: torch.dtype):
  """x's entries at positions `at` (int64, any shape) along `axis`, as x.shape[:axis] + at.shape + x.shape[axis + 1:]:
  a one-hot selection, the max over the axis of x where the position is the index and the lowest value of the dtype
  elsewhere, so the selected element comes back bit for bit (-0.0 and NaN included); 0 where `at` is outside
  [0, n)."""
  n = x.shape[axis]
  pre, post, ishape = tuple(x.shape[:axis]), tuple(x.shape[axis + 1:]), tuple(at.shape)
  hit = at.reshape(ishape + (1,)) == A.arange(n)                                    # (*I, n)
  hit = hit.reshape((1,) * len(pre) + ishape + (n,) + (1,) * len(post))
  xs = x.reshape(pre + (1,) * len(ishape) + (n,) + post)
  picked = A.where(hit, xs, _lowest(dt)).max(len(pre) + len(ishape))
  valid = ((at >= 0) & (at < n)).reshape((1,) * len(pre) + ishape + (1,) * len(post))
  return cast(A.where(valid, picked, False if dt == torch.bool else 0), dt)


@lowering(aten.index.Tensor, check=_one_index)
def _index(node, x, indices):
  """x[:, ..., idx] (what an embedding of a 2-D or larger index decomposes to). torch raises for an index outside
  [-n, n); kc cannot raise in a kernel and gives 0 there."""
  axis = len(indices) - 1
  return _select(x, axis, _wrapped(cast(indices[-1], torch.int64), x.shape[axis]), out_dtype(node))


def _index_select_check(node: torch.fx.Node) -> Optional[str]:
  dt = meta(node.args[2]).dtype
  if dt not in (torch.int32, torch.int64): return f"index_select with a {dt} index"
  return _one_hot_size(meta(node.args[0]), meta(node.args[2]))


@lowering(aten.index_select.default, check=_index_select_check)
def _index_select(node, x, dim, index):
  """x.index_select(dim, index) (an embedding of a 0-D or 1-D index decomposes to it): index holds positions in
  [0, n); torch raises for others (negative ones too), kc gives 0 there."""
  axis = dim % max(len(x.shape), 1)
  at = cast(index, torch.int64)
  return _select(x, axis, at.reshape(1) if len(at.shape) == 0 else at, out_dtype(node))


def _index_put_check(node: torch.fx.Node) -> Optional[str]:
  if (why := _one_index(node)) is not None: return why
  accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
  if not accumulate: return "index_put without accumulate (torch keeps an unspecified one of repeated indices)"
  return None


@lowering(aten.index_put.default, check=_index_put_check)
def _index_put(node, x, indices, values, accumulate=False):
  """x with values[p] added at x[:, ..., idx[p]] for every position p (the backward of an embedding): for each
  target, the sum over positions of the values whose index names it. Positions are summed before they are added to
  x (torch adds them one by one; the rounding may differ), float16 and bfloat16 in float32; a target no index names
  keeps x's value as it is (-0.0 too). An index outside [-n, n), where torch raises, adds nothing."""
  axis = len(indices) - 1
  index = indices[-1]
  n = x.shape[axis]
  pre, post, ishape = tuple(x.shape[:axis]), tuple(x.shape[axis + 1:]), tuple(index.shape)
  dt = out_dtype(node)
  acc = opmath(dt)
  at = _wrapped(cast(index, torch.int64), n)
  hit = A.arange(n).reshape((n,) + (1,) * len(ishape)) == at                       # (n, *I)
  hit = hit.reshape((1,) * len(pre) + (n,) + ishape + (1,) * len(post))
  vs = cast(values, acc)
  vs = A.Expr.expand(vs.reshape((1,) * (len(pre) + len(ishape) + len(post) - len(vs.shape)) + tuple(vs.shape)),
                     pre + ishape + post)
  vs = vs.reshape(pre + (1,) + ishape + post)
  positions = tuple(range(len(pre) + 1, len(pre) + 1 + len(ishape)))
  added = A.where(hit, vs, 0).sum(positions)
  named = hit.any(positions)
  return cast(A.where(named, cast(x, acc) + added, cast(x, acc)), dt)
