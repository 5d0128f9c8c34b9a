#!/usr/bin/python3
"""The `reference` suite: examples/train_gpt2 against PyTorch (gpt2_ref.py) from the same
initial weights on the same llm.c tokens, 10 AdamW steps in f32 on one mesh (argv: the
train_gpt2 binary, the mpiexec wrapper, the mesh file, the process count). Every step's loss
must agree within 1e-4 relative, and step 0's gradients tensor by tensor (max abs difference
over the tensor's max abs value, at least 1e-3 of the step's largest) within 1e-4. Prints `N passed, N failed`."""
import argparse
import contextlib
import io
import math
import os
import re
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
# Adam's epsilon for the trained-weights check (check_out says why).
OUT_EPS = 1e-4


def losses(text):
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 4 and f[0] == "step":
            out.append(float(f[3]))
    return out


def model_size(mesh):
    """The `model` dim of a mesh file (1 without one)."""
    with open(mesh) as f:
        m = re.search(r"\bmodel:\s*(\d+)", f.read())
    return int(m.group(1)) if m else 1


# Parameters sharded over `model` (docs/gpt2.md) and the dim: the vocabulary of wte, the
# columns of q, k, v and fc with their biases, the rows of the attention output and proj.
SHARDED = [(r"wte", 0), (r"h\.\d+\.(q|k|v|fc)\.w", 1), (r"h\.\d+\.(q|k|v|fc)\.b", 0),
           (r"h\.\d+\.(o|proj)\.w", 0)]


def shard(n, k, j):
    """Rows of shard j when n rows split k ways (the library's rule: the first n % k shards
    one longer)."""
    return n // k + (1 if j < n % k else 0)


def check_layouts(text, msize):
    """train_gpt2 --show-layouts: every model-parallel parameter holds its shard of its
    sharded dim on the device (a vocabulary msize does not divide: uneven shards), every other
    one the whole tensor, and each device read from the f32 init file exactly the bytes of its
    own boxes (device d of a batch x model mesh is model shard d % msize). Returns the
    failures."""
    bad, seen, params = [], 0, []
    for line in text.splitlines():
        f = line.split()
        if len(f) != 7 or f[0] != "layout":
            continue
        seen += 1
        name, glob, loc = f[1], [int(v) for v in f[4].split("x")], [int(v) for v in f[6].split("x")]
        dim = next((dim for pat, dim in SHARDED if re.fullmatch(pat, name)), None)
        want = list(glob)
        if dim is not None:
            want[dim] = shard(glob[dim], msize, 0)  # the line shows process 0's first device
        if loc != want:
            bad.append(f"{name}: local {loc}, want {want} (global {glob}, model={msize})")
        params.append((glob, dim))

    def box(j):
        return sum(math.prod(shard(g, msize, j) if i == dim else g for i, g in enumerate(glob))
                   for glob, dim in params)
    reads = [line.split() for line in text.splitlines() if line.startswith("read device ")]
    for f in reads:
        want = 4 * box(int(f[2]) % msize)
        if int(f[4]) != want:
            bad.append(f"device {f[2]} read {f[4]} bytes of the init, its boxes are {want}")
    if seen == 0 or not reads:
        bad.append("no layout or read lines")
    return bad


def run(cmd, nprocs, mpiexec):
    if nprocs > 1:
        cmd = [mpiexec, "-n", str(nprocs)] + cmd
    env = dict(os.environ)
    env.pop("DT_CPU_DEVICES", None)
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def check_mesh(exe, mpiexec, mesh, nprocs, d, init, toks, common, ref, g):
    """One mesh: returns (passed, failed) of its three checks."""
    out = os.path.join(d, "grads-" + os.path.basename(mesh))
    cmd = [exe, "--init", init, "--data", toks, "--mesh", mesh, "--grads-out", out,
           "--show-layouts", "1"] + common
    ours = run(cmd, nprocs, mpiexec)
    print(f"== {os.path.basename(mesh)} on {nprocs} process(es)")
    if ours.returncode != 0:
        print(ours.stdout, ours.stderr)
        return 0, 3
    lay = check_layouts(ours.stdout, model_size(mesh))
    # The banner gives the model's sizes (read from the init file and config.json here).
    banner = "{layers} layers, width {width}, {heads} heads, vocab {vocab}".format(**CFG)
    if banner not in ours.stdout:
        said = [line for line in ours.stdout.splitlines() if line.startswith("train_gpt2:")]
        lay.append(f"banner without '{banner}': {said[0] if said else 'none'}")
    print(f"layouts (model={model_size(mesh)}) and banner: {'ok' if not lay else 'FAIL'}")
    for b in lay:
        print("  FAIL", b)
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
    return int(ok) + int(not bad) + int(not lay), int(not ok) + int(bool(bad)) + int(bool(lay))


