#!/usr/bin/env python3
"""Foreign files from the outside: (1) the hf-gpt2 export round trip: a GPT-2 restored from HF
and from llm.c files, saved as our checkpoint by 2 processes, exported by `dtensor ckpt export
--format hf-gpt2` and read back by an independent reader (tests/ckpt_py/stread.py: numpy and
the safetensors spec) must equal the HF reference tensors exactly, with HF names, fused c_attn,
no lm_head and __metadata__ {"format": "pt"}; (2) a fuzzer over safetensors headers, data and
HF indexes: every mutation is either rejected with a status naming the file, or accepted with
exactly what a strict outside parser reads from it; never a crash (run under ASan by the
sanitizer pass, which catches a read out of bounds).
Usage: test_foreign_files.py DTENSOR HELPER MPIEXEC DATA_DIR"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.environ.get("DT_TEST_SRCDIR",
                                               os.path.dirname(__file__) + "/.."), "ckpt_py"))
import stread  # noqa: E402

TOOL = HELPER = MPIEXEC = DATA = None
PER_KIND = int(os.environ.get("DT_FUZZ_PER_KIND", "60"))
KNOWN = {"F32", "F64", "F16", "BF16", "I32", "I64", "U8"}
DT_NAME = {"F32": "f32", "F64": "f64", "F16": "f16", "BF16": "bf16", "I32": "i32", "I64": "i64",
           "U8": "u8"}


def run(args, env=None, timeout=180):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run(args, capture_output=True, text=True, env=e, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


class ExportRoundTrip(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        ref = stread.SafeTensorsFile(os.path.join(DATA, "hf_gpt2", "model.safetensors"))
        cls.ref = {}
        for name in ref.header:
            if name == "lm_head.weight" or name.endswith(".attn.bias"):
                continue
            cls.ref[name[len("transformer."):] if name.startswith("transformer.") else name] = \
                ref.array(name)
        # Our checkpoints, saved by 2 processes: from HF with wte padded to 16 rows, from llm.c.
        cls.ck = {}
        for source, rows in (("hf_gpt2", 16), ("llmc_f32.bin", 0)):
            ck = os.path.join(cls.tmp.name, "ck-" + source)
            rc, out, err = run([MPIEXEC, "-n", "2", HELPER, "save-gpt2",
                                os.path.join(DATA, source), ck, str(rows)],
                               env={"DT_CPU_DEVICES": "2"})
            assert rc == 0, out + err
            cls.ck[source] = ck

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def export(self, source, vocab_arg):
        path = os.path.join(self.tmp.name, "out.safetensors")
        # These checkpoints (saved by foreign_helper) do not record the heads: given here.
        args = [TOOL, "ckpt", "export", "--format", "hf-gpt2", self.ck[source], path,
                "--heads", "2"]
        rc, out, err = run(args + (["--vocab", str(vocab_arg)] if vocab_arg else []))
        self.assertEqual(rc, 0, out + err)
        self.assertFalse(os.path.exists(path + ".partial"))
        with open(os.path.join(self.tmp.name, "config.json")) as f:
            cfg = json.load(f)
        self.assertEqual((cfg["n_head"], cfg["n_layer"], cfg["n_embd"], cfg["n_positions"]),
                         (2, 2, 8, 6))
        return stread.SafeTensorsFile(path)

    def test_export_of_a_checkpoint_without_recorded_heads_asks_for_them(self):
        d = tempfile.mkdtemp(dir=self.tmp.name)
        rc, out, err = run([TOOL, "ckpt", "export", "--format", "hf-gpt2", self.ck["hf_gpt2"],
                            os.path.join(d, "m.safetensors")])
        self.assertEqual(rc, 1, out + err)
        self.assertIn("--heads H", err)
        self.assertEqual(os.listdir(d), [])

    def check_equal(self, f, wte_rows):
        self.assertEqual(f.metadata, {"format": "pt"})
        self.assertEqual(set(f.header), set(self.ref))
        self.assertNotIn("lm_head.weight", f.header)
        for name, want in self.ref.items():
            got = f.array(name)
            if name == "wte.weight":
                self.assertEqual(got.shape, (wte_rows, want.shape[1]))
                self.assertTrue((got[want.shape[0]:] == 0).all())
                got = got[:want.shape[0]]
            self.assertEqual(f.header[name]["dtype"], "F32")
            self.assertEqual(got.shape, want.shape, name)
            self.assertTrue((got.view("u4") == want.view("u4")).all(), name)

    def test_hf_source_exported_equals_the_hf_file(self):
        self.check_equal(self.export("hf_gpt2", 10), 10)

    def test_llmc_source_exported_equals_the_same_model_in_hf_form(self):
        self.check_equal(self.export("llmc_f32.bin", 0), 10)

    def test_padded_vocabulary_is_kept_without_vocab(self):
        self.check_equal(self.export("hf_gpt2", 0), 16)

    def test_export_of_a_checkpoint_without_gpt2_names_fails_naming_the_parameter(self):
        bad = os.path.join(self.tmp.name, "bad")
        shutil.copytree(self.ck["hf_gpt2"], bad)
        ix = os.path.join(bad, "dtensor-index.json")
        with open(ix) as f:
            text = f.read()
        # rename a parameter and reseal as an editor that knows the format would: the
        # checkpoint stays valid, the export must name the missing parameter
        text = text.replace('"h.1.v.b"', '"h.1.vv.b"')
        key = text.index('"index_crc32c": "')
        with open(ix, "w") as f:
            f.write(text[:key] + '"index_crc32c": "%08x"\n}\n' % stread.crc32c(text[:key].encode()))
        rc, out, err = run([TOOL, "ckpt", "ls", bad])
        self.assertEqual(rc, 0, out + err)
        rc, out, err = run([TOOL, "ckpt", "export", "--format", "hf-gpt2", bad,
                            os.path.join(self.tmp.name, "x.safetensors")])
        self.assertEqual(rc, 1, out + err)
        self.assertIn("'h.1.v.b'", err)
        rc, out, err = run([TOOL, "ckpt", "export", "--format", "nope", bad, "x"])
        self.assertEqual(rc, 2, out + err)


# ---- fuzzing ---------------------------------------------------------------------------------

def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError("duplicate key")
    return dict(pairs)


def outside_view(path):
    """What a strict outside reader finds in a safetensors file: {name: (dtype, shape, crc)},
    None when it rejects the file, "skip" where the two readers may rightly differ."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        n = int.from_bytes(raw[:8], "little")
        json.loads(raw[8:8 + n].decode("utf-8"), object_pairs_hook=no_duplicates)
        f = stread.SafeTensorsFile(path)
    except ValueError:
        return "skip"    # duplicate keys, or JSON Python reads differently
    except (stread.FormatError, Exception):
        return None
    out = {}
    for name, e in f.header.items():
        if e["dtype"] not in KNOWN or len(e["shape"]) > 8 or not name or len(name) > 1024:
            return "skip"
        out[name] = (DT_NAME[e["dtype"]], list(e["shape"]), stread.crc32c(bytes(f.raw(name))))
    return out


