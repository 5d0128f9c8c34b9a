#!/usr/bin/python3
"""examples/train_moe across expert-parallel degrees (docs/moe.md, "The same bits at every EP
degree"): a run of 8 steps on 2 processes (EP 2, 2 experts each) saved after step 4 with the
AdamW moments, the routing bias and the step; the same 8 steps uninterrupted on 4 processes
(EP 4) and on 1 (EP 1) print every step's line (loss, total, dropped fraction, load) and the
held-out loss (17 digits) bit for bit as at EP 2; resumed on 2, 4 and 1 processes, steps 5-8
and the held-out loss are the uninterrupted run's bit for bit. Then --export: the HF directory
has Mixtral's per-expert names and [out, in] shapes (read here from the safetensors header),
and --init-hf reads it back at EP 2, 4 and 1: the exporting run's held-out loss bit for bit.
argv: train_moe, the mpiexec wrapper [, --quick: under the sanitizers, only the resume at EP 4
and the read-back at EP 2]. Prints `N passed, N failed`."""
import json
import os
import struct
import subprocess
import sys
import tempfile

ARGS = ["--steps", "8", "--batch", "8", "--moe", "4", "--topk", "2", "--heldout", "64",
        "--capacity", "1.25"]


def run(train, mpiexec, nprocs, extra):
    cmd = [train] + ARGS + extra
    if nprocs > 1:
        cmd = [mpiexec, "-n", str(nprocs)] + cmd
    env = dict(os.environ)
    env["DT_CPU_DEVICES"] = "1"
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr[-3000:])
    steps = {}
    held = None
    for line in r.stdout.splitlines():
        w = line.split()
        if w and w[0] == "step":
            steps[int(w[1])] = (w[3], w[-1], line)  # the loss as printed, the load, all
        elif w and w[0] == "heldout":
            held = w[1]
    return r.returncode, steps, held


def main():
    train, mpiexec = sys.argv[1], sys.argv[2]
    quick = "--quick" in sys.argv[3:]
    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        passed, failed = passed + ok, failed + (not ok)

    with tempfile.TemporaryDirectory() as tmp:
        ck, hf = os.path.join(tmp, "ep2"), os.path.join(tmp, "hf")
        rc, full, held = run(train, mpiexec, 2, ["--save", ck, "--save-at", "4", "--export", hf])
        check(rc == 0 and len(full) == 8 and os.path.isdir(ck),
              "EP 2: 8 steps, saved after step 4")
        for nprocs in () if quick else (4, 1):
            rc, res, rheld = run(train, mpiexec, nprocs, [])
            diff = [s for s in range(1, 9) if res.get(s) != full.get(s)]
            check(rc == 0 and len(full) == 8 and not diff and rheld == held,
                  f"EP {nprocs} uninterrupted: the 8 step lines and held-out bit for bit as at "
                  f"EP 2 ({rheld} vs {held}; steps differing: {diff})")
        for nprocs in (4,) if quick else (2, 4, 1):
            rc, res, rheld = run(train, mpiexec, nprocs, ["--resume", ck])
            ok = rc == 0 and sorted(res) == [5, 6, 7, 8]
            same = ok and all(res[s] == full[s] for s in res) and rheld == held
            check(same, f"resumed at EP {nprocs}: steps 5-8 and held-out bit for bit "
                  f"({rheld} vs {held})")
        names = {}
        if os.path.isdir(hf):
            with open(os.path.join(hf, "model.safetensors"), "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                names = json.loads(f.read(n))
        want = {"model.layers.1.block_sparse_moe.gate.weight": [4, 32],
                "model.layers.0.block_sparse_moe.experts.3.w1.weight": [16, 32],
                "model.layers.0.block_sparse_moe.experts.0.w2.weight": [32, 16],
                "model.layers.1.block_sparse_moe.experts.2.w3.weight": [16, 32],
                "model.layers.0.self_attn.q_proj.weight": [32, 32],
                "lm_head.weight": [28, 32], "model.embed_tokens.weight": [28, 32]}
        ok = all(names.get(k, {}).get("shape") == v for k, v in want.items())
        experts = sum(".experts." in k for k in names)
        check(ok and experts == 2 * 4 * 3,
              f"--export: Mixtral names and shapes, {experts} expert tensors")
        for nprocs in (2,) if quick else (2, 4, 1):
            rc, _, rheld = run(train, mpiexec, nprocs, ["--init-hf", hf, "--steps", "0"])
            check(rc == 0 and rheld == held,
                  f"--init-hf at EP {nprocs}: held-out bit for bit ({rheld} vs {held})")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
