#!/usr/bin/env python3
"""f32 GEMM throughput: wick (tools/wick-mm time cpu) beside numpy (its own OpenBLAS) and PyTorch
(MKL / oneDNN) in the same run: square N x N products, N = 256 ... 4096, at 1 and 2 threads.

    bench/sgemm_peer.py [--wick-mm build/tools/wick-mm] [--sizes 256,512,1024,2048,4096]
                        [--threads 1,2] [--rounds 3] [--wick-base OTHER/wick-mm]

Every (program, thread count) runs in a fresh process (thread counts are fixed at start-up), one
after the other within a round, so that the load of a shared machine falls on all of them alike.
Each process times every size: a warm-up product, then R products, and reports the median; the
figure printed is the best of the rounds' medians, in GFLOP/s, with the ratio of wick to the best
peer and the load average of each round. --wick-base adds a second wick-mm (another build, e.g. the
tree before a change) to each round, as column "base", for an A/B in the same run; the medians of
the rounds are printed too. numpy and torch come from the Python running this script
(a venv with `pip install numpy torch`); a peer that is not installed is left out.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

RUNS = {256: 40, 512: 15, 1024: 6, 2048: 4, 4096: 3}


def runs_for(n):
    return RUNS.get(n, max(3, int(40 * (256 / n) ** 2)))


def worker(lib, sizes):
    """Runs inside the peer's process: prints {size: median seconds} as JSON."""
    if lib == "numpy":
        import numpy as np

        def make(n):
            rng = np.random.default_rng(0)
            return (rng.standard_normal((n, n), dtype=np.float32),
                    rng.standard_normal((n, n), dtype=np.float32))

        def mm(a, b):
            return a @ b
    else:
        import torch
        torch.set_num_threads(int(os.environ["SGEMM_THREADS"]))

        def make(n):
            g = torch.Generator().manual_seed(0)
            return torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)

        def mm(a, b):
            return torch.mm(a, b)

    out = {}
    for n in sizes:
        a, b = make(n)
        mm(a, b)
        secs = []
        for _ in range(runs_for(n)):
            t0 = time.perf_counter()
            mm(a, b)
            secs.append(time.perf_counter() - t0)
        secs.sort()
        out[n] = secs[len(secs) // 2]
    print(json.dumps(out))


def peer_version(lib):
    try:
        if lib == "numpy":
            import numpy as np
            cfg = np.show_config(mode="dicts")
            blas = cfg.get("Build Dependencies", {}).get("blas", {})
            return f"numpy {np.__version__} ({blas.get('name', '?')} {blas.get('version', '')})"
        import torch
        return f"torch {torch.__version__}"
    except ImportError:
        return None


def thread_env(threads):
    env = dict(os.environ)
    for var in ("WICK_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                "SGEMM_THREADS"):
        env[var] = str(threads)
    return env


def run_wick(wick_mm, sizes, threads):
    out, gemm = {}, ""
    for n in sizes:
        text = subprocess.run([wick_mm, "time", "cpu", "--size", str(n), "--runs",
                               str(runs_for(n) + 1)], env=thread_env(threads), check=True,
                              capture_output=True, text=True).stdout
        m = re.search(r"median of the other \d+ ([0-9.]+) (ms|µs)", text)
        if not m:
            sys.exit(f"sgemm_peer: no median in wick-mm's output:\n{text}")
        out[n] = float(m.group(1)) * (1e-3 if m.group(2) == "ms" else 1e-6)
        g = re.search(r": GEMM (.*)", text)
        gemm = g.group(1) if g else gemm
    return out, gemm


def run_peer(lib, sizes, threads):
    text = subprocess.run([sys.executable, __file__, "--worker", lib, "--sizes",
                           ",".join(map(str, sizes))], env=thread_env(threads), check=True,
                          capture_output=True, text=True).stdout
    return {int(k): v for k, v in json.loads(text.strip().splitlines()[-1]).items()}


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wick-mm", default=os.path.join(root, "build", "tools", "wick-mm"))
    ap.add_argument("--sizes", default="256,512,1024,2048,4096")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--wick-base", help="another wick-mm timed in the same rounds (column base)")
    ap.add_argument("--worker", choices=["numpy", "torch"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.worker:
        worker(args.worker, sizes)
        return

    threads = [int(t) for t in args.threads.split(",")]
    peers = [lib for lib in ("numpy", "torch") if peer_version(lib)]
    medians = {}  # (program, threads, n) -> every round's median
    gemm, base_gemm = "", ""
    loads = []

    def record(prog, t, res):
        for n, s in res.items():
            medians.setdefault((prog, t, n), []).append(s)

    for r in range(args.rounds):
        load_start = loadavg()
        for t in threads:
            res, gemm = run_wick(args.wick_mm, sizes, t)
            record("wick", t, res)
            if args.wick_base:
                res, base_gemm = run_wick(args.wick_base, sizes, t)
                record("base", t, res)
            for lib in peers:
                record(lib, t, run_peer(lib, sizes, t))
        loads.append(f"{load_start}-{loadavg()}")
        print(f"round {r + 1}/{args.rounds} done (load average {loads[-1]})", file=sys.stderr)

    with open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    print(f"CPU: {cpu}, {os.cpu_count()} logical CPUs; load average per round: {', '.join(loads)}")
    print(f"wick: {gemm}")
    progs = ["wick"]
    if args.wick_base:
        print(f"base: {base_gemm} ({args.wick_base})")
        progs.append("base")
    for lib in peers:
        print(f"peer: {peer_version(lib)}")
    for title, pick in (("best of the rounds' medians", lambda v: min(v)),
                        ("median of the rounds' medians", lambda v: sorted(v)[len(v) // 2])):
        print(f"GFLOP/s, {title} (ratio: wick / best peer)")
        head = "".join(f" {p:>8}" for p in progs + peers)
        print(f"{'N':>6} {'thr':>3}{head}   ratio")
        for t in threads:
            for n in sizes:
                gf = {p: 2.0 * n ** 3 / pick(medians[(p, t, n)]) * 1e-9 for p in progs + peers}
                line = f"{n:>6} {t:>3}" + "".join(f" {gf[p]:8.1f}" for p in progs + peers)
                if peers:
                    line += f"   {gf['wick'] / max(gf[p] for p in peers):.2f}x"
                print(line)


if __name__ == "__main__":
    main()
