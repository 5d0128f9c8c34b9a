#!/usr/bin/env python3
"""An exported GPT-2 loads back: train_gpt2 --out saves a checkpoint, `dtensor ckpt export
--format hf-gpt2` writes the Hugging Face file and config.json beside it; Python's json module
reads config.json and its sizes agree with the run's options and with the safetensors header
read by hand; `train_gpt2 --init EXPORT` runs and its first loss is the loss of the
checkpoint's own model (the run resumed from the checkpoint, on the same data: every batch of
the token file is the same sequence). Heads: --heads must agree with what the checkpoint
records; a config.json that contradicts the tensors is refused by --init.
Usage: test_ckpt_export_gpt2.py DTENSOR TRAIN_GPT2"""
import json
import os
import random
import re
import struct
import subprocess
import sys
import tempfile
import unittest

TOOL = TRAIN = None
L, C, H, V, T, B = 2, 32, 4, 64, 16, 2
MODEL = ["--layers", str(L), "--width", str(C), "--heads", str(H), "--vocab", str(V)]
RUN = ["--context", str(T), "--batch", str(B), "--lr", "1e-2"]


def run(args, timeout=120):
    env = dict(os.environ, DT_CPU_DEVICES="1")
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def losses(out):
    return {int(m.group(1)): float(m.group(2))
            for m in re.finditer(r"^step (\d+) loss (\S+)", out, re.M)}


def header_by_hand(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


class ExportGpt2(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        # llm.c tokens: one sequence of T repeated, so that every record (T inputs, T
        # targets) is the same and any two runs see the same batches.
        rng = random.Random(3)
        pattern = [rng.randrange(V) for _ in range(T)]
        toks = [pattern[i % T] for i in range(T * 40 + 1)]
        cls.toks = os.path.join(d, "toks.bin")
        head = [0] * 256
        head[0], head[1], head[2] = 20240520, 1, len(toks)
        with open(cls.toks, "wb") as f:
            f.write(struct.pack("<256i", *head) + struct.pack(f"<{len(toks)}H", *toks))
        cls.out = os.path.join(d, "a")
        rc, out, err = run([TRAIN, "--init", "random", *MODEL, *RUN, "--steps", "2",
                            "--data", cls.toks, "--out", cls.out])
        assert rc == 0, out + err
        cls.ckpt = os.path.join(cls.out, "checkpoint")
        cls.export_dir = os.path.join(d, "export")
        os.mkdir(cls.export_dir)
        cls.export = os.path.join(cls.export_dir, "model.safetensors")
        cls.rc, cls.stdout, cls.stderr = run([TOOL, "ckpt", "export", "--format", "hf-gpt2",
                                              cls.ckpt, cls.export])

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_export_writes_config_json_with_the_model_sizes(self):
        self.assertEqual(self.rc, 0, self.stdout + self.stderr)
        self.assertEqual(sorted(os.listdir(self.export_dir)), ["config.json",
                                                               "model.safetensors"])
        with open(os.path.join(self.export_dir, "config.json")) as f:
            cfg = json.load(f)
        want = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": V,
                "n_positions": T, "n_ctx": T, "n_embd": C, "n_layer": L, "n_head": H,
                "n_inner": None, "activation_function": "gelu_new",
                "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
                "torch_dtype": "float32"}
        self.assertEqual(cfg, want)
        # The same sizes as the file's own tensors, read here without any of our code.
        hdr = header_by_hand(self.export)
        self.assertEqual(hdr["wte.weight"]["shape"], [cfg["vocab_size"], cfg["n_embd"]])
        self.assertEqual(hdr["wpe.weight"]["shape"], [cfg["n_positions"], cfg["n_embd"]])
        layers = {int(k.split(".")[1]) for k in hdr if k.startswith("h.")}
        self.assertEqual(layers, set(range(cfg["n_layer"])))
        self.assertEqual(cfg["n_embd"] % cfg["n_head"], 0)

    def test_init_of_the_export_starts_at_the_loss_of_the_checkpoint_model(self):
        self.assertEqual(self.rc, 0, self.stdout + self.stderr)
        rc, out, err = run([TRAIN, "--init", self.export, *RUN, "--steps", "1",
                            "--data", self.toks])
        self.assertEqual(rc, 0, out + err)
        self.assertIn(f"{L} layers, width {C}, {H} heads, vocab {V}", out)
        got = losses(out)[0]
        # The checkpoint's own model: the run resumed, its step 2 (the same batch).
        rc, out, err = run([TRAIN, "--init", "random", *MODEL, *RUN, "--steps", "3",
                            "--data", self.toks, "--resume", self.out])
        self.assertEqual(rc, 0, out + err)
        want = losses(out)[2]
        self.assertLessEqual(abs(got - want), 1e-6 * abs(want), (got, want))

    def test_heads_given_must_agree_with_the_checkpoint_record(self):
        other = os.path.join(self.tmp.name, "other")
        os.mkdir(other)
        target = os.path.join(other, "model.safetensors")
        rc, out, err = run([TOOL, "ckpt", "export", "--format", "hf-gpt2", self.ckpt, target,
                            "--heads", "8"])
        self.assertEqual(rc, 1, out + err)
        self.assertIn("8 heads asked", err)
        self.assertIn(f"trained with {H}", err)
        self.assertEqual(os.listdir(other), [])
        rc, out, err = run([TOOL, "ckpt", "export", "--format", "hf-gpt2", self.ckpt, target,
                            "--heads", str(H)])
        self.assertEqual(rc, 0, out + err)
        with open(os.path.join(other, "config.json")) as f:
            self.assertEqual(json.load(f)["n_head"], H)

    def test_init_refuses_a_config_json_that_contradicts_the_tensors(self):
        self.assertEqual(self.rc, 0, self.stdout + self.stderr)
        bad = os.path.join(self.tmp.name, "bad")
        os.mkdir(bad)
        with open(self.export, "rb") as f, open(os.path.join(bad, "model.safetensors"),
                                                 "wb") as g:
            g.write(f.read())
        with open(os.path.join(self.export_dir, "config.json")) as f:
            cfg = json.load(f)
        cfg["n_embd"] = 2 * C
        with open(os.path.join(bad, "config.json"), "w") as f:
            json.dump(cfg, f)
        rc, out, err = run([TRAIN, "--init", os.path.join(bad, "model.safetensors"), *RUN,
                            "--steps", "1", "--data", self.toks])
        self.assertNotEqual(rc, 0, out + err)
        self.assertIn("n_embd", out + err)
        self.assertIn(str(2 * C), out + err)

    def test_export_into_the_checkpoint_directory_is_refused(self):
        rc, out, err = run([TOOL, "ckpt", "export", "--format", "hf-gpt2", self.ckpt,
                            os.path.join(self.ckpt, "model.safetensors")])
        self.assertEqual(rc, 1, out + err)
        self.assertIn("checkpoint directory", err)
        self.assertFalse(any(n.startswith(("model", "config")) for n in os.listdir(self.ckpt)))


if __name__ == "__main__":
    TOOL, TRAIN = sys.argv[1:3]
    del sys.argv[1:3]
    unittest.main(verbosity=2)
