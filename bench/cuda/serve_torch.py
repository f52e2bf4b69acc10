#!/usr/bin/env python3
"""Serving throughput on the GPU: wick's serve::Engine (bench/bench_serve_engine) beside Hugging
Face transformers' continuous batching (`generate_batch`), in one run, on a random-weight model of
Llama-3.2-1B's shape in bf16 (config typed in from meta-llama/Llama-3.2-1B; transformers makes
the seeded N(0, 0.02) weights and saves the folder that wick loads through load_causal_lm).

For each number of concurrent streams, every stream gets its own prompt of --prompt-len tokens and
generates --new tokens greedily (no end-of-sequence stop); the figure is the aggregate output
tok/s: all generated tokens over the wall time from submitting the first request to the last
token (transformers: from the first request's creation, after its manager's set-up). transformers
runs with its defaults (SDPA over the paged cache, its own choice of CUDA graphs), after a
warm-up of the same stream count. Needs torch, transformers >= 5 and safetensors.

  serve_torch.py --bench build-gpu/bench/bench_serve_engine                (the GPU machine)
  serve_torch.py --bench build/bench/bench_serve_engine --device cpu --dtype f32 \\
      --shape llama-tiny --streams 1,4 --new 8                            (checks the logic)

Prints a table and "RESULT serve_torch_<streams> wick W torch T ratio R" lines.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

try:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.generation import GenerationConfig
except ImportError as e:
    print("serve_torch: needs torch and transformers:", e, file=sys.stderr)
    sys.exit(2)

SHAPES = {
    "llama-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                     num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=64, rms_norm_eps=1e-5, max_position_embeddings=131072,
                     tie_word_embeddings=True,
                     rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                     bos_token_id=128000, eos_token_id=128001),
    "llama-tiny": dict(vocab_size=1024, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=2048,
                       tie_word_embeddings=True,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                       bos_token_id=1, eos_token_id=2),
}
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def make_model(shape, seed=0):
    cfg = AutoConfig.for_model("llama", **SHAPES[shape])
    cfg.initializer_range = 0.02
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def prompt_for(stream, length, vocab):
    """The prompts bench_serve_engine makes (its prompt_for), so both run the same tokens."""
    return [(stream * 7919 + i * 104729 + 13) % (vocab - 1) + 1 for i in range(length)]


def torch_run(model, streams, prompt_len, new, vocab):
    """Aggregate output tok/s of one generate_batch call over `streams` prompts: the generated
    tokens over the time from the first request's creation to the last token (transformers
    stamps both), so the manager's set-up and CUDA graph warm-up inside the call are left out;
    the call's whole wall time where there are no stamps."""
    inputs = [prompt_for(s, prompt_len, vocab) for s in range(streams)]
    gen = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate_batch(inputs=inputs, generation_config=gen, progress_bar=False,
                                   record_timestamps=True)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    failed = [o for o in out.values() if getattr(o, "error", None)]
    if failed or len(out) != streams:
        raise RuntimeError(f"generate_batch: {len(out)} of {streams} results, {len(failed)} "
                           f"failed{': ' + failed[0].error if failed else ''}")
    tokens = sum(len(o.generated_tokens) for o in out.values())
    stamps = [o.timestamps[-1] for o in out.values() if getattr(o, "timestamps", None)]
    if len(stamps) == streams:
        secs = max(stamps) - min(o.created_time for o in out.values())
    return tokens / secs, tokens


def wick_run(bench, folder, device, dtype, streams, prompt_len, new):
    cmd = [bench, "--model", folder, "--device", device, "--dtype", dtype, "--streams",
           ",".join(map(str, streams)), "--prompt-len", str(prompt_len), "--new", str(new)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rates = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", line)
        if m:
            rates[int(m.group(1))] = [float(g) for g in m.groups()[1:]]
    if not rates:
        raise RuntimeError("bench_serve_engine output not understood:\n" + out)
    return rates, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default="build-gpu/bench/bench_serve_engine")
    ap.add_argument("--shape", default="llama-1b", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--streams", default="1,16,64,256")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--skip-torch", action="store_true", help="wick only")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("serve_torch: no CUDA GPU (use --device cpu to check the script)")
    if not os.path.exists(a.bench):
        sys.exit(f"serve_torch: no bench_serve_engine at {a.bench}")
    streams = [int(s) for s in a.streams.split(",")]
    vocab = SHAPES[a.shape]["vocab_size"]
    folder = os.path.join(tempfile.mkdtemp(prefix="serve_torch_"), a.shape)
    model = make_model(a.shape)
    model.to(DTYPES[a.dtype]).save_pretrained(folder, safe_serialization=True)
    print(f"{a.shape}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters, "
          f"{a.dtype}, {a.prompt_len}-token prompts, {a.new} new tokens a stream", flush=True)

    wick, out = wick_run(a.bench, folder, a.device, a.dtype, streams, a.prompt_len, a.new)
    print(out, end="", flush=True)

    peer = {}
    if not a.skip_torch:
        model = model.to(a.device, DTYPES[a.dtype])
        model.config._attn_implementation = "sdpa"
        for s in streams:
            try:
                torch_run(model, s, a.prompt_len, min(a.new, 16), vocab)  # warm-up
                peer[s], n = torch_run(model, s, a.prompt_len, a.new, vocab)
                print(f"transformers generate_batch {s:4d} streams: {peer[s]:9.1f} tok/s "
                      f"({n} tokens)", flush=True)
            except Exception as e:  # noqa: BLE001 - the peer's failure is reported, not fatal
                print(f"transformers generate_batch {s} streams failed: {e}", flush=True)

    print(f"\n{'streams':>8} {'wick tok/s':>12} {'torch tok/s':>12} {'ratio':>7}")
    for s in streams:
        w = wick.get(s, [0])[0]
        t = peer.get(s, 0)
        ratio = w / t if t else float("nan")
        print(f"{s:8d} {w:12.1f} {t:12.1f} {ratio:7.2f}")
        print(f"RESULT serve_torch_{s} wick {w:.1f} torch {t:.1f} ratio {ratio:.2f}")


if __name__ == "__main__":
    main()
