#!/usr/bin/env python3
"""Writes the foreign files the tests of tests/foreign read, with numpy only (never our code):
safetensors files by the format's spec, an HF sharded set, llm.c GPT-2 checkpoints laid out as
llm.c's train_gpt2.py write_model does, bad files, and numpy's expected result of every view
case (manifest.txt), so that the C tests compare against an independent computation.
Usage: make_foreign.py OUTDIR STAMP_HEADER"""
import json
import os
import struct
import sys

import numpy as np

RNG_SEED = 1234


def bf16_bits(x):
    """float32 -> bf16 bits, rounding to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, dtype="<f4").view("<u4").astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return r.astype("<u2")


def bf16_to_f32(bits):
    return (bits.astype("<u4") << 16).view("<f4")


ST = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I32": "<i4"}


def raw(arr, dtype):
    if dtype == "BF16":
        return np.ascontiguousarray(arr, dtype="<u2").tobytes()
    return np.ascontiguousarray(arr, dtype=ST[dtype]).tobytes()


def write_st(path, tensors, meta=None):
    """tensors: list of (name, dtype, shape, bytes); data in that order, header per spec."""
    header, at = {}, 0
    if meta is not None:
        header["__metadata__"] = meta
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(data)]}
        at += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for t in tensors:
            f.write(t[3])


def single_tensors(rng):
    t = {}
    t["a.f32"] = ("F32", rng.standard_normal((6, 10)).astype("<f4"))
    t["w.c_attn"] = ("F32", rng.standard_normal((4, 12)).astype("<f4"))
    t["h.f16"] = ("F16", rng.standard_normal((5, 8)).astype("<f2"))
    t["h.bf16"] = ("BF16", bf16_bits(rng.standard_normal((7, 6)).astype("<f4")))
    t["b.bias"] = ("F32", rng.standard_normal(12).astype("<f4"))
    t["d.f64"] = ("F64", rng.standard_normal((3, 5)))
    t["s.scalar"] = ("F32", np.array(3.25, dtype="<f4"))
    t["e.empty"] = ("F32", np.zeros((0, 4), dtype="<f4"))
    t["i.i32"] = ("I32", np.arange(16, dtype="<i4").reshape(4, 4) * 7 - 20)
    return t


def value_f(dtype, arr):
    """The stored values as float64 (bf16 from its bits)."""
    if dtype == "BF16":
        return bf16_to_f32(arr).astype(np.float64)
    return arr.astype(np.float64)


def convert(x64, target):
    """numpy's conversion to the target dtype: raw little-endian bytes."""
    if target == "f32":
        return x64.astype("<f4").tobytes()
    if target == "f64":
        return x64.astype("<f8").tobytes()
    if target == "f16":
        return x64.astype("<f4").astype("<f2").tobytes()
    if target == "bf16":
        return bf16_bits(x64.astype("<f4")).tobytes()
    raise ValueError(target)


def view(arr, rb=0, re=-1, sd=0, sp=1, si=0, tr=0, pad=0):
    x = arr
    if x.ndim > 0:
        x = x[rb:(re if re >= 0 else x.shape[0])]
    if sp > 1:
        n = x.shape[sd] // sp
        x = np.take(x, range(si * n, (si + 1) * n), axis=sd)
    if tr:
        x = x.T
    if pad:
        x = np.concatenate([x, np.zeros((pad - x.shape[0],) + x.shape[1:], x.dtype)])
    return np.array(x, order="C", copy=True)


# ---- llm.c GPT-2 ---------------------------------------------------------------------------
L, C, NH, MAXT, V, VP = 2, 8, 2, 6, 10, 16


def llmc_params(rng):
    """llm.c's 16 arrays in file order (f32), wte's padding rows zero as llm.c writes them."""
    wte = rng.standard_normal((VP, C)).astype("<f4")
    wte[V:] = 0
    shapes = [("wpe", (MAXT, C)), ("ln1w", (L, C)), ("ln1b", (L, C)), ("qkvw", (L, 3 * C, C)),
              ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)),
              ("ln2w", (L, C)), ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
              ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]
    p = [("wte", wte)]
    for name, shape in shapes:
        p.append((name, rng.standard_normal(shape).astype("<f4")))
    return p


