"""ATen ops as kc.ast expressions: the table the partitioner asks ("can kc run this node exactly?") and the region
builder calls ("give me its value").

Each entry is a function of the FX node and its arguments, where every argument that was a node is now its value (a
kc.ast Expr for a tensor, a Python number for a SymInt). Dtypes follow torch, not numpy: the node's own result dtype
(from its FakeTensor) is what every entry casts to, and elementwise math on float16 and bfloat16 runs in float32 and is
rounded once per op, as torch's CPU kernels do (its "opmath" type). An op whose meaning kc cannot match exactly (integer
division by zero raises in torch, random numbers, in-place updates) has no entry or a check that says why, and the
partitioner leaves it to torch."""
from __future__ import annotations
import math, operator
from dataclasses import dataclass
from typing import Any, Callable, Optional
import torch
import torch.fx
from kc import ast as A
from kc_torch.dtypes import HALF, opmath, supported, to_kc

aten = torch.ops.aten
Check = Callable[[torch.fx.Node], Optional[str]]


@dataclass(frozen=True)
class Lowering:
  fn: Callable[..., Any]   # fn(node, *args, **kwargs) -> an Expr, or a tuple of them for ops with several results
  check: Check             # None where this node lowers exactly, else the reason it does not


LOWERINGS: dict[Any, Lowering] = {}


def _always(node: torch.fx.Node) -> Optional[str]: return None


def lowering(*ops, check: Check = _always):
  """Register `fn` as the lowering of each of `ops` (OpOverloads, or OpOverloadPackets for all their overloads)."""
  def register(fn):
    for op in ops:
      for overload in ([getattr(op, name) for name in op.overloads()] if isinstance(op, torch._ops.OpOverloadPacket) else [op]):
        LOWERINGS[overload] = Lowering(fn, check)
    return fn
  return register


# ------------------------------------------------------------------------------------------------------------- meta

def meta(node) -> Any:
  return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def out_dtype(node: torch.fx.Node, i: Optional[int] = None) -> torch.dtype:
  val = meta(node)
  return (val[i] if i is not None else val).dtype


def _probe(v) -> Any:
  """A stand-in with v's dtype and dimensionality (0-d tensors promote like scalars in torch), for torch.result_type."""
  m = meta(v)
  if isinstance(m, torch.Tensor): return torch.empty((1,) * m.dim(), dtype=m.dtype)
  return m


def result_type(a, b) -> torch.dtype:
  """torch's type promotion of two operands (tensors by dtype and dimensionality, Python numbers by kind)."""
  return torch.result_type(_probe(a), _probe(b))


def tensor_dtypes(node: torch.fx.Node) -> list[torch.dtype]:
  """The dtypes of every tensor the node reads or makes."""
  vals = [meta(a) for a in node.all_input_nodes] + [meta(node)]
  flat: list[Any] = []
  for v in vals: flat.extend(v if isinstance(v, (tuple, list)) else [v])
  return [v.dtype for v in flat if isinstance(v, torch.Tensor)]


def dtypes_check(node: torch.fx.Node) -> Optional[str]:
  bad = sorted({str(d) for d in tensor_dtypes(node) if not supported(d)})
  return f"dtype {', '.join(bad)} has no kc dtype" if bad else None


def cast(x, dtype: torch.dtype):
  """x as `dtype`: an Expr is cast (a no-op when it has the dtype), a Python number stays a weak scalar."""
  if not isinstance(x, A.Expr): return x
  dt = to_kc(dtype)
  return x if x.dtype == dt else x.astype(dt)


def _axes(dims, ndim: int) -> tuple[int, ...]:
  if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0): return tuple(range(ndim))
  dims = dims if isinstance(dims, (list, tuple)) else [dims]
  return tuple(sorted(d % max(ndim, 1) for d in dims))


# ---------------------------------------------------------------------------------------------------- elementwise

