#!/usr/bin/python3
"""The `reference` suite: examples/train_moe (a decoder with routed experts, docs/moe.md)
against the same model written here in PyTorch (float64), from the same initial weights
(train_moe --dump writes them) on the same batches: 10 AdamW steps, every step's loss within
1e-5 relative, the same experts chosen for every token at step 0, every gradient of step 0
within 1e-4 of its largest magnitude; routing by softmax with the balancing bias (its update
after each step), and by sigmoid with the auxiliary loss, the z-loss and capacity dropping;
each on 1 process, 2 processes (EP 2: 2 experts each) and 4 processes (EP 4); the first also
on 2 processes with the dense parameters stepped by ZeRO stage 1 (--zero 1).
argv: train_moe, the mpiexec wrapper. Prints `N passed, N failed`."""
import math
import os
import subprocess
import sys
import tempfile

import torch

STEPS, B, T, V = 10, 8, 16, 28
C, H, L, E, K, F = 32, 4, 2, 4, 2, 16
LR = 3e-3
TOL, GTOL = 1e-5, 1e-4

VARIANTS = {
    "softmax-bias": dict(score="softmax", balance="bias", capacity=0.0, aux=0.0, z=0.0),
    "sigmoid-aux-capacity": dict(score="sigmoid", balance="aux", capacity=1.0, aux=1e-2,
                                 z=1e-3),
}


def run_ours(train, mpiexec, nprocs, var, out, extra=()):
    cmd = [train, "--steps", str(STEPS), "--batch", str(B), "--moe", str(E), "--topk", str(K),
           "--hidden", str(F), "--width", str(C), "--heads", str(H), "--layers", str(L),
           "--lr", str(LR), "--score", var["score"], "--balance", var["balance"],
           "--capacity", str(var["capacity"]), "--aux-coeff", str(var["aux"]),
           "--z-coeff", str(var["z"]), "--heldout", "16", "--dump", out, "--quiet"] + list(extra)
    if nprocs > 1:
        cmd = [mpiexec, "-n", str(nprocs)] + cmd
    env = dict(os.environ)
    env["DT_CPU_DEVICES"] = "1"
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def read_dump(out):
    steps, ids, labels, choices = [], [], [], None
    with open(os.path.join(out, "steps.txt")) as f:
        for line in f:
            w = line.split()
            if w[0] == "step":
                steps.append(float(w[3]))
            elif w[0] == "ids":
                ids.append([int(x) for x in w[1:]])
            elif w[0] == "labels":
                labels.append([int(x) for x in w[1:]])
            elif w[0] == "choices":
                choices = [int(x) for x in w[1:]]
    return steps, ids, labels, choices


def param_shapes():
    shapes = [("wte", (V, C)), ("wpe", (T, C))]
    for l in range(L):
        shapes += [(f"l{l}.attn_norm", (C,))]
        shapes += [(f"l{l}.{n}", (C, C)) for n in ("wq", "wk", "wv", "wo")]
        shapes += [(f"l{l}.mlp_norm", (C,)), (f"l{l}.gate", (C, E)), (f"l{l}.w1", (E, C, F)),
                   (f"l{l}.w3", (E, C, F)), (f"l{l}.w2", (E, F, C))]
    return shapes + [("norm", (C,)), ("head", (C, V))]


def load(out, prefix, name, shape):
    with open(os.path.join(out, f"{prefix}_{name}.f32"), "rb") as f:
        data = f.read()
    t = torch.frombuffer(bytearray(data), dtype=torch.float32).reshape(shape)
    return t.to(torch.float64)


def rms(x, g):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5) * g


def moe(var, p, l, x, bias):
    """x [N, C] -> y, aux, choices [N, K], kept load per expert."""
    logits = x @ p[f"l{l}.gate"]
    scores = torch.sigmoid(logits) if var["score"] == "sigmoid" else torch.softmax(logits, -1)
    choice = scores.detach() + bias.to(torch.float64)
    idx = torch.topk(choice, K, dim=-1).indices
    g = torch.gather(scores, 1, idx)
    g = g / g.sum(-1, keepdim=True)
    n = x.shape[0]
    keep = torch.ones(n, K, dtype=torch.float64)
    load = [0] * E
    chosen = [0] * E
    if var["capacity"] > 0:
        cap = math.ceil(T * K * var["capacity"] / E)
    else:
        cap = n * K
    for g0 in range(0, n, T):  # capacity per sequence, first choices first
        used = [0] * E
        for k in range(K):
            for t in range(g0, g0 + T):
                e = int(idx[t, k])
                chosen[e] += 1
                if used[e] < cap:
                    used[e] += 1
                    load[e] += 1
                else:
                    keep[t, k] = 0
    y = torch.zeros_like(x)
    for e in range(E):
        sel = idx == e
        if not bool(sel.any()):
            continue
        h = (torch.nn.functional.silu(x @ p[f"l{l}.w1"][e]) * (x @ p[f"l{l}.w3"][e])) @ \
            p[f"l{l}.w2"][e]
        w = (g * keep * sel).sum(-1, keepdim=True)
        y = y + w * h
    aux = torch.zeros((), dtype=torch.float64)
    if var["balance"] == "aux":
        f = torch.tensor([var["aux"] * E * c / (n * K) for c in chosen], dtype=torch.float64)
        pn = scores / scores.sum(-1, keepdim=True)
        aux = aux + (pn.mean(0) * f).sum()
    if var["z"] > 0:
        aux = aux + var["z"] * (torch.logsumexp(logits, -1) ** 2).mean()
    return y, aux, idx, load


