#!/usr/bin/env python3
"""examples/train_vit (a small vision transformer on the digits, written with the public ops):
the default run on the 1x1 mesh, on the 2x2 mesh in one process (4 CPU devices) and on the
2x2 mesh under mpiexec -n 2 (2 devices each) reaches >= 97% held-out accuracy and prints the
same lines bit for bit: every loss (printed with 9 significant digits, enough to tell any two
f32 values apart), every held-out evaluation, each parameter's checksum (FNV-1a of its f32
bytes) and the result line. Bad options exit 2 with one line. Python standard library only.
Usage: test_train_vit.py TRAIN_VIT MPIEXEC MESH_DIR"""
import os
import re
import subprocess
import sys
import unittest

TRAIN = MPIEXEC = MESHES = None
RESULT = re.compile(r"^result accuracy=(\d\.\d{4}) heldout_loss=(\S+) checksum=([0-9a-f]{16}) "
                    r"steps=(\d+)$")
# The lines that must not depend on the mesh or the process count (not the timings).
COMPARED = ("step ", "eval ", "checksum ", "result ")


def run(procs, devices, args, expect=0):
    """train_vit under mpiexec with `procs` processes (0: no launcher) of `devices` CPU
    devices each; returns (stdout, stderr)."""
    env = dict(os.environ, DT_CPU_DEVICES=str(devices))
    cmd = [TRAIN] + args
    if procs:
        cmd = [MPIEXEC, "-n", str(procs)] + cmd
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    if p.returncode != expect:
        raise AssertionError(f"{' '.join(cmd)}: exit {p.returncode}, expected {expect}\n"
                             f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p.stdout, p.stderr


def mesh(name):
    return ["--mesh", os.path.join(MESHES, name + ".yaml")]


class TrainVit(unittest.TestCase):
    def test_meshes_and_processes_give_the_same_bits_and_97_percent(self):
        runs = {"1x1": (0, 1, "1x1"), "2x2": (0, 4, "2x2"), "2x2 np2": (2, 2, "2x2")}
        got = {}
        for name, (procs, devices, m) in runs.items():
            out, _ = run(procs, devices, mesh(m) + ["--log-every", "10", "--checksums"])
            lines = [l for l in out.splitlines() if l.startswith(COMPARED)]
            res = RESULT.match(lines[-1])
            self.assertIsNotNone(res, f"{name}: last line {lines[-1]!r}\n{out}")
            self.assertGreaterEqual(float(res.group(1)), 0.97, f"{name}\n{out}")
            self.assertEqual(sum(l.startswith("step ") for l in lines), 30, name)
            self.assertEqual(sum(l.startswith("checksum ") for l in lines), 13, name)
            got[name] = lines
        ref = got.pop("1x1")
        losses = [float(l.split()[3]) for l in ref if l.startswith("step ")]
        self.assertLess(losses[-1], losses[0] / 10)  # it learns
        for name, lines in got.items():
            for a, b in zip(ref, lines):
                self.assertEqual(b, a, f"{name} differs from 1x1")
            self.assertEqual(len(lines), len(ref), name)

    def test_bad_options_exit_2_with_one_line(self):
        for args, msg in ((["--bogus", "1"], "unknown option '--bogus'"),
                          (["--batch", "63"], "--batch 63: not a valid value"),
                          (["--steps"], "missing value: '--steps'")):
            out, err = run(0, 1, mesh("1x1") + args, expect=2)
            self.assertEqual(err.strip(), f"train_vit: {msg}" if "missing" not in msg
                             else f"train_vit: unknown option or {msg}")
            self.assertEqual(out, "")


if __name__ == "__main__":
    TRAIN, MPIEXEC, MESHES = sys.argv[1:4]
    del sys.argv[1:4]
    unittest.main(verbosity=2)
