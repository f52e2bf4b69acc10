#!/usr/bin/env bash
# The GPU check, in one call on the GPU machine (see DEVELOPERS.md): configure and build with CUDA
# for sm_90, run the whole test suite with WICK_REQUIRE_CUDA=1 (a skipped GPU test fails), the GPU
# benchmark, the PyTorch comparison, the decode step's tok/s, the nn kernels (norms, prefill and
# decode attention) beside PyTorch, the serving engine beside transformers' continuous batching,
# the families' graph decode beside transformers' static-cache generate, compute-sanitizer
# memcheck over the CUDA tests and `wick-mm time cuda`; then a short table, printed last.
#
#   scripts/gpu-check.sh               run everything (logs under $OUT or build-gpu/logs)
#   scripts/gpu-check.sh --fetch-deps  here, with network: download the Debian packages of the
#                                      build's dependencies, packed into build-gpudeps/deps.tar.xz
#                                      (carry that folder; the GPU machine has no registry and may
#                                      lack them)
#
# Environment: WICK_GPU_BUILD (build dir, default build-gpu), WICK_GPU_JOBS (default: nproc),
# WICK_GPU_SKIP="tests bench graphs torch embed wickmm conform overhead decode nn serve families
# sanitizer"
# (stages to leave out), WICK_GPU_CTEST_ARGS (more ctest arguments, e.g. "-L cuda" for the GPU
# tests alone), WICK_GPU_BUDGET (seconds after which no further sanitizer run starts).
# With $OUT set (the device tool), the logs are packed into $OUT/gpu-check-logs.tgz. Exits 1 when
# any stage failed (a build error, a failed or skipped-under-require test, a tool's non-zero exit,
# a conformance breach, a memcheck error): the failed stages are listed last.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
DEPS_DIR=$ROOT/build-gpudeps

if [[ "${1:-}" == "--fetch-deps" ]]; then
  # The packages unpacked into one prefix, less the large static libraries (ICU's, OpenBLAS's)
  # and documentation, packed as deps.tar.xz: half the packages' size, within what the device
  # tool carries.
  debs=$(mktemp -d) && prefix=$(mktemp -d) && cd "$debs" || exit 1
  apt-get download libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev libgtest-dev \
    libgmock-dev libbenchmark-dev libbenchmark1debian libgfortran5 libquadmath0 libcli11-dev \
    libzip-dev libzip4 nlohmann-json3-dev libicu-dev libicu72 libpcre2-dev libpcre2-8-0 \
    libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 zlib1g-dev zlib1g pkgconf pkgconf-bin libpkgconf3 \
    pkg-config libcpp-httplib-dev libcpp-httplib0.11 || exit 1
  for f in *.deb; do dpkg -x "$f" "$prefix" || exit 1; done
  find "$prefix" \( -name 'libicu*.a' -o -name 'libopenblas*.a' \) -delete
  rm -rf "$prefix/usr/share/doc" "$prefix/usr/share/man"
  mkdir -p "$DEPS_DIR" && tar cJf "$DEPS_DIR/deps.tar.xz" -C "$prefix" usr || exit 1
  rm -rf "$debs" "$prefix"
  exit 0
fi

BUILD=${WICK_GPU_BUILD:-build-gpu}
JOBS=${WICK_GPU_JOBS:-$(nproc)}
LOGS=$ROOT/$BUILD/logs
SKIP=" ${WICK_GPU_SKIP:-} "
mkdir -p "$LOGS"
skip() { [[ "$SKIP" == *" $1 "* ]]; }
over_budget() { (($(date +%s) - T0 > ${WICK_GPU_BUDGET:-100000})); }
stage() { printf '\n==== %s (%s)\n' "$1" "$(date +%T)"; }
FAILED=()
# check NAME RC: records stage NAME as failed when RC is not 0.
check() { [[ "$2" == 0 ]] || FAILED+=("$1 (exit $2)"); }
T0=$(date +%s)

stage "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 |
  tee "$LOGS/gpu.txt"