def forward(var, p, ids, labels, biases):
    x = p["wte"][ids] + p["wpe"]
    total_aux = torch.zeros((), dtype=torch.float64)
    choices, loads = [], []
    hd = C // H
    for l in range(L):
        h = rms(x, p[f"l{l}.attn_norm"])
        q, k, v = (h @ p[f"l{l}.{n}"] for n in ("wq", "wk", "wv"))
        q, k, v = (t.reshape(B, T, H, hd).transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        a = torch.softmax(s.masked_fill(mask, float("-inf")), -1) @ v
        x = x + a.transpose(1, 2).reshape(B, T, C) @ p[f"l{l}.wo"]
        h = rms(x, p[f"l{l}.mlp_norm"]).reshape(B * T, C)
        y, aux, idx, load = moe(var, p, l, h, biases[l])
        x = x + y.reshape(B, T, C)
        total_aux = total_aux + aux
        choices.append(idx)
        loads.append(load)
    logits = rms(x, p["norm"]) @ p["head"]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), labels.reshape(-1),
                                             ignore_index=-1)
    return loss, loss + total_aux, choices, loads


def bias_update(bias, load, coeff=1e-3):
    """In f32, as moe_bias_update."""
    mean = torch.tensor(sum(load), dtype=torch.float32) / torch.tensor(E, dtype=torch.float32)
    for e in range(E):
        d = float(mean - torch.tensor(load[e], dtype=torch.float32))
        bias[e] += torch.tensor(coeff if d > 0 else -coeff if d < 0 else 0.0,
                                dtype=torch.float32)
    bias -= bias.sum() / torch.tensor(E, dtype=torch.float32)


def reference(var, out, ids, labels):
    shapes = param_shapes()
    p = {n: load(out, "init", n, s).requires_grad_(True) for n, s in shapes}
    opt = torch.optim.AdamW([p[n] for n, _ in shapes], lr=LR, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    biases = [torch.zeros(E, dtype=torch.float32) for _ in range(L)]
    losses, choices0, grads0 = [], None, None
    for step in range(STEPS):
        x = torch.tensor(ids[step]).reshape(B, T)
        y = torch.tensor(labels[step]).reshape(B, T)
        opt.zero_grad()
        loss, total, choices, loads = forward(var, p, x, y, biases)
        total.backward()
        if step == 0:
            choices0 = torch.stack(choices).reshape(-1).tolist()
            grads0 = {n: p[n].grad.detach().clone() for n, _ in shapes}
        opt.step()
        if var["balance"] == "bias":
            for l in range(L):
                bias_update(biases[l], loads[l])
        losses.append(float(loss))
    return losses, choices0, grads0


def main():
    train, mpiexec = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        passed, failed = passed + ok, failed + (not ok)

    for vname, var in VARIANTS.items():
        ref = None
        runs = [(1, ()), (2, ()), (4, ())]
        if vname == "softmax-bias":  # the dense parameters through ZeRO stage 1
            runs.append((2, ("--zero", "1")))
        for nprocs, extra in runs:
            if extra:
                vname = vname.split(" ")[0] + " zero1"
            with tempfile.TemporaryDirectory() as out:
                r = run_ours(train, mpiexec, nprocs, var, out, extra)
                if r.returncode != 0:
                    check(False, f"{vname} np{nprocs}: train_moe exit {r.returncode}\n"
                          f"{r.stderr[-2000:]}")
                    continue
                losses, ids, labels, choices = read_dump(out)
                if ref is None:
                    ref = reference(var, out, ids, labels)
                rl, rc, rg = ref
                worst = max(abs(a - b) / abs(b) for a, b in zip(losses, rl))
                check(len(losses) == STEPS and worst <= TOL,
                      f"{vname} np{nprocs}: 10 losses within {TOL} relative (worst {worst:.2e};"
                      f" ours {losses[-1]:.7f}, torch {rl[-1]:.7f})")
                same = sum(a == b for a, b in zip(choices, rc))
                check(choices == rc, f"{vname} np{nprocs}: step 0 experts chosen the same "
                      f"({same} of {len(rc)})")
                gw, gname = 0.0, ""
                for n, s in param_shapes():
                    g = load(out, "grad0", n, s)
                    d = float((g - rg[n]).abs().max() / max(float(rg[n].abs().max()), 1e-30))
                    if d > gw:
                        gw, gname = d, n
                check(gw <= GTOL, f"{vname} np{nprocs}: step 0 gradients within {GTOL} of "
                      f"their largest (worst {gw:.2e}, {gname})")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
