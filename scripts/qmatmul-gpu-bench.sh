#!/usr/bin/env bash
# Quantized decode on the GPU machine, in one command: random SmolLM2-shaped (Q4_1) and
# Llama-1B-shaped (Q4_0) GGUF files quantized by the `gguf` package (its wheel carried in .whl/
# when the image lacks it), the CUDA qmatmul tests, then decode tok/s of each kept quantized
# beside the same shape in bf16 (bench_generate, CUDA graph and op by op).
#
#   scripts/qmatmul-gpu-bench.sh        (after scripts/gpu-check.sh, or it builds through it)
#
# Environment: WICK_GPU_BUILD (default build-gpu), WICK_QGGUF_DIR (default /tmp/wick-qgguf).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${WICK_GPU_BUILD:-build-gpu}
DIR=${WICK_QGGUF_DIR:-/tmp/wick-qgguf}
mkdir -p "$DIR"
if [[ ! -f $BUILD/build.ninja && ! -f $BUILD/Makefile ]]; then
  WICK_GPU_SKIP="tests bench graphs torch wickmm sanitizer" scripts/gpu-check.sh >/dev/null 2>&1
fi
cmake --build "$BUILD" --target bench_generate cuda_test_cuda_qmatmul test_qmatmul || exit 1
if ! python3 -c "import gguf" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .whl/gguf-*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
echo "==== qmatmul tests"
WICK_REQUIRE_CUDA=1 "$BUILD/tests/cuda_test_cuda_qmatmul" 2>&1 | tail -15
"$BUILD/tests/test_qmatmul" 2>&1 | tail -3
echo "==== random GGUF files"
[[ -f $DIR/smollm2-q4_1.gguf ]] ||
  python3 scripts/make_random_gguf.py --shape smollm2 --type q4_1 -o "$DIR/smollm2-q4_1.gguf"
[[ -f $DIR/llama1b-q4_0.gguf ]] ||
  python3 scripts/make_random_gguf.py --shape llama1b --type q4_0 -o "$DIR/llama1b-q4_0.gguf"
echo "==== decode, batch 1 (prompt 32, 256 new tokens)"
for pair in "smollm2 smollm2-q4_1" "llama1b llama1b-q4_0"; do
  set -- $pair
  echo "---- $1: bf16 weights"
  "$BUILD/bench/bench_generate" --shape "$1" --device cuda --dtype bf16 --new 256 2>&1 | tail -4
  echo "---- $1: $2 kept quantized (bf16 activations)"
  "$BUILD/bench/bench_generate" --model "$DIR/$2.gguf" --keep-quantized --device cuda \
    --dtype bf16 --new 256 2>&1 | tail -4
done