nvcc --version | tail -1

# Dependencies the image may lack: the carried Debian packages, unpacked into a private prefix.
source scripts/gpu-env.sh

stage "configure + build"
gpu_configure "$BUILD" "$LOGS/configure.txt" || { echo "gpu-check: configure failed"; exit 1; }
# -k 0: a target that does not compile (work in progress elsewhere) leaves the others to check.
BUILD_SUMMARY="ok"
if ! ninja -C "$BUILD" -j"$JOBS" -k 0 >"$LOGS/build.txt" 2>&1; then
  grep -E "^FAILED|error:" "$LOGS/build.txt" | head -40
  FAILED+=("build")
  BUILD_SUMMARY="FAILED: $(grep -c '^FAILED' "$LOGS/build.txt") targets ($(grep '^FAILED' "$LOGS/build.txt" |
    sed 's/^FAILED: //' | tr '\n' ' ' | cut -c1-200))"
  [[ -x "$BUILD/src/libwick.a" || -f "$BUILD/src/libwick.a" ]] || { echo "gpu-check: no libwick"; exit 1; }
fi
echo "built in $(($(date +%s) - T0)) s: $BUILD_SUMMARY"

CTEST_SUMMARY="not run"
if ! skip tests; then
  stage "tests (WICK_REQUIRE_CUDA=1)"
  # shellcheck disable=SC2086 # WICK_GPU_CTEST_ARGS is a list of ctest arguments
  WICK_REQUIRE_CUDA=1 ctest --test-dir "$BUILD" -j8 --timeout 300 --no-tests=error \
    --output-on-failure ${WICK_GPU_CTEST_ARGS:-} >"$LOGS/ctest.txt" 2>&1
  check tests $?
  grep -E "tests passed|Failed|\*\*\*|Timeout|Not Run" "$LOGS/ctest.txt" | head -40
  CTEST_SUMMARY=$(grep -E "tests passed" "$LOGS/ctest.txt" | tail -1)
fi

if ! skip bench; then
  stage "GPU benchmark"
  timeout 300 "$BUILD"/bench/cuda_bench_cuda 2>&1 | tee "$LOGS/bench.txt"
  check bench "${PIPESTATUS[0]}"
  stage "model-file load benchmark (1 GB safetensors to the H200 vs cudaMemcpy)"
  timeout 300 "$BUILD"/bench/cuda_bench_load_cuda 2>&1 | tee -a "$LOGS/bench.txt"
  check bench_load "${PIPESTATUS[0]}"
fi

if ! skip graphs; then
  stage "graph-mode benchmark (with PyTorch eager)"
  timeout 120 "$BUILD"/bench/cuda_bench_graphs 2>&1 | tee "$LOGS/graphs.txt"
  check graphs "${PIPESTATUS[0]}"
  PYTHONUNBUFFERED=1 timeout 120 python3 bench/cuda/torch_graphs.py 2>&1 | tee -a "$LOGS/graphs.txt"
  check torch_graphs "${PIPESTATUS[0]}"
fi

if ! skip torch; then
  stage "PyTorch comparison"
  PYTHONUNBUFFERED=1 timeout 300 python3 bench/cuda/torch_compare.py 2>&1 | tee "$LOGS/torch.txt"
  check torch "${PIPESTATUS[0]}"
fi

# Sentence embeddings beside sentence-transformers, when an all-MiniLM-L6-v2 folder is given
# (WICK_MINILM_DIR; carry it as f16 safetensors: scripts/make_minilm_refs.py --export-f16).
if ! skip embed && [[ -n "${WICK_MINILM_DIR:-}" ]]; then
  stage "sentence embeddings: wick vs sentence-transformers (MiniLM-L6, 10,000 sentences, batch 128)"
  for dt in f32 bf16; do
    PYTHONUNBUFFERED=1 timeout 300 python3 bench/embed_peer.py "$WICK_MINILM_DIR" \
      --wick "$BUILD"/bench/bench_embed --device cuda --dtype $dt --runs 3 2>&1 |
      grep -v "^Loading" | tee -a "$LOGS/embed.txt"
    check "embed $dt" "${PIPESTATUS[0]}"
  done
