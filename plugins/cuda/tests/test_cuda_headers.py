"""Where NVRTC's CUDA headers are found: cuda.pathfinder's answer, then the wheel layouts of CUDA 12
(nvidia/cuda_runtime/include) and CUDA 13 (nvidia/cu13/include), then $CUDA_HOME and $CUDA_PATH; always headers of
NVRTC's own CUDA major, and a typed error naming every place searched where there are none.

The layouts are laid out in temporary site-packages folders; the real headers of both majors side by side come from
the installed wheels and from wheel files in KC_CUDA_HEADER_WHEELS (pip download --no-deps nvidia-cuda-runtime-cu12
'nvidia-cuda-runtime==13.*'), extracted as pip would install them."""
import glob, os, shutil, sys, zipfile
import pytest
from hypothesis import given, settings, strategies as st
from kc.backend import CompileError, KcError
import kc_cuda.compiler as compiler
from kc_cuda.compiler import (NEEDED_HEADER, WHEEL_INCLUDE_DIRS, CUDAHeadersNotFound, NVRTCCompiler, find_headers,
                              header_version, nvrtc_major)

MAJORS = tuple(WHEEL_INCLUDE_DIRS)
WHEELS_ENV = "KC_CUDA_HEADER_WHEELS"
HALF_KERNEL = ('#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n'
               'extern "C" __global__ void k(half* a, nv_bfloat16* b) {\n'
               '  a[0] = a[1] * (half)2.0f; b[0] = b[1] + b[2];\n}\n')


def fake_headers(include: str, version: int = 12090, fp16: bool = True) -> str:
  """A folder of headers as a CUDA install has them: cuda_fp16.h and cuda_runtime_api.h's CUDART_VERSION."""
  os.makedirs(include, exist_ok=True)
  if fp16:
    with open(os.path.join(include, NEEDED_HEADER), "w") as f: f.write("// half\n")
  with open(os.path.join(include, "cuda_runtime_api.h"), "w") as f:
    f.write(f"#pragma once\n#define CUDART_VERSION  {version}\n")
  return include


def wheel_include(site: str, major: int) -> str: return os.path.join(site, *WHEEL_INCLUDE_DIRS[major].split("/"))


def no_pathfinder(): return None, "pathfinder (stand-in)"


def test_each_wheel_layout_is_found_for_its_own_major(tmp_path):
  site = str(tmp_path / "site-packages")
  fake_headers(wheel_include(site, 12), 12090)
  fake_headers(wheel_include(site, 13), 13050)
  for major, version in ((12, (12, 9)), (13, (13, 5))):
    found = find_headers(major, [site], {}, no_pathfinder)
    assert (found.path, found.version) == (wheel_include(site, major), version)
    assert found.found_via == f"the CUDA {major} wheel layout"


def test_pathfinder_answer_of_another_major_is_passed_over(tmp_path):
  # cuda.pathfinder looks in nvidia/cu13/include first: beside a CUDA 12 NVRTC its answer is the wrong major
  site = str(tmp_path / "site")
  cu12, cu13 = fake_headers(wheel_include(site, 12), 12080), fake_headers(wheel_include(site, 13), 13000)
  assert find_headers(12, [site], {}, lambda: (cu13, "pathfinder")).path == cu12
  found = find_headers(13, [site], {}, lambda: (cu13, "pathfinder"))
  assert (found.path, found.found_via) == (cu13, "pathfinder")


def test_toolkit_variables_come_after_the_wheels(tmp_path):
  home, path = str(tmp_path / "home"), str(tmp_path / "path")
  fake_headers(os.path.join(home, "include"), 12060)
  fake_headers(os.path.join(path, "include"), 13010)
  env = {"CUDA_HOME": home, "CUDA_PATH": path}
  assert find_headers(12, [], env, no_pathfinder).found_via == "$CUDA_HOME"
  assert find_headers(13, [], env, no_pathfinder).found_via == "$CUDA_PATH"
  site = str(tmp_path / "site")
  fake_headers(wheel_include(site, 12), 12090)
  assert find_headers(12, [site], env, no_pathfinder).version == (12, 9)


