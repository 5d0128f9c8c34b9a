#!/usr/bin/python3
"""The `reference` suite: examples/generate on HF directories of random weights against the
PyTorch references of hf_ref.py (float64, full recomputation): a Llama with grouped-query
attention, llama3 rope scaling and tied embeddings (one safetensors file); a Qwen2 (q/k/v
biases, one kv head, untied head, rope_theta 1e6, a sharded set with an index, in bf16 as HF
ships most models: both sides compute from the bf16 values); a GPT-2. For
each, on each mesh (argv: generate, the mpiexec wrapper, then MESH:NPROCS...): two prompts of
different lengths batched, the prompt positions' logits within 1e-5 of the reference's
(max abs difference over the reference's max abs logit), and 32 greedy tokens per row from our
key/value cache equal to the reference's full-recompute decoding, token for token. Then
sampling (temperature, top-k, top-p, a seed) gives the same tokens on every mesh, and top-k 1
gives the greedy tokens (on the first mesh; sampling on the first and the last). --gpu adds
a 1x2 GPU mesh (DT_GPU=sim without a GPU).
Prints `N passed, N failed`."""
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_ref  # noqa: E402

TOL = 1e-5
NEW = 32
PROMPTS = [[5, 17, 42, 8, 3], [60, 2, 33, 71, 9, 11, 27, 50]]


def run(cmd, nprocs, mpiexec):
    if nprocs > 1:
        cmd = [mpiexec, "-n", str(nprocs)] + cmd
    env = dict(os.environ)
    env.pop("DT_CPU_DEVICES", None)
    if "gpu" in os.path.basename(cmd[cmd.index("--mesh") + 1] if "--mesh" in cmd else ""):
        env["DT_GPU"] = env.get("DT_GPU", "sim")
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def ids_of(out):
    return [[int(v) for v in line.split()[2:]] for line in out.splitlines()
            if line.startswith("ids ")]


def main():
    exe, mpiexec = sys.argv[1], sys.argv[2]
    args = [a for a in sys.argv[3:] if a != "--gpu" and not a.startswith("--tool=")]
    tool = next((a[len("--tool="):] for a in sys.argv[3:] if a.startswith("--tool=")), None)
    meshes = [(m.rsplit(":", 1)[0], int(m.rsplit(":", 1)[1])) for m in args]
    torch.set_num_threads(1)
    passed, failed = 0, 0

    def check(ok, what):
        nonlocal passed, failed
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        passed += ok
        failed += not ok

    with tempfile.TemporaryDirectory() as tmp:
        if "--gpu" in sys.argv:
            # A GPU mesh (1x2, one process): a real GPU, else DT_GPU=sim's simulated one.
            gpu = os.path.join(tmp, "gpu_1x2.yaml")
            with open(gpu, "w") as f:
                f.write("mesh:\n  name: gpu_1x2\n  device_type: GPU\n"
                        "  dims: {batch: 1, model: 2}\n")
            meshes.append((gpu, 1))
        models = {
            "llama": hf_ref.make_llama(os.path.join(tmp, "llama"), seed=1),
            "qwen2": hf_ref.make_llama(os.path.join(tmp, "qwen2"), seed=2, model_type="qwen2",
                                       kv_heads=1, tie=False, rope_theta=1e6, llama3=False,
                                       shards=2, bf16=True),
            "gpt2": hf_ref.make_gpt2(os.path.join(tmp, "gpt2"), seed=3),
        }
        for name in models:
            d = os.path.join(tmp, name)
            cfg, w = hf_ref.load_dir(d)
            V = cfg["vocab_size"]
            n = min(len(p) for p in PROMPTS)
            ref_logits = torch.stack([hf_ref.logits(cfg, w, [p[:n]])[0] for p in PROMPTS])
            ref_tokens = [hf_ref.greedy(cfg, w, p, NEW) for p in PROMPTS]
            sampled = {}
            for mesh, nprocs in meshes:
                tag = f"{name} on {os.path.basename(mesh)} x{nprocs}"
                lpath = os.path.join(tmp, f"{name}.logits")
                args = [exe, "--model", d, "--mesh", mesh, "--tokens", str(NEW), "--ignore-eos",
                        "--print-ids", "--logits-out", lpath]
                for p in PROMPTS:
                    args += ["--ids", ",".join(map(str, p))]
                r = run(args, nprocs, mpiexec)
                if r.returncode != 0:
                    check(False, f"{tag}: generate failed:\n{r.stdout}{r.stderr}")
                    continue
                with open(lpath, "rb") as f:
                    ours = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).double()
                ours = ours.reshape(len(PROMPTS), n, V)
                err = float((ours - ref_logits).abs().max() / ref_logits.abs().max())
                check(err <= TOL, f"{tag}: logits within {TOL:g} relative of the reference "
                      f"(max {err:.2e})")
                got = ids_of(r.stdout)
                check(got == ref_tokens, f"{tag}: {NEW} greedy tokens per row equal the "
                      f"reference's full recompute" + ("" if got == ref_tokens else
                                                       f"\n  ours {got}\n  ref  {ref_tokens}"))
                # `dtensor generate` (examples/generate's run as a subcommand): the Llama on
                # the first and the last mesh, the reference's greedy tokens.
                if tool and name == "llama" and mesh in (meshes[0][0], meshes[-1][0]):
                    t = run([tool, "generate", "--model", d, "--mesh", mesh, "--max-tokens",
                             str(NEW), "--ignore-eos", "--print-ids"]
                            + sum((["--ids", ",".join(map(str, p))] for p in PROMPTS), []),
                            nprocs, mpiexec)
                    check(t.returncode == 0 and ids_of(t.stdout) == ref_tokens,
                          f"{tag}: dtensor generate gives the reference's greedy tokens"
                          + ("" if t.returncode == 0 else f"\n{t.stdout}{t.stderr}"))
                # Sampling on the first and the last mesh (they must agree), top-k 1 on the
                # first: fewer process starts (each is most of a run's time).
                if mesh in (meshes[0][0], meshes[-1][0]):
                    r = run([exe, "--model", d, "--mesh", mesh, "--tokens", "12",
                             "--ignore-eos", "--print-ids", "--temperature", "0.8", "--top-k",
                             "20", "--top-p", "0.9", "--seed", "7"]
                            + sum((["--ids", ",".join(map(str, p))] for p in PROMPTS), []),
                            nprocs, mpiexec)
                    sampled[mesh] = ids_of(r.stdout) if r.returncode == 0 else None
                if mesh != meshes[0][0]:
                    continue
                k1 = run([exe, "--model", d, "--mesh", mesh, "--tokens", "12", "--ignore-eos",
                          "--print-ids", "--temperature", "1.5", "--top-k", "1", "--seed", "9",
                          "--ids", ",".join(map(str, PROMPTS[0]))], nprocs, mpiexec)
                check(k1.returncode == 0 and ids_of(k1.stdout) == [ref_tokens[0][:12]],
                      f"{tag}: top-k 1 sampling gives the greedy tokens")
            vals = list(sampled.values())
            check(all(v is not None and v == vals[0] and len(v[0]) == 12 for v in vals),
                  f"{name}: sampled tokens (temperature, top-k, top-p, seed) agree on the first "
                  f"and the last mesh")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