fi

if ! skip wickmm; then
  stage "wick-mm time cuda (fresh process)"
  WICK_TRACE=1 timeout 60 "$BUILD"/tools/wick-mm time cuda 2>&1 | tee "$LOGS/wickmm.txt"
  check wickmm "${PIPESTATUS[0]}"
  timeout 60 "$BUILD"/tools/wick-mm time cuda 2>&1 | tee "$LOGS/wickmm2.txt"
  check wickmm "${PIPESTATUS[0]}"
fi

if ! skip conform; then
  stage "wick-conform cpu and cuda (every op against float64, docs/NUMERICS.md), --determinism cuda"
  for d in cpu cuda; do
    timeout 300 "$BUILD"/tools/wick-conform $d >"$LOGS/conform_$d.txt" 2>&1
    rc=$?
    echo "wick-conform $d: exit $rc ($(tail -1 "$LOGS/conform_$d.txt"))"
    check "conform $d" $rc
    grep BREACH "$LOGS/conform_$d.txt" | head -20
  done
  timeout 300 "$BUILD"/tools/wick-conform --determinism cuda >"$LOGS/conform_determinism.txt" 2>&1
  rc=$?
  echo "wick-conform --determinism cuda: exit $rc ($(tail -1 "$LOGS/conform_determinism.txt"))"
  check "conform --determinism cuda" $rc
fi

if ! skip overhead; then
  stage "small-op overhead on the CPU (with LibTorch C++)"
  timeout 300 "$BUILD"/bench/bench_overhead --benchmark_repetitions=5 \
    --benchmark_report_aggregates_only=true --benchmark_out="$LOGS/overhead.json" \
    --benchmark_out_format=json 2>&1 | tee "$LOGS/overhead.txt"
  check overhead "${PIPESTATUS[0]}"
fi

if ! skip decode; then
  stage "decode step: Llama-1B and SmolLM2 shapes, bf16 and kept quantized (scripts/gpu-decode.sh)"
  WICK_GPU_BUILD=$BUILD WICK_DECODE_VARIANTS=default timeout 600 bash scripts/gpu-decode.sh --quick \
    >"$LOGS/decode.txt" 2>&1
  check decode $?
  sed -n '/gpu-decode summary/,$p' "$LOGS/decode.txt"
fi

if ! skip nn; then
  stage "nn kernels beside PyTorch: row ops, prefill and decode attention (bench_nn_cuda, torch_nn.py)"
  timeout 180 "$BUILD"/bench/cuda_bench_nn_cuda 2>&1 | tee "$LOGS/nn.txt"
  check nn "${PIPESTATUS[0]}"
  PYTHONUNBUFFERED=1 timeout 180 python3 bench/cuda/torch_nn.py 2>&1 | tee -a "$LOGS/nn.txt"
  check torch_nn "${PIPESTATUS[0]}"
fi

if ! skip serve; then
  stage "serving: serve::Engine vs transformers generate_batch, Llama-1B shape bf16 (serve_torch.py)"
  PYTHONUNBUFFERED=1 timeout 400 python3 bench/cuda/serve_torch.py \
    --bench "$BUILD"/bench/bench_serve_engine --bench-args=--compare-graphs 2>&1 | grep -v ContinuousBatchingLogger |
    tee "$LOGS/serve.txt"
  check serve "${PIPESTATUS[0]}"
  # The cost of batch invariance (wick-serve --deterministic: wick's GEMM for every product) at 64
  # streams, beside the default in the same process.
  PYTHONUNBUFFERED=1 timeout 300 python3 bench/cuda/serve_torch.py --skip-torch --streams 64 \
    --bench "$BUILD"/bench/bench_serve_engine --bench-args=--compare-invariant 2>&1 |
    tee -a "$LOGS/serve.txt"
  check "serve invariant" "${PIPESTATUS[0]}"
