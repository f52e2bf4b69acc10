#!/usr/bin/env bash
# Where the GPU time goes, in one call on the GPU machine: per-kernel times from Nsight Compute
# (ncu, hardware timers, clocks left alone) of the Llama-1B-shaped bf16 decode step and of the
# MiniLM forward, beside the same programs' wall-clock figures with and without graph mode.
# ncu's raw CSVs (its .log files) land in $OUT (or build-gpu/logs); a per-kernel summary is
# printed. Under ncu every kernel runs alone with cold caches: small kernels read 3-5 µs there.
#
#   scripts/gpu-profile.sh [decode] [embed]     (default: both; embed needs WICK_MINILM_DIR)
#
# Carry build-gpudeps/ on a fresh machine; the MiniLM folder (models-cache/minilm-f16) on a
# second call while the machine is warm (both exceed one call's carry limit together).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${WICK_GPU_BUILD:-build-gpu}
LOGS=${OUT:-$BUILD/logs}
mkdir -p "$LOGS"
WHAT=" ${*:-decode embed} "
source scripts/gpu-env.sh
T0=$(date +%s)
gpu_configure "$BUILD" "$LOGS/configure.txt" || exit 1
ninja -C "$BUILD" -j"$(nproc)" bench_generate bench_embed >"$LOGS/build.txt" 2>&1 ||
  { grep -E "error|FAILED" "$LOGS/build.txt" | head -30; exit 1; }
echo "built in $(($(date +%s) - T0)) s"
NCU=(ncu --clock-control none --csv --page raw
     --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,dram__bytes_read.sum)
summary() {  # per kernel and grid: launches, median µs, DRAM bytes read and GB/s
  python3 scripts/ncu_summary.py "$1"
}

if [[ "$WHAT" == *" decode "* ]]; then
  echo "==== Llama-1B shape, bf16 decode: wall clock"
  G="$BUILD"/bench/bench_generate
  timeout 200 "$G" --shape llama1b --device cuda --dtype bf16 --prompt-len 32 --new 128 --repeats 3 2>&1 | tail -8
  WICK_DECODE_GEMV=0 timeout 200 "$G" --shape llama1b --device cuda --dtype bf16 --prompt-len 32 \
    --new 128 --repeats 3 2>&1 | tail -4 | sed 's/^/no fused gemv: /'
  echo "==== Llama-1B shape, bf16 decode: ncu over 3 tokens"
  timeout 300 "${NCU[@]}" --log-file "$LOGS/ncu_decode.log" "$G" --shape llama1b --device cuda \
    --dtype bf16 --prompt-len 4 --new 3 --repeats 1 >/dev/null 2>"$LOGS/ncu_decode.err"
  echo "ncu exit $?"; tail -n 3 "$LOGS/ncu_decode.err"
  summary "$LOGS/ncu_decode.log" | head -40
fi

if [[ "$WHAT" == *" embed "* && -n "${WICK_MINILM_DIR:-}" ]]; then
  python3 -c "
import sys; sys.path.insert(0, 'bench'); import embed_peer as e
s = e.make_sentences(10000)
open('/tmp/sent10k.txt', 'w').write('\n'.join(s) + '\n')
open('/tmp/sent1k.txt', 'w').write('\n'.join(s[:1000]) + '\n')"
  E="$BUILD"/bench/bench_embed
  echo "==== MiniLM, 10,000 sentences: wall clock"
  for dt in f32 bf16; do
    timeout 120 "$E" "$WICK_MINILM_DIR" /tmp/sent10k.txt --device cuda --dtype $dt --runs 3 | head -1
    WICK_CUDA_GRAPHS=0 timeout 120 "$E" "$WICK_MINILM_DIR" /tmp/sent10k.txt --device cuda --dtype $dt \
      --runs 3 | head -1 | sed 's/^/graphs off: /'
  done

  echo "==== MiniLM f32, 1,000 sentences: ncu"
  timeout 300 "${NCU[@]}" --log-file "$LOGS/ncu_embed.log" "$E" "$WICK_MINILM_DIR" /tmp/sent1k.txt \
    --device cuda --dtype f32 --batch 128 >/dev/null 2>"$LOGS/ncu_embed.err"
  echo "ncu exit $?"; tail -n 3 "$LOGS/ncu_embed.err"
  summary "$LOGS/ncu_embed.log" | head -40
  timeout 60 "$E" "$WICK_MINILM_DIR" /tmp/sent1k.txt --device cuda --dtype f32 --runs 3 | head -1 |
    sed 's/^/1,000 sentences without ncu: /'
fi
echo "gpu-profile took $(($(date +%s) - T0)) s"