def test_the_error_names_every_place_and_why(tmp_path):
  site = str(tmp_path / "site")
  fake_headers(wheel_include(site, 13), 13000)
  fake_headers(wheel_include(site, 12), 12090, fp16=False)
  home = str(tmp_path / "home")
  os.makedirs(os.path.join(home, "include"))
  with open(os.path.join(home, "include", NEEDED_HEADER), "w") as f: f.write("// no version header beside it\n")
  with pytest.raises(CUDAHeadersNotFound) as e:
    find_headers(12, [site, str(tmp_path / "missing")], {"CUDA_HOME": home}, lambda: (None, "pathfinder (stand-in)"))
  assert isinstance(e.value, CompileError) and isinstance(e.value, KcError) and e.value.cuda_major == 12
  msg = str(e.value)
  assert "pip install 'kc-cuda[cu12]'" in msg and "CUDA_HOME" in msg
  assert f"the CUDA 12 wheel layout {wheel_include(site, 12)}: no {NEEDED_HEADER}" in msg
  assert f"the CUDA 13 wheel layout {wheel_include(site, 13)}: CUDA 13.0 headers, not CUDA 12's" in msg
  assert "pathfinder (stand-in): found nothing" in msg and "$CUDA_PATH: not set" in msg
  assert f"$CUDA_HOME {os.path.join(home, 'include')}: {NEEDED_HEADER}, but no CUDART_VERSION" in msg
  assert str(tmp_path / "missing") not in msg  # a site folder that does not exist is no place


def test_a_pathfinder_that_cannot_answer_is_reported_not_raised(tmp_path, monkeypatch):
  import cuda.pathfinder
  def old_pathfinder(libname): raise RuntimeError(f"UNKNOWN {libname=!r}")
  monkeypatch.setattr(cuda.pathfinder, "find_nvidia_header_directory", old_pathfinder)
  site = str(tmp_path / "site")
  fake_headers(wheel_include(site, 13), 13020)
  assert find_headers(13, [site], {}).version == (13, 2)
  with pytest.raises(CUDAHeadersNotFound, match=r"RuntimeError: UNKNOWN libname='cudart'"): find_headers(12, [site], {})


PLACES = ("pathfinder", "site_a/12", "site_a/13", "site_b/12", "site_b/13", "CUDA_HOME", "CUDA_PATH")


@settings(max_examples=60, deadline=None)
@given(nvrtc=st.sampled_from(MAJORS),
       laid=st.dictionaries(st.sampled_from(PLACES), st.sampled_from([12000, 12090, 13000, 13050, 0])))
