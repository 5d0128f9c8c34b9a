#!/usr/bin/python3
"""The `reference` suite: examples/train_gpt2 against PyTorch (gpt2_ref.py) from the same
initial weights on the same llm.c tokens, 10 AdamW steps in f32 on one mesh (argv: the
train_gpt2 binary, the mpiexec wrapper, the mesh file, the process count). Every step's loss
must agree within 1e-4 relative, and step 0's gradients tensor by tensor (max abs difference
over the tensor's max abs value, at least 1e-3 of the step's largest) within 1e-4. Prints `N passed, N failed`."""
import argparse
import contextlib
import io
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


def check_mesh(exe, mpiexec, mesh, nprocs, d, init, toks, common, ref, g):
    """One mesh: returns (passed, failed) of its two checks."""
    out = os.path.join(d, "grads-" + os.path.basename(mesh))
    cmd = [exe, "--init", init, "--data", toks, "--mesh", mesh, "--grads-out", out] + common
    if nprocs > 1:
        cmd = [mpiexec, "-n", str(nprocs)] + cmd
    env = dict(os.environ)
    env.pop("DT_CPU_DEVICES", None)
    ours = subprocess.run(cmd, capture_output=True, text=True, env=env)
    print(f"== {os.path.basename(mesh)} on {nprocs} process(es)")
    if ours.returncode != 0:
        print(ours.stdout, ours.stderr)
        return 0, 2
    lr_, lo = losses(ref), losses(ours.stdout)
    ok = len(lr_) == STEPS and len(lo) == STEPS
    for s in range(min(len(lr_), len(lo))):
        rel = abs(lo[s] - lr_[s]) / abs(lr_[s])
        good = rel <= TOL
        ok = ok and good
        print(f"step {s} ours {lo[s]:.9g} torch {lr_[s]:.9g} rel {rel:.2e} {'ok' if good else 'FAIL'}")
    worst, bad = 0.0, []
    # The key bias's true gradient is zero (a constant added to every key's score cancels in
    # the softmax): both sides hold rounding noise there, so the scale a difference is
    # measured against is at least 1e-3 of the largest gradient of the step.
    floor = 1e-3 * max(t.abs().max().item() for t in g.values())
    for name, t in g.items():
        with open(os.path.join(out, name + ".f32"), "rb") as f:
            raw = f.read()
        mine = torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(t.shape)
        rel = (mine - t).abs().max().item() / max(t.abs().max().item(), floor)
        worst = max(worst, rel)
        if not rel <= TOL:
            bad.append(f"{name} rel {rel:.2e}")
    print(f"step-0 gradients: {len(g)} tensors, worst relative difference {worst:.2e}")
    for b in bad:
        print("  FAIL", b)
    return int(ok) + int(not bad), int(not ok) + int(bool(bad))


def main():
    """argv: train_gpt2, mpiexec, then MESH.yaml:PROCESSES for each mesh."""
    exe, mpiexec = sys.argv[1], sys.argv[2]
    d = tempfile.mkdtemp(prefix="gpt2ref-")
    passed = failed = 0
    try:
        init, toks = os.path.join(d, "init.safetensors"), os.path.join(d, "train.bin")
        a = argparse.Namespace(out=init, seed=1, **CFG)
        gpt2_ref.make_init(a)
        with open(os.path.join(d, "config.json"), "w") as f:
            f.write('{"n_head": %d}' % CFG["heads"])
        gpt2_ref.make_tokens(argparse.Namespace(out=toks, tokens=2000, vocab=CFG["vocab"], seed=2))
        common = ["--batch", str(B), "--context", str(T), "--steps", str(STEPS), "--lr", str(LR),
                  "--weight-decay", str(WD)]
        gpath = os.path.join(d, "ref_grads.safetensors")
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            gpt2_ref.train(argparse.Namespace(init=init, data=toks, heads=CFG["heads"], batch=B,
                                              context=T, steps=STEPS, lr=LR, weight_decay=WD,
                                              beta1=0.9, beta2=0.999, eps=1e-8, clip=1.0,
                                              grads_out=gpath))
        ref, g = buf.getvalue(), gpt2_ref.st_read(gpath)
        for arg in sys.argv[3:]:
            mesh, nprocs = arg.rsplit(":", 1)
            p, f = check_mesh(exe, mpiexec, mesh, int(nprocs), d, init, toks, common, ref, g)
            passed, failed = passed + p, failed + f
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
