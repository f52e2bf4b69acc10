#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan, CUDA off; only the targets and the library)
# and runs each for WICK_FUZZ_SECONDS (default 60), side by side, starting from the committed
# corpus (fuzz/corpus/<target>) and its crash reproducers (fuzz/crashes/<target>). Fails on any
# crash, leak, timeout or sanitizer report.
#
#   scripts/fuzz.sh [target ...]     default: every fuzz/fuzz_*.cpp
#
# Environment: WICK_FUZZ_BUILD (default build-fuzz; a build configured with WICK_BUILD_FUZZ=ON is
# used as configured), WICK_FUZZ_SECONDS, WICK_JOBS,
# WICK_FUZZ_SERIAL=1 (one target after another, for a long local run on a shared machine),
# WICK_FUZZ_MINIMISE=1 (after the run, merge the new inputs into a minimised fuzz/corpus/<target>:
# commit that, and copy any crash file into fuzz/crashes/<target>/ with its fix).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${WICK_FUZZ_BUILD:-build-fuzz}
seconds=${WICK_FUZZ_SECONDS:-60}
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  for f in fuzz/fuzz_*.cpp; do targets+=("$(basename "$f" .cpp)"); done
fi

# A build already configured for the fuzzers (scripts/test.sh's sanitized build) is used as it is.
if ! grep -q '^WICK_BUILD_FUZZ:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DWICK_BUILD_FUZZ=ON -DWICK_CUDA=OFF -DWICK_SANITIZE=address,undefined \
    -DWICK_AVX512_KERNELS=OFF -DWICK_BUILD_TESTS=OFF -DWICK_BUILD_BENCH=OFF \
    -DWICK_BUILD_TOOLS=OFF >/dev/null
fi
cmake --build "$build" -j "${WICK_JOBS:-$(nproc)}" --target "${targets[@]}"

start() {
  local t=$1 corpus="$build/corpus/$1"
  mkdir -p "$corpus"
  cp -n fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null || true
  echo "== $t: ${seconds}s"
  local seeds=()
  [[ -d fuzz/crashes/$t ]] && seeds+=("fuzz/crashes/$t")
  # New inputs go to the build's copy of the corpus, crashes to $build/<target>-crash-*.
  "$build/fuzz/$t" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$build/$t-" "$corpus" "${seeds[@]}" \
    >"$build/$t.log" 2>&1
}

status=0
finish() {
  local t=$1 rc=$2
  echo "== $t"
  grep -E "^stat::(number_of_executed_units|peak_rss_mb)|SUMMARY|ERROR|^Done" "$build/$t.log" || true
  if [[ $rc -ne 0 ]]; then
    tail -40 "$build/$t.log"
    echo "$t: FAILED (exit $rc; see $build/$t.log and $build/$t-crash-*)"
    status=1
  fi
  if [[ "${WICK_FUZZ_MINIMISE:-0}" == 1 ]]; then
    local merged="$build/corpus/$t.min"
    rm -rf "$merged" && mkdir -p "$merged"
    "$build/fuzz/$t" -merge=1 -rss_limit_mb=2048 -timeout=10 -max_len=65536 "$merged" \
      fuzz/corpus/"$t" "$build/corpus/$t" >"$build/$t.merge.log" 2>&1
    rm -rf fuzz/corpus/"$t" && mkdir -p fuzz/corpus/"$t" && cp "$merged"/* fuzz/corpus/"$t"/
    echo "$t: minimised corpus of $(ls fuzz/corpus/"$t" | wc -l) inputs in fuzz/corpus/$t"
  fi
}

if [[ "${WICK_FUZZ_SERIAL:-0}" == 1 ]]; then
  for t in "${targets[@]}"; do
    rc=0
    start "$t" || rc=$?
    finish "$t" $rc
  done
else
  # Side by side (one process each): the wall time is about one target's.
  pids=()
  for t in "${targets[@]}"; do
    start "$t" &
    pids+=($!)
  done
  for i in "${!targets[@]}"; do
    rc=0
    wait "${pids[$i]}" || rc=$?
    finish "${targets[$i]}" $rc
  done
fi
exit $status
