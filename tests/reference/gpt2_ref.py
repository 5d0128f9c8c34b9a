#!/usr/bin/python3
"""The PyTorch reference of examples/train_gpt2 (the `reference` suite): GPT-2 in torch from
the same initial weights (an HF-named safetensors file) on the same llm.c token shard, trained
with torch.optim.AdamW, printing `step N loss L` per step and writing step 0's gradients
(under our parameter names, docs/foreign.md) as a safetensors file.

  gpt2_ref.py make-init OUT.safetensors --layers L --width C --heads H --vocab V --context T --seed S
  gpt2_ref.py make-tokens OUT.bin --tokens N --vocab V --seed S
  gpt2_ref.py train --init IN.safetensors --heads H --data TRAIN.bin --batch B --context T
              --steps N --lr LR [--weight-decay W] [--beta1] [--beta2] [--eps] [--clip C]
              [--warmup N] [--min-lr LR] [--grads-out G.safetensors]
              [--final-out W.safetensors]   (the trained weights, HF names)

Weight decay goes to the 2-D tensors (embeddings and matrices), not to biases and LayerNorm
(nanoGPT's configure_optimizers), as examples/gpt2 groups them. Everything in f32 (float64
nowhere), one process: PyTorch is the reference here, not a peer.
"""
import argparse
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F

# ---- safetensors (the format is small: 8-byte header length, JSON header, raw buffer) ----


def st_write(path, tensors, metadata=None):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        b = t.detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def st_read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        buf = f.read()
    out = {}
    for name, d in header.items():
        if name == "__metadata__":
            continue
        if d["dtype"] != "F32":
            raise SystemExit(f"{path}: {name}: dtype {d['dtype']} (only F32 here)")
        lo, hi = d["data_offsets"]
        out[name] = torch.frombuffer(bytearray(buf[lo:hi]), dtype=torch.float32).reshape(d["shape"]).clone()
    return out


# ---- llm.c's GPT-2 checkpoint (train_gpt2.c gpt2_build_from_checkpoint) ---------------------


def llmc_write(path, w, heads):
    """HF-named f32 tensors as llm.c's checkpoint: an int32[256] header (magic 20240326,
    version 3, maxT, V, L, NH, C, Vp: V rounded up to a multiple of 128, as llm.c pads 50257 to
    50304), then wte padded to Vp rows with zeros, wpe, ln1w, ln1b, qkvw, qkvb, attprojw,
    attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb (each stacked over the layers, weights
    [out, in]: HF's Conv1D [in, out] transposed), lnfw, lnfb."""
    L = layers_of(w)
    V, C = w["wte.weight"].shape
    Vp = (V + 127) // 128 * 128
    T = w["wpe.weight"].shape[0]
    head = [0] * 256
    head[:8] = [20240326, 3, T, V, L, heads, C, Vp]
    per = [("ln_1.weight", False), ("ln_1.bias", False), ("attn.c_attn.weight", True),
           ("attn.c_attn.bias", False), ("attn.c_proj.weight", True), ("attn.c_proj.bias", False),
           ("ln_2.weight", False), ("ln_2.bias", False), ("mlp.c_fc.weight", True),
           ("mlp.c_fc.bias", False), ("mlp.c_proj.weight", True), ("mlp.c_proj.bias", False)]
    wte = torch.zeros(Vp, C, dtype=w["wte.weight"].dtype)
    wte[:V] = w["wte.weight"]
    parts = [wte, w["wpe.weight"]]
    for name, transpose in per:
        for l in range(L):
            t = w[f"h.{l}.{name}"]
            parts.append(t.t() if transpose else t)
    parts += [w["ln_f.weight"], w["ln_f.bias"]]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *head))
        for t in parts:
            f.write(t.detach().to(torch.float32).contiguous().numpy().tobytes())


# ---- llm.c token shards -------------------------------------------------------------------


def tokens_write(path, toks):
    head = [0] * 256
    head[0], head[1], head[2] = 20240520, 1, len(toks)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *head))
        f.write(struct.pack(f"<{len(toks)}H", *toks))


