"""Program: what it records, its estimates, and the launch-limit invariant; the C-style renderer's basics."""
import math
import numpy as np
import pytest
import kc
from kc import Ops, dtypes, ast as A, Kernel, Opt, OptOps, Variable, CompileError
from kc.renderer.cstyle import CStyleLanguage

F = lambda i, *s: A.arg(i, dtypes.float32, s)  # noqa: E731


class GPUish(CStyleLanguage):
  device = "GPUISH"
  kernel_prefix, buffer_prefix, smem_prefix, barrier = "__kernel ", "__global ", "__local ", "barrier(CLK_LOCAL_MEM_FENCE);"
  code_for_workitem = {"g": lambda d: f"get_group_id({d})", "l": lambda d: f"get_local_id({d})", "i": lambda d: f"get_global_id({d})"}
  global_max, local_max = (64, 64, 64), (16, 16, 16)


def matmul(M, K, N): return A.sink(A.store(0, (F(1, M, K).reshape(M, K, 1) * F(2, K, N).reshape(1, K, N)).sum(1)))


def test_program_fields_and_estimates():
  M, K, N = 32, 16, 8
  k = Kernel(matmul(M, K, N), GPUish())
  k.apply_opt(Opt(OptOps.LOCAL, 0, 4))
  prg = k.to_program()
  assert prg.globals == [0, 1, 2] or sorted(prg.globals) == [0, 1, 2]
  assert prg.outs == [0] and prg.vars == []
  assert math.prod(prg.global_size) * math.prod(prg.local_size) == M * N
  assert prg.op_estimate == 2 * M * N * K  # one multiply and one add per product, index math not counted
  assert prg.mem_estimate == 4 * (M * K + K * N + M * N)


def test_launch_sizes_never_exceed_the_renderer():
  k = Kernel(A.sink(A.store(0, F(1, 100, 60) * 2.0)), GPUish())
  prg = k.to_program()
  assert all(g <= m for g, m in zip(prg.global_size, GPUish.global_max))


def test_symbolic_program():
  n = Variable("n", 1, 64)
  ast = A.sink(A.store(0, A.arg(1, dtypes.float32, (n, 4)).sum(1)))
  gpu_prg = Kernel(ast, GPUish()).to_program()
  assert gpu_prg.launch_dims({n: 5})[0][0] == 5  # the symbolic dim is a launch dim: known at launch, not an argument
  cpu_prg = Kernel(ast, kc.Device.renderer("CLANG")).to_program()
  assert [v.arg[0] for v in cpu_prg.vars] == ["n"] and "const int n" in cpu_prg.src  # a loop bound: an argument


def test_renders_locals_barrier_and_gates():
  k = Kernel(A.sink(A.store(0, F(1, 8, 64).sum(1))), GPUish())
  k.apply_opt(Opt(OptOps.GROUPTOP, 0, 16))
  src = k.to_program().src
  assert "__local float temp1[16];" in src and "barrier(CLK_LOCAL_MEM_FENCE);" in src and "get_local_id(0)" in src
  assert "lidx0==0" in src and "if (" in src  # only the first thread of the group writes the result


def test_masked_load_reads_zero_in_source(cpu):
  src = Kernel(A.sink(A.store(0, F(1, 4).pad(((1, 1),)) + 1.0)), kc.Device.renderer("CLANG")).to_program().src
  assert "?(*(data1+" in src and ":0.0f" in src


def test_missing_spelling_is_a_compile_error():
  class NoMul(GPUish):
    code_for_op = {k: v for k, v in GPUish.code_for_op.items() if k is not Ops.MUL}
  with pytest.raises(CompileError, match="no spelling for Ops.MUL"): Kernel(matmul(4, 4, 4), NoMul()).to_program()


