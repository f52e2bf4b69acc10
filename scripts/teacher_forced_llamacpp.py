#!/usr/bin/env python3
"""Teacher-forced top-1 agreement and perplexity over the first N tokens of several texts: wick's
quantized model (16-bit, 8-bit and f32 activations) and llama.cpp (llama-cpp-python, same GGUF file), each
against wick's dequantised f32 model. The ids come from llama.cpp's tokenizer and go to
wick-generate through --prompt-ids, so every engine sees the same tokens.

    python3 scripts/teacher_forced_llamacpp.py --model SmolLM2-135M-Instruct.Q4_1.gguf \
        --generate build/tools/wick-generate README.md docs/NUMERICS.md ...
"""
import argparse
import os
import subprocess
import tempfile

import numpy as np


def wick_logits(generate, model, ids, env_extra, flags, vocab, tmp):
    out = os.path.join(tmp, "logits.f32")
    env = dict(os.environ, **env_extra)
    subprocess.run([generate, model, "--prompt-ids", ",".join(map(str, ids)), "--max-new", "0",
                    "-q", "--logits-out", out] + flags, env=env, check=True,
                   capture_output=True)
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), vocab)


def compare(logits, ref, ids):
    """Agreement of argmaxes with ref, and both perplexities of ids[1:]."""
    def ppl(lg):
        lg = lg[:-1].astype(np.float64)
        mx = lg.max(axis=1, keepdims=True)
        lse = mx[:, 0] + np.log(np.exp(lg - mx).sum(axis=1))
        return float(np.exp(np.mean(lse - lg[np.arange(len(lg)), ids[1:]])))
    same = np.mean(logits[:-1].argmax(1) == ref[:-1].argmax(1))
    return float(same), ppl(logits), ppl(ref)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--generate", default="build/tools/wick-generate")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("texts", nargs="+")
    a = ap.parse_args()
    from llama_cpp import Llama

    llm = Llama(model_path=a.model, n_ctx=a.tokens + 8, n_batch=a.tokens, n_ubatch=a.tokens,
                logits_all=True, verbose=False)
    vocab = llm.n_vocab()
    engines = [(f"wick {a} act", {"WICK_QMATMUL_ACTIVATIONS": a}, []) for a in ("int16", "int8", "f32")]
    print(f"{'text':24s} {'engine':14s} {'top-1':>7s} {'ppl':>9s} {'ppl f32':>9s} {'ratio':>7s}")
    with tempfile.TemporaryDirectory() as tmp:
        for path in a.texts:
            with open(path, encoding="utf-8", errors="replace") as f:
                ids = llm.tokenize(f.read().encode(), add_bos=False)[: a.tokens]
            if len(ids) < a.tokens:
                raise SystemExit(f"{path}: only {len(ids)} tokens")
            ids = np.array(ids)
            ref = wick_logits(a.generate, a.model, ids, {}, ["--dequantize"], vocab, tmp)
            rows = []
            for name, env, flags in engines:
                rows.append((name, wick_logits(a.generate, a.model, ids, env, flags, vocab, tmp)))
            if not a.no_llamacpp:
                llm.reset()
                llm.eval(ids.tolist())
                rows.append(("llama.cpp", np.array(llm.scores[: len(ids)], dtype=np.float32)))
            for name, lg in rows:
                agree, p, pr = compare(lg, ref, ids)
                print(f"{os.path.basename(path)[:24]:24s} {name:14s} {100 * agree:6.2f}% "
                      f"{p:9.4f} {pr:9.4f} {p / pr:7.4f}", flush=True)


if __name__ == "__main__":
    main()
