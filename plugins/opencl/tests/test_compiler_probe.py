"""The probe build: OPENCL is available only where the driver's compiler builds a trivial kernel for the selected
device. A stand-in pyopencl (FakeCL, in kc_opencl.compiler) and a stand-in device make the build fail or succeed, so
these tests do not depend on what this machine's OpenCL driver can do."""
from types import SimpleNamespace
import pytest
import kc_opencl
from kc import ast as A, dtypes
from kc.errors import DeviceUnavailable
from kc.kernel import Kernel
from kc.runtime.device import DeviceRegistry
from kc.runtime.plugins import PluginTable
from kc_opencl import platform as clplatform

pytest.importorskip("pyopencl", reason="pyopencl is not installed")  # kc_opencl.compiler imports it
from kc_opencl import compiler as clcompiler  # noqa: E402

UNKNOWN_CPU = "error: unknown target CPU 'generic'\nDevice Fake CPU failed to build the program\n"


class FakeCL:
  """Stands in for pyopencl inside kc_opencl.compiler: contexts, and programs whose build fails with `log` when
  `fails`. Records every build as (source, options, devices)."""

  class Error(Exception): pass
  class RuntimeError(Error): pass
  program_build_info = SimpleNamespace(LOG="LOG")
  program_info = SimpleNamespace(BINARIES="BINARIES")

  def __init__(self, fails=False, log="", no_context=False, no_log=False):
    self.fails, self.log, self.no_context, self.no_log = fails, log, no_context, no_log
    self.builds = []

  def Context(self, devices):
    if self.no_context: raise self.Error("clCreateContext failed: DEVICE_NOT_AVAILABLE")
    return SimpleNamespace(devices=list(devices))

  def Program(self, context, src): return FakeProgram(self, context, src)


class FakeProgram:
  def __init__(self, cl, context, src): self.cl, self.context, self.src = cl, context, src

  def build(self, options=(), devices=None, cache_dir=None):
    self.cl.builds.append((self.src, list(options), list(devices)))
    if self.cl.fails: raise self.cl.RuntimeError(f"clBuildProgram failed: BUILD_PROGRAM_FAILURE\n\n{self.cl.log}")

  def get_build_info(self, device, what):
    assert what == "LOG"
    if self.cl.no_log: raise self.cl.Error("clGetProgramBuildInfo failed: INVALID_PROGRAM")
    return self.cl.log

  def get_info(self, what):
    assert what == "BINARIES"
    return [b"fake binary"]


def fake_device(name="Fake CPU", driver="1.0", cpu=True):
  """What DeviceInfo.of reads from a pyopencl Device."""
  import pyopencl as cl
  kind = cl.device_type.CPU if cpu else cl.device_type.GPU
  return SimpleNamespace(name=name, platform=SimpleNamespace(name="Fake CL", version="OpenCL 3.0 FakeCL 1.0 LLVM 14"), version="OpenCL 3.0",
                         driver_version=driver, max_work_item_sizes=[512, 256, 64], max_work_group_size=512, local_mem_size=65536,
                         address_bits=64, mem_base_addr_align=1024, extensions="cl_khr_fp64", image_support=False,
                         single_fp_config=int(cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT), type=int(kind))


@pytest.fixture
def driver(monkeypatch):
  """Installs a FakeCL and a stand-in device as the selected one: driver(cl, device=None) -> the device. The probe's
  per-process answers and the selected device's info start (and end) empty."""
  monkeypatch.setattr(clplatform, "_probed", {})
  clplatform._info_for.cache_clear()
  def install(cl, device=None):
    device = device or fake_device()
    monkeypatch.setattr(clcompiler, "cl", cl)
    monkeypatch.setattr(clplatform, "select_device", lambda: device)
    return device
  yield install
  clplatform._info_for.cache_clear()  # the stand-in device's info must not outlive the test