@pytest.mark.parametrize("fn,ref,domain", [
  (lambda e: e.exp2(), np.exp2, (-160.0, 140.0)), (lambda e: e.log2(), np.log2, (1e-30, 1e30)), (lambda e: e.sin(), np.sin, (-1e4, 1e4))])
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64, dtypes.float16])
def test_transcendental_fallbacks_within_two_ulp(fn, ref, domain, dt):
  """The polynomial exp2/log2/sin a renderer without them gets, compiled by the C backend and checked per element."""
  from kc_clang.renderer import ClangRenderer
  class NoTranscendentals(ClangRenderer):
    code_for_op = {k: v for k, v in ClangRenderer.code_for_op.items() if k not in (Ops.EXP2, Ops.LOG2, Ops.SIN)}
  npdt = dt.np
  rng = np.random.default_rng(1)
  lo, hi = domain
  x = (np.exp(rng.uniform(np.log(lo), np.log(hi), 3000)) if lo > 0 else rng.uniform(lo, hi, 3000))
  specials = [0.0, -0.0, 1.0, np.inf, -np.inf, np.nan, 1e-40, -5.0]
  x = np.concatenate([x, specials]).astype(npdt)
  dev = kc.Device["CLANG"]
  k = Kernel(A.sink(A.store(0, fn(A.arg(1, dt, (x.size,))))), NoTranscendentals())
  prg = k.to_program()
  assert not any(f in prg.src for f in ("exp2", "log2", "sin("))
  out = np.zeros_like(x)
  b0, b1 = kc.Buffer("CLANG", x.size, dt).allocate(), kc.Buffer("CLANG", x.size, dt).allocate().copyin(x)
  dev.runtime(prg.name, dev.compiler.compile(prg.src))(b0, b1)
  b0.copyout(memoryview(out).cast("B"))
  with np.errstate(all="ignore"): want = ref(x.astype(np.float64)).astype(npdt)
  same = (out == want) | (np.isnan(out) & np.isnan(want))
  ulps = np.abs(out.astype(np.float64) - want.astype(np.float64)) / np.spacing(np.abs(want)).astype(np.float64)
  assert np.all(same | (ulps <= 2)), f"worst at {x[~same][np.argmax(ulps[~same])]}"


def specials(prg): return {u.arg[0]: u.arg[1] for u in prg.uops if u.op is Ops.SPECIAL}


def test_loops_and_specials_match_the_opts(minic, cpu):
  M, K, N = 64, 32, 48
  k = Kernel(matmul(M, K, N), minic)
  for o in [Opt(OptOps.LOCAL, 0, 8), Opt(OptOps.LOCAL, 1, 4), Opt(OptOps.UPCAST, 0, 2)]: k.apply_opt(o)
  prg = k.to_program()
  sp = specials(prg)
  assert sorted(v for n, v in sp.items() if n.startswith("lidx")) == [4, 8]
  assert math.prod(v for n, v in sp.items() if n.startswith("gidx")) * 8 * 4 * 2 == M * N
  ranges = [u for u in prg.uops if u.op is Ops.RANGE]
  assert [r.src[1].arg for r in ranges] == [K]  # only the reduce is a loop on a GPU
  cpu_prg = Kernel(matmul(M, K, N), kc.Device.renderer("CLANG")).to_program()
  # (the reduce's one accumulator chain runs its K steps 4 at a time, into 4 accumulators: kc.codegen.lower)
  assert [r.src[1].arg for r in cpu_prg.uops if r.op is Ops.RANGE] == [M, N, K // 4] and not specials(cpu_prg)


def test_upcast_4_on_a_unit_stride_axis_is_one_vector_load():
  k = Kernel(A.sink(A.store(0, F(1, 16, 64) * F(2, 16, 64))), kc.Device.renderer("CLANG"))
  k.apply_opt(Opt(OptOps.UPCAST, 0, 4))  # the merged 1024 axis, unit stride in every buffer
  uops = k.to_program().uops
  loads = [u for u in uops if u.op is Ops.LOAD]
  stores = [u for u in uops if u.op is Ops.STORE]
  assert [ld.dtype for ld in loads] == [dtypes.float32.vec(4)] * 2 and [st.src[1].dtype for st in stores] == [dtypes.float32.vec(4)]


def test_the_minimal_dialect_renders_every_kernel_of_the_kernel_tests(minic):
  from test_heuristics import CASES
  from test_tensor_cores import half_matmul, float_matmul
  from test_verify_ast import softmax_denominator, variance
  builds = [c[0] for c in CASES.values()] + [softmax_denominator, variance, lambda: half_matmul(64, 64, 64), lambda: float_matmul(32, 32, 32),
                                            lambda: half_matmul(30, 30, 30)]
  rendered = 0
  for build in builds:
    variants = [lambda k: k, lambda k: k.hand_coded_optimizations()]
    variants += [lambda k, lvl=lvl: (k.apply_tensor_cores(lvl, tc_opt=2), k)[1] for lvl in (1, 2, 3)]
    for variant in variants:
      k = variant(Kernel(build(), minic))
      src = k.to_program().src
      assert src.startswith("kernel void ") and src.count("{") == src.count("}")
      rendered += 1
  assert rendered == len(builds) * 5


def test_group_ids_without_thread_ids_still_mean_work_groups_of_one(minic):
  prg = Kernel(A.sink(A.store(0, F(1, 5, 7) * 2.0)), minic).to_program()
  assert [u.arg[0] for u in prg.uops if u.op is Ops.SPECIAL] == ["gidx0"] and prg.global_size == [35, 1, 1] and prg.local_size == [1, 1, 1]
  k = Kernel(A.sink(A.store(0, F(1, 5, 7) * 2.0)), minic)
  k.apply_opt(Opt(OptOps.NOLOCALS))
  prg = k.to_program()
  assert [u.arg[0] for u in prg.uops if u.op is Ops.SPECIAL] == ["idx0"] and prg.local_size is None