def probe(paths):
    """Our reading of each file: {path: (dict or None, error line)}."""
    rc, out, err = run([HELPER, "probe"] + paths, env={"DT_CPU_DEVICES": "1"}, timeout=600)
    assert rc == 0, f"probe exited {rc} (a crash?):\n{out[-2000:]}\n{err[-4000:]}"
    res, cur = {}, None
    for line in out.splitlines():
        if line.startswith("== "):
            cur = line[3:]
            res[cur] = ({}, None)
        elif line.startswith("ERROR "):
            res[cur] = (None, line)
        elif cur is not None and res[cur][0] is not None:
            name, dt, shape, crc = line.rsplit(" ", 3)
            shape = [int(x) for x in shape.strip("[]").split(",") if x]
            res[cur][0][name] = (dt, shape, int(crc, 16))
    return res


def mutate(rng, data, lo, hi):
    at = rng.randrange(lo, hi)
    kind = rng.choice(["flip", "set", "insert", "delete", "truncate", "digit"])
    if kind == "flip":
        return data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1:]
    if kind == "set":
        return data[:at] + bytes([rng.randrange(256)]) + data[at + 1:]
    if kind == "insert":
        return data[:at] + bytes([rng.randrange(256)]) + data[at:]
    if kind == "delete":
        return data[:at] + data[at + 1:]
    if kind == "truncate":
        return data[:at]
    digits = [i for i in range(lo, hi) if chr(data[i]).isdigit()]   # lie about a number
    if not digits:
        return data[:at]
    i = rng.choice(digits)
    return data[:i] + str(rng.randrange(10)).encode() + data[i + 1:]


