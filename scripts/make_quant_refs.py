#!/usr/bin/env python3
"""Reference blocks for the GGUF weight types added after the first six (Q5_1, Q2_K, Q3_K, Q5_K,
IQ4_NL, IQ4_XS), made by the gguf package from PyPI (run once; the output is committed).

  pip install gguf numpy
  python3 scripts/make_quant_refs.py [DIR]    (default tests/data/formats)

Writes py_quant_more.gguf: per type a tensor "q.<type>" (2 x 512) of random blocks (every bit
pattern, finite f16 scales) and "expected.<type>" = gguf.quants.dequantize of it (f32). The
C++ tests check wick's dequantisation (CPU and CUDA) bit for bit and qmatmul against it.
"""
import os
import sys

import gguf
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
Q = gguf.GGMLQuantizationType
# The byte offsets of each type's f16 scale fields (ggml-common.h's block structs).
SCALES = {Q.Q5_1: [0, 2], Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q5_K: [0, 2], Q.IQ4_NL: [0],
          Q.IQ4_XS: [0]}


def random_blocks(rng, qtype, n_blocks):
    _, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in SCALES[qtype]:
        scales = rng.uniform(-0.05, 0.05, size=n_blocks).astype(np.float16)
        raw[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return raw


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "data", "formats")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(20261205)
    path = os.path.join(out, "py_quant_more.gguf")
    w = gguf.GGUFWriter(path, "llama")
    for qtype in SCALES:
        block, _ = gguf.GGML_QUANT_SIZES[qtype]
        rows, cols = 2, 512
        raw = random_blocks(rng, qtype, rows * cols // block).reshape(rows, -1)
        expected = gguf.quants.dequantize(raw, qtype).astype(np.float32)
        assert expected.shape == (rows, cols), expected.shape
        assert np.all(np.isfinite(expected)) and np.abs(expected).sum() > 0
        w.add_tensor(f"q.{qtype.name}", raw, raw_dtype=qtype)
        w.add_tensor(f"expected.{qtype.name}", expected)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{path}: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
