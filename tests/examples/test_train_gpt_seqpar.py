#!/usr/bin/env python3
"""examples/train_gpt --sequence-parallel (activations sharded along the sequence over `model`
outside the tensor-parallel matmuls) and --cp K (checks the mesh's `seq` dim):
- the same steps with and without --sequence-parallel print the same losses (training and
  held-out, curves.csv) within 1e-5 relative: GPT on 1x2 (np 2) and 2x2 (np 4), the Llama
  variant on 2x2 (np 4), dropout 0.1 on; and the 1x1 single-device run likewise;
- it is not a no-op: the tape holds fewer bytes for the backward pass per process (the
  `tape: at most N bytes` line) by at least 20%: the sequence shards of the activations, and
  no whole-sequence input of a column-parallel matmul (each block's gathers and norms are
  re-run in the backward pass, as Megatron gathers again);
- those re-runs give the bits of recomputing whole blocks (--checkpoint-blocks, itself the
  plain tape's bits: tests/autograd): every tensor of the checkpoint after 3 steps (the
  parameters and the optimizer's state) bit for bit, on 1x2;
- --cp 2 on a batch x model x seq mesh with seq=2 runs and gives the losses of the 1x1 run;
  --cp 2 without a `seq` dim, --cp 4 on seq=2, --sequence-parallel with a `seq` dim, and
  in the test-only TRAIN_GPT_MANUAL with --manual-backward, are refused with one line and
  exit 1.
Usage: test_train_gpt_seqpar.py TRAIN_GPT TRAIN_GPT_MANUAL MPIEXEC MESH_DIR"""
import os
import re
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_train_resume  # noqa: E402

TRAIN = TRAIN_MANUAL = MPIEXEC = MESHES = None
SMALL = ["--layers", "2", "--width", "32", "--heads", "2", "--batch", "4", "--warmup", "2",
         "--eval-every", "3", "--samples", "2", "--steps", "3", "--context", "64",
         "--dropout", "0.1"]
SP = ["--sequence-parallel"]


def run(procs, mesh, args, expect=0, devices="1", train=None):
    e = dict(os.environ, DT_CPU_DEVICES=devices)
    if not mesh.endswith(".yaml"):
        mesh = os.path.join(MESHES, mesh + ".yaml")
    cmd = ([MPIEXEC, "-n", str(procs)] if procs else []) + [train or TRAIN, "--mesh", mesh]
    p = subprocess.run(cmd + args, env=e, capture_output=True, text=True, timeout=120)
    if p.returncode != expect:
        raise AssertionError(f"{' '.join(cmd + args)}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def curve(d):
    """(training loss, held-out loss or None) per step of curves.csv."""
    with open(os.path.join(d, "curves.csv")) as f:
        rows = [line.rstrip("\n").split(",") for line in f][1:]
    return [(float(r[1]), float(r[2]) if r[2] else None) for r in rows]


def tape_bytes(p):
    m = re.search(r"tape: at most (\d+) bytes", p.stdout + p.stderr)
    if not m:
        raise AssertionError(f"no tape line in\n{p.stdout}\n{p.stderr}")
    return int(m.group(1))


class TrainSeqPar(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="train_seqpar_")

    def tearDown(self):
        self.tmp.cleanup()

    def out(self, name):
        return ["--out", os.path.join(self.tmp.name, name)]

    def curve(self, name):
        return curve(os.path.join(self.tmp.name, name))

    def close(self, a, b, what):
        self.assertEqual(len(a), 3, what)
        self.assertEqual(len(a), len(b), what)
        for i, ((l, e), (rl, re_)) in enumerate(zip(a, b)):
            self.assertAlmostEqual(l, rl, delta=1e-5 * rl, msg=f"{what} step {i + 1}")
            self.assertEqual(e is None, re_ is None, what)
            if re_ is not None:
                self.assertAlmostEqual(e, re_, delta=1e-5 * re_, msg=f"{what} step {i + 1}")

    def test_losses_agree_and_tape_smaller(self):
        run(0, "1x1", SMALL + self.out("ref"))
        ref = self.curve("ref")
        run(0, "1x1", SMALL + SP + self.out("ref_sp"))
        self.close(self.curve("ref_sp"), ref, "1x1 --sequence-parallel")
        for procs, mesh, arch in ((2, "1x2", "gpt"), (4, "2x2", "gpt"), (4, "2x2", "llama")):
            what = f"{mesh} {arch}"
            args = SMALL + ["--arch", arch]
            plain = run(procs, mesh, args + self.out(what + "a"))
            sp = run(procs, mesh, args + SP + self.out(what + "b"))
            self.close(self.curve(what + "b"), self.curve(what + "a"),
                       what + " --sequence-parallel")
            if arch == "gpt":
                self.close(self.curve(what + "a"), ref, what + " against 1x1")
            a, b = tape_bytes(plain), tape_bytes(sp)
            self.assertLess(b, 0.8 * a,
                            f"{what}: tape bytes {b} with --sequence-parallel, {a} without")
            self.assertIn("sequence gathers recomputed", sp.stdout + sp.stderr)
            if mesh == "1x2":
                run(procs, mesh, args + SP + ["--checkpoint-blocks"] + self.out(what + "c"))
                want, _ = test_train_resume.read_checkpoint(
                    os.path.join(self.tmp.name, what + "c", "checkpoint"))
                got, _ = test_train_resume.read_checkpoint(
                    os.path.join(self.tmp.name, what + "b", "checkpoint"))
                self.assertEqual(sorted(got), sorted(want))
                for name, t in want.items():
                    self.assertTrue(np.array_equal(t.view(np.uint8), got[name].view(np.uint8)),
                                    f"{what}: {name} differs from --checkpoint-blocks'")

    def test_cp(self):
        mesh = os.path.join(self.tmp.name, "1x1x2.yaml")
        with open(mesh, "w") as f:
            f.write("mesh:\n  name: cpu_1x1x2\n  device_type: CPU\n"
                    "  dims: {batch: 1, model: 1, seq: 2}\n")
        run(0, "1x1", SMALL + self.out("ref"))  # the other test's reference, kept independent
        run(2, mesh, SMALL + ["--cp", "2"] + self.out("cp"))
        self.close(self.curve("cp"), self.curve("ref"), "--cp 2")
        p = run(0, "1x1", SMALL + ["--cp", "2"] + self.out("x"), expect=1)
        self.assertIn("--cp 2: mesh 'cpu_1x1' has no `seq` dim", p.stderr)
        p = run(0, mesh, SMALL + ["--cp", "4"] + self.out("x"), expect=1, devices="2")
        self.assertIn("--cp 4: mesh 'cpu_1x1x2' has seq=2", p.stderr)
        p = run(0, mesh, SMALL + SP + self.out("x"), expect=1, devices="2")
        self.assertIn("--sequence-parallel with a `seq` mesh dim is not supported", p.stderr)
        p = run(0, "1x1", SMALL + SP + ["--manual-backward"] + self.out("x"), expect=1,
                train=TRAIN_MANUAL)
        self.assertIn("--sequence-parallel needs the tape's backward", p.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    TRAIN, TRAIN_MANUAL, MPIEXEC, MESHES = sys.argv[1:5]
    unittest.main(argv=sys.argv[:1], verbosity=2)