fi

if ! skip families; then
  stage "families: graph decode vs transformers' static-cache generate (family_torch.py)"
  PYTHONUNBUFFERED=1 timeout 400 python3 bench/cuda/family_torch.py \
    --bench "$BUILD"/bench/bench_generate --engines generate_static 2>&1 | tee "$LOGS/families.txt"
  check families "${PIPESTATUS[0]}"
fi

SAN_SUMMARY="not run"
if ! skip sanitizer; then
  stage "compute-sanitizer memcheck over the CUDA tests"
  san_errors=0
  san_runs=0
  for t in "$BUILD"/tests/cuda_test_*; do
    [[ -x "$t" ]] || continue
    name=$(basename "$t")
    if over_budget; then
      echo "$name: not run (over WICK_GPU_BUDGET)"
      continue
    fi
    WICK_REQUIRE_CUDA=1 timeout 400 compute-sanitizer --tool memcheck --report-api-errors no \
      --error-exitcode 99 "$t" --gtest_brief=1 >"$LOGS/san_$name.txt" 2>&1
    rc=$?
    n=$(grep -oE "ERROR SUMMARY: [0-9]+" "$LOGS/san_$name.txt" | grep -oE "[0-9]+" | tail -1)
    echo "$name: exit $rc, ${n:-?} memcheck errors"
    if [[ "$rc" != 0 || -z "$n" || "$n" != 0 ]]; then
      grep -m5 -A8 "=========" "$LOGS/san_$name.txt"
      FAILED+=("memcheck $name (exit $rc, ${n:-?} errors)")
    fi
    san_errors=$((san_errors + ${n:-0}))
    san_runs=$((san_runs + 1))
  done
  SAN_SUMMARY="$san_errors errors in $san_runs programs"
fi

stage "table (gpu-check took $(($(date +%s) - T0)) s)"
cat "$LOGS"/bench.txt "$LOGS"/torch.txt "$LOGS"/graphs.txt "$LOGS"/embed.txt "$LOGS"/nn.txt 2>/dev/null | grep '^RESULT ' >"$LOGS/results.txt"
BUILD_SUMMARY="$BUILD_SUMMARY" CTEST_SUMMARY="$CTEST_SUMMARY" SAN_SUMMARY="$SAN_SUMMARY" WICKMM="$LOGS/wickmm2.txt" LOGS="$LOGS" \
  python3 - "$LOGS/results.txt" <<'EOF'
import os, re, sys
r = {}
for line in open(sys.argv[1]):
    _, k, v = line.split()
    r[k] = float(v)
def first_ms(path):
    try:
        text = open(path, encoding="utf-8", errors="replace").read()
    except OSError:
        return None
    m = re.search(r"run 0: matmul returned .*?after synchronize ([0-9.]+) (µs|ms|s)\b", text)
    if not m:
        return None
    return float(m.group(1)) * {"µs": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]
def f(k, fmt="{:.3g}"):
    return fmt.format(r[k]) if k in r else "-"
rows = []
def row(name, target, ours, torch, ok):
    rows.append((name, target, ours, torch, "ok" if ok else ("-" if ok is None else "MISS")))
for n in (1024, 4096, 8192):
    for dt in ("f32", "bf16", "f16"):
        k = f"matmul_{n}_{dt}"
        ratio = r.get(k + "_ratio")
        row(f"matmul {n} {dt}: wick/cuBLAS (TFLOP/s)", ">= 0.98",
            f"{ratio:.3f} ({r.get(k + '_tflops', 0):.1f})" if ratio else "-",
            f(f"torch_{k}_tflops", "{:.1f} TFLOP/s"), None if ratio is None else ratio >= 0.98)
def lim(k, target, cmp):
    return None if k not in r else cmp(r[k], target)
row("matmul 1024 f32 returns (us)", "<= 5", f("matmul_return_us", "{:.2f}"),
    f("torch_matmul_return_us", "{:.2f}"), lim("matmul_return_us", 5, lambda a, b: a <= b))
