"""kc.runtime.shared_library: a kernel's shared library in this process, unloaded when dropped."""
import gc, shutil, subprocess, sys
import pytest
import kc
from kc.backend import SharedLibrary

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("cc") is None,
                                reason="builds a .so with cc and reads Linux's /proc/self/maps")

SOURCE = "int kc_answer(void) { return 42; }\nint kc_data = 7;\n"


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> bytes:
  out = tmp_path_factory.mktemp("lib") / "answer.so"
  subprocess.run(["cc", "-shared", "-fPIC", "-x", "c", "-", "-o", str(out)], input=SOURCE.encode(), check=True)
  return out.read_bytes()


def mapped(name: str) -> set[str]:
  """The files of loaded libraries of kernel `name` that /proc/self/maps lists (the file is removed once loaded)."""
  with open("/proc/self/maps") as f: return {line.split()[5] for line in f if f"/kc-{name}-" in line}


def test_symbols_and_functions(image):
  lib = SharedLibrary(image, "answer")
  fn = lib.function("kc_answer")
  assert fn() == 42
  assert lib.address("kc_data") is not None and lib.address("kc_missing") is None
  with pytest.raises(kc.KcError, match="no function named 'kc_missing'"): lib.function("kc_missing")


def test_dropping_it_unmaps_the_code(image):
  libs = [SharedLibrary(image, "dropped") for _ in range(20)]
  assert len(mapped("dropped")) == 20
  del libs[:19]
  gc.collect()
  assert len(mapped("dropped")) == 1
  libs[0].close()
  assert mapped("dropped") == set() and libs[0].lib is None
  libs[0].close()  # closing twice is harmless
  with pytest.raises(kc.KcError, match="was closed"): libs[0].address("kc_answer")


def test_an_image_the_loader_refuses_is_a_kc_error():
  with pytest.raises(kc.KcError, match="cannot load the compiled library of kernel 'junk'"):
    SharedLibrary(b"not an ELF file", "junk")
  gc.collect()  # the half-made object's finalizer has nothing to close
