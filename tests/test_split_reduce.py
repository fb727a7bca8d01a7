"""kc.schedule.split_reduce: a large reduce with few outputs becomes a partial and a combine kernel (what kc.compile runs as a
SplitCompiledKernel), checked against numpy on every device that runs here; and the ASTs it leaves alone."""
import numpy as np
import pytest
import kc
from kc import ast as A, dtypes
from kc.api import SplitCompiledKernel
from kc.schedule.split_reduce import MIN_REDUCE, MIN_REDUCE_THREADS, TEMP, min_reduce, split_reduce

DEVICES = [d for d in ("CLANG", "EMU", "OPENCL") if kc.Device.unavailable_reason(d) is None]
N = MIN_REDUCE * 2  # the transform's own tests: large enough for a device with work-groups
NC = MIN_REDUCE_THREADS * 2  # and for CLANG
rng = np.random.default_rng(0)


def next_prime(n: int) -> int:
  while any(n % d == 0 for d in range(2, int(n ** 0.5) + 1)): n += 1
  return n


def run_split(sink, inputs: dict, device: str) -> dict:
  """kc.run's outputs, after checking that kc.compile split the kernel."""
  assert isinstance(kc.compile(sink, device=device), SplitCompiledKernel)
  return kc.run(sink, inputs, device=device)


@pytest.fixture(params=DEVICES)
def device(request): return request.param


@pytest.fixture(params=["divisible", "prime"])
def n(request, device):
  """A reduce length the device splits: a power of two, or a prime (no divisor to split by: the reduce axis is padded
  with the reduce's identity)."""
  least = min_reduce(kc.Device[device].renderer)
  return 2 * least if request.param == "divisible" else next_prime(least)


@pytest.fixture
def big(device): return 2 * min_reduce(kc.Device[device].renderer)


# ----------------------------------------------------------------------------------------------- results vs numpy

def test_full_sum(device, n):
  x = rng.standard_normal(n).astype(np.float32)
  out = run_split(A.sink(A.store(0, A.arg(1, dtypes.float32, (n,)).sum())), {1: x}, device)[0]
  np.testing.assert_allclose(out, x.astype(np.float64).sum(), rtol=1e-4, atol=1e-3)


def test_max_of_negatives(device, n):
  x = -rng.random(n).astype(np.float32) - 1  # all below 0: a pad that read 0 would win
  out = run_split(A.sink(A.store(0, A.arg(1, dtypes.float32, (n,)).max())), {1: x}, device)[0]
  assert out == x.max()


def test_int_sum_wraps_exactly(device, n):
  x = rng.integers(-2**31, 2**31 - 1, n, dtype=np.int32)
  out = run_split(A.sink(A.store(0, A.arg(1, dtypes.int32, (n,)).sum(dtype=dtypes.int32))), {1: x}, device)[0]
  assert out == x.sum(dtype=np.int32)


def test_int_max(device, n):
  x = rng.integers(-2**31, -2**30, n, dtype=np.int32)
  out = run_split(A.sink(A.store(0, A.arg(1, dtypes.int32, (n,)).max())), {1: x}, device)[0]
  assert out == x.max()


def test_min_any_all_and_nan(device, n):
  i = rng.integers(-2**31, 2**31 - 1, n, dtype=np.int32)
  b = np.zeros(n, bool); b[n - 3] = True
  f = rng.random(n).astype(np.float32); f[n // 2] = np.nan
  cases = [(A.arg(1, dtypes.int32, (n,)).min(), i, i.min()), (A.arg(1, dtypes.bool, (n,)).any(), b, True),
           (A.arg(1, dtypes.bool, (n,)).all(), ~b, False), (A.arg(1, dtypes.float32, (n,)).max(), f, np.nan)]
  for expr, x, want in cases:
    np.testing.assert_array_equal(run_split(A.sink(A.store(0, expr)), {1: x}, device)[0], want)


def test_int_prod_wraps_exactly(device, big):
  x = rng.integers(-3, 4, big, dtype=np.int32) | 1  # odd factors: the product never collapses to 0
  out = run_split(A.sink(A.store(0, A.arg(1, dtypes.int32, (big,)).prod(dtype=dtypes.int32))), {1: x}, device)[0]
  assert out == np.prod(x, dtype=np.int32)


def test_mean_of_half(device, big):
  x = rng.random(big).astype(np.float16)
  out = run_split(A.sink(A.store(0, A.arg(1, dtypes.float16, (big,)).mean())), {1: x}, device)[0]
  assert out.dtype == np.float16
  np.testing.assert_allclose(out.astype(np.float32), x.astype(np.float32).mean(), rtol=2e-3)


@pytest.mark.parametrize("keepdims", [False, True])
def test_rows_of_a_few_row_matrix(device, big, keepdims):
  x = rng.standard_normal((3, big)).astype(np.float32)
  out = run_split(A.sink(A.store(0, A.arg(1, dtypes.float32, (3, big)).sum(1, keepdims=keepdims))), {1: x}, device)[0]
  assert out.shape == ((3, 1) if keepdims else (3,))
  np.testing.assert_allclose(out, x.astype(np.float64).sum(1, keepdims=keepdims), rtol=1e-4, atol=1e-3)


def test_columns_of_a_tall_matrix(device, big):
  x = rng.standard_normal((big, 4)).astype(np.float32)
  out = run_split(A.sink(A.store(0, A.arg(1, dtypes.float32, (big, 4)).max(0, keepdims=True))), {1: x}, device)[0]
  assert out.shape == (1, 4) and np.array_equal(out, x.max(0, keepdims=True))


def test_elementwise_after_the_reduce(device, big):
  # a scale, another input read at the output's shape, and a sqrt: the combine kernel computes them all
  x, b = rng.random((2, big)).astype(np.float32), rng.random(2).astype(np.float32)
  expr = ((A.arg(1, dtypes.float32, (2, big)) * 0.5).sum(1) + A.arg(2, dtypes.float32, (2,))).sqrt()
  out = run_split(A.sink(A.store(0, expr)), {1: x, 2: b}, device)[0]
  np.testing.assert_allclose(out, np.sqrt((x.astype(np.float64) * 0.5).sum(1) + b), rtol=1e-5)


def test_buffers_and_repeated_calls(device, big):
  x = rng.standard_normal(big).astype(np.float32)
  ck = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (big,)).sum())), device=device)
  inp = kc.Buffer(device, big, dtypes.float32).allocate().copyin(x)
  out = kc.Buffer(device, 1, dtypes.float32).allocate()
  for scale in (1, 2):  # the partials buffer is reused: the second call must not see the first one's values
    inp.copyin(x * scale)
    assert ck(out, inp) >= 0
    np.testing.assert_allclose(out.numpy(), (x.astype(np.float64) * scale).sum(), rtol=1e-4, atol=1e-3)


