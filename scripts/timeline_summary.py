#!/usr/bin/env python3
"""Summarises a device timeline (src/cuda/device_timeline.cuh, WICK_DEVICE_TIMELINE_OUT): the
records of every block of the decode step's instrumented kernels, grouped into launches, then per
kind of kernel the mean over the last complete decode steps of:
  gap    from the end of the launch before (its last block) to this launch's first block passing
         pdl_wait (negative: the wait ended before the kernel before had ended, by the timer);
  early  how far before that end this launch's first block started (weights loaded ahead);
  post   from the first block passing pdl_wait to the launch's last block ending;
  span   from the end of the launch before to this launch's end: what the launch adds to a step.
Kernels that are not instrumented (cuBLAS, argmax, embedding) show as the gap of the next one.
Steps end at the Generator's advance kernel, or at the kind --step-end names (the serving
engine's paged step ends at its output head).
With --marks, first the decode (or paged) attention's blocks inside: the mean time from a block's
start to its pdl_wait, q in registers (shared memory), its first warp's key tiles done, the warps
merged and its end (also for a timeline of bench_nn_cuda's decode kernel alone, which has no
steps).

  scripts/timeline_summary.py TIMELINE [--steps N] [--detail] [--marks] [--step-end KIND]
"""
import argparse
import bisect
import statistics
from collections import defaultdict

EPILOGUES = {0: "store", 1: "qkv_rope", 2: "silu_mul", 3: "gelu_mul", 4: "add"}  # GemvEpilogue


def kind_of(tag):
    top = tag >> 28
    if top in (1, 2, 6):
        epi = EPILOGUES.get((tag >> 24) & 0xF, "?")
        k = tag & 0xFFFFFF
        return f"{ {1: 'gemv', 2: 'gemv_stream', 6: 'gemv_pairs'}[top]} {epi} k={k}"
    if top == 3:
        return "attention"
    if top == 4:
        return "advance"
    if top == 7:
        return "paged_attention"
    return f"tag {tag:#x}"


