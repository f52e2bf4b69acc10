#!/usr/bin/env python3
"""Reference files for wick's format tests, made and checked by the reference Python packages
(numpy, safetensors, gguf from PyPI).

  make_format_refs.py refs [DIR]        small committed files in tests/data/formats (default DIR)
  make_format_refs.py roundtrip-make DIR   random files of every dtype, written by Python
  make_format_refs.py roundtrip-check DIR  checks the copies wick wrote (wick_*) bit for bit
  make_format_refs.py seeds [DIR]       small valid files: the fuzzers' seed corpus (fuzz/corpus)

The round trip (run by .ci/run): Python writes py_* files -> test_formats_roundtrip (with
WICK_FORMAT_ROUNDTRIP_DIR=DIR) reads each with wick and writes it back as wick_* -> Python reads
wick's files with its own readers and compares every byte of every tensor and every metadata value.
"""
import json
import os
import sys

import numpy as np
import gguf
import safetensors.numpy as stnp
from safetensors import safe_open

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_REFS = os.path.join(HERE, "..", "tests", "data", "formats")

NP_DTYPES = {"u8": np.uint8, "u32": np.uint32, "i64": np.int64, "f16": np.float16,
             "f32": np.float32, "f64": np.float64}
ST_NAMES = {"u8": "U8", "u32": "U32", "i64": "I64", "bf16": "BF16", "f16": "F16", "f32": "F32",
            "f64": "F64"}
Q = gguf.GGMLQuantizationType
# Quantized types wick dequantises, with the byte offsets of their f16 scale fields.
QUANT_SCALES = {Q.Q8_0: [0], Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q4_K: [0, 2],
                Q.Q6_K: [208]}


def write_safetensors_raw(path, entries, metadata=None):
    """A safetensors file from (name, dtype string, shape, raw bytes): for BF16, which numpy lacks."""
    header, data, off = {}, b"", 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dt, shape, raw in entries:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        data += raw
        off += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + data)


def read_safetensors_raw(path):
    """name -> (dtype string, shape, raw bytes), and the metadata, checked by the reference reader."""
    with safe_open(path, framework="np") as f:
        keys = set(f.keys())
        metadata = f.metadata() or {}
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], tuple(e["shape"]), data[b:end])
    assert set(out) == keys, (set(out), keys)
    return out, metadata


def random_blocks(rng, qtype, n_blocks):
    """Random block bytes (every bit pattern) with finite f16 scales; returns uint8 (n, bytes)."""
    _, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in QUANT_SCALES[qtype]:
        scales = rng.uniform(-0.05, 0.05, size=n_blocks).astype(np.float16)
        raw[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return raw


def make_refs(out):
    os.makedirs(out, exist_ok=True)
    # safetensors: arange(12).reshape(3, 4) * 0.5 - 2 for floats, arange(12) * 7 for integers.
    base = np.arange(12).reshape(3, 4)
    arrays = {}
    for name, dt in NP_DTYPES.items():
        arrays[name] = (base * 0.5 - 2).astype(dt) if np.issubdtype(dt, np.floating) else (base * 7).astype(dt)
    stnp.save_file(arrays, os.path.join(out, "py_dtypes.tmp"), metadata={"made_by": "make_format_refs.py"})
    entries, meta = read_safetensors_raw(os.path.join(out, "py_dtypes.tmp"))
    os.remove(os.path.join(out, "py_dtypes.tmp"))
    bf16 = ((base * 0.5 - 2).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    rows = [(k, e[0], e[1], e[2]) for k, e in sorted(entries.items())]
    rows.append(("bf16", "BF16", (3, 4), bf16.tobytes()))
    write_safetensors_raw(os.path.join(out, "py_dtypes.safetensors"), rows, meta)

    # npy: the same values per dtype, plus a Fortran-order and a big-endian array.
    for name, arr in arrays.items():
        np.save(os.path.join(out, f"py_{name}.npy"), arr)
    np.save(os.path.join(out, "py_fortran.npy"), np.asfortranarray(arrays["f32"]))
    np.save(os.path.join(out, "py_bigendian.npy"), arrays["f64"].astype(">f8"))
    np.savez(os.path.join(out, "py_stored.npz"), a=arrays["f32"], b=arrays["i64"])
    np.savez_compressed(os.path.join(out, "py_deflated.npz"), a=arrays["f32"], b=arrays["i64"])

    # gguf: metadata of every value type; F32/F16/BF16 tensors; per quantized type a tensor
    # "q.<type>" of random blocks and "expected.<type>" = gguf.quants.dequantize of it.
    rng = np.random.default_rng(20261201)
    w = gguf.GGUFWriter(os.path.join(out, "py_quant.gguf"), "llama")
    add_every_value_type(w)
    w.add_tensor("plain.f32", arrays["f32"])
    w.add_tensor("plain.f16", arrays["f16"])
    w.add_tensor("plain.bf16", bf16.view(np.uint8).reshape(3, 8), raw_dtype=Q.BF16)
    for qtype in QUANT_SCALES:
        block, _ = gguf.GGML_QUANT_SIZES[qtype]
        rows, cols = 2, 512
        raw = random_blocks(rng, qtype, rows * cols // block).reshape(rows, -1)
        expected = gguf.quants.dequantize(raw, qtype).astype(np.float32)
        assert expected.shape == (rows, cols), expected.shape
        w.add_tensor(f"q.{qtype.name}", raw, raw_dtype=qtype)
        w.add_tensor(f"expected.{qtype.name}", expected)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    total = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"reference files in {out}: {total} bytes")


def add_every_value_type(w):
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 1.5)
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_int64("test.i64", -(2**62))
    w.add_float64("test.f64", -0.125)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "héllo wick")
    w.add_array("test.strings", ["a", "bc", "", "ü"])
    w.add_array("test.ints", [1, -2, 3])
    w.add_array("test.floats", [0.5, -1.25])
    w.add_array("test.nested", [[1, 2], [3]])
    w.add_uint32("llama.context_length", 4096)


