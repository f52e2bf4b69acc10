#!/usr/bin/env python3
"""PyTorch eager for the workloads of bench/cuda/bench_graphs.cpp, timed the same way (wall-clock
from the first op to the end of the GPU work, per op, median after warm-up): 1000 dependent adds
on 4 f32 elements, and a 12-layer MLP forward (256 wide, batch 1: matmul, bias add, relu per
layer) repeated 100 times. Prints "RESULT torch_<key> <value>" lines."""

import statistics
import sys
import time

try:
    import torch
except ImportError:
    print("torch_graphs: PyTorch is not installed", file=sys.stderr)
    sys.exit(2)

CHAIN = 1000
LAYERS = 12
WIDTH = 256
FORWARDS = 100
MLP_OPS = FORWARDS * LAYERS * 3


def median_us(run, samples):
    for _ in range(3):
        run()
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def result(key, value):
    print(f"RESULT torch_{key} {value:.6g}", flush=True)


def main():
    if not torch.cuda.is_available():
        print("torch_graphs: no CUDA device", file=sys.stderr)
        sys.exit(2)
    dev = torch.device("cuda:0")
    torch.backends.cuda.matmul.allow_tf32 = False  # true fp32, as wick by default

    y = torch.randn(4, device=dev)

    def chain():
        x = y
        for _ in range(CHAIN):
            x = x + y
        torch.cuda.synchronize()

    chain_us = median_us(chain, 21) / CHAIN

    w = [torch.randn(WIDTH, WIDTH, device=dev) * 0.0625 for _ in range(LAYERS)]
    b = [torch.randn(WIDTH, device=dev) * 0.1 for _ in range(LAYERS)]
    x0 = torch.randn(1, WIDTH, device=dev)

    def mlp():
        with torch.no_grad():
            for _ in range(FORWARDS):
                h = x0
                for l in range(LAYERS):
                    h = torch.relu(h @ w[l] + b[l])
        torch.cuda.synchronize()

    mlp_us = median_us(mlp, 11) / MLP_OPS
    print(f"== PyTorch {torch.__version__} eager, per-op wall-clock us (median)")
    print(f"{'1000 dependent adds (4 f32)':<28} {chain_us:10.2f}")
    print(f"{'MLP 12x256 b1 x100 (3600)':<28} {mlp_us:10.2f}")
    result("graphs_add_chain_us", chain_us)
    result("graphs_mlp_us", mlp_us)


if __name__ == "__main__":
    main()
