"""kc_torch's nn lowerings (kc_torch/lower_nn.py) against torch eager: convolutions (forward, transposed, backward),
max and average pooling with their backwards, adaptive average pooling, and the embedding's gather and scatter-add.
Each compiled function runs in kc with no fallback (checked), or falls back with the reason its check gives."""
import math
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings, HealthCheck, strategies as st
import kc
import kc_torch
from kc_torch.lowering import LOWERINGS, Lowering

aten = torch.ops.aten
# kc's hand-coded opts unroll every loop of these tiny kernels, and rendering that takes most of a test's time; the
# end-to-end net runs with them
OPTIONS = {"device": "CLANG", "opts": "none"}
# halves: 2 ulp of the float64 result rounded once
TOLERANCE = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-12, rtol=1e-12),
             torch.bfloat16: dict(atol=1e-2, rtol=8e-3), torch.float16: dict(atol=2e-3, rtol=1e-3)}
HALF = (torch.float16, torch.bfloat16)


def _leaves(inputs, grad: bool, dtype=None):
  return [(x.to(dtype) if dtype and x.dtype in HALF else x).detach().clone().requires_grad_(
    grad and x.is_floating_point()) if isinstance(x, torch.Tensor) else x for x in inputs]


def _tuple(x): return x if isinstance(x, tuple) else (x,)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
  """Equal values with equal signs (-0.0 is not 0.0); NaN matches NaN whatever its payload (torch's own conversions
  change it)."""
  if not a.is_floating_point(): return torch.equal(a, b)
  bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
  nan = a.isnan()
  return torch.equal(nan, b.isnan()) and torch.equal(a.view(bits)[~nan], b.view(bits)[~nan])


def compare(fn, *inputs, grad=True, tolerance=None, exact=False):
  """fn compiled with backend "kc" against fn in eager: the outputs, and with grad the gradients of every float input
  for a random output gradient. Returns the fallbacks recorded while compiling and running. Half inputs are compared
  with eager in float64 on the same values: kc accumulates them in float32 and rounds once, where torch's CPU
  backward kernels round partial results too (their error is several times kc's). exact: the outputs bit for bit."""
  torch._dynamo.reset()
  kc_torch.clear_fallbacks()
  eager_in, kc_in = _leaves(inputs, grad, torch.float64), _leaves(inputs, grad)
  expected, got = _tuple(fn(*eager_in)), _tuple(torch.compile(fn, backend="kc", options=OPTIONS)(*kc_in))
  for e, g in zip(expected, got):
    tol = tolerance or TOLERANCE.get(g.dtype, dict(atol=0, rtol=0))
    torch.testing.assert_close(g, e.to(g.dtype), equal_nan=True, **tol)
    if exact: assert _same_bits(g, e.to(g.dtype))
  if grad:
    seeds = [torch.randn_like(g) for g in got if g.requires_grad]
    torch.autograd.backward([e for e in expected if e.requires_grad], [s.to(e.dtype) for s, e in zip(seeds, expected)])
    torch.autograd.backward([g for g in got if g.requires_grad], seeds)
    for e, g in zip(eager_in, kc_in):
      if isinstance(e, torch.Tensor) and e.requires_grad:
        torch.testing.assert_close(g.grad, e.grad.to(g.dtype), **(tolerance or TOLERANCE[g.dtype]))
  return kc_torch.fallbacks()


@pytest.fixture
def lowered(monkeypatch):
  """Records the arguments each named op's lowering is called with (proof that kc, not torch, ran it)."""
  calls: dict = {}

  def spy(*ops):
    for op in ops:
      original = LOWERINGS[op]

      def fn(node, *args, _op=op, _fn=original.fn, **kwargs):
        calls.setdefault(_op, []).append(node.args)
        return _fn(node, *args, **kwargs)
      monkeypatch.setitem(LOWERINGS, op, Lowering(fn, original.check))
    return calls
  return spy


