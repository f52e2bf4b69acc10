#!/usr/bin/env python3
"""Sentence-embedding throughput: wick (bench/bench_embed) beside sentence-transformers, in the
same run, on the same 10,000 sentences of mixed length, batch 128.

    bench/embed_peer.py MODEL_DIR [--wick build/bench/bench_embed] [--device cpu|cuda]
                        [--dtype f32|bf16|f16] [--n 10000] [--batch 128] [--runs 1]

Prints both figures, the ratio wick / sentence-transformers, and the worst cosine between the two
programs' embeddings (both must compute the same thing). Without torch only wick's figure is
printed.
"""

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

WORDS = (
    "the a of and to in is was for on that with as by at from it this be are or an which "
    "search embedding vector model sentence token query document retrieval semantic index "
    "café naïve résumé Zürich São Paulo Québec über straße 東京 北京 서울 🚀 🎉 😀 "
    "computer science language learning network neural training data weather river mountain "
    "music guitar violin orchestra kitchen recipe chocolate coffee morning evening yesterday "
    "government economy market price inflation bank interest rate growth election policy "
    "football match goal player coach season stadium city village street house garden tree "
    "2024 3.14 100% $5 #tag @user e-mail co-operate don't it's can't (note) [ref] {x} ... !? --"
).split()


def make_sentences(n, seed=2024):
    """Mixed lengths: mostly short queries, some paragraphs, a few past the 256-token limit."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.5:
            k = rng.randint(3, 15)
        elif r < 0.85:
            k = rng.randint(16, 60)
        elif r < 0.97:
            k = rng.randint(61, 150)
        else:
            k = rng.randint(151, 300)
        words = [rng.choice(WORDS) for _ in range(k)]
        words[0] = words[0].capitalize()
        out.append(" ".join(words) + rng.choice([".", "!", "?", ""]))
    return out


def run_peer(model_dir, sentences, device, dtype, batch, runs):
    import torch
    from sentence_transformers import SentenceTransformer
    torch.set_num_threads(os.cpu_count())
    model = SentenceTransformer(model_dir, device=device)
    if dtype != "f32":
        model = model.to({"bf16": torch.bfloat16, "f16": torch.float16}[dtype])
    model.eval()

    def encode(texts):
        with torch.inference_mode():
            e = model.encode(texts, batch_size=batch, convert_to_tensor=True,
                             show_progress_bar=False)
        return e.float().cpu().numpy()  # read back, as wick's benchmark does

    encode(sentences[: 2 * batch])  # warm-up
    secs, emb = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        emb = encode(sentences)
        secs.append(time.perf_counter() - t0)
    secs.sort()
    med = secs[len(secs) // 2]
    return len(sentences) / med, med, emb, torch.__version__


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--wick", default=os.path.join(os.path.dirname(__file__), "..", "build",
                                                   "bench", "bench_embed"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16"])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()

    sentences = make_sentences(args.n)
    with tempfile.TemporaryDirectory() as tmp:
        text_file = os.path.join(tmp, "sentences.txt")
        with open(text_file, "w", encoding="utf-8") as f:
            f.write("\n".join(sentences) + "\n")
        npy_file = os.path.join(tmp, "wick.npy")
        cmd = [args.wick, args.model_dir, text_file, "--device", args.device, "--dtype",
               args.dtype, "--batch", str(args.batch), "--runs", str(args.runs), "--output",
               npy_file]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            sys.exit(f"embed_peer: {' '.join(cmd)} failed ({proc.returncode})")
        wick_rate = float(re.search(r"WICK_SENTENCES_PER_S ([0-9.]+)", proc.stdout).group(1))
        wick_emb = np.load(npy_file)

    try:
        peer_rate, peer_s, peer_emb, torch_version = run_peer(
            args.model_dir, sentences, args.device, args.dtype, args.batch, args.runs)
    except ImportError as e:
        print(f"sentence-transformers not available ({e}): wick {wick_rate:.1f} sentences/s")
        return
    cos = (wick_emb * peer_emb).sum(1) / (np.linalg.norm(wick_emb, axis=1) *
                                          np.linalg.norm(peer_emb, axis=1))
    print(f"sentence-transformers (torch {torch_version}): {args.n} sentences, batch "
          f"{args.batch}, {args.device} {args.dtype}: {peer_s:.3f} s, {peer_rate:.1f} sentences/s")
    print(f"embed {args.device} {args.dtype}: wick {wick_rate:.1f} sentences/s, "
          f"sentence-transformers {peer_rate:.1f} sentences/s, ratio {wick_rate / peer_rate:.2f}x "
          f"(min cosine wick vs peer {cos.min():.6f})")


if __name__ == "__main__":
    main()