def test_a_device_whose_compiler_cannot_build_is_unavailable_and_says_why(driver):
  driver(FakeCL(fails=True, log=UNKNOWN_CPU))
  reason = kc_opencl.unavailable_reason()
  # the device, the compiler's first error line, and what to do instead
  assert "cannot build a trivial kernel for Fake CPU (Fake CL OpenCL 3.0 FakeCL 1.0 LLVM 14)" in reason
  assert "error: unknown target CPU 'generic'." in reason and "failed to build the program" not in reason
  assert "Use the CLANG device instead" in reason and "OpenCL implementation whose compiler supports this CPU" in reason
  reg = DeviceRegistry(PluginTable(entry_points=lambda: []))
  reg.table.register(kc_opencl.kc_backends()[0])
  assert "OPENCL" in reg.names() and "OPENCL" not in reg.available() and reg.unavailable_reason("OPENCL") == reason
  with pytest.raises(DeviceUnavailable, match="unknown target CPU 'generic'"):
    reg["OPENCL"]
  with pytest.raises(DeviceUnavailable, match="unknown target CPU 'generic'"):
    reg.compiler("OPENCL")  # the compile tier says why rather than fail on every kernel


def test_the_render_tier_keeps_the_device_limits_without_a_working_compiler(driver):
  cl = FakeCL(fails=True, log=UNKNOWN_CPU)
  driver(cl)
  renderer = kc_opencl.device_renderer()
  assert renderer.info is not None and renderer.info.name == "Fake CPU"
  assert renderer.local_max == (512, 256, 64) and renderer.shared_max == 65536
  src = Kernel(A.sink(A.store(0, A.arg(1, dtypes.float32, (16,)) + 1.0)), renderer).to_program().src
  assert "__kernel void" in src
  assert cl.builds == []  # rendering builds nothing, not even the probe


def test_a_gpu_whose_compiler_cannot_build_says_device_not_cpu(driver):
  driver(FakeCL(fails=True, log="error: unsupported target 'fakearch-9'\n"), fake_device("Fake GPU", cpu=False))
  reason = kc_opencl.unavailable_reason()
  assert "for Fake GPU" in reason and "error: unsupported target 'fakearch-9'" in reason and "supports this device" in reason


def test_a_device_whose_compiler_builds_is_available_and_the_probe_uses_kc_build_options(driver):
  cl = FakeCL()
  device = driver(cl)
  assert kc_opencl.unavailable_reason() is None
  [(src, options, devices)] = cl.builds
  assert src == clcompiler.PROBE_SOURCE and "__kernel void" in src
  assert options == ["-cl-fp32-correctly-rounded-divide-sqrt"] and devices == [device]  # what every kernel is built with


def test_the_probe_builds_once_per_process_and_device(driver):
  cl = FakeCL(fails=True, log=UNKNOWN_CPU)
  device = driver(cl)
  first = kc_opencl.unavailable_reason()
  assert kc_opencl.unavailable_reason() == first and clplatform.compiler_problem(device) == "error: unknown target CPU 'generic'"
  assert len(cl.builds) == 1
  # another device (or the same device under another driver) is built for again
  other = fake_device(driver="2.0")
  assert clplatform.compiler_problem(other) == "error: unknown target CPU 'generic'" and len(cl.builds) == 2
  clplatform.compiler_problem(other)
  assert len(cl.builds) == 2


@pytest.mark.parametrize("cl, problem", [
  # the program kept no log: pyopencl's message, which quotes it, gives the error line
  (FakeCL(fails=True, log="error: unknown target CPU 'generic'", no_log=True), "error: unknown target CPU 'generic'"),
  # a log with no line that says error: its first line
  (FakeCL(fails=True, log="ld: cannot find -lfakekernel\nDevice Fake CPU failed to build the program\n"), "ld: cannot find -lfakekernel"),
  # no context on the device: nothing can build there either
  (FakeCL(no_context=True), "Error: clCreateContext failed: DEVICE_NOT_AVAILABLE"),
])
def test_what_the_probe_reports_when_the_driver_fails_otherwise(driver, cl, problem):
  driver(cl)
  reason = kc_opencl.unavailable_reason()
  assert f": {problem}. Use the CLANG device" in reason
