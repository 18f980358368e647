#!/usr/bin/env python3
"""Reads the Nsight Compute raw CSV of docs/gpu-runs/profile-gpu.sh (ncu --csv --page raw)
and prints the single-stream decode steps: their kernels, GPU time, DRAM bytes read and
the time and bandwidth by kernel. A step is the kernels from one final-norm boundary to
the next (65 RMS norms: two a layer and the output's). Usage: ncu-steps.py FILE.csv
"""
import collections
import csv
import re
import sys

TIME = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
BYTES = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}


def load(path):
    rows = list(csv.reader(open(path)))
    head, units = rows[0], rows[1]
    col = {c: i for i, c in enumerate(head)}
    tm = TIME[units[col["gpu__time_duration.sum"]]]
    bm = BYTES[units[col["dram__bytes_read.sum"]]]
    out = []
    for r in rows[2:]:
        def val(c):
            v = r[col[c]].replace(",", "")
            return float(v) if v else 0.0
        name = re.sub(r"\(.*", "", r[col["Kernel Name"]]).replace("void ", "")[:48]
        out.append((name, val("gpu__time_duration.sum") * tm, val("dram__bytes_read.sum") * bm))
    return out


def main(path):
    k = load(path)
    graphs = [t for n, t, _ in k if n == "graph"]
    if graphs:
        print("graph launches: %d, GPU ms each: %s" % (len(graphs), " ".join("%.2f" % (t * 1e3) for t in graphs)))
    first = next(i for i, r in enumerate(k) if r[0].startswith("mul_mat_vec_q"))
    norms = [i for i, r in enumerate(k) if r[0].startswith("rms_norm") and i > first - 3]
    bounds = norms[::65]
    for a, b in zip(bounds, bounds[1:]):
        seg = k[a:b]
        t, rd = sum(r[1] for r in seg), sum(r[2] for r in seg)
        if t:
            print("step: %d kernels, GPU %.3f ms, read %.2f GB, %.2f TB/s" % (len(seg), t * 1e3, rd / 1e9, rd / t / 1e12))
    if len(bounds) < 3:
        return
    by = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for n, t, rd in k[bounds[-2]:bounds[-1]]:
        by[n][0] += 1
        by[n][1] += t
        by[n][2] += rd
    total = sum(v[1] for v in by.values())
    print("last whole step by kernel:")
    for n, (c, t, rd) in sorted(by.items(), key=lambda x: -x[1][1]):
        print("  %-48s n=%3d %.3f ms (%4.1f%%) %.2f TB/s, %.1f us each" % (n, c, t * 1e3, 100 * t / total, rd / t / 1e12 if t else 0, t / c * 1e6))


if __name__ == "__main__":
    main(sys.argv[1])
