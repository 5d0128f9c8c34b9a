#!/usr/bin/env python3
"""examples/train_gpt --pipe on small sizes: the same steps through 2 pipeline stages
(pipe=2 x batch=2 at 2 and 4 processes; GPipe, 1F1B, interleaved; gpt and llama) print the
same training and held-out losses and samples as the run without pipelining (--pipe 1 on
batch=2, micro-batches accumulated), the last losses to 9 digits; a run stopped at P=2
resumes at P=1 and P=4 with every tensor of its final checkpoint (parameters and AdamW
state, read by this test's own reader) bit for bit the uninterrupted run's; a process
holding two stages, a bad --schedule and an unpipelined checkpoint fail with a message.
(The parameters themselves are compared bit for bit in tests/pipeline/pipe_gpt.)
Usage: test_train_gpt_pipe.py TRAIN_GPT MPIEXEC MESH_DIR"""
import os
import re
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_train_resume  # noqa: E402

TRAIN = MPIEXEC = MESHES = None
SMALL = ["--layers", "4", "--width", "16", "--heads", "2", "--batch", "16", "--warmup", "2",
         "--steps", "4", "--eval-every", "1", "--microbatches", "4"]
RESULT = re.compile(r"^result train_loss=(\S+) heldout_loss=(\S+) pipe=(\d+) microbatches=4 "
                    r"schedule=(\S+) samples=(\S*) checkpoint=(\S+)$")
STEP = re.compile(r"^step +\d+/\d+ +loss (\S+) +held-out (\S+)", re.M)


def run(procs, devices, args, expect=0):
    test_train_resume.TRAIN, test_train_resume.MPIEXEC = TRAIN, MPIEXEC
    return test_train_resume.run(procs, devices, args, expect)


class TrainGptPipe(test_train_resume.ExampleCase):
    PREFIX = "train_gpt_pipe_"

    def losses(self, procs, devices, mesh, args, steps=4):
        out, _ = run(procs, devices, self.mesh(mesh) + SMALL + ["--out", self.path("out")] +
                     args)
        m = RESULT.match(out.strip().splitlines()[-1])
        self.assertIsNotNone(m, out)
        lines = STEP.findall(out)
        self.assertEqual(len(lines), steps, out)
        # the losses, the held-out loss and the samples (not the stage count)
        return lines, m.group(1), m.group(2), m.group(5)

    def test_pipelined_losses_equal_the_unpipelined_run(self):
        for arch in ("gpt", "llama"):
            ref = self.losses(0, 2, "2x1", ["--pipe", "1", "--arch", arch])
            for procs, devices in ((2, 2), (4, 1)):
                for sched in ("gpipe", "1f1b", "interleaved"):
                    if arch == "llama" and sched != "1f1b":
                        continue
                    got = self.losses(procs, devices, "pipe2x2",
                                      ["--pipe", "2", "--schedule", sched, "--arch", arch])
                    self.assertEqual(got, ref, f"{arch} {sched} np {procs}")

    def test_a_checkpoint_at_p2_resumes_at_p1_and_p4_bit_identical(self):
        longer = ["--steps", "6", "--samples", "3"]
        whole = self.path("whole")
        ref = self.losses(2, 1, "pipe2x1x1", ["--pipe", "2", "--out", whole] + longer, 6)
        stopped = self.path("stopped")
        self.losses(2, 1, "pipe2x1x1", ["--pipe", "2", "--out", stopped, "--stop-after", "3"]
                    + longer, 3)
        _, values = test_train_resume.read_checkpoint(os.path.join(stopped, "checkpoint"))
        self.assertEqual(values["train/step"]["value"], 3)
        want, _ = test_train_resume.read_checkpoint(os.path.join(whole, "checkpoint"))
        self.assertTrue(any(n.endswith("/exp_avg_sq") for n in want), sorted(want))
        for procs, mesh, pipe in ((0, "1x1", "1"), (4, "pipe4x1", "4")):
            if procs >= 4 and test_train_resume.SANITIZED:
                continue
            out = self.path("resumed" + pipe)
            got = self.losses(procs, 1, mesh, ["--pipe", pipe, "--out", out, "--resume",
                                               os.path.join(stopped, "checkpoint")] + longer, 3)
            self.assertEqual(got[0], ref[0][3:], f"P=2 -> P={pipe}")
            self.assertEqual(got[1:], ref[1:], f"P=2 -> P={pipe}")
            tensors, _ = test_train_resume.read_checkpoint(os.path.join(out, "checkpoint"))
            self.assertEqual(sorted(tensors), sorted(want))
            for name, a in want.items():
                self.assertTrue(np.array_equal(a.view(np.uint8), tensors[name].view(np.uint8)),
                                f"P=2 -> P={pipe}: {name} differs")

    def test_bad_uses_fail_with_a_message(self):
        _, err = run(0, 4, self.mesh("pipe2x2") + SMALL + ["--pipe", "2"], expect=1)
        self.assertIn("one stage", err)
        _, err = run(0, 1, ["--pipe", "1", "--schedule", "zigzag"], expect=2)
        self.assertIn("--schedule", err)
        _, err = run(0, 1, ["--microbatches", "2"], expect=2)
        self.assertIn("--pipe", err)
        # An unpipelined run's checkpoint draws its batches otherwise: refused, naming both.
        plain = self.path("plain")
        run(0, 1, self.mesh("1x1") + ["--layers", "4", "--width", "16", "--heads", "2",
                                      "--batch", "16", "--steps", "2", "--samples", "0",
                                      "--out", plain])
        _, err = run(0, 1, self.mesh("1x1") + SMALL + ["--pipe", "1", "--resume",
                                                       os.path.join(plain, "checkpoint")],
                     expect=1)
        self.assertIn("batches=pipe", err)


if __name__ == "__main__":
    TRAIN, MPIEXEC, MESHES = sys.argv[1:4]
    test_train_resume.MESHES = MESHES
    unittest.main(argv=sys.argv[:1], verbosity=2)
