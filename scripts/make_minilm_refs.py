#!/usr/bin/env python3
"""References for wick's all-MiniLM-L6-v2 tests (tests/test_bert.cpp), made once and committed.

    scripts/make_minilm_refs.py MODEL_DIR [--out tests/data/minilm]
        writes, from ~200 varied sentences (made here, deterministic):
          sentences.txt          one sentence per line (one of them empty)
          token_ids.npy          u32, every sentence's ids one after the other (256 at most each)
          token_lengths.npy      u32, the number of ids of each sentence
          embeddings_f32w.npy    f32 (n, 384): sentence-transformers' pipeline computed in float64
                                 from the folder's f32 weights
          embeddings_f16w.npy    the same from the weights rounded to f16 (for a model folder
                                 carried as f16 safetensors, e.g. to the GPU machine)
          hidden_f32w.npy        f32 (4, s, 384): last hidden states of the first 4 sentences,
                                 padded together to s tokens (padding rows included)
        and prints how far sentence-transformers' own f32 run is from the f64 reference.

    scripts/make_minilm_refs.py MODEL_DIR --export-f16 DIR
        copies the model folder to DIR with model.safetensors converted to f16 (45 MB).

    scripts/make_minilm_refs.py MODEL_DIR --check-st FILE.npy [--device cuda] [--dtype bf16]
        runs sentence-transformers on sentences.txt and prints the cosine of each embedding
        against FILE.npy (a second opinion on the GPU machine).

The f64 runs need torch and sentence-transformers (CPU is enough).
"""

import argparse
import json
import os
import random
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "tests", "data", "minilm")

BASE = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "A man is riding a white horse on an enclosed ground.",
    "Two children are playing in the snow.",
    "The new movie is awesome!",
    "I love pasta.",
    "Do you like pizza?",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "How do I reset my password?",
    "Click 'Forgot password' on the sign-in page and follow the e-mail link.",
    "Machine learning is a field of study in artificial intelligence.",
    "Sentence embeddings map text to dense vectors for semantic search.",
    "The stock market fell 3.2% on Tuesday after the announcement.",
    "Water boils at 100 °C at sea level.",
    "E = mc^2 relates energy and mass.",
    "Call me at +1 (555) 123-4567 before 9:30 a.m.",
    "Visit https://example.com/path?query=1&x=y#frag for details.",
    "Send feedback to someone@example.org, please.",
    "C++20 introduced concepts, ranges and coroutines.",
    "def f(x): return x ** 2  # a Python one-liner",
    "SELECT name, COUNT(*) FROM users GROUP BY name;",
    "Café, naïve, résumé, façade and coöperate carry accents.",
    "Ünïcödé àççéñts shöûld bé strïppéd by thé tökénïzér.",
    "São Paulo é a maior cidade do Brasil.",
    "El niño comió una manzana en la mañana.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Les élèves étudient à la bibliothèque ce soir.",
    "Москва — столица России.",
    "Ελληνικά γράμματα: α, β, γ, δ.",
    "日本語の文章も埋め込みます。",
    "我喜欢吃中国菜。",
    "한국어 문장도 처리합니다.",
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "مرحبا بالعالم",
    "שלום עולם",
    "हिन्दी में एक वाक्य।",
    "I'm so happy today 😀🎉!",
    "Emoji only: 🍕🍔🍟🌭",
    "Rocket 🚀 to the moon 🌕, then back to Earth 🌍.",
    "Wait... what?!?! No way!!!",
    "----- ***** ===== !!!!! ?????",
    "((nested (parentheses) [and {brackets}]))",
    "Tabs\tand  double  spaces   in    between.",
    "ALL CAPS SENTENCE SHOUTING LOUDLY",
    "MiXeD CaSe WoRdS aRe NoRmAlIsEd",
    "supercalifragilisticexpialidocious",
    "pneumonoultramicroscopicsilicovolcanoconiosis is a long word",
    "1234567890 0987654321 3.14159 2.71828",
    "a",
    "?",
    "",
    "OK",
    "Yes.",
    "No!",
    "The weather is lovely today.",
    "It's so sunny outside!",
    "He drove to the stadium.",
    "A cheetah is running behind its prey.",
    "The cat sits outside.",
    "The new movie is so great.",
    "A woman is playing the violin.",
    "Two men pushed carts through the woods.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
]

SUBJECTS = ["The engineer", "My grandmother", "A small robot", "The committee", "Every student",
            "The old lighthouse keeper", "A hungry cat", "The startup", "Our neighbour",
            "The orchestra", "A tourist from Québec", "The GPU"]
VERBS = ["carefully examined", "quickly forgot", "wrote a report about", "argued loudly over",
         "painted", "measured", "sold", "ignored", "celebrated", "translated", "benchmarked",
         "dreamed of"]
OBJECTS = ["the broken bicycle", "a cup of green tea", "the quarterly earnings",
           "an ancient manuscript", "the matrix multiplication kernel", "seven red balloons",
           "the rainy afternoon", "a recipe for crème brûlée", "the tokenizer's edge cases",
           "the last train to Zürich", "a hundred lines of code", "the sleepy village"]
TAILS = ["", " yesterday", " before lunch", " with great enthusiasm", " for the third time",
         " despite the noise", " in 2024", " (again)", " — or so they say", "!", "?", "..."]


