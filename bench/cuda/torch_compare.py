#!/usr/bin/env python3
"""The figures of bench/cuda/bench_cuda.cpp, measured on PyTorch in the same way (CUDA events
after warm-up, median of many samples; the queue kept full for matmuls), plus PyTorch's first
matmul in a fresh process. Prints "RESULT torch_<key> <value>" lines for scripts/gpu-check.sh."""

import statistics
import sys
import time

try:
    import torch
except ImportError:
    print("torch_compare: PyTorch is not installed", file=sys.stderr)
    sys.exit(2)


def result(key, value):
    print(f"RESULT torch_{key} {value:.6g}", flush=True)


def main():
    if not torch.cuda.is_available():
        print("torch_compare: no CUDA device", file=sys.stderr)
        sys.exit(2)
    dev = torch.device("cuda:0")

    # First matmul of this process, after device init (as wick-mm time cuda run 0 measures it).
    torch.zeros(1, device=dev)
    torch.cuda.synchronize()
    a = torch.randn(1024, 1024, device=dev)
    b = torch.randn(1024, 1024, device=dev)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    c = a @ b
    torch.cuda.synchronize()
    first_ms = (time.perf_counter() - t0) * 1e3
    print(f"== first matmul 1024 f32 in this process: {first_ms:.1f} ms")
    result("first_matmul_ms", first_ms)

    # True fp32, as wick by default.
    torch.backends.cuda.matmul.allow_tf32 = False
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    lead = torch.empty(4 << 30, dtype=torch.uint8, device=dev)

    def gpu_ms(op, reps, samples, keep_full):
        for _ in range(2):
            op()
        torch.cuda.synchronize()
        ms = []
        for s in range(samples):
            if keep_full:
                lead.fill_(s % 256)
            start.record()
            for _ in range(reps):
                op()
            stop.record()
            stop.synchronize()
            ms.append(start.elapsed_time(stop) / reps)
        return statistics.median(ms)

    print("== matmul (GPU time, queue kept full)")
    for n in (1024, 4096, 8192):
        for name, dt in (("f32", torch.float32), ("bf16", torch.bfloat16), ("f16", torch.float16)):
            x = torch.randn(n, n, device=dev).to(dt)
            y = torch.randn(n, n, device=dev).to(dt)
            flop = 2.0 * n * n * n
            rate = 50e12 if dt == torch.float32 else 600e12
            reps = min(200, max(2, int(0.02 / (flop / rate))))
            samples = 5 if (n >= 8192 and dt == torch.float32) else 9
            t = gpu_ms(lambda: torch.matmul(x, y), reps, samples, True)
            print(f"{n:6d} {name:5s} {flop / t / 1e9:10.1f} TFLOP/s")
            result(f"matmul_{n}_{name}_tflops", flop / t / 1e9)
            del x, y

    x = torch.randn(1024, 1024, device=dev)
    y = torch.randn(1024, 1024, device=dev)
    for _ in range(20):
        torch.matmul(x, y)
    torch.cuda.synchronize()
    us = []
    for _ in range(5):
        for _ in range(100):
            t0 = time.perf_counter()
            torch.matmul(x, y)
            us.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    print(f"== matmul 1024 f32 returns after {statistics.median(us):.2f} us")
    result("matmul_return_us", statistics.median(us))

    c = torch.matmul(x, y)
    torch.cuda.synchronize()
    rb = []
    for _ in range(300):
        t0 = time.perf_counter()
        c[517, 33].item()
        rb.append((time.perf_counter() - t0) * 1e6)
    print(f"== read-back of one element (.item()): {statistics.median(rb):.2f} us")
    result("readback_one_us", statistics.median(rb))

    n = 64 << 20
    x = torch.randn(n, device=dev)
    y = torch.randn(n, device=dev)
    dst = torch.empty(n, device=dev)
    nbytes = n * 4
    t_add = gpu_ms(lambda: x + y, 20, 9, False)
    t_copy = gpu_ms(lambda: dst.copy_(x), 20, 9, False)
    add_gbs, copy_gbs = 3 * nbytes / t_add / 1e6, 2 * nbytes / t_copy / 1e6
    print(f"== add 64M f32: {add_gbs:.0f} GB/s, copy {copy_gbs:.0f} GB/s, ratio {add_gbs / copy_gbs:.3f}")
    result("add_gbs", add_gbs)
    result("copy_gbs", copy_gbs)
    result("add_vs_copy", add_gbs / copy_gbs)
    rows = x.view(8192, 8192)
    t_soft = gpu_ms(lambda: torch.softmax(rows, dim=1), 10, 9, False)
    t_sum = gpu_ms(lambda: x.sum(), 20, 9, False)
    print(f"== softmax {2 * nbytes / t_soft / 1e6:.0f} GB/s, sum {nbytes / t_sum / 1e6:.0f} GB/s")
    result("softmax_gbs", 2 * nbytes / t_soft / 1e6)
    result("sum_gbs", nbytes / t_sum / 1e6)


if __name__ == "__main__":
    main()
