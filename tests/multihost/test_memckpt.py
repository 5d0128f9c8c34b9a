#!/usr/bin/env python3
"""In-memory checkpoints on a buddy host (dt_memckpt, docs/recovery.md) under
tests/multihost/mh.sh (2 hosts as network namespaces, Open MPI over TCP): train_gpt on 2 hosts
x 2 processes, started by `dtensor launch --max-restarts 1`, saving to host memory every step
(K = 1; each host's memory a directory of its own, "mem-%h", since the namespaces share
/dev/shm) and to disk every 100 steps. Host 2's processes are killed at a random step (25 or
30) and its memory wiped: the relaunched job resumes from the newest step in memory (host 2's
files from their buddy copies on host 1), at most K steps lost, and its state at step 40
equals bit for bit an uninterrupted run's. With host 1's memory wiped too (the buddy host lost
as well; disk every 20 steps there, so that a disk step exists) the job says so, resumes from
the disk's step 20 and also reaches the same bits. Both recoveries are timed from the kill to
the first step after the restart, and to regaining the step reached before the kill.
Usage (inside mh.sh): test_memckpt.py TRAIN_GPT DTENSOR MPIRUN MESH_DIR"""
import glob
import os
import random
import re
import shutil
import sys
import tempfile
import time
import unittest

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
try:
    from test_multihost import Watched, run, same_state
except ImportError as e:  # numpy missing: meson's skip code
    print(f"skipping: {e}")
    sys.exit(77)

TRAIN = DTENSOR = MPIRUN = MESHES = None
TIMEOUT = 3      # DT_COMM_TIMEOUT
STEPS = 120      # the schedule's length (the learning rate's cosine)
STOP = 40        # where the runs stop (--stop-after): the state compared

FIGURES = {}


def host(i):
    return os.environ["MH_PREFIX"] + str(i)


def mpi_args():
    """What tests/multihost/mh.sh's mpirun adds for these hosts (as test_launch_restart.py)."""
    return ("--mca plm_rsh_agent {} --mca plm_rsh_no_tree_spawn 1 --mca btl tcp,self "
            "--mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 --mca pml ob1 "
            "--mca osc ^ucx --mca hwloc_base_binding_policy none --oversubscribe"
            .format(os.path.join(os.environ["MH_DIR"], "agent")))