def make_sentences(n=200, seed=1234):
    rng = random.Random(seed)
    out = list(BASE)
    while len(out) < n - 6:
        k = rng.randint(1, 3)
        parts = []
        for _ in range(k):
            parts.append(f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
                         f"{rng.choice(TAILS)}")
        s = ", and ".join(parts)
        if not s.endswith(("!", "?", "...")):
            s += "."
        out.append(s)
    # Long lines: past the model's 256-token limit (truncated) and near it.
    words = [w for s in BASE[:40] for w in s.split()]
    for length in (40, 120, 200, 300, 450, 700):
        out.append(" ".join(rng.choice(words) for _ in range(length)))
    assert all("\n" not in s and "\r" not in s for s in out)
    return out


def load_st(model_dir, device="cpu"):
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(model_dir, device=device)


def pipeline_f64(model, sentences, batch_size=16):
    """sentence-transformers' encode, in float64 (the model converted with .double())."""
    import torch
    model = model.double()
    with torch.no_grad():
        emb = model.encode(sentences, batch_size=batch_size, convert_to_numpy=True,
                           normalize_embeddings=False)
    return emb.astype(np.float64)


def round_weights_f16(model):
    import torch
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.float16).to(p.dtype))


def cosines(a, b):
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    num = (a * b).sum(1)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return num / np.maximum(den, 1e-30)


def make_refs(model_dir, out):
    import torch
    torch.manual_seed(0)
    os.makedirs(out, exist_ok=True)
    sentences = make_sentences()
    with open(os.path.join(out, "sentences.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(sentences) + "\n")

    model = load_st(model_dir)
    tok = model.tokenizer
    max_len = model.max_seq_length
    ids = [tok(s, truncation=True, max_length=max_len)["input_ids"] for s in sentences]
    np.save(os.path.join(out, "token_ids.npy"), np.array([i for x in ids for i in x], np.uint32))
    np.save(os.path.join(out, "token_lengths.npy"), np.array([len(x) for x in ids], np.uint32))

    emb32 = model.encode(sentences, batch_size=32, convert_to_numpy=True)
    ref = pipeline_f64(load_st(model_dir), sentences)
    np.save(os.path.join(out, "embeddings_f32w.npy"), ref.astype(np.float32))
    c = cosines(emb32, ref)
    print(f"sentence-transformers f32 vs f64 reference: min cosine {c.min():.9f}, "
          f"mean {c.mean():.9f}, max |diff| {np.abs(emb32 - ref).max():.3g}")

    m16 = load_st(model_dir)
    round_weights_f16(m16)
    ref16 = pipeline_f64(m16, sentences)
    np.save(os.path.join(out, "embeddings_f16w.npy"), ref16.astype(np.float32))
    c = cosines(ref16, ref)
    print(f"f16-rounded weights vs f32 weights (both f64): min cosine {c.min():.9f}")

    # Last hidden states of the first 4 sentences as one padded batch, in float64.
    m = load_st(model_dir).double()
    bert = m[0].auto_model
    batch = tok(sentences[:4], padding=True, truncation=True, max_length=max_len,
                return_tensors="pt")
    with torch.no_grad():
        hidden = bert(input_ids=batch["input_ids"],
                      attention_mask=batch["attention_mask"]).last_hidden_state
    np.save(os.path.join(out, "hidden_f32w.npy"), hidden.numpy().astype(np.float32))
    print(f"wrote {len(sentences)} sentences, {sum(map(len, ids))} ids, hidden "
          f"{tuple(hidden.shape)} to {os.path.abspath(out)}")


def export_f16(model_dir, dest):
    from safetensors.numpy import load_file, save_file
    shutil.copytree(model_dir, dest, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("model.safetensors", "*.bin", "*.onnx"))
    tensors = load_file(os.path.join(model_dir, "model.safetensors"))
    conv = {k: (v.astype(np.float16) if v.dtype == np.float32 else v) for k, v in tensors.items()}
    save_file(conv, os.path.join(dest, "model.safetensors"), metadata={"format": "pt"})
    print(f"wrote {dest} (f16 weights)")


def check_st(model_dir, ref_path, device, dtype, out):
    import torch
    sentences = open(os.path.join(out, "sentences.txt"), encoding="utf-8").read().split("\n")[:-1]
    model = load_st(model_dir, device)
    if dtype != "f32":
        model = model.to({"f16": torch.float16, "bf16": torch.bfloat16}[dtype])
    emb = model.encode(sentences, batch_size=32, convert_to_numpy=False, convert_to_tensor=True)
    c = cosines(emb.float().cpu().numpy(), np.load(ref_path))
    print(f"sentence-transformers {device} {dtype} vs {ref_path}: min cosine {c.min():.9f}, "
          f"mean {c.mean():.9f}, worst sentence {int(c.argmin())}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--export-f16", metavar="DIR")
    ap.add_argument("--check-st", metavar="FILE")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"])
    args = ap.parse_args()
    if not os.path.isfile(os.path.join(args.model_dir, "config.json")):
        sys.exit(f"{args.model_dir}: no config.json (expected the model folder of the wheel)")
    if args.export_f16:
        export_f16(args.model_dir, args.export_f16)
    elif args.check_st:
        check_st(args.model_dir, args.check_st, args.device, args.dtype, args.out)
    else:
        make_refs(args.model_dir, args.out)


if __name__ == "__main__":
    main()
