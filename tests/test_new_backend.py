"""`kc new-backend`: the package it writes is complete, byte-compiles, imports only kc and kc.backend, renders a
kernel, and runs kernels correctly once registered, without installing anything."""
import ast as pyast
import importlib, py_compile, shutil, sys
import numpy as np
import pytest
import kc
from kc import ast as A, dtypes
from kc.tools.cli import main
from kc.tools.new_backend import NewBackendError, backend_names, compatible_range, write_backend
from kc.runtime import plugins

NAME = "nbtoy"  # a name no installed plugin takes
FILES = {"pyproject.toml", "README.md", "kc_nbtoy/__init__.py", "kc_nbtoy/renderer.py", "kc_nbtoy/compiler.py",
         "kc_nbtoy/runtime.py", "tests/test_conformance.py"}


@pytest.fixture
def generated(tmp_path):
  return write_backend(NAME, tmp_path)


@pytest.fixture
def plugin_module(generated):
  """The generated package imported from its folder, as `import kc_nbtoy` would once installed; forgotten afterwards."""
  sys.path.insert(0, str(generated))
  try: yield importlib.import_module("kc_nbtoy")
  finally:
    sys.path.remove(str(generated))
    for mod in [m for m in sys.modules if m == "kc_nbtoy" or m.startswith("kc_nbtoy.")]: del sys.modules[mod]


def _imported_modules(path) -> set[str]:
  tree = pyast.parse(path.read_text())
  out = set()
  for node in pyast.walk(tree):
    if isinstance(node, pyast.Import): out.update(a.name for a in node.names)
    elif isinstance(node, pyast.ImportFrom) and node.level == 0: out.add(node.module)
  return out


def test_the_package_has_every_file_and_they_byte_compile(generated):
  assert generated.name == "kc-nbtoy"
  assert {str(p.relative_to(generated)) for p in generated.rglob("*") if p.is_file()} == FILES
  for py in generated.rglob("*.py"): py_compile.compile(str(py), doraise=True, cfile=str(py) + "c")
  for text in (p.read_text() for p in generated.rglob("*") if p.is_file() and p.suffix != ".pyc"):
    assert "TODO" not in text and "$" not in text


def test_pyproject_names_the_distribution_the_entry_point_and_a_compatible_kc(generated):
  tomllib = pytest.importorskip("tomllib")  # Python 3.11+
  project = tomllib.loads((generated / "pyproject.toml").read_text())["project"]
  assert project["name"] == "kc-nbtoy"
  assert project["entry-points"]["kc.backends"] == {"nbtoy": "kc_nbtoy"}
  assert project["dependencies"] == [compatible_range(kc.__version__)]


def test_the_plugin_imports_only_kc_kc_backend_the_stdlib_and_itself(generated):
  allowed_third_party = {"kc", "kc.backend"}
  for py in (generated / "kc_nbtoy").glob("*.py"):
    for mod in _imported_modules(py):
      top = mod.split(".")[0]
      assert mod in allowed_third_party or top == "kc_nbtoy" or top in sys.stdlib_module_names, f"{py.name} imports {mod}"


def test_the_renderer_renders_a_kernel(plugin_module):
  from kc_nbtoy.renderer import NbtoyRenderer
  sink = A.sink(A.store(0, (A.arg(1, dtypes.float32, (4, 8)) * 2).sum(1)))
  src = kc.Kernel(sink, NbtoyRenderer()).to_program().src
  assert "#include <math.h>" in src and "void " in src and "float*" in src


def test_the_spec_names_the_device(plugin_module):
  [spec] = plugin_module.kc_backends()
  assert (spec.name, spec.distribution, spec.api_version) == ("NBTOY", "kc-nbtoy", plugins.PLUGIN_API_VERSION)
  assert spec.renderer().device == "NBTOY"


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) here")
def test_registered_in_process_it_runs_kernels_like_numpy(plugin_module):
  [spec] = plugin_module.kc_backends()
  plugins.register(spec, replace=True)
  try:
    x = np.random.default_rng(0).standard_normal((16, 24)).astype(np.float32)
    a = A.arg(1, dtypes.float32, x.shape)
    sink = A.sink(A.store(0, (a * a + 1).sum(1)))
    out = kc.run(sink, {1: x}, device="NBTOY")[0]
    np.testing.assert_allclose(out, (x * x + 1).sum(1), rtol=1e-5)
    i = np.arange(-50, 50, dtype=np.int32)
    b = A.arg(1, dtypes.int32, i.shape)
    np.testing.assert_array_equal(kc.run(A.sink(A.store(0, b * 3 - 7)), {1: i}, device="NBTOY")[0], i * 3 - 7)
  finally: plugins.unregister("NBTOY")


