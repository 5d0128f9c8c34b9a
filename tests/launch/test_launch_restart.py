#!/usr/bin/env python3
"""`dtensor launch --max-restarts 1 --exclude-lost` on the hosts of tests/multihost/mh.sh (2
hosts as network namespaces, Open MPI over TCP): train_mlp on 2 hosts x 2 processes of the 2x2
mesh, saving through the checkpoint manager every 20 steps; host 2 is killed mid-run; the
launcher names it lost, relaunches on host 1 alone (2 processes of 2 devices, the same mesh)
from the latest committed step, and the job completes with exit status 0. Its final
parameters, read with numpy, equal bit for bit those of a run stopped by hand at that step
(--stop-after) and resumed by hand on host 1 alone, 2 processes. And with the link of host 2
cut instead, the launcher (its keepalive settings) ends the job within DT_COMM_TIMEOUT plus 2
minutes, where a bare mpirun waits for the lost daemon for about 8 minutes.
Usage (inside mh.sh): test_launch_restart.py TRAIN_MLP MESH_DIR DTENSOR MPIRUN"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "multihost"))
try:
    from test_multihost import Watched, run, same_state
except ImportError as e:  # numpy missing: meson's skip code
    print(f"skipping: {e}")
    sys.exit(77)

TRAIN = MESHES = DTENSOR = MPIRUN = None
TIMEOUT = 3  # DT_COMM_TIMEOUT
STEPS = 100  # long enough that the kill after step 24 lands before the last step


def host(i):
    return os.environ["MH_PREFIX"] + str(i)


def mpi_args():
    """What tests/multihost/mh.sh's mpirun adds for these hosts: its launch agent for ssh,
    TCP only over eth0."""
    return ("--mca plm_rsh_agent {} --mca plm_rsh_no_tree_spawn 1 --mca btl tcp,self "
            "--mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 --mca pml ob1 "
            "--mca osc ^ucx --mca hwloc_base_binding_policy none --oversubscribe"
            .format(os.path.join(os.environ["MH_DIR"], "agent")))


def env():
    e = {k: v for k, v in os.environ.items() if k != "DT_CPU_DEVICES"}
    e["DT_COMM_TIMEOUT"] = str(TIMEOUT)
    return e


class LaunchRestart(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="launch_restart_")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def tearDown(self):
        for i in (1, 2):
            run([os.environ["MH_KILLHOST"], host(i)], os.environ)
        run([os.environ["MH_UNCUT"], host(2)], os.environ)

    def train(self, root, *more):
        return [TRAIN, "--mesh", os.path.join(MESHES, "2x2.yaml"), "--hidden", "32",
                "--steps", str(STEPS), "--eval-every", "12", "--ckpt-every", "20",
                "--ckpt-root", root, "--out", root + "-out", *more]

    def launch(self, *opts):
        return [os.environ["MH_INHOST"], host(1), DTENSOR, "launch", "--hosts",
                f"{host(1)}:2,{host(2)}:2", "--mpiexec", MPIRUN, "--mpi-args", mpi_args(),
                *opts, "--"]

    def test_killed_host_restarts_on_the_other_host_from_the_last_checkpoint(self):
        root = os.path.join(self.tmp, "elastic")
        job = Watched(self.launch("--max-restarts", "1", "--exclude-lost") + self.train(root),
                      env())
        t = job.wait_for(r"^step +(2[4-9]|[3-9]\d)/", 120)
        self.assertIsNotNone(t, "no progress:\n" + "".join(job.all))
        run([os.environ["MH_KILLHOST"], host(2)], os.environ)
        t = job.wait_for(r"dtensor launch: restart 1 of 1 from step", 60)
        self.assertIsNotNone(t, "no restart:\n" + "".join(job.all))
        before = int(run([os.environ["MH_BYTES"], host(2)], os.environ))
        rc, out = job.finish(180)
        for line in out.splitlines():  # what the launcher said, for the log
            if line.startswith("dtensor launch:") or "resumed from" in line:
                print(line, file=sys.stderr)
        # The relaunch left host 2 out: hardly a byte crossed its link (a step's gradient sums
        # alone are 64 x 32 + 32 x 10 floats).
        crossed = int(run([os.environ["MH_BYTES"], host(2)], os.environ)) - before
        self.assertLess(crossed, (64 * 32 + 32 * 10) * 4, out)
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, rf"dtensor launch: the job failed \(exit status \d+\); lost "
                              rf"host\(s\): {host(2)}\n")
        m = re.search(r"restart 1 of 1 from step (\d+) \((\S+)\) on 2 processes: (\S+)\n", out)
        self.assertIsNotNone(m, out)
        step = int(m.group(1))
        self.assertEqual(m.group(3), host(1))
        self.assertGreaterEqual(step, 20)
        self.assertLess(step, STEPS)
        self.assertIn(f"resumed from {m.group(2)} at step {step}", out)
        # By hand: stopped at that step (4 processes, as the first run), then resumed on the
        # remaining host as 2 processes of 2 devices.
        byhand = os.path.join(self.tmp, "byhand")
        base = [os.environ["MH_INHOST"], host(1), MPIRUN] + mpi_args().split()
        run(base + ["--host", f"{host(1)}:4", "-n", "4"] +
            self.train(byhand, "--stop-after", str(step), "--quiet"), env(), timeout=240)
        run(base + ["--host", f"{host(1)}:2", "-n", "2"] +
            self.train(byhand, "--resume", "latest", "--quiet"), env(), timeout=240)
        a = os.path.join(root, "step-%010d" % STEPS)
        b = os.path.join(byhand, "step-%010d" % STEPS)
        same_state(self, a, b, STEPS)

    def test_cut_host_ends_the_launched_job_within_the_timeout_and_two_minutes(self):
        root = os.path.join(self.tmp, "cut")
        job = Watched(self.launch() + self.train(root, "--steps", "100000"), env())
        t = job.wait_for(r"^step +(1[2-9]|[2-9]\d|\d{3,})/", 120)
        self.assertIsNotNone(t, "no progress:\n" + "".join(job.all))
        run([os.environ["MH_CUT"], host(2)], os.environ)
        t0 = time.monotonic()
        rc, out = job.finish(TIMEOUT + 120)
        self.assertIsNotNone(rc, f"dtensor launch still running {TIMEOUT + 120} s after the "
                                 "cut:\n" + out)
        took = time.monotonic() - t0
        print(f"the launched job ended {took:.1f} s after the cut (exit status {rc})",
              file=sys.stderr)
        self.assertNotEqual(rc, 0, out)
        self.assertIn(host(2), out)


def main():
    global TRAIN, MESHES, DTENSOR, MPIRUN
    TRAIN, MESHES, DTENSOR, MPIRUN = sys.argv[1:5]
    # The killed host first: after the cut case, a new job on these hosts printed no step
    # within 120 s (seen since the merges of 2026-12-01, not understood yet; alone, or first,
    # the killed-host case passes).
    order = ["test_killed_host_restarts_on_the_other_host_from_the_last_checkpoint",
             "test_cut_host_ends_the_launched_job_within_the_timeout_and_two_minutes"]
    tests = unittest.TestSuite(LaunchRestart(name) for name in order)
    only = os.environ.get("LAUNCH_TEST_ONLY")  # a part of one test's name, to run it alone
    if only:
        tests = unittest.TestSuite(t for t in tests if only in t.id())
    ok = unittest.TextTestRunner(verbosity=2).run(tests).wasSuccessful()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