# ---- round trip ----

def roundtrip_make(d):
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(7)
    arrays = {}
    for name, dt in NP_DTYPES.items():
        if np.issubdtype(dt, np.floating):
            # Random bit patterns, NaNs and infinities included (compared as bits).
            bits = {np.float16: np.uint16, np.float32: np.uint32, np.float64: np.uint64}[dt]
            arrays[name] = rng.integers(0, np.iinfo(bits).max, size=(5, 7), dtype=bits, endpoint=True).view(dt)
        else:
            arrays[name] = rng.integers(0, np.iinfo(dt).max, size=(5, 7), dtype=dt, endpoint=True)
    stnp.save_file(arrays, os.path.join(d, "py_rt.tmp"), metadata={"k": "v", "made_by": "python"})
    entries, meta = read_safetensors_raw(os.path.join(d, "py_rt.tmp"))
    os.remove(os.path.join(d, "py_rt.tmp"))
    rows = [(k, e[0], e[1], e[2]) for k, e in sorted(entries.items())]
    bf = rng.integers(0, 2**16, size=(3, 9), dtype=np.uint16)
    rows.append(("bf16", "BF16", (3, 9), bf.tobytes()))
    write_safetensors_raw(os.path.join(d, "py_rt.safetensors"), rows, meta)
    for name, arr in arrays.items():
        np.save(os.path.join(d, f"py_rt_{name}.npy"), arr)
    np.savez(os.path.join(d, "py_rt_stored.npz"), **arrays)
    np.savez_compressed(os.path.join(d, "py_rt_deflated.npz"), **arrays)
    w = gguf.GGUFWriter(os.path.join(d, "py_rt.gguf"), "llama")
    add_every_value_type(w)
    w.add_tensor("f32", arrays["f32"])
    w.add_tensor("f16", arrays["f16"])
    w.add_tensor("bf16", bf.view(np.uint8).reshape(3, 18), raw_dtype=Q.BF16)
    for qtype in QUANT_SCALES:
        block, _ = gguf.GGML_QUANT_SIZES[qtype]
        w.add_tensor(f"q.{qtype.name}", random_blocks(rng, qtype, 4).reshape(2, -1), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"python files written to {d}")


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def roundtrip_check(d):
    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)

    # safetensors: same names, dtypes, shapes, bytes and metadata; non-BF16 also through numpy.
    py, py_meta = read_safetensors_raw(os.path.join(d, "py_rt.safetensors"))
    wk, wk_meta = read_safetensors_raw(os.path.join(d, "wick_rt.safetensors"))
    check(py == wk, "safetensors tensors differ")
    check(py_meta == wk_meta, f"safetensors metadata differs: {py_meta} vs {wk_meta}")
    loaded = stnp.load_file(os.path.join(d, "wick_rt_nobf16.safetensors"))
    for name, arr in loaded.items():
        check(np.dtype(arr.dtype).itemsize * arr.size == len(py[name][2]) and arr.tobytes() == py[name][2],
              f"safetensors.numpy reading wick's {name}")
    # npy / npz through numpy.load.
    for name in NP_DTYPES:
        a = np.load(os.path.join(d, f"py_rt_{name}.npy"))
        b = np.load(os.path.join(d, f"wick_rt_{name}.npy"))
        check(same_bits(a, b), f"npy {name}")
    for kind in ("stored", "deflated"):
        a = np.load(os.path.join(d, f"py_rt_{kind}.npz"))
        b = np.load(os.path.join(d, f"wick_rt_{kind}.npz"))
        check(sorted(a.files) == sorted(b.files), f"npz {kind} members")
        for k in a.files:
            check(same_bits(a[k], b[k]), f"npz {kind} {k}")
    # gguf through GGUFReader: every metadata value and every tensor's type, shape and bytes.
    ra = gguf.GGUFReader(os.path.join(d, "py_rt.gguf"))
    rb = gguf.GGUFReader(os.path.join(d, "wick_rt.gguf"))
    fa = {f.name: f for f in ra.fields.values() if not f.name.startswith("GGUF.")}
    fb = {f.name: f for f in rb.fields.values() if not f.name.startswith("GGUF.")}
    fb.pop("general.alignment", None)
    fa.pop("general.alignment", None)
    check(set(fa) == set(fb), f"gguf keys: {set(fa) ^ set(fb)}")
    for k in set(fa) & set(fb):
        check(fa[k].types == fb[k].types, f"gguf {k} types {fa[k].types} vs {fb[k].types}")
        pa = [bytes(fa[k].parts[i]) for i in fa[k].data]
        pb = [bytes(fb[k].parts[i]) for i in fb[k].data]
        check(pa == pb, f"gguf {k} value")
    ta = {t.name: t for t in ra.tensors}
    tb = {t.name: t for t in rb.tensors}
    check(set(ta) == set(tb), "gguf tensor names")
    for k in set(ta) & set(tb):
        check(ta[k].tensor_type == tb[k].tensor_type, f"gguf {k} type")
        check(list(ta[k].shape) == list(tb[k].shape), f"gguf {k} shape")
        check(bytes(ta[k].data.tobytes()) == bytes(tb[k].data.tobytes()), f"gguf {k} bytes")
    if failures:
        print("round trip FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("round trip ok: safetensors, npy, npz (stored, deflated), gguf: every byte equal")


def make_seeds(out):
    """Tiny valid files per parser (fuzz_npy's inputs start with a byte: even npy, odd npz)."""
    import io
    import zipfile
    for d in ("fuzz_safetensors", "fuzz_npy", "fuzz_gguf"):
        os.makedirs(os.path.join(out, d), exist_ok=True)
    rng = np.random.default_rng(3)
    small = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([7], dtype=np.int64),
             "c": np.arange(4, dtype=np.float16)}
    st = os.path.join(out, "fuzz_safetensors")
    stnp.save_file(small, os.path.join(st, "three.safetensors"), metadata={"format": "np"})
    write_safetensors_raw(os.path.join(st, "bf16.safetensors"), [("x", "BF16", (2,), b"\x80\x3f\x00\x40"),
                                                                ("y", "U8", (3,), b"\x01\x02\x03")])
    npd = os.path.join(out, "fuzz_npy")
    for name, arr in [("f32", small["a"]), ("fortran", np.asfortranarray(small["a"])),
                      ("be", small["b"].astype(">i8")), ("u1", np.arange(5, dtype=np.uint8)),
                      ("scalar", np.float64(2.5))]:
        buf = io.BytesIO()
        np.save(buf, arr)
        with open(os.path.join(npd, f"npy_{name}"), "wb") as f:
            f.write(b"\x00" + buf.getvalue())
    for name, fn in [("stored", np.savez), ("deflated", np.savez_compressed)]:
        buf = io.BytesIO()
        fn(buf, a=small["a"], b=small["b"])
        with open(os.path.join(npd, f"npz_{name}"), "wb") as f:
            f.write(b"\x01" + buf.getvalue())
    w = gguf.GGUFWriter(os.path.join(out, "fuzz_gguf", "small.gguf"), "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_bool("b", True)
    w.add_array("tokenizer.ggml.tokens", ["<s>", "a", "b"])
    w.add_array("n", [[1, 2], [3]])
    w.add_tensor("f16", np.arange(4, dtype=np.float16))
    for qtype in QUANT_SCALES:
        w.add_tensor(f"q.{qtype.name}", random_blocks(rng, qtype, 1), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"seed corpus in {out}")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else "refs"
    if cmd == "refs":
        make_refs(sys.argv[2] if len(sys.argv) > 2 else DEFAULT_REFS)
    elif cmd == "seeds":
        make_seeds(sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "..", "fuzz", "corpus"))
    elif cmd == "roundtrip-make":
        roundtrip_make(sys.argv[2])
    elif cmd == "roundtrip-check":
        roundtrip_check(sys.argv[2])
    else:
        sys.exit(__doc__)
