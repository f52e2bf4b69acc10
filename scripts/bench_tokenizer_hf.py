#!/usr/bin/env python3
"""Hugging Face tokenizers' encode speed on the committed corpus (bench/bench_tokenizer prints it
beside wick's). Usage: python3 scripts/bench_tokenizer_hf.py [tests/data/tokenizer]"""
import gzip
import json
import os
import sys
import time

from tokenizers import Tokenizer

data = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests",
                                                          "data", "tokenizer")
lines = [json.loads(l) for l in open(os.path.join(data, "corpus.jsonl"), encoding="utf-8")]
size = sum(len(s.encode()) for s in lines)
for name in ["minilm", "smollm2", "llama3_style"]:
    tok = Tokenizer.from_str(gzip.open(os.path.join(data, name + ".json.gz")).read().decode())
    tok.no_truncation()
    tok.no_padding()
    for line in lines:  # warm the BPE cache, as the C++ benchmark's first iterations do
        tok.encode(line, add_special_tokens=False)
    best_single = best_batch = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for line in lines:
            tok.encode(line, add_special_tokens=False)
        best_single = min(best_single, time.perf_counter() - t0)
        t0 = time.perf_counter()
        tok.encode_batch(lines, add_special_tokens=False)
        best_batch = min(best_batch, time.perf_counter() - t0)
    print(f"HF tokenizers {name:13s} encode (one line per call): {size / best_single / 1e6:6.2f} MB/s"
          f"   encode_batch (all threads): {size / best_batch / 1e6:6.2f} MB/s")