def elementwise(node: torch.fx.Node, fn: Callable[..., Any], *args):
  """fn over args cast to the dtype torch computes the node in (its result dtype, or float32 for halves), then
  rounded to the result dtype. A tensor operand is first cast to the result dtype, as torch's TensorIterator casts
  every input to the common dtype before a half kernel computes in float32 (an int64 667 divides a bfloat16 as
  bfloat16(667) = 668), except a 0-d one in the second place: torch's half mul and div read that CPU scalar's
  original value in float32 (TensorIterator.original_scalar_value; add and sub round it first, _scalar_in)."""
  out = out_dtype(node)
  compute = opmath(out)
  def operand(i: int, a):
    return cast(a, out) if isinstance(a, A.Expr) and (a.shape or i != 1 or len(args) != 2) else a
  return cast(fn(*(cast(operand(i, a), compute) for i, a in enumerate(args))), out)


def _binary(fn):
  def lower(node, a, b, alpha=1):
    if alpha != 1: return elementwise(node, lambda x, y: fn(x, y * alpha), a, b)
    return elementwise(node, fn, a, b)
  return lower


def _scalar_in(dtype: torch.dtype):
  """torch's CPU add and sub (not mul or div) round a Python-number operand, and a 0-d tensor, to the tensor's dtype
  before the float32 math of a half or bfloat16 op: x + 0.1 adds half(0.1), x + tensor(667) adds bfloat16(667)."""
  def rounded(x):
    if dtype not in HALF: return x
    if isinstance(x, float): return float(torch.tensor(x, dtype=dtype))
    return cast(x, dtype) if isinstance(x, A.Expr) and not x.shape else x
  return rounded


def _additive(fn):
  def lower(node, a, b, alpha=1):
    r = _scalar_in(out_dtype(node))
    return _binary(fn)(node, r(a), r(b), alpha)
  return lower


lowering(aten.add.Tensor, aten.add.Scalar)(_additive(operator.add))
lowering(aten.sub.Tensor, aten.sub.Scalar)(_additive(operator.sub))
lowering(aten.mul.Tensor, aten.mul.Scalar)(_binary(operator.mul))
lowering(aten.maximum.default)(_binary(A.maximum))
lowering(aten.minimum.default)(_binary(A.minimum))
lowering(aten.rsub.Scalar, aten.rsub.Tensor)(_additive(lambda a, b: b - a))


def _true_division(node: torch.fx.Node) -> Optional[str]:
  mode = node.kwargs.get("rounding_mode")
  return None if mode is None else f"division with rounding_mode={mode!r} (torch raises on an integer 0 divisor; " \
    "kc's floor of a float quotient may differ in its last bit)"


@lowering(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode, check=_true_division)
def _div(node, a, b, rounding_mode=None):
  return elementwise(node, operator.truediv, a, b)


def _unary(fn):
  def lower(node, x): return elementwise(node, fn, x)
  return lower


def _float_result(node: torch.fx.Node) -> Optional[str]:
  return None if out_dtype(node).is_floating_point else "an int result of a float function"


for _op, _fn in [(aten.exp, A.Expr.exp), (aten.log, A.Expr.log), (aten.sqrt, A.Expr.sqrt), (aten.sin, A.Expr.sin),
                 (aten.cos, A.Expr.cos), (aten.tanh, A.Expr.tanh), (aten.sigmoid, A.Expr.sigmoid),
                 (aten.reciprocal, A.Expr.recip), (aten.exp2, A.Expr.exp2), (aten.log2, A.Expr.log2),
                 (aten.rsqrt, lambda x: x.sqrt().recip())]:
  lowering(_op.default, check=_float_result)(_unary(_fn))
lowering(aten.neg.default)(_unary(operator.neg))
lowering(aten.abs.default)(_unary(abs))
lowering(aten.relu.default)(_unary(lambda x: A.maximum(x, 0)))
lowering(aten.floor.default)(_unary(A.Expr.floor))
lowering(aten.ceil.default)(_unary(A.Expr.ceil))
lowering(aten.trunc.default)(_unary(A.Expr.trunc))
lowering(aten.round.default)(_unary(A.Expr.rint))
lowering(aten.sign.default)(_unary(A.Expr.sign))
lowering(aten.silu.default)(_unary(lambda x: x * x.sigmoid()))
lowering(aten.expm1.default, check=_float_result)(_unary(lambda x: x.exp() - 1))
lowering(aten.log1p.default, check=_float_result)(_unary(lambda x: (x + 1).log()))


