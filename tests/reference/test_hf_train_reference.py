#!/usr/bin/python3
"""The `reference` suite: examples/train_llama fine-tuning HF directories of random weights
(a Llama with grouped-query attention, llama3 rope scaling and tied embeddings; a sharded
Qwen2 with q/k/v biases, one kv head and an untied head; a GPT-2) for 10 AdamW steps on llm.c
tokens, against hf_ref.train (PyTorch's AdamW, float64): every step's loss within 1e-4
relative, on each mesh (argv: train_llama, generate, the mpiexec wrapper, then
MESH:NPROCS...). On the first mesh also --out: the exported HF directory, read back by
hf_ref's own reader, holds the reference's trained weights (1e-4 relative per tensor), and
examples/generate reads it and gives the reference's greedy tokens of those weights.
Prints `N passed, N failed`."""
import os
import re
import struct
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_ref  # noqa: E402

B, T, STEPS, LR, WD = 4, 16, 10, 1e-3, 0.1
TOL = 1e-4
# Adam's epsilon: 1e-4 (not 1e-8), so that parameters whose gradients are near roundoff are
# not moved by Adam's normalisation of that roundoff (as gpt2_reference's trained-weights
# check); the losses do not depend on it at this tolerance.
EPS = 1e-4


def run(cmd, nprocs, mpiexec):
    if nprocs > 1:
        cmd = [mpiexec, "-n", str(nprocs)] + cmd
    env = dict(os.environ)
    env.pop("DT_CPU_DEVICES", None)
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def skip_k_bias(name, diff, cfg):
    """diff without the key bias: softmax is blind to it, so its gradient is roundoff that
    Adam's normalisation turns into steps of the learning rate's size in either direction,
    on our side and PyTorch's alike."""
    if name.endswith("k_proj.bias"):
        return diff * 0
    if name.endswith("c_attn.bias"):
        C = cfg["n_embd"]
        return torch.cat([diff[:C], diff[2 * C:]])
    return diff


def main():
    train, gen, mpiexec = sys.argv[1], sys.argv[2], sys.argv[3]
    meshes = [(m.rsplit(":", 1)[0], int(m.rsplit(":", 1)[1])) for m in sys.argv[4:]]
    torch.set_num_threads(1)
    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        passed += ok
        failed += not ok

    with tempfile.TemporaryDirectory() as tmp:
        g = torch.Generator().manual_seed(11)
        toks = torch.randint(0, 96, (B * T * STEPS + 1,), generator=g).tolist()
        shard = os.path.join(tmp, "toks.bin")
        with open(shard, "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
            f.write(struct.pack(f"<{len(toks)}H", *toks))
        models = {
            "llama": lambda d: hf_ref.make_llama(d, seed=1),
            "qwen2": lambda d: hf_ref.make_llama(d, seed=2, model_type="qwen2", kv_heads=1,
                                                 tie=False, rope_theta=1e6, llama3=False,
                                                 shards=2),
            "gpt2": lambda d: hf_ref.make_gpt2(d, seed=3),
        }
        for name, make in models.items():
            d = os.path.join(tmp, name)
            make(d)
            cfg, w = hf_ref.load_dir(d)
            ref, trained = hf_ref.train(cfg, w, toks, B, T, STEPS, LR, WD, eps=EPS)
            for i, (mesh, nprocs) in enumerate(meshes):
                tag = f"{name} on {os.path.basename(mesh)} x{nprocs}"
                out = os.path.join(tmp, name + "-out")
                args = [train, "--model", d, "--data", shard, "--batch", str(B), "--context",
                        str(T), "--steps", str(STEPS), "--lr", str(LR), "--weight-decay",
                        str(WD), "--eps", str(EPS), "--mesh", mesh] + (["--out", out] if i == 0 else [])
                # Qwen2's export sharded (model-0000i-of-0000N and the index) at 64 KB.
                if i == 0 and name == "qwen2":
                    args += ["--max-file-bytes", "65536"]
                r = run(args, nprocs, mpiexec)
                ours = [float(m.group(1)) for m in re.finditer(r"^step \d+ loss (\S+)",
                                                                r.stdout, re.M)]
                if r.returncode != 0 or len(ours) != STEPS:
                    check(False, f"{tag}: train_llama failed:\n{r.stdout}{r.stderr}")
                    continue
                err = max(abs(a - b) / abs(b) for a, b in zip(ours, ref))
                check(err <= TOL, f"{tag}: {STEPS} AdamW steps' losses within {TOL:g} of "
                      f"PyTorch's (max {err:.2e})")
                if i > 0:
                    continue
                hf = os.path.join(out, "hf")
                if name == "qwen2":
                    check(os.path.exists(os.path.join(hf, "model.safetensors.index.json")) and
                          sum(f.startswith("model-0000") for f in os.listdir(hf)) > 1,
                          "qwen2: the export above --max-file-bytes is sharded with an index")
                ecfg, ew = hf_ref.load_dir(hf)
                bad = [k for k in trained if k not in ew or
                       float(skip_k_bias(k, ew[k] - trained[k], cfg).abs().max()) >
                       TOL * max(float(trained[k].abs().max()), 1e-3)]
                check(not bad and set(ew) == set(trained) and ecfg["model_type"] ==
                      cfg["model_type"], f"{name}: the exported HF directory holds the "
                      f"reference's trained weights under HF names" + (f" (bad: {bad[:3]}: " + ", ".join(
                          f"{float((ew[k] - trained[k]).abs().max()):.2e} of "
                          f"{float(trained[k].abs().max()):.2e}" for k in bad[:3] if k in ew)
                          + ")" if bad else ""))
                p = [5, 17, 42, 8, 3]
                want = hf_ref.greedy(ecfg, trained, p, 16)
                r = run([gen, "--model", hf, "--ids", ",".join(map(str, p)), "--tokens", "16",
                         "--ignore-eos", "--print-ids"], 1, mpiexec)
                got = [[int(v) for v in line.split()[2:]] for line in r.stdout.splitlines()
                       if line.startswith("ids ")]
                check(got == [want], f"{name}: generate on the export gives the reference's "
                      f"greedy tokens of the trained weights")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