def tokens_read(path):
    with open(path, "rb") as f:
        head = struct.unpack("<256i", f.read(1024))
        if head[0] != 20240520 or head[1] != 1:
            raise SystemExit(f"{path}: not an llm.c token file")
        n = head[2]
        return list(struct.unpack(f"<{n}H", f.read(2 * n)))


def batch(toks, k, B, T):
    """llm.c's loader on one process: batch k is the B*T+1 tokens from k*B*T (wrapping)."""
    nb = (len(toks) - 1) // (B * T)
    base = (k % nb) * B * T
    buf = torch.tensor(toks[base:base + B * T + 1], dtype=torch.long)
    return buf[:-1].view(B, T), buf[1:].view(B, T)


# ---- the model ------------------------------------------------------------------------------


def layers_of(w):
    L = 0
    while f"h.{L}.ln_1.weight" in w:
        L += 1
    return L


def forward(w, H, x):
    """GPT-2: learned positions, pre-LN blocks with biased attention and MLP, GELU (tanh), a
    final LayerNorm, the head tied to wte. w: HF-named tensors."""
    B, T = x.shape
    C = w["wte.weight"].shape[1]
    h = w["wte.weight"][x] + w["wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(layers_of(w)):
        p = f"h.{l}."
        a = F.layer_norm(h, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], 1e-5)
        qkv = a @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, H, C // H).transpose(1, 2)
        k = k.view(B, T, H, C // H).transpose(1, 2)
        v = v.view(B, T, H, C // H).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        h = h + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        m = F.layer_norm(h, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], 1e-5)
        m = F.gelu(m @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
        h = h + m @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    h = F.layer_norm(h, (C,), w["ln_f.weight"], w["ln_f.bias"], 1e-5)
    return h @ w["wte.weight"].t()


def our_grads(w, L, C):
    """Gradients under our names (docs/foreign.md): c_attn split into q, k, v."""
    g = {"wte": w["wte.weight"].grad, "wpe": w["wpe.weight"].grad}
    for l in range(L):
        p, o = f"h.{l}.", f"h.{l}."
        ga, gb = w[p + "attn.c_attn.weight"].grad, w[p + "attn.c_attn.bias"].grad
        for j, n in enumerate("qkv"):
            g[o + n + ".w"] = ga[:, j * C:(j + 1) * C]
            g[o + n + ".b"] = gb[j * C:(j + 1) * C]
        pairs = [("ln1.g", "ln_1.weight"), ("ln1.b", "ln_1.bias"), ("o.w", "attn.c_proj.weight"),
                 ("o.b", "attn.c_proj.bias"), ("ln2.g", "ln_2.weight"), ("ln2.b", "ln_2.bias"),
                 ("fc.w", "mlp.c_fc.weight"), ("fc.b", "mlp.c_fc.bias"),
                 ("proj.w", "mlp.c_proj.weight"), ("proj.b", "mlp.c_proj.bias")]
        for ours, hf in pairs:
            g[o + ours] = w[p + hf].grad
    g["lnf.g"], g["lnf.b"] = w["ln_f.weight"].grad, w["ln_f.bias"].grad
    return g


def make_init(a):
    gen = torch.Generator().manual_seed(a.seed)
    C, L, V, T = a.width, a.layers, a.vocab, a.context
    def normal(*shape, std=0.02):
        return torch.randn(*shape, generator=gen) * std
    w = {"wte.weight": normal(V, C), "wpe.weight": normal(T, C, std=0.01)}
    for l in range(L):
        p = f"h.{l}."
        # Non-trivial norms and biases, so that their gradients are tested too.
        w[p + "ln_1.weight"] = 1.0 + normal(C, std=0.1)
        w[p + "ln_1.bias"] = normal(C)
        w[p + "attn.c_attn.weight"] = normal(C, 3 * C)
        w[p + "attn.c_attn.bias"] = normal(3 * C)
        w[p + "attn.c_proj.weight"] = normal(C, C, std=0.02 / math.sqrt(2 * L))
        w[p + "attn.c_proj.bias"] = normal(C)
        w[p + "ln_2.weight"] = 1.0 + normal(C, std=0.1)
        w[p + "ln_2.bias"] = normal(C)
        w[p + "mlp.c_fc.weight"] = normal(C, 4 * C)
        w[p + "mlp.c_fc.bias"] = normal(4 * C)
        w[p + "mlp.c_proj.weight"] = normal(4 * C, C, std=0.02 / math.sqrt(2 * L))
        w[p + "mlp.c_proj.bias"] = normal(C)
    w["ln_f.weight"] = 1.0 + normal(C, std=0.1)
    w["ln_f.bias"] = normal(C)
    st_write(a.out, w, {"format": "pt", "n_head": str(a.heads)})


def make_tokens(a):
    gen = torch.Generator().manual_seed(a.seed)
    tokens_write(a.out, torch.randint(0, a.vocab, (a.tokens,), generator=gen).tolist())


def lr_at(a, step):
    """llm.c's schedule (llmc/schedulers.h get_learning_rate) with an absolute floor: linear
    warmup lr * (step + 1) / W over the first W steps, then cosine decay from lr towards
    min_lr, reached at step `steps` (one past the last); min_lr defaults to lr. Neither given:
    constant lr."""
    warmup = getattr(a, "warmup", 0) or 0
    min_lr = getattr(a, "min_lr", None)
    min_lr = a.lr if min_lr is None else min_lr
    if step < warmup:
        return a.lr * (step + 1) / warmup
    if a.steps <= warmup:
        return a.lr
    ratio = (step - warmup) / (a.steps - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (a.lr - min_lr)


def train(a):
    torch.manual_seed(0)
    w = st_read(a.init)
    for t in w.values():
        t.requires_grad_(True)
    L, C = layers_of(w), w["wte.weight"].shape[1]
    decay = [t for t in w.values() if t.dim() == 2]
    rest = [t for t in w.values() if t.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps)
    toks = tokens_read(a.data)
    for step in range(a.steps):
        x, y = batch(toks, step, a.batch, a.context)
        logits = forward(w, a.heads, x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if step == 0 and a.grads_out:
            st_write(a.grads_out, our_grads(w, L, C))
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(list(w.values()), a.clip)
        lr = lr_at(a, step)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        print(f"step {step} loss {loss.item():.9g} lr {lr:.9g}", flush=True)
    if getattr(a, "final_out", None):
        st_write(a.final_out, w, {"format": "pt"})


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make-init")
    m.add_argument("out")
    for k in ("layers", "width", "heads", "vocab", "context", "seed"):
        m.add_argument("--" + k, type=int, required=True)
    t = sub.add_parser("make-tokens")
    t.add_argument("out")
    for k in ("tokens", "vocab", "seed"):
        t.add_argument("--" + k, type=int, required=True)
    r = sub.add_parser("train")
    r.add_argument("--init", required=True)
    r.add_argument("--data", required=True)
    r.add_argument("--heads", type=int, required=True)
    r.add_argument("--batch", type=int, required=True)
    r.add_argument("--context", type=int, required=True)
    r.add_argument("--steps", type=int, required=True)
    r.add_argument("--lr", type=float, required=True)
    r.add_argument("--weight-decay", type=float, default=0.0)
    r.add_argument("--beta1", type=float, default=0.9)
    r.add_argument("--beta2", type=float, default=0.999)
    r.add_argument("--eps", type=float, default=1e-8)
    r.add_argument("--clip", type=float, default=1.0)
    r.add_argument("--warmup", type=int, default=0)
    r.add_argument("--min-lr", type=float, default=None)
    r.add_argument("--grads-out")
    r.add_argument("--final-out")
    a = ap.parse_args()
    torch.set_num_threads(1)
    {"make-init": make_init, "make-tokens": make_tokens, "train": train}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
