#!/usr/bin/env python3
"""train_mlp on a real Slurm cluster (tests/launch/slurm_cluster.sh under tests/multihost/mh.sh:
munged, slurmctld and two slurmd from Debian's packages, each node a network namespace):
started through `sbatch` (a batch script that calls srun), through `srun` directly, and through
`dtensor launch` inside `salloc`, on 2 nodes x 2 processes of the 2x2 mesh. Each must give the
held-out accuracy and bit for bit the checkpoint of 4 processes under mpiexec on this host.
srun starts Open MPI's processes through PMIx (--mpi=pmix) and MPICH's through PMI2
(--mpi=pmi2): docs/launch.md.
Usage (inside slurm_cluster.sh): test_slurm.py MPI TRAIN_MLP MPIEXEC MESH_DIR DTENSOR"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "multihost"))
try:
    from test_multihost import COMMON, accuracy, run, same_state
except ImportError as e:  # numpy missing: meson's skip code
    print(f"skipping: {e}")
    sys.exit(77)

MPI = TRAIN = MPIEXEC = MESHES = DTENSOR = None
# Processes started by Slurm talk over the hosts' eth0 only, over TCP (no shared memory, even
# inside a host), as in tests/multihost.
NET = {"OMPI_MCA_btl": "tcp,self", "OMPI_MCA_btl_tcp_if_include": "eth0",
       "OMPI_MCA_oob_tcp_if_include": "eth0", "OMPI_MCA_pml": "ob1",
       "OMPI_MCA_hwloc_base_binding_policy": "none"}


def head(*cmd):
    """A command on host 1, where slurmctld runs and jobs are submitted."""
    return [os.environ["MH_INHOST"], os.environ["MH_PREFIX"] + "1", *cmd]


def srun_mpi():
    return "pmix" if MPI == "openmpi" else "pmi2"


class Slurm(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="slurm_")
        cls.args = ["--mesh", os.path.join(MESHES, "2x2.yaml")] + COMMON + ["--steps", "24"]
        cls.ref = os.path.join(cls.tmp, "ref")
        env = dict(os.environ, DT_CPU_DEVICES="1")
        cls.ref_acc = accuracy(run([MPIEXEC, "-n", "4", TRAIN] + cls.args + ["--out", cls.ref],
                                   env))
        cls.env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k in ("SLURM_CONF", "SLURM_DIR")}
        cls.env.update(NET, DT_CPU_DEVICES="1")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.before = self.host2_bytes()

    @staticmethod
    def host2_bytes():
        return int(run([os.environ["MH_BYTES"], os.environ["MH_PREFIX"] + "2"], os.environ))

    def check(self, out, name):
        # The job ran on both nodes: 12 steps' worth of the data-parallel gradient sums of a
        # 64-32-10 MLP at least crossed node 2's link.
        crossed = self.host2_bytes() - self.before
        self.assertEqual(accuracy(out), self.ref_acc)
        same_state(self, os.path.join(self.ref, "checkpoint"),
                   os.path.join(self.tmp, name, "checkpoint"), 24)
        print(f"{crossed} bytes over node 2's link", file=sys.stderr)
        self.assertGreater(crossed, 12 * (64 * 32 + 32 * 10) * 4)

    def train(self, name):
        return [TRAIN] + self.args + ["--out", os.path.join(self.tmp, name)]

    def test_srun_starts_train_mlp_on_two_nodes(self):
        out = run(head("srun", f"--mpi={srun_mpi()}", "-N", "2", "--ntasks-per-node", "2",
                       "--kill-on-bad-exit=1", *self.train("srun")), self.env, timeout=120)
        self.check(out, "srun")

    def test_sbatch_runs_train_mlp_on_two_nodes(self):
        script = os.path.join(self.tmp, "job.sh")
        log = os.path.join(self.tmp, "job.out")
        with open(script, "w") as f:
            f.write("#!/bin/sh\n#SBATCH -N 2\n#SBATCH --ntasks-per-node 2\n"
                    f"#SBATCH -o {log}\n"
                    # The nodes the batch step saw, then the job itself.
                    "echo nodes=$SLURM_JOB_NODELIST tasks=$SLURM_NTASKS_PER_NODE\n"
                    f"exec srun --mpi={srun_mpi()} --kill-on-bad-exit=1 "
                    + " ".join(self.train("sbatch")) + "\n")
        run(head("sbatch", "--wait", script), self.env, timeout=120)
        with open(log) as f:
            out = f.read()
        self.assertIn(f"nodes={os.environ['MH_PREFIX']}[1-2] tasks=2", out)
        self.check(out, "sbatch")

    def test_dtensor_launch_inside_salloc_uses_the_allocation(self):
        # No --hosts: the nodes and the tasks per node come from the allocation; the
        # launcher's daemons start through Slurm (Open MPI's plm/slurm, Hydra's bootstrap).
        p = subprocess.run(head("salloc", "-N", "2", "--ntasks-per-node", "2", DTENSOR,
                                "launch", "--dry-run", "--", *self.train("x")),
                           env=self.env, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        h = os.environ["MH_PREFIX"]
        if MPI == "mpich":  # srun with PMI2 (Hydra's start through Slurm hung here)
            self.assertIn(f"srun --mpi=pmi2 --kill-on-bad-exit=1 --nodes=2 --ntasks=4 "
                          f"--nodelist={h}1,{h}2 --ntasks-per-node=2 ", p.stdout)
        else:
            for i in (1, 2):
                self.assertIn(f"#   {h}{i} slots=2", p.stdout)
            self.assertIn(" -n 4 --map-by ppr:2:node ", p.stdout)
        out = run(head("salloc", "-N", "2", "--ntasks-per-node", "2", DTENSOR, "launch", "--",
                       *self.train("salloc")), self.env, timeout=120)
        self.check(out, "salloc")


def main():
    global MPI, TRAIN, MPIEXEC, MESHES, DTENSOR
    MPI, TRAIN, MPIEXEC, MESHES, DTENSOR = sys.argv[1:6]
    tests = unittest.TestLoader().loadTestsFromTestCase(Slurm)
    ok = unittest.TextTestRunner(verbosity=2).run(tests).wasSuccessful()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
