#!/usr/bin/env bash
# The CUDA device's check on a machine with an NVIDIA GPU and driver, offline: install kc, kc-cuda and the conformance
# suite into the machine's own Python, show what kc sees, run kc-cuda's own tests (its GPU tests included), the
# conformance suite on CUDA (all tiers), the CUDA benchmark, the call path (bench_call), kc's OPENCL device on the same GPU
# through NVIDIA's OpenCL driver (conformance, all tiers) and kc-torch's benchmark on the GPU (torch eager, inductor
# and torch.compile(backend="kc") with kc's CUDA device: benchmarks/bench_torch.py --device CUDA). Everything lands in $OUT (default ./gpu_check_out).
#
# Run from anywhere in the repository:  bash plugins/cuda/gpu_check.sh
#
# It uses the Python it is given as it is (a GPU image's Python is often itself a virtual environment, whose packages
# a new venv would not see): `pip install --no-deps --no-build-isolation --no-index -e . -e plugins/cuda -e conformance`
# needs no network. Before that it checks that every module the run imports is there and names what is missing; a
# missing one can be carried in as wheels (KC_WHEELHOUSE), which it installs from with --no-index first. Make them on
# a machine with a network:  bash plugins/cuda/gpu_check.sh wheels   (into build/gpu-wheels, ~1 MiB)
#
# The steps' caps add up to less than KC_GPU_CHECK_BUDGET (default 540 s), so the whole run fits one 10-minute call;
# a step also never runs past what is left of the budget. A failing step does not stop the next, except that nothing
# runs after a failed preflight or install, and nothing that needs a GPU runs where none can open. The benchmark
# rewrites its JSON after every row. Exit status: 0 all passed, 1 a step failed, 3 no GPU here (everything before
# that passed).
#
# Settings (environment):
#   OUT                  where reports go (default ./gpu_check_out)
#   PYTHON               the interpreter to install into and run (default python3)
#   KC_WHEELHOUSE        a folder of wheels for modules the Python lacks (default build/gpu-wheels where it exists;
#                        a path that is no folder, e.g. none, installs nothing from wheels)
#   KC_GPU_SKIP_INSTALL=1  kc, kc-cuda and kc-conformance are already installed in PYTHON
#   KC_GPU_WORKERS       conformance processes (default 8)
#   KC_GPU_SPECS         the conformance specs (default none,hand,random,tc: the single-opt specs are the shared
#                        lowering, which CI certifies on EMU impersonating CUDA)
#   KC_GPU_TORCH_MODELS  the models of bench_torch.py on the GPU, comma-separated (default all: every model, 71 s
#                        on an H200 with its compiles)
#   KC_GPU_CHECK_BUDGET  seconds for all steps together (default 540)
set -u
cd "$(dirname "$0")/../.." || exit 2
PYTHON=${PYTHON:-python3}
WHEELHOUSE=${KC_WHEELHOUSE:-$([[ -d build/gpu-wheels ]] && echo build/gpu-wheels)}
# what the run needs that a GPU image with torch, cupy, NVIDIA's CUDA wheels and pytest may lack
CARRIED_WHEELS="jsonschema pyopencl"  # pyopencl: the opencl step (kc's OPENCL on NVIDIA's OpenCL driver, same GPU)

if [[ "${1:-}" == wheels ]]; then  # with a network: CARRIED_WHEELS for Python 3.12 on x86-64 Linux
  exec "$PYTHON" -m pip download --only-binary=:all: --python-version "${KC_GPU_PYTHON_VERSION:-3.12}" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "${KC_WHEELHOUSE:-build/gpu-wheels}" $CARRIED_WHEELS
fi

