#!/usr/bin/env python3
"""CPU decode speed of wick beside llama.cpp (llama-cpp-python) on a real-size random-weight model
of a newer family, in one run: by default a Qwen3-0.6B-shaped model (Qwen/Qwen3-0.6B's config:
hidden 1024, 28 layers, 16 heads, 8 kv heads, head_dim 128, intermediate 3072, vocab 151936, tied
embeddings) written as a Q4_0 GGUF by scripts/make_random_gguf.py. Rounds alternate the two
engines (and which goes first) for each thread count; the figures are the medians of the rounds.
wick runs through bench_generate --model (kept quantized, WICK_NUM_THREADS=t), llama.cpp through
scripts/bench_llamacpp.py's loop (the same prompt and decode length). On a loaded machine
llama.cpp's OpenMP threads spin-wait and its 2-thread figures collapse: run with
OMP_WAIT_POLICY=PASSIVE in the environment to have them sleep instead (wick ignores it).

    python3 bench/family_peer.py --bench build/bench/bench_generate
    python3 bench/family_peer.py --shape gemma3-1b --threads 1,2 --rounds 5
    python3 bench/family_peer.py --model qwen3-q4_0.gguf   (an existing file)

Prints a table, the wick/llama.cpp ratio per thread count and "RESULT" lines.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))

import make_random_gguf  # noqa: E402
from bench_llamacpp import llamacpp_figures, load_average  # noqa: E402


def wick_figures(bench, model, threads, prompt_len, new_tokens):
    """Prefill and decode tok/s of one bench_generate run (one warm-up, one timed)."""
    env = dict(os.environ, WICK_NUM_THREADS=str(threads))
    out = subprocess.run([bench, "--model", model, "--keep-quantized", "--prompt-len",
                          str(prompt_len), "--new", str(new_tokens), "--repeats", "1"],
                         env=env, check=True, capture_output=True, text=True).stdout
    m = re.search(r"wick \(op by op\)\s+([\d.]+)\s+([\d.]+)", out)
    if not m:
        raise RuntimeError("bench_generate output not understood:\n" + out)
    return float(m.group(1)), float(m.group(2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-0.6b", choices=sorted(make_random_gguf.SHAPES))
    ap.add_argument("--type", default="q4_0", choices=sorted(make_random_gguf.TYPES),
                    help="type of the layer matrices")
    ap.add_argument("--embed-type", default="q8_0", choices=sorted(make_random_gguf.TYPES),
                    help="type of the tied embedding / output head")
    ap.add_argument("--model", help="an existing GGUF file instead of writing one")
    ap.add_argument("--keep", action="store_true", help="keep the written GGUF file")
    ap.add_argument("--bench", default="build/bench/bench_generate")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--extra-bufts", action="store_true",
                    help="llama.cpp with its extra buffer types (AMX, repacked weights); off by "
                         "default because its AMX path dies of SIGILL where the OS withholds AMX")
    a = ap.parse_args()
    if not os.path.exists(a.bench):
        sys.exit(f"family_peer: no bench_generate at {a.bench} (build the bench_generate target)")

    path = a.model
    if path is None:
        fd, path = tempfile.mkstemp(suffix=f"-{a.shape}-{a.type}.gguf")
        os.close(fd)
        print(f"writing {path} ({a.shape}, layers {a.type}, embedding {a.embed_type})...",
              flush=True)
        make_random_gguf.write(make_random_gguf.SHAPES[a.shape], a.type, a.embed_type, path)
    try:
        size_mib = os.path.getsize(path) / 1048576
        prompt = [(i * 7919 + 11) % 1000 for i in range(a.prompt_len)]  # bench_generate's prompt
        threads = [int(t) for t in a.threads.split(",")]
        runs = {}
        for r in range(a.rounds):
            for t in threads:
                order = ("llama.cpp", "wick") if r % 2 == 0 else ("wick", "llama.cpp")
                for engine in order:
                    if engine == "wick":
                        p, d = wick_figures(a.bench, path, t, a.prompt_len, a.new)
                    else:
                        p, d = llamacpp_figures(path, t, prompt, a.new, a.extra_bufts)
                    runs.setdefault((engine, t), []).append((p, d))
                    print(f"round {r + 1}: {engine:9s} {t} thread(s): prefill {p:8.1f} tok/s, "
                          f"decode {d:7.1f} tok/s (load average {load_average():.1f})",
                          flush=True)
        name = os.path.basename(a.model) if a.model else f"{a.shape} {a.type} (random weights)"
        print(f"\n{name}, {size_mib:.0f} MiB: prompt {a.prompt_len}, {a.new} new tokens, medians "
              f"of {a.rounds} alternating rounds, load average {load_average():.1f} on "
              f"{os.cpu_count()} cores")
        print(f"{'threads':>7} {'engine':>10} {'prefill tok/s':>14} {'decode tok/s':>13}")
        med = {k: (statistics.median(p for p, _ in v), statistics.median(d for _, d in v))
               for k, v in runs.items()}
        tag = a.shape if not a.model else os.path.splitext(os.path.basename(a.model))[0]
        tag = re.sub(r"[^0-9A-Za-z]+", "_", tag)
        for t in threads:
            for engine in ("llama.cpp", "wick"):
                p, d = med[(engine, t)]
                print(f"{t:>7} {engine:>10} {p:14.1f} {d:13.1f}")
            lp, ld = med[("llama.cpp", t)]
            wp, wd = med[("wick", t)]
            print(f"{t:>7} {'wick/llama':>10} {wp / lp:13.2f}x {wd / ld:12.2f}x")
        for t in threads:
            print(f"RESULT {tag}_cpu_{t}t_decode_tps wick {med[('wick', t)][1]:.1f} llama.cpp "
                  f"{med[('llama.cpp', t)][1]:.1f} ratio "
                  f"{med[('wick', t)][1] / med[('llama.cpp', t)][1]:.2f}")
    finally:
        if a.model is None and not a.keep:
            os.remove(path)
        elif a.model is None:
            print(f"kept {path}")


if __name__ == "__main__":
    main()
