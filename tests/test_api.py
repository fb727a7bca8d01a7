"""kc.compile / kc.run / CompiledKernel on the embedded default (CLANG): results, and typed errors for bad calls."""
import json, subprocess, sys
import numpy as np
import pytest
import kc
from kc import ast as A, dtypes, Variable, KcError, SymbolicError

F = lambda i, *s: A.arg(i, dtypes.float32, s)  # noqa: E731


def test_contract_example():
  M, K, N = 64, 32, 48
  a, b = F(1, M, K), F(2, K, N)
  sink = A.sink(A.store(0, (a.reshape(M, K, 1) * b.reshape(1, K, N)).sum(axis=1)))
  k = kc.compile(sink, device="CLANG")
  assert isinstance(k, kc.CompiledKernel) and isinstance(k.program, kc.Program) and k.name == k.program.name
  out = np.empty((M, N), np.float32)
  x, y = np.random.rand(M, K).astype(np.float32), np.random.rand(K, N).astype(np.float32)
  seconds = k(out, x, y)
  assert seconds >= 0 and np.allclose(out, x @ y, atol=1e-4)
  outs = kc.run(sink, {1: x, 2: y}, device="CLANG", opts="none")
  assert outs[0].shape == (M, N) and np.allclose(outs[0], x @ y, atol=1e-4)  # numpy's shape: sum drops axis 1


def test_explicit_opts_and_buffers():
  sink = A.sink(A.store(0, F(1, 16, 16).sum(1)))
  k = kc.compile(sink, device="CLANG", opts=[kc.Opt(kc.OptOps.UNROLL, 0, 4)])
  assert k.kernel.applied_opts == [kc.Opt(kc.OptOps.UNROLL, 0, 4)]
  x = np.arange(256, dtype=np.float32)
  inp, out = kc.Buffer("CLANG", 256, dtypes.float32).allocate().copyin(x), kc.Buffer("CLANG", 16, dtypes.float32).allocate()
  k(out, inp)
  assert np.allclose(out.numpy(), x.reshape(16, 16).sum(1))


def test_symbolic_call():
  n = Variable("n", 1, 64)
  k = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (n,)) * 2.0)), device="CLANG")
  x = np.arange(7, dtype=np.float32)
  out = np.zeros(7, np.float32)
  k(out, x, n=7)
  assert np.array_equal(out, x * 2)
  with pytest.raises(KcError, match=r"shape \(7,\).*got an array of shape \(10,\)"): k(np.zeros(10, np.float32), np.zeros(10, np.float32), n=7)
  buf = kc.Buffer("CLANG", 10, dtypes.float32).allocate().copyin(np.zeros(10, np.float32))
  k(buf, np.arange(7, dtype=np.float32), n=7)  # a kc.Buffer is flat: it only has to be big enough
  assert np.array_equal(buf.numpy(), np.where(np.arange(10) < 7, np.arange(10) * 2, 0))
  with pytest.raises(SymbolicError, match="needs a value for Variable 'n'"): k(out, x)
  with pytest.raises(SymbolicError, match="must be an int in 1..64"): k(out, x, n=65)
  with pytest.raises(SymbolicError, match="no Variables"): k(out, x, n=3, m=2)


@pytest.mark.parametrize("args,match", [
  (lambda: (np.zeros(8, np.float32),), "takes 2 buffers"),
  (lambda: (np.zeros(8, np.float32), np.zeros(8, np.int32)), "must be float32"),
  (lambda: (np.zeros(8, np.float32), np.zeros(4, np.float32)), r"must have shape \(8,\).*got an array of shape \(4,\)"),
  (lambda: (np.zeros(16, np.float32)[::2], np.zeros(8, np.float32)), "not C-contiguous"),
  (lambda: (np.zeros(8, np.float32), [0.0] * 8), "numpy array or a kc.Buffer"),
])
def test_bad_calls_are_typed_errors(args, match):
  k = kc.compile(A.sink(A.store(0, F(1, 8) + 1.0)), device="CLANG")
  with pytest.raises(KcError, match=match): k(*args())


