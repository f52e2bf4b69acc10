#!/usr/bin/env bash
# The portable build's CPU benchmarks beside a -march=native build's, same machine, same run:
# builds bench_elementwise and bench_matmul twice (build-bench-portable: the default flags;
# build-bench-native: WICK_NATIVE=ON), runs each benchmark of both, one after the other, and
# prints a table of both figures and their ratio.
#
#   scripts/bench-portable.sh            (WICK_JOBS: build jobs; BENCH_ARGS: extra benchmark args)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${WICK_JOBS:-$(nproc)}
common=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DWICK_CUDA=OFF -DWICK_BUILD_TESTS=OFF
        -DWICK_BUILD_TOOLS=OFF)
for kind in portable native; do
  native=OFF
  [[ $kind == native ]] && native=ON
  cmake -S . -B build-bench-$kind "${common[@]}" -DWICK_NATIVE=$native > /dev/null
  cmake --build build-bench-$kind -j "$jobs" --target bench_elementwise bench_matmul
done

out=$(mktemp -d)
for b in bench_elementwise bench_matmul; do
  for kind in portable native; do
    ./build-bench-$kind/bench/$b --benchmark_format=json --benchmark_out="$out/$b-$kind.json" \
      --benchmark_out_format=json ${BENCH_ARGS:-} > /dev/null
  done
done

python3 - "$out" <<'PY'
import json, sys, os
out = sys.argv[1]
ctx = json.load(open(os.path.join(out, "bench_elementwise-portable.json")))["context"]
print(f"portable build: CPU kernels {ctx.get('wick_cpu_isa', '?')}; {ctx.get('num_cpus')} CPUs")
print(f"{'benchmark':44} {'portable':>12} {'native':>12} {'portable/native':>16}")
for b in ("bench_elementwise", "bench_matmul"):
    runs = {}
    for kind in ("portable", "native"):
        with open(os.path.join(out, f"{b}-{kind}.json")) as f:
            runs[kind] = {r["name"]: r for r in json.load(f)["benchmarks"]}
    for name, p in runs["portable"].items():
        n = runs["native"].get(name)
        if n is None:
            continue
        # Throughput where the benchmark reports it (higher is better), else time (lower).
        if "bytes_per_second" in p:
            pv, nv, unit = p["bytes_per_second"] / 1e9, n["bytes_per_second"] / 1e9, "GB/s"
            ratio = pv / nv
        elif "items_per_second" in p:
            pv, nv, unit = p["items_per_second"] / 1e9, n["items_per_second"] / 1e9, "G/s"
            ratio = pv / nv
        else:
            pv, nv, unit = p["real_time"], n["real_time"], p["time_unit"]
            ratio = nv / pv
        print(f"{name:44} {pv:9.2f} {unit:4} {nv:7.2f} {unit:4} {ratio:14.3f}")
PY
rm -rf "$out"