OUT=${OUT:-./gpu_check_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUDGET=${KC_GPU_CHECK_BUDGET:-540}
DEADLINE=$(( $(date +%s) + BUDGET ))
KILL_GRACE=10  # timeout's --kill-after: a step may overrun its limit by this much
# a fresh compile cache: a stale entry from another kc must not decide what runs
export KC_CACHE_DIR=${KC_CACHE_DIR:-$(mktemp -d)}
exec > >(tee "$OUT/gpu_check.log") 2>&1

FAILED=()
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"

# step NAME CAP_SECONDS COMMAND...: run COMMAND for at most CAP seconds and never past the budget; returns its status
step() {
  local name=$1 cap=$2; shift 2
  local left=$(( DEADLINE - $(date +%s) - KILL_GRACE ))
  local limit=$(( cap < left ? cap : left ))
  echo
  echo "=== $name (at most ${limit}s) ==="
  if (( limit < 5 )); then
    echo "skipped: the time budget of ${BUDGET}s is spent"
    FAILED+=("$name")
    echo "$name: skipped (no time left)" >> "$SUMMARY"
    return 124
  fi
  local start=$(date +%s)
  # a fresh bash runs the step: timeout runs programs, and the step functions are exported to it
  timeout --kill-after=$KILL_GRACE "$limit" bash -c '"$@"' step "$@"
  local rc=$?
  local took=$(( $(date +%s) - start ))
  if (( rc == 124 || rc == 137 )); then echo "--- $name timed out after ${limit}s"; fi
  if (( rc != 0 )); then FAILED+=("$name"); fi
  echo "$name: rc=$rc in ${took}s" | tee -a "$SUMMARY"
  return $rc
}

finish() {  # the summary, then exit with $1 where no step failed
  echo
  echo "=== summary ==="
  cat "$SUMMARY"
  if (( ${#FAILED[@]} )); then echo "failed: ${FAILED[*]}"; exit 1; fi
  exit "$1"
}

# every module the run imports: "module pip-name why", one a line
export REQUIRED_MODULES="numpy numpy kc
pluggy pluggy kc's plugin registry
cuda.bindings cuda-bindings NVRTC and the CUDA driver
cuda.pathfinder cuda-pathfinder finding the CUDA headers
pytest pytest the plugin tests and the conformance suite
xdist pytest-xdist conformance in several processes
hypothesis hypothesis the plugin tests
ml_dtypes ml-dtypes the plugin tests' fp8 and bfloat16 references
jsonschema jsonschema the conformance report (validated before it is written)"
export OUT PYTHON WHEELHOUSE

missing_modules() {  # prints "pip-name (module: why)" for each REQUIRED_MODULES entry that does not import
  "$PYTHON" - <<'EOF'
import importlib, os
for line in os.environ["REQUIRED_MODULES"].splitlines():
  module, pip_name, why = line.split(" ", 2)
  try: importlib.import_module(module)
  except Exception as e: print(f"{pip_name} ({module}: {why}; {type(e).__name__}: {e})")
EOF
}
preflight() {
  "$PYTHON" - <<'EOF' || return 1
import sys
print(sys.executable, sys.version.split()[0], "(a virtual environment)" if sys.prefix != sys.base_prefix else "")
sys.exit(sys.version_info < (3, 10) and "kc needs Python 3.10 or newer")
EOF
  if [[ "${KC_GPU_SKIP_INSTALL:-0}" != 1 ]] && ! "$PYTHON" - <<'EOF'
import setuptools, sys
print("setuptools", setuptools.__version__)
sys.exit(tuple(int(x) for x in setuptools.__version__.split(".")[:2]) < (64, 0))
EOF
  then
    echo "missing: setuptools>=64 (kc is installed with --no-build-isolation, built by the Python's own setuptools)"
    return 1
  fi
  local missing
  missing=$(missing_modules)
  if [[ -n "$missing" && -d "$WHEELHOUSE" ]]; then
    echo "installing from $WHEELHOUSE (--no-index): $(ls "$WHEELHOUSE" | tr '\n' ' ')"
    "$PYTHON" -m pip install --disable-pip-version-check --no-index --find-links "$WHEELHOUSE" \
      $(echo "$missing" | cut -d' ' -f1) || return 1
    missing=$(missing_modules)
  fi
  if [[ -n "$missing" ]]; then
    echo "missing, and no network to install them from:"
    echo "$missing" | sed 's/^/  /'
    echo "carry them in: with a network, 'bash plugins/cuda/gpu_check.sh wheels' fills build/gpu-wheels;" \
         "bring that folder along (or set KC_WHEELHOUSE)"
    return 1
  fi
  echo "every module the run imports is there"
  "$PYTHON" -c "import torch; print('torch', torch.__version__, 'for CUDA', torch.version.cuda)" 2>/dev/null \
    || echo "torch is not importable: the benchmark leaves out the torch.matmul comparison"
}
install_kc() {
  # a distribution named `kc` (kc-core's name before 0.1's rename, or another project's) provides the same import
  # package and would register its own EMU entry point: it goes before kc-core is installed
  if "$PYTHON" -m pip show -q kc >/dev/null 2>&1; then
    echo "removing the installed distribution kc: kc-core provides the kc package"
    "$PYTHON" -m pip uninstall -y -q --disable-pip-version-check kc
  fi
  "$PYTHON" -m pip install --disable-pip-version-check --no-deps --no-build-isolation --no-index \
    -e . -e plugins/cuda -e plugins/opencl -e conformance -e integrations/torch
}
kc_cli() { "$PYTHON" -c 'import sys; from kc.tools.cli import main; sys.exit(main(sys.argv[1:]))' "$@"; }
show_nvrtc() {  # needs no GPU: NVRTC and the headers it compiles with, and one kernel through both
  "$PYTHON" - <<'EOF'
from kc_cuda.compiler import NVRTCCompiler, bindings_major, cuda_headers, nvrtc_version
h = cuda_headers()
print(f"cuda-bindings for CUDA {bindings_major()}, NVRTC {nvrtc_version()}, "
      f"CUDA {h.version_text} headers in {h.path} (found by {h.found_via})")
src = ('#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n'
       'extern "C" __global__ void k(half* a, nv_bfloat16* b) { a[0] = a[1]; b[0] = b[1]; }\n')
cubin = NVRTCCompiler("sm_90").compile_uncached(src)
print(f"a half and bfloat16 kernel compiles to {len(cubin)} bytes of cubin for sm_90")
EOF
}
show_gpu() {
  if command -v nvidia-smi > /dev/null; then nvidia-smi -L; else echo "nvidia-smi is not on PATH"; fi
  kc_cli devices
}
cuda_available() {
  "$PYTHON" - <<'EOF'
import sys, kc_cuda.driver as d
reason = d.unavailable_reason()
print(reason or f"CUDA is available: {d.device_props(d.selected_ordinal())}")
sys.exit(reason is not None)
EOF
}
plugin_tests() {
  # kc-torch's CUDA tests (torch.compile(backend="kc") on CUDA tensors, on torch's stream) run with the plugin's
  "$PYTHON" -m pytest -q -p no:cacheprovider -rs -n 4 plugins/cuda/tests integrations/torch/tests/test_torch_cuda.py \
    --junitxml="$OUT/cuda_plugin_tests.xml"
}
conformance() {
  kc_cli conformance --device CUDA -n "${KC_GPU_WORKERS:-8}" --specs "${KC_GPU_SPECS:-none,hand,random,tc}" \
    --report "$OUT/cuda_conformance.json" --report "$OUT/cuda_conformance.html" --junitxml "$OUT/cuda_conformance.xml"
}
bench() {
  local rc=0
  "$PYTHON" benchmarks/bench_cuda.py --json "$OUT/bench_cuda.json" || rc=$?
  # the call path on the GPU (RESULTS.md's section bench_call_cuda): numpy arrays, kc.Buffers, device addresses
  "$PYTHON" benchmarks/bench_call.py --devices CUDA --repeats 9 || rc=$?
  cp benchmarks/RESULTS.md "$OUT/RESULTS.md"
  return $rc
}
opencl_on_gpu() {  # kc's OPENCL device on the same GPU through NVIDIA's OpenCL driver: every conformance tier, the call path
  if ! "$PYTHON" -c "import pyopencl" 2>/dev/null; then
    "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --find-links "$WHEELHOUSE" pyopencl \
      || { echo "pyopencl is neither installed nor carried (bash plugins/cuda/gpu_check.sh wheels): no OpenCL check"; return 1; }
  fi
  # the driver ships libnvidia-opencl.so.1 with CUDA's; a container image often lacks the ICD file that names it
  if [[ -z "${OCL_ICD_VENDORS:-}" && ! -e /etc/OpenCL/vendors/nvidia.icd ]]; then
    mkdir -p "$OUT/icd" && echo libnvidia-opencl.so.1 > "$OUT/icd/nvidia.icd"
    cp /etc/OpenCL/vendors/*.icd "$OUT/icd/" 2>/dev/null
    export OCL_ICD_VENDORS="$OUT/icd"
    echo "NVIDIA's OpenCL registered for this run in $OUT/icd"
  fi
  local platform
  platform=$("$PYTHON" -c "import pyopencl as cl; print(next(i for i, p in enumerate(cl.get_platforms()) if 'NVIDIA' in p.name))") \
    || { echo "no NVIDIA OpenCL platform: the driver's OpenCL library is missing"; return 1; }
  export KC_OPENCL_DEVICE="$platform:0"
  kc_cli conformance --device OPENCL -n "${KC_GPU_WORKERS:-8}" --specs "${KC_GPU_SPECS:-none,hand,random,tc}" \
    --report "$OUT/opencl_conformance.json" --junitxml "$OUT/opencl_conformance.xml" || return 1
  # RESULTS.md's section bench_call_opencl
  "$PYTHON" benchmarks/bench_call.py --devices OPENCL --repeats 9 && cp benchmarks/RESULTS.md "$OUT/RESULTS.md"
}
torch_bench() {  # RESULTS.md's section bench_torch_cuda: eager, inductor and kc on the GPU, both modes
  local rc=0 models=${KC_GPU_TORCH_MODELS:-all}
  [[ "$models" == all ]] && models=""
  "$PYTHON" benchmarks/bench_torch.py --device CUDA --repeats 10 --budget 3 ${models:+--models "$models"} || rc=$?
  cp benchmarks/RESULTS.md "$OUT/RESULTS.md"
  return $rc
}
export -f missing_modules preflight install_kc kc_cli show_nvrtc show_gpu cuda_available plugin_tests conformance bench \
  opencl_on_gpu torch_bench

# the caps: they add up to at most the default budget, each step's limit is also what is left of it
CAPS=(preflight:30 install:40 nvrtc:20 devices:20 cuda-available:20 plugin-tests:60 conformance:70 bench:60 opencl:60
      torch-bench:120)
cap() { local c; for c in "${CAPS[@]}"; do [[ ${c%%:*} == "$1" ]] && echo "${c#*:}"; done; }
total=0; for c in "${CAPS[@]}"; do total=$(( total + ${c#*:} )); done

echo "kc CUDA check: $(git rev-parse --short HEAD 2>/dev/null || echo 'no git') on $(uname -srm), budget ${BUDGET}s" \
     "(step caps add up to ${total}s), reports in $OUT"
step preflight "$(cap preflight)" preflight || finish 1
if [[ "${KC_GPU_SKIP_INSTALL:-0}" == 1 ]]; then echo "kc is installed in $PYTHON already (KC_GPU_SKIP_INSTALL=1)"
else step install "$(cap install)" install_kc || finish 1; fi
step nvrtc "$(cap nvrtc)" show_nvrtc
step devices "$(cap devices)" show_gpu
if ! step cuda-available "$(cap cuda-available)" cuda_available; then
  unset 'FAILED[${#FAILED[@]}-1]'
  echo "no GPU here: the plugin tests, the conformance run tier and the benchmark need one; stopping before them"
  finish 3
fi
step plugin-tests "$(cap plugin-tests)" plugin_tests
step conformance "$(cap conformance)" conformance
step bench "$(cap bench)" bench
step opencl "$(cap opencl)" opencl_on_gpu
step torch-bench "$(cap torch-bench)" torch_bench
finish 0