def test_the_first_place_in_order_with_nvrtcs_major_wins(tmp_path_factory, nvrtc, laid):
  """Any mix of layouts, majors and missing headers (version 0: no cuda_fp16.h): the headers found are the first of
  pathfinder, site_a's layouts, site_b's, CUDA_HOME, CUDA_PATH that holds NVRTC's major; else the error lists all."""
  root = str(tmp_path_factory.mktemp("layouts"))
  dirs = {}
  for place, version in laid.items():
    if place.startswith("site"):
      site, major = place.split("/")
      dirs[place] = wheel_include(os.path.join(root, site), int(major))
    else: dirs[place] = os.path.join(root, place, "include")
    fake_headers(dirs[place], version or 12090, fp16=version != 0)
  env = {v: os.path.dirname(dirs[v]) for v in ("CUDA_HOME", "CUDA_PATH") if v in dirs}
  # within a site folder NVRTC's own major's layout is looked at first; a site folder that does not exist is no place
  sites = [s for s in ("site_a", "site_b") if any(p.startswith(s) for p in laid)]
  wheels = [f"{s}/{m}" for s in sites for m in sorted(MAJORS, key=lambda m: m != nvrtc)]
  order = ["pathfinder", *wheels, "CUDA_HOME", "CUDA_PATH"]
  winner = next((p for p in order if laid.get(p) and laid[p] // 1000 == nvrtc), None)
  sites_given = [os.path.join(root, "site_a"), os.path.join(root, "site_b")]
  args = (nvrtc, sites_given, env, lambda: (dirs.get("pathfinder"), "pathfinder"))
  if winner is None:
    with pytest.raises(CUDAHeadersNotFound) as e: find_headers(*args)
    assert len(e.value.searched) == len(order)
  else:
    found = find_headers(*args)
    assert found.path == dirs[winner] and found.version[0] == nvrtc


def test_headers_of_the_installed_nvrtc_are_found():
  found = compiler.cuda_headers()
  assert found.version[0] == nvrtc_major() and os.path.isfile(os.path.join(found.path, NEEDED_HEADER))
  identity = NVRTCCompiler("sm_90").identity()
  assert f"CUDA {nvrtc_major()}" in identity and f"headers {found.version_text}" in identity


# ---------------------------------------------------------------------------------------------------- the real wheels

def _installed_include_dirs() -> dict:
  """{major: include folder} of the nvidia-cuda-runtime wheels installed in this Python."""
  found = {}
  for site in sys.path:
    for major in MAJORS:
      inc = wheel_include(site, major) if site else ""
      if major not in found and os.path.isfile(os.path.join(inc, NEEDED_HEADER)): found[major] = inc
  return found


@pytest.fixture(scope="module")
def real_side_by_side(tmp_path_factory):
  """A site-packages folder holding the real headers of both CUDA majors, each in its wheel's layout."""
  site = str(tmp_path_factory.mktemp("site-packages"))
  wheels = sorted(glob.glob(os.path.join(os.environ[WHEELS_ENV], "*.whl"))) if os.environ.get(WHEELS_ENV) else []
  for wheel in wheels:
    with zipfile.ZipFile(wheel) as z:  # what pip installs from the wheel's include folder
      z.extractall(site, [n for n in z.namelist() if n.startswith("nvidia/") and "/include/" in n])
  for major, inc in _installed_include_dirs().items():
    if not os.path.isdir(wheel_include(site, major)): shutil.copytree(inc, wheel_include(site, major))
  missing = [m for m in MAJORS if header_version(wheel_include(site, m)) is None]
  if missing:
    pytest.skip(f"no real CUDA {' or '.join(map(str, missing))} headers here: install nvidia-cuda-runtime of that "
                f"major, or point {WHEELS_ENV} at a folder holding its wheel "
                "(pip download --no-deps -d DIR nvidia-cuda-runtime-cu12 'nvidia-cuda-runtime==13.*')")
  return site


def test_real_wheels_side_by_side_give_each_major_its_own(real_side_by_side):
  site = real_side_by_side
  cu13 = wheel_include(site, 13)
  for major in MAJORS:
    # pathfinder's answer is the CUDA 13 layout whichever NVRTC asks, as cuda.pathfinder's search order gives it
    found = find_headers(major, [site], {}, lambda: (cu13, "pathfinder"))
    assert found.version[0] == major and found.path == wheel_include(site, major)


def test_nvrtc_compiles_half_and_bfloat16_with_the_headers_found_beside_the_other_major(real_side_by_side, monkeypatch):
  site = real_side_by_side
  other = next(m for m in MAJORS if m != nvrtc_major())
  found = find_headers(nvrtc_major(), [site], {}, lambda: (wheel_include(site, other), "pathfinder"))
  monkeypatch.setattr(compiler, "cuda_headers", lambda: found)
  c = NVRTCCompiler("sm_90")
  assert c.options[-1] == f"-I{wheel_include(site, nvrtc_major())}"
  lib, log = c.compile_with_log(HALF_KERNEL)
  assert compiler.unpack_library(lib)[0]["cuda"] == nvrtc_major() and "warning" not in log
