#!/usr/bin/env python3
"""References for the decoder families of load_causal_lm (tests/test_families.cpp).

  make_family_refs.py [--out tests/data/families]

For each family (qwen3, mistral, phi3, gemma2, gemma3_text, and Phi-3 with partial rotary:
phi3_partial, phi3_partial_longrope) a tiny random model with seeded weights is built by
transformers itself (hidden 32, 2-3 layers, vocabulary 96, a sliding window of
8 where the family has one, Gemma's soft-caps on) and saved as a model folder (config.json and f32
model.safetensors), with:
  prompt.npy   (2, 12) token ids: two 12-token prompts, so that a window of 8 is exceeded
  logits.npy   (2, 12, vocab) f32 logits of the batch of both prompts in one forward (eager)
  logits_bf16.npy  the same from the model in bf16 (its bf16 logits as f32)
  greedy.npy   10 greedy tokens after the first prompt (plain argmax with the KV cache)
and, for the families llama.cpp names (qwen3, gemma2, gemma3, phi3; Mistral is its llama),
model.gguf: the same weights (f32) under the tensor names and metadata llama.cpp's
convert_hf_to_gguf.py writes (Gemma's norm weights stored as 1 + w, Phi-3's rope factors as
tensors, Mistral's q and k rows permuted for interleaved rope as llama's are), and Mistral's window
as llama.attention.sliding_window (gguf's key; llama.cpp's converter leaves it out).

  make_family_refs.py --gguf-only mistral

rewrites only that family's model.gguf, from its committed folder, and

  make_family_refs.py --only phi3_partial

makes only that family's folder (the seeds are per family, so the others' stay as committed).
phi3_partial_longrope's config.json is rewritten in Phi-4-mini's style (partial_rotary_factor at
the top level, rope_scaling instead of rope_parameters), checked to load to the same logits.
Needs torch, transformers (5.x) and gguf (/work/main/.whl/gguf-0.19.0-py3-none-any.whl).
"""

import argparse
import os

import numpy as np

PROMPTS = [[1, 17, 42, 5, 88, 23, 61, 9, 30, 74, 12, 50],
           [1, 8, 93, 44, 2, 67, 15, 38, 81, 26, 59, 3]]
GREEDY_TOKENS = 10

TINY = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, vocab_size=96, rms_norm_eps=1e-5,
            max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)

FAMILIES = {
    "qwen3": dict(TINY, model_type="qwen3", tie_word_embeddings=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "mistral": dict(TINY, model_type="mistral", tie_word_embeddings=False, sliding_window=8,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    # Long-rope: the cache (and the prompt) exceed original_max_position_embeddings, so the long
    # factors and the attention factor sqrt(1 + ln 8 / ln 8) are in use.
    "phi3": dict(TINY, model_type="phi3", tie_word_embeddings=False, sliding_window=8,
                 original_max_position_embeddings=8,
                 rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                  "short_factor": [1.0, 1.3, 1.9, 2.6],
                                  "long_factor": [1.1, 2.2, 3.5, 5.0],
                                  "original_max_position_embeddings": 8}),
    "gemma2": dict(TINY, model_type="gemma2", tie_word_embeddings=True, sliding_window=8,
                   query_pre_attn_scalar=16, attn_logit_softcapping=5.0,
                   final_logit_softcapping=3.0, hidden_activation="gelu_pytorch_tanh",
                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "gemma3_text": dict(TINY, model_type="gemma3_text", tie_word_embeddings=True,
                        num_hidden_layers=3, sliding_window=8, query_pre_attn_scalar=8,
                        hidden_activation="gelu_pytorch_tanh",
                        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                        rope_parameters={
                            "full_attention": {"rope_type": "linear", "factor": 2.0,
                                               "rope_theta": 1000000.0},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                        }),
    # Partial rotary: rope on the first int(8 * f) dims of each head, the rest passing through.
    "phi3_partial": dict(TINY, model_type="phi3", tie_word_embeddings=False, sliding_window=8,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                          "partial_rotary_factor": 0.5}),
    # Phi-4-mini's layout: long-rope over 6 of 8 dims (3 factors each), no window.
    "phi3_partial_longrope": dict(TINY, model_type="phi3", tie_word_embeddings=False,
                                  original_max_position_embeddings=8,
                                  rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                   "partial_rotary_factor": 0.75,
                                                   "short_factor": [1.0, 1.4, 2.1],
                                                   "long_factor": [1.2, 2.5, 4.0],
                                                   "original_max_position_embeddings": 8}),
}


