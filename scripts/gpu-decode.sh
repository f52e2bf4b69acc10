#!/usr/bin/env bash
# Decode speed on the GPU machine in one call: build the decode targets, run the CUDA tests of the
# decode step (Llama, qmatmul, nn), then bench_generate (batch 1, CUDA graph) for the Llama-1B and
# SmolLM2 shapes in bf16 and kept quantized (random GGUF files made by scripts/make_random_gguf.py:
# Llama-1B Q4_0, SmolLM2 Q4_1, Q8_0 embeddings), each with and without programmatic dependent
# launch (WICK_PDL=0). A table is printed last. Carry build-gpudeps/ and .whl/ (the gguf wheel)
# on a fresh machine.
#
#   scripts/gpu-decode.sh [--quick]      (--quick: no tests)
#   WICK_DECODE_VARIANTS="default WICK_PDL=0 WICK_GEMV_ROWS=8"   settings to bench, one run each
#                                        (default "default WICK_PDL=0"; join two with a comma)
#   WICK_DECODE_NCU=1                    also per-kernel times from ncu (Llama-1B bf16 and Q4_0)
#   WICK_DECODE_NEW=N                    new tokens per bench run (default 256)
set -uo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
cd "$(dirname "$0")/.."
BUILD=${WICK_GPU_BUILD:-build-gpu}
DIR=${WICK_QGGUF_DIR:-/tmp/wick-qgguf}
QUICK=${1:-}
T0=$(date +%s)
source scripts/gpu-env.sh
declare -a TABLE
gpu_configure "$BUILD" /tmp/decode_cfg.txt || exit 1
if ! ninja -C "$BUILD" cuda_test_cuda_llama cuda_test_cuda_qmatmul cuda_test_cuda_nn \
  bench_generate >/tmp/decode_build.txt 2>&1; then
  grep -E "^FAILED|error" /tmp/decode_build.txt | head -30
  exit 1
fi
echo "built in $(($(date +%s) - T0)) s"

if [[ $QUICK != --quick ]]; then
  for t in cuda_test_cuda_llama cuda_test_cuda_qmatmul cuda_test_cuda_nn; do
    for env in WICK_PDL=1 WICK_PDL=0 WICK_GEMV_ROWS=8; do
      [[ $t != cuda_test_cuda_llama && $env == WICK_GEMV* ]] && continue
      env ${env//,/ } WICK_REQUIRE_CUDA=1 timeout 180 "$BUILD/tests/$t" >/tmp/decode_$t.txt 2>&1
      rc=$?
      grep -E "^\[ +FAILED +\]|Failure" /tmp/decode_$t.txt | head -10
      TABLE+=("$([[ $rc == 0 ]] && echo PASS || echo FAIL)  $t $env: $(grep -E '^\[  PASSED' /tmp/decode_$t.txt)")
    done
  done
fi

if ! python3 -c "import gguf" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .whl/gguf-*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
mkdir -p "$DIR"
[[ -f $DIR/smollm2-q4_1.gguf ]] ||
  python3 scripts/make_random_gguf.py --shape smollm2 --type q4_1 -o "$DIR/smollm2-q4_1.gguf" >/dev/null
[[ -f $DIR/llama1b-q4_0.gguf ]] ||
  python3 scripts/make_random_gguf.py --shape llama1b --type q4_0 -o "$DIR/llama1b-q4_0.gguf" >/dev/null

G=$BUILD/bench/bench_generate
rate() {  # decode tok/s from bench_generate's RESULT lines: CUDA graph / op by op
  awk '/^RESULT wick_graph_decode_tps/ {g = $3} /^RESULT wick_decode_tps/ {o = $3}
       END {if (g != "") print "graph " g " / op by op " o " tok/s"}'
}
NEW=${WICK_DECODE_NEW:-256}
for variant in ${WICK_DECODE_VARIANTS:-default WICK_PDL=0}; do
  run_env=(env)
  [[ $variant != default ]] && run_env+=(${variant//,/ })
  for shape in llama1b smollm2; do
    r=$("${run_env[@]}" timeout 120 "$G" --shape $shape --device cuda --dtype bf16 --new "$NEW" 2>&1 |
      tee /tmp/decode_$shape.txt | rate)
    bar=$([[ $shape == llama1b ]] && echo 1300 || echo 2000)
    TABLE+=("$(printf '%-8s bf16        %-22s %s  (bar >= %s graph)' $shape "$variant" "${r:-FAILED}" $bar)")
  done
  for f in llama1b-q4_0 smollm2-q4_1; do
    r=$("${run_env[@]}" timeout 120 "$G" --model "$DIR/$f.gguf" --keep-quantized --device cuda \
      --dtype bf16 --new "$NEW" 2>&1 | tee /tmp/decode_$f.txt | rate)
    bar=$([[ $f == llama1b-q4_0 ]] && echo "(bar >= 2000 graph)" || echo "(printed beside bf16)")
    TABLE+=("$(printf '%-8s %-11s %-22s %s  %s' ${f%%-*} ${f#*-} "$variant" "${r:-FAILED}" "$bar")")
  done
done
tail -5 /tmp/decode_llama1b.txt
if [[ -n ${WICK_DECODE_NCU:-} ]]; then  # per-kernel times (kernels alone, cold caches)
  NCU=(ncu --clock-control none --csv --page raw
       --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,dram__bytes_read.sum)
  for m in "--shape llama1b" "--model $DIR/llama1b-q4_0.gguf --keep-quantized"; do
    echo "==== ncu: $m"
    timeout 300 "${NCU[@]}" --log-file /tmp/decode_ncu.log "$G" $m --device cuda --dtype bf16 \
      --prompt-len 4 --new 3 --repeats 1 >/dev/null 2>/tmp/decode_ncu.err || tail -3 /tmp/decode_ncu.err
    python3 scripts/ncu_summary.py /tmp/decode_ncu.log >/tmp/decode_ncu.txt
    head -25 /tmp/decode_ncu.txt
  done
fi
echo "==== gpu-decode summary ($(($(date +%s) - T0)) s)"
printf '%s\n' "${TABLE[@]}"
