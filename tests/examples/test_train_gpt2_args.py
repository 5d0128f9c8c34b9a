#!/usr/bin/env python3
"""train_gpt2's command line (argv: the train_gpt2 binary): --help and -h print the usage on
stdout and exit 0; a --context longer than the init file's position table (an llm.c checkpoint
with n_ctx 8, written here) exits non-zero naming both, where the table's own length trains.
Python standard library only."""
import os
import random
import struct
import subprocess
import sys
import tempfile

V, C, L, NH, CTX = 128, 16, 1, 2, 8


def write_llmc(path):
    """llm.c's GPT-2 checkpoint (version 3: f32): an int32[256] header, then the parameters
    in llm.c's order, small random weights and unit norms."""
    rng = random.Random(7)
    head = [0] * 256
    head[:8] = [20240326, 3, CTX, V, L, NH, C, V]
    sizes = [("w", V * C), ("w", CTX * C), ("1", L * C), ("0", L * C), ("w", L * 3 * C * C),
             ("0", L * 3 * C), ("w", L * C * C), ("0", L * C), ("1", L * C), ("0", L * C),
             ("w", L * 4 * C * C), ("0", L * 4 * C), ("w", L * C * 4 * C), ("0", L * C),
             ("1", C), ("0", C)]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *head))
        for kind, n in sizes:
            vals = [rng.gauss(0.0, 0.02) if kind == "w" else float(kind) for _ in range(n)]
            f.write(struct.pack(f"<{n}f", *vals))


def write_tokens(path, n):
    rng = random.Random(8)
    head = [0] * 256
    head[0], head[1], head[2] = 20240520, 1, n
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *head))
        f.write(struct.pack(f"<{n}H", *[rng.randrange(V) for _ in range(n)]))


def run(exe, *args):
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


def main():
    exe = sys.argv[1]
    failed, passed = [], []

    def check(ok, what, r):
        print(("ok   " if ok else "FAIL ") + what)
        (passed if ok else failed).append(what)
        if not ok:
            print(f"  exit {r.returncode}\n  stdout: {r.stdout}\n  stderr: {r.stderr}")

    for flag in ("--help", "-h"):
        r = run(exe, flag)
        check(r.returncode == 0 and r.stdout.startswith("usage: train_gpt2")
              and "--context" in r.stdout and "needs a value" not in r.stderr,
              f"{flag} prints the usage and exits 0", r)
    r = run(exe, "--batch", "2", "--help")
    check(r.returncode == 0 and "usage: train_gpt2" in r.stdout, "--help after options", r)
    r = run(exe, "--batch")
    check(r.returncode != 0 and "--batch needs a value" in r.stderr,
          "a missing value is still refused", r)

    with tempfile.TemporaryDirectory() as d:
        init, data = os.path.join(d, "init.bin"), os.path.join(d, "train.bin")
        write_llmc(init)
        write_tokens(data, 4096)
        base = ["--init", init, "--data", data, "--batch", "2", "--steps", "1", "--lr", "1e-3"]
        r = run(exe, *base, "--context", str(CTX))
        check(r.returncode == 0 and "result loss=" in r.stdout,
              f"--context {CTX}, the table's rows, trains", r)
        r = run(exe, *base, "--context", str(2 * CTX))
        check(r.returncode != 0 and f"--context {2 * CTX}" in r.stderr
              and f"position table ({CTX} rows" in r.stderr and "step 0" not in r.stdout,
              f"--context {2 * CTX} past the {CTX}-row table is refused", r)
    print(f"{len(passed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
