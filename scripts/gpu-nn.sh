#!/usr/bin/env bash
# The nn kernels alone on the GPU machine, in one call (a quicker loop than gpu-check.sh): build
# cuda_test_cuda_nn, cuda_test_cuda_llama and cuda_bench_nn_cuda for sm_90, run the tests
# (WICK_REQUIRE_CUDA=1), the benchmark with its variants, PyTorch's figures
# (bench/cuda/torch_nn.py), a table of wick beside PyTorch, and SASS counts of the attention
# kernels. Logs under $OUT (the device tool) or build-gpu/logs.
#
#   scripts/gpu-nn.sh            (carry build-gpudeps when the machine lacks the dependencies)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${WICK_GPU_BUILD:-build-gpu}
LOGS=${OUT:-$BUILD/logs}
mkdir -p "$LOGS"
T0=$(date +%s)
source scripts/gpu-env.sh  # the image may lack some dependencies (libzip, ...)
gpu_configure "$BUILD" "$LOGS/configure.txt" || exit 1
ninja -C "$BUILD" -j"$(nproc)" cuda_test_cuda_nn cuda_test_cuda_llama cuda_bench_nn_cuda \
  >"$LOGS/build.txt" 2>&1 ||
  { grep -E "error|FAILED" "$LOGS/build.txt" | head -30; exit 1; }
echo "built in $(($(date +%s) - T0)) s"
WICK_REQUIRE_CUDA=1 timeout 120 stdbuf -oL "$BUILD"/tests/cuda_test_cuda_nn >"$LOGS/test.txt" 2>&1
echo "tests: exit $?"
grep -E "Failure|FAILED|PASSED|^[a-z].* d [0-9]+$|error" "$LOGS/test.txt" | head -30
# The callers of decode attention: Llama's graph-captured and op-by-op decode steps.
WICK_REQUIRE_CUDA=1 timeout 300 stdbuf -oL "$BUILD"/tests/cuda_test_cuda_llama >"$LOGS/test_llama.txt" 2>&1
echo "llama tests: exit $?"
grep -E "Failure|FAILED|PASSED|error" "$LOGS/test_llama.txt" | head -20
B="$BUILD"/bench/cuda_bench_nn_cuda
timeout 180 "$B" >"$LOGS/bench_raw.txt" 2>&1
echo "bench: exit $?"
grep -v '^RESULT' "$LOGS/bench_raw.txt" | tee "$LOGS/bench.txt"
# Variants: each row kernel for every op, forced decode splits.
{
  for k in block warp bulk; do WICK_ROW_KERNEL=$k timeout 60 "$B" rows | grep -F "(kernel)" | sed "s/^/$k row kernel: /"; done
  for n in 1 4; do WICK_ROW_WARPS=$n timeout 60 "$B" rows | grep -F "(kernel)" | sed "s/^/$n rows a block: /"; done
  for n in 8 32 64; do WICK_DECODE_SPLITS=$n timeout 60 "$B" decode | grep -E "^kernel, 8" | sed "s/^/decode splits $n: /"; done
} 2>&1 | tee "$LOGS/variants.txt"
if [[ -z "${WICK_NN_NO_TORCH:-}" ]]; then
  PYTHONUNBUFFERED=1 timeout 180 python3 bench/cuda/torch_nn.py >"$LOGS/torch_raw.txt" 2>&1
  echo "torch: exit $?"
  grep -v '^RESULT' "$LOGS/torch_raw.txt" | tee "$LOGS/torch.txt"
fi
# One table: wick beside PyTorch from this run.
touch "$LOGS/bench_raw.txt" "$LOGS/torch_raw.txt"
awk '
  $1 == "RESULT" && $2 ~ /^nn_/ { w[substr($2, 4)] = $3 }
  $1 == "RESULT" && $2 ~ /^torch_nn_/ { t[substr($2, 10)] = $3 }
  function row(label, key, unit, better,   a, b, r) {
    a = (key in w) ? w[key] : "-"; b = (key in t) ? t[key] : "-"; r = "-"
    if (a != "-" && b != "-" && a + 0 > 0 && b + 0 > 0) r = sprintf("%.2f", better == "low" ? b / a : a / b)
    printf "%-40s %12s %12s %8s\n", label " (" unit ")", a, b, r
  }
  END {
    printf "%-40s %12s %12s %8s\n", "figure", "wick", "pytorch", "wick/pt"
    row("D2D copy", "copy_gbs", "GB/s", "high")
    split("layer_norm rms_norm softmax", ops, " ")
    for (i = 1; i <= 3; i++) {
      row(ops[i] " op", ops[i] "_gbs", "GB/s", "high")
      row(ops[i] " kernel", ops[i] "_kernel_gbs", "GB/s", "high")
      if ((ops[i] "_kernel_vs_copy") in w) printf "%-40s %12.3f\n", ops[i] " kernel / copy (bar 0.85)", w[ops[i] "_kernel_vs_copy"]
    }
    split("1024 4096 16384", ss, " ")
    for (i = 1; i <= 3; i++) row("attention s=" ss[i], "attn_s" ss[i] "_ms", "ms", "low")
    row("decode kernel, 8 caches", "decode_us", "us", "low")
    row("decode kernel, 8 caches", "decode_gbs", "GB/s", "high")
    if ("decode_vs_copy" in w) printf "%-40s %12.3f %12.3f\n", "decode / copy (bar 0.70)", w["decode_vs_copy"], t["decode_vs_copy"]
    row("decode kernel, one cache", "decode_l2_us", "us", "low")
    row("decode, half masked (visible bytes)", "decode_masked_gbs", "GB/s", "high")
    row("decode through the op, one cache", "decode_op_us", "us", "low")
  }' "$LOGS/bench_raw.txt" "$LOGS/torch_raw.txt" | tee "$LOGS/table.txt"
obj=$(find "$BUILD" -name 'attention.cu.o' | head -1)
if command -v cuobjdump >/dev/null && [[ -n "$obj" ]]; then
  # Instruction counts of the attention kernels' SASS, to a file.
  cuobjdump -sass "$obj" | awk '/Function : /{name=$3} {for (i = 1; i <= NF; i++)
    if ($i ~ /^(HMMA|MUFU|LDSM|LDL|STL|BAR|LDGSTS|LDG|F2FP)/) { split($i, a, "."); c[name " " a[1]]++ } }
    END { for (k in c) print k, c[k] }' | sort >"$LOGS/attention_sass_counts.txt" 2>&1
fi
echo "gpu-nn took $(($(date +%s) - T0)) s"
