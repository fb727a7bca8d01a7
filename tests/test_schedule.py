"""kc.schedule: programs of several kernels mean what numpy means, one-kernel programs are unchanged, intermediates are
planned without overlapping lifetimes, and a program compiles to one callable with the one-kernel call convention."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import kc
from kc import ast as A, dtypes
from kc.errors import ArgumentError, InvalidASTError, OptsError
from kc.ir.uop import Ops
from kc.schedule import schedule

DEVICES = ["CLANG", "EMU"]


def rand(shape, seed=0):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def run(expr, inputs, device):
  return kc.run(A.sink(A.store(0, expr)), inputs, device)[0]


# each: (name, builder of the kc.ast value from x (M, N), its numpy twin, the kernels kc schedules)
PROGRAMS = [
  ("reduce result reshaped, then computed with", lambda x: x.sum(0).reshape(2, -1) + 1.0, lambda a: a.sum(0).reshape(2, -1) + 1.0, 2),
  ("reduce result broadcast along the other axis", lambda x: x.T - x.max(1), lambda a: a.T - a.max(1), 1),
  ("a reduce of it", lambda x: (x.T - x.max(1)).sum(1), lambda a: (a.T - a.max(1)).sum(1), 1),
  ("reduce of a reshaped reduce", lambda x: x.sum(0).reshape(2, -1).sum(1), lambda a: a.sum(0).reshape(2, -1).sum(1), 2),
  ("reduce result flipped and padded", lambda x: x.sum(1)[::-1].reshape(-1, 1) * x, lambda a: a.sum(1)[::-1].reshape(-1, 1) * a, 1),
  ("standardize", lambda x: (x - x.mean()) / x.std(), lambda a: (a - a.mean()) / a.std(), 1),
  ("softmax", lambda x: (e := (x - x.max(1, keepdims=True)).exp()) / e.sum(1, keepdims=True),
   lambda a: (e := np.exp(a - a.max(1, keepdims=True))) / e.sum(1, keepdims=True), 1),
  ("a reduce result broadcast to a new leading axis", lambda x: (x.sum(0) + x.reshape(1, *x.shape)).sum(2),
   lambda a: (a.sum(0) + a.reshape(1, *a.shape)).sum(2), 1),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,build,twin,kernels", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_programs_mean_what_numpy_means(name, build, twin, kernels, device):
  a = rand((4, 6))
  x = A.arg(1, dtypes.float32, (4, 6))
  sink = A.sink(A.store(0, build(x)))
  assert len(schedule(sink).kernels) == kernels
  np.testing.assert_allclose(kc.run(sink, {1: a}, device)[0], twin(a), rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 7), n=st.integers(1, 7), axis=st.sampled_from([0, 1]), move=st.sampled_from(["flip", "pad", "reshape", "T"]),
       op=st.sampled_from(["sum", "max", "mean"]))
def test_movement_after_reduces_property(m, n, axis, move, op):
  """Any movement of a reduce result, combined again with the input it came from (numpy's broadcasting), on CLANG."""
  a = rand((m, n), seed=m * 10 + n)
  x = A.arg(1, dtypes.float32, (m, n))
  r, ra = getattr(x, op)(axis), getattr(a, op)(axis)
  if move == "flip": r, ra = r[::-1], ra[::-1]
  elif move == "pad": r, ra = r.pad(((1, 2),)), np.pad(ra, ((1, 2),))
  elif move == "reshape": r, ra = r.reshape(-1, 1), ra.reshape(-1, 1)
  else: r, ra = r.reshape(1, -1).T, ra.reshape(1, -1).T
  try: want = ra * a.sum() + ra.sum()
  except ValueError: return
  got = run(r * x.sum() + r.sum(), {1: a}, "CLANG")
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_outputs_of_different_shapes_share_a_sink(device):
  a = rand((4, 6))
  x = A.arg(1, dtypes.float32, (4, 6))
  sink = A.sink(A.store(0, x.sum(0)), A.store(2, x.sum(1)), A.store(3, x * 2), A.store(4, x.max(1)))
  plan = schedule(sink)
  # x.sum(1) and x.max(1) share a loop nest: one kernel stores both
  assert len(plan.kernels) == 3 and sorted(len(k.ast.src) for k in plan.kernels) == [1, 1, 2]
  out = kc.run(sink, {1: a}, device)
  for i, want in [(0, a.sum(0)), (2, a.sum(1)), (3, a * 2), (4, a.max(1))]:
    assert out[i].shape == want.shape
    np.testing.assert_allclose(out[i], want, rtol=1e-5, atol=1e-5)


def test_one_kernel_programs_are_the_program_itself():
  x = A.arg(1, dtypes.float32, (16, 64))
  for e in [x + 1, (x - x.max(1, keepdims=True)).exp2().sum(1), x.sum(1).reshape(4, 4), x.std(1)]:
    sink = A.sink(A.store(0, e))
    plan = schedule(sink)
    assert plan.single and plan.kernels[0].ast is sink and plan.peak_bytes == 0
    assert type(kc.compile(sink, "CLANG", opts="none")) is kc.CompiledKernel


def test_a_stored_reshape_of_a_reduce_is_one_kernel():
  """x.sum(0).reshape(2, 3) stored: the intermediate would be a copy, so the reduce's kernel writes the output."""
  x = A.arg(1, dtypes.float32, (4, 6))
  sink = A.sink(A.store(0, x.sum(0).reshape(2, 3)))
  assert schedule(sink).single and not any(u.op is Ops.BUFFER for u in sink.toposort)


def chain(x, a, steps):
  """A program whose every step materialises a (8, 8) intermediate read by the next step, and its numpy twin."""
  y, ya = x, a
  for _ in range(steps):
    y, ya = (y.sum(0).reshape(8, 8) + 1.0).reshape(64, 1) * x, (ya.sum(0).reshape(8, 8) + 1.0).reshape(64, 1) * a
  return y, ya


def test_intermediates_with_overlapping_lifetimes_never_share_bytes():
  a = rand((64, 64)) * 0.01
  x = A.arg(1, dtypes.float32, (64, 64))
  y, ya = chain(x, a, 3)
  side = x.sum(1).reshape(8, 8).T + x.max(0).reshape(8, 8)  # intermediates live beside the chain's
  sink = A.sink(A.store(0, y), A.store(2, side.sum(0).reshape(2, 4) * side.max()))
  plan = schedule(sink)
  assert len(plan.temps) >= 4
  for t in plan.temps:
    for u in plan.temps:
      if t.index < u.index and t.offset < u.offset + u.nbytes and u.offset < t.offset + t.nbytes:
        assert t.last < u.first or u.last < t.first, (t, u)
  sa = a.sum(1).reshape(8, 8).T + a.max(0).reshape(8, 8)
  out = kc.run(sink, {1: a}, "CLANG")
  np.testing.assert_allclose(out[0], ya, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(out[2], sa.sum(0).reshape(2, 4) * sa.max(), rtol=1e-4, atol=1e-5)


def test_intermediates_are_reused_when_lifetimes_end():
  x = A.arg(1, dtypes.float32, (64, 64))
  plan = schedule(A.sink(A.store(0, chain(x, np.zeros((64, 64), np.float32), 4)[0])))
  # four (8, 8) intermediates, each read only by the next kernel: two slots of 256 bytes take turns
  assert len(plan.temps) == 4 and len(plan.kernels) == 5 and plan.peak_bytes == 2 * 256


def test_compiled_program_call_convention():
  a = rand((4, 6))
  x = A.arg(1, dtypes.float32, (4, 6))
  sink = A.sink(A.store(0, x.sum(0).reshape(2, 3) + 1.0))
  prg = kc.compile(sink, "CLANG")
  assert isinstance(prg, kc.CompiledKernel) and len(prg.kernels) == 2 and len(prg.programs) == 2
  out = np.zeros((2, 3), np.float32)
  prg(out, a)
  np.testing.assert_allclose(out, a.sum(0).reshape(2, 3) + 1, rtol=1e-5)
  buf_out, buf_in = kc.Buffer("CLANG", 6, dtypes.float32).allocate(), kc.Buffer("CLANG", 24, dtypes.float32).allocate()
  buf_in.copyin(memoryview(a.reshape(-1)))
  prg(buf_out, buf_in)
  got = np.zeros(6, np.float32)
  buf_out.copyout(memoryview(got))
  np.testing.assert_allclose(got.reshape(2, 3), out)
  with pytest.raises(ArgumentError): prg(out, np.zeros((5, 6), np.float32))
  with pytest.raises(ArgumentError): prg(out)


def test_opts_apply_per_kernel():
  x = A.arg(1, dtypes.float32, (4, 6))
  sink = A.sink(A.store(0, x.sum(0).reshape(2, 3) + 1.0))
  for opts in ["none", "hand", ["none", "hand"], [[], "none"]]: assert len(kc.compile(sink, "CLANG", opts=opts).kernels) == 2
  with pytest.raises(OptsError, match="2 kernels"): kc.compile(sink, "CLANG", opts=[kc.Opt(kc.OptOps.UPCAST, 0, 2)])
  with pytest.raises(OptsError, match="one per kernel"): kc.compile(sink, "CLANG", opts=["none"])


def test_debug_2_prints_a_line_per_kernel(capsys):
  x = A.arg(1, dtypes.float32, (4, 6))
  sink = A.sink(A.store(0, x.sum(0).reshape(2, 3) + 1.0))
  with kc.Context(DEBUG=2): kc.compile(sink, "CLANG", opts="none")
  lines = [l for l in capsys.readouterr().out.splitlines() if "schedule" in l]
  assert len(lines) == 3 and "kernel 0" in lines[0] and "kernel 1" in lines[1] and "bytes at peak" in lines[2]


@pytest.mark.parametrize("call", ["numpy", "buffers"])
def test_debug_2_times_each_kernel_of_a_program_call(capsys, call):
  # the plain-array fast path and the general path both report the program's time and each kernel's own
  x = A.arg(1, dtypes.float32, (4, 6))
  prog = kc.compile(A.sink(A.store(0, x.sum(0).reshape(2, 3) + 1.0)), "CLANG", opts="none")
  out, a = np.zeros((2, 3), np.float32), np.ones((4, 6), np.float32)
  args = (out, a) if call == "numpy" else \
    (kc.Buffer("CLANG", 6, dtypes.float32).allocate(), kc.Buffer("CLANG", 24, dtypes.float32).allocate().copyin(a.ravel()))
  capsys.readouterr()
  with kc.Context(DEBUG=2): prog(*args)
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 3 and "(2 kernels)" in lines[0]
  for line, ck in zip(lines[1:], prog.kernels): assert line.split()[1] == ck.name and line.endswith(" us")


def test_what_numpy_refuses_is_still_refused():
  x = A.arg(1, dtypes.float32, (4, 6))
  with pytest.raises(InvalidASTError, match="do not broadcast"): x - x.max(1)
  with pytest.raises(InvalidASTError, match="cannot reshape"): x.sum(0).reshape(4)
  with pytest.raises(InvalidASTError, match="out of range"): x.sum(0).sum(1)


def test_an_expand_that_would_multiply_reduce_work_materialises_instead():
  """p @ v after a softmax expands p along v's columns: recomputing the softmax per column would multiply its work by
  64, so p is materialised (two kernels); a small program recomputes instead and stays one kernel."""
  import math
  def attention(M, N, D):
    q, k, v = (A.arg(i, dtypes.float32, s) for i, s in ((1, (M, D)), (2, (N, D)), (3, (N, D))))
    s = (q @ k.T) / math.sqrt(D)
    e = (s - s.max(1, keepdims=True)).exp()
    return A.sink(A.store(0, (e / e.sum(1, keepdims=True)) @ v))
  assert len(schedule(attention(64, 64, 32)).kernels) == 2
  assert len(schedule(attention(4, 4, 2)).kernels) == 1
  rng = np.random.default_rng(1)
  qa, ka, va = (rng.standard_normal(s).astype(np.float32) for s in ((64, 32), (64, 32), (64, 32)))
  sa = qa @ ka.T / math.sqrt(32)
  ea = np.exp(sa - sa.max(1, keepdims=True))
  got = kc.run(attention(64, 64, 32), {1: qa, 2: ka, 3: va}, "CLANG")[0]
  np.testing.assert_allclose(got, (ea / ea.sum(1, keepdims=True)) @ va, rtol=1e-4, atol=1e-5)


def test_cli_renders_and_runs_each_kernel_of_a_program():
  import subprocess, sys
  cli = lambda *a: subprocess.run([sys.executable, "-m", "kc.tools.cli", *a], capture_output=True, text=True, timeout=600)
  r = cli("render", "attention", "--device", "CLANG", "--opts", "none")
  assert r.returncode == 0, r.stderr
  heads = [line for line in r.stdout.splitlines() if line.startswith("// ")]
  # the softmax's exp stored once (CLANG computes it in software), the softmax, then @ v: the kernels kc.compile builds
  assert [h.split("(kernel ")[1][:6] for h in heads[:3]] == ["1 of 3", "2 of 3", "3 of 3"] and "bytes at peak" in heads[3]
  r = cli("run", "standardize", "--device", "CLANG")
  assert r.returncode == 0 and " ok" in r.stdout, r.stdout + r.stderr


def test_a_callers_buffer_is_read_by_every_kernel_before_one_writes_it():
  x, y = A.arg(1, dtypes.float32, (4, 6)), A.arg(2, dtypes.float32, (6,))
  sink = A.sink(A.store(0, x.sum(0).reshape(2, 3) + 1), A.store(1, x * 2))  # buffer 1 in place, read by another kernel
  plan = schedule(sink)
  writer = next(i for i, k in enumerate(plan.kernels) if kc.schedule.BufferRef(False, 1) in k.outputs)
  assert writer == len(plan.kernels) - 1
  a = np.arange(24, dtype=np.float32).reshape(4, 6)
  want0, want1 = a.sum(0).reshape(2, 3) + 1, a * 2
  out = np.zeros((2, 3), np.float32)
  kc.compile(sink, "CLANG")(out, a)
  assert np.array_equal(out, want0) and np.array_equal(a, want1)
  # two kernels that each write what the other reads: no order runs them as written
  with pytest.raises(InvalidASTError, match="reads a buffer of the caller's after writing it"):
    A.sink(A.store(0, x + 1), A.store(1, (y * 2).reshape(1, 6).expand(4, 6)), A.store(2, x.sum(0)))


def test_merging_kernels_never_makes_them_wait_on_each_other():
  """kc fuzz seed 1 case 105: an intermediate's kernel merged into a kernel that read, through a second intermediate,
  the first one: the merged kernels then had to run before themselves, and the program was refused as a circle."""
  k0 = A.arg(4, dtypes.uint8, (4, 5, 4))
  k2 = k0.flip((0, 2))
  k3 = k2.min(axis=(1, 2), keepdims=True)
  k8 = (k3.expand((4, 2, 1)) >> A.arg(5, dtypes.uint8, (4, 1, 1))).cast(dtypes.int32)
  sink = A.sink(A.store(0, k8), A.store(1, k2), A.store(2, k8.sum(axis=(1,))), A.store(3, k3))
  a = np.random.default_rng(0).integers(0, 255, (4, 5, 4)).astype(np.uint8)
  b = np.random.default_rng(1).integers(0, 9, (4, 1, 1)).astype(np.uint8)
  out = kc.run(sink, {4: a, 5: b}, "CLANG")
  a2 = a[::-1, :, ::-1]
  a3 = a2.min(axis=(1, 2), keepdims=True)
  a8 = (np.broadcast_to(a3, (4, 2, 1)) >> b).astype(np.int32)
  for i, want in [(0, a8), (1, a2), (2, a8.sum(1)), (3, a3)]: assert np.array_equal(out[i], want)


@pytest.mark.parametrize("device", DEVICES)
def test_a_stack_of_reduce_results_reduced_again_vectorizes(device):
  """kc fuzz seed 2 case 447: UPCAST of the stack axis put an accumulator update in one lane and a load in the others;
  the vectorizer read a second source of every lane (IndexError) instead of gathering the lanes as they are."""
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((10, 6)).astype(np.float16), rng.standard_normal((6, 16)).astype(np.float16)
  c, d = rng.standard_normal((10, 16)).astype(np.float32), rng.standard_normal((1, 1)).astype(np.float32)
  k0, k1 = A.arg(1, dtypes.float16, (10, 6)), A.arg(2, dtypes.float16, (6, 16))
  m = (k0.reshape((10, 6, 1)) * k1.reshape((1, 6, 16))).cast(dtypes.float32).sum(axis=(1,))
  out = (A.stack([m, A.arg(3, dtypes.float32, (10, 16)), m], axis=0) / -0.75).sum(axis=(1, 2), keepdims=True)
  sink = A.sink(A.store(0, out + A.arg(4, dtypes.float32, (1, 1))))
  ma = (a[:, :, None] * b[None]).astype(np.float32).sum(1)
  want = (np.stack([ma, c, ma], 0) / -0.75).sum(axis=(1, 2), keepdims=True) + d
  for opts in ("hand", "none"):
    np.testing.assert_allclose(kc.run(sink, {1: a, 2: b, 3: c, 4: d}, device, opts=opts)[0], want, rtol=2e-3, atol=2e-3)



def test_a_programs_kernels_come_in_the_same_order_wherever_its_uops_live():
  # UOps hash by their address: a schedule built from sets of them came out in another order when the same program's
  # UOps lay at other addresses (another process, or the same one later), and a list of opts given per kernel then
  # applied to other kernels (the fuzz's random opts found it, in classic program 8). Built again and again with
  # other objects allocated in between, every program of the fuzz's classic family keeps its kernels and their order.
  import random
  from kc.runtime.opt_cache import ast_key
  from kc.tools.fuzz import case_seed, generate, kc_lines

  def kernels(i: int, share: bool) -> tuple:
    ns = {"A": A, "dtypes": dtypes, "np": np}
    exec("\n".join(kc_lines(generate(case_seed(11, i), family="classic"))), ns)
    plan = schedule(ns["sink"], share_transcendentals=share)
    return tuple((ast_key(k.ast), tuple(map(str, k.buffers))) for k in plan.kernels)
  rng = random.Random(0)
  for i in range(16):
    for share in (False, True):
      seen = set()
      for _ in range(6):
        junk = [[object() for _ in range(rng.randrange(1, 3000))] for _ in range(3)]
        seen.add(kernels(i, share))
        schedule.cache_clear()
        del junk  # freed at once (no gc.collect: in a test worker's large heap one took 0.6 s)
      assert len(seen) == 1, f"classic program {i}: {len(seen)} different schedules"


# ***** on a device with work-groups, a reduce result read broadcast is a kernel of its own *****

def _normalisations():
  x = A.arg(1, dtypes.float32, (64, 96))
  e = (x - x.max(1, keepdims=True)).exp()
  mean = x.mean(1, keepdims=True)
  return {"softmax": (e / e.sum(1, keepdims=True), 3), "variance": (((x - mean) ** 2).mean(1), 2),
          "layernorm": ((x - mean) / (((x - mean) ** 2).mean(1, keepdims=True) + 1e-5).sqrt(), 3),
          "minus_total": (x - x.sum(), 2), "row_max_only": (x.max(1), 1)}


def _broadcast_reduce_reads(plan) -> list:
  from kc.schedule.scheduler import _broadcasts, _holding_reduces
  out = []
  for k in plan.kernels:
    order = k.ast.toposort
    held = _holding_reduces(order)
    out += [u for u in order if u.op is Ops.VIEW and u.src and held.get(u.src[0]) and _broadcasts(u.arg)]
  return out


def test_on_a_work_group_device_no_kernel_reads_a_reduce_result_broadcast():
  # where work-items each compute their own outputs, a reduce result read broadcast (a softmax's row max and sum, a
  # layernorm's mean) was computed again by every work-item that read it: on PoCL a softmax of 256 rows of 1024 took
  # 77 ms so, 0.65 ms as three kernels. Every classic fuzz program and the normalisations, scheduled for such a
  # device: no kernel reads a value holding a reduce through a broadcasting view, and a host CPU's schedule is as before
  from kc.tools.fuzz import case_seed, generate, kc_lines
  sinks = [A.sink(A.store(0, v)) for v, _ in _normalisations().values()]
  for i in range(24):
    ns = {"A": A, "dtypes": dtypes, "np": np}
    exec("\n".join(kc_lines(generate(case_seed(13, i), family="classic"))), ns)
    sinks.append(ns["sink"])
  split = 0
  for sink in sinks:
    apart = schedule(sink, broadcast_reduces_apart=True)
    assert not _broadcast_reduce_reads(apart)
    split += len(apart.kernels) > len(schedule(sink).kernels)
  assert split >= 5  # the rule did split kernels (the normalisations, and classic programs)


@pytest.mark.parametrize("name", list(_normalisations()))
def test_normalisations_on_a_work_group_device_are_a_kernel_per_reduce_and_mean_what_numpy_means(name, emu):
  value, kernels = _normalisations()[name]
  compiled = kc.compile(A.sink(A.store(0, value)), device="EMU", opts="hand")
  assert len(getattr(compiled, "kernels", [compiled])) == kernels
  x = np.random.default_rng(3).standard_normal((64, 96)).astype(np.float32)
  want = {"softmax": lambda: np.exp(x - x.max(1, keepdims=True)) / np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True),
          "variance": lambda: x.var(1), "minus_total": lambda: x - x.sum(), "row_max_only": lambda: x.max(1),
          "layernorm": lambda: (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)}[name]()
  out = np.zeros(want.shape, np.float32)
  compiled(out, x)
  np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("full,part", [((3, 3), (3, 1)), ((4, 5), (1, 5)), ((2, 3, 4), (2, 1, 4)), ((2, 3, 4), (1, 3, 1))])
@pytest.mark.parametrize("opts", ["none", "hand"])
def test_reduces_over_different_axes_merged_into_one_kernel_keep_one_shape(full, part, opts):
  # on a work-group device a broadcast reduce is materialised (rule 9), and its kernel merges with another reduce of
  # one output shape: a full reduce of `full` beside one of `part` (size 1 where `full` is not). The Kernel merged
  # neighbouring axes that every tracker could merge, and the two reduce inputs then disagreed (9 against 3)
  x, c, axes = A.arg(2, dtypes.float32, full), A.const(6, dtypes.int32, part), tuple(i for i, d in enumerate(part) if d > 1)
  sink = A.sink(A.store(0, x.min(axis=tuple(range(len(full))))), A.store(1, c + c.sum(axis=axes, keepdims=True)))
  v = np.arange(np.prod(full), dtype=np.float32).reshape(full) - 5
  out = kc.run(sink, {2: v}, device="EMU", opts=opts)
  assert out[0].reshape(()) == v.min()
  cn = np.full(part, 6, np.int32)
  np.testing.assert_array_equal(out[1].reshape(part), cn + cn.sum(axis=axes, keepdims=True))


@settings(max_examples=12, deadline=None)
@given(m=st.sampled_from([32, 48]), k=st.sampled_from([48, 64]), n=st.sampled_from([64, 96]),
       act=st.sampled_from(["exp2", "relu", "square"]), stored=st.sampled_from([("a",), ("h", "a"), ("a", "h")]),
       device=st.sampled_from(DEVICES))
def test_an_activation_stored_and_multiplied_again_is_computed_by_one_kernel(m, k, n, act, stored, device):
  """A training forward's Linear layer: h = x @ W1.T + b, a = act(h), both (or a alone) outputs saved for the
  backward, and a @ W2.T: the output store of a (m, 1, n) and its intermediate for the next product (m, 1, n, 1)
  differ by a size-1 axis, and are one kernel (one product), not one each. (Sizes where recomputing the activation
  inside the second product would multiply its work: it is materialised.)"""
  nout = 1 + len(stored)
  x, w1, b, w2 = (A.arg(nout + i, dtypes.float32, s) for i, s in enumerate(((m, k), (n, k), (n,), (k, n))))
  h = x @ w1.T + b
  a = {"exp2": lambda v: (v * 0.125).exp2(), "relu": lambda v: v.maximum(0.0), "square": lambda v: v * v}[act](h)
  values = {"h": h, "a": a}
  sink = A.sink(A.store(0, a @ w2.T), *(A.store(1 + i, values[s]) for i, s in enumerate(stored)))
  first, second = schedule(sink).kernels
  assert sorted(r.index for r in first.outputs if not r.temp) == list(range(1, nout)) and any(r.temp for r in first.outputs)
  xs, w1s, bs, w2s = (rand(s, seed) for seed, s in enumerate(((m, k), (n, k), (n,), (k, n))))
  hs = xs @ w1s.T + bs
  want_a = {"exp2": lambda v: np.exp2(v * 0.125), "relu": lambda v: np.maximum(v, 0), "square": lambda v: v * v}[act](hs)
  wants = {"h": hs, "a": want_a}
  out = kc.run(sink, {nout: xs, nout + 1: w1s, nout + 2: bs, nout + 3: w2s}, device)
  # sums of products: an error relative to the largest magnitude, where a few outputs cancel to near 0
  o = want_a @ w2s.T
  np.testing.assert_allclose(out[0].reshape(m, k), o, rtol=1e-4, atol=1e-5 * np.abs(o).max())
  for i, s in enumerate(stored):
    np.testing.assert_allclose(out[1 + i].reshape(wants[s].shape), wants[s], rtol=1e-5, atol=1e-5 * np.abs(wants[s]).max())


@settings(max_examples=10, deadline=None)
@given(rows=st.sampled_from([8, 64]), cols=st.sampled_from([16, 1024]), device=st.sampled_from(DEVICES))
def test_an_intermediate_the_program_also_returns_is_written_into_the_callers_buffer(rows, cols, device):
  """Rule 5: a layer norm's mean and rstd, realized (read by the output's kernel) and returned (saved for a backward),
  are computed once into the caller's buffers, which the output's kernel then reads: no intermediate, no copy."""
  x = A.arg(3, dtypes.float32, (rows, cols))
  m = x.mean(1, keepdims=True).realize()
  r = (((x - m) * (x - m)).mean(1, keepdims=True) + 1e-5).sqrt().recip().realize()
  sink = A.sink(A.store(0, (x - m) * r), A.store(1, m), A.store(2, r))
  plan = schedule(sink)
  assert not plan.temps and plan.peak_bytes == 0
  writers = {ref.index: i for i, k in enumerate(plan.kernels) for ref in k.outputs}
  assert sorted(writers) == [0, 1, 2] and sum(len(k.outputs) for k in plan.kernels) == 3   # each written once
  assert writers[0] > max(writers[1], writers[2])   # the output's kernel reads them after they are written
  xs = rand((rows, cols), 7)
  out = kc.run(sink, {3: xs}, device)
  assert [out[i].shape for i in range(3)] == [(rows, cols), (rows, 1), (rows, 1)]   # as the program stored them
  ms = xs.mean(1, keepdims=True)
  rs = 1 / np.sqrt(((xs - ms) ** 2).mean(1, keepdims=True) + 1e-5)
  np.testing.assert_allclose(out[1].reshape(rows, 1), ms, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out[2].reshape(rows, 1), rs, rtol=1e-4)
  np.testing.assert_allclose(out[0].reshape(rows, cols), (xs - ms) * rs, rtol=1e-4, atol=1e-4)


def test_an_intermediate_stays_one_where_the_callers_buffer_is_read_or_stored_another_way():
  # buffer 1 is also the input: its old value must be read before any kernel writes it, so the doubled value stays an
  # intermediate; a value stored transposed is not the intermediate's layout: copied
  x = A.arg(1, dtypes.float32, (8, 16))
  y = (x * 2).exp2().realize()
  sink = A.sink(A.store(0, y.sum(1) + x.sum(1)), A.store(1, y))
  assert len(schedule(sink).temps) == 1
  xs = rand((8, 16), 1)
  out, inout = np.empty(8, np.float32), xs.copy()   # buffer 1: read as x, then written as y
  kc.compile(sink, "CLANG")(out, inout)
  np.testing.assert_allclose(out, np.exp2(xs * 2).sum(1) + xs.sum(1), rtol=1e-5)
  np.testing.assert_allclose(inout, np.exp2(xs * 2), rtol=1e-6)
  s = (x * 2).sum(1, keepdims=True).reshape(2, 4).realize()
  sink = A.sink(A.store(0, x - s.reshape(8, 1)), A.store(1, s.permute(1, 0)))
  assert len(schedule(sink).temps) == 1
  x2 = A.arg(2, dtypes.float32, (8, 16))
  s = (x2 * 2).sum(1, keepdims=True).reshape(2, 4).realize()
  sink = A.sink(A.store(0, x2 - s.reshape(8, 1)), A.store(1, s.permute(1, 0)))
  assert len(schedule(sink).temps) == 1
  out = kc.run(sink, {2: xs}, "CLANG")
  np.testing.assert_allclose(out[1].reshape(4, 2), (xs * 2).sum(1).reshape(2, 4).T, rtol=1e-5)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(0, 3000)), min_size=1, max_size=8),
       st.sampled_from([1, 4, 256, 512, 4096, 768]))