def test_a_batch_of_kernels_builds_in_one_compiler_run_and_each_runs_as_its_own_build(plugin_module, cache_dir):
  # kernels of one name (one loop nest, other bodies) and a reduce: compile_many builds them as one library
  [spec] = plugin_module.kc_backends()
  plugins.register(spec, replace=True)
  try:
    x = np.random.default_rng(0).standard_normal((16, 24)).astype(np.float32)
    a = A.arg(1, dtypes.float32, x.shape)
    exprs = [a * 2, a * 3, a + 1, (a * a).sum(1), (a * 2).exp()]
    cks = [kc.compile(A.sink(A.store(0, e)), device="NBTOY") for e in exprs]
    assert len({ck.program.name for ck in cks}) < len(cks)
    compiler = kc.Device["NBTOY"].compiler
    runs = []
    monkey = compiler.compile_uncached
    compiler.compile_uncached = lambda src: runs.append(src) or monkey(src)
    libs = compiler.compile_batch_uncached([ck.program.src for ck in cks])
    assert len(runs) == 1 and len({lib.split(b"\0", 2)[2] for lib in libs}) == 1  # one compiler run, one library
    for ck, lib, want in zip(cks, libs, [x * 2, x * 3, x + 1, (x * x).sum(1), np.exp(x * 2)]):
      out = np.zeros(ck.specs[0].shape, np.float32)
      kc.api.CompiledKernel(ck.ast, ck.kernel, ck.program, "NBTOY", kc.Device["NBTOY"].runtime(ck.program.name, lib))(out, x)
      np.testing.assert_allclose(out, want, rtol=1e-5)
  finally: plugins.unregister("NBTOY")


# ------------------------------------------------------------------------------------------------------------ refusals

@pytest.mark.parametrize("bad", ["", "9lives", "_x", "my-gpu", "a b", "gpu.x"])
def test_a_name_that_is_no_identifier_is_refused(tmp_path, bad):
  with pytest.raises(NewBackendError, match="cannot name a backend"): write_backend(bad, tmp_path)
  assert not any(tmp_path.iterdir())


def test_a_non_empty_target_folder_is_refused_and_left_alone(tmp_path):
  (tmp_path / "kc-nbtoy").mkdir()
  (tmp_path / "kc-nbtoy" / "keep.txt").write_text("mine")
  with pytest.raises(NewBackendError, match="not empty"): write_backend(NAME, tmp_path)
  assert [p.name for p in (tmp_path / "kc-nbtoy").iterdir()] == ["keep.txt"]


def test_an_empty_target_folder_is_used(tmp_path):
  (tmp_path / "kc-nbtoy").mkdir()
  assert (write_backend(NAME, tmp_path) / "pyproject.toml").is_file()


def test_a_registered_device_name_is_refused(tmp_path):
  taken = kc.Device.names()[0]
  with pytest.raises(NewBackendError, match=f"device {taken} is already registered"): write_backend(taken.lower(), tmp_path)


def test_the_command_writes_the_package_and_exits_2_on_bad_input(tmp_path, capsys):
  assert main(["new-backend", NAME, "--dir", str(tmp_path)]) == 0
  assert "kc conformance --device NBTOY" in capsys.readouterr().out
  assert main(["new-backend", NAME, "--dir", str(tmp_path)]) == 2
  assert "not empty" in capsys.readouterr().err
  assert main(["new-backend", "2fast", "--dir", str(tmp_path)]) == 2


def test_names_and_version_ranges():
  n = backend_names("My_Gpu")
  assert (n.device, n.entry_point, n.package, n.distribution, n.class_prefix) == ("MY_GPU", "my_gpu", "kc_my_gpu", "kc-my_gpu", "MyGpu")
  assert compatible_range("0.1.0") == "kc-core>=0.1,<0.2"
  assert compatible_range("1.4.2", "kc-conformance") == "kc-conformance>=1.4,<2"
