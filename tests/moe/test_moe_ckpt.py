#!/usr/bin/python3
"""examples/train_moe checkpoints across expert-parallel degrees (docs/moe.md): a run of 8
steps on 2 processes (EP 2, 2 experts each) saved after step 4 with the AdamW moments, the
routing bias and the step; resumed on 2 processes its steps 5-8 and held-out loss are the
uninterrupted run's bit for bit; resumed on 4 processes (EP 4) and on 1 (EP 1) the same steps
agree to rounding (1e-6 relative: the dense gradients sum the batch per device, grouped
differently at another degree) and the same experts' load is printed. Then --export: the HF
directory has Mixtral's per-expert names and [out, in] shapes (read here from the safetensors
header), and --init-hf reads it back: at EP 2 the held-out loss of the exporting run bit for
bit, at EP 4 and EP 1 within 1e-6.
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
            steps[int(w[1])] = (w[3], w[-1])  # the loss as printed, the load
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
        for nprocs in (4,) if quick else (2, 4, 1):
            rc, res, rheld = run(train, mpiexec, nprocs, ["--resume", ck])
            ok = rc == 0 and sorted(res) == [5, 6, 7, 8]
            if nprocs == 2:
                same = ok and all(res[s] == full[s] for s in res) and rheld == held
                check(same, f"resumed at EP 2: steps 5-8 and held-out bit for bit "
                      f"({rheld} vs {held})")
                continue
            worst = max((abs(float(res[s][0]) - float(full[s][0])) / float(full[s][0])
                         for s in res), default=1.0) if ok else 1.0
            hw = abs(float(rheld) - float(held)) / float(held) if ok and rheld else 1.0
            check(ok and worst <= 1e-6 and hw <= 1e-6,
                  f"resumed at EP {nprocs}: steps 5-8 within 1e-6 (worst {worst:.1e}), "
                  f"held-out {rheld} vs {held}")
            check(ok and res[5][1] == full[5][1],
                  f"resumed at EP {nprocs}: step 5 routes the same load ({res.get(5)})")
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
            if nprocs == 2:
                check(rc == 0 and rheld == held,
                      f"--init-hf at EP 2: held-out bit for bit ({rheld} vs {held})")
            else:
                d = abs(float(rheld) - float(held)) / float(held) if rc == 0 else 1.0
                check(d <= 1e-6, f"--init-hf at EP {nprocs}: held-out {rheld} vs {held}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
