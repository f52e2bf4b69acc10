#!/usr/bin/env bash
# Builds the libFuzzer targets of the file parsers (clang, ASan + UBSan, CUDA off) and runs each
# for WICK_FUZZ_SECONDS (default 60), all at once, starting from the committed seed corpus
# (fuzz/corpus/<target>). Fails on any crash, leak, timeout or sanitizer report.
#
#   scripts/fuzz.sh [target ...]     default: fuzz_safetensors fuzz_npy fuzz_gguf
#
# Environment: WICK_FUZZ_BUILD (default build-fuzz), WICK_FUZZ_SECONDS, WICK_JOBS.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${WICK_FUZZ_BUILD:-build-fuzz}
seconds=${WICK_FUZZ_SECONDS:-60}
targets=("$@")
pids=()
[[ ${#targets[@]} -gt 0 ]] || targets=(fuzz_safetensors fuzz_npy fuzz_gguf)

CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DWICK_BUILD_FUZZ=ON -DWICK_CUDA=OFF -DWICK_SANITIZE=address,undefined -DWICK_AVX512_KERNELS=OFF \
  -DWICK_BUILD_TESTS=OFF -DWICK_BUILD_BENCH=OFF -DWICK_BUILD_TOOLS=OFF >/dev/null
cmake --build "$build" -j "${WICK_JOBS:-$(nproc)}" --target "${targets[@]}"

# The targets run side by side (one process each), so the wall time is one target's.
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t"
  mkdir -p "$corpus"
  cp -n fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null || true
  echo "== $t: ${seconds}s"
  # New inputs go to the build's copy of the corpus, crashes to $build/<target>-crash-*.
  "$build/fuzz/$t" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$build/$t-" "$corpus" >"$build/$t.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!targets[@]}"; do
  t=${targets[$i]}
  rc=0
  wait "${pids[$i]}" || rc=$?
  echo "== $t"
  grep -E "^stat::(number_of_executed_units|peak_rss_mb)|SUMMARY|ERROR|^Done" "$build/$t.log" || true
  if [[ $rc -ne 0 ]]; then
    tail -40 "$build/$t.log"
    echo "$t: FAILED (exit $rc; see $build/$t.log and $build/$t-crash-*)"
    status=1
  fi
done
exit $status
