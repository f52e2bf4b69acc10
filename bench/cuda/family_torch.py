#!/usr/bin/env python3
"""Graph decode speed (batch 1) of wick beside Hugging Face transformers with a static cache and
torch.compile ("reduce-overhead": CUDA graphs), in one run, on random-weight models of
Qwen3-0.6B's and Gemma-3-1B's shapes (configs typed in from Qwen/Qwen3-0.6B and
google/gemma-3-1b-it). Each model is made by transformers (seeded N(0, 0.02) weights), saved as a
bf16 model folder (config.json + model.safetensors) that wick's bench_generate --model loads
through load_causal_lm, and timed the same way by both: a prefill of the prompt, then greedy
decode, tok/s of the decode tokens after the first, best of the repeats after a warm-up.
Needs only torch, transformers and safetensors (no network).

  family_torch.py --bench build/bench/bench_generate                   (the GPU machine)
  family_torch.py --bench build/bench/bench_generate --device cpu --dtype f32 \\
      --shapes qwen3-tiny,gemma3-tiny --engines eager --new 8          (checks the logic on a CPU)

Prints a table and "RESULT family_torch_<shape>_decode_tps wick W torch T ratio R" lines; the
ratio is wick's graph decode (op by op on a CPU) over transformers' compiled static cache.
"""

import argparse
import inspect
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

try:
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, StaticCache
except ImportError as e:
    print("family_torch: needs torch and transformers:", e, file=sys.stderr)
    sys.exit(2)