def test_intermediates_are_placed_apart_at_the_alignment(spans, alignment):
  """placed_at: every offset a multiple of the alignment, and two intermediates live in the same kernel (from the
  one that writes it to the last that reads it) never share a byte."""
  from kc.schedule.memory import TempBuffer, placed_at
  temps = tuple(TempBuffer(i, dtypes.float32, size, 0, first, first + length) for i, (first, length, size) in enumerate(spans))
  placed, peak = placed_at(temps, alignment)
  assert [t.index for t in placed] == list(range(len(temps)))
  for t in placed:
    assert t.offset % alignment == 0 and t.offset + t.nbytes <= peak
    for u in placed:
      if u.index < t.index and not (t.last < u.first or u.last < t.first):  # live at once
        assert t.offset + max(t.nbytes, 1) <= u.offset or u.offset + max(u.nbytes, 1) <= t.offset


def test_a_program_on_a_device_whose_views_need_more_alignment_places_its_intermediates_there(views_at_4096):
  """An OpenCL device's sub-buffers start at its base address alignment (512 bytes on NVIDIA's OpenCL, where a
  program's intermediates at 256-byte offsets failed to run): the arena is planned again at the device's multiple.
  Here EMU's allocator asks for 4096 and refuses any other view, as OpenCL's does."""
  x = A.arg(1, dtypes.float32, (8, 16))
  t = (x * 2.0).realize()
  u = (t.exp2() + t.sum(1, keepdims=True)).realize()
  sink = A.sink(A.store(0, (u * t).sum(1)))
  assert len(schedule(sink).temps) >= 2 and any(tb.offset % 4096 for tb in schedule(sink).temps)
  program = kc.compile(sink, device="EMU")
  assert isinstance(program, kc.CompiledProgram) and all(tb.offset % 4096 == 0 for tb in program.schedule.temps)
  xv = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
  out = np.zeros(8, np.float32)
  program(out, xv)
  tv = xv * 2
  np.testing.assert_allclose(out, ((np.exp2(tv) + tv.sum(1, keepdims=True)) * tv).sum(1), rtol=1e-5)
