#!/usr/bin/python3
"""PyTorch references of Hugging Face decoders (the `reference` suite), written here from the
papers' and transformers' definitions, independent of our code: GPT-2 (GPT2LMHeadModel) and
the Llama family (LlamaForCausalLM: RMSNorm, rotate-half rotary embeddings with rope_theta and
llama3 frequency scaling, grouped-query attention, SwiGLU, optional q/k/v biases as Qwen2,
tied or untied head). Builds HF directories of random weights (config.json, model.safetensors
or a sharded set with model.safetensors.index.json), computes logits by full recomputation in
float64, and greedy continuations (each token from a full recompute of the sequence so far).
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import struct  # noqa: E402

from gpt2_ref import st_write  # noqa: E402


def st_write_bf16(path, tensors, metadata=None):
    """A safetensors file of BF16 tensors (rounded to nearest even by torch)."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        b = t.detach().to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def st_read(path):
    """Every tensor of a safetensors file (F32 or BF16) as float32."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        buf = f.read()
    out = {}
    for name, d in header.items():
        if name == "__metadata__":
            continue
        lo, hi = d["data_offsets"]
        raw = bytearray(buf[lo:hi])
        if d["dtype"] == "F32":
            t = torch.frombuffer(raw, dtype=torch.float32)
        elif d["dtype"] == "BF16":
            t = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16).to(torch.float32)
        else:
            raise SystemExit(f"{path}: {name}: dtype {d['dtype']}")
        out[name] = t.reshape(d["shape"]).clone()
    return out


# ---- random HF directories -------------------------------------------------------------------


def _rand(g, *shape, std=1.0, mean=0.0):
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * std + mean).to(torch.float32)


def write_dir(out, cfg, tensors, shards=1, bf16=False):
    """config.json and the tensors (f32, or bf16): one model.safetensors, or `shards` files
    and an index."""
    os.makedirs(out, exist_ok=True)
    write = st_write_bf16 if bf16 else st_write
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    names = list(tensors)
    if shards == 1:
        write(os.path.join(out, "model.safetensors"), tensors, {"format": "pt"})
        return
    per = (len(names) + shards - 1) // shards
    wmap = {}
    for s in range(shards):
        fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s * per:(s + 1) * per]}
        write(os.path.join(out, fn), part, {"format": "pt"})
        wmap.update({n: fn for n in part})
    total = sum(t.numel() * (2 if bf16 else 4) for t in tensors.values())
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2)


def make_llama(out, seed=1, vocab=96, hidden=64, inter=96, layers=2, heads=4, kv_heads=2,
               model_type="llama", tie=True, bias=False, rope_theta=10000.0, llama3=True,
               shards=1, max_pos=128, bf16=False):
    g = torch.Generator().manual_seed(seed)
    D = hidden // heads
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": model_type,
           "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": inter,
           "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv_heads, "max_position_embeddings": max_pos,
           "rms_norm_eps": 1e-5, "rope_theta": rope_theta, "hidden_act": "silu",
           "tie_word_embeddings": tie, "bos_token_id": 0, "eos_token_id": 1,
           "torch_dtype": "float32"}
    if model_type == "llama":
        cfg["attention_bias"] = bias
    if llama3:
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    t = {"model.embed_tokens.weight": _rand(g, vocab, hidden, std=0.5)}
    s = 1.0 / math.sqrt(hidden)
    for l in range(layers):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = _rand(g, hidden, std=0.1, mean=1.0)
        t[p + "self_attn.q_proj.weight"] = _rand(g, heads * D, hidden, std=s)
        t[p + "self_attn.k_proj.weight"] = _rand(g, kv_heads * D, hidden, std=s)
        t[p + "self_attn.v_proj.weight"] = _rand(g, kv_heads * D, hidden, std=s)
        if bias or model_type == "qwen2":
            t[p + "self_attn.q_proj.bias"] = _rand(g, heads * D, std=0.1)
            t[p + "self_attn.k_proj.bias"] = _rand(g, kv_heads * D, std=0.1)
            t[p + "self_attn.v_proj.bias"] = _rand(g, kv_heads * D, std=0.1)
        t[p + "self_attn.o_proj.weight"] = _rand(g, hidden, heads * D, std=s)
        t[p + "post_attention_layernorm.weight"] = _rand(g, hidden, std=0.1, mean=1.0)
        t[p + "mlp.gate_proj.weight"] = _rand(g, inter, hidden, std=s)
        t[p + "mlp.up_proj.weight"] = _rand(g, inter, hidden, std=s)
        t[p + "mlp.down_proj.weight"] = _rand(g, hidden, inter, std=1.0 / math.sqrt(inter))
    t["model.norm.weight"] = _rand(g, hidden, std=0.1, mean=1.0)
    if not tie:
        t["lm_head.weight"] = _rand(g, vocab, hidden, std=0.5)
    if bf16:
        cfg["torch_dtype"] = "bfloat16"
    write_dir(out, cfg, t, shards, bf16)
    return cfg


def make_gpt2(out, seed=1, vocab=96, hidden=64, layers=2, heads=4, n_pos=64, shards=1):
    g = torch.Generator().manual_seed(seed)
    C = hidden
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": vocab,
           "n_embd": C, "n_layer": layers, "n_head": heads, "n_positions": n_pos,
           "n_ctx": n_pos, "n_inner": None, "layer_norm_epsilon": 1e-5,
           "activation_function": "gelu_new", "tie_word_embeddings": True,
           "bos_token_id": 0, "eos_token_id": 1}
    s = 1.0 / math.sqrt(C)
    t = {"wte.weight": _rand(g, vocab, C, std=0.5), "wpe.weight": _rand(g, n_pos, C, std=0.1)}
    for l in range(layers):
        p = f"h.{l}."
        t[p + "ln_1.weight"] = _rand(g, C, std=0.1, mean=1.0)
        t[p + "ln_1.bias"] = _rand(g, C, std=0.1)
        t[p + "attn.c_attn.weight"] = _rand(g, C, 3 * C, std=s)
        t[p + "attn.c_attn.bias"] = _rand(g, 3 * C, std=0.1)
        t[p + "attn.c_proj.weight"] = _rand(g, C, C, std=s)
        t[p + "attn.c_proj.bias"] = _rand(g, C, std=0.1)
        t[p + "ln_2.weight"] = _rand(g, C, std=0.1, mean=1.0)
        t[p + "ln_2.bias"] = _rand(g, C, std=0.1)
        t[p + "mlp.c_fc.weight"] = _rand(g, C, 4 * C, std=s)
        t[p + "mlp.c_fc.bias"] = _rand(g, 4 * C, std=0.1)
        t[p + "mlp.c_proj.weight"] = _rand(g, 4 * C, C, std=1.0 / math.sqrt(4 * C))
        t[p + "mlp.c_proj.bias"] = _rand(g, C, std=0.1)
    t["ln_f.weight"] = _rand(g, C, std=0.1, mean=1.0)
    t["ln_f.bias"] = _rand(g, C, std=0.1)
    write_dir(out, cfg, t, shards)
    return cfg


def load_dir(d):
    """config.json and every tensor (single file or sharded index), in float64."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    idx = os.path.join(d, "model.safetensors.index.json")
    w = {}
    if os.path.exists(idx):
        with open(idx) as f:
            for fn in sorted(set(json.load(f)["weight_map"].values())):
                w.update(st_read(os.path.join(d, fn)))
    else:
        w.update(st_read(os.path.join(d, "model.safetensors")))
    return cfg, {k: v.to(torch.float64) for k, v in w.items()}


