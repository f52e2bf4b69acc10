#!/usr/bin/env python3
"""wick-serve beside llama.cpp's OpenAI-compatible server (llama-cpp-python[server] from PyPI) on
the same GGUF file, in the same run: output tok/s and p50/p99 time to first token (TTFT) and
inter-token latency (ITL) at 1, 4, 16 and 64 concurrent streams, printed side by side; then
wick-serve at 1 stream beside wick-generate's decode rate. A benchmark, not a test.

Both servers run at once (the idle one sleeps) and each concurrency level runs on wick-serve, then
on llama.cpp, so that a noisy machine disturbs both alike. Each stream sends `--requests` streamed
completions of `--tokens` tokens one after another (at low concurrency more, so that each level
has `--min-requests`); tokens are counted as the streamed pieces that
carry text (each server sends one per token). llama-cpp-python is installed by this script into
its own venv (`--venv`, kept for later runs; pip builds it from source the first time unless its
wheel cache has it). llama.cpp's server runs with --interrupt_requests False: by default a new
request cuts the one it is streaming short, which no client of a shared server wants.

    python3 bench/serve_peer.py --model SmolLM2-135M-Instruct.Q4_1.gguf \
        --server build/tools/wick-serve --generate build/tools/wick-generate
"""

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

PROMPTS = ["Once upon a time, in a land far away,", "The history of the Roman Empire began",
           "Here is a long list of fruits:", "def main():\n", "In the year 2050, cities will",
           "The recipe for bread is simple:", "Dear diary, today I", "The ocean is deep and"]


# Runs llama_cpp.server, optionally without llama.cpp's extra buffer types (AMX, weight
# repacking): where the OS does not let the process use AMX, llama.cpp's AMX matmul dies of SIGILL.
LLAMA_SERVER = """
import runpy, sys
if sys.argv.pop(1) == "no-extra-bufts":
    import llama_cpp.llama_cpp as llama_cpp
    default_params = llama_cpp.llama_model_default_params
    def params():
        p = default_params()
        p.use_extra_bufts = False
        return p
    llama_cpp.llama_model_default_params = params
sys.argv[0] = "llama_cpp.server"
runpy.run_module("llama_cpp.server", run_name="__main__")
"""


def ensure_llamacpp(venv, version):
    py = os.path.join(venv, "bin", "python")
    check = [py, "-c", "import llama_cpp.server, fastapi, uvicorn, sse_starlette"]
    if os.path.exists(py) and subprocess.run(check, capture_output=True).returncode == 0:
        return py
    print(f"installing llama-cpp-python[server]=={version} into {venv} (a source build takes "
          "about 15 minutes on 2 cores unless pip's wheel cache has it)...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q",
                    f"llama-cpp-python[server]=={version}"], check=True)
    return py


def wait_ready(port, proc, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with {proc.returncode}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/v1/models")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server on port {port} did not start")