# ------------------------------------------------------------------------------------------------- convolutions

def _conv_case(nd, n, c_in, c_out, groups, size, kernel, stride, padding, dilation, bias, dtype=torch.float32):
  x = torch.randn((n, c_in * groups) + size, dtype=dtype)
  w = torch.randn((c_out * groups, c_in) + kernel, dtype=dtype)
  b = torch.randn(c_out * groups, dtype=dtype) if bias else None
  conv = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
  return (lambda x, w, b: conv(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)), (x, w, b)


@st.composite
def conv2d_cases(draw):
  kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
  stride = (draw(st.integers(1, 3)), draw(st.integers(1, 2)))
  dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
  padding = tuple(draw(st.integers(0, k)) for k in kernel)
  # each spatial size leaves at least one output position
  size = tuple(draw(st.integers(max(d * (k - 1) + 1 - 2 * p, 1), 7)) for k, d, p in zip(kernel, dilation, padding))
  return dict(nd=2, n=draw(st.integers(1, 2)), c_in=draw(st.integers(1, 3)), c_out=draw(st.integers(1, 3)),
              groups=draw(st.integers(1, 2)), size=size, kernel=kernel, stride=stride, padding=padding,
              dilation=dilation, bias=draw(st.booleans()))


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv2d_cases())
def test_conv2d_property(case):
  fn, inputs = _conv_case(**case)
  assert compare(fn, *inputs) == []


@pytest.mark.parametrize("case", [
  dict(nd=1, n=2, c_in=3, c_out=2, groups=1, size=(9,), kernel=(3,), stride=(2,), padding=(1,), dilation=(2,),
       bias=True),
  dict(nd=3, n=1, c_in=1, c_out=2, groups=2, size=(4, 3, 5), kernel=(2, 1, 3), stride=(1, 1, 2), padding=(0, 1, 1),
       dilation=(1, 1, 1), bias=False),
  dict(nd=2, n=1, c_in=2, c_out=1, groups=3, size=(5, 4), kernel=(3, 2), stride=(2, 3), padding=(2, 0), dilation=(1, 1),
       bias=True, dtype=torch.float64),
  dict(nd=2, n=2, c_in=3, c_out=2, groups=1, size=(6, 5), kernel=(3, 3), stride=(1, 2), padding=(1, 1), dilation=(1, 1),
       bias=True, dtype=torch.bfloat16),
  dict(nd=1, n=1, c_in=2, c_out=2, groups=2, size=(7,), kernel=(2,), stride=(3,), padding=(0,), dilation=(3,),
       bias=True, dtype=torch.float16),
], ids=["conv1d", "conv3d-groups", "conv2d-float64", "conv2d-bfloat16", "conv1d-float16"])
def test_conv_forms(case):
  fn, inputs = _conv_case(**case)
  assert compare(fn, *inputs) == []


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_integer_conv_wraps_as_torch(dtype):
  """torch's CPU convolution of ints wraps on overflow; any order of the sum gives its value modulo 2**bits."""
  scale = 2 ** 20 if dtype == torch.int32 else 2 ** 52
  x, w = torch.randint(-scale, scale, (2, 3, 6, 5), dtype=dtype), torch.randint(-999, 999, (4, 3, 3, 2), dtype=dtype)
  fn = lambda x, w: F.conv2d(x, w, stride=2, padding=1)  # noqa: E731
  assert compare(fn, x, w, grad=False) == []


@pytest.mark.parametrize("nd, stride, padding, output_padding, dilation, groups", [
  (1, 2, 1, 1, 1, 1), (2, (2, 1), (1, 0), (1, 0), (1, 2), 2)])
def test_conv_transpose(nd, stride, padding, output_padding, dilation, groups):
  x = torch.randn((2, 2 * groups) + (4, 3)[:nd])
  w = torch.randn((2 * groups, 3) + (3, 2)[:nd])
  conv = (F.conv_transpose1d, F.conv_transpose2d)[nd - 1]
  fn = lambda x, w, b: conv(x, w, b, stride=stride, padding=padding, output_padding=output_padding,  # noqa: E731
                            dilation=dilation, groups=groups)
  assert compare(fn, x, w, torch.randn(3 * groups)) == []


