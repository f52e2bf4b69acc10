#!/usr/bin/env python3
"""wick beside llama.cpp (llama-cpp-python) on one GGUF file, in the same run: decode tok/s with
1 and 2 threads and the prefill of a 128-token prompt, rounds alternating between the two engines,
medians of the rounds, and each engine's decode speed-up from its thread counts. wick runs through
bench_generate --keep-quantized (WICK_NUM_THREADS=t).
On a loaded machine llama.cpp's OpenMP threads spin-wait and its 2-thread figures collapse;
OMP_WAIT_POLICY=PASSIVE in the environment makes them sleep instead (wick ignores it). On a
machine shared with other work, `chrt -f 10` before the command runs both engines ahead of it, so
that the thread counts measure idle cores.

    python3 scripts/bench_llamacpp.py --model SmolLM2-135M-Instruct.Q4_1.gguf \
        --bench build/bench/bench_generate
"""
import argparse
import os
import re
import statistics
import subprocess
import time


def load_average():
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def llamacpp_figures(model, threads, prompt, new_tokens, extra_bufts=True):
    import llama_cpp.llama_cpp as llama_cpp  # the module whose defaults Llama() reads
    from llama_cpp import Llama

    if not extra_bufts:
        # Without the extra buffer types (AMX, weight repacking): where the OS does not let the
        # process use AMX, llama.cpp's AMX matmul dies of SIGILL.
        default_params = llama_cpp.llama_model_default_params

        def params():
            p = default_params()
            p.use_extra_bufts = False
            return p
        llama_cpp.llama_model_default_params = params

    llm = Llama(model_path=model, n_ctx=len(prompt) + new_tokens + 8, n_batch=len(prompt),
                n_threads=threads, n_threads_batch=threads, verbose=False)
    llm.eval(prompt[:8])  # warm-up
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    prefill = len(prompt) / (time.perf_counter() - t0)
    token = prompt[-1]
    t0 = time.perf_counter()
    for i in range(new_tokens):
        llm.eval([(token + 7919 * i) % 1000])
    decode = new_tokens / (time.perf_counter() - t0)
    del llm
    return prefill, decode


def wick_figures(bench, model, threads, prompt_len, new_tokens):
    env = dict(os.environ, WICK_NUM_THREADS=str(threads))
    out = subprocess.run([bench, "--model", model, "--keep-quantized", "--prompt-len",
                          str(prompt_len), "--new", str(new_tokens), "--repeats", "2"],
                         env=env, check=True, capture_output=True, text=True).stdout
    m = re.search(r"wick \(op by op\)\s+([\d.]+)\s+([\d.]+)", out)
    if not m:
        raise RuntimeError("bench_generate output not understood:\n" + out)
    return float(m.group(1)), float(m.group(2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--bench", default="build/bench/bench_generate")
    ap.add_argument("--old-bench", help="an older build's bench_generate, run in the same rounds "
                    "(an A/B of two wick trees beside llama.cpp)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-extra-bufts", action="store_true",
                    help="llama.cpp without its extra buffer types (AMX, repacked weights): for "
                         "machines where its AMX path dies of SIGILL")
    a = ap.parse_args()
    prompt = [(i * 7919 + 11) % 1000 for i in range(a.prompt_len)]  # bench_generate's prompt
    runs = {}
    engines = ("llama.cpp", "wick-old", "wick") if a.old_bench else ("llama.cpp", "wick")
    for r in range(a.rounds):
        for t in [int(x) for x in a.threads.split(",")]:
            for engine in engines:
                if engine != "llama.cpp":
                    bench = a.bench if engine == "wick" else a.old_bench
                    p, d = wick_figures(bench, a.model, t, a.prompt_len, a.new)
                else:
                    p, d = llamacpp_figures(a.model, t, prompt, a.new, not a.no_extra_bufts)
                runs.setdefault((engine, t), []).append((p, d))
                print(f"round {r + 1}: {engine:9s} {t} thread(s): prefill {p:8.1f} tok/s, "
                      f"decode {d:7.1f} tok/s (load average {load_average():.1f})", flush=True)
    med = {key: (statistics.median(p for p, _ in v), statistics.median(d for _, d in v))
           for key, v in runs.items()}
    load = load_average()
    print(f"\n{os.path.basename(a.model)}: prompt {a.prompt_len}, {a.new} new tokens, medians of "
          f"{a.rounds} alternating rounds, load average {load:.1f} on {os.cpu_count()} cores")
    print(f"{'threads':>7} {'engine':>10} {'prefill tok/s':>14} {'decode tok/s':>13}")
    for t in sorted({t for _, t in med}):
        for engine in engines:
            p, d = med[(engine, t)]
            print(f"{t:>7} {engine:>10} {p:14.1f} {d:13.1f}")
        lp, ld = med[("llama.cpp", t)]
        wp, wd = med[("wick", t)]
        print(f"{t:>7} {'wick/llama':>10} {wp / lp:13.2f}x {wd / ld:12.2f}x")
        if a.old_bench:
            op, od = med[("wick-old", t)]
            print(f"{t:>7} {'wick/old':>10} {wp / op:13.2f}x {wd / od:12.2f}x")
    threads = sorted({t for _, t in med})
    if len(threads) > 1:
        lo, hi = threads[0], threads[-1]
        for engine in engines:
            print(f"{engine} decode, {hi} threads / {lo}: "
                  f"{med[(engine, hi)][1] / med[(engine, lo)][1]:.2f}x")


if __name__ == "__main__":
    main()