def write_llmc(path, params, version):
    header = np.zeros(256, dtype="<i4")
    header[:8] = [20240326, version, MAXT, V, L, NH, C, VP]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for _, a in params:
            f.write(a.tobytes() if version == 3 else bf16_bits(a).tobytes())


def ours_from_llmc(params, vocab_rows, bf16):
    """Our GPT-2 parameters (docs/foreign.md) from llm.c's arrays, in numpy."""
    P = {n: (bf16_to_f32(bf16_bits(a)) if bf16 else a) for n, a in params}
    out = {}
    wte = np.zeros((vocab_rows, C), "<f4")
    wte[:V] = P["wte"][:V]
    out["wte"] = wte
    out["wpe"] = P["wpe"]
    for l in range(L):
        h = f"h.{l}."
        qkvw, qkvb = P["qkvw"][l], P["qkvb"][l]
        out[h + "ln1.g"], out[h + "ln1.b"] = P["ln1w"][l], P["ln1b"][l]
        for k, n in enumerate("qkv"):
            out[h + n + ".w"] = qkvw[k * C:(k + 1) * C].T
            out[h + n + ".b"] = qkvb[k * C:(k + 1) * C]
        out[h + "o.w"], out[h + "o.b"] = P["attprojw"][l].T, P["attprojb"][l]
        out[h + "ln2.g"], out[h + "ln2.b"] = P["ln2w"][l], P["ln2b"][l]
        out[h + "fc.w"], out[h + "fc.b"] = P["fcw"][l].T, P["fcb"][l]
        out[h + "proj.w"], out[h + "proj.b"] = P["fcprojw"][l].T, P["fcprojb"][l]
    out["lnf.g"], out["lnf.b"] = P["lnfw"], P["lnfb"]
    return {k: np.ascontiguousarray(v, "<f4") for k, v in out.items()}


def hf_from_llmc(params, prefix):
    """The same model as HF's GPT-2 state dict (Conv1D weights [in, out], fused c_attn)."""
    P = dict(params)
    t = [(prefix + "wte.weight", P["wte"][:V]), (prefix + "wpe.weight", P["wpe"])]
    for l in range(L):
        h = f"{prefix}h.{l}."
        t += [(h + "ln_1.weight", P["ln1w"][l]), (h + "ln_1.bias", P["ln1b"][l]),
              (h + "attn.bias", np.tril(np.ones((MAXT, MAXT), "<f4"))),
              (h + "attn.c_attn.weight", P["qkvw"][l].T), (h + "attn.c_attn.bias", P["qkvb"][l]),
              (h + "attn.c_proj.weight", P["attprojw"][l].T),
              (h + "attn.c_proj.bias", P["attprojb"][l]),
              (h + "ln_2.weight", P["ln2w"][l]), (h + "ln_2.bias", P["ln2b"][l]),
              (h + "mlp.c_fc.weight", P["fcw"][l].T), (h + "mlp.c_fc.bias", P["fcb"][l]),
              (h + "mlp.c_proj.weight", P["fcprojw"][l].T),
              (h + "mlp.c_proj.bias", P["fcprojb"][l])]
    t += [(prefix + "ln_f.weight", P["lnfw"]), (prefix + "ln_f.bias", P["lnfb"]),
          ("lm_head.weight", P["wte"][:V])]
    return [(n, np.ascontiguousarray(a, "<f4")) for n, a in t]


