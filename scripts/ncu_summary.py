#!/usr/bin/env python3
"""Per kernel and grid of an ncu raw CSV (--csv --page raw with gpu__time_duration.sum,
launch__grid_size, dram__bytes_read.sum): launches, median us, DRAM MB read, GB/s and share of the
kernel time. Used by scripts/gpu-profile.sh and scripts/gpu-decode.sh.

    ncu_summary.py LOG
"""
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
hdr = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
if hdr is None:
    sys.exit("no ncu rows in " + sys.argv[1])
h = rows[hdr]
k, t, g = h.index("Kernel Name"), h.index("gpu__time_duration.sum"), h.index("launch__grid_size")
d = h.index("dram__bytes_read.sum")
ns_per = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}[rows[hdr + 1][t]]
b_per = {"byte": 1.0, "Kbyte": 1e3, "KB": 1e3, "Mbyte": 1e6, "MB": 1e6, "Gbyte": 1e9, "GB": 1e9}.get(rows[hdr + 1][d], 1.0)
acc = collections.defaultdict(list)
for r in rows[hdr + 2:]:
    try:
        ns = float(r[t].replace(",", "")) * ns_per
        by = float(r[d].replace(",", "")) * b_per
    except (ValueError, IndexError):
        continue
    acc[(r[k].split("(")[0][:60], r[g])].append((ns, by))
total = sum(ns for v in acc.values() for ns, _ in v)
print(f"{'kernel':60} {'grid':>7} {'n':>5} {'median us':>10} {'MB read':>9} {'GB/s':>7} {'share':>6}")
for (name, grid), v in sorted(acc.items(), key=lambda x: -sum(ns for ns, _ in x[1])):
    ns, by = sorted(v)[len(v) // 2]
    share = 100 * sum(n for n, _ in v) / total
    print(f"{name:60} {grid:>7} {len(v):5d} {ns / 1e3:10.2f} {by / 1e6:9.2f} {by / ns:7.0f} {share:5.1f}%")
print(f"total kernel time {total / 1e3:.1f} us")
