#!/usr/bin/env bash
# A/B of the CPU speed against an older tree (its files in ab-old/: `git archive REV | tar -x -C
# ab-old`), built side by side without CUDA, then run alternately (old, new) for WICK_AB_ROUNDS
# rounds: SmolLM2-135M Q4_1 prefill and decode tok/s (kept quantized, 128-token prompt, 128 new),
# MiniLM sentences/s (a mixed set of sentences, batch 128) and the small-op overhead (ns of an
# untracked element-wise op). Prints each round's figures and the medians' ratios.
#
#   scripts/cpu-ab.sh              build, then bench (WICK_SMOLLM2_GGUF, WICK_MINILM_DIR as in CI)
#   WICK_AB_ROUNDS=5               rounds (default 5)
#   WICK_NUM_THREADS               threads of both trees (default: all cores)
set -uo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
cd "$(dirname "$0")/.."
ROOT=$PWD
GGUF=${WICK_SMOLLM2_GGUF:-/var/cache/wick-models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
MINILM=${WICK_MINILM_DIR:-/var/cache/wick-models/all-minilm-l6-v2}
[[ -d ab-old/src ]] || { echo "cpu-ab: ab-old/ holds no tree"; exit 1; }
[[ -f $GGUF && -d $MINILM ]] || { echo "cpu-ab: needs $GGUF and $MINILM"; exit 1; }
TARGETS="bench_generate bench_embed bench_overhead"
build() {  # build SRC DIR
  (cd "$1" && cmake -S . -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DWICK_CUDA=OFF >/dev/null &&
    cmake --build "$2" --target $TARGETS >/tmp/cpu_ab_build_$(basename "$1").txt 2>&1) ||
    { tail -20 /tmp/cpu_ab_build_$(basename "$1").txt; return 1; }
}
build "$ROOT" build-cpu-ab || { echo "cpu-ab: the new tree did not build"; exit 1; }
build "$ROOT/ab-old" /work/ab-old-build || { echo "cpu-ab: the old tree did not build"; exit 1; }

SENT=/tmp/wick-cpu-ab-sentences.txt
python3 - >$SENT <<'PY'
import random
random.seed(3)
words = "the a man woman dog city river market fell rose quickly slowly under over house food".split()
for n in range(1024):
    print(" ".join(random.choice(words) for _ in range(random.randint(4, 120))))
PY
ROUNDS=${WICK_AB_ROUNDS:-5}
declare -A R
add() { R[$1,$2]="${R[$1,$2]:-} ${3:-FAIL}"; }
for ((r = 0; r < ROUNDS; r++)); do
  for tree in old new; do
    B=$([[ $tree == old ]] && echo /work/ab-old-build || echo build-cpu-ab)
    out=$($B/bench/bench_generate --model "$GGUF" --keep-quantized --prompt-len 128 --new 128 \
      --repeats 1 2>&1)
    line=$(grep '^wick (op by op)' <<<"$out")
    add "smollm2 q4_1 prefill tok/s" $tree "$(awk '{print $(NF-2)}' <<<"$line")"
    add "smollm2 q4_1 decode tok/s" $tree "$(awk '{print $(NF-1)}' <<<"$line")"
    add "minilm sentences/s" $tree "$($B/bench/bench_embed "$MINILM" $SENT --batch 128 --runs 1 2>&1 |
      awk '/^WICK_SENTENCES_PER_S/ {print $2}')"
    add "small op ns" $tree "$($B/bench/bench_overhead --benchmark_filter='BM_wick_untracked$' \
      --benchmark_min_time=0.2 2>/dev/null | awk '/^BM_wick_untracked / {print $2}')"
  done
  echo "round $((r + 1)) of $ROUNDS done"
done
echo "==== CPU A/B ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, \
${WICK_NUM_THREADS:-all} threads, $ROUNDS rounds, old then new each round)"
printf '%-28s %-40s %-40s %s\n' case old new "new/old (medians)"
for label in "smollm2 q4_1 prefill tok/s" "smollm2 q4_1 decode tok/s" "minilm sentences/s" "small op ns"; do
  o=${R[$label,old]} n=${R[$label,new]}
  ratio=$(python3 -c "import statistics as s
o=[float(x) for x in '$o'.split() if x!='FAIL']; n=[float(x) for x in '$n'.split() if x!='FAIL']
print(f'{s.median(n)/s.median(o):.4f}' if o and n else 'n/a')")
  printf '%-28s %-40s %-40s %s\n' "$label" "$o" "$n" "$ratio"
done
