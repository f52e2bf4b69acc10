#!/usr/bin/env python3
"""A GGUF file of a Llama-shaped model with random weights N(0, 0.02), its matrices quantized by
the `gguf` package (gguf.quants.quantize): for decode benchmarks of quantized weights where no
real checkpoint can be fetched (the GPU machine).

    python3 scripts/make_random_gguf.py --shape smollm2 --type q4_1 -o /tmp/smollm2-q4_1.gguf
    python3 scripts/make_random_gguf.py --shape llama1b --type q4_0 -o /tmp/llama1b-q4_0.gguf
    python3 scripts/make_random_gguf.py --shape qwen3_06b --type q4_0 -o /tmp/qwen3-q4_0.gguf

qwen3_06b is architecture qwen3 (per-head q/k norms, head_dim 128 apart from hidden / heads).
"""
import argparse

import numpy as np
import gguf

SHAPES = {
    # vocab, hidden, intermediate, layers, heads, kv heads, rope theta, eps
    "smollm2": (49152, 576, 1536, 30, 9, 3, 100000.0, 1e-5),
    "llama1b": (128256, 2048, 8192, 16, 32, 8, 500000.0, 1e-5),
    "qwen3_06b": (151936, 1024, 3072, 28, 16, 8, 1000000.0, 1e-6),
}
HEAD_DIM = {"qwen3_06b": 128}
ARCH = {"qwen3_06b": "qwen3"}
TYPES = {
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
    "q4_1": gguf.GGMLQuantizationType.Q4_1,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q5_0": gguf.GGMLQuantizationType.Q5_0,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=SHAPES, required=True)
    ap.add_argument("--type", choices=TYPES, default="q4_0", help="type of the layer matrices")
    ap.add_argument("--embed-type", choices=TYPES, default="q8_0",
                    help="type of the (tied) token embedding / output head")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    vocab, d, inter, layers, heads, kv, theta, eps = SHAPES[a.shape]
    hd = HEAD_DIM.get(a.shape, d // heads)
    arch = ARCH.get(a.shape, "llama")
    rng = np.random.default_rng(a.seed)
    w = gguf.GGUFWriter(a.output, arch)
    w.add_context_length(8192)
    w.add_embedding_length(d)
    w.add_feed_forward_length(inter)
    w.add_block_count(layers)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(hd)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(eps)
    w.add_vocab_size(vocab)
    if arch != "llama":
        w.add_tokenizer_model("none")  # no vocabulary: llama.cpp loads it for prompt ids alone

    def mat(name, rows, cols, qtype):
        x = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float32)
        w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)

    def norm(name, n=d):
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    t, te = TYPES[a.type], TYPES[a.embed_type]
    mat("token_embd.weight", vocab, d, te)
    norm("output_norm.weight")
    for i in range(layers):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight")
        norm(p + "ffn_norm.weight")
        if arch == "qwen3":
            norm(p + "attn_q_norm.weight", hd)
            norm(p + "attn_k_norm.weight", hd)
        mat(p + "attn_q.weight", heads * hd, d, t)
        mat(p + "attn_k.weight", kv * hd, d, t)
        mat(p + "attn_v.weight", kv * hd, d, t)
        mat(p + "attn_output.weight", d, heads * hd, t)
        mat(p + "ffn_gate.weight", inter, d, t)
        mat(p + "ffn_up.weight", inter, d, t)
        mat(p + "ffn_down.weight", d, inter, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.output}: {a.shape}, layers {a.type}, embedding {a.embed_type}")


if __name__ == "__main__":
    main()
