#!/usr/bin/env python3
"""examples/train_mlp --device gpu on the simulated accelerator (DT_GPU=sim: device memory the
host cannot touch, asynchronous streams, the CPU's kernels) against the same run on CPU
devices: a short run (hidden 32, 24 steps) on the 2x2 mesh must print the same accuracy and
write the same checkpoint bit for bit (parameters, ZeRO master weights and moments, counters)
and the same curves, as one process with 4 GPU devices, under `mpiexec -n 2` with 2 each and
`-n 4` with 1 each (the staged transport forced, in 1 KiB chunks). A run stopped on GPU
devices resumes on CPU devices (and the other way) exactly, and on GPU devices of another
process count. With --offload (the optimizer's state on the host) the run and its checkpoint
are the same, and it resumes without offload. Checkpoints
are read with numpy and tests/ckpt_py/stread.py (never our C code), through the helpers of
test_train_resume.py.
Usage: test_train_gpu.py TRAIN_MLP MPIEXEC MESH_DIR"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_train_resume as tr  # noqa: E402  (exits 77 without numpy)

COMMON = tr.COMMON
# The staged transport forced, with chunks small enough that its pipeline cuts the pieces.
STAGED_SMALL = {"DT_TRANSPORT": "staged", "DT_STAGED_CHUNK_KB": "1"}


def run(procs, devices, args, gpu, expect=0, env_more=None):
    """train_mlp under mpiexec with `procs` processes (0: no launcher) of `devices` devices
    each, GPU devices simulated when `gpu`; returns stdout and stderr. The ranks inherit the
    launcher's environment (one host), plus env_more."""
    tr.skip_np4_sanitized(procs)
    env = dict(os.environ, DT_CPU_DEVICES=str(devices), DT_GPU="sim",
               DT_GPU_DEVICES=str(devices), **(env_more or {}))
    cmd = [tr.TRAIN] + args + ["--device", "gpu" if gpu else "cpu"]
    if procs:
        cmd = [tr.MPIEXEC, "-n", str(procs)] + cmd
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    if p.returncode != expect:
        raise AssertionError(f"{' '.join(cmd)}: exit {p.returncode}, expected {expect}\n"
                             f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p.stdout, p.stderr


class TrainGpu(unittest.TestCase):
    check_result = tr.TrainResume.check_result
    assert_same_checkpoints = tr.TrainResume.assert_same_checkpoints

    @classmethod
    def setUpClass(cls):
        # The reference: the CPU run, once.
        cls.tmp = tempfile.mkdtemp(prefix="train_gpu_")
        cls.ref = os.path.join(cls.tmp, "cpu")
        out, _ = run(0, 4, cls.mesh() + COMMON + ["--out", cls.ref], gpu=False)
        cls.ref_out = out

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @staticmethod
    def mesh():
        return ["--mesh", os.path.join(tr.MESHES, "2x2.yaml")]

    def path(self, name):
        return os.path.join(self.tmp, name)

    def assert_same_as_cpu(self, out, outdir):
        self.assertEqual(self.check_result(out, outdir),
                         self.check_result(self.ref_out, self.ref))
        self.assert_same_checkpoints(os.path.join(self.ref, "checkpoint"),
                                     os.path.join(outdir, "checkpoint"))
        self.assertEqual(tr.curves(os.path.join(self.ref, "curves.csv")),
                         tr.curves(os.path.join(outdir, "curves.csv")))

    def test_gpu_devices_in_one_process_train_as_the_cpu_ones(self):
        d = self.path("gpu1")
        out, _ = run(0, 4, self.mesh() + COMMON + ["--out", d], gpu=True)
        self.assert_same_as_cpu(out, d)

    def test_gpu_devices_in_two_processes_train_as_the_cpu_ones(self):
        d = self.path("gpu2")
        out, _ = run(2, 2, self.mesh() + COMMON + ["--out", d], gpu=True)
        self.assert_same_as_cpu(out, d)

    def test_gpu_devices_in_four_processes_train_as_the_cpu_ones(self):
        d = self.path("gpu4")
        out, _ = run(4, 1, self.mesh() + COMMON + ["--out", d], gpu=True,
                     env_more=STAGED_SMALL)
        self.assert_same_as_cpu(out, d)

    def test_a_run_stopped_on_two_gpu_processes_resumes_on_four(self):
        d = self.path("g2g4")
        run(2, 2, self.mesh() + COMMON + ["--out", d, "--stop-after", "12"], gpu=True)
        out, _ = run(4, 1, self.mesh() + COMMON +
                     ["--out", d, "--resume", os.path.join(d, "checkpoint")], gpu=True)
        self.assert_same_as_cpu(out, d)

    def test_a_run_stopped_on_gpus_resumes_on_cpus_and_back(self):
        for first, then, name in ((True, False, "g2c"), (False, True, "c2g")):
            d = self.path(name)
            run(0, 4, self.mesh() + COMMON + ["--out", d, "--stop-after", "12"], gpu=first)
            out, _ = run(2, 2, self.mesh() + COMMON +
                         ["--out", d, "--resume", os.path.join(d, "checkpoint")], gpu=then)
            self.assert_same_as_cpu(out, d)

    def test_offload_trains_as_the_cpu_devices_and_resumes_without_it(self):
        # The optimizer's state on the host (--offload): the same run, the same checkpoint.
        d = self.path("off1")
        out, _ = run(0, 4, self.mesh() + COMMON + ["--out", d, "--offload"], gpu=True)
        self.assert_same_as_cpu(out, d)
        d = self.path("off2")
        run(2, 2, self.mesh() + COMMON + ["--out", d, "--offload", "--stop-after", "12"],
            gpu=True)
        out, _ = run(2, 2, self.mesh() + COMMON +
                     ["--out", d, "--resume", os.path.join(d, "checkpoint")], gpu=True)
        self.assert_same_as_cpu(out, d)
        _, err = run(0, 4, self.mesh() + COMMON + ["--out", self.path("offcpu"), "--offload"],
                     gpu=False, expect=1)
        self.assertIn("nothing to offload", err)

    def test_the_run_says_it_is_on_gpu_devices_and_bad_devices_are_refused(self):
        out, _ = run(0, 4, self.mesh() + COMMON[:-1] + ["--out", self.path("say"),
                                                        "--steps", "1"], gpu=True)
        self.assertIn("4 GPU devices (1 process x 4)", out)
        _, err = run(0, 4, self.mesh() + ["--device", "tpu"], gpu=True, expect=2)
        self.assertIn("--device: 'tpu' is not cpu or gpu", err)


def main():
    tr.TRAIN, tr.MPIEXEC, tr.MESHES = sys.argv[1:4]
    del sys.argv[1:4]
    unittest.main(verbosity=2)


if __name__ == "__main__":
    main()
