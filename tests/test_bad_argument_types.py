"""Every public entry point, each argument in turn replaced by a value of the wrong kind (None, an array, a float, a
huge int, a string, an empty or odd tuple, a dtype, a numpy scalar...): the call works (numpy takes numpy's integers
where it takes ints) or raises a kc.KcError subclass; never Python's own TypeError, ValueError, AttributeError or
OverflowError from deep inside, nor numpy's truth-value error from an array tested as a bool."""
from __future__ import annotations
import numpy as np
import pytest
import kc
from kc import ast as A, dtypes

F = dtypes.float32
WRONG = [None, np.zeros(3), np.zeros((2, 2), np.float32), -1, 0, 2 ** 70, float("nan"), 1.5, "x", (), (1, -2), {}, True, b"a",
         [1, 2], [[1]], (None,), ("a",), (1.5,), object(), F, np.float32(2), np.int64(3)]
X = A.arg(1, F, (4, 4))
SINK = A.sink(A.store(0, X * 2.0))
N = kc.Variable("n", 1, 8)
SYMBOLIC = A.sink(A.store(0, A.arg(1, F, (N,)) * 2.0))


def _kernel(sink=SINK): return kc.compile(sink, "CLANG")
def _buffer(): return kc.Buffer("CLANG", 16, F).allocate()
def _clang_kernel(): return kc.Kernel(SINK, kc.Device["CLANG"].renderer)


ENTRIES = {
  # building: shapes, axes, movement, reduces
  "A.arg": (A.arg, [1, F, (4, 4)]),
  "A.const": (A.const, [1.0, F, (4, 4)]),
  "reshape": (lambda s: X.reshape(s), [(16,)]),
  "permute": (lambda s: X.permute(s), [(1, 0)]),
  "np.transpose": (lambda s: np.transpose(X, s), [(1, 0)]),
  "expand": (lambda s: X.reshape(4, 4, 1).expand(s), [(4, 4, 3)]),
  "pad": (lambda s: X.pad(s), [((1, 1), (0, 0))]),
  "shrink": (lambda s: X.shrink(s), [((1, 2), (0, 4))]),
  "flip": (lambda s: X.flip(s), [(0,)]),
  "windows": (lambda a, s: X.windows(a, s), [1, 2]),
  "squeeze": (lambda a: X.reshape(4, 1, 4).squeeze(a), [1]),
  "getitem": (lambda i: X[i], [(slice(0, 2), 1)]),
  "sum": (lambda a, k, d: X.sum(a, keepdims=k, acc_dtype=d), [1, False, None]),
  "max": (lambda a, k: X.max(a, keepdims=k), [1, True]),
  "mean": (lambda a, k: X.mean(a, keepdims=k), [0, False]),
  "var": (lambda a, d, k: X.var(a, ddof=d, keepdims=k), [1, 0, False]),
  "argmax": (lambda a, k: X.argmax(a, keepdims=k), [1, False]),
  "any": (lambda a, k: X.any(a, keepdims=k), [1, False]),
  "cumsum": (lambda a, d: X.cumsum(a, dtype=d), [1, None]),
  "np.sum": (lambda a, k: np.sum(X, axis=a, keepdims=k), [1, False]),
  "concatenate": (lambda xs, a: A.concatenate(xs, a), [[X, X], 0]),
  "stack": (lambda xs, a: A.stack(xs, a), [[X, X], 1]),
  "arange": (lambda n, d: A.arange(n, dtype=d), [8, F]),
  # values
  "cast": (lambda d: X.cast(d), [dtypes.int32]),
  "bitcast": (lambda d: X.bitcast(d), [dtypes.int32]),
  "round": (lambda d: X.round(d), [1]),
  "clip": (lambda lo, hi: X.clip(lo, hi), [0.0, 1.0]),
  "where": (lambda a, b: (X > 0).where(a, b), [1.0, 2.0]),
  "add": (lambda a: X + a, [1.0]),
  "pow": (lambda a: X ** a, [2.0]),
  "matmul": (lambda a: X @ a, [A.arg(2, F, (4, 4))]),
  "store": (A.store, [0, X]),
  "sink": (A.sink, [A.store(0, X)]),
  # compiling and running
  "compile": (lambda s, d, o: kc.compile(s, d, o), [SINK, "CLANG", "hand"]),
  "run": (lambda s, i, d: kc.run(s, i, device=d), [SINK, {1: np.ones((4, 4), np.float32)}, "CLANG"]),
  "call": (lambda o, i: _kernel()(o, i), [np.empty((4, 4), np.float32), np.ones((4, 4), np.float32)]),
  "call with a Variable": (lambda o, i, v: _kernel(SYMBOLIC)(o, i, n=v), [np.empty(4, np.float32), np.ones(4, np.float32), 4]),
  "run with a Variable": (lambda i, v: kc.run(SYMBOLIC, {1: i}, device="CLANG", n=v), [np.ones(4, np.float32), 4]),
  "Buffer.copyin": (lambda d: _buffer().copyin(d), [np.ones(16, np.float32)]),
  "Buffer.copyout": (lambda d: _buffer().copyout(d), [memoryview(bytearray(64))]),
  "Buffer.__dlpack__": (lambda s: _buffer().__dlpack__(stream=s), [None]),
  "Buffer view": (lambda b, off: kc.Buffer("CLANG", 4, F, base=b, offset=off), [_buffer(), 0]),
  "Buffer": (lambda d, n, t: kc.Buffer(d, n, t).allocate(), ["CLANG", 16, F]),
  "from_dlpack": (lambda o, d: kc.from_dlpack(o, d), [np.ones(4, np.float32), "CLANG"]),
  "Device": (lambda d: kc.Device[d], ["CLANG"]),
  "Opt": (lambda o, a, m: _clang_kernel().apply_opt(kc.Opt(o, a, m)), [kc.OptOps.UPCAST, 0, 4]),
  "Kernel": (lambda s, r: kc.Kernel(s, r), [SINK, kc.Device["CLANG"].renderer]),
  "colored_shape": (lambda p: _clang_kernel().colored_shape(p), [10]),
  # symbols and shapes
  "Variable": (kc.Variable, ["n", 1, 8]),
  "sym_infer": (kc.sym_infer, [N * 2, {N: 3}]),
  "sym_infer's value": (lambda v: kc.sym_infer(N * 2, {N: v}), [3]),
  "bind": (lambda v: N.bind(v), [3]),
  "substitute": (lambda d: (N * 2).substitute(d), [{N: kc.Variable("m", 1, 4)}]),
  "ShapeTracker": (lambda s: kc.ShapeTracker.from_shape(s), [(4, 4)]),
  "offset_of": (lambda c: kc.ShapeTracker.from_shape((4, 4)).offset_of(c), [(1, 2)]),
  "from_numpy": (dtypes.from_numpy, [np.dtype(np.float32)]),
  "vec": (lambda n: F.vec(n), [4]),
}


@pytest.mark.parametrize("name", list(ENTRIES))
def test_a_wrong_kind_of_argument_is_a_kc_error(name):
  fxn, args = ENTRIES[name]
  fxn(*args)  # the catalogue's own arguments are right
  escaped = []
  for pos in range(len(args)):
    for wrong in WRONG:
      given = list(args)
      given[pos] = wrong
      try: fxn(*given)
      except kc.KcError: pass
      except Exception as e: escaped.append(f"argument {pos} = {wrong!r:.40}: {type(e).__name__}: {e}"[:200])
  assert not escaped, "\n".join(escaped)
