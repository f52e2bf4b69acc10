#!/usr/bin/env python3
"""The peer of bench/bench_generate.cpp: Hugging Face transformers decoding (batch 1) on the GPU,
on a random model of the same shape, timed the same way (prefill of the prompt, then greedy
decode; tok/s of the decode tokens after the first). Two engines: eager with the dynamic cache,
and the static cache with torch.compile ("reduce-overhead": its CUDA graphs).

  generate_peer.py --shape llama1b --dtype bf16 --prompt-len 32 --new 128 --out peer.json
  generate_peer.py --device cpu --gguf SmolLM2-135M-Instruct.Q4_1.gguf --dtype f32 \
      --engines eager --new 64 --out peer_cpu.json      (the CPU benchmark's peer)
Prints a table and "RESULT torch_<engine>_decode_tps <value>" lines; writes the JSON that
bench_generate --peer reads.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "scripts"))

try:
    import torch
    from make_llama_refs import SHAPES, gguf_to_state, make_model
except ImportError as e:
    print("generate_peer: needs torch and transformers:", e, file=sys.stderr)
    sys.exit(2)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def gguf_model(path):
    """SmolLM2 (or any llama GGUF) dequantised to f32, as bench_generate --model PATH.gguf."""
    from transformers import AutoConfig, LlamaForCausalLM
    cfg, state = gguf_to_state(path)
    c = dict(cfg)
    c.pop("model_type")
    model = LlamaForCausalLM(AutoConfig.for_model("llama", **c)).eval()
    sd = {k: torch.from_numpy(v) for k, v in state.items()}
    if cfg["tie_word_embeddings"]:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    model.load_state_dict(sd, strict=False)
    return model


def run(model, prompt, n, static):
    from transformers import StaticCache
    dev = prompt.device
    sync()
    t0 = time.perf_counter()
    if static:
        length = prompt.shape[1] + n
        try:  # transformers 5
            cache = StaticCache(config=model.config, max_cache_len=length)
        except TypeError:  # transformers 4
            cache = StaticCache(config=model.config, max_batch_size=1, max_cache_len=length,
                                device=dev, dtype=model.dtype)
    else:
        cache = None
    pos = torch.arange(prompt.shape[1], device=dev)
    out = model(prompt, past_key_values=cache, use_cache=True, cache_position=pos)
    cache = out.past_key_values
    nxt = out.logits[:, -1:].argmax(-1)
    sync()
    t1 = time.perf_counter()
    for i in range(n - 1):
        p = torch.tensor([prompt.shape[1] + i], device=dev)
        out = model(nxt, past_key_values=cache, use_cache=True, cache_position=p)
        nxt = out.logits[:, -1:].argmax(-1)
    sync()
    t2 = time.perf_counter()
    return prompt.shape[1] / (t1 - t0), (n - 1) / (t2 - t1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama1b", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="bf16", choices=["f32", "bf16", "f16"])
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engines", default="eager,static_compiled")
    ap.add_argument("--out", default="peer.json")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--gguf", help="a llama GGUF file, dequantised (instead of --shape)")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("generate_peer: no CUDA GPU", file=sys.stderr)
        sys.exit(2)
    dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
    model = gguf_model(a.gguf) if a.gguf else make_model(SHAPES[a.shape], seed=0)
    model = model.to(a.device, dt)
    model.config._attn_implementation = "sdpa"
    prompt = torch.tensor([[(i * 7919 + 11) % 1000 for i in range(a.prompt_len)]],
                          device=a.device)
    results = {}
    for engine in a.engines.split(","):
        static = engine != "eager"
        if engine == "static_compiled":
            model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        with torch.no_grad():
            run(model, prompt, a.new, static)  # warm-up (and compilation)
            best = (0.0, 0.0)
            for _ in range(a.repeats):
                p, d = run(model, prompt, a.new, static)
                best = (max(best[0], p), max(best[1], d))
        name = f"transformers {engine} ({torch.__version__})"
        results[name] = {"prefill_tps": best[0], "decode_tps": best[1]}
        print(f"{name:50s} prefill {best[0]:10.1f} tok/s  decode {best[1]:8.1f} tok/s", flush=True)
        print(f"RESULT torch_{engine}_decode_tps {best[1]:.1f}", flush=True)
        # After each engine: a run stopped during a later (slower) compilation keeps these.
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
