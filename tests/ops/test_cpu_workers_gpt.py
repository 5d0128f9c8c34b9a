#!/usr/bin/env python3
"""examples/train_gpt on the 1x2 mesh in one process (DT_CPU_DEVICES=2) with the CPU workers off
(DT_CPU_WORKERS=0) and on (1): the same training and held-out losses to every printed digit
and bit-identical checkpoint files (parameters, master weights, moments). Needs 2 cores (one
worker per device); skips otherwise. Both runs pin OPENBLAS_NUM_THREADS=1: left to itself the
runtime gives BLAS cores/lanes threads (2 with the workers off, 1 per worker on), and on some
CPUs OpenBLAS's sgemm gives other bits with another thread count (seen on an AMD EPYC with
OpenBLAS 0.3.21, even on one device), which is BLAS's matter, not the workers'. Usage: test_cpu_workers_gpt.py TRAIN_GPT MESH_DIR"""
import os
import subprocess
import sys
import tempfile

ARGS = ["--batch", "16", "--steps", "4", "--warmup", "2", "--eval-every", "2", "--samples", "0",
        "--quiet"]


def run(train, mesh, workers, out):
    env = dict(os.environ, DT_CPU_DEVICES="2", DT_CPU_WORKERS=str(workers), DT_BIND="0",
               OPENBLAS_NUM_THREADS="1")
    cmd = [train, "--mesh", mesh, "--out", out] + ARGS
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} (DT_CPU_WORKERS={workers}): exit {p.returncode}\n"
                 f"{p.stdout}\n{p.stderr}")
    with open(os.path.join(out, "curves.csv")) as f:
        rows = [line.rstrip("\n").split(",") for line in f]
    head = rows[0]
    keep = [head.index("step"), head.index("train_loss"), head.index("heldout_loss")]
    losses = [[r[i] for i in keep] for r in rows[1:]]  # tokens_per_s differs, of course
    ckpt = os.path.join(out, "checkpoint")
    files = {}
    for dirpath, _, names in os.walk(ckpt):
        for n in names:
            if n.endswith(".safetensors"):
                with open(os.path.join(dirpath, n), "rb") as f:
                    files[os.path.relpath(os.path.join(dirpath, n), ckpt)] = f.read()
    return p.stdout.strip().splitlines()[-1], losses, files


def main():
    train, meshes = sys.argv[1], sys.argv[2]
    if len(os.sched_getaffinity(0)) < 2:
        print("skipping: fewer than 2 cores, so the workers would not start")
        return 77
    mesh = os.path.join(meshes, "1x2.yaml")
    with tempfile.TemporaryDirectory(prefix="cpu_workers_gpt_") as tmp:
        off = run(train, mesh, 0, os.path.join(tmp, "off"))
        on = run(train, mesh, 1, os.path.join(tmp, "on"))
    fails = []
    if len(off[1]) != 4:
        fails.append(f"expected 4 steps in curves.csv, got {off[1]}")
    if off[1] != on[1]:
        fails.append(f"losses differ:\n off {off[1]}\n on  {on[1]}")
    if off[0].split(" checkpoint=")[0] != on[0].split(" checkpoint=")[0]:
        fails.append(f"result lines differ:\n off {off[0]}\n on  {on[0]}")
    if not off[2] or sorted(off[2]) != sorted(on[2]):
        fails.append(f"checkpoint files: {sorted(off[2])} and {sorted(on[2])}")
    for name in sorted(set(off[2]) & set(on[2])):
        if off[2][name] != on[2][name]:
            fails.append(f"checkpoint file {name} differs")
    for f in fails:
        print("FAIL:", f)
    if not fails:
        print(f"ok: {len(off[1])} steps, losses {[r[1] for r in off[1]]}, "
              f"{len(off[2])} checkpoint files equal")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