def print_marks(attention, marks, last=400):
    """Mean offsets inside the last attention blocks: each block's marks record is the next one
    its thread 0 wrote after the block's own record."""
    seqs = {b: sorted(v) for b, v in marks.items()}
    keys = {b: [m[0] for m in v] for b, v in seqs.items()}
    rows = []
    for start, seq, block, waited, end in sorted(attention)[-last:]:
        i = bisect.bisect_right(keys.get(block, []), seq)
        if i == len(keys.get(block, [])):
            continue
        _, q_ready, loop_done, merged = seqs[block][i]
        rows.append((waited, q_ready, loop_done, merged, end))
        rows[-1] = tuple((t - start) / 1e3 for t in rows[-1])
    if not rows:
        print("no attention marks (a build without them, or no decode attention)")
        return
    print(f"attention, the last {len(rows)} blocks: us from a block's start (mean, max)")
    for i, name in enumerate(["pdl_wait", "q ready", "warp 0 tiles", "warps merged", "end"]):
        v = [r[i] for r in rows]
        print(f"  {name:13} {statistics.mean(v):6.2f} {max(v):6.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("timeline")
    ap.add_argument("--steps", type=int, default=3, help="last complete steps summarised")
    ap.add_argument("--detail", action="store_true", help="also every launch of the last step")
    ap.add_argument("--marks", action="store_true", help="the attention blocks' inner times")
    ap.add_argument("--step-end", default="advance",
                    help="the kind of launch that ends a step (the Generator's: advance; the\n"
                    "serving engine's: its output head, e.g. 'gemv store k=2048')")
    args = ap.parse_args()
    recs = []
    marks = defaultdict(list)  # block -> (seq, q ready, loop done, merged)
    attention = []  # (start, seq, block, waited, end)
    with open(args.timeline) as f:
        for line in f:
            tag, block, sm, seq, start, waited, end = map(int, line.split())
            if tag >> 28 == 5:  # WICK_TL_END_MARKS of the attention block that just ended
                marks[block].append((seq, start, waited, end))
                continue
            if tag >> 28 in (3, 7):  # the decode or the paged attention
                attention.append((start, seq, block, waited, end))
            recs.append((start, waited, end, tag, block, sm))
    if args.marks:
        print_marks(attention, marks)
    if not recs:
        print("no records")
        return
    recs.sort()
    # Launches: runs of one tag in start order (a launch's blocks all start before the next
    # launch's first block can: programmatic launch waits for every block's trigger or exit).
    launches = []
    for r in recs:
        kind = kind_of(r[3])
        if not launches or launches[-1]["kind"] != kind:
            launches.append({"kind": kind, "blocks": []})
        launches[-1]["blocks"].append(r)
    for ln in launches:
        b = ln["blocks"]
        ln["first_start"] = min(x[0] for x in b)
        ln["first_waited"] = min(x[1] for x in b if x[1] != 0) if any(x[1] for x in b) else b[0][0]
        ln["last_end"] = max(x[2] for x in b)
        ln["n"] = len(b)
        ln["median_block"] = statistics.median(x[2] - x[0] for x in b)
    # Steps end at each launch of the --step-end kind.
    ends = [i for i, ln in enumerate(launches) if ln["kind"] == args.step_end]
    if len(ends) < 2:
        print(f"{len(launches)} launches, fewer than two decode steps: no summary")
        return
    steps = [(ends[i] + 1, ends[i + 1]) for i in range(len(ends) - 1)][-args.steps:]
    rows = defaultdict(lambda: defaultdict(list))
    order = []
    totals = []
    for lo, hi in steps:
        totals.append((launches[hi]["last_end"] - launches[lo - 1]["last_end"]) / 1e3)
        for i in range(lo, hi + 1):
            ln, prev = launches[i], launches[i - 1]
            if ln["kind"] not in order:
                order.append(ln["kind"])
            r = rows[ln["kind"]]
            r["gap"].append((ln["first_waited"] - prev["last_end"]) / 1e3)
            r["early"].append((prev["last_end"] - ln["first_start"]) / 1e3)
            r["post"].append((ln["last_end"] - ln["first_waited"]) / 1e3)
            r["span"].append((ln["last_end"] - prev["last_end"]) / 1e3)
            r["blocks"].append(ln["n"])
            r["block_us"].append(ln["median_block"] / 1e3)
    print(f"{len(recs)} block records, {len(launches)} launches; the last {len(steps)} steps: "
          f"{', '.join(f'{t:.1f}' for t in totals)} us (step end to step end)")
    print(f"{'kernel':34} {'n/step':>6} {'blocks':>7} {'gap':>7} {'early':>7} {'post':>7} "
          f"{'span':>7} {'span/step':>9} {'block':>7}  (us, means)")
    for kind in order:
        r = rows[kind]
        per_step = len(r["span"]) / len(steps)
        mean = lambda key: statistics.mean(r[key])
        print(f"{kind:34} {per_step:6.0f} {mean('blocks'):7.0f} {mean('gap'):7.2f} "
              f"{mean('early'):7.2f} {mean('post'):7.2f} {mean('span'):7.2f} "
              f"{mean('span') * per_step:9.1f} {mean('block_us'):7.2f}")
    if args.detail:
        lo, hi = steps[-1]
        t0 = launches[lo - 1]["last_end"]
        print(f"last step, us from the end of the advance before: kernel blocks first_start "
              f"first_waited last_end span")
        for i in range(lo, hi + 1):
            ln = launches[i]
            print(f"{ln['kind']:34} {ln['n']:6} {(ln['first_start'] - t0) / 1e3:8.2f} "
                  f"{(ln['first_waited'] - t0) / 1e3:8.2f} {(ln['last_end'] - t0) / 1e3:8.2f} "
                  f"{(ln['last_end'] - launches[i - 1]['last_end']) / 1e3:6.2f}")


if __name__ == "__main__":
    main()
