#!/usr/bin/env python3
"""examples/train_gpt with --context (the names packed into rows of T tokens, so attention runs
the tiled kernel) and --dropout (Philox keyed by the global element index): the same steps on
1x1 (one process) and 2x2 (four processes) give the same losses within rounding, dropout on;
so do meshes with a `seq` dim (the activations sharded along the sequence, attention context
parallel: batch x seq, model x seq, and the Llama variant on model x seq);
the tiled and untiled kernels (DT_ATTENTION_KERNEL) give the same losses within rounding, dropout
(of the residual branches and of the attention probabilities) on;
dropout changes the losses; --dropout with --manual-backward (the test-only TRAIN_GPT_MANUAL)
fails with one line.
Usage: test_train_context.py TRAIN_GPT TRAIN_GPT_MANUAL MPIEXEC MESH_DIR"""
import os
import subprocess
import sys
import tempfile
import unittest

TRAIN = TRAIN_MANUAL = MPIEXEC = MESHES = None
SMALL = ["--layers", "1", "--width", "16", "--heads", "2", "--batch", "4", "--warmup", "2",
         "--eval-every", "3", "--samples", "2", "--steps", "3", "--context", "256", "--quiet"]


def run(procs, mesh, args, env=None, expect=0, train=None):
    e = dict(os.environ, DT_CPU_DEVICES="1", **(env or {}))
    cmd = ([MPIEXEC, "-n", str(procs)] if procs else []) + [train or TRAIN, "--mesh",
                                                           os.path.join(MESHES, mesh + ".yaml")]
    p = subprocess.run(cmd + args, env=e, capture_output=True, text=True, timeout=240)
    if p.returncode != expect:
        raise AssertionError(f"{' '.join(cmd + args)}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def curve(d):
    """(training loss, held-out loss or None) per step of curves.csv."""
    with open(os.path.join(d, "curves.csv")) as f:
        rows = [line.rstrip("\n").split(",") for line in f][1:]
    return [(float(r[1]), float(r[2]) if r[2] else None) for r in rows]


class TrainContext(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="train_context_")

    def tearDown(self):
        self.tmp.cleanup()

    def out(self, name):
        return ["--out", os.path.join(self.tmp.name, name)]

    def close(self, a, b, what):
        self.assertEqual(len(a), 3, what)
        self.assertEqual(len(a), len(b), what)
        for i, ((l, e), (rl, re_)) in enumerate(zip(a, b)):
            self.assertAlmostEqual(l, rl, delta=1e-4 * rl, msg=f"{what} step {i + 1}")
            if re_ is not None:
                self.assertAlmostEqual(e, re_, delta=1e-4 * re_, msg=f"{what} step {i + 1}")

    def test_meshes_agree_with_dropout(self):
        drop = ["--dropout", "0.1"]
        run(0, "1x1", SMALL + drop + self.out("a"))
        run(4, "2x2", SMALL + drop + self.out("b"))
        self.close(curve(os.path.join(self.tmp.name, "b")), curve(os.path.join(self.tmp.name, "a")),
                   "2x2 against 1x1, dropout 0.1")
        run(0, "1x1", SMALL + self.out("c"))
        plain, dropped = curve(os.path.join(self.tmp.name, "c")), curve(os.path.join(self.tmp.name, "a"))
        self.assertNotEqual([l for l, _ in plain], [l for l, _ in dropped])

    def test_sequence_sharded_meshes_agree(self):
        meshes = {"1x1x2": "{batch: 1, model: 1, seq: 2}", "2x1x2": "{batch: 2, model: 1, seq: 2}",
                  "1x2x2": "{batch: 1, model: 2, seq: 2}"}
        for name, dims in meshes.items():
            with open(os.path.join(self.tmp.name, name + ".yaml"), "w") as f:
                f.write(f"mesh:\n  name: cpu_{name}\n  device_type: CPU\n  dims: {dims}\n")
        drop = ["--dropout", "0.1"]
        run(0, "1x1", SMALL + drop + self.out("ref"))
        ref = curve(os.path.join(self.tmp.name, "ref"))
        # Under the sanitizers (DT_TEST_SANITIZED, tests/meson.build) 1x2x2 alone: `model` x
        # `seq`, the ring over `seq` inside a tensor-parallel mesh, the llama run's mesh too;
        # `batch` x `seq` and `seq` alone run the same ring and are the plain pass's.
        seq_meshes = (("1x1x2", 2), ("2x1x2", 4), ("1x2x2", 4))
        if os.environ.get("DT_TEST_SANITIZED") == "1":
            seq_meshes = seq_meshes[2:]
        for name, procs in seq_meshes:
            mesh = os.path.join(self.tmp.name, name)
            run(procs, mesh, SMALL + drop + self.out(name))
            self.close(curve(os.path.join(self.tmp.name, name)), ref, name)
        llama = ["--arch", "llama", "--kv-heads", "1"]
        run(0, "1x1", SMALL + drop + llama + self.out("lref"))
        run(4, os.path.join(self.tmp.name, "1x2x2"), SMALL + drop + llama + self.out("l"))
        self.close(curve(os.path.join(self.tmp.name, "l")), curve(os.path.join(self.tmp.name, "lref")),
                   "llama 1x2x2")

    def test_tiled_and_untiled_kernels_agree(self):
        # Dropout on: both kernels drop the same attention probabilities.
        drop = ["--dropout", "0.1"]
        run(2, "2x1", SMALL + drop + self.out("t"), env={"DT_ATTENTION_KERNEL": "tiled"})
        run(2, "2x1", SMALL + drop + self.out("u"), env={"DT_ATTENTION_KERNEL": "untiled"})
        self.close(curve(os.path.join(self.tmp.name, "t")), curve(os.path.join(self.tmp.name, "u")),
                   "tiled against untiled, dropout 0.1")

    def test_dropout_needs_the_tape(self):
        p = run(0, "1x1", SMALL + ["--dropout", "0.1", "--manual-backward"] + self.out("m"),
                expect=1, train=TRAIN_MANUAL)
        self.assertIn("--dropout needs the tape", p.stdout + p.stderr)


if __name__ == "__main__":
    TRAIN, TRAIN_MANUAL, MPIEXEC, MESHES = sys.argv[1:5]
    unittest.main(argv=sys.argv[:1], verbosity=2)
