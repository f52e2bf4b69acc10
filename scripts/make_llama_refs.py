#!/usr/bin/env python3
"""References for wick's Llama-family models, made by Hugging Face transformers.

  make_llama_refs.py tiny [--out tests/data/llama]
      Tiny seeded LlamaForCausalLM and Qwen2ForCausalLM (config.json + model.safetensors) and
      their f32 logits for a fixed prompt and 16 greedy tokens (.npy): small, committed; the C++
      tests read them without Python.
  make_llama_refs.py smollm2 GGUF [--out tests/data/llama]
      SmolLM2-135M-Instruct from its GGUF file, dequantised with the `gguf` package, q/k rows
      un-permuted, loaded into LlamaForCausalLM: 64 greedy tokens for fixed prompts (JSON).
  make_llama_refs.py build SHAPE DIR [--seed S]
      A random model of a real shape (llama1b, qwen05b, smollm2) saved as a HF folder (f32).

Seeds are fixed so that the files are reproducible.
"""

import argparse
import json
import os
import sys

import numpy as np

TINY_PROMPT = [3, 17, 42, 5, 9, 33, 1, 58, 20, 11, 7, 90]

SHAPES = {
    # Llama-3.2-1B: d 2048, 16 layers, 32/8 heads, vocab 128256, llama3 rope scaling, tied.
    "llama1b": dict(model_type="llama", hidden_size=2048, intermediate_size=8192,
                    num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                    head_dim=64, vocab_size=128256, rms_norm_eps=1e-5, rope_theta=500000.0,
                    max_position_embeddings=131072, tie_word_embeddings=True,
                    rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192},
                    bos_token_id=128000, eos_token_id=128001),
    # Qwen2-0.5B: d 896, 24 layers, 14/2 heads, vocab 151936, q/k/v bias, tied.
    "qwen05b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864,
                    num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                    vocab_size=151936, rms_norm_eps=1e-6, rope_theta=1000000.0,
                    max_position_embeddings=32768, tie_word_embeddings=True,
                    bos_token_id=151643, eos_token_id=151643),
    # SmolLM2-135M: d 576, 30 layers, 9/3 heads, vocab 49152, tied.
    "smollm2": dict(model_type="llama", hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    vocab_size=49152, rms_norm_eps=1e-5, rope_theta=100000.0,
                    max_position_embeddings=8192, tie_word_embeddings=True,
                    bos_token_id=1, eos_token_id=2),
}


def make_model(cfg_dict, seed, init_std=0.02):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg_dict = dict(cfg_dict)
    model_type = cfg_dict.pop("model_type")
    cfg = AutoConfig.for_model(model_type, **cfg_dict)
    cfg.initializer_range = init_std
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    # Norm weights near 1 but not exactly (so a missing weight shows).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return model.eval()


def save_folder(model, out_dir):
    from safetensors.torch import save_file
    os.makedirs(out_dir, exist_ok=True)
    model.config.to_json_file(os.path.join(out_dir, "config.json"))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})


def greedy(model, ids, n):
    """Plain argmax of the last position, n times (no eos handling, no logits processors)."""
    import torch
    seq = list(ids)
    past = None
    with torch.no_grad():
        out = model(torch.tensor([seq]), use_cache=True)
        for _ in range(n):
            nxt = int(out.logits[0, -1].argmax())
            seq.append(nxt)
            out = model(torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True)
    return seq[len(ids):]


def cmd_tiny(args):
    import torch
    tiny = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=96, rms_norm_eps=1e-5, rope_theta=10000.0,
                max_position_embeddings=64, bos_token_id=1, eos_token_id=2)
    variants = {
        "tiny_llama": dict(tiny, model_type="llama", tie_word_embeddings=False),
        "tiny_qwen2": dict(tiny, model_type="qwen2", tie_word_embeddings=True),
        "tiny_llama3_scaled": dict(tiny, model_type="llama", tie_word_embeddings=False,
                                   rope_theta=500000.0,
                                   rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                 "original_max_position_embeddings": 16}),
    }
    for i, (name, cfg) in enumerate(variants.items()):
        model = make_model(cfg, seed=1234 + i, init_std=0.2)
        d = os.path.join(args.out, name)
        save_folder(model, d)
        with torch.no_grad():
            logits = model(torch.tensor([TINY_PROMPT])).logits[0].double().numpy()
        np.save(os.path.join(d, "logits.npy"), logits.astype(np.float32))
        toks = greedy(model, TINY_PROMPT, 16)
        np.save(os.path.join(d, "greedy.npy"), np.array(toks, dtype=np.int64))
        np.save(os.path.join(d, "prompt.npy"), np.array(TINY_PROMPT, dtype=np.int64))
        print(name, "logit range", float(logits.max() - logits.min()), "greedy", toks)


