#!/usr/bin/env python3
"""Sentence-embedding throughput: wick (bench/bench_embed) beside sentence-transformers and ONNX
Runtime, in the same run, on the same sentences, batch 128, three sets:

    short  2,000 sentences of 8 words
    long     200 sentences of 256 tokens or more (truncated to the model's 256)
    mixed  1,000 sentences of mixed length (mostly short, some paragraphs, a few past 256 tokens)

    bench/embed_peer.py MODEL_DIR [--wick build/bench/bench_embed] [--sets short,long,mixed]
                        [--threads 2] [--rounds 3] [--device cpu|cuda] [--dtype f32|bf16|f16]
                        [--wick-dtypes f32,bf16] [--batch 128]

Every program runs in its own process with the thread count given (WICK_NUM_THREADS,
torch.set_num_threads, ONNX Runtime's intra-op threads), one after the other within a round, so
that the load of a shared machine falls on all of them alike; the figure printed is the best of
the rounds, in sentences/s, with the load average of each round and the worst cosine between
wick's embeddings and each peer's (all must compute the same thing). ONNX Runtime runs the model
exported from the same checkpoint by torch.onnx (kept in ~/.cache/wick-bench), with the
sentences sorted by length as sentence-transformers does; mean pooling and normalisation in
numpy. --wick-dtypes runs wick once per dtype listed (each a row of the table) beside the peers
run in --dtype: `--wick-dtypes f32,bf16` shows wick's bf16 projections (AMX where the CPU has them)
and its f32 beside f32 peers. A peer that is not installed is left out (pip install sentence-transformers onnxruntime
onnx).
"""

import argparse
import json
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

# Plain words of one token each: a sentence of k of them is k tokens (+ [CLS], [SEP]).
PLAIN = ("the a of and to in is was for on that with as by at from it this be are or an which "
         "computer science language learning network training data weather river mountain music "
         "kitchen morning evening government economy market price bank interest rate growth "
         "election policy football match goal player coach season city village street house "
         "garden tree").split()

SETS = {"short": 2000, "long": 200, "mixed": 1000}


def make_mixed(n, seed=2024):
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


make_sentences = make_mixed  # the name scripts/gpu-profile.sh imports


def make_set(name, n=None):
    n = n or SETS[name]
    if name == "mixed":
        return make_mixed(n)
    rng = random.Random({"short": 8, "long": 256}[name])
    k = 8 if name == "short" else 300  # past 256 tokens: every sentence is truncated to 256
    return [" ".join(rng.choice(PLAIN) for _ in range(k)).capitalize() + "." for _ in range(n)]


# ---- peers, each run in its own process (--worker) ----

def onnx_path(model_dir):
    import hashlib
    key = hashlib.sha1(os.path.abspath(model_dir).encode()).hexdigest()[:12]
    path = os.path.join(os.path.expanduser("~/.cache/wick-bench"), f"minilm-{key}.onnx")
    if os.path.exists(path):
        return path
    import torch
    from transformers import AutoModel
    os.makedirs(os.path.dirname(path), exist_ok=True)
    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = AutoModel.from_pretrained(model_dir).eval()

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    ids = torch.ones(2, 16, dtype=torch.long)
    torch.onnx.export(Encoder(), (ids, torch.ones_like(ids), torch.zeros_like(ids)), path + ".tmp",
                      input_names=["input_ids", "attention_mask", "token_type_ids"],
                      output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                      dynamic_axes={k: {0: "batch", 1: "seq"} for k in
                                    ["input_ids", "attention_mask", "token_type_ids",
                                     "last_hidden_state"]})
    os.replace(path + ".tmp", path)
    return path