def make_model(cfg_dict, seed):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg_dict = dict(cfg_dict)
    model_type = cfg_dict.pop("model_type")
    cfg = AutoConfig.for_model(model_type, **cfg_dict)
    cfg.initializer_range = 0.2
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    gemma = model_type.startswith("gemma")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                # Near the identity but not exactly (Gemma's norms multiply by 1 + w).
                base = 0.0 if gemma else 1.0
                p.copy_(base + 0.1 * torch.randn_like(p))
    return model.eval()


def save_folder(model, out_dir):
    from safetensors.torch import save_file
    os.makedirs(out_dir, exist_ok=True)
    model.config.to_json_file(os.path.join(out_dir, "config.json"))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})


def phi4_mini_style_config(d, logits):
    """Rewrites d/config.json as Phi-4-mini's: partial_rotary_factor at the top level and the
    rope object as rope_scaling (transformers 4's name); checks transformers reads it the same."""
    import json
    import torch
    from transformers import AutoModelForCausalLM
    path = os.path.join(d, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    rope = cfg.pop("rope_parameters")
    cfg["partial_rotary_factor"] = rope.pop("partial_rotary_factor")
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = rope
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    again = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    assert again.config.rope_parameters["partial_rotary_factor"] == 0.75
    with torch.no_grad():
        same = again(torch.tensor(PROMPTS)).logits.double().numpy()
    assert np.array_equal(same, logits), "the rewritten config reads differently"


def greedy(model, ids, n):
    """Plain argmax of the last position, n times, with the model's own cache."""
    import torch
    seq = list(ids)
    with torch.no_grad():
        out = model(torch.tensor([seq]), use_cache=True)
        for _ in range(n):
            nxt = int(out.logits[0, -1].argmax())
            seq.append(nxt)
            out = model(torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True)
    return seq[len(ids):]


# ---- GGUF, as llama.cpp's convert_hf_to_gguf.py writes these families ----

def write_gguf(model, family, path):
    import gguf
    cfg = model.config
    arch = {"qwen3": "qwen3", "gemma2": "gemma2", "gemma3_text": "gemma3", "phi3": "phi3",
            "mistral": "llama"}[model.config.model_type]
    gemma = arch.startswith("gemma")
    w = gguf.GGUFWriter(path, arch)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if arch != "phi3":  # llama.cpp's Phi-3 converter writes the rotated dims only
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)
    rope = cfg.rope_parameters
    if arch == "gemma3":
        w.add_rope_freq_base(rope["full_attention"]["rope_theta"])
        w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["full_attention"]["factor"])
        w.add_sliding_window(cfg.sliding_window)
        w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg.layer_types])
    else:
        w.add_rope_freq_base(rope["rope_theta"])
    if arch == "gemma2":
        # llama.cpp derives the score scale from head_dim; the tiny model's
        # query_pre_attn_scalar differs, so the file states it (llama.cpp's attention.scale key).
        w.add_attention_scale(cfg.query_pre_attn_scalar ** -0.5)
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
        w.add_sliding_window(cfg.sliding_window)
    if arch == "llama":
        w.add_rope_dimension_count(cfg.head_dim)
        w.add_vocab_size(cfg.vocab_size)
        w.add_sliding_window(cfg.sliding_window)
    if arch == "phi3":
        # As llama.cpp: int(factor * hidden) // heads rotated dims; window 0 for none.
        w.add_rope_dimension_count(int(rope.get("partial_rotary_factor", 1.0) * cfg.hidden_size)
                                   // cfg.num_attention_heads)
        w.add_sliding_window(cfg.sliding_window or 0)
        if rope["rope_type"] == "longrope":
            w.add_rope_scaling_attn_factors(
                float(np.sqrt(1 + np.log(cfg.max_position_embeddings /
                                         rope["original_max_position_embeddings"]) /
                              np.log(rope["original_max_position_embeddings"]))))
            w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])

    def t(name, tensor):
        w.add_tensor(name, tensor.detach().float().numpy().astype(np.float32))

    state = dict(model.state_dict())
    t("token_embd.weight", state["model.embed_tokens.weight"])
    norm = state["model.norm.weight"]
    t("output_norm.weight", norm + 1 if gemma else norm)
    if not cfg.tie_word_embeddings:
        t("output.weight", state["lm_head.weight"])
    if arch == "phi3" and rope["rope_type"] == "longrope":
        t("rope_factors_long.weight", __import__("torch").tensor(rope["long_factor"]))
        t("rope_factors_short.weight", __import__("torch").tensor(rope["short_factor"]))
    names = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "post_attention_norm" if gemma else "ffn_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "self_attn.qkv_proj": "attn_qkv",
        "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
        "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
        "mlp.gate_up_proj": "ffn_up",
    }
    def permute(v, heads):
        # llama.cpp's LlamaModel.permute: rows (heads, 2, head_dim / 2) as (heads, head_dim / 2, 2).
        return v.reshape(heads, 2, v.shape[0] // heads // 2, *v.shape[1:]).swapaxes(1, 2) \
                .reshape(v.shape)

    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        for hf, gg in names.items():
            key = p + hf + ".weight"
            if key not in state:
                continue
            v = state[key]
            if gemma and hf.endswith("norm"):
                v = v + 1
            if arch == "llama" and hf == "self_attn.q_proj":
                v = permute(v, cfg.num_attention_heads)
            if arch == "llama" and hf == "self_attn.k_proj":
                v = permute(v, cfg.num_key_value_heads)
            t(f"blk.{i}.{gg}.weight", v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                  "data", "families"))
    ap.add_argument("--gguf-only", metavar="FAMILY")
    ap.add_argument("--only", metavar="FAMILY", action="append")
    args = ap.parse_args()
    if args.gguf_only:
        from transformers import AutoModelForCausalLM
        d = os.path.join(args.out, args.gguf_only)
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        write_gguf(model, args.gguf_only, os.path.join(d, "model.gguf"))
        return
    for i, (family, cfg) in enumerate(FAMILIES.items()):
        if args.only and family not in args.only:
            continue
        model = make_model(cfg, seed=5000 + i)
        d = os.path.join(args.out, family)
        save_folder(model, d)
        with torch.no_grad():
            logits = model(torch.tensor(PROMPTS)).logits.double().numpy()
        if family == "phi3_partial_longrope":
            phi4_mini_style_config(d, logits)
        np.save(os.path.join(d, "logits.npy"), logits.astype(np.float32))
        # The same folder loaded by transformers in bf16 (from_pretrained keeps the rotary
        # frequencies f32, where .to(bfloat16) would round them).
        from transformers import AutoModelForCausalLM
        half = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16,
                                                    attn_implementation="eager").eval()
        with torch.no_grad():
            logits_bf16 = half(torch.tensor(PROMPTS)).logits.float().numpy()
        np.save(os.path.join(d, "logits_bf16.npy"), logits_bf16.astype(np.float32))
        np.save(os.path.join(d, "prompt.npy"), np.array(PROMPTS, dtype=np.int64))
        toks = greedy(model, PROMPTS[0], GREEDY_TOKENS)
        np.save(os.path.join(d, "greedy.npy"), np.array(toks, dtype=np.int64))
        write_gguf(model, family, os.path.join(d, "model.gguf"))
        print(family, "logit range", float(logits.max() - logits.min()), "greedy", toks)


if __name__ == "__main__":
    main()
