#!/usr/bin/env python3
"""Every byte a restore relies on is checked: a fuzzer over a good checkpoint (saved by 2
processes x 2 devices) mutates the index, the safetensors headers and the data (bit flips, byte
changes, inserted, deleted and truncated bytes, and edits of the index's meaning: named values
emptied, mesh string, chunk_bytes and a value changed, rewritten as JSON). Each mutation must be
caught, `dtensor ckpt verify` exiting 1 naming the mutated file, and a restore of everything
(3 devices, other layouts) failing with DT_ERR_CORRUPT, or else be harmless: verify passes,
`dtensor ckpt ls` shows exactly what it shows of the good one, and the restore gives back every
element and value exactly. An edit of the index's meaning is never harmless. Standard library only.
Usage: test_ckpt_fuzz.py DTENSOR MAKE_CKPT MPIEXEC"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

TOOL = HELPER = MPIEXEC = None
VERSION = 7
PER_KIND = int(os.environ.get("DT_FUZZ_PER_KIND", "40"))


def run(args, env=None, timeout=120):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run(args, capture_output=True, text=True, env=e, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def mutate_bytes(rng, data, lo, hi):
    """One random change of data inside [lo, hi): (new bytes, description) or None."""
    if hi <= lo:
        return None
    at = rng.randrange(lo, hi)
    kind = rng.choice(["flip", "set", "insert", "delete", "truncate", "append"])
    if kind == "flip":
        bit = rng.randrange(8)
        new = data[:at] + bytes([data[at] ^ (1 << bit)]) + data[at + 1:]
    elif kind == "set":
        v = rng.randrange(256)
        new = data[:at] + bytes([v]) + data[at + 1:]
    elif kind == "insert":
        new = data[:at] + bytes([rng.randrange(256)]) + data[at:]
    elif kind == "delete":
        new = data[:at] + data[at + 1:]
    elif kind == "truncate":
        new = data[:at]
    else:
        new = data + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
    return (new, f"{kind} at {at}") if new != data else None


def semantic_edits(text):
    """Edits of the index's meaning, each rewritten as plain JSON by an outside tool."""
    out = []
    for what, edit in (
            ("values emptied", lambda ix: ix.__setitem__("values", [])),
            ("mesh string altered", lambda ix: ix.__setitem__("mesh", ix["mesh"] + "x")),
            ("chunk_bytes altered", lambda ix: ix.__setitem__("chunk_bytes",
                                                               ix["chunk_bytes"] * 2)),
            ("step changed", lambda ix: next(v for v in ix["values"] if v["name"] == "step")
             .__setitem__("value", VERSION + 1)),
            ("a tensor dropped", lambda ix: ix["tensors"].pop()),
            ("num_devices altered", lambda ix: ix.__setitem__("num_devices", 1))):
        ix = json.loads(text)
        edit(ix)
        out.append((json.dumps(ix, indent=1).encode() + b"\n", what))
    return out


class Fuzz(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.good = os.path.join(self.tmp.name, "good")
        cmd = [MPIEXEC, "-n", "2", HELPER, "save", self.good, str(VERSION), "--pieces"]
        rc, out, err = run(cmd, env={"DT_CPU_DEVICES": "2"})
        self.assertEqual(rc, 0, out + err)

    def tearDown(self):
        self.tmp.cleanup()

    def listing(self, d):
        """What `dtensor ckpt ls` shows of d (mesh, files, tensors, slices, values)."""
        rc, out, err = run([TOOL, "ckpt", "ls", d])
        self.assertEqual(rc, 0, err)
        return out.replace(d, "D")

    def test_every_mutation_is_caught_or_harmless(self):
        seed = int(os.environ.get("DT_FUZZ_SEED", time.time_ns() % 100000))
        rng = random.Random(seed)
        print(f"\nseed {seed} (DT_FUZZ_SEED)", file=sys.stderr)
        with open(os.path.join(self.good, "dtensor-index.json"), "rb") as f:
            index_text = f.read()
        index = json.loads(index_text)
        files = index["files"]
        cases = []  # (kind, file name, new bytes, description)
        for new, what in semantic_edits(index_text):
            cases.append(("semantic", "dtensor-index.json", new, what))
        kinds = {"index": 0, "header": 0, "data": 0}
        while min(kinds.values()) < PER_KIND:
            kind = rng.choice([k for k, n in kinds.items() if n < PER_KIND])
            if kind == "index":
                name, data, lo, hi = "dtensor-index.json", index_text, 0, len(index_text)
            else:
                fi = rng.choice(files)
                name = fi["name"]
                with open(os.path.join(self.good, name), "rb") as f:
                    data = f.read()
                lo, hi = (0, fi["header_bytes"]) if kind == "header" \
                    else (fi["header_bytes"], fi["bytes"])
            m = mutate_bytes(rng, data, lo, hi)
            if m:
                cases.append((kind, name, m[0], m[1]))
                kinds[kind] += 1
        dirs, verdicts = [], []
        for k, (kind, name, new, what) in enumerate(cases):
            d = os.path.join(self.tmp.name, f"m{k:03d}")
            shutil.copytree(self.good, d)
            with open(os.path.join(d, name), "wb") as f:
                f.write(new)
            rc, out, err = run([TOOL, "ckpt", "verify", d])
            label = f"{kind} {name}: {what}"
            self.assertIn(rc, (0, 1), f"{label}: verify crashed ({rc}):\n{out}{err}")
            if rc == 1:
                self.assertIn(name, err, f"{label}: the message does not name the file")
                self.assertRegex(err, r"field '|\.json:\d+:\d+:|truncated|missing|header",
                                 f"{label}: the message names no field")
            else:  # harmless only if a reader sees nothing changed
                self.assertNotEqual(kind, "semantic", f"{label}: verify passed")
                self.assertEqual(self.listing(d), self.listing(self.good), label)
            dirs.append(d)
            verdicts.append((label, rc))
        # One restore process for all: 3 devices, layouts other than the saved ones.
        rc, out, err = run([HELPER, "check", "--pieces", *dirs], env={"DT_CPU_DEVICES": "3"},
                           timeout=300)
        got = {}
        for line in out.splitlines():
            f = line.split()
            if f[:1] == ["result"]:
                got[f[1]] = " ".join(f[2:])
        harmless = 0
        for d, (label, vrc) in zip(dirs, verdicts):
            res = got.get(d)
            if vrc == 1:
                self.assertEqual(res, "error=DT_ERR_CORRUPT", f"{label}: restore gave {res}")
            else:
                harmless += 1
                self.assertEqual(res, f"version={VERSION}", f"{label}: verify passed but the "
                                 f"restore gave {res}")
        print(f"{len(cases)} mutations ({kinds} + {len(cases) - sum(kinds.values())} "
              f"semantic): {len(cases) - harmless} caught, {harmless} harmless", file=sys.stderr)
        # The good checkpoint itself passes both (the checks can fail only on a change).
        rc, out, err = run([TOOL, "ckpt", "verify", self.good])
        self.assertEqual(rc, 0, out + err)


if __name__ == "__main__":
    TOOL, HELPER, MPIEXEC = sys.argv[1:4]
    del sys.argv[1:4]
    unittest.main(verbosity=2)
