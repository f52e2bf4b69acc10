#!/usr/bin/env python3
"""Reference blocks for the GGUF weight types added after the first six (Q5_1, Q2_K, Q3_K, Q5_K,
IQ4_NL, IQ4_XS), made by the gguf package from PyPI (run once; the output is committed).

  pip install gguf numpy
  python3 scripts/make_quant_refs.py [DIR]    (default tests/data/formats)

Writes py_quant_more.gguf: per type a tensor "q.<type>" (2 x 512) of random blocks (every bit
pattern, finite f16 scales) and "expected.<type>" = gguf.quants.dequantize of it (f32). The
C++ tests check wick's dequantisation (CPU and CUDA) bit for bit and qmatmul against it.

  python3 scripts/make_quant_refs.py --llamacpp SRC.gguf OUTDIR Q3_K_S Q5_K_M IQ4_XS ...

requantizes a model with llama.cpp's own quantizer (llama_cpp_python's llama_model_quantize,
allow_requantize) into OUTDIR/<name>-<TYPE>.gguf: real K-quant and IQ4 mixes for the whole-model
checks (scripts/teacher_forced_llamacpp.py, test_qmatmul's QMatmulSmolLM2 through
WICK_SMOLLM2_GGUF). Not committed (~100 MB each).
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


def llamacpp_quantize(src, out_dir, types):
    import ctypes

    import llama_cpp
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(src))[0].split(".")[0]
    for name in types:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + name)
        params.allow_requantize = True
        out = os.path.join(out_dir, f"{stem}-{name}.gguf")
        rc = llama_cpp.llama_model_quantize(src.encode(), out.encode(), ctypes.byref(params))
        if rc != 0:
            raise SystemExit(f"llama_model_quantize {name}: {rc}")
        kinds = {}
        for t in gguf.GGUFReader(out).tensors:
            kinds[t.tensor_type.name] = kinds.get(t.tensor_type.name, 0) + 1
        print(out, kinds)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--llamacpp":
        return llamacpp_quantize(sys.argv[2], sys.argv[3], sys.argv[4:])
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
