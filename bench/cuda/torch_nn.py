#!/usr/bin/env python3
"""PyTorch's figures for bench/cuda/bench_nn_cuda.cpp, measured the same way (CUDA events after
warm-up, medians): F.layer_norm, F.rms_norm and softmax on (4096, 4096) bf16 in GB/s beside a
device-to-device copy; F.scaled_dot_product_attention (flash) bf16 b=1 h=32 d=128 causal at
s = 1024/4096/16384; decode s=1 against a 4096-long KV cache with h_kv=8 (enable_gqa when this
PyTorch has it, else k/v repeated beforehand, which reads 4x the bytes), as a CUDA graph of 64
calls over 8 caches (beyond the L2) and eagerly on one cache. Prints
"RESULT torch_nn_<key> <value>" lines."""

import statistics
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("torch_nn: PyTorch is not installed", file=sys.stderr)
    sys.exit(2)


def result(key, value):
    print(f"RESULT torch_nn_{key} {value:.6g}", flush=True)


LEAD = None


def gpu_ms(op, reps, samples):
    """GPU ms per call: a 1 GiB fill is queued first so that every call is enqueued before the
    first one starts (no launch gaps), as bench_nn_cuda does."""
    global LEAD
    if LEAD is None:
        LEAD = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:0")
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        op()
    torch.cuda.synchronize()
    ms = []
    for i in range(samples):
        LEAD.fill_(i % 256)
        start.record()
        for _ in range(reps):
            op()
        stop.record()
        stop.synchronize()
        ms.append(start.elapsed_time(stop) / reps)
    return statistics.median(ms)


def main():
    if not torch.cuda.is_available():
        print("torch_nn: no CUDA device", file=sys.stderr)
        sys.exit(2)
    dev = torch.device("cuda:0")
    bf = torch.bfloat16
    rows, cols = 4096, 4096
    nbytes = 2.0 * rows * cols * 2
    x = torch.randn(rows, cols, device=dev, dtype=bf)
    w = torch.randn(cols, device=dev, dtype=bf)
    b = torch.randn(cols, device=dev, dtype=bf)
    dst = torch.empty_like(x)
    t_copy = gpu_ms(lambda: dst.copy_(x), 20, 15)
    copy_gbs = nbytes / t_copy / 1e6
    print(f"== (4096, 4096) bf16 row ops, D2D copy: {copy_gbs:.0f} GB/s")
    result("copy_gbs", copy_gbs)
    ops = {
        "layer_norm": lambda: F.layer_norm(x, (cols,), w, b, 1e-5),
        "softmax": lambda: torch.softmax(x, dim=-1),
    }
    if hasattr(F, "rms_norm"):
        ops["rms_norm"] = lambda: F.rms_norm(x, (cols,), w, 1e-5)
    for name, op in ops.items():
        t = gpu_ms(op, 20, 15)
        gbs = nbytes / t / 1e6
        print(f"{name:<11} {t:8.3f} ms {gbs:7.0f} GB/s  {100 * gbs / copy_gbs:5.1f}% of copy")
        result(f"{name}_gbs", gbs)
        result(f"{name}_vs_copy", gbs / copy_gbs)

    heads, dim = 32, 128
    print("== F.scaled_dot_product_attention bf16 b=1 h=32 d=128 causal")
    for s in (1024, 4096, 16384):
        q, k, v = (torch.randn(1, heads, s, dim, device=dev, dtype=bf) for _ in range(3))
        reps = 2 if s >= 16384 else 10
        t = gpu_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), reps, 7)
        tflops = 4.0 * heads * s * s * dim * 0.5 / t / 1e9
        print(f"s={s:<6} {t:9.3f} ms {tflops:7.1f} TFLOP/s")
        result(f"attn_s{s}_ms", t)
        result(f"attn_s{s}_tflops", tflops)

    s_kv, h_kv = 4096, 8
    kv_bytes = 2.0 * h_kv * s_kv * dim * 2
    q = torch.randn(1, heads, 1, dim, device=dev, dtype=bf)
    # 8 caches (134 MB) read in turn, beyond the L2, as bench_nn_cuda's kernel figure.
    caches = [(torch.randn(1, h_kv, s_kv, dim, device=dev, dtype=bf),
               torch.randn(1, h_kv, s_kv, dim, device=dev, dtype=bf)) for _ in range(8)]
    try:
        # One query sees every key: no causal mask (PyTorch's is_causal aligns to the top left).
        F.scaled_dot_product_attention(q, caches[0][0], caches[0][1], enable_gqa=True)
        how = "enable_gqa"

        def sdpa(k, v):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    except TypeError:
        how = "k/v repeated beforehand"
        caches = [(k.repeat_interleave(heads // h_kv, 1), v.repeat_interleave(heads // h_kv, 1))
                  for k, v in caches]

        def sdpa(k, v):
            return F.scaled_dot_product_attention(q, k, v)

    def line(what, key, t, nbytes):
        gbs = nbytes / t / 1e6
        print(f"{what:<52} {t * 1e3:6.2f} us {gbs:6.0f} GB/s {100 * gbs / copy_gbs:5.1f}% of copy")
        result(f"{key}_us", t * 1e3)
        result(f"{key}_gbs", gbs)
        result(f"{key}_vs_copy", gbs / copy_gbs)

    print(f"== decode bf16 s=1 s_kv={s_kv} h={heads} h_kv={h_kv} d={dim} ({how}), "
          f"KV cache {kv_bytes / 1e6:.1f} MB")
    # The GPU's time per call: 64 calls captured into a CUDA graph, replayed.
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for k, v in caches:
                sdpa(k, v)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(8):
                for k, v in caches:
                    sdpa(k, v)
        t = gpu_ms(graph.replay, 4, 9) / 64
        line("F.scaled_dot_product_attention, 8 caches, graph", "decode", t, kv_bytes)
    except Exception as e:  # noqa: BLE001 - any failure of the capture leaves the eager figure
        print(f"torch_nn: graph capture of the decode failed: {e}", file=sys.stderr)
    # Eager calls on one cache (host work per call included where it outlasts the GPU).
    k, v = caches[0]
    t = gpu_ms(lambda: sdpa(k, v), 50, 15)
    line("F.scaled_dot_product_attention, one cache, eager", "decode_op", t, kv_bytes)

if __name__ == "__main__":
    main()