def test_conv_backward_of_weights_only_runs_in_kc(lowered):
  """An input that needs no gradient asks convolution_backward for (None, grad_weight, grad_bias): the region
  takes the tuple with its None entry."""
  calls = lowered(aten.convolution_backward.default)
  x, w, b = torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3, requires_grad=True), torch.randn(4, requires_grad=True)
  torch._dynamo.reset()
  kc_torch.clear_fallbacks()
  fn = lambda w, b: F.conv2d(x, w, b, padding=1)  # noqa: E731
  got = torch.compile(fn, backend="kc", options=OPTIONS)(w, b)
  we, be = w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
  expected = fn(we, be)
  seed = torch.randn_like(expected)
  got.backward(seed)
  expected.backward(seed)
  torch.testing.assert_close(w.grad, we.grad)
  torch.testing.assert_close(b.grad, be.grad)
  assert kc_torch.fallbacks() == []
  assert {tuple(args[-1]) for args in calls[aten.convolution_backward.default]} == {(False, True, True)}


def _node(target, *args, result):
  """A graph node calling `target`, whose tensor arguments and result carry only their meta values."""
  graph = torch.fx.Graph()
  placed = []
  for i, a in enumerate(args):
    if isinstance(a, torch.Tensor):
      p = graph.placeholder(f"x{i}")
      p.meta["val"] = a
      placed.append(p)
    elif isinstance(a, list) and any(isinstance(t, torch.Tensor) for t in a):
      entries = []
      for j, t in enumerate(a):
        if t is None: entries.append(None); continue
        p = graph.placeholder(f"x{i}_{j}")
        p.meta["val"] = t
        entries.append(p)
      placed.append(entries)
    else: placed.append(a)
  node = graph.call_function(target, tuple(placed))
  node.meta["val"] = result
  return node


def test_refused_convolutions():
  from kc_torch.partition import why_not
  meta = lambda *shape, dtype=torch.float32: torch.empty(shape, dtype=dtype, device="meta")  # noqa: E731
  conv = aten.convolution.default
  assert why_not(_node(conv, meta(1, 1, 4, dtype=torch.bool), meta(1, 1, 2, dtype=torch.bool), None, [1], [0], [1],
                       False, [0], 1, result=meta(1, 1, 3, dtype=torch.bool))) == "a convolution of bool"
  assert why_not(_node(conv, meta(1, 4), meta(2, 1, 4), None, [1], [0], [1], False, [0], 1,
                       result=meta(2, 1))) == "a convolution of a 2-D input with a 3-D weight (kc lowers batched ones)"


# ------------------------------------------------------------------------------------------------------ pooling

def _max_pool(x, kernel, stride, padding, dilation, ceil_mode):
  return F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode=ceil_mode, return_indices=True)


def test_max_pool_values_and_indices_with_nan_inf_and_ties():
  """torch's rules: the first of equal maxima; the last NaN of a window; padding never wins, even against -inf."""
  nan, inf = math.nan, math.inf
  x = torch.tensor([[1., nan, 2., 2., -inf],
                    [nan, 0., 5., 5., -inf],
                    [3., 3., 3., 1., -inf],
                    [-inf, -inf, 1., nan, nan],
                    [-inf, -inf, -0., 0., -inf]]).reshape(1, 1, 5, 5).repeat(2, 3, 1, 1)
  fn = lambda x: (_max_pool(x, (2, 3), (1, 2), (1, 1), (1, 1), False)  # noqa: E731
                  + _max_pool(x, (2, 2), (2, 2), (0, 0), (2, 1), True))
  assert compare(fn, x, grad=False, exact=True) == []
  # of -0.0 and 0.0 the first is the value, with its sign (the windows of the last row hold both, in both orders)
  z = torch.tensor([[-0., 0., 0., -0.], [-1., -2., -3., -4.]]).reshape(1, 1, 2, 4)
  got = torch.compile(lambda x: _max_pool(x, (2, 2), (2, 2), (0, 0), (1, 1), False)[0], backend="kc")(z)
  assert torch.equal(torch.signbit(got), torch.signbit(_max_pool(z, (2, 2), (2, 2), (0, 0), (1, 1), False)[0]))
  assert torch.signbit(got).tolist() == [[[[True, False]]]]
  ints = torch.randint(-3, 3, (2, 3, 5, 5))
  assert compare(lambda x: _max_pool(x, (3, 2), (1, 1), (1, 1), (1, 1), False), ints, grad=False) == []