def read_grads(out, names_shapes):
    got = {}
    for name, shape in names_shapes.items():
        with open(os.path.join(out, name + ".f32"), "rb") as f:
            got[name] = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).reshape(shape)
    return got


def check_random_init(exe, mpiexec, meshes, d, toks):
    """--init random on every mesh against the first: the same global tensors everywhere (drawn
    globally, each device keeping its box), so step 0's loss and gradients agree (1e-5, the
    meshes' summation orders differ). Returns (passed, failed)."""
    cfg = ["--init", "random", "--layers", "2", "--width", "64", "--heads", "4", "--vocab", "128",
           "--seed", "7", "--data", toks, "--batch", str(B), "--context", str(T), "--steps", "1",
           "--lr", str(LR)]
    first, shapes, ok = None, None, True
    for mesh, nprocs in meshes:
        out = os.path.join(d, "rgrads-" + os.path.basename(mesh))
        r = run([exe, "--mesh", mesh, "--grads-out", out] + cfg, nprocs, mpiexec)
        if r.returncode != 0:
            print(r.stdout, r.stderr)
            return 0, 1
        loss = losses(r.stdout)[0]
        if first is None:
            names = [n[:-4] for n in os.listdir(out)]
            shapes = {}
            for n in names:
                shapes[n] = (os.path.getsize(os.path.join(out, n + ".f32")) // 4,)
            first = (loss, read_grads(out, shapes))
            continue
        g = read_grads(out, shapes)
        floor = 1e-3 * max(t.abs().max().item() for t in first[1].values())
        worst = max((g[n] - first[1][n]).abs().max().item() / max(first[1][n].abs().max().item(),
                                                                    floor) for n in shapes)
        rel = abs(loss - first[0]) / abs(first[0])
        good = rel <= 1e-5 and worst <= 1e-5
        ok = ok and good
        print(f"random init on {os.path.basename(mesh)}: loss rel {rel:.2e}, gradients worst "
              f"{worst:.2e} against {os.path.basename(meshes[0][0])}: {'ok' if good else 'FAIL'}")
    return int(ok), int(not ok)


def check_zero3(exe, mpiexec, mesh, nprocs, d, init, toks, common):
    """--zero 3 against --zero 1 on one mesh for 3 steps: the same losses and the same final
    parameters, bit for bit (stage 3 is stage 2 with the parameters sharded; the gathered
    values are the master weights cast as stage 1 writes them). Returns (passed, failed)."""
    steps = ["--steps", "3"] + [a for i, a in enumerate(common)
                                if a != "--steps" and (i == 0 or common[i - 1] != "--steps")]
    runs = []
    for z in ("1", "3"):
        out = os.path.join(d, f"params-z{z}-" + os.path.basename(mesh))
        r = run([exe, "--init", init, "--data", toks, "--mesh", mesh, "--zero", z,
                 "--params-out", out] + steps, nprocs, mpiexec)
        if r.returncode != 0:
            print(r.stdout, r.stderr)
            return 0, 1
        files = sorted(os.listdir(out))
        runs.append((losses(r.stdout), {f: open(os.path.join(out, f), "rb").read() for f in files}))
    (l1, p1), (l3, p3) = runs
    differ = [f for f in p1 if p1[f] != p3.get(f)]
    good = l1 == l3 and len(l1) == 3 and not differ and len(p1) == len(p3) > 0
    print(f"--zero 3 against --zero 1 on {os.path.basename(mesh)}: losses {l3} vs {l1}, "
          f"{len(p1) - len(differ)}/{len(p1)} parameters equal bit for bit: "
          f"{'ok' if good else 'FAIL'}")
    return int(good), int(not good)


def lrs(text):
    return [float(line.split()[-1]) for line in text.splitlines()
            if line.startswith("step ") and " lr " in line]


def check_schedule(exe, mpiexec, mesh, nprocs, d, init, toks, common):
    """--warmup 3 --min-lr 1e-4 (llm.c's warmup and cosine decay) against PyTorch with the same
    schedule (gpt2_ref.lr_at): every step's learning rate (1e-6, ours is a float) and loss
    (TOL). Returns (passed, failed)."""
    sched = ["--warmup", "3", "--min-lr", "1e-4"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        gpt2_ref.train(argparse.Namespace(init=init, data=toks, heads=CFG["heads"], batch=B,
                                          context=T, steps=STEPS, lr=LR, weight_decay=WD,
                                          beta1=0.9, beta2=0.999, eps=1e-8, clip=1.0,
                                          warmup=3, min_lr=1e-4, grads_out=None))
    r = run([exe, "--init", init, "--data", toks, "--mesh", mesh] + common + sched, nprocs,
            mpiexec)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        return 0, 1
    lt, lo, rt, ro = losses(buf.getvalue()), losses(r.stdout), lrs(buf.getvalue()), lrs(r.stdout)
    worst = max([abs(a - b) / abs(b) for a, b in zip(lo, lt)] or [1.0])
    wlr = max([abs(a - b) / abs(b) for a, b in zip(ro, rt)] or [1.0])
    good = len(lo) == len(lt) == len(ro) == len(rt) == STEPS and worst <= TOL and wlr <= 1e-6
    print(f"schedule on {os.path.basename(mesh)}: lr {['%.3g' % v for v in ro]}, worst lr rel "
          f"{wlr:.2e}, worst loss rel {worst:.2e}: {'ok' if good else 'FAIL'}")
    return int(good), int(not good)


def hf_of(ours, L, C):
    """Our parameters (docs/foreign.md names) in HF's form: q, k, v fused into c_attn."""
    w = {"wte.weight": ours["wte"], "wpe.weight": ours["wpe"]}
    for l in range(L):
        o, p = f"h.{l}.", f"h.{l}."
        w[p + "attn.c_attn.weight"] = torch.cat([ours[o + n + ".w"] for n in "qkv"], dim=1)
        w[p + "attn.c_attn.bias"] = torch.cat([ours[o + n + ".b"] for n in "qkv"])
        for mine, hf in [("ln1.g", "ln_1.weight"), ("ln1.b", "ln_1.bias"),
                         ("o.w", "attn.c_proj.weight"), ("o.b", "attn.c_proj.bias"),
                         ("ln2.g", "ln_2.weight"), ("ln2.b", "ln_2.bias"),
                         ("fc.w", "mlp.c_fc.weight"), ("fc.b", "mlp.c_fc.bias"),
                         ("proj.w", "mlp.c_proj.weight"), ("proj.b", "mlp.c_proj.bias")]:
            w[p + hf] = ours[o + mine]
    w["ln_f.weight"], w["ln_f.bias"] = ours["lnf.g"], ours["lnf.b"]
    return w


def check_out(exe, mpiexec, tool, mesh, nprocs, d, init, toks, common):
    """--out DIR with --zero 3 on one mesh: `dtensor ckpt export --format hf-gpt2` of
    DIR/checkpoint holds exactly HF's tensors (fused c_attn, wte once, no lm_head), each equal
    bit for bit to the trained parameters (--params-out) and close to PyTorch's trained weights;
    DIR/curves.csv has every step's loss. Returns (passed, failed).

    Both sides train with Adam's epsilon OUT_EPS here, not 1e-8. Adam's update
    m/(sqrt(v) + eps) moves by at most 2 |dg| / eps when the gradients move by dg, so rounding
    dg in the gradients moves a weight by at most STEPS * LR * 2 |dg| / eps after STEPS steps.
    With eps = 1e-8 that bound is 2000 |dg|: a weight whose true gradient is near zero (the key
    bias's is exactly zero) takes +-LR steps whose signs the rounding picks, and differed from
    PyTorch by 1.6e-3 of its tensor's largest value on one OpenBLAS kernel and 1e-4 on
    another. With eps = 1e-4 it is 0.2 |dg|: the gradients agree within 1e-6 of their largest
    values (step 0's check), so the weights must agree far inside 5e-4 of theirs on any
    machine (seen: 6e-7 to 1.3e-6 with OpenBLAS's Prescott, Haswell and SkylakeX kernels). The
    losses above are compared at eps = 1e-8."""
    out, pout = os.path.join(d, "out-" + os.path.basename(mesh)), os.path.join(d, "pout")
    hf = os.path.join(d, "export.safetensors")
    fpath = os.path.join(d, "ref_final.safetensors")
    with contextlib.redirect_stdout(io.StringIO()):
        gpt2_ref.train(argparse.Namespace(init=init, data=toks, heads=CFG["heads"], batch=B,
                                          context=T, steps=STEPS, lr=LR, weight_decay=WD,
                                          beta1=0.9, beta2=0.999, eps=OUT_EPS, clip=1.0,
                                          grads_out=None, final_out=fpath))
    final = gpt2_ref.st_read(fpath)
    r = run([exe, "--init", init, "--data", toks, "--mesh", mesh, "--zero", "3", "--out", out,
             "--params-out", pout, "--eps", str(OUT_EPS)] + common, nprocs, mpiexec)
    e = subprocess.run([tool, "ckpt", "export", "--format", "hf-gpt2",
                        os.path.join(out, "checkpoint"), hf], capture_output=True, text=True) \
        if r.returncode == 0 else r
    if e.returncode != 0:
        print(r.stdout, r.stderr, e.stdout, e.stderr)
        return 0, 1
    ours = {}
    for f in os.listdir(pout):
        with open(os.path.join(pout, f), "rb") as fh:
            ours[f[:-4]] = torch.frombuffer(bytearray(fh.read()), dtype=torch.float32)
    L, C = CFG["layers"], CFG["width"]
    shapes = {"wte": (CFG["vocab"], C), "wpe": (CFG["context"], C)}
    for l in range(L):
        for n, sh in [("q.w", (C, C)), ("k.w", (C, C)), ("v.w", (C, C)), ("o.w", (C, C)),
                      ("fc.w", (C, 4 * C)), ("proj.w", (4 * C, C))]:
            shapes[f"h.{l}.{n}"] = sh
    for n in ours:
        ours[n] = ours[n].reshape(shapes.get(n, (-1,)))
    want, got = hf_of(ours, L, C), gpt2_ref.st_read(hf)
    bad = [n for n in want if n not in got or not torch.equal(got[n], want[n])]
    bad += [f"{n} (not expected)" for n in got if n not in want]
    # PyTorch's trained weights, every element (OUT_EPS above says why they must agree).
    worst = 0.0
    for n, t in final.items():
        a = got.get(n)
        if a is not None:
            worst = max(worst, (a - t).abs().max().item() / t.abs().max().item())
    csv = [line.split(",") for line in open(os.path.join(out, "curves.csv")).read().split()[1:]]
    lo = losses(r.stdout)
    csv_ok = len(csv) == len(lo) == STEPS and all(
        int(c[0]) == s and abs(float(c[1]) - lo[s]) <= 1e-5 * abs(lo[s]) for s, c in enumerate(csv))
    good = not bad and worst <= 5e-4 and csv_ok
    print(f"--out on {os.path.basename(mesh)} (--zero 3): export {len(got)} tensors, "
          f"{len(want) - len(bad)} equal to the trained ones bit for bit, worst relative "
          f"difference to PyTorch's trained weights {worst:.2e}, curves.csv "
          f"{'ok' if csv_ok else 'FAIL'}: {'ok' if good else 'FAIL'}")
    for b in bad:
        print("  FAIL", b)
    return int(good), int(not good)


def check_resume(exe, mpiexec, mesh, nprocs, d, init, toks, common):
    """--resume from --out: 4 steps saved, then resumed to the 10 on the same mesh, gives every
    later step's loss (9 digits) and the final parameters bit for bit as the uninterrupted
    run (the same sums in the same order); resumed on 1x1 instead (one process, the state
    resharded), the same losses within 1e-5. Returns (passed, failed)."""
    base = os.path.join(d, "resume-" + os.path.basename(mesh))
    one = os.path.join(os.path.dirname(mesh), "1x1.yaml")
    short = [a if i == 0 or common[i - 1] != "--steps" else "4" for i, a in enumerate(common)]
    cmd = [exe, "--init", init, "--data", toks]
    runs = [(mesh, nprocs, ["--params-out", base + "-full"] + common),
            (mesh, nprocs, ["--out", base + "-out"] + short),
            (mesh, nprocs, ["--resume", base + "-out", "--params-out", base + "-res"] + common),
            (one, 1, ["--resume", base + "-out"] + common)]
    got = []
    for m, n, extra in runs:
        r = run(cmd + ["--mesh", m] + extra, n, mpiexec)
        if r.returncode != 0:
            print(r.stdout, r.stderr)
            return 0, 1
        got.append(losses(r.stdout))
    full, res, res1 = got[0], got[2], got[3]
    files = sorted(os.listdir(base + "-full"))
    same = [f for f in files if open(os.path.join(base + "-full", f), "rb").read() ==
            open(os.path.join(base + "-res", f), "rb").read()]
    worst = max(abs(a - b) / abs(b) for a, b in zip(res1, full[4:])) if res1 else 1.0
    good = (len(full) == STEPS and got[1] == full[:4] and res == full[4:] and
            len(same) == len(files) > 0 and len(res1) == STEPS - 4 and worst <= 1e-5)
    print(f"--resume on {os.path.basename(mesh)} after 4 of {STEPS} steps: losses "
          f"{'equal' if res == full[4:] else f'{res} vs {full[4:]}'}, {len(same)}/{len(files)} "
          f"parameters equal bit for bit; resumed on 1x1: worst loss rel {worst:.2e}: "
          f"{'ok' if good else 'FAIL'}")
    return int(good), int(not good)


def check_refusal(exe, mpiexec, mesh, nprocs, d, toks):
    """3 heads over model=2: refused, naming the divisibility. Returns (passed, failed)."""
    r = run([exe, "--init", "random", "--layers", "1", "--width", "48", "--heads", "3",
             "--vocab", "128", "--data", toks, "--batch", str(B), "--context", str(T),
             "--steps", "1", "--lr", str(LR), "--mesh", mesh], nprocs, mpiexec)
    text = r.stdout + r.stderr
    good = r.returncode != 0 and "divide the 3 heads" in text
    said = [line for line in text.splitlines() if "train_gpt2:" in line]
    print(f"3 heads on {os.path.basename(mesh)}: {'refused ok' if good else 'FAIL'}: "
          f"{said[0] if said else text[-300:]}")
    return int(good), int(not good)


def prepare(d):
    """In d: CFG's init (safetensors, config.json), the tokens, and PyTorch's 10 steps from
    them. Returns (init, toks, PyTorch's output, its step-0 gradients)."""
    init, toks = os.path.join(d, "init.safetensors"), os.path.join(d, "train.bin")
    gpt2_ref.make_init(argparse.Namespace(out=init, seed=1, **CFG))
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write('{"n_head": %d}' % CFG["heads"])
    gpt2_ref.make_tokens(argparse.Namespace(out=toks, tokens=2000, vocab=CFG["vocab"], seed=2))
    gpath = os.path.join(d, "ref_grads.safetensors")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        gpt2_ref.train(argparse.Namespace(init=init, data=toks, heads=CFG["heads"], batch=B,
                                          context=T, steps=STEPS, lr=LR, weight_decay=WD,
                                          beta1=0.9, beta2=0.999, eps=1e-8, clip=1.0,
                                          grads_out=gpath))
    return init, toks, buf.getvalue(), gpt2_ref.st_read(gpath)


def check_odd_vocab(exe, mpiexec, tool, tp, d, common):
    """A vocabulary the model dim does not divide (127 over model=2, as GPT-2's 50257):
    uneven vocabulary shards. Against PyTorch on the first tensor-parallel mesh from the
    safetensors init and from llm.c's checkpoint (its vocabulary padded to 128, as llm.c pads
    50257 to 50304), --out's export on the last, and --resume on a multi-process one.
    Returns (passed, failed)."""
    CFG["vocab"] = 127
    od = os.path.join(d, "odd")
    os.mkdir(od)
    init, toks, ref, g = prepare(od)
    llmc = os.path.join(od, "init.bin")
    gpt2_ref.llmc_write(llmc, gpt2_ref.st_read(init), CFG["heads"])
    passed = failed = 0
    for source in (init, llmc):
        print(f"vocabulary 127, {os.path.basename(source)}:", end=" ")
        p, f = check_mesh(exe, mpiexec, tp[0][0], tp[0][1], od, source, toks, common, ref, g)
        passed, failed = passed + p, failed + f
    checks = [check_out(exe, mpiexec, tool, tp[-1][0], tp[-1][1], od, init, toks, common)] \
        if tool else []
    multi = [(m, n) for m, n in tp if n > 1] or tp
    checks.append(check_resume(exe, mpiexec, multi[0][0], multi[0][1], od, init, toks, common))
    for p, f in checks:
        passed, failed = passed + p, failed + f
    return passed, failed


# The CPU flag each OpenBLAS kernel the suite forces (OPENBLAS_CORETYPE, meson.build) needs.
CORE_FLAGS = {"prescott": "pni", "haswell": "avx2", "skylakex": "avx512f"}


def cpu_lacks_core():
    """The OPENBLAS_CORETYPE this test was given, when this CPU cannot run it (else None)."""
    core = os.environ.get("OPENBLAS_CORETYPE", "")
    flag = CORE_FLAGS.get(core.lower())
    if not flag:
        return None
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f
                      if line.startswith("flags")), [])
    return None if flag in flags else core