# The released models' config.json values that shape the computation (weights are random).
SHAPES = {
    "qwen3-0.6b": dict(model_type="qwen3", vocab_size=151936, hidden_size=1024,
                       intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                       max_position_embeddings=40960, tie_word_embeddings=True,
                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                       bos_token_id=151643, eos_token_id=151645),
    "gemma3-1b": dict(model_type="gemma3_text", vocab_size=262144, hidden_size=1152,
                      intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
                      num_key_value_heads=1, head_dim=256, rms_norm_eps=1e-6,
                      max_position_embeddings=32768, tie_word_embeddings=True,
                      query_pre_attn_scalar=256, sliding_window=512,
                      hidden_activation="gelu_pytorch_tanh",
                      layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                   for i in range(26)],
                      rope_parameters={
                          "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                      bos_token_id=2, eos_token_id=1, pad_token_id=0),
    # Tiny shapes of the same families, for checking this script (prompt ids go up to 999).
    "qwen3-tiny": dict(model_type="qwen3", vocab_size=1024, hidden_size=64,
                       intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                       max_position_embeddings=512, tie_word_embeddings=True,
                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    "gemma3-tiny": dict(model_type="gemma3_text", vocab_size=1024, hidden_size=64,
                        intermediate_size=128, num_hidden_layers=3, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=32, rms_norm_eps=1e-6,
                        max_position_embeddings=512, tie_word_embeddings=True,
                        query_pre_attn_scalar=32, sliding_window=8,
                        hidden_activation="gelu_pytorch_tanh",
                        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                        rope_parameters={
                            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                        bos_token_id=2, eos_token_id=1, pad_token_id=0),
}
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def make_model(shape, seed=0):
    """transformers' model of `shape` with seeded random weights (its own initialisation:
    N(0, 0.02) matrices, norms at their identity), f32 on the CPU."""
    cfg = dict(SHAPES[shape])
    cfg = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    cfg.initializer_range = 0.02
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def torch_run(model, prompt, n, device):
    """One greedy generation with a static cache: prefill tok/s, decode tok/s (after the
    first token)."""
    length = prompt.shape[1] + n
    try:  # transformers 5
        cache = StaticCache(config=model.config, max_cache_len=length)
    except TypeError:  # transformers 4
        cache = StaticCache(config=model.config, max_batch_size=1, max_cache_len=length,
                            device=device, dtype=model.dtype)
    # transformers renames past_key_values to cache (5.x deprecates the old name).
    key = "cache" if "cache" in inspect.signature(type(model).forward).parameters else \
        "past_key_values"
    sync(device)
    t0 = time.perf_counter()
    pos = torch.arange(prompt.shape[1], device=device)
    out = model(prompt, use_cache=True, cache_position=pos, **{key: cache})
    nxt = out.logits[:, -1:].argmax(-1)
    sync(device)
    t1 = time.perf_counter()
    for i in range(n - 1):
        p = torch.tensor([prompt.shape[1] + i], device=device)
        out = model(nxt, use_cache=True, cache_position=p, **{key: cache})
        nxt = out.logits[:, -1:].argmax(-1)
    sync(device)
    t2 = time.perf_counter()
    return prompt.shape[1] / (t1 - t0), (n - 1) / (t2 - t1)


def generate_figures(model, prompt, n, repeats, device):
    """transformers' own `generate` with a static cache: on a GPU it compiles the decode step
    itself (its generation_config.compile_config, CUDA graphs). Prefill tok/s from a one-token
    generation, decode tok/s from the difference to an n-token one; best of `repeats` after a
    warm-up (the compilation)."""
    def timed(tokens):
        sync(device)
        t0 = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens,
                             do_sample=False, cache_implementation="static",
                             pad_token_id=0)
        sync(device)
        assert out.shape[1] == prompt.shape[1] + tokens, out.shape
        return time.perf_counter() - t0
    timed(n)
    timed(n)
    best = (0.0, 0.0)
    for _ in range(repeats):
        one, full = timed(1), timed(n)
        best = (max(best[0], prompt.shape[1] / one), max(best[1], (n - 1) / (full - one)))
    return best


def torch_figures(model, engine, prompt_len, n, repeats, device, dtype):
    """Best prefill and decode tok/s of `repeats` runs after a warm-up (and compilation)."""
    model = model.to(device, dtype)
    model.config._attn_implementation = "sdpa"
    if engine == "generate_static":
        prompt = torch.tensor([[(i * 7919 + 11) % 1000 for i in range(prompt_len)]],
                              device=device)
        with torch.no_grad():
            return generate_figures(model, prompt, n, repeats, device)
    forward = model.forward
    if engine == "static_compiled":
        model.forward = torch.compile(forward, mode="reduce-overhead", fullgraph=True)
    prompt = torch.tensor([[(i * 7919 + 11) % 1000 for i in range(prompt_len)]], device=device)
    try:
        with torch.no_grad():
            torch_run(model, prompt, n, device)
            best = (0.0, 0.0)
            for _ in range(repeats):
                p, d = torch_run(model, prompt, n, device)
                best = (max(best[0], p), max(best[1], d))
    finally:
        model.forward = forward
    return best


def wick_figures(bench, folder, device, dtype, prompt_len, n, repeats):
    """bench_generate's prefill and decode tok/s: the CUDA graph's decode where there is one,
    else op by op."""
    cmd = [bench, "--model", folder, "--device", device.split(":")[0], "--dtype", dtype,
           "--prompt-len", str(prompt_len), "--new", str(n), "--repeats", str(repeats)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    figures = {}
    for name in ("op by op", "decode step as a CUDA graph"):
        m = re.search(r"wick \(" + re.escape(name) + r"\)\s+([\d.]+)\s+([\d.]+)", out)
        if m:
            figures[name] = (float(m.group(1)), float(m.group(2)))
    if not figures:
        raise RuntimeError("bench_generate output not understood:\n" + out)
    return figures.get("decode step as a CUDA graph", figures.get("op by op")), out


def peer_figures(folder, engine, a):
    """transformers' prefill and decode tok/s for the model in `folder`, measured in a child
    process: a peer that crashes (torch.compile has segfaulted on some torch and transformers
    versions) is reported and leaves the other engines and shapes measured. None when it
    failed."""
    cmd = [sys.executable, os.path.abspath(__file__), "--peer-child", folder, "--engines", engine,
           "--device", a.device, "--dtype", a.dtype, "--prompt-len", str(a.prompt_len),
           "--new", str(a.new), "--repeats", str(a.repeats)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"^PEER ([\d.]+) ([\d.]+)$", run.stdout, re.M)
    if run.returncode != 0 or not m:
        how = f"signal {-run.returncode}" if run.returncode < 0 else f"exit {run.returncode}"
        tail = "\n".join(run.stderr.strip().splitlines()[-5:])
        print(f"  transformers {engine:18s} failed ({how}):\n{tail}", flush=True)
        return None
    return float(m.group(1)), float(m.group(2))


def peer_child(a):
    """The child of peer_figures: loads the saved model and prints "PEER prefill decode"."""
    model = AutoModelForCausalLM.from_pretrained(a.peer_child, dtype=DTYPES[a.dtype]).eval()
    tp, td = torch_figures(model, a.engines, a.prompt_len, a.new, a.repeats, a.device,
                           DTYPES[a.dtype])
    print(f"PEER {tp:.3f} {td:.3f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default="build/bench/bench_generate")
    ap.add_argument("--shapes", default="qwen3-0.6b,gemma3-1b")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engines", default="static_compiled",
                    help="transformers engines, comma-separated: static_compiled (the peer), "
                         "generate_static (transformers' generate with a static cache, which "
                         "compiles its decode step on a GPU), static (no compile), eager")
    ap.add_argument("--keep", help="write the model folders here and keep them")
    ap.add_argument("--peer-child", metavar="FOLDER", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.peer_child:
        return peer_child(a)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("family_torch: no CUDA GPU (use --device cpu to check the script)")
    if not os.path.exists(a.bench):
        sys.exit(f"family_torch: no bench_generate at {a.bench}")
    engines = a.engines.split(",")
    root = a.keep or tempfile.mkdtemp(prefix="family_torch_")
    rows = []
    try:
        for shape in a.shapes.split(","):
            if shape not in SHAPES:
                sys.exit(f"family_torch: unknown shape {shape} (known: {', '.join(SHAPES)})")
            folder = os.path.join(root, shape)
            model = make_model(shape)
            model.to(DTYPES[a.dtype]).save_pretrained(folder, safe_serialization=True)
            print(f"{shape}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters, "
                  f"{a.dtype}, saved to {folder}", flush=True)
            (wp, wd), _ = wick_figures(a.bench, folder, a.device, a.dtype, a.prompt_len, a.new,
                                       a.repeats)
            print(f"  wick (bench_generate)           prefill {wp:10.1f} tok/s  decode "
                  f"{wd:8.1f} tok/s", flush=True)
            del model
            peer = {}
            for engine in engines:
                figures = peer_figures(folder, engine, a)
                if figures is None:
                    continue
                peer[engine] = figures
                print(f"  transformers {engine:18s} prefill {figures[0]:10.1f} tok/s  decode "
                      f"{figures[1]:8.1f} tok/s", flush=True)
            rows.append((shape, wd, peer))
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    device = torch.cuda.get_device_name() if a.device.startswith("cuda") else "CPU"
    print(f"\n{device}, {a.dtype}, prompt {a.prompt_len}, {a.new} new tokens, best of "
          f"{a.repeats}; torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"{'shape':>12} {'wick tok/s':>11} " +
          " ".join(f"{e + ' tok/s':>22} {'wick/' + e:>22}" for e in engines))
    failed = False
    for shape, wd, peer in rows:
        print(f"{shape:>12} {wd:11.1f} " +
              " ".join(f"{peer[e][1]:22.1f} {wd / peer[e][1]:21.2f}x" if e in peer else
                       f"{'failed':>22} {'-':>22}" for e in engines))
        # The RESULT line compares with the first engine that ran, and names it.
        ran = [e for e in engines if e in peer]
        failed |= len(ran) < len(engines)
        if ran:
            e = ran[0]
            print(f"RESULT family_torch_{shape.replace('-', '_').replace('.', '_')}_decode_tps "
                  f"wick {wd:.1f} torch_{e} {peer[e][1]:.1f} ratio {wd / peer[e][1]:.2f}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