def worker(peer, model_dir, text_file, threads, batch, dtype, device, out_file):
    with open(text_file, encoding="utf-8") as f:
        sentences = f.read().split("\n")[:-1]
    if peer == "st":
        import torch
        from sentence_transformers import SentenceTransformer
        torch.set_num_threads(threads)
        model = SentenceTransformer(model_dir, device=device)
        model = model.to({"f32": torch.float32, "bf16": torch.bfloat16,
                          "f16": torch.float16}[dtype]).eval()
        version = f"sentence-transformers (torch {torch.__version__})"

        def encode(texts):
            with torch.inference_mode():
                e = model.encode(texts, batch_size=batch, convert_to_tensor=True,
                                 show_progress_bar=False)
            return e.float().cpu().numpy()
    else:
        import onnxruntime as ort
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(model_dir)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(onnx_path(model_dir), opts,
                                    providers=["CPUExecutionProvider"])
        version = f"onnxruntime {ort.__version__}"
        max_len = min(tok.model_max_length, 256)

        def encode(texts):
            order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
            out = np.empty((len(texts), 0), np.float32)
            parts = {}
            for s in range(0, len(order), batch):
                idx = order[s:s + batch]
                t = tok([texts[i] for i in idx], padding=True, truncation=True,
                        max_length=max_len, return_tensors="np")
                h = sess.run(None, {"input_ids": t["input_ids"].astype(np.int64),
                                    "attention_mask": t["attention_mask"].astype(np.int64),
                                    "token_type_ids": t["token_type_ids"].astype(np.int64)})[0]
                m = t["attention_mask"][..., None].astype(np.float32)
                e = (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
                e /= np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
                for j, i in enumerate(idx):
                    parts[i] = e[j]
            out = np.stack([parts[i] for i in range(len(texts))])
            return out

    encode(sentences[: min(len(sentences), batch)])  # warm-up
    t0 = time.perf_counter()
    emb = encode(sentences)
    secs = time.perf_counter() - t0
    np.save(out_file, emb)
    print(json.dumps({"rate": len(sentences) / secs, "version": version}))


def run_peer(peer, args, text_file, out_file):
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    proc = subprocess.run([sys.executable, __file__, args.model_dir, "--worker", peer,
                           "--text", text_file, "--threads", str(args.threads), "--batch",
                           str(args.batch), "--dtype", args.dtype, "--device", args.device,
                           "--out", out_file], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_wick(args, text_file, out_file, dtype):
    env = dict(os.environ, WICK_NUM_THREADS=str(args.threads))
    cmd = [args.wick, args.model_dir, text_file, "--device", args.device, "--dtype", dtype,
           "--batch", str(args.batch), "--runs", "1", "--output", out_file]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        sys.exit(f"embed_peer: {' '.join(cmd)} failed ({proc.returncode})")
    return float(re.search(r"WICK_SENTENCES_PER_S ([0-9.]+)", proc.stdout).group(1))


def peer_available(peer):
    try:
        if peer == "st":
            import sentence_transformers  # noqa: F401
            import torch  # noqa: F401
        else:
            import onnxruntime  # noqa: F401
            import transformers  # noqa: F401
        return True
    except ImportError:
        return False


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--wick", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "..", "build", "bench", "bench_embed"))
    ap.add_argument("--sets", default="short,long,mixed")
    ap.add_argument("--n", type=int, default=0, help="sentences per set (0: the set's own)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", "--runs", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16"])
    ap.add_argument("--wick-dtypes", default="",
                    help="wick's dtypes, comma-separated (default: --dtype)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--worker", choices=["st", "ort"], help=argparse.SUPPRESS)
    ap.add_argument("--text", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.model_dir, args.text, args.threads, args.batch, args.dtype,
               args.device, args.out)
        return

    sets = args.sets.split(",")
    wick_dtypes = (args.wick_dtypes or args.dtype).split(",")
    peers = [p for p in ("st", "ort") if peer_available(p)]
    if "ort" in peers and args.device != "cpu":
        peers.remove("ort")
    names = {"st": "sentence-transformers", "ort": "onnxruntime"}
    best, cos, versions, loads = {}, {}, {}, []
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for s in sets:
            files[s] = os.path.join(tmp, f"{s}.txt")
            with open(files[s], "w", encoding="utf-8") as f:
                f.write("\n".join(make_set(s, args.n or None)) + "\n")
        for r in range(args.rounds):
            start = loadavg()
            for s in sets:
                wick_emb = {}
                for dt in wick_dtypes:
                    wick_npy = os.path.join(tmp, f"{s}-wick-{dt}.npy")
                    rate = run_wick(args, files[s], wick_npy, dt)
                    best[(dt, s)] = max(rate, best.get((dt, s), 0))
                    wick_emb[dt] = np.load(wick_npy)
                for p in peers:
                    npy = os.path.join(tmp, f"{s}-{p}.npy")
                    res = run_peer(p, args, files[s], npy)
                    if res is None:
                        continue
                    versions[p] = res["version"]
                    best[(p, s)] = max(res["rate"], best.get((p, s), 0))
                    e = np.load(npy)
                    for dt in wick_dtypes:
                        w = wick_emb[dt]
                        c = (w * e).sum(1) / (np.linalg.norm(w, axis=1) * np.linalg.norm(e, axis=1))
                        cos[(dt, p, s)] = min(float(c.min()), cos.get((dt, p, s), 1.0))
            loads.append(f"{start}-{loadavg()}")
            print(f"round {r + 1}/{args.rounds} done (load average {loads[-1]})", file=sys.stderr)

    with open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    print(f"CPU: {cpu}, {os.cpu_count()} logical CPUs; {args.threads} threads, batch "
          f"{args.batch}, {args.device}, peers {args.dtype}; load average per round: "
          f"{', '.join(loads)}")
    for p in peers:
        if p in versions:
            print(f"peer: {versions[p]}")
    shown = [p for p in peers if p in versions]
    print("sentences/s, best of the rounds (ratio: wick / peer; min cosine wick vs peer)")
    print(f"{'set':>6} {'n':>5} {'wick':>10} {'rate':>9}" + "".join(f" {names[p]:>22}"
                                                               for p in shown))
    for s in sets:
        for dt in wick_dtypes:
            w = best[(dt, s)]
            line = f"{s:>6} {args.n or SETS[s]:>5} {'wick ' + dt:>10} {w:9.1f}"
            for p in shown:
                if (p, s) in best:
                    rate = best[(p, s)]
                    line += f" {rate:9.1f} {w / rate:5.2f}x {cos[(dt, p, s)]:.4f}"
                else:
                    line += f" {'-':>22}"
            print(line)
        for dt in wick_dtypes:
            suffix = "" if dt == args.dtype else f"_{dt}"
            for p in shown:
                if (p, s) in best:
                    print(f"RESULT embed_{s}_{p}_ratio{suffix} {best[(dt, s)] / best[(p, s)]:.4f}")

if __name__ == "__main__":
    main()