class Fuzz(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def test_mutated_safetensors_files_are_rejected_naming_the_file_or_read_exactly(self):
        rng = random.Random(33)
        with open(os.path.join(DATA, "single.safetensors"), "rb") as f:
            good = f.read()
        hlen = 8 + int.from_bytes(good[:8], "little")
        paths = []
        for k in range(3 * PER_KIND):
            lo, hi = (0, hlen) if k < 2 * PER_KIND else (hlen, len(good))
            data = mutate(rng, good, lo, hi)
            p = os.path.join(self.tmp.name, f"m{k}.safetensors")
            with open(p, "wb") as fh:
                fh.write(data)
            paths.append(p)
        res = probe(paths)
        rejected = accepted = 0
        for p in paths:
            ours, err = res[p]
            want = outside_view(p)
            if ours is None:
                rejected += 1
                self.assertIn(os.path.basename(p), err)
                self.assertRegex(err, r"DT_ERR_(CORRUPT|UNSUPPORTED)")
                if want not in (None, "skip"):
                    self.fail(f"{p}: an outside reader accepts it, we reject it: {err}")
            else:
                accepted += 1
                # a strict reader may reject what we accept (a gap, bytes after the data)
                if want not in (None, "skip"):
                    self.assertEqual(ours, want, p)
        self.assertGreater(rejected, PER_KIND)
        self.assertGreater(accepted, 0)

    def test_mutated_indexes_are_rejected_naming_the_index_or_read_exactly(self):
        rng = random.Random(34)
        shutil.copytree(os.path.join(DATA, "sharded"), os.path.join(self.tmp.name, "s"))
        ix = os.path.join(self.tmp.name, "s", "model.safetensors.index.json")
        with open(ix, "rb") as f:
            good_text = f.read()
        paths, texts = [], []
        for k in range(PER_KIND):
            data = mutate(rng, good_text, 0, len(good_text))
            p = os.path.join(self.tmp.name, "s", f"m{k}.safetensors.index.json")
            with open(p, "wb") as fh:
                fh.write(data)
            paths.append(p)
            texts.append(data)
        res = probe([ix] + paths)
        base = res[ix][0]
        self.assertIsNotNone(base)
        self.assertEqual(len(base), 4)
        files = {f: set(stread.SafeTensorsFile(os.path.join(self.tmp.name, "s", f)).header)
                 for f in os.listdir(os.path.join(self.tmp.name, "s"))
                 if f.endswith(".safetensors")}
        for p, text in zip(paths, texts):
            ours, err = res[p]
            try:
                j = json.loads(text.decode("utf-8"), object_pairs_hook=no_duplicates)
                wm = j["weight_map"]
                ok = (isinstance(wm, dict) and wm and
                      all(isinstance(v, str) and v in files and k in files[v]
                          for k, v in wm.items()))
            except Exception:
                ok = False
            if ok:
                self.assertIsNotNone(ours, f"{p}: a valid index rejected: {err}")
                self.assertEqual(ours, base, p)
            elif ours is None:
                self.assertIn(os.path.basename(p), err)


def main():
    global TOOL, HELPER, MPIEXEC, DATA
    TOOL, HELPER, MPIEXEC, DATA = sys.argv[1:5]
    del sys.argv[1:5]
    unittest.main(verbosity=2)


if __name__ == "__main__":
    main()
