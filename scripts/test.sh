#!/usr/bin/env bash
# The whole test suite: the normal build (the CUDA backend is compiled when nvcc is present; GPU
# tests skip without a GPU), one under AddressSanitizer + UndefinedBehaviorSanitizer, one under
# ThreadSanitizer for the concurrency test (both compiled by clang), then the file formats' Python
# round trip and fuzzing. Warnings are errors in the normal build here (WICK_WERROR), never in a
# user's build. The normal build's suite also
# runs the CPU kernels of each instruction set (WICK_CPU_ISA forced, and under
# `qemu-x86_64 -cpu Haswell` when qemu-user is installed), `wick-conform cpu`, the fuzz corpora's
# replay and the consumer test against the installed package. Every ctest run has a 600 s limit
# per test and fails when it finds no tests. Under CI=true a stage this machine should run but
# cannot (qemu-user missing; the AVX-512 kernels' tests on an AVX-512 host) fails the run instead
# of vanishing. The wall time of each stage is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${WICK_JOBS:-$(nproc)}
ctest_args=(--output-on-failure -j "$jobs" --timeout 600 --no-tests=error)

stages=()
report() {
  local rc=$?
  echo
  echo "== stage wall times (s)"
  local s
  for s in "${stages[@]}"; do echo "  $s"; done
  [[ $rc -eq 0 ]] || echo "  (stopped: exit $rc)"
}
trap report EXIT
# stage NAME COMMAND...: runs COMMAND, recording its wall time under NAME.
stage() {
  local name=$1 t0=$SECONDS
  shift
  echo "== $name"
  "$@"
  stages+=("$(printf '%-28s %5d' "$name" $((SECONDS - t0)))")
}

build() {
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DWICK_WERROR=ON
  cmake --build build -j "$jobs"
}
stage "build" build

# Under CI, the stages this host must run are registered: the Haswell runs under qemu-user, and on
# a CPU with AVX-512 the tests of the AVX-512 kernels.
if [[ "${CI:-}" == true ]]; then
  count() { ctest --test-dir build -N -R "$1" | sed -n 's/^Total Tests: //p'; }
  if [[ $(count '^haswell_') -eq 0 ]]; then
    echo "test.sh: CI=true but no qemu-user runs (qemu-x86_64 missing?)"
    exit 1
  fi
  if grep -q avx512f /proc/cpuinfo && grep -q avx512bw /proc/cpuinfo &&
    grep -q avx512dq /proc/cpuinfo && grep -q avx512vl /proc/cpuinfo &&
    [[ $(count '^isa_avx512_') -eq 0 ]]; then
    echo "test.sh: CI=true on an AVX-512 host but no AVX-512 kernel tests (WICK_AVX512_KERNELS?)"
    exit 1
  fi
fi
stage "tests" ctest --test-dir build "${ctest_args[@]}"

# The sanitized build checks the host code and builds only what the tests need: CUDA is off there
# (no GPU to run it on anyway), benchmarks and tools too, and the CPU kernels once (AVX2: the
# AVX-512 build of the same sources runs in the normal build's suite). Line tables only (-g1) are
# enough for the sanitizers' stack traces. clang compiles it (about twice as fast as g++ with the
# sanitizers), and the same build holds the libFuzzer targets (WICK_BUILD_FUZZ: the library is
# instrumented for coverage too), which the fuzz stage runs: the library is compiled once for both.
# Warnings are errors in the normal (g++) build.
sanitized_flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG")
asan_build() {
  CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja "${sanitized_flags[@]}" -DWICK_CUDA=OFF \
    -DWICK_SANITIZE=address,undefined -DWICK_BUILD_FUZZ=ON -DWICK_BUILD_BENCH=OFF \
    -DWICK_BUILD_TOOLS=OFF -DWICK_AVX512_KERNELS=OFF
  cmake --build build-asan -j "$jobs"
}
stage "asan build" asan_build
# The real-model tests (MiniLM, SmolLM2) run in the normal build; under ASan they would take
# minutes, so they are pointed at no model and skip.
stage "asan tests" env WICK_MINILM_DIR=/nonexistent WICK_REQUIRE_MINILM=0 \
  WICK_SMOLLM2_GGUF=/nonexistent WICK_REQUIRE_SMOLLM2=0 \
  ctest --test-dir build-asan "${ctest_args[@]}"

# ThreadSanitizer over the concurrency test only (lock order, writer-fair locks, shared graphs);
# CPU only. OpenBLAS's own threads are not instrumented: keep it single-threaded here.
tsan_build() {
  CC=clang CXX=clang++ cmake -S . -B build-tsan -G Ninja "${sanitized_flags[@]}" -DWICK_CUDA=OFF \
    -DWICK_SANITIZE=thread -DWICK_BUILD_BENCH=OFF -DWICK_BUILD_TOOLS=OFF -DWICK_AVX512_KERNELS=OFF
  cmake --build build-tsan -j "$jobs" --target test_concurrency
}
stage "tsan build" tsan_build
stage "tsan tests" env OPENBLAS_NUM_THREADS=1 \
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ./build-tsan/tests/test_concurrency

# The file formats: the round trip through Python's own readers and writers, then a bounded fuzz
# run of each parser (scripts/formats_ci.sh; WICK_FUZZ_SECONDS=0 skips the fuzzing).
stage "formats round trip" env WICK_FUZZ_SECONDS=0 bash scripts/formats_ci.sh
if [[ "${WICK_FUZZ_SECONDS:-60}" != 0 ]]; then
  stage "fuzz (build + run)" env WICK_FUZZ_BUILD=build-asan bash scripts/fuzz.sh
fi
