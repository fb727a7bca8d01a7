#!/usr/bin/env bash
# The CUDA device's check on a machine with an NVIDIA GPU and driver: install kc, kc-cuda and the conformance suite
# into a virtual environment, show what kc sees, run kc-cuda's own tests (its GPU tests included), the conformance
# suite on CUDA (all tiers) and the CUDA benchmark. Everything lands in $OUT (default ./gpu_check_out).
#
# Run from the repository root:  bash plugins/cuda/gpu_check.sh
# Every step is bounded by `timeout` and the whole run by KC_GPU_CHECK_BUDGET seconds (default 450, under 8 minutes
# with the install); a failing step does not stop the next, and the script exits 1 at the end if any step failed.
#
# Settings (environment):
#   OUT                  where reports go (default ./gpu_check_out)
#   PYTHON               the interpreter that makes the virtual environment (default python3)
#   KC_GPU_VENV          the virtual environment (default .venv-gpu-check; reused when it exists). It sees the system's
#                        site-packages, so a torch (or cuda-bindings) the machine already has is used as it is
#   KC_GPU_TORCH=1       pip install torch too (a large download; without it torch is used only if already present)
#   KC_PIP_OFFLINE=1     install without an index (--no-index --no-build-isolation), from KC_WHEELHOUSE if set
#   KC_GPU_SKIP_INSTALL=1  use KC_GPU_VENV as it is (kc, kc-cuda and kc-conformance already installed in it)
#   KC_GPU_CHECK_BUDGET  seconds for all steps together (default 450)
set -u
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-./gpu_check_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PYTHON=${PYTHON:-python3}
VENV=${KC_GPU_VENV:-.venv-gpu-check}
BUDGET=${KC_GPU_CHECK_BUDGET:-450}
DEADLINE=$(( $(date +%s) + BUDGET ))
# a fresh compile cache: a stale entry from another kc must not decide what runs
export KC_CACHE_DIR=${KC_CACHE_DIR:-$(mktemp -d)}
exec > >(tee "$OUT/gpu_check.log") 2>&1

FAILED=()
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"

# step NAME CAP_SECONDS COMMAND...: run COMMAND for at most CAP seconds and what is left of the budget
step() {
  local name=$1 cap=$2; shift 2
  local left=$(( DEADLINE - $(date +%s) ))
  local limit=$(( cap < left ? cap : left ))
  echo
  echo "=== $name (at most ${limit}s) ==="
  if (( limit < 10 )); then
    echo "skipped: the time budget of ${BUDGET}s is spent"
    FAILED+=("$name")
    echo "$name: skipped (no time left)" >> "$SUMMARY"
    return
  fi
  local start=$(date +%s)
  # a fresh bash runs the step: timeout runs programs, and the step functions are exported to it
  timeout --kill-after=10 "$limit" bash -c '"$@"' step "$@"
  local rc=$?
  local took=$(( $(date +%s) - start ))
  if (( rc == 124 || rc == 137 )); then echo "--- $name timed out after ${limit}s"; fi
  if (( rc != 0 )); then FAILED+=("$name"); fi
  echo "$name: rc=$rc in ${took}s" | tee -a "$SUMMARY"
}

PIP_FLAGS="--disable-pip-version-check --progress-bar off"
if [[ "${KC_PIP_OFFLINE:-0}" == 1 ]]; then
  PIP_FLAGS+=" --no-index --no-build-isolation"
  [[ -n "${KC_WHEELHOUSE:-}" ]] && PIP_FLAGS+=" --find-links $KC_WHEELHOUSE"
fi
export OUT VENV PYTHON PIP_FLAGS

make_venv() { [[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv --system-site-packages "$VENV"; }
install_kc() {
  "$VENV/bin/python" -m pip install $PIP_FLAGS -e '.[test]' -e plugins/cuda -e 'conformance[parallel]'
}
install_torch() { "$VENV/bin/python" -m pip install $PIP_FLAGS torch; }
show_gpu() {
  if command -v nvidia-smi > /dev/null; then nvidia-smi -L; else echo "nvidia-smi is not on PATH"; fi
  "$VENV/bin/kc" devices
  "$VENV/bin/python" -c "import kc_cuda.driver as d; r = d.unavailable_reason(); print('CUDA:', r or d.device_props(d.selected_ordinal()))"
  "$VENV/bin/python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>/dev/null \
    || echo "torch: not installed (KC_GPU_TORCH=1 installs it)"
}
cuda_available() { "$VENV/bin/python" -c "import sys, kc_cuda.driver as d; r = d.unavailable_reason(); print(r or 'CUDA is available'); sys.exit(r is not None)"; }
plugin_tests() {
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider -rs plugins/cuda/tests --junitxml="$OUT/cuda_plugin_tests.xml"
}
conformance() {
  "$VENV/bin/kc" conformance --device CUDA -n 4 --report "$OUT/cuda_conformance.json" --junitxml "$OUT/cuda_conformance.xml"
}
bench() {
  "$VENV/bin/python" benchmarks/bench_cuda.py --json "$OUT/bench_cuda.json" && cp benchmarks/RESULTS.md "$OUT/RESULTS.md"
}

export -f make_venv install_kc install_torch show_gpu cuda_available plugin_tests conformance bench

echo "kc CUDA check: $(git rev-parse --short HEAD 2>/dev/null || echo 'no git') on $(uname -srm), budget ${BUDGET}s, reports in $OUT"
if [[ "${KC_GPU_SKIP_INSTALL:-0}" == 1 ]]; then echo "using $VENV as it is (KC_GPU_SKIP_INSTALL=1)"; else
  step venv 60 make_venv
  step install 180 install_kc
fi
if [[ "${KC_GPU_TORCH:-0}" == 1 ]]; then step install-torch 180 install_torch; fi
step devices 60 show_gpu
step cuda-available 30 cuda_available
step plugin-tests 120 plugin_tests
step conformance 240 conformance
step bench 150 bench

echo
echo "=== summary ==="
cat "$SUMMARY"
if (( ${#FAILED[@]} )); then
  echo "failed: ${FAILED[*]}"
  exit 1
fi
echo "all steps passed"
