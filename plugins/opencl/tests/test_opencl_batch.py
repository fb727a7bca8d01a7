"""Batched builds (OpenCLCompiler.compile_batch_uncached): many kernels from one clBuildProgram, each member's payload
running exactly as its own build does, as a binary or as kept source; kernels that share a name or a static helper;
the batch's program built once a process; and sources a batch cannot hold failing the batch so that compile_many
builds them one by one."""
import numpy as np
import pytest
import kc
from kc import ast as A, dtypes
from kc.api import CompiledKernel
from kc.errors import CompileError
import kc_opencl
from kc_opencl.compiler import BATCH_PAYLOAD, OpenCLCompiler, payload_entry, payload_source

if (REASON := kc_opencl.unavailable_reason()) is not None:
  pytest.skip(f"OPENCL cannot open here: {REASON}", allow_module_level=True)

pytestmark = pytest.mark.usefixtures("cache_dir")

# three kernels of one name (one loop nest, other bodies), a reduce, half and double precision (extension pragmas), and fp8
# (static conversion helpers on a CPU device, in two kernels)
EXPRS = {
  "double": (lambda x: x * 2, dtypes.float32),
  "triple": (lambda x: x * 3, dtypes.float32),
  "plus": (lambda x: x + 1, dtypes.float32),
  "rowsum": (lambda x: x.sum(axis=1), dtypes.float32),
  "half": (lambda x: (x * 3).cast(dtypes.float16) * 2, dtypes.float32),
  "f64": (lambda x: x.cast(dtypes.float64) * 3, dtypes.float32),
  "fp8": (lambda x: x.cast(dtypes.fp8e4m3), dtypes.float32),
  "fp8_twice": (lambda x: (x * 2).cast(dtypes.fp8e4m3), dtypes.float32),
}
SHAPE = (32, 64)


@pytest.fixture(scope="module")
def programs():
  r = kc.Device["OPENCL"].renderer
  return {name: kc.compile(A.sink(A.store(0, fn(A.arg(1, dt, SHAPE)))), device="OPENCL", opts="hand")
          for name, (fn, dt) in EXPRS.items() if r.supports_dtype(dtypes.float16 if name == "half" else dtypes.float64 if name == "f64" else dt)}


def compiler(source_payload: bool) -> OpenCLCompiler:
  d = kc.Device["OPENCL"]
  return OpenCLCompiler(d.context, d.cl_device, d.info, d.compiler.plugin_version, source_payload=source_payload)


def run_payload(ck: CompiledKernel, lib: bytes) -> np.ndarray:
  """Kernel `ck` loaded from the payload `lib` and run: its output's bytes."""
  swapped = CompiledKernel(ck.ast, ck.kernel, ck.program, "OPENCL", kc.Device["OPENCL"].runtime(ck.program.name, lib))
  x = np.random.default_rng(0).uniform(-2, 2, SHAPE).astype(np.float32)
  spec = ck.specs[0]
  out = np.zeros(spec.shape, np.uint8 if spec.dtype == dtypes.fp8e4m3 else spec.np_dtype)  # fp8: its raw bits
  swapped(out, x)
  return out.view(np.uint8)


@pytest.mark.parametrize("source_payload", [True, False], ids=["source", "binary"])
def test_every_member_runs_as_its_own_build_does(programs, source_payload):
  c, names = compiler(source_payload), list(programs)
  srcs = [programs[n].program.src for n in names]
  assert len({programs[n].program.name for n in names}) < len(names)  # the batch holds kernels of one name
  assert any("#pragma OPENCL EXTENSION" in s for s in srcs) or "f64" not in names
  libs = c.compile_batch_uncached(srcs)
  assert len(libs) == len(names) and len({payload_entry(lib)[1] for lib in libs}) == 1  # one program, every member
  assert (payload_source(payload_entry(libs[0])[1]) is not None) is source_payload
  for name, lib in zip(names, libs):
    ck = programs[name]
    np.testing.assert_array_equal(run_payload(ck, lib), run_payload(ck, c.compile_uncached(ck.program.src)), err_msg=name)


def test_a_batchs_program_is_built_once_a_process(programs, monkeypatch):
  c = compiler(True)
  libs = c.compile_batch_uncached([p.program.src for p in programs.values()])
  dev, builds = kc.Device["OPENCL"], []
  real = dev.compiler.build
  monkeypatch.setattr(dev.compiler, "build", lambda src: builds.append(src) or real(src))
  for ck, lib in zip(programs.values(), libs): run_payload(ck, lib)
  assert len(builds) <= 1  # none when an earlier test of this process loaded the same batch


def test_compile_many_builds_a_bad_batch_one_by_one(programs):
  c = compiler(True)
  good = [programs["double"].program.src, programs["rowsum"].program.src]
  bad = "__kernel void broken(__global float* d) { d[0] = undefined_name; }\n"
  got = c.compile_many([good[0], bad, good[1]])
  assert isinstance(got[1], CompileError) and "undefined_name" in (got[1].log or str(got[1]))
  for lib, name in ((got[0], "double"), (got[2], "rowsum")):  # built alone: each its own program
    assert isinstance(lib, bytes) and not lib.startswith(BATCH_PAYLOAD)
    np.testing.assert_array_equal(run_payload(programs[name], lib), run_payload(programs[name], c.compile_uncached(programs[name].program.src)))


@pytest.mark.parametrize("src", [
  "#define X 1\n__kernel void k(__global float* d) { d[0] = X; }\n",
  "__kernel void a(__global float* d) { d[0] = 1.0f; }\n__kernel void b(__global float* d) { d[0] = 2.0f; }\n",
  "float h(float x) { return x; }\n"])
def test_a_source_a_batch_cannot_hold_fails_the_batch(src):
  with pytest.raises(CompileError): compiler(True).compile_batch_uncached([src, "__kernel void k(__global float* d) { d[0] = 1.0f; }\n"])


def test_a_payload_that_is_not_a_batchs_names_no_entry():
  assert payload_entry(b"\x7fELF...") == (None, b"\x7fELF...")
  assert payload_entry(BATCH_PAYLOAD + b"kcb3_E_4\0PROGRAM\0BYTES") == ("kcb3_E_4", b"PROGRAM\0BYTES")
