#!/usr/bin/env bash
# Where a decode step's time goes on the GPU machine, kernel by kernel as the CUDA graph runs them
# (programmatic launches overlapping): builds build-timeline with -DWICK_DEVICE_TIMELINE
# (src/cuda/device_timeline.cuh: every block of the decode GEMVs, the decode attention and the
# step's last kernel records its start, its pdl_wait and its end), runs bench_generate's decode
# (batch 1, CUDA graph) and prints scripts/timeline_summary.py's table: per kind of kernel the
# gap after the kernel before, the time after pdl_wait and what it adds to a step, then every
# launch of the last step. The records cost a few percent of the step (7% on Llama-1B bf16):
# compare variants with each other here, and speed with bench_generate in a normal build.
# Nsight Systems does not run on the GPU machine, and ncu runs each kernel alone.
#
#   scripts/gpu-timeline.sh [MODEL ...]      (default: llama1b; carry build-gpudeps/ and .whl/)
#   MODEL: a bench_generate shape (llama1b, smollm2, qwen05b; bf16 random weights), or
#   llama1b-q4_0 / smollm2-q4_1 (random GGUF files kept quantized, made as gpu-decode.sh makes them),
#   or qwen3-0.6b / gemma3-1b (bf16 random-weight folders made as bench/cuda/family_torch.py makes
#   them; the composed kernels of a step, which record nothing, show as gaps),
#   or engine-llama1b: the serving engine's single stream (bench_serve_engine, 1 stream, its paged
#   step; Llama-1B-shaped bf16 random weights made by bench/cuda/serve_torch.py), whose steps end at
#   its output head
#   WICK_TIMELINE_VARIANTS="default WICK_PDL=0"   settings to run, one run each (join two with a comma)
set -uo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
cd "$(dirname "$0")/.."
T0=$(date +%s)
source scripts/gpu-env.sh
B=build-timeline
cmake -S . -B $B -G Ninja -DWICK_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_CUDA_FLAGS=-DWICK_DEVICE_TIMELINE "${cmake_deps[@]}" >/tmp/timeline_cfg.txt 2>&1 ||
  { tail -20 /tmp/timeline_cfg.txt; exit 1; }
ninja -C $B bench_generate bench_serve_engine >/tmp/timeline_build.txt 2>&1 ||
  { grep -E "error|FAILED" /tmp/timeline_build.txt | head -30; exit 1; }
echo "built in $(($(date +%s) - T0)) s"
DIR=${WICK_QGGUF_DIR:-/tmp/wick-qgguf}
for model in "${@:-llama1b}"; do
  case $model in
    *-q4_0 | *-q4_1 | *-q8_0)
      if ! python3 -c "import gguf" 2>/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
          .whl/gguf-*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
      fi
      mkdir -p "$DIR"
      [[ -f $DIR/$model.gguf ]] || python3 scripts/make_random_gguf.py --shape "${model%%-*}" \
        --type "${model#*-}" -o "$DIR/$model.gguf" >/dev/null || exit 1
      source_args=(--model "$DIR/$model.gguf" --keep-quantized) ;;
    engine-llama1b)
      [[ -d /tmp/llama1b ]] || python3 -c "
import sys, torch
sys.path.insert(0, 'bench/cuda')
import serve_torch
serve_torch.make_model('llama-1b').to(torch.bfloat16).save_pretrained('/tmp/llama1b')" \
        >/dev/null 2>&1 || { echo "engine-llama1b: no model folder (torch, transformers)"; exit 1; }
      for variant in ${WICK_TIMELINE_VARIANTS:-default}; do
        run_env=(env WICK_DEVICE_TIMELINE_OUT=/tmp/timeline.txt)
        [[ $variant != default ]] && run_env+=(${variant//,/ })
        echo "==== $model $variant"
        "${run_env[@]}" timeout 120 $B/bench/bench_serve_engine --model /tmp/llama1b --device cuda \
          --dtype bf16 --streams 1 --new 256 2>&1 | grep -E "^ +1 "
        python3 scripts/timeline_summary.py /tmp/timeline.txt --steps 3 --detail --marks \
          --step-end "gemv store k=2048"
      done
      continue ;;
    qwen3-0.6b | gemma3-1b)
      [[ -d /tmp/$model ]] || python3 -c "
import sys, torch
sys.path.insert(0, 'bench/cuda')
import family_torch
family_torch.make_model('$model').to(torch.bfloat16).save_pretrained('/tmp/$model', safe_serialization=True)" \
        >/dev/null 2>&1 || { echo "$model: no model folder (torch, transformers)"; exit 1; }
      source_args=(--model "/tmp/$model") ;;
    *) source_args=(--shape "$model") ;;
  esac
  for variant in ${WICK_TIMELINE_VARIANTS:-default}; do
    run_env=(env WICK_DEVICE_TIMELINE_OUT=/tmp/timeline.txt)
    [[ $variant != default ]] && run_env+=(${variant//,/ })
    echo "==== $model $variant"
    "${run_env[@]}" timeout 120 $B/bench/bench_generate "${source_args[@]}" --device cuda \
      --dtype bf16 --new 256 --repeats 2 2>&1 |
      awk '/^RESULT wick_graph_decode_tps/ {print "graph decode " $3 " tok/s (timeline build)"}'
    python3 scripts/timeline_summary.py /tmp/timeline.txt --steps 3 --detail --marks
  done
done