row("  same, no graph replay (us)", "", f("matmul_return_plain_us", "{:.2f}"), "-", None)
row("  cublasLtMatmul / cublasGemmEx alone (us)", "",
    f("cublaslt_return_us", "{:.2f}") + " / " + f("cublas_gemmex_return_us", "{:.2f}"), "-", None)
row("read one element of 1024^2 (us)", "<= 12", f("readback_one_us", "{:.2f}"),
    f("torch_readback_one_us", "{:.2f}"), lim("readback_one_us", 12, lambda a, b: a <= b))
row("add 64M f32 / D2D copy", ">= 0.85", f("add_vs_copy"), f("torch_add_vs_copy"),
    lim("add_vs_copy", 0.85, lambda a, b: a >= b))
row("add 64M f32 (GB/s)", "", f("add_gbs", "{:.0f}"), f("torch_add_gbs", "{:.0f}"), None)
row("softmax 8192^2 f32 (GB/s)", "", f("softmax_gbs", "{:.0f}"), f("torch_softmax_gbs", "{:.0f}"),
    None)
row("sum 64M f32 (GB/s)", "", f("sum_gbs", "{:.0f}"), f("torch_sum_gbs", "{:.0f}"), None)
row("1000 dependent adds, graphs (us/op)", "<= 3", f("graphs_add_chain_graph_us", "{:.2f}"),
    f("torch_graphs_add_chain_us", "{:.2f}"), lim("graphs_add_chain_graph_us", 3, lambda a, b: a <= b))
row("  stream / raw launches (us/op)", "",
    f("graphs_add_chain_stream_us", "{:.2f}") + " / " + f("graphs_add_chain_raw_us", "{:.2f}"), "-", None)
mlp_ok = None
if "graphs_mlp_graph_us" in r and "graphs_mlp_stream_us" in r:
    mlp_ok = r["graphs_mlp_graph_us"] < r["graphs_mlp_stream_us"]
row("MLP 12x256 b1, graphs / stream (us/op)", "graphs<stream",
    f("graphs_mlp_graph_us", "{:.2f}") + " / " + f("graphs_mlp_stream_us", "{:.2f}"),
    f("torch_graphs_mlp_us", "{:.2f}"), mlp_ok)
row("matmul 1024 f32 returns: graph mode / stream + replay / stream, no replay (us)", "",
    f("matmul_return_graph_mode_us", "{:.2f}") + " / " + f("matmul_return_stream_replay_us", "{:.2f}")
    + " / " + f("matmul_return_stream_plain_us", "{:.2f}"), "-", None)
row("  MLP stream mode, matmul replay / none (us/op)", "",
    f("graphs_mlp_stream_us", "{:.2f}") + " / " + f("graphs_mlp_stream_no_matmul_graphs_us", "{:.2f}"),
    "-", None)
for v, name in (("full", "warm-up GEMMs (default)"), ("handle", "warm-up, handle only"),
                ("none", "no warm-up")):
    k = f"warmup_{v}_"
    row(f"fresh process, {name}: first f32/bf16 matmul, 200 f32, process (ms)", "",
        " / ".join(f(k + x, "{:.1f}") for x in ("first_f32_ms", "first_bf16_ms", "loop_f32_ms",
                                                  "process_ms")), "-", None)
for dt in ("f32", "bf16"):
    k = f"embed_cuda_{dt}"
    row(f"MiniLM embeddings {dt}: wick/ST (sent/s)", ">= 2",
        f"{r[k + '_ratio']:.2f} ({r[k + '_wick_sps']:.0f})" if k + "_ratio" in r else "-",
        f(f"torch_{k}_sps", "{:.0f}"), lim(k + "_ratio", 2, lambda a, b: a >= b))
