#!/usr/bin/env python3
"""A GGUF file of a model with random weights N(0, 0.02) in a real model's shape, its matrices
quantized by the `gguf` package (gguf.quants.quantize): for decode benchmarks of quantized weights
where no real checkpoint can be fetched. Llama shapes (architecture llama), Qwen3 (qwen3: per-head
q/k norms) and Gemma 3 text (gemma3: norms stored as 1 + w, pre and post norms, sliding windows),
under the tensor names and metadata llama.cpp's convert_hf_to_gguf.py writes. A byte-level
vocabulary of the shape's size (tokenizer.ggml.*) is written so that llama.cpp loads the file.

    python3 scripts/make_random_gguf.py --shape smollm2 --type q4_1 -o /tmp/smollm2-q4_1.gguf
    python3 scripts/make_random_gguf.py --shape llama1b --type q4_0 -o /tmp/llama1b-q4_0.gguf
    python3 scripts/make_random_gguf.py --shape qwen3-0.6b --type q4_0 -o /tmp/qwen3-q4_0.gguf
    python3 scripts/make_random_gguf.py --shape gemma3-1b --type q4_0 -o /tmp/gemma3-q4_0.gguf
"""
import argparse
from dataclasses import dataclass, field

import numpy as np
import gguf


@dataclass
class Shape:
    arch: str
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    rope_theta: float
    eps: float
    head_dim: int = 0  # 0: hidden / heads
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm of each head's q and k
    extra: dict = field(default_factory=dict)  # architecture-specific metadata

    def hd(self):
        return self.head_dim or self.hidden // self.heads


SHAPES = {
    "smollm2": Shape("llama", 49152, 576, 1536, 30, 9, 3, 100000.0, 1e-5),
    "llama1b": Shape("llama", 128256, 2048, 8192, 16, 32, 8, 500000.0, 1e-5),
    # Qwen/Qwen3-0.6B's config.json: tied embeddings, head_dim 128 (q is 2048 wide).
    "qwen3-0.6b": Shape("qwen3", 151936, 1024, 3072, 28, 16, 8, 1000000.0, 1e-6, head_dim=128,
                        qk_norm=True),
    # google/gemma-3-1b-it's config.json: 5 local layers (window 512, rope base 10000) to each
    # global one (base 1e6), query_pre_attn_scalar 256, tied embeddings.
    "gemma3-1b": Shape("gemma3", 262144, 1152, 6912, 26, 4, 1, 1000000.0, 1e-6, head_dim=256,
                       qk_norm=True, extra={"sliding_window": 512, "rope_local": 10000.0,
                                            "pattern": 6}),
    # Tiny shapes of the same architectures, for checking the scripts (the benchmarks' prompt
    # ids go up to 999).
    "qwen3-tiny": Shape("qwen3", 1024, 64, 128, 2, 4, 2, 1000000.0, 1e-6, head_dim=32,
                        qk_norm=True),
    "gemma3-tiny": Shape("gemma3", 1024, 64, 128, 3, 2, 1, 1000000.0, 1e-6, head_dim=32,
                         qk_norm=True, extra={"sliding_window": 8, "rope_local": 10000.0,
                                              "pattern": 3}),
}
TYPES = {
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
    "q4_1": gguf.GGMLQuantizationType.Q4_1,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q5_0": gguf.GGMLQuantizationType.Q5_0,
    "f16": gguf.GGMLQuantizationType.F16,
    "f32": gguf.GGMLQuantizationType.F32,
}


def byte_vocab(n):
    """n tokens: GPT-2's 256 byte characters, "ab" (the one merge), filler words, and last
    <|bos|> <|eos|>."""
    chars = []
    for b in range(256):
        if b < 33 or 126 < b < 161 or b == 173:
            k = sum(1 for x in range(b) if x < 33 or 126 < x < 161 or x == 173)
            chars.append(chr(256 + k))
        else:
            chars.append(chr(b))
    tokens = chars + ["ab"] + [f"w{i}" for i in range(257, n - 2)] + ["<|bos|>", "<|eos|>"]
    types = [1] * (n - 2) + [3, 3]  # byte-level BPE files mark the byte tokens normal
    return tokens[:n], types[:n]


def write(shape, qtype, embed_type, output, seed=0):
    s = shape
    hd = s.hd()
    gemma = s.arch == "gemma3"
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(output, s.arch)
    w.add_context_length(8192 if s.arch == "llama" else 32768)
    w.add_embedding_length(s.hidden)
    w.add_feed_forward_length(s.intermediate)
    w.add_block_count(s.layers)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(s.eps)
    w.add_vocab_size(s.vocab)
    if s.arch == "llama":
        w.add_rope_dimension_count(hd)
    else:
        w.add_key_length(hd)
        w.add_value_length(hd)
    if gemma:
        w.add_sliding_window(s.extra["sliding_window"])
        w.add_rope_freq_base_swa(s.extra["rope_local"])
        p = s.extra["pattern"]
        w.add_sliding_window_pattern([(i + 1) % p != 0 for i in range(s.layers)])
        w.add_attention_scale(hd ** -0.5)  # query_pre_attn_scalar = head_dim
    tokens, types = byte_vocab(s.vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if s.arch == "qwen3" else "default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["a b"])
    w.add_bos_token_id(s.vocab - 2)
    w.add_eos_token_id(s.vocab - 1)

    def mat(name, rows, cols, t):
        x = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float32)
        if t in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            w.add_tensor(name, x.astype(np.float16 if t == gguf.GGMLQuantizationType.F16
                                        else np.float32))
        else:
            w.add_tensor(name, gguf.quants.quantize(x, t), raw_dtype=t)

    def norm(name, n):
        # Gemma's converter stores 1 + w; the weights of these random models are w = 0.
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    t, te = TYPES[qtype], TYPES[embed_type]
    mat("token_embd.weight", s.vocab, s.hidden, te)
    norm("output_norm.weight", s.hidden)
    for i in range(s.layers):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", s.hidden)
        norm(p + "ffn_norm.weight", s.hidden)
        if gemma:
            norm(p + "post_attention_norm.weight", s.hidden)
            norm(p + "post_ffw_norm.weight", s.hidden)
        if s.qk_norm:
            norm(p + "attn_q_norm.weight", hd)
            norm(p + "attn_k_norm.weight", hd)
        mat(p + "attn_q.weight", s.heads * hd, s.hidden, t)
        mat(p + "attn_k.weight", s.kv_heads * hd, s.hidden, t)
        mat(p + "attn_v.weight", s.kv_heads * hd, s.hidden, t)
        mat(p + "attn_output.weight", s.hidden, s.heads * hd, t)
        mat(p + "ffn_gate.weight", s.intermediate, s.hidden, t)
        mat(p + "ffn_up.weight", s.intermediate, s.hidden, t)
        mat(p + "ffn_down.weight", s.hidden, s.intermediate, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=SHAPES, required=True)
    ap.add_argument("--type", choices=TYPES, default="q4_0", help="type of the layer matrices")
    ap.add_argument("--embed-type", choices=TYPES, default="q8_0",
                    help="type of the (tied) token embedding / output head")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    write(SHAPES[a.shape], a.type, a.embed_type, a.output, a.seed)
    print(f"wrote {a.output}: {a.shape}, layers {a.type}, embedding {a.embed_type}")


if __name__ == "__main__":
    main()
