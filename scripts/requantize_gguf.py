#!/usr/bin/env python3
"""Rewrites a llama GGUF with its quantized matrices requantized to a K-quant mix, for the
whole-model check of qmatmul's Q5_0 / Q4_K / Q6_K kernels (tests/test_qmatmul.cpp,
QMatmulSmolLM2 with WICK_SMOLLM2_GGUF pointing at the output):

    python3 scripts/requantize_gguf.py SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smollm2-kmix.gguf

Each quantized matrix is dequantised (the gguf package) and requantized: those whose rows are a
multiple of 256 to Q4_K (even layers) or Q6_K (odd layers), the others to Q5_0 (the gguf
package's quantizer). The gguf package has no K-quant quantizer, so this file holds a plain one
(per sub-block max/min scales, not llama.cpp's error-minimising search): good enough to
exercise the kernels on real activations. Tensors that are not Q4_0/Q4_1/Q5_0/Q8_0 are copied.
"""

import re
import sys

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFValueType, GGUFWriter, Keys, quants

REQUANTIZED = {QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q8_0}


def f16_bytes(v):
    return np.asarray(v, dtype=np.float16).reshape(-1, 1).view(np.uint8)


def quantize_q4_k(x):
    """x (rows, k), k % 256 == 0 -> (rows, k / 256 * 144) u8: d sc q - dmin m."""
    blocks = x.reshape(-1, 8, 32).astype(np.float64)
    lo = np.minimum(blocks.min(axis=2), 0.0)  # the min is -dmin m <= 0
    scale = (blocks.max(axis=2) - lo) / 15.0
    mins = -lo
    d = (scale.max(axis=1) / 63.0).astype(np.float16).astype(np.float64)
    dmin = (mins.max(axis=1) / 63.0).astype(np.float16).astype(np.float64)
    safe = lambda a: np.where(a == 0, 1.0, a)
    sc = np.clip(np.rint(scale / safe(d)[:, None]), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(mins / safe(dmin)[:, None]), 0, 63).astype(np.uint8)
    step = d[:, None] * sc
    q = np.rint((blocks + (dmin[:, None] * m)[:, :, None]) / safe(step)[:, :, None])
    q = np.clip(q, 0, 15).astype(np.uint8)  # (blocks, 8 sub-blocks, 32)
    scales = np.zeros((blocks.shape[0], 12), dtype=np.uint8)
    scales[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((m[:, 4:8] & 0x0F) << 4)
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(-1, 128)  # sub-blocks 2i, 2i + 1
    out = np.concatenate([f16_bytes(d), f16_bytes(dmin), scales, qs], axis=1)
    return out.reshape(x.shape[0], -1)


def quantize_q6_k(x):
    """x (rows, k), k % 256 == 0 -> (rows, k / 256 * 210) u8: d sc (q - 32)."""
    subs = x.reshape(-1, 16, 16).astype(np.float64)
    scale = np.abs(subs).max(axis=2) / 31.0
    d = (scale.max(axis=1) / 127.0).astype(np.float16).astype(np.float64)
    safe = lambda a: np.where(a == 0, 1.0, a)
    sc = np.clip(np.rint(scale / safe(d)[:, None]), 0, 127).astype(np.int8)
    step = d[:, None] * sc
    q = np.clip(np.rint(subs / safe(step)[:, :, None]), -32, 31) + 32
    q = q.astype(np.uint8).reshape(-1, 2, 4, 32)  # (blocks, half, quarter, l): value 128 n + 32 q + l
    low = q & 0x0F
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], 2)
    hi = q >> 4
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
    out = np.concatenate(
        [ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), f16_bytes(d)], axis=1
    )
    return out.reshape(x.shape[0], -1)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    reader = GGUFReader(src)
    arch = reader.fields[Keys.General.ARCHITECTURE].contents()
    writer = GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name == Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    counts = {}
    for t in reader.tensors:
        data, qtype = t.data, t.tensor_type
        if qtype in REQUANTIZED and len(t.shape) == 2 and not t.name.startswith("token_embd"):
            x = quants.dequantize(t.data, qtype).astype(np.float32)
            k = x.shape[-1]
            layer = re.search(r"blk\.(\d+)\.", t.name)
            if k % 256 == 0:
                odd = layer is not None and int(layer.group(1)) % 2 == 1
                qtype = QT.Q6_K if odd else QT.Q4_K
                data = (quantize_q6_k if odd else quantize_q4_k)(x)
                back = quants.dequantize(data, qtype)
                err = np.abs(back - x).max() / max(np.abs(x).max(), 1e-30)
                assert err < 0.1, f"{t.name}: {qtype.name} round trip off by {err:.3f} of max"
            else:
                qtype = QT.Q5_0
                data = quants.quantize(x, qtype)
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
        writer.add_tensor(t.name, np.ascontiguousarray(data), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(dst, counts)


if __name__ == "__main__":
    main()