def _erf(x):
  """erf in float32, to a few float32 ulp: an odd Taylor polynomial below 0.5 (relative accuracy near 0, where erf is
  about 2x/sqrt(pi)), above it 1 - erfc with Numerical Recipes' Chebyshev fit of erfc (fractional error < 1.2e-7)."""
  a = abs(x)
  x2 = x * x
  small = x * (1.1283791670955126 + x2 * (-0.37612638903183754 + x2 * (0.11283791670955126 + x2 * (
    -0.026866170645131252 + x2 * (0.005223977625442188 + x2 * (-0.0008548327023450852 + x2 * 0.00012055332981789664))))))
  t = 1 / (1 + 0.5 * a)
  poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (0.27886807 + t * (
    -1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
  erfc = t * (-a * a + poly).exp()
  large = A.where(x < 0, erfc - 1, 1 - erfc)
  return A.where(a < 0.5, small, large)


def _erf_dtype(node: torch.fx.Node) -> Optional[str]:
  return None if out_dtype(node) in (torch.float32, torch.float16, torch.bfloat16) else \
    f"erf of {out_dtype(node)} (kc's erf is accurate to float32)"


lowering(aten.erf.default, check=_erf_dtype)(_unary(_erf))


@lowering(aten.pow.Tensor_Scalar)
def _pow_scalar(node, x, exponent):
  return elementwise(node, lambda v: v ** exponent, x)


@lowering(aten.pow.Tensor_Tensor, check=lambda n: None if out_dtype(n).is_floating_point else "an int power")
def _pow_tensor(node, x, y):
  return elementwise(node, operator.pow, x, y)


@lowering(aten.clamp.default, aten.clamp.Tensor)
def _clamp(node, x, min=None, max=None):  # noqa: A002
  return elementwise(node, lambda v, lo, hi: A.clip(v, lo, hi), x, min, max)


lowering(aten.clamp_min.default, aten.clamp_min.Tensor)(_binary(A.maximum))
lowering(aten.clamp_max.default, aten.clamp_max.Tensor)(_binary(A.minimum))


def _compare(fn):
  def lower(node, a, b):
    common = opmath(result_type(node.args[0], node.args[1]))
    return fn(cast(a, common), cast(b, common))
  return lower


for _name, _fn in [("lt", operator.lt), ("le", operator.le), ("gt", operator.gt), ("ge", operator.ge),
                   ("eq", operator.eq), ("ne", operator.ne)]:
  _packet = getattr(aten, _name)
  lowering(_packet.Tensor, _packet.Scalar)(_compare(_fn))


@lowering(aten.logical_not.default)
def _logical_not(node, x): return A.logical_not(x)


lowering(aten.logical_and.default)(lambda node, a, b: A.logical_and(a, b))
lowering(aten.logical_or.default)(lambda node, a, b: A.logical_or(a, b))
lowering(aten.logical_xor.default)(lambda node, a, b: A.logical_xor(a, b))


def _int_or_bool(node: torch.fx.Node) -> Optional[str]:
  return None if not out_dtype(node).is_floating_point else "a bitwise op of floats"


lowering(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, check=_int_or_bool)(_binary(operator.and_))
lowering(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, check=_int_or_bool)(_binary(operator.or_))
lowering(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, check=_int_or_bool)(_binary(operator.xor))
lowering(aten.bitwise_not.default, check=_int_or_bool)(_unary(operator.invert))


@lowering(aten.isnan.default)
def _isnan(node, x): return x.isnan()


@lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(node, cond, a, b):
  out = out_dtype(node)
  return cast(A.where(cond, cast(a, out), cast(b, out)), out)


@lowering(aten._to_copy.default, aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default,
          aten._conj.default, aten.detach.default,
          check=lambda n: None if n.kwargs.get("device") in (None,) or meta(n.args[0]).device == n.kwargs["device"]
          else "a copy to another device")
def _copy(node, x, **kwargs):
  return cast(x, out_dtype(node))


@lowering(torch.ops.prims.convert_element_type.default)
def _convert(node, x, dtype):
  return cast(x, dtype)


# ----------------------------------------------------------------------------------------------------- creation

def _shape_of(node: torch.fx.Node) -> tuple[int, ...]:
  return tuple(int(s) for s in meta(node).shape)


@lowering(aten.full.default, aten.full_like.default, aten.zeros_like.default, aten.ones_like.default,
          aten.scalar_tensor.default, aten.zeros.default, aten.ones.default, aten.new_full.default,
          aten.new_zeros.default, aten.new_ones.default, aten.empty_like.default)
def _full(node, *args, **kwargs):
  fill = {aten.full.default: 1, aten.full_like.default: 1, aten.new_full.default: 2}.get(node.target)
  value = args[fill] if fill is not None else args[0] if node.target is aten.scalar_tensor.default else \
    1 if node.target in (aten.ones_like.default, aten.ones.default, aten.new_ones.default) else 0
  dt = out_dtype(node)
  value = bool(value) if dt == torch.bool else float(value) if dt.is_floating_point else int(value)
  return A.const(value, to_kc(dt), _shape_of(node))


@lowering(aten.arange.start_step, aten.arange.start, aten.arange.default)
def _arange(node, *args, **kwargs):
  bounds = [a for a in args if isinstance(a, (int, float))]
  return A.arange(*bounds, dtype=to_kc(out_dtype(node)))


# ---------------------------------------------------------------------------------------------------- reductions

def _reduce(method: str, acc: Callable[[torch.dtype], torch.dtype]):
  def lower(node, x, dims=None, keepdim=False, dtype=None, **kwargs):
    out = out_dtype(node)
    axes = _axes(dims, len(x.shape))
    v = cast(x, acc(out)) if method in ("sum", "prod") else x
    return cast(getattr(v, method)(axes, keepdims=keepdim) if len(x.shape) else v, out)
  return lower


lowering(aten.sum.dim_IntList, aten.sum.default)(_reduce("sum", opmath))
lowering(aten.prod.dim_int, aten.prod.default)(_reduce("prod", opmath))
lowering(aten.amax.default, aten.max.default)(_reduce("max", lambda d: d))
lowering(aten.amin.default, aten.min.default)(_reduce("min", lambda d: d))
lowering(aten.any.dim, aten.any.dims, aten.any.default)(_reduce("any", lambda d: d))
lowering(aten.all.dim, aten.all.dims, aten.all.default)(_reduce("all", lambda d: d))


@lowering(aten.mean.dim, aten.mean.default)
def _mean(node, x, dims=None, keepdim=False, dtype=None):
  out = out_dtype(node)
  axes = _axes(dims, len(x.shape))
  n = math.prod(x.shape[a] for a in axes)
  return cast(cast(x, opmath(out)).sum(axes, keepdims=keepdim) / n, out)


def _var_mean_parts(x, dims, correction, keepdim, out: torch.dtype):
  axes = _axes(dims, len(x.shape))
  n = math.prod(x.shape[a] for a in axes)
  v = cast(x, opmath(out))
  mean = v.sum(axes, keepdims=True) / n
  var = ((v - mean) * (v - mean)).sum(axes, keepdims=keepdim) / max(n - correction, 0)
  return cast(var, out), cast(mean if keepdim else mean.reshape(var.shape), out)


@lowering(aten.var_mean.correction)
def _var_mean(node, x, dims=None, *, correction=1, keepdim=False):
  return _var_mean_parts(x, dims, 1 if correction is None else correction, keepdim, out_dtype(node, 0))


@lowering(aten.var.correction)
def _var(node, x, dims=None, *, correction=1, keepdim=False):
  return _var_mean_parts(x, dims, 1 if correction is None else correction, keepdim, out_dtype(node))[0]


@lowering(aten.argmax.default, aten.argmin.default,
          check=lambda n: None if not out_dtype(n).is_floating_point and all(
            not d.is_floating_point or d in (torch.float32, torch.float64) for d in tensor_dtypes(n)) else "argmax of half")
def _argmax(node, x, dim=None, keepdim=False):
  method = "argmax" if node.target is aten.argmax.default else "argmin"
  return getattr(x, method)(dim, keepdims=keepdim) if dim is not None or not keepdim else \
    getattr(x, method)().reshape((1,) * len(x.shape))


@lowering(aten.max.dim, aten.min.dim,
          check=lambda n: None if all(not d.is_floating_point or d in (torch.float32, torch.float64)
                                      for d in tensor_dtypes(n)) else "max/min with indices of half")
def _max_dim(node, x, dim, keepdim=False):
  """(values, indices): the extreme along `dim` and the first index of it (the first NaN where there is one, as
  torch's CPU kernel and numpy's argmax)."""
  largest = node.target is aten.max.dim
  if not len(x.shape): return x, A.const(0, to_kc(torch.int64), ())
  values = x.max(dim, keepdims=keepdim) if largest else x.min(dim, keepdims=keepdim)
  index = x.argmax(dim, keepdims=keepdim) if largest else x.argmin(dim, keepdims=keepdim)
  return values, index


def _scan(method: str):
  def lower(node, x, dim, dtype=None):
    out = out_dtype(node)
    v = cast(x, opmath(out))
    return cast(getattr(A, method)(v, axis=dim % max(len(x.shape), 1)) if len(x.shape) else v, out)
  return lower


lowering(aten.cumsum.default)(_scan("cumsum"))
lowering(aten.cumprod.default)(_scan("cumprod"))


@lowering(aten.pow.Scalar, check=lambda n: None if out_dtype(n).is_floating_point else "an int power")
def _pow_base(node, base, x):
  return elementwise(node, lambda b, e: b ** e, float(base), x)


@lowering(aten.remainder.Tensor, aten.remainder.Scalar,
          check=lambda n: None if out_dtype(n).is_floating_point else "an int remainder (torch raises on a 0 divisor)")
def _remainder(node, a, b):
  return elementwise(node, operator.mod, a, b)


@lowering(aten.repeat.default)
def _repeat(node, x, repeats):
  """torch's repeat: the tensor tiled `repeats` times per axis (leading new axes where repeats is longer)."""
  shape = (1,) * (len(repeats) - len(x.shape)) + tuple(x.shape)
  x = x.reshape(shape)
  tiled = x.reshape(tuple(d for n in shape for d in (1, n))).expand(tuple(d for r, n in zip(repeats, shape) for d in (r, n)))
  return tiled.reshape(tuple(r * n for r, n in zip(repeats, shape)))


@lowering(aten.linalg_vector_norm.default,
          check=lambda n: None if (n.args[1] if len(n.args) > 1 else n.kwargs.get("ord", 2)) in (1, 2, float("inf"))
          and out_dtype(n).is_floating_point else "a vector norm of another order")
def _vector_norm(node, x, ord=2, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
  out = out_dtype(node)
  v = abs(cast(x, opmath(out)))
  axes = _axes(dim, len(x.shape))
  if ord == float("inf"): return cast(v.max(axes, keepdims=keepdim), out)
  if ord == 1: return cast(v.sum(axes, keepdims=keepdim), out)
  return cast((v * v).sum(axes, keepdims=keepdim).sqrt(), out)


# ------------------------------------------------------------------------------------------------------ matmuls

def _mm(node, a, b):
  out = out_dtype(node)
  return cast(cast(a, out) @ cast(b, out), out)


lowering(aten.mm.default, aten.bmm.default, aten.matmul.default)(_mm)


@lowering(aten.addmm.default, aten.baddbmm.default)
def _addmm(node, bias, a, b, *, beta=1, alpha=1):
  out = out_dtype(node)
  prod = cast(a, out) @ cast(b, out)
  acc = opmath(out)
  value = cast(prod, acc) * alpha if alpha != 1 else cast(prod, acc)
  return cast(value + (cast(bias, acc) * beta if beta != 1 else cast(bias, acc)), out)


# ------------------------------------------------------------------------------------------------------ movement

def _sizes(shape, numel: int) -> tuple[int, ...]:
  shape = [int(s) for s in shape]
  if -1 in shape:
    known = math.prod(s for s in shape if s != -1)
    shape[shape.index(-1)] = numel // known if known else 0
  return tuple(shape)


@lowering(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default)
def _view(node, x, shape):
  return x.reshape(_sizes(shape, math.prod(x.shape)))


@lowering(aten.permute.default, aten.permute_copy.default)
def _permute(node, x, order):
  return x.permute(tuple(d % len(x.shape) for d in order)) if len(x.shape) else x


@lowering(aten.t.default)
def _t(node, x): return x.permute((1, 0)) if len(x.shape) == 2 else x


@lowering(aten.transpose.int)
def _transpose(node, x, d0, d1):
  if not len(x.shape): return x
  order = list(range(len(x.shape)))
  d0, d1 = d0 % len(order), d1 % len(order)
  order[d0], order[d1] = order[d1], order[d0]
  return x.permute(tuple(order))


@lowering(aten.expand.default, aten.expand_copy.default)
def _expand(node, x, shape, implicit=False):
  shape = list(shape)
  lead = len(shape) - len(x.shape)
  full = tuple(x.shape[i - lead] if s == -1 else int(s) for i, s in enumerate(shape))
  return A.Expr.expand(x.reshape((1,) * lead + tuple(x.shape)) if lead else x, full) if full != tuple(x.shape) else x


@lowering(aten.unsqueeze.default)
def _unsqueeze(node, x, dim):
  d = dim % (len(x.shape) + 1)
  return x.reshape(tuple(x.shape[:d]) + (1,) + tuple(x.shape[d:]))


@lowering(aten.squeeze.dims, aten.squeeze.dim, aten.squeeze.default)
def _squeeze(node, x, dims=None):
  return x.reshape(_shape_of(node))


@lowering(aten.select.int)
def _select(node, x, dim, index):
  d = dim % len(x.shape)
  return x[(slice(None),) * d + (index,)]


@lowering(aten.slice.Tensor)
def _slice(node, x, dim=0, start=None, end=None, step=1):
  d = dim % len(x.shape)
  n = x.shape[d]
  start = 0 if start is None else start
  end = n if end is None else end
  start, end = max(min(start + n if start < 0 else start, n), 0), max(min(end + n if end < 0 else end, n), 0)
  return x[(slice(None),) * d + (slice(start, max(end, start), step),)]


@lowering(aten.split_with_sizes.default, aten.split.Tensor)
def _split(node, x, sizes, dim=0):
  d = dim % len(x.shape)
  n = x.shape[d]
  sizes = [sizes] * math.ceil(n / sizes) if isinstance(sizes, int) else list(sizes)
  parts, at = [], 0
  for s in sizes:
    stop = min(at + s, n)
    parts.append(x[(slice(None),) * d + (slice(at, stop),)])
    at = stop
  return tuple(parts)


@lowering(aten.cat.default)
def _cat(node, xs, dim=0):
  out = out_dtype(node)
  parts = [cast(x, out) for x in xs if not (len(x.shape) == 1 and x.shape[0] == 0 and len(meta(node).shape) != 1)]
  return A.concatenate(parts, axis=dim % len(meta(node).shape))


@lowering(aten.flip.default)
def _flip(node, x, dims): return x.flip(tuple(d % len(x.shape) for d in dims))


@lowering(aten.constant_pad_nd.default)
def _pad(node, x, pad, value=0):
  # torch's pad lists (before, after) pairs from the last axis backwards; negative amounts cut
  pairs = [(0, 0)] * len(x.shape)
  for i in range(len(pad) // 2): pairs[len(x.shape) - 1 - i] = (pad[2 * i], pad[2 * i + 1])
  cut = tuple(slice(-b if b < 0 else 0, (x.shape[d] + a) if a < 0 else x.shape[d]) for d, (b, a) in enumerate(pairs))
  x = x[cut]
  grow = tuple((max(b, 0), max(a, 0)) for b, a in pairs)
  padded = x.pad(grow)
  if value == 0 or not any(b or a for b, a in grow): return padded
  inside = A.const(True, to_kc(torch.bool), tuple(x.shape)).pad(grow)
  return A.where(inside, padded, cast(value, out_dtype(node)))


@lowering(operator.getitem)
def _getitem(node, values, index): return values[index]


import kc_torch.lower_nn  # noqa: E402,F401  (registers the nn lowerings)
