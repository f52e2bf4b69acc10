#!/usr/bin/env bash
# The nn kernels alone on the GPU machine, in one call (a quicker loop than gpu-check.sh): build
# cuda_test_cuda_nn and cuda_bench_nn_cuda for sm_90, run the tests (WICK_REQUIRE_CUDA=1), the
# benchmark with its variants, PyTorch's figures (bench/cuda/torch_nn.py) and SASS counts of the
# attention kernels. Logs under $OUT (the device tool) or build-gpu/logs.
#
#   scripts/gpu-nn.sh            (carry build-gpudeps when the machine lacks the dependencies)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${WICK_GPU_BUILD:-build-gpu}
LOGS=${OUT:-$BUILD/logs}
mkdir -p "$LOGS"
T0=$(date +%s)
source scripts/gpu-env.sh  # the image may lack some dependencies (libzip, ...)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DWICK_BUILD_TOOLS=OFF "${cmake_deps[@]}" >"$LOGS/configure.txt" 2>&1 ||
  { tail -30 "$LOGS/configure.txt"; exit 1; }
ninja -C "$BUILD" -j"$(nproc)" cuda_test_cuda_nn cuda_bench_nn_cuda >"$LOGS/build.txt" 2>&1 ||
  { grep -E "error|FAILED" "$LOGS/build.txt" | head -30; exit 1; }
echo "built in $(($(date +%s) - T0)) s"
WICK_REQUIRE_CUDA=1 timeout 60 stdbuf -oL "$BUILD"/tests/cuda_test_cuda_nn >"$LOGS/test.txt" 2>&1
echo "tests: exit $?"
grep -E "Failure|FAILED|PASSED|^[a-z].* d [0-9]+$|error" "$LOGS/test.txt" | head -30
B="$BUILD"/bench/cuda_bench_nn_cuda
timeout 120 "$B" 2>&1 | grep -v '^RESULT' | tee "$LOGS/bench.txt"
for v in 2 4 8; do WICK_ROW_VPT=$v timeout 30 "$B" rows | grep -E "% of copy" | sed "s/^/VPT $v: /"; done
for n in 2 4; do WICK_DECODE_BLOCKS_PER_SM=$n timeout 30 "$B" decode | grep "== decode" | sed "s/^/blocks per SM $n: /"; done
[[ -n "${WICK_NN_NO_TORCH:-}" ]] || PYTHONUNBUFFERED=1 timeout 120 python3 bench/cuda/torch_nn.py 2>&1 | grep -v '^RESULT' | tee "$LOGS/torch.txt"
obj=$(find "$BUILD" -name 'attention.cu.o' | head -1)
if command -v cuobjdump >/dev/null && [[ -n "$obj" ]]; then
  # Instruction counts of the attention kernels' SASS, to a file.
  cuobjdump -sass "$obj" | awk '/Function : /{name=$3} {for (i = 1; i <= NF; i++)
    if ($i ~ /^(HMMA|MUFU|LDSM|LDL|STL|BAR|LDGSTS|LDG|F2FP)/) { split($i, a, "."); c[name " " a[1]]++ } }
    END { for (k in c) print k, c[k] }' | sort >"$LOGS/attention_sass_counts.txt" 2>&1
fi
echo "gpu-nn took $(($(date +%s) - T0)) s"
