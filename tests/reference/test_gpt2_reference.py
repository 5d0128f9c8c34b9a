#!/usr/bin/python3
"""The `reference` suite: examples/train_gpt2 against PyTorch (gpt2_ref.py) from the same
initial weights on the same llm.c tokens, 10 AdamW steps in f32 on one mesh (argv: the
train_gpt2 binary, the mpiexec wrapper, the mesh file, the process count). Every step's loss
must agree within 1e-4 relative, and step 0's gradients tensor by tensor (max abs difference
over the tensor's max abs value, at least 1e-3 of the step's largest) within 1e-4. Prints `N passed, N failed`."""
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpt2_ref  # noqa: E402

import torch  # noqa: E402

CFG = dict(layers=2, width=64, heads=4, vocab=128, context=16)
B, T, STEPS, LR, WD = 4, 16, 10, 1e-3, 0.1
TOL = 1e-4


def losses(text):
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 4 and f[0] == "step":
            out.append(float(f[3]))
    return out


def main():
    exe, mpiexec, mesh, nprocs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    d = tempfile.mkdtemp(prefix="gpt2ref-")
    passed = failed = 0
    try:
        init, toks = os.path.join(d, "init.safetensors"), os.path.join(d, "train.bin")
        a = type("A", (), {})()
        for k, v in CFG.items():
            setattr(a, k, v)
        a.out, a.seed = init, 1
        gpt2_ref.make_init(a)
        with open(os.path.join(d, "config.json"), "w") as f:
            f.write('{"n_head": %d}' % CFG["heads"])
        a = type("A", (), {})()
        a.out, a.tokens, a.vocab, a.seed = toks, 2000, CFG["vocab"], 2
        gpt2_ref.make_tokens(a)
        common = ["--batch", str(B), "--context", str(T), "--steps", str(STEPS), "--lr", str(LR),
                  "--weight-decay", str(WD)]
        ref = subprocess.run([sys.executable, os.path.join(HERE, "gpt2_ref.py"), "train",
                              "--init", init, "--data", toks, "--heads", str(CFG["heads"]),
                              "--grads-out", os.path.join(d, "ref_grads.safetensors")] + common,
                             capture_output=True, text=True, check=True).stdout
        cmd = [exe, "--init", init, "--data", toks, "--mesh", mesh, "--grads-out",
               os.path.join(d, "grads")] + common
        if nprocs > 1:
            cmd = [mpiexec, "-n", str(nprocs)] + cmd
        env = dict(os.environ)
        env.pop("DT_CPU_DEVICES", None)
        ours = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if ours.returncode != 0:
            print(ours.stdout, ours.stderr)
            print("0 passed, 1 failed")
            return 1
        lr_, lo = losses(ref), losses(ours.stdout)
        ok = len(lr_) == STEPS and len(lo) == STEPS
        for s in range(min(len(lr_), len(lo))):
            rel = abs(lo[s] - lr_[s]) / abs(lr_[s])
            good = rel <= TOL
            ok = ok and good
            print(f"step {s} ours {lo[s]:.9g} torch {lr_[s]:.9g} rel {rel:.2e} {'ok' if good else 'FAIL'}")
        passed, failed = passed + ok, failed + (not ok)
        g = gpt2_ref.st_read(os.path.join(d, "ref_grads.safetensors"))
        worst, bad = 0.0, []
        # The key bias's true gradient is zero (a constant added to every key's score cancels
        # in the softmax): both sides hold rounding noise there, so the scale a difference is
        # measured against is at least 1e-3 of the largest gradient of the step.
        floor = 1e-3 * max(t.abs().max().item() for t in g.values())
        for name, t in g.items():
            with open(os.path.join(d, "grads", name + ".f32"), "rb") as f:
                raw = f.read()
            mine = torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(t.shape)
            scale = t.abs().max().item()
            rel = (mine - t).abs().max().item() / max(scale, floor)
            worst = max(worst, rel)
            if not rel <= TOL:
                bad.append(f"{name} rel {rel:.2e}")
        print(f"step-0 gradients: {len(g)} tensors, worst relative difference {worst:.2e}")
        for b in bad:
            print("  FAIL", b)
        passed, failed = passed + (not bad), failed + bool(bad)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