def test_bad_opts_and_devices():
  sink = A.sink(A.store(0, F(1, 8) + 1.0))
  with pytest.raises(KcError, match="opts must be"): kc.compile(sink, device="CLANG", opts="fast")
  with pytest.raises(kc.KernelOptError): kc.compile(sink, device="CLANG", opts=[kc.Opt(kc.OptOps.LOCAL, 0, 2)])
  with pytest.raises(KcError, match="unknown device"): kc.compile(sink, device="NOPE")


def test_outputs_are_written_in_place_inputs_untouched():
  x = np.arange(8, dtype=np.float32)
  keep = x.copy()
  out = np.full(8, -1, np.float32)
  kc.compile(A.sink(A.store(0, F(1, 8) * 3.0)), device="CLANG")(out, x)
  assert np.array_equal(out, keep * 3) and np.array_equal(x, keep)


def kc_cli(*argv):
  return subprocess.run([sys.executable, "-m", "kc.tools.cli", *argv], capture_output=True, text=True)


def test_cli_devices_render_run_doctor():
  devs = json.loads(kc_cli("devices", "--json").stdout)
  clang = next(d for d in devs["devices"] if d["device"] == "CLANG")
  assert clang["available"] and clang["renderer"]["locals"] is False and clang["distribution"] == "kc-clang"
  r = kc_cli("render", "matmul", "--device", "CLANG")
  assert r.returncode == 0 and "void r_" in r.stdout and "for (int ridx0" in r.stdout
  r = kc_cli("run", "softmax", "--device", "CLANG", "--opts", "none")
  assert r.returncode == 0 and " ok," in r.stdout
  r = kc_cli("doctor")
  assert "CLANG: ok" in r.stdout
  r = kc_cli("render", "nonexistent")
  assert r.returncode == 2


def test_cli_bench_writes_json(tmp_path):
  out = tmp_path / "bench.json"
  r = kc_cli("bench", "--device", "CLANG", "--repeats", "1", "--json", str(out))
  assert r.returncode == 0, r.stdout + r.stderr
  rows = json.loads(out.read_text())["results"]
  assert {row["example"] for row in rows} >= {"add", "matmul", "softmax"} and all(row["ok"] and row["device"] == "CLANG" for row in rows)


def test_a_kernel_compiled_again_in_one_process_reuses_its_program(monkeypatch):
  # rendering is most of a compile from the caches: the same AST, device, opts and renderer settings reuse the
  # Program and the loaded binary; a setting the renderer reads from the environment renders anew
  pytest.importorskip("kc_clang")
  n = 1 << 20  # past PARALLEL_MIN_OPS: split across the threads when there are two
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (n, 4)).sum(1)))
  monkeypatch.setenv("KC_CLANG_THREADS", "2")
  a, b = kc.compile(sink, "CLANG"), kc.compile(sink, "CLANG")
  assert a.program is b.program and a.kernel is not b.kernel
  assert kc.compile(sink, "CLANG", "none").program is not a.program  # other opts
  monkeypatch.setenv("KC_CLANG_THREADS", "1")
  one = kc.compile(sink, "CLANG")
  assert one.program is not a.program and "kc_part" in a.program.src and "kc_part" not in one.program.src
  x = np.random.default_rng(0).random((n, 4), dtype=np.float32)
  for ck in (a, one):
    out = np.empty(n, np.float32)
    ck(out, x)
    np.testing.assert_allclose(out, x.sum(1), rtol=1e-6)


def test_wait_false_needs_a_framework_stream():
  import numpy as np
  import kc
  from kc import ast as A, dtypes
  k = kc.compile(A.sink(A.store(0, A.arg(1, dtypes.float32, (8,)) + 1)), device="CLANG")
  x, out = np.ones(8, np.float32), np.zeros(8, np.float32)
  with pytest.raises(kc.ArgumentError, match="stream="): k(out, x, wait=False)
  with pytest.raises(kc.ArgumentError, match="no streams"): k(out, x, stream=5, wait=False)
  assert k(out, x) is not None and (out == 2).all()
