#!/usr/bin/python3
"""`dtensor tokenize` (tools/cmd_tokenize.c): text files and a directory of them, whole or line
by line, into llm.c token shards, read back here by llm.c's format (int32[256] header: magic
20240520, version 1, the token count; uint16 tokens) and decoded with this test's own
byte-level vocabulary (GPT-2's byte-to-unicode table, a few merges): the validation shard
first, every document preceded by <|endoftext|>, the decoded text equal to the input.
argv: the dtensor tool. Prints `N passed, N failed`."""
import json
import os
import struct
import subprocess
import sys
import tempfile


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def read_shard(path):
    with open(path, "rb") as f:
        head = struct.unpack("<256i", f.read(1024))
        body = f.read()
    assert head[0] == 20240520 and head[1] == 1, head[:3]
    assert len(body) == 2 * head[2], (len(body), head[2])
    return list(struct.unpack(f"<{head[2]}H", body))


def main():
    tool = sys.argv[1]
    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        passed += ok
        failed += not ok

    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    merges = [("a", "n"), ("an", "n"), ("Ġ", "A"), ("e", "r")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    eot = vocab["<|endoftext|>"]
    dec = {i: s for s, i in vocab.items()}
    u2b = {c: b for b, c in b2u.items()}

    def decode(ids):
        return bytes(u2b[c] for i in ids for c in dec[i]).decode("utf-8")

    def show(ids):
        """The text of ids, <EOT> for each end-of-text token."""
        out, run = [], []
        for i in ids + [eot]:
            if i == eot:
                out.append(decode(run))
                run = []
            else:
                run.append(i)
        return "<EOT>".join(out)

    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "vocab.json"), "w") as f:
            json.dump(vocab, f)
        with open(os.path.join(tmp, "merges.txt"), "w") as f:
            f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
        docs = os.path.join(tmp, "docs")
        os.makedirs(docs)
        texts = {"b.txt": "Anna and Ann met hannah here.\n", "a.txt": "Hänsel, Gretel: 42 names.\n"}
        for n, t in texts.items():
            with open(os.path.join(docs, n), "w") as f:
                f.write(t)
        out = os.path.join(tmp, "shards", "tok")
        os.makedirs(os.path.dirname(out))
        r = subprocess.run([tool, "tokenize", "--vocab", os.path.join(tmp, "vocab.json"),
                            "--merges", os.path.join(tmp, "merges.txt"), "--out", out,
                            "--val-tokens", "10", "--shard-tokens", "16", docs],
                           capture_output=True, text=True)
        check(r.returncode == 0, "tokenize of a directory succeeds" + (r.stderr and ": " + r.stderr))
        files = sorted(os.listdir(os.path.dirname(out)), key=lambda f: f[-10:])
        check(files[0] == "tok_val_000000.bin" and files[1] == "tok_train_000001.bin",
              f"the validation shard comes first ({files[:2]})")
        ids = sum((read_shard(os.path.join(tmp, "shards", f)) for f in files), [])
        sizes = [len(read_shard(os.path.join(tmp, "shards", f))) for f in files]
        check(sizes[0] == 10 and all(s == 16 for s in sizes[1:-1]),
              f"shards hold --val-tokens then --shard-tokens tokens ({sizes})")
        text = show(ids)
        check(text == "<EOT>" + texts["a.txt"] + "<EOT>" + texts["b.txt"],
              "the files decode back in name order, each after <|endoftext|>")
        check(vocab["ann"] in ids and vocab["ĠA"] not in ids[:3],
              "the merges apply (ann is one token)")
        r = subprocess.run([tool, "tokenize", "--vocab", os.path.join(tmp, "vocab.json"),
                            "--merges", os.path.join(tmp, "merges.txt"), "--out", out + "L",
                            "--lines", os.path.join(docs, "b.txt"), os.path.join(docs, "a.txt")],
                           capture_output=True, text=True)
        ids = read_shard(out + "L_val_000000.bin")
        text = show(ids)
        check(r.returncode == 0 and
              text == "<EOT>Anna and Ann met hannah here.<EOT>Hänsel, Gretel: 42 names.",
              "--lines makes each line a document")
        r = subprocess.run([tool, "tokenize", "--vocab", os.path.join(tmp, "vocab.json"),
                            "--merges", os.path.join(tmp, "merges.txt"), "--out", out,
                            os.path.join(tmp, "missing.txt")], capture_output=True, text=True)
        check(r.returncode == 1 and "missing.txt" in r.stderr,
              "a missing input is refused naming it")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