def main():
    """argv: train_gpt2, mpiexec, then MESH.yaml:PROCESSES for each mesh, and --extras (the
    random init on every mesh, the learning-rate schedule on the first mesh, --zero 3 against
    --zero 1 on the multi-process meshes, the refusal of heads model does not divide, and with
    --tool=DTENSOR --out and its export on the last tensor-parallel mesh)."""
    lacks = cpu_lacks_core()
    if lacks:
        print(f"OPENBLAS_CORETYPE={lacks}: this CPU lacks {CORE_FLAGS[lacks.lower()]}: skipped")
        return 77
    exe, mpiexec = sys.argv[1], sys.argv[2]
    extras = "--extras" in sys.argv[3:]
    tool = next((a[len("--tool="):] for a in sys.argv[3:] if a.startswith("--tool=")), None)
    meshes = [(a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])) for a in sys.argv[3:]
              if not a.startswith("--")]
    d = tempfile.mkdtemp(prefix="gpt2ref-")
    passed = failed = 0
    common = ["--batch", str(B), "--context", str(T), "--steps", str(STEPS), "--lr", str(LR),
              "--weight-decay", str(WD)]
    try:
        init, toks, ref, g = prepare(d)
        for mesh, nprocs in meshes:
            p, f = check_mesh(exe, mpiexec, mesh, nprocs, d, init, toks, common, ref, g)
            passed, failed = passed + p, failed + f
        if extras:
            # The same init as llm.c's checkpoint, on a tensor-parallel mesh: the same checks
            # (losses and gradients against PyTorch, each device's boxes read, the banner).
            tp = [(m, n) for m, n in meshes if model_size(m) > 1]
            if tp:
                llmc = os.path.join(d, "init.bin")
                gpt2_ref.llmc_write(llmc, gpt2_ref.st_read(init), CFG["heads"])
                print("llm.c checkpoint:", end=" ")
                p, f = check_mesh(exe, mpiexec, tp[0][0], tp[0][1], d, llmc, toks, common, ref, g)
                passed, failed = passed + p, failed + f
            checks = [check_random_init(exe, mpiexec, meshes, d, toks),
                      check_schedule(exe, mpiexec, meshes[0][0], meshes[0][1], d, init, toks,
                                     common)]
            checks += [check_zero3(exe, mpiexec, m, n, d, init, toks, common)
                       for m, n in meshes if n > 1]
            if tool and tp:
                checks.append(check_out(exe, mpiexec, tool, tp[-1][0], tp[-1][1], d, init, toks,
                                        common))
            checks += [check_refusal(exe, mpiexec, tp[0][0], tp[0][1], d, toks)] if tp else []
            for p, f in checks:
                passed, failed = passed + p, failed + f
            if tp:
                p, f = check_odd_vocab(exe, mpiexec, tool, tp, d, common)
                passed, failed = passed + p, failed + f
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