class MemCkpt(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="memckpt_")
        # The uninterrupted run: 4 processes of 1 device, as the launched job, here on one
        # host (shared memory is quicker than the namespaces' TCP; two hosts train to the
        # same bits as one, test_multihost.py).
        ref = os.path.join(cls.tmp, "ref")
        run([MPIRUN, "-n", "4"] + cls.train(ref, 10, memory=False) + ["--keep-last", "10"],
            cls.env("ref"), timeout=240)
        cls.ref = os.path.join(ref, "step-%010d" % STOP)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)
        for name, value in FIGURES.items():
            print(f"memckpt figure: {name} = {value}", file=sys.stderr)

    def tearDown(self):
        for i in (1, 2):
            run([os.environ["MH_KILLHOST"], host(i)], os.environ)

    @classmethod
    def env(cls, job):
        e = {k: v for k, v in os.environ.items() if k != "DT_CPU_DEVICES"}
        e["DT_COMM_TIMEOUT"] = str(TIMEOUT)
        e["DT_MEMCKPT_DIR"] = os.path.join(cls.tmp, "mem-%h")
        e["DT_JOB_ID"] = job
        return e

    @classmethod
    def train(cls, root, disk_every, memory=True):
        return [TRAIN, "--mesh", os.path.join(MESHES, "2x2.yaml"), "--steps", str(STEPS),
                "--stop-after", str(STOP), "--eval-every", "5", "--ckpt-every",
                str(disk_every), "--ckpt-root", root, "--out", root + "-out"] + \
            (["--mem-ckpt-every", "1"] if memory else [])

    def memory(self, i):
        return os.path.join(self.tmp, f"mem-{host(i)}")

    def newest_in_memory(self, i):
        """The newest step host i began to save (committed or not): the step the job had
        completed (a step is saved right after it, K = 1)."""
        steps = [int(m.group(1)) for p in glob.glob(os.path.join(self.memory(i), "*", "step-*"))
                 if (m := re.search(r"step-(\d+)(\.dtensor-tmp)?$", p))]
        return max(steps) if steps else -1

    def kill_and_restart(self, job, disk_every, wipe_both):
        """Launches, kills host 2 at a random printed step (25 or 30; its memory wiped, host
        1's too when wipe_both), and returns (output, the step reached, seconds from the kill
        to the first step after the restart, and to regaining the step reached)."""
        root = os.path.join(self.tmp, job)
        launch = [os.environ["MH_INHOST"], host(1), DTENSOR, "launch", "--hosts",
                  f"{host(1)}:2,{host(2)}:2", "--mpiexec", MPIRUN, "--mpi-args", mpi_args(),
                  "--max-restarts", "1", "--"]
        w = Watched(launch + self.train(root, disk_every), self.env(job))
        at = random.Random(os.getpid()).choice((25, 30))
        t5 = w.wait_for(r"^step +5/", 180)
        t = w.wait_for(rf"^step +{at}/", 180)
        self.assertIsNotNone(t, "no progress:\n" + "".join(w.all))
        self.seconds_per_step = (t - t5) / (at - 5) if t5 else None
        run([os.environ["MH_KILLHOST"], host(2)], os.environ)
        t_kill = time.monotonic()
        # The newest step the job reached: host 1 began to save it to memory (K = 1).
        reached = self.newest_in_memory(1)
        shutil.rmtree(self.memory(2), ignore_errors=True)  # host 2's memory is gone
        if wipe_both:
            shutil.rmtree(self.memory(1), ignore_errors=True)
        t_failed = w.wait_for(r"dtensor launch: the job failed", 60)
        self.assertIsNotNone(t_failed, "the job did not fail:\n" + "".join(w.all))
        if wipe_both:  # whatever host 1's last processes left: the buddy host is lost too
            shutil.rmtree(self.memory(1), ignore_errors=True)
        # The restarted program's first line (after MPI_Init and the model's setup), then
        # its restore, then its first step.
        t_started = w.wait_for(r"in-memory checkpoints every", 120)
        t_resumed = w.wait_for(r"^resumed from", 120)
        t_first = w.wait_for(r"first step after resuming", 120)
        self.assertIsNotNone(t_first, "no step after the restart:\n" + "".join(w.all))
        kind = "memory" if not wipe_both else "disk (every 20 steps)"
        FIGURES[f"{kind}: seconds from the kill to the job's failure"] = round(t_failed - t_kill, 2)
        if t_started and t_resumed:
            FIGURES[f"{kind}: seconds from the failure to the relaunched program's setup"] = \
                round(t_started - t_failed, 2)
            FIGURES[f"{kind}: seconds from the setup to the restore's end"] = \
                round(t_resumed - t_started, 2)
            FIGURES[f"{kind}: seconds from the restore's end to the first step"] = \
                round(t_first - t_resumed, 2)
        t_back = w.wait_for(rf"^step +({reached // 5 * 5 + 5}|{STOP})/", 120)
        rc, out = w.finish(180)
        self.assertEqual(rc, 0, out)
        for line in out.splitlines():  # what the launcher and the job said, for the log
            if line.startswith("dtensor launch:") or "resum" in line or "memory" in line:
                print(line, file=sys.stderr)
        same_state(self, self.ref, os.path.join(root, "step-%010d" % STOP), STOP)
        self.assertFalse(glob.glob(os.path.join(self.memory(1), "dtensor-mem-" + job)),
                         "memory left after the job ended")
        return out, reached, t_first - t_kill, (t_back or t_first) - t_kill

    def test_killed_host_resumes_from_memory_losing_at_most_one_step_bit_identical(self):
        # The disk checkpoint every 100 steps: none yet at the kill.
        out, reached, first, back = self.kill_and_restart("memjob", 100, wipe_both=False)
        m = re.search(r"resumed from memory at step (\d+): (\d+) files in the memory of 1 "
                      r"host\(s\), (\d+) of them buddy copies", out)
        self.assertIsNotNone(m, out)
        step = int(m.group(1))
        self.assertGreater(int(m.group(3)), 0, out)  # host 2's files came from host 1
        lost = reached - step
        self.assertLessEqual(lost, 1, out)
        m = re.search(r"fetched in ([\d.]+) s, loaded in ([\d.]+) s", out)
        FIGURES["memory: seconds to restore (fetch + load)"] = \
            round(float(m.group(1)) + float(m.group(2)), 3)
        FIGURES["memory: steps lost"] = lost
        FIGURES["memory: seconds from kill to first step after restart"] = round(first, 2)
        FIGURES["memory: seconds from kill to regaining the killed step"] = round(back, 2)
        # This run's disk checkpoint (every 100 steps) had no step yet: a restart from disk
        # would have started over, re-running the `reached` steps (at this run's step time,
        # evaluation included) after the same relaunch.
        if self.seconds_per_step:
            disk = first + reached * self.seconds_per_step
            FIGURES["disk (every 100 steps, this run; computed): steps lost"] = reached
            FIGURES["disk (every 100 steps, this run; computed): seconds from kill to "
                    "regaining the killed step"] = round(disk, 2)
            FIGURES["recovery to the killed step, disk every 100 (computed) / memory"] = \
                round(disk / max(back, 1e-3), 2)

    def test_lost_buddy_host_too_falls_back_to_disk_and_says_so(self):
        # The disk checkpoint every 20 steps: step 20 is there at the kill.
        out, reached, first, back = self.kill_and_restart("diskjob", 20, wipe_both=True)
        self.assertRegex(out, r"memory: dt_memckpt_find: no step of job diskjob .*; resuming "
                              r"from disk")
        self.assertIn("at step 20\n", out)
        m = re.search(r"restored from disk in ([\d.]+) s", out)
        self.assertIsNotNone(m, out)
        FIGURES["disk: seconds to restore"] = float(m.group(1))
        FIGURES["disk (every 20 steps): steps lost"] = reached - 20
        FIGURES["disk (every 20 steps): seconds from kill to first step after restart"] = \
            round(first, 2)
        FIGURES["disk (every 20 steps): seconds from kill to regaining the killed step"] = \
            round(back, 2)


def main():
    global TRAIN, DTENSOR, MPIRUN, MESHES
    TRAIN, DTENSOR, MPIRUN, MESHES = sys.argv[1:5]
    order = ["test_killed_host_resumes_from_memory_losing_at_most_one_step_bit_identical",
             "test_lost_buddy_host_too_falls_back_to_disk_and_says_so"]
    tests = unittest.TestSuite(MemCkpt(name) for name in order)
    ok = unittest.TextTestRunner(verbosity=2).run(tests).wasSuccessful()
    d = "disk (every 20 steps): seconds from kill to regaining the killed step"
    if "memory: seconds from kill to regaining the killed step" in FIGURES and d in FIGURES:
        ratio = (FIGURES[d] /
                 max(FIGURES["memory: seconds from kill to regaining the killed step"], 1e-3))
        print(f"memckpt figure: recovery to the killed step, disk / memory = {ratio:.2f}x",
              file=sys.stderr)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