# ---- the forward passes (full recomputation, float64) ----------------------------------------


def _attention(q, k, v, heads, kv_heads):
    """q [B, T, H, D], k, v [B, T, KV, D]: causal softmax attention, kv heads repeated."""
    B, T, H, D = q.shape
    rep = heads // kv_heads
    k = k.repeat_interleave(rep, dim=2)
    v = v.repeat_interleave(rep, dim=2)
    s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    s = s.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhts,bshd->bthd", s.softmax(-1), v).reshape(B, T, H * D)


def llama_inv_freq(cfg, D):
    theta = cfg.get("rope_theta", 10000.0)
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    rs = cfg.get("rope_scaling")
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wl = 2 * math.pi / inv
        scaled = torch.where(wl > old / lo, inv / factor, inv)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wl >= old / hi) & (wl <= old / lo)
        inv = torch.where(medium, smoothed, scaled)
    return inv


def _rope(x, inv):
    """x [B, T, H, D], rotate-half form: pairs (i, i + D/2)."""
    T = x.shape[1]
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :]
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], -1)
    return x * cos + rot * sin


def llama_logits(cfg, w, ids):
    ids = torch.as_tensor(ids)
    H, KV = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    C = cfg["hidden_size"]
    D = cfg.get("head_dim") or C // H
    eps = cfg["rms_norm_eps"]
    inv = llama_inv_freq(cfg, D)

    def rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g

    def lin(x, p):
        y = x @ w[p + ".weight"].T
        return y + w[p + ".bias"] if p + ".bias" in w else y

    x = w["model.embed_tokens.weight"][ids]
    B, T = ids.shape
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = rms(x, w[p + "input_layernorm.weight"])
        q = _rope(lin(a, p + "self_attn.q_proj").view(B, T, H, D), inv)
        k = _rope(lin(a, p + "self_attn.k_proj").view(B, T, KV, D), inv)
        v = lin(a, p + "self_attn.v_proj").view(B, T, KV, D)
        x = x + lin(_attention(q, k, v, H, KV), p + "self_attn.o_proj")
        b = rms(x, w[p + "post_attention_layernorm.weight"])
        x = x + lin(F.silu(lin(b, p + "mlp.gate_proj")) * lin(b, p + "mlp.up_proj"),
                    p + "mlp.down_proj")
    f = rms(x, w["model.norm.weight"])
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return f @ head.T


