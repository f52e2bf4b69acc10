#!/usr/bin/env bash
# A/B of the decode and embedding speed on the GPU machine, in one call: builds this tree and an
# older one (its files in ab-old/: `git archive REV | tar -x -C ab-old`) side by side, then runs
# bench_generate (graph decode of the Llama-1B and SmolLM2 shapes, bf16 and kept quantized from
# random GGUF files) and bench_embed (a MiniLM-shaped model with seeded random bf16 weights)
# alternately, old then new, for WICK_AB_ROUNDS rounds, and prints a table of both.
# Carry ab-old/, build-gpudeps/ (gpu-check.sh --fetch-deps), .whl/ (the gguf wheel) and
# .ab/minilm/ (the MiniLM folder without model.safetensors).
#
#   scripts/gpu-ab.sh              build, then bench
#   WICK_AB_ROUNDS=3               rounds (default 2)
#   WICK_AB_TESTS="cuda_test_cuda_llama ..."  GPU tests of the new tree, run before the bench
set -uo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
cd "$(dirname "$0")/.."
ROOT=$PWD
T0=$(date +%s)
source scripts/gpu-env.sh
[[ -d ab-old/src ]] || { echo "gpu-ab: ab-old/ holds no tree"; exit 1; }
TARGETS="bench_generate bench_embed ${WICK_AB_TESTS:-}"
fail=0
build() {  # build DIR SRC
  (cd "$2" && gpu_configure "$1" /tmp/ab_cfg_$(basename "$2").txt &&
    ninja -C "$1" $3 >/tmp/ab_build_$(basename "$2").txt 2>&1) ||
    { grep -E "^FAILED|error" /tmp/ab_build_$(basename "$2").txt | head -20; return 1; }
}
build build-gpu "$ROOT" "$TARGETS" & new_pid=$!
build build-gpu "$ROOT/ab-old" "bench_generate bench_embed" & old_pid=$!
wait $new_pid || { echo "gpu-ab: the new tree did not build"; exit 1; }
wait $old_pid || { echo "gpu-ab: the old tree did not build"; exit 1; }
echo "built in $(($(date +%s) - T0)) s"
# The GPU tests first: a run cut short by its time limit still says whether they pass.
for t in ${WICK_AB_TESTS:-}; do
  WICK_REQUIRE_CUDA=1 timeout 120 build-gpu/tests/$t >/tmp/ab_$t.txt 2>&1
  echo "$t: rc=$? $(grep -E '^\[  PASSED|^\[  FAILED' /tmp/ab_$t.txt | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure" /tmp/ab_$t.txt | head -10
done

if ! python3 -c "import gguf" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .whl/gguf-*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
DIR=/tmp/wick-qgguf
mkdir -p $DIR
[[ -f $DIR/smollm2-q4_1.gguf ]] ||
  python3 scripts/make_random_gguf.py --shape smollm2 --type q4_1 -o $DIR/smollm2-q4_1.gguf >/dev/null
[[ -f $DIR/llama1b-q4_0.gguf ]] ||
  python3 scripts/make_random_gguf.py --shape llama1b --type q4_0 -o $DIR/llama1b-q4_0.gguf >/dev/null
# A MiniLM-shaped model: the real folder's config and tokenizer, seeded random weights.
M=/tmp/wick-minilm
if [[ ! -f $M/model.safetensors ]]; then
  mkdir -p $M && cp -r .ab/minilm/. $M/
  python3 - "$M" <<'PY'
import json, sys, torch
from safetensors.torch import save_file
d = sys.argv[1]
c = json.load(open(d + "/config.json"))
g = torch.Generator().manual_seed(7)
h, i, v, p = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["max_position_embeddings"]
def r(*s): return (torch.randn(*s, generator=g) * 0.05).contiguous()
t = {"embeddings.word_embeddings.weight": r(v, h), "embeddings.position_embeddings.weight": r(p, h),
     "embeddings.token_type_embeddings.weight": r(c["type_vocab_size"], h),
     "embeddings.LayerNorm.weight": torch.ones(h), "embeddings.LayerNorm.bias": torch.zeros(h)}
for l in range(c["num_hidden_layers"]):
    b = f"encoder.layer.{l}."
    for n in ["attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"]:
        t[b + n + ".weight"], t[b + n + ".bias"] = r(h, h), r(h)
    t[b + "intermediate.dense.weight"], t[b + "intermediate.dense.bias"] = r(i, h), r(i)
    t[b + "output.dense.weight"], t[b + "output.dense.bias"] = r(h, i), r(h)
    for n in ["attention.output.LayerNorm", "output.LayerNorm"]:
        t[b + n + ".weight"], t[b + n + ".bias"] = torch.ones(h), torch.zeros(h)
t["pooler.dense.weight"], t["pooler.dense.bias"] = r(h, h), r(h)
save_file(t, d + "/model.safetensors")
PY
  python3 - <<'PY' >$M/sentences.txt
import random
random.seed(3)
words = "the a man woman dog city river market fell rose quickly slowly under over house food".split()
for n in range(4096):
    print(" ".join(random.choice(words) for _ in range(random.randint(4, 60))))
PY
fi

ROUNDS=${WICK_AB_ROUNDS:-2}
declare -A R
run_case() {  # tree label command...
  local tree=$1 label=$2
  shift 2
  local v
  v=$("$@" 2>&1 | awk '/^RESULT wick_graph_decode_tps/ {print $3} /^WICK_SENTENCES_PER_S/ {print $2}')
  R[$label,$tree]="${R[$label,$tree]:-} ${v:-FAIL}"
}
for ((r = 0; r < ROUNDS; r++)); do
  for tree in old new; do
    B=$([[ $tree == old ]] && echo ab-old/build-gpu || echo build-gpu)
    run_case $tree "llama1b bf16" timeout 120 $B/bench/bench_generate --shape llama1b --device cuda --dtype bf16 --new 256
    run_case $tree "llama1b q4_0" timeout 120 $B/bench/bench_generate --model $DIR/llama1b-q4_0.gguf --keep-quantized --device cuda --dtype bf16 --new 256
    run_case $tree "smollm2 bf16" timeout 120 $B/bench/bench_generate --shape smollm2 --device cuda --dtype bf16 --new 256
    run_case $tree "smollm2 q4_1" timeout 120 $B/bench/bench_generate --model $DIR/smollm2-q4_1.gguf --keep-quantized --device cuda --dtype bf16 --new 256
    run_case $tree "minilm bf16 sent/s" timeout 120 $B/bench/bench_embed $M $M/sentences.txt --device cuda --dtype bf16 --runs 5
  done
done
echo "==== A/B ($(nvidia-smi --query-gpu=name --format=csv,noheader), $ROUNDS rounds, old then new each round)"
printf '%-20s %-28s %-28s %s\n' case old new "new/old (medians)"
for label in "llama1b bf16" "llama1b q4_0" "smollm2 bf16" "smollm2 q4_1" "minilm bf16 sent/s"; do
  o=${R[$label,old]} n=${R[$label,new]}
  ratio=$(python3 -c "import statistics as s,sys
o=[float(x) for x in '$o'.split() if x!='FAIL']; n=[float(x) for x in '$n'.split() if x!='FAIL']
print(f'{s.median(n)/s.median(o):.4f}' if o and n else 'n/a')")
  printf '%-20s %-28s %-28s %s\n' "$label" "$o" "$n" "$ratio"
done
echo "gpu-ab: $(($(date +%s) - T0)) s"