def stream_once(port, model, prompt, tokens):
    """(ttft seconds, [inter-token gaps], token count) of one streamed completion."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
                       "stream": True})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    times = []
    for raw in r:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if any(ch.get("text") for ch in chunk.get("choices", [])):
            times.append(time.perf_counter())
    c.close()
    if not times:
        return None, [], 0
    return times[0] - t0, [b - a for a, b in zip(times, times[1:])], len(times)


def run_level(port, model, streams, requests, tokens):
    ttfts, itls, counts, errors = [], [], [0], []
    lock = threading.Lock()

    def worker(i):
        for k in range(requests):
            try:
                ttft, gaps, n = stream_once(port, model, PROMPTS[(i + k) % len(PROMPTS)], tokens)
            except Exception as e:  # noqa: BLE001 (counted and shown)
                with lock:
                    errors.append(repr(e))
                continue
            with lock:
                if ttft is not None:
                    ttfts.append(ttft)
                itls.extend(gaps)
                counts[0] += n

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"tok_s": counts[0] / wall, "ttft": ttfts, "itl": itls, "errors": errors,
            "tokens": counts[0], "wall": wall}


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the GGUF file both servers load")
    ap.add_argument("--server", default="build/tools/wick-serve")
    ap.add_argument("--generate", default="build/tools/wick-generate")
    ap.add_argument("--streams", default="1,4,16,64")
    ap.add_argument("--tokens", type=int, default=32, help="max_tokens of each request")
    ap.add_argument("--requests", type=int, default=1, help="requests per stream and level")
    ap.add_argument("--min-requests", type=int, default=8,
                    help="requests per level at least (more per stream at low concurrency)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads of each")
    ap.add_argument("--decode-rounds", type=int, default=3,
                    help="rounds of wick-serve (1 stream) beside wick-generate; 0 skips them")
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--venv", default="/tmp/wick-serve-peer-venv")
    ap.add_argument("--llamacpp-version", default="0.3.36")
    ap.add_argument("--llama-extra-bufts", action="store_true",
                    help="let llama.cpp use its extra buffer types (AMX; SIGILL where the OS "
                         "forbids AMX)")
    ap.add_argument("--wick-port", type=int, default=18480)
    ap.add_argument("--llama-port", type=int, default=18481)
    args = ap.parse_args()
    levels = [int(s) for s in args.streams.split(",")]
    model_id = re.sub(r"\.gguf$", "", os.path.basename(args.model))

    py = ensure_llamacpp(args.venv, args.llamacpp_version)
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    n_ctx = max(2048, (args.tokens + 64) * max(levels))
    servers = {
        "wick-serve": subprocess.Popen(
            [args.server, "--port", str(args.wick_port), "--threads", str(args.threads),
             "--max-batch", str(max(levels)), args.model],
            stderr=subprocess.DEVNULL, env=env),
        "llama.cpp": subprocess.Popen(
            [py, "-c", LLAMA_SERVER,
             "extra-bufts" if args.llama_extra_bufts else "no-extra-bufts",
             "--model", args.model, "--model_alias", model_id,
             "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads),
             "--n_ctx", str(n_ctx), "--interrupt_requests", "False", "--host", "127.0.0.1",
             "--port", str(args.llama_port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env),
    }
    ports = {"wick-serve": args.wick_port, "llama.cpp": args.llama_port}
    results = {}
    try:
        for name, proc in servers.items():
            wait_ready(ports[name], proc)
            stream_once(ports[name], model_id, PROMPTS[0], 4)  # warm-up
        for streams in levels:
            for name in servers:
                per_stream = max(args.requests, -(-args.min_requests // streams))
                r = run_level(ports[name], model_id, streams, per_stream, args.tokens)
                results[(name, streams)] = r
                print(f"  {name:10s} {streams:3d} streams: {r['tokens']} tokens in "
                      f"{r['wall']:.1f} s, {len(r['errors'])} errors "
                      f"{r['errors'][:1] if r['errors'] else ''}", file=sys.stderr)
    finally:
        for proc in servers.values():
            proc.terminate()
        for proc in servers.values():
            proc.wait(60)

    load = os.getloadavg()[0]
    print(f"\nserve_peer: {model_id}, {args.threads} threads each, {args.tokens} tokens per "
          f"request, {args.requests} request(s) per stream ({args.min_requests} at least per level); load average {load:.1f} "
          "(other work on this machine skews both)")
    head = f"{'streams':>7} | {'server':10} | {'tok/s':>7} | {'TTFT p50':>9} | {'TTFT p99':>9} | " \
           f"{'ITL p50':>8} | {'ITL p99':>8} | errors"
    print(head)
    print("-" * len(head))
    for streams in levels:
        for name in servers:
            r = results[(name, streams)]
            print(f"{streams:7d} | {name:10} | {r['tok_s']:7.1f} | {pct(r['ttft'], 50) * 1e3:7.0f}ms"
                  f" | {pct(r['ttft'], 99) * 1e3:7.0f}ms | {pct(r['itl'], 50) * 1e3:6.1f}ms | "
                  f"{pct(r['itl'], 99) * 1e3:6.1f}ms | {len(r['errors'])}")
        w, l = results[("wick-serve", streams)], results[("llama.cpp", streams)]
        if l["tok_s"] > 0:
            print(f"{'':7} | {'ratio':10} | {w['tok_s'] / l['tok_s']:6.2f}x |")

    # wick-serve at 1 stream beside wick-generate's own decode rate (same model, prompt, threads
    # and token count), alternating, median of the rounds.
    if args.decode_rounds > 0:
        server = subprocess.Popen([args.server, "--port", str(args.wick_port), "--threads",
                                   str(args.threads), args.model], stderr=subprocess.DEVNULL)
        serve_rates, gen_rates = [], []
        try:
            wait_ready(args.wick_port, server)
            stream_once(args.wick_port, model_id, PROMPTS[0], 4)
            for _ in range(args.decode_rounds):
                gen = subprocess.run([args.generate, args.model, "--prompt", PROMPTS[0],
                                      "--max-new", str(args.decode_tokens), "--temperature", "0",
                                      "--json", "-q", "--threads", str(args.threads)],
                                     capture_output=True, text=True, check=True)
                gen_rates.append(json.loads(gen.stdout)["timings"]["decode_tokens_per_second"])
                _, gaps, _ = stream_once(args.wick_port, model_id, PROMPTS[0], args.decode_tokens)
                serve_rates.append(len(gaps) / sum(gaps) if gaps else float("nan"))
        finally:
            server.terminate()
            server.wait(60)
        s, g = statistics.median(serve_rates), statistics.median(gen_rates)
        print(f"\n1 stream, {args.decode_tokens} tokens, median of {args.decode_rounds} alternating "
              f"rounds: wick-serve decodes {s:.1f} tok/s (tokens after the first / their time), "
              f"wick-generate {g:.1f} tok/s (its decode timing): {s / g:.2f}x")

if __name__ == "__main__":
    main()
