#!/usr/bin/env bash
# The whole test suite: the normal build (the CUDA backend is compiled when nvcc is present; GPU
# tests skip without a GPU), one under AddressSanitizer + UndefinedBehaviorSanitizer, one under
# ThreadSanitizer for the concurrency test, then the file formats' Python round trip and fuzzing.
# Warnings are errors here (WICK_WERROR), never in a user's build. The normal build's suite also
# runs the CPU kernels of each instruction set (WICK_CPU_ISA forced, and under
# `qemu-x86_64 -cpu Haswell` when qemu-user is installed) and the consumer test against the
# installed package.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${WICK_JOBS:-$(nproc)}

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DWICK_WERROR=ON
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

# The sanitized build checks the host code and builds only what the tests need: CUDA is off there
# (no GPU to run it on anyway), benchmarks and tools too, and the CPU kernels once (AVX2: the
# AVX-512 build of the same sources runs in the normal build's suite). Line tables only (-g1) are
# enough for the sanitizers' stack traces: on a 2-core EPYC the build took 512 s so, 764 s with -g.
sanitized_flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG")
cmake -S . -B build-asan -G Ninja "${sanitized_flags[@]}" -DWICK_WERROR=ON \
  -DWICK_CUDA=OFF -DWICK_SANITIZE=address,undefined -DWICK_BUILD_BENCH=OFF -DWICK_BUILD_TOOLS=OFF \
  -DWICK_AVX512_KERNELS=OFF
cmake --build build-asan -j "$jobs"
# The real-model tests (MiniLM) run in the normal build; under ASan they would take minutes, so
# they are pointed at a folder without the model and skip.
WICK_MINILM_DIR=/dev/null ctest --test-dir build-asan --output-on-failure -j "$jobs"

# ThreadSanitizer over the concurrency test only (lock order, writer-fair locks, shared graphs);
# CPU only. OpenBLAS's own threads are not instrumented: keep it single-threaded here.
cmake -S . -B build-tsan -G Ninja "${sanitized_flags[@]}" -DWICK_CUDA=OFF \
  -DWICK_SANITIZE=thread -DWICK_BUILD_BENCH=OFF -DWICK_BUILD_TOOLS=OFF
cmake --build build-tsan -j "$jobs" --target test_concurrency
OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
  ./build-tsan/tests/test_concurrency

# The file formats: the round trip through Python's own readers and writers, then a bounded fuzz
# run of each parser (scripts/formats_ci.sh; WICK_FUZZ_SECONDS=0 skips the fuzzing).
bash scripts/formats_ci.sh
