#!/usr/bin/env bash
# The CPU benchmarks beside their peers on the GPU machine's host processor (the device tool's
# machines run on an Intel Xeon, family 6 model 207 when last seen), pinned to two CPUs of
# distinct cores as on a 2-core VM: sgemm (bench/sgemm_peer.py), SmolLM2-135M-shaped Q4_1 decode
# beside llama.cpp (scripts/bench_llamacpp.py) and MiniLM-shaped embeddings (bench/embed_peer.py),
# as the call's time allows. The machine's image has numpy, torch (MKL), sentence-transformers and
# ONNX Runtime but no llama-cpp-python or gguf, and no registry: pack them here first.
#
#   scripts/cpu-peers-device.sh --pack SITE_PACKAGES   here: copy llama_cpp, diskcache and gguf
#       from a Python's site-packages (pip install llama-cpp-python gguf) and MiniLM's config
#       and tokenizer ($WICK_MINILM_DIR, no weights) into out/cpu-peers (about 20 MB)
#   scripts/cpu-peers-device.sh                        there (device tool, carry build-gpudeps and
#                                                      out/cpu-peers): build, then run
#
# Environment (there): STAGES (default "sgemm smollm2 embed"), WICK_CALL_LIMIT (seconds, default
# 560), SGEMM_ROUNDS, LLAMA_ROUNDS, EMBED_ROUNDS, WICK_CPU_BUILD (default build-cpu). The models
# are random-weight ones in the real shapes (the speed of a shape does not depend on its values):
# SmolLM2 by scripts/make_random_gguf.py, MiniLM initialised by transformers. Figures go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PACK=out/cpu-peers

if [[ "${1:-}" == "--pack" ]]; then
  site=${2:?usage: --pack SITE_PACKAGES}
  minilm=${WICK_MINILM_DIR:?set WICK_MINILM_DIR to the MiniLM folder}
  rm -rf "$PACK" && mkdir -p "$PACK/py" "$PACK/minilm" || exit 1
  for p in llama_cpp diskcache gguf; do
    cp -r "$site/$p" "$PACK/py/" || exit 1
  done
  find "$PACK/py" -name __pycache__ -prune -exec rm -rf {} +
  # The libraries' fully versioned copies: the loader needs only libX.so and libX.so.0.
  rm -f "$PACK"/py/llama_cpp/lib/*.so.*.*
  (cd "$minilm" && tar cf - --exclude=model.safetensors .) | tar xf - -C "$PACK/minilm" || exit 1
  du -sh "$PACK"
  exit 0
fi

T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
left() { echo $((${WICK_CALL_LIMIT:-560} - $(el))); }
OUT=${OUT:-$PWD/$PACK/results}
mkdir -p "$OUT"
lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|L2|L3|Vendor|family|Model:"
echo "flags: $(grep -m1 -o -w -E 'avx2|avx512f|avx512_bf16|avx512_vnni|amx_tile|amx_bf16' /proc/cpuinfo | tr '\n' ' ')"
# Two CPUs of distinct cores of one socket.
lscpu -p=CPU,CORE,SOCKET | grep -v '^#' >/tmp/cpus
read -r A CA SA < <(head -1 /tmp/cpus | tr ',' ' ')
B=$(awk -F, -v c="$CA" -v s="$SA" '$2 != c && $3 == s {print $1; exit}' /tmp/cpus)
PIN="taskset -c $A${B:+,$B}"
echo "pinned: $PIN"
export PYTHONPATH=$PWD/$PACK/py OMP_WAIT_POLICY=PASSIVE PYTHONUNBUFFERED=1
python3 -c "import numpy, torch, sys; print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'torch', torch.__version__)"
source scripts/gpu-env.sh
BUILD=${WICK_CPU_BUILD:-build-cpu}
if [[ ! -f $BUILD/build.ninja ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DWICK_CUDA=OFF -DCMAKE_BUILD_TYPE=Release -DWICK_BUILD_TESTS=OFF \
    "${cmake_deps[@]}" >"$OUT/configure.txt" 2>&1 || { tail "$OUT/configure.txt"; exit 1; }
fi
# Always: on a warm machine the sources may have changed since the last call's build.
ninja -C "$BUILD" wick-mm bench_generate bench_embed >"$OUT/build.txt" 2>&1 ||
  { grep -E "error|FAILED" "$OUT/build.txt" | head; exit 1; }
echo "== built at $(el) s"
WICK_TRACE=1 "$BUILD/tools/wick-mm" time cpu --size 64 --runs 2 2>&1 | grep -i -E "gemm" | head -3
FAILED=0
for stage in ${STAGES:-sgemm smollm2 embed}; do
  l=$(left)
  echo "== $stage at $(el) s ($l s left)"
  case $stage in
    sgemm)
      ((l < 150)) && { echo "skipped: too little time"; continue; }
      # One thread pinned to one CPU (a peer cannot borrow the second), two threads to both.
      for t in 1 2; do
        pin=$PIN
        ((t == 1)) && pin="taskset -c $A"
        $pin timeout "$(left)" python3 bench/sgemm_peer.py --wick-mm "$BUILD/tools/wick-mm" \
          --threads $t --rounds "${SGEMM_ROUNDS:-1}" 2>&1 | tee "$OUT/sgemm-$t.txt" | tail -7 ||
          FAILED=1
      done ;;
    smollm2)
      ((l < 120)) && { echo "skipped: too little time"; continue; }
      [[ -f /tmp/smollm2-q4_1.gguf ]] || python3 scripts/make_random_gguf.py --shape smollm2 \
        --type q4_1 -o /tmp/smollm2-q4_1.gguf >/dev/null
      $PIN timeout "$(left)" python3 scripts/bench_llamacpp.py --model /tmp/smollm2-q4_1.gguf \
        --bench "$BUILD/bench/bench_generate" --rounds "${LLAMA_ROUNDS:-3}" 2>&1 |
        tee "$OUT/smollm2.txt" | tail -10 || FAILED=1 ;;
    embed)
      ((l < 150)) && { echo "skipped: too little time"; continue; }
      if [[ ! -f /tmp/minilm-random/model.safetensors ]]; then
        rm -rf /tmp/minilm-random && cp -r "$PACK/minilm" /tmp/minilm-random
        python3 -c "
import torch, transformers
torch.manual_seed(0)
model = transformers.BertModel(transformers.BertConfig.from_pretrained('/tmp/minilm-random'))
model.save_pretrained('/tmp/minilm-random', safe_serialization=True)" 2>&1 | grep -v -i warn | tail -3
      fi
      $PIN timeout "$(left)" python3 bench/embed_peer.py /tmp/minilm-random --wick "$BUILD/bench/bench_embed" \
        --wick-dtypes f32,bf16 --rounds "${EMBED_ROUNDS:-1}" 2>&1 | tee "$OUT/embed.txt" |
        grep -v -i -E "warn|RESULT" | tail -10 || FAILED=1 ;;
    *) echo "unknown stage $stage"; FAILED=1 ;;
  esac
done
echo "== done at $(el) s"
exit $FAILED
