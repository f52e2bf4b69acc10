#!/usr/bin/env bash
# The portable build's CPU benchmarks beside a -march=native build's, same machine, same run:
# builds bench_elementwise and bench_matmul twice (build-bench-portable: the default flags;
# build-bench-native: WICK_NATIVE=ON), runs both programs of both builds in turn, ROUNDS times
# (alternating, so that a change in the machine's load hits both), and prints the best figure of
# each build and their ratio.
#
#   scripts/bench-portable.sh   (WICK_JOBS: build jobs; ROUNDS, default 3; BENCH_ARGS: more args)
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
rounds=${ROUNDS:-3}
for ((r = 1; r <= rounds; r++)); do
  for b in bench_elementwise bench_matmul; do
    for kind in portable native; do
      ./build-bench-$kind/bench/$b --benchmark_out="$out/$b-$kind-$r.json" \
        --benchmark_out_format=json ${BENCH_ARGS:-} > /dev/null
    done
  done
done

python3 - "$out" "$rounds" <<'PY'
import json, sys, os
out, rounds = sys.argv[1], int(sys.argv[2])
ctx = json.load(open(os.path.join(out, "bench_elementwise-portable-1.json")))["context"]
print(f"portable build: CPU kernels {ctx.get('wick_cpu_isa', '?')}; {ctx.get('num_cpus')} CPUs")
print(f"{'benchmark':44} {'portable':>12} {'native':>12} {'portable/native':>16}")
for b in ("bench_elementwise", "bench_matmul"):
    # The best round of each benchmark: the highest throughput, or the lowest time.
    def better(a, b):
        for key in ("bytes_per_second", "items_per_second"):
            if key in a:
                return a if a[key] >= b[key] else b
        return a if a["real_time"] <= b["real_time"] else b
    runs = {}
    for kind in ("portable", "native"):
        runs[kind] = {}
        for r in range(1, rounds + 1):
            with open(os.path.join(out, f"{b}-{kind}-{r}.json")) as f:
                for run in json.load(f)["benchmarks"]:
                    prev = runs[kind].get(run["name"])
                    runs[kind][run["name"]] = run if prev is None else better(run, prev)
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
