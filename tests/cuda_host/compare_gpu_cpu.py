#!/usr/bin/env python3
"""A training example on GPU devices of the host build (-Dcuda=host) against the same run on
CPU devices: both runs' curves.csv must agree step by step, every column but the throughput,
within a relative 1e-4 (plus 1e-6 absolute): the GEMMs of the cuBLAS stand-in and the f64 sums
of the CUDA loss and reduction kernels add in another order than OpenBLAS and the CPU kernels
(docs/cuda_host.md). Standard library only.
Usage: compare_gpu_cpu.py OUTDIR CPU_ARGS... -- GPU_ARGS... -- COMMON_ARGS...
(each run gets --out OUTDIR/cpu or OUTDIR/gpu appended)."""
import csv
import os
import subprocess
import sys
import time


def run(cmd, out):
    t0 = time.monotonic()
    p = subprocess.run(cmd + ["--out", out], capture_output=True, text=True)
    print(f"{' '.join(cmd)}: exit {p.returncode} in {time.monotonic() - t0:.1f} s")
    if p.returncode != 0:
        print(p.stdout, p.stderr, sep="\n")
        sys.exit(1)
    with open(os.path.join(out, "curves.csv")) as f:
        return list(csv.DictReader(f))


def main():
    outdir, rest = sys.argv[1], sys.argv[2:]
    i = rest.index("--")
    j = rest.index("--", i + 1)
    cpu, gpu, common = rest[:i], rest[i + 1:j], rest[j + 1:]
    a = run(cpu + common, os.path.join(outdir, "cpu"))
    b = run(gpu + common, os.path.join(outdir, "gpu"))
    if len(a) != len(b) or not a:
        print(f"{len(a)} CPU rows, {len(b)} GPU rows")
        sys.exit(1)
    bad = 0
    for ra, rb in zip(a, b):
        for k, va in ra.items():
            if k.endswith("_per_s") or va == "":
                continue
            x, y = float(va), float(rb[k])
            ok = abs(x - y) <= 1e-6 + 1e-4 * abs(x)
            bad += not ok
            print(f"step {ra['step']} {k}: cpu {x:.9g} gpu {y:.9g}{'' if ok else '  DIFFERS'}")
    sys.exit(1 if bad else 0)


main()
