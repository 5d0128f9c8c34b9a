#!/usr/bin/env python3
"""train_gpt's model in PyTorch, for bench/gpt_torch.sh: the same architecture (pre-norm blocks,
no biases in the linear layers, learned position embeddings, GELU tanh, an untied head, a
final layer norm), the same initialisation scales, batching (names of `context` characters,
`batch` per step over all processes), AdamW with decay on the weight matrices only and the
global gradient norm clipped to 1. Random character ids stand in for the names: the speed of a
step does not depend on them. With --procs 2, DistributedDataParallel over gloo (each process
half the batch, torch threads = cores / processes unless --threads says).

--arch gpt2: examples/train_gpt2's GPT-2 instead (build_gpt2).

Prints one line: torch_tokens_per_s=N (tokens of the timed steps / their wall time)."""
import argparse
import math
import os
import sys
import time


def build(torch, width, layers, heads, vocab, context):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(width)
            self.q = nn.Linear(width, width, bias=False)
            self.k = nn.Linear(width, width, bias=False)
            self.v = nn.Linear(width, width, bias=False)
            self.proj = nn.Linear(width, width, bias=False)
            self.ln2 = nn.LayerNorm(width)
            self.fc = nn.Linear(width, 4 * width, bias=False)
            self.fc2 = nn.Linear(4 * width, width, bias=False)

        def forward(self, x):
            b, t, c = x.shape
            h = self.ln1(x)
            shape = (b, t, heads, c // heads)
            q, k, v = (f(h).view(shape).transpose(1, 2) for f in (self.q, self.k, self.v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // heads))
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, c)
            x = x + self.proj(y)
            return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, width)
            self.wpe = nn.Embedding(context, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.lnf = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab, bias=False)

        def forward(self, ids, targets):
            pos = torch.arange(ids.shape[1])
            x = self.wte(ids) + self.wpe(pos)
            for blk in self.blocks:
                x = blk(x)
            logits = self.head(self.lnf(x))
            return F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))

    torch.manual_seed(1)
    m = GPT()
    resid = 0.02 / math.sqrt(2.0 * layers)
    with torch.no_grad():
        m.wte.weight.normal_(0, 0.02)
        m.wpe.weight.normal_(0, 0.01)
        m.head.weight.normal_(0, 0.02)
        for blk in m.blocks:
            for lin in (blk.q, blk.k, blk.v, blk.fc):
                lin.weight.normal_(0, 0.02)
            for lin in (blk.proj, blk.fc2):
                lin.weight.normal_(0, resid)
    return m


def build_gpt2(torch, width, layers, heads, vocab, context):
    """examples/train_gpt2's model as a PyTorch user writes GPT-2 (HF's module layout): biases
    in every projection, a fused q/k/v projection, GELU tanh, a final layer norm and the head
    tied to the token embedding; GPT-2's initialisation (0.02, residual projections
    0.02 / sqrt(2 L), zero biases)."""
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(width)
            self.c_attn = nn.Linear(width, 3 * width)
            self.c_proj = nn.Linear(width, width)
            self.ln_2 = nn.LayerNorm(width)
            self.c_fc = nn.Linear(width, 4 * width)
            self.mlp_proj = nn.Linear(4 * width, width)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
            shape = (b, t, heads, c // heads)
            q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // heads))
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            x = x + self.c_proj((att @ v).transpose(1, 2).reshape(b, t, c))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT2(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, width)
            self.wpe = nn.Embedding(context, width)
            self.h = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(width)

        def forward(self, ids, targets):
            pos = torch.arange(ids.shape[1])
            x = self.wte(ids) + self.wpe(pos)
            for blk in self.h:
                x = blk(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)
            return F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))

    torch.manual_seed(1)
    m = GPT2()
    resid = 0.02 / math.sqrt(2.0 * layers)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 1 and "ln" not in name:
                p.zero_()
            elif p.dim() == 2:
                p.normal_(0, resid if name.endswith("proj.weight") else 0.02)
    return m


def run(rank, args):
    import torch
    procs = args.procs
    cores = args.cores or os.cpu_count() or 1
    torch.set_num_threads(args.threads if args.threads > 0 else max(1, cores // procs))
    if procs > 1:
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        dist.init_process_group("gloo", rank=rank, world_size=procs)
    make = build_gpt2 if args.arch == "gpt2" else build
    model = make(torch, args.width, args.layers, args.heads, args.vocab, args.context)
    # Decay on the matrices and embeddings (2-D), not on norms and biases.
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    plain = [p for n, p in model.named_parameters() if p.dim() != 2]
    if procs > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": plain, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.99), eps=1e-8)
    rows = args.batch // procs
    g = torch.Generator().manual_seed(100 + rank)

    def step():
        ids = torch.randint(0, args.vocab, (rows, args.context + 1), generator=g)
        loss = model(ids[:, :-1], ids[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(args.warmup):
        step()
    if procs > 1:
        torch.distributed.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    if procs > 1:
        torch.distributed.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        tokens = args.steps * args.batch * args.context
        print("torch_tokens_per_s=%.1f" % (tokens / dt), flush=True)
    if procs > 1:
        torch.distributed.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", choices=("gpt", "gpt2"), default="gpt")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=28)   # train_gpt's names: 27 letters and '.'
    ap.add_argument("--context", type=int, default=16)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.004)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--cores", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)  # intra-op threads per process
    ap.add_argument("--port", type=int, default=29517)
    args = ap.parse_args()
    if args.batch % args.procs:
        sys.exit("gpt_torch.py: --batch must divide among --procs")
    if args.procs == 1:
        run(0, args)
    else:
        import torch.multiprocessing as mp
        mp.spawn(run, args=(args,), nprocs=args.procs, join=True)


if __name__ == "__main__":
    main()