@pytest.mark.parametrize("shape, kernel, stride, padding, dilation, ceil_mode, dtype", [
  ((2, 3, 7, 6), (3, 2), (2, 2), (1, 1), (1, 2), True, torch.float32),
  ((3, 6, 5), (2, 2), (1, 1), (0, 1), (1, 1), False, torch.bfloat16),
  # windows that tile the plane (the elementwise backward): a row and a column past the last window, 3x2 windows,
  # and a last window ceil_mode cuts (the general form)
  ((2, 3, 7, 6), (2, 2), (2, 2), (0, 0), (1, 1), False, torch.float32),
  ((2, 4, 9, 8), (3, 2), (3, 2), (0, 0), (1, 1), False, torch.bfloat16),
  ((1, 2, 7, 7), (2, 2), (2, 2), (0, 0), (1, 1), True, torch.float32),
])
def test_max_pool_backward(shape, kernel, stride, padding, dilation, ceil_mode, dtype):
  """Overlapping windows (stride 1) send one input several gradients; ties on bfloat16's coarse values and on small
  integers (the first of equal elements gets the gradient)."""
  x = torch.randn(shape).to(dtype)
  assert compare(lambda x: _max_pool(x, kernel, stride, padding, dilation, ceil_mode)[0], x.round()) == []
  fn = lambda x: _max_pool(x, kernel, stride, padding, dilation, ceil_mode)[0]  # noqa: E731
  assert compare(fn, x) == []


def test_avg_pool():
  """Windows cut by the padding and by ceil_mode's last window, counted with and without the padding, and an
  override of the divisor."""
  cases = [((3, 2), (2, 1), (1, 1), True, True, None), ((3, 3), (2, 2), (1, 0), True, False, None),
           ((2, 2), (1, 2), (0, 1), False, True, 3)]
  fn = lambda x: tuple(F.avg_pool2d(x, *case) for case in cases)  # noqa: E731
  assert compare(fn, torch.randn(2, 3, 6, 5)) == []


def test_avg_pool_bfloat16_unbatched():
  assert compare(lambda x: F.avg_pool2d(x, 3, 2, 1), torch.randn(3, 7, 6).bfloat16()) == []


def test_adaptive_avg_pool():
  """An output size that tiles the input (a reshape), and one whose windows vary in size and overlap."""
  fn = lambda x, y: (F.adaptive_avg_pool2d(x, (3, 2)), F.adaptive_avg_pool2d(y, (3, 4)))  # noqa: E731
  assert compare(fn, torch.randn(2, 3, 6, 4), torch.randn(2, 5, 7)) == []


# --------------------------------------------------------------------------------------------------- embeddings

