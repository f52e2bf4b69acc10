# Sourced by the GPU scripts (gpu-check.sh, gpu-nn.sh, gpu-profile.sh, llama_gpu_run.sh): when the
# GPU machine's image lacks a build dependency, unpack the Debian packages carried in
# build-gpudeps/deps.tar.xz (gpu-check.sh --fetch-deps) into a private prefix (kept on a warm
# machine for the next call) and point CMake, pkg-config and the loader at it. Sets the array cmake_deps:
# extra configure arguments, empty when the system has everything; defines gpu_configure.
cmake_deps=()
gpu_env_have_deps() {
  [[ -f /usr/include/gtest/gtest.h && -f /usr/include/CLI/CLI.hpp &&
     -f /usr/include/benchmark/benchmark.h &&
     -f /usr/include/zip.h && -f /usr/include/nlohmann/json.hpp &&
     -f /usr/include/unicode/uchar.h && -f /usr/include/pcre2.h && -f /usr/include/zlib.h ]] &&
    command -v pkg-config >/dev/null && ldconfig -p | grep -q libopenblas
}
WICK_DEPS_PREFIX=/tmp/wick-deps
if ! gpu_env_have_deps; then
  if [[ -f build-gpudeps/deps.tar.xz && ! -d $WICK_DEPS_PREFIX/usr ]]; then
    mkdir -p $WICK_DEPS_PREFIX && tar xJf build-gpudeps/deps.tar.xz -C $WICK_DEPS_PREFIX
    echo "dependencies: unpacked the carried packages into $WICK_DEPS_PREFIX"
  elif [[ -d $WICK_DEPS_PREFIX/usr ]]; then
    echo "dependencies: using $WICK_DEPS_PREFIX, unpacked by an earlier call"
  else
    echo "dependencies: some are missing and build-gpudeps/ holds no packages (--fetch-deps)"
  fi
  if [[ -d $WICK_DEPS_PREFIX/usr ]]; then
    gpu_env_lib=$WICK_DEPS_PREFIX/usr/lib/x86_64-linux-gnu
    cmake_deps=(-DCMAKE_PREFIX_PATH=$WICK_DEPS_PREFIX/usr
                -DCMAKE_LIBRARY_PATH=$gpu_env_lib/openblas-pthread)
    # Appended, so that the system's own libraries still win.
    export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$gpu_env_lib/openblas-pthread:$gpu_env_lib
    # PCRE2 is found through pkg-config: the carried .pc files name /usr, so the prefix is their
    # root.
    command -v pkg-config >/dev/null || export PATH=$PATH:$WICK_DEPS_PREFIX/usr/bin
    export PKG_CONFIG_PATH=$gpu_env_lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$WICK_DEPS_PREFIX
  fi
fi

# gpu_configure BUILD LOG: configures BUILD (Release, CUDA for sm_90, the dependencies above),
# CMake's output in LOG; on failure prints its tail and returns 1.
gpu_configure() {
  cmake -S . -B "$1" -G Ninja -DWICK_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90 "${cmake_deps[@]}" >"$2" 2>&1 ||
    { tail -40 "$2"; echo "configure of $1 failed (log: $2)"; return 1; }
}