# ----------------------------------------------------------------------------------------------- the transform

def test_plan_shapes_and_buffers():
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (4, N)).sum(1) + A.arg(2, dtypes.float32, (4,))))
  split = split_reduce(sink)
  # the partial reads the input and writes the partials; the combine reads the partials and the post-reduce input
  assert split.partial_buffers == (1, TEMP) and split.combine_buffers == (0, 2, TEMP)
  assert split.temp_size == 4 * split.parts and split.temp_dtype == dtypes.float32
  assert N % split.parts == 0 and 16 <= split.parts <= 64


def test_plan_is_deterministic():
  build = lambda: A.sink(A.store(0, A.arg(1, dtypes.float32, (NC,)).sum()))
  first, second = kc.compile(build(), device="CLANG"), kc.compile(build(), device="CLANG")
  assert [p.src for p in first.programs] == [p.src for p in second.programs] and first.name == second.name


@pytest.mark.parametrize("expr", [
  lambda: A.arg(1, dtypes.float32, (N // 64, 64)).sum(1),                     # small reduces: one kernel keeps the cores busy
  lambda: A.arg(1, dtypes.float32, (1024, N)).sum(1),                         # many outputs
  lambda: A.arg(1, dtypes.float32, (NC,)) * 2,                                 # no reduce
  lambda: (A.arg(1, dtypes.float32, (NC,)) - A.arg(1, dtypes.float32, (NC,)).max()).exp2().sum(),  # two reduces
  lambda: A.arg(1, dtypes.float32, (2, N)) - A.arg(1, dtypes.float32, (2, N)).max(1, keepdims=True),  # broadcast back
])
def test_left_alone(expr):
  assert split_reduce(A.sink(A.store(0, expr()))) is None


def test_threshold_depends_on_the_renderer():
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (N,)).sum()))
  assert split_reduce(sink, kc.Device["EMU"].renderer) is not None  # work-groups: one would hold the whole reduce
  assert split_reduce(sink, kc.Device["CLANG"].renderer) is None  # threads cost more to start: only larger ones
  assert split_reduce(A.sink(A.store(0, A.arg(1, dtypes.float32, (NC,)).sum())), kc.Device["CLANG"].renderer) is not None


def test_symbolic_shapes_left_alone():
  n = kc.Variable("n", 1, 1 << 20)
  assert split_reduce(A.sink(A.store(0, A.arg(1, dtypes.float32, (n,)).sum()))) is None


def test_opt_out(monkeypatch):
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (NC,)).sum()))
  assert type(kc.compile(sink, device="CLANG", split_reduce=False)) is kc.CompiledKernel
  assert type(kc.compile(sink, device="CLANG", opts="none")) is kc.CompiledKernel  # explicit opts: one kernel
  assert type(kc.compile(sink, device="CLANG", opts=[])) is kc.CompiledKernel
  monkeypatch.setenv("KC_SPLIT_REDUCE", "0")
  assert type(kc.compile(sink, device="CLANG")) is kc.CompiledKernel
  monkeypatch.setenv("KC_SPLIT_REDUCE", "1")
  ck = kc.compile(sink, device="CLANG")
  assert isinstance(ck, SplitCompiledKernel) and isinstance(ck, kc.CompiledKernel)
  assert ck.program is ck.programs[0] and ck.name == ck.program.name and len(ck.programs) == 2


def test_split_call_checks_arguments():
  ck = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (NC,)).sum())), device="CLANG")
  with pytest.raises(kc.KcError): ck(np.zeros(1, np.float32), np.zeros(NC - 1, np.float32))
  with pytest.raises(kc.KcError): ck(np.zeros(1, np.float32))


def test_invalid_ast_fails_as_one_kernel():
  # a store whose view does not fit its value: the error is verify_ast's about the user's AST
  x = A.arg(1, dtypes.float32, (NC,)).sum()
  good = A.store(0, x)
  bad = good.replace(src=(good.src[0], kc.ShapeTracker.from_shape((2,)).to_uop(), good.src[2]))
  with pytest.raises(kc.InvalidASTError):
    kc.compile(A.sink(bad), device="CLANG")