def main(out, stamp):
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(RNG_SEED)
    T = single_tensors(rng)
    items = [(n, d, a.shape, raw(a, d)) for n, (d, a) in T.items()]
    single = os.path.join(out, "single.safetensors")
    write_st(single, items, {"format": "pt", "note": "made by make_foreign.py"})
    # HF's sharded layout: two files and the index.
    sh = os.path.join(out, "sharded")
    os.makedirs(sh, exist_ok=True)
    parts = {"model-00001-of-00002.safetensors": ["a.f32", "w.c_attn"],
             "model-00002-of-00002.safetensors": ["h.bf16", "b.bias"]}
    wm, total = {}, 0
    for fn, names in parts.items():
        write_st(os.path.join(sh, fn), [(n, T[n][0], T[n][1].shape, raw(T[n][1], T[n][0]))
                                        for n in names], {"format": "pt"})
        for n in names:
            wm[n] = fn
            total += len(raw(T[n][1], T[n][0]))
    with open(os.path.join(sh, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)
    # llm.c and the same model as an HF directory (transformer.-prefixed, with config.json).
    params = llmc_params(rng)
    write_llmc(os.path.join(out, "llmc_f32.bin"), params, 3)
    write_llmc(os.path.join(out, "llmc_bf16.bin"), params, 5)
    hf = os.path.join(out, "hf_gpt2")
    os.makedirs(hf, exist_ok=True)
    write_st(os.path.join(hf, "model.safetensors"),
             [(n, "F32", a.shape, a.tobytes()) for n, a in hf_from_llmc(params, "transformer.")],
             {"format": "pt"})
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump({"model_type": "gpt2", "n_head": NH, "n_layer": L, "n_embd": C,
                   "n_positions": MAXT, "vocab_size": V}, f)
    # Our GPT-2 parameters as numpy computes them: raw f32 files under gpt2_expect*/.
    for tag, bf, rows in (("f32", False, 12), ("bf16", True, 12), ("hf", False, 0)):
        d = os.path.join(out, "gpt2_expect_" + tag)
        os.makedirs(d, exist_ok=True)
        for name, a in ours_from_llmc(params, rows or V, bf).items():
            a.tofile(os.path.join(d, name + ".bin"))
    # View cases: id source tensor rb re sd sp si tr pad target.
    cases = [
        ("single.safetensors", "a.f32", 0, -1, 0, 1, 0, 0, 0, "f32"),
        ("single.safetensors", "a.f32", 1, 5, 0, 1, 0, 0, 0, "f32"),
        ("single.safetensors", "w.c_attn", 0, -1, 1, 3, 1, 0, 0, "f32"),
        ("single.safetensors", "w.c_attn", 0, -1, 0, 1, 0, 1, 0, "f32"),
        ("single.safetensors", "w.c_attn", 0, -1, 1, 3, 2, 1, 0, "f32"),
        ("single.safetensors", "h.f16", 0, -1, 0, 1, 0, 0, 0, "f32"),
        ("single.safetensors", "h.bf16", 0, -1, 0, 1, 0, 0, 0, "f32"),
        ("single.safetensors", "a.f32", 0, -1, 0, 1, 0, 0, 0, "bf16"),
        ("single.safetensors", "a.f32", 0, -1, 0, 1, 0, 0, 0, "f16"),
        ("single.safetensors", "d.f64", 0, -1, 0, 1, 0, 0, 0, "f32"),
        ("single.safetensors", "a.f32", 0, 5, 0, 1, 0, 0, 9, "f32"),
        ("single.safetensors", "b.bias", 0, -1, 0, 3, 2, 0, 0, "f32"),
        ("single.safetensors", "s.scalar", 0, -1, 0, 1, 0, 0, 0, "f32"),
        ("single.safetensors", "h.bf16", 0, -1, 0, 1, 0, 0, 0, "bf16"),
        ("single.safetensors", "h.bf16", 2, 7, 0, 1, 0, 1, 0, "f16"),
        ("sharded/model.safetensors.index.json", "a.f32", 0, -1, 0, 1, 0, 0, 0, "f32"),
        ("sharded", "h.bf16", 0, -1, 0, 1, 0, 1, 0, "f32"),
        ("sharded", "w.c_attn", 0, -1, 1, 3, 0, 0, 0, "f32"),
        ("llmc_f32.bin", "h.1.qkvw", 0, -1, 0, 3, 1, 1, 0, "f32"),
        ("llmc_bf16.bin", "wte", 0, V, 0, 1, 0, 0, 12, "f32"),
    ]
    llmc = dict(params)
    with open(os.path.join(out, "manifest.txt"), "w") as man:
        for k, (s, name, rb, re, sd, sp, si, tr, pad, target) in enumerate(cases):
            if s.startswith("llmc"):
                l, n = (int(name.split(".")[1]), name.split(".")[2]) if "." in name else (-1, name)
                a = llmc[n][l] if l >= 0 else llmc[n]
                x64 = value_f("BF16", bf16_bits(a)) if "bf16" in s else a.astype(np.float64)
            else:
                d, a = T[name]
                x64 = value_f(d, a)
            x = view(x64, rb, re, sd, sp, si, tr, pad)
            with open(os.path.join(out, f"expect_{k}.bin"), "wb") as f:
                f.write(convert(x, target))
            shape = ",".join(str(v) for v in x.shape) or "-"
            man.write(f"{k} {s} {name} {rb} {re} {sd} {sp} {si} {tr} {pad} {target} {shape}\n")
    write_bad(out, T)
    with open(stamp, "w") as f:
        f.write("/* Generated by make_foreign.py. */\n#define FOREIGN_DIR \"%s\"\n" % out)


def write_bad(out, T):
    bad = os.path.join(out, "bad")
    os.makedirs(bad, exist_ok=True)
    good = [("x", "F32", (4, 4), np.arange(16, dtype="<f4").tobytes()),
            ("y", "F32", (2, 3), np.arange(6, dtype="<f4").tobytes())]
    p = os.path.join(bad, "good.safetensors")
    write_st(p, good)
    data = open(p, "rb").read()
    open(os.path.join(bad, "truncated.safetensors"), "wb").write(data[:-5])
    lie = [("x", "F32", (4, 4), good[0][3]), ("y", "F32", (2, 3), good[1][3])]
    write_st(os.path.join(bad, "lying_offsets.safetensors"), lie)
    # Rewrite y's offsets to run past the end, and an overlap of x and y.
    for fname, yoff in (("lying_offsets.safetensors", [64, 99999]),
                        ("overlap.safetensors", [40, 64]), ("wrong_span.safetensors", [64, 84])):
        hdr = {"x": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]},
               "y": {"dtype": "F32", "shape": [2, 3], "data_offsets": yoff}}
        text = json.dumps(hdr).encode()
        text += b" " * (-len(text) % 8)
        open(os.path.join(bad, fname), "wb").write(struct.pack("<Q", len(text)) + text +
                                                   good[0][3] + good[1][3])
    text = b'{"x": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]'  # no closing }
    open(os.path.join(bad, "bad_json.safetensors"), "wb").write(
        struct.pack("<Q", len(text)) + text + good[0][3])
    open(os.path.join(bad, "header_length.safetensors"), "wb").write(
        struct.pack("<Q", 1 << 40) + data[8:])
    unk = {"x": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}
    text = json.dumps(unk).encode()
    open(os.path.join(bad, "dtype.safetensors"), "wb").write(
        struct.pack("<Q", len(text)) + text + b"\0" * 4)
    # An index naming a tensor its file lacks, and one naming a missing file.
    for sub, wm in (("index_ghost", {"x": "good.safetensors", "ghost": "good.safetensors"}),
                    ("index_nofile", {"x": "gone.safetensors"})):
        d = os.path.join(bad, sub)
        os.makedirs(d, exist_ok=True)
        write_st(os.path.join(d, "good.safetensors"), good)
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": wm}, f)
    # llm.c: a version it does not know, and a truncated file.
    hdr = np.zeros(256, "<i4")
    hdr[:8] = [20240326, 4, MAXT, V, L, NH, C, VP]
    open(os.path.join(bad, "llmc_version.bin"), "wb").write(hdr.tobytes() + b"\0" * 64)
    hdr[1] = 3
    open(os.path.join(bad, "llmc_truncated.bin"), "wb").write(hdr.tobytes() + b"\0" * 64)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