for op in ("layer_norm", "rms_norm", "softmax"):
    ours, theirs = r.get(f"nn_{op}_vs_copy"), r.get(f"torch_nn_{op}_vs_copy")
    row(f"{op} (4096, 4096) bf16 / D2D copy", ">= 0.85, >= PyTorch", f(f"nn_{op}_vs_copy", "{:.3f}"),
        f(f"torch_nn_{op}_vs_copy", "{:.3f}"),
        None if ours is None else ours >= 0.85 and (theirs is None or ours >= theirs))
for n in (1024, 4096, 16384):
    ours, theirs = r.get(f"nn_attn_s{n}_ms"), r.get(f"torch_nn_attn_s{n}_ms")
    ratio = theirs / ours if ours and theirs else None
    row(f"attention bf16 b1 h32 d128 causal s={n}: PyTorch time / wick's (ms)", ">= 0.9",
        "-" if ratio is None else f"{ratio:.2f} ({ours:.3f})", f(f"torch_nn_attn_s{n}_ms", "{:.3f}"),
        None if ratio is None else ratio >= 0.9)
row("decode attention s_kv 4096 h_kv 8: KV read / D2D copy", ">= 0.70",
    f("nn_decode_vs_copy", "{:.3f}"), f("torch_nn_decode_vs_copy", "{:.3f}"),
    lim("nn_decode_vs_copy", 0.70, lambda a, b: a >= b))
fm = first_ms(os.environ["WICKMM"])
row("first matmul 1024 f32, fresh process (ms)", "<= 25", "-" if fm is None else f"{fm:.2f}",
    f("torch_first_matmul_ms", "{:.1f}"), None if fm is None else fm <= 25)
def conform(dev):
    try:
        last = open(f"{os.environ['LOGS']}/conform_{dev}.txt").read().strip().splitlines()[-1]
    except (OSError, IndexError):
        return "-", None
    m = re.match(r"(\d+) checks, (\d+) breaches", last)
    return (last, m.group(2) == "0") if m else (last[:40], False)
for dev in ("cpu", "cuda"):
    text, ok = conform(dev)
    row(f"wick-conform {dev}", "0 breaches", text, "-", ok)
try:
    import json
    bench = {b["name"]: b["cpu_time"] for b in
             json.load(open(f"{os.environ['LOGS']}/overhead.json"))["benchmarks"]
             if b.get("aggregate_name") == "median"}
except (OSError, ValueError, KeyError):
    bench = {}
for kind, target in (("untracked", 250), ("tracked", 600)):
    ours, theirs = bench.get(f"BM_wick_{kind}_median"), bench.get(f"BM_torch_{kind}_median")
    ok = None if ours is None else ours <= target and (theirs is None or ours < theirs)
    row(f"CPU x = x + x*z, 4 f32, {kind} (ns)", f"<= {target}",
        "-" if ours is None else f"{ours:.0f}", "-" if theirs is None else f"{theirs:.0f}", ok)
w = [max(len(str(x[i])) for x in rows + [("figure", "target", "wick", "PyTorch", "")])
     for i in range(5)]
hdr = ("figure", "target", "wick", "PyTorch", "")
print("  ".join(str(c).ljust(w[i]) for i, c in enumerate(hdr)))
for x in rows:
    print("  ".join(str(c).ljust(w[i]) for i, c in enumerate(x)))
print(f"build: {os.environ['BUILD_SUMMARY']}")
print(f"tests (WICK_REQUIRE_CUDA=1): {os.environ['CTEST_SUMMARY']}")
print(f"compute-sanitizer memcheck: {os.environ['SAN_SUMMARY']}")
EOF
[[ -f "$LOGS/decode.txt" ]] && sed -n '/gpu-decode summary/,$p' "$LOGS/decode.txt"
grep -h '^RESULT ' "$LOGS"/serve.txt "$LOGS"/families.txt 2>/dev/null
[[ -n "${OUT:-}" ]] && tar czf "$OUT/gpu-check-logs.tgz" -C "$LOGS" . 2>/dev/null
if [[ ${#FAILED[@]} -gt 0 ]]; then
  echo "gpu-check: FAILED: ${FAILED[*]}"
  exit 1
fi
echo "gpu-check: every stage passed"
exit 0
