#!/usr/bin/env bash
# Issue 15's GPU checks in one call on the GPU machine: build only the Llama targets, run
# cuda_test_cuda_llama with WICK_REQUIRE_CUDA=1, then scripts/llama_gpu_check.py (speed beside
# transformers, then f32 logits and bf16 greedy tokens against transformers). Each part runs even
# when an earlier one fails; a table of all of them is printed last. Carry build-gpudeps/ when the
# machine lacks the Debian dependencies (scripts/gpu-check.sh --fetch-deps).
#
#   scripts/llama_gpu_run.sh [extra args for llama_gpu_check.py, e.g. --skip accuracy]
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${WICK_GPU_BUILD:-build-gpu}
T0=$(date +%s)
source scripts/gpu-env.sh
declare -a TABLE
gpu_configure "$BUILD" /tmp/llama_cfg.txt || exit 1
if ninja -C "$BUILD" -k 0 cuda_test_cuda_llama cuda_test_cuda_half_rounding cuda_test_cuda_nn wick-generate \
  bench_generate >/tmp/llama_build.txt 2>&1; then
  TABLE+=("PASS  build ($(($(date +%s) - T0)) s)")
else
  grep -E "^FAILED|error" /tmp/llama_build.txt | head -30
  TABLE+=("FAIL  build: $(grep '^FAILED' /tmp/llama_build.txt | tr '\n' ' ' | cut -c1-200)")
fi
# f16/bf16 rounding points: CUDA against the CPU (tests/cuda/test_cuda_half_rounding.cpp), and
# the attention kernels' accuracy tests.
for t in cuda_test_cuda_half_rounding cuda_test_cuda_nn; do
  if [[ -x $BUILD/tests/$t ]]; then
    WICK_REQUIRE_CUDA=1 timeout 120 "$BUILD/tests/$t" >/tmp/llama_$t.txt 2>&1
    grep -E "^\[ +FAILED +\]|Failure|differ" /tmp/llama_$t.txt | head -20
    TABLE+=("$(grep -q '^\[  PASSED  \]' /tmp/llama_$t.txt && ! grep -q '^\[  FAILED  \]' /tmp/llama_$t.txt &&
      echo PASS || echo FAIL)  $t: $(grep -E '^\[ +(PASSED|FAILED) +\]' /tmp/llama_$t.txt | head -2 | tr '\n' ' ')")
  fi
done
if [[ -x $BUILD/tests/cuda_test_cuda_llama ]]; then
  WICK_REQUIRE_CUDA=1 timeout 180 "$BUILD/tests/cuda_test_cuda_llama" 2>&1 | tee /tmp/llama_test.txt |
    grep -E "^\[ +(OK|FAILED) +\]|Failure|error|exception|PASSED" | head -60
  TABLE+=("$(grep -q '^\[  PASSED  \]' /tmp/llama_test.txt && ! grep -q '^\[  FAILED  \]' /tmp/llama_test.txt &&
    echo PASS || echo FAIL)  cuda_test_cuda_llama: $(grep -E '^\[ +(PASSED|FAILED) +\]' /tmp/llama_test.txt | head -2 | tr '\n' ' ')")
fi
timeout 420 python3 scripts/llama_gpu_check.py --build "$BUILD" --budget 330 "$@" 2>&1 | tee /tmp/llama_check.txt
if grep -q '^==== Llama checks' /tmp/llama_check.txt; then
  TABLE+=("$(sed -n '/^==== Llama checks/,$p' /tmp/llama_check.txt)")
else  # stopped by the timeout: the rows printed so far
  TABLE+=("llama_gpu_check.py stopped; rows so far:" "$(grep -E '\(bar .*\) (PASS|FAIL)$' /tmp/llama_check.txt)")
fi
echo
echo "==== summary ($(($(date +%s) - T0)) s)"
printf '%s\n' "${TABLE[@]}"