def gguf_to_state(path):
    """Dequantised tensors under HF names, q/k rows un-permuted; and the config."""
    import gguf
    r = gguf.GGUFReader(path)

    def field(key):
        f = r.fields[key]
        v = f.parts[f.data[0]]
        return v.tolist()[0] if hasattr(v, "tolist") and len(v) == 1 else v

    n_head = int(field("llama.attention.head_count"))
    n_kv = int(field("llama.attention.head_count_kv"))
    cfg = dict(model_type="llama", hidden_size=int(field("llama.embedding_length")),
               intermediate_size=int(field("llama.feed_forward_length")),
               num_hidden_layers=int(field("llama.block_count")),
               num_attention_heads=n_head, num_key_value_heads=n_kv,
               rms_norm_eps=float(field("llama.attention.layer_norm_rms_epsilon")),
               rope_theta=float(field("llama.rope.freq_base")),
               max_position_embeddings=int(field("llama.context_length")),
               bos_token_id=int(field("tokenizer.ggml.bos_token_id")),
               eos_token_id=int(field("tokenizer.ggml.eos_token_id")))
    names = {"token_embd.weight": "model.embed_tokens.weight",
             "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
    per_layer = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                 "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                 "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                 "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    state = {}
    for t in r.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = [int(x) for x in reversed(t.shape.tolist())]
        w = w.reshape(shape)
        if t.name in names:
            hf = names[t.name]
        else:
            _, i, part, kind = t.name.split(".")
            hf = f"model.layers.{i}.{per_layer[part]}.{kind}"
        if t.name.endswith("attn_q.weight") or t.name.endswith("attn_k.weight"):
            heads = n_head if "attn_q" in t.name else n_kv
            out, inp = w.shape
            w = w.reshape(heads, out // heads // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)
        state[hf] = w
    cfg["vocab_size"] = state["model.embed_tokens.weight"].shape[0]
    cfg["tie_word_embeddings"] = "lm_head.weight" not in state
    return cfg, state


SMOL_PROMPTS = [
    [1, 504, 3575, 282, 4649, 314],  # placeholder ids when no tokenizer is at hand
]


def cmd_smollm2(args):
    import torch
    from transformers import AutoConfig, LlamaForCausalLM
    cfg, state = gguf_to_state(args.gguf)
    c = dict(cfg)
    c.pop("model_type")
    config = AutoConfig.for_model("llama", **c)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).eval()
    sd = {k: torch.from_numpy(v) for k, v in state.items()}
    if cfg["tie_word_embeddings"]:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if "rotary" not in m]
    assert not missing and not unexpected, (missing, unexpected)
    prompts = json.loads(args.prompts) if args.prompts else None
    if prompts is None:
        try:
            from transformers import AutoTokenizer
            tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(args.gguf)),
                                                gguf_file=os.path.basename(args.gguf))
            texts = ["The capital of France is", "def fibonacci(n):",
                     "Once upon a time, in a small village,", "The three primary colors are",
                     "Water boils at"]
            prompts = [tok(t)["input_ids"] for t in texts]
        except Exception as e:  # no tokenizer support: fixed ids
            print("tokenizer unavailable (", e, "): fixed prompt ids", file=sys.stderr)
            prompts = SMOL_PROMPTS
    rows = []
    for ids in prompts:
        toks = greedy(model, ids, 64)
        rows.append({"prompt_ids": ids, "greedy": toks})
        print(ids, "->", toks[:16], "...")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "smollm2_greedy.json"), "w") as f:
        json.dump({"model": os.path.basename(args.gguf), "dtype": "f32 (dequantised)",
                   "rows": rows}, f, indent=1)


def cmd_build(args):
    model = make_model(SHAPES[args.shape], seed=args.seed)
    save_folder(model, args.dir)
    print("saved", args.shape, "to", args.dir)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tiny")
    t.add_argument("--out", default="tests/data/llama")
    s = sub.add_parser("smollm2")
    s.add_argument("gguf")
    s.add_argument("--out", default="tests/data/llama")
    s.add_argument("--prompts", help="JSON list of prompt id lists")
    b = sub.add_parser("build")
    b.add_argument("shape", choices=sorted(SHAPES))
    b.add_argument("dir")
    b.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    {"tiny": cmd_tiny, "smollm2": cmd_smollm2, "build": cmd_build}[args.cmd](args)


if __name__ == "__main__":
    main()