@pytest.mark.parametrize("indices", [[[2, 3, 2], [1, 5, 0]], [4, 1, 2, 2]], ids=["2d-index", "1d-index_select"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embedding(indices, dtype):
  """Repeated and padding indices; the rows come back bit for bit (-0.0 and NaN too), and the gradient sums the
  rows' gradients."""
  weight = torch.randn(6, 3).to(dtype)
  weight[2, 0], weight[3, 1] = -0.0, math.nan
  fn = lambda w, i: F.embedding(i, w, padding_idx=1)  # noqa: E731
  assert compare(fn, weight, torch.tensor(indices), exact=True) == []


def test_index_on_a_later_axis_and_index_put():
  """x[:, idx] with a negative index (from the end) and a repeated one; index_put adds at repeated positions and
  leaves untouched ones as they are (-0.0 too). Whole numbers, so that any order of the sums is exact."""
  x, idx = torch.randint(-9, 9, (3, 5, 2)).float(), torch.tensor([4, 0, -2, 4])
  x[:, 1] = -0.0
  assert compare(lambda x: x[:, idx], x, exact=True) == []
  values = torch.randint(-9, 9, (4, 1)).float()
  assert compare(lambda x, v: aten.index_put.default(x, [None, idx], v, True), x, values, exact=True, grad=False) == []


def test_indices_torch_refuses_give_zero_rows():
  """torch raises for an index out of range; a kernel cannot, and kc gives a row of zeros (index_select: negative
  indices too, which torch refuses there)."""
  w = torch.randn(5, 3)
  torch._dynamo.reset()
  got = torch.compile(lambda w, i: w[i], backend="kc", options=OPTIONS)(w, torch.tensor([[0, 7], [-6, -5]]))
  assert torch.equal(got, torch.stack([torch.stack([w[0], torch.zeros(3)]), torch.stack([torch.zeros(3), w[0]])]))
  torch._dynamo.reset()
  got = torch.compile(lambda w, i: F.embedding(i, w), backend="kc", options=OPTIONS)(w, torch.tensor([-1, 3, 5]))
  assert torch.equal(got, torch.stack([torch.zeros(3), w[3], torch.zeros(3)]))


def test_other_index_forms_fall_back():
  """Two index tensors, and index_put that overwrites (torch keeps one of repeated indices), run in torch."""
  x, rows, cols = torch.randn(4, 5), torch.tensor([0, 3]), torch.tensor([1, 1])
  reasons = {f.reason for f in compare(lambda x: x[rows, cols], x, grad=False)}
  assert reasons == {"indexing with 2 index tensors (kc lowers one)"}
  reasons = {f.reason for f in compare(lambda x, v: torch.index_put(x, (rows,), v), x, torch.randn(2, 5), grad=False)}
  assert reasons == {"index_put without accumulate (torch keeps an unspecified one of repeated indices)"}


def test_refused_index_forms():
  """A gather past ONE_HOT_LIMIT (a language model's vocabulary) and a boolean mask are left to torch."""
  from kc_torch.partition import why_not
  from kc_torch.lower_nn import ONE_HOT_LIMIT
  meta = lambda *shape, dtype=torch.float32: torch.empty(shape, dtype=dtype, device="meta")  # noqa: E731
  table, idx = meta(ONE_HOT_LIMIT // 64, 64), meta(2, dtype=torch.int64)
  assert "ONE_HOT_LIMIT" in why_not(_node(aten.index_select.default, table, 0, idx, result=meta(2, 64)))
  assert "ONE_HOT_LIMIT" in why_not(_node(aten.index.Tensor, table, [idx], result=meta(2, 64)))
  assert "ONE_HOT_LIMIT" in why_not(_node(aten.index_put.default, table, [idx], meta(2, 64), True, result=table))
  assert why_not(_node(aten.index_select.default, table, 0, idx[:1], result=meta(1, 64))) is None
  mask = meta(4, dtype=torch.bool)
  assert why_not(_node(aten.index.Tensor, meta(4, 3), [mask], result=meta(2, 3))) == \
    "indexing with a torch.bool (mask) tensor"


def test_conv_net_forward_and_backward():
  torch.manual_seed(0)
  net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 4, 3, stride=2),
                      nn.Flatten(), nn.Linear(4, 2))
  x = torch.randn(2, 3, 8, 8)
  torch._dynamo.reset()
  kc_torch.clear_fallbacks()
  compiled = torch.compile(net, backend="kc", options={"device": "CLANG"})
  got = compiled(x)
  got.sum().backward()
  grads = [p.grad.clone() for p in net.parameters()]
  net.zero_grad()
  expected = net(x)
  expected.sum().backward()
  torch.testing.assert_close(got, expected)
  for g, p in zip(grads, net.parameters()): torch.testing.assert_close(g, p.grad)
  assert kc_torch.fallbacks() == []


@pytest.mark.parametrize("shape, dim, dtype", [((6, 33), -1, torch.float32), ((5, 4, 7), 1, torch.float64),
                                               ((3, 17), 0, torch.bfloat16), ((0, 5), -1, torch.float32),
                                               ((4, 0), 1, torch.float32)])
def test_softmax_scales_each_row_by_its_sums_reciprocal(shape, dim, dtype):
  """kc-torch's softmax decomposition multiplies by 1/sum (torch's CPU kernel does too): the values and gradients
  match eager along any dim, halves included, and empty tensors run in kc as well (torch's decomposition)."""
  x = (torch.randn(shape) * 4).to(dtype)
  assert compare(lambda x: x.softmax(dim) * 2, x) == []
  from kc_torch.decompositions import softmax
  traced = torch.fx.experimental.proxy_tensor.make_fx(lambda x: softmax(x, -1, False))(torch.randn(3, 5))
  targets = [n.target for n in traced.graph.nodes if n.op == "call_function"]
  assert torch.ops.aten.reciprocal.default in targets and torch.ops.aten.div.Tensor not in targets


def test_max_pool_backward_masks_its_gradient_without_a_float_select_and_keeps_special_gradients(monkeypatch):
  # which position of a window got its gradient is a coin toss: the tiled backward (and the general one) mask the
  # gradient's bits instead of selecting floats, which C compilers compile to branches. A gradient's NaN, infs and
  # -0.0 reach their positions as they are, every other position gets +0.0, as eager's scatter gives
  from kc_torch.region import KcRegion
  monkeypatch.setattr(KcRegion, "_programs", {})
  torch.manual_seed(0)
  for kernel, stride in (((2, 2), (2, 2)), ((3, 3), (1, 1))):
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    g = torch.randn(2, 3, *F.max_pool2d(x, kernel, stride).shape[-2:])
    g[0, 0, 0, 0], g[0, 1, 1, 1], g[1, 2, 0, 1], g[1, 0, 2, 2] = math.nan, math.inf, -math.inf, -0.0
    torch._dynamo.reset()
    torch.compile(lambda x, k=kernel, s=stride: F.max_pool2d(x, k, s), backend="kc")(x).backward(g)
    got, x.grad = x.grad, None
    F.max_pool2d(x, kernel, stride).backward(g)
    assert torch.equal(torch.isnan(got), torch.isnan(x.grad))
    exact = kernel == stride   # each input position gets one window's gradient, or sums several (in another order)
    torch.testing.assert_close(got.nan_to_num(0.0), x.grad.nan_to_num(0.0), rtol=0 if exact else 1e-5, atol=0 if exact else 1e-6)
    assert torch.equal(torch.signbit(got.nan_to_num(0.0)), torch.signbit(x.grad.nan_to_num(0.0)))
  kernels = [ck for plan in KcRegion._programs.values() for ck in getattr(plan.program, "kernels", [plan.program])]
  # the backward's kernels: one float32 output, computed from the saved int64 indices
  backward = [ck for ck in kernels if len(ck.kernel.ast.src) == 1 and ck.kernel.ast.src[0].src[2].dtype.base == kc.dtypes.float32
              and any(u.op is kc.Ops.LOAD and u.dtype == kc.dtypes.int64 for u in ck.kernel.ast.toposort)]
  assert backward and not any(u.op is kc.Ops.WHERE and kc.dtypes.is_float(u.dtype) for ck in backward for u in ck.kernel.ast.toposort)