def gpt2_logits(cfg, w, ids):
    ids = torch.as_tensor(ids)
    H, C = cfg["n_head"], cfg["n_embd"]
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    B, T = ids.shape
    x = w["wte.weight"][ids] + w["wpe.weight"][torch.arange(T)][None]

    def ln(x, p):
        return F.layer_norm(x, (C,), w[p + ".weight"], w[p + ".bias"], eps)

    def conv(x, p):  # Conv1D: [in, out]
        return x @ w[p + ".weight"] + w[p + ".bias"]

    for l in range(cfg["n_layer"]):
        p = f"h.{l}."
        qkv = conv(ln(x, p + "ln_1"), p + "attn.c_attn")
        q, k, v = (t.reshape(B, T, H, C // H) for t in qkv.split(C, -1))
        x = x + conv(_attention(q, k, v, H, H), p + "attn.c_proj")
        x = x + conv(F.gelu(conv(ln(x, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh"),
                     p + "mlp.c_proj")
    return ln(x, "ln_f") @ w["wte.weight"].T


def logits(cfg, w, ids):
    return (gpt2_logits if cfg["model_type"] == "gpt2" else llama_logits)(cfg, w, ids)


def greedy(cfg, w, prompt, n):
    """n tokens, each the argmax of a full recompute over the prompt and those before."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(logits(cfg, w, [seq])[0, -1].argmax()))
    return seq[len(prompt):]


def train(cfg, w, toks, B, T, steps, lr, wd, betas=(0.9, 0.95), eps=1e-8, clip=1.0):
    """`steps` AdamW steps (weight decay on the 2-D tensors only, global-norm clipping) on
    llm.c's batches of toks (batch k: the B*T+1 tokens from k*B*T), float64. Returns each
    step's loss (before its update) and the trained weights."""
    params = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    decay = [p for p in params.values() if p.dim() == 2]
    plain = [p for p in params.values() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                             {"params": plain, "weight_decay": 0.0}],
                            lr=lr, betas=betas, eps=eps)
    losses = []
    n = (len(toks) - 1) // (B * T)
    for s in range(steps):
        at = (s % n) * B * T
        buf = torch.tensor(toks[at:at + B * T + 1])
        x, y = buf[:-1].view(B, T), buf[1:].view(B, T)
        lg = logits(cfg, params, x)
        loss = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(list(params.values()), clip)
        opt.step()
        losses.append(float(loss))
    return losses, {k: v.detach() for k, v in params.items()}
