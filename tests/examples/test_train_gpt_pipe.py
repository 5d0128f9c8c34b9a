#!/usr/bin/env python3
"""examples/train_gpt --pipe on small sizes: the same steps through 2 pipeline stages
(pipe=2 x batch=2 at 2 and 4 processes; GPipe, 1F1B, interleaved; gpt and llama) print the
same losses, every step to 9 digits, as the run without pipelining (--pipe 1 on batch=2,
micro-batches accumulated); a process holding two stages and a bad --schedule fail with a
message. (The parameters themselves are compared bit for bit in tests/pipeline/pipe_gpt.)
Usage: test_train_gpt_pipe.py TRAIN_GPT MPIEXEC MESH_DIR"""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_train_resume  # noqa: E402

TRAIN = MPIEXEC = MESHES = None
SMALL = ["--layers", "4", "--width", "16", "--heads", "2", "--batch", "16", "--warmup", "2",
         "--steps", "4", "--eval-every", "1", "--microbatches", "4"]
RESULT = re.compile(r"^result train_loss=(\S+) pipe=(\d+) microbatches=4 schedule=(\S+)$")
STEP = re.compile(r"^step +\d+/\d+ +loss (\S+)", re.M)


def run(procs, devices, args, expect=0):
    test_train_resume.TRAIN, test_train_resume.MPIEXEC = TRAIN, MPIEXEC
    return test_train_resume.run(procs, devices, args, expect)


class TrainGptPipe(test_train_resume.ExampleCase):
    PREFIX = "train_gpt_pipe_"

    def losses(self, procs, devices, mesh, args):
        out, _ = run(procs, devices, self.mesh(mesh) + SMALL + args)
        m = RESULT.match(out.strip().splitlines()[-1])
        self.assertIsNotNone(m, out)
        steps = STEP.findall(out)
        self.assertEqual(len(steps), 4, out)
        return steps, m.group(1)

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

    def test_bad_uses_fail_with_a_message(self):
        _, err = run(0, 4, self.mesh("pipe2x2") + SMALL + ["--pipe", "2"], expect=1)
        self.assertIn("one stage", err)
        _, err = run(0, 1, ["--pipe", "1", "--schedule", "zigzag"], expect=2)
        self.assertIn("--schedule", err)
        _, err = run(0, 1, ["--microbatches", "2"], expect=2)
        self.assertIn("--pipe", err)


if __name__ == "__main__":
    TRAIN, MPIEXEC, MESHES = sys.argv[1:4]
    test_train_resume.MESHES = MESHES
    unittest.main(argv=sys.argv[:1], verbosity=2)
