#!/usr/bin/env python3
"""`dtensor launch` on this host: the command it builds for the MPI this build links (Open MPI:
hostfile slots, --map-by ppr:N:node, -x, keepalive; MPICH: -f, -ppn, -genv) from --hosts, a
hostfile or a Slurm allocation's variables; the job's exit status; restarts (a stand-in
launcher that reports a lost host once, then succeeds: the relaunch leaves that host out and
resumes from the latest committed step under the manager's root, or refuses where the mesh
does not fit); and a real run of train_mlp through it equal bit for bit to one under mpiexec.
As root (containers), neither it nor BUILD/mpiexec needs Open MPI's OMPI_ALLOW_RUN_AS_ROOT
variables. Usage: test_launch.py [--sanitized] MPI DTENSOR TRAIN_MLP MPIEXEC MESH_DIR WRAPPER
(--sanitized: not the run of train_mlp against mpiexec, whose library code the sanitizer build
tests elsewhere; WRAPPER: BUILD/mpiexec)"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "multihost"))

MPI = DTENSOR = TRAIN = MPIEXEC = MESHES = WRAPPER = None
SANITIZED = False

# A stand-in launcher: records each call (argv, hostfile, DT_LAUNCH_RESTART) in $FAKE_LOG and
# behaves as $FAKE_PLAN says for that call: "lost:HOST" prints the runtime's lost-client
# error naming HOST (and a client of another host that answered) then exits 1; "exit:N";
# "signal:N" kills itself.
FAKE = r'''#!/usr/bin/env python3
import json, os, signal, sys
log = os.environ["FAKE_LOG"]
calls = [json.loads(l) for l in open(log)] if os.path.exists(log) else []
argv = sys.argv[1:]
hf = None
for flag in ("--hostfile", "-f"):
    if flag in argv:
        hf = open(argv[argv.index(flag) + 1]).read()
with open(log, "a") as f:
    f.write(json.dumps({"argv": argv, "hostfile": hf,
                        "restart": os.environ.get("DT_LAUNCH_RESTART")}) + "\n")
plan = os.environ["FAKE_PLAN"].split(",")[len(calls)]
what, arg = plan.split(":")
if what == "lost":
    print("train_mlp: forward/backward: DT_ERR_TIMEOUT: relayout exchange: lost client(s) 2 "
          f"(host {arg}), 3 (host {arg}): nothing came for 3 s and no answer to a ping in 1.5 s "
          "(DT_COMM_TIMEOUT); client(s) 1 (host a) answered but are waiting too", file=sys.stderr)
    sys.exit(1)
if what == "signal":
    os.kill(os.getpid(), int(arg))
sys.exit(int(arg))
'''


def clean_env(**more):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith("DT_") and not k.startswith("SLURM_")}
    e.update(more)
    return e


class Launch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="launch_")
        cls.fake = os.path.join(cls.tmp, "fake_mpiexec")
        with open(cls.fake, "w") as f:
            f.write(FAKE.replace("/usr/bin/env python3", sys.executable, 1))
        os.chmod(cls.fake, 0o755)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def launch(self, args, env, expect=0):
        p = subprocess.run([DTENSOR, "launch"] + args, env=env, capture_output=True,
                           text=True, timeout=300)
        self.assertEqual(p.returncode, expect, f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
        return p

    def dry(self, args, env):
        lines = self.launch(["--dry-run"] + args, env).stdout.splitlines()
        hostfile = [l[4:] for l in lines if l.startswith("#   ")]
        return hostfile, lines[-1]

    def test_two_hosts_give_the_command_of_the_linked_mpi(self):
        hf, cmd = self.dry(["--hosts", "a:2,b:2", "--env", "FOO=bar", "--env", "NOT_SET",
                            "--", "prog", "--x", "a b"],
                           clean_env(DT_COMM_TIMEOUT="3", DT_CPU_DEVICES="1"))
        words = cmd.split(" ")
        hostfile = words[2]
        if MPI == "mpich":
            self.assertEqual(hf, ["a:2", "b:2"])
            self.assertEqual(cmd, f"{MPIEXEC} -f {hostfile} -n 4 -ppn 2 "
                                  "-genv DT_COMM_TIMEOUT 3 -genv DT_CPU_DEVICES 1 "
                                  "-genv DT_LAUNCH_RESTART 0 -genv FOO bar prog --x 'a b'")
        else:
            self.assertEqual(hf, ["a slots=2", "b slots=2"])
            # DT_COMM_TIMEOUT=3: the watchdog reports after 4.5 s; keepalive 10 s + 3 x 5 s.
            self.assertEqual(cmd, f"{MPIEXEC} --hostfile {hostfile} -n 4 --map-by ppr:2:node "
                                  "-x DT_COMM_TIMEOUT=3 -x DT_CPU_DEVICES=1 "
                                  "-x DT_LAUNCH_RESTART=0 -x FOO=bar "
                                  "--mca oob_tcp_keepalive_time 10 "
                                  "--mca oob_tcp_keepalive_intvl 5 "
                                  "--mca oob_tcp_keepalive_probes 3 prog --x 'a b'")

    def test_default_timeout_keeps_the_launcher_within_two_minutes_of_it(self):
        if MPI == "mpich":
            self.skipTest("keepalive settings are Open MPI's")
        _, cmd = self.dry(["--", "prog"], clean_env())
        # DT_COMM_TIMEOUT unset: 300 s; 390 + 3 x 5 = 405 <= 300 + 120.
        self.assertIn("-n 1 -x DT_LAUNCH_RESTART=0 --mca oob_tcp_keepalive_time 390 ", cmd)
        self.assertNotIn("--hostfile", cmd)

    def test_slurm_allocation_gives_its_nodes_and_tasks(self):
        hf, cmd = self.dry(["prog"], clean_env(SLURM_JOB_NODELIST="n[01-03],m7",
                                               SLURM_TASKS_PER_NODE="2(x3),1"))
        if MPI == "mpich":  # srun with PMI2 (docs/launch.md): the nodes, no hostfile
            self.assertEqual(hf, [])
            self.assertEqual(cmd, "srun --mpi=pmi2 --kill-on-bad-exit=1 --nodes=4 --ntasks=7 "
                                  "--nodelist=n01,n02,n03,m7 prog")
        else:
            self.assertEqual(hf, ["n01 slots=2", "n02 slots=2", "n03 slots=2", "m7 slots=1"])
            self.assertIn(" -n 7 ", cmd)
            self.assertNotIn("ppr", cmd)
        hf, cmd = self.dry(["prog"], clean_env(SLURM_JOB_NODELIST="gpu-[8-10]",
                                               SLURM_NTASKS_PER_NODE="4"))
        if MPI == "mpich":
            self.assertEqual(cmd, "srun --mpi=pmi2 --kill-on-bad-exit=1 --nodes=3 --ntasks=12 "
                                  "--nodelist=gpu-8,gpu-9,gpu-10 --ntasks-per-node=4 prog")
        else:
            self.assertEqual(hf, ["gpu-8 slots=4", "gpu-9 slots=4", "gpu-10 slots=4"])
            self.assertIn(" -n 12 --map-by ppr:4:node ", cmd)

    def test_hostfile_forms_and_nproc_per_node(self):
        path = os.path.join(self.tmp, "hosts")
        with open(path, "w") as f:
            f.write("# a comment\na slots=3\nb:2\n\nc   # one slot\n")
        sep = ":" if MPI == "mpich" else " slots="
        hf, cmd = self.dry(["--hostfile", path, "prog"], clean_env())
        self.assertEqual(hf, [f"a{sep}3", f"b{sep}2", f"c{sep}1"])
        self.assertIn(" -n 6 ", cmd)
        hf, cmd = self.dry(["--hostfile", path, "--nproc-per-node", "2", "prog"], clean_env())
        self.assertEqual(hf, [f"a{sep}2", f"b{sep}2", f"c{sep}2"])
        self.assertIn(" -n 6 ", cmd)

    def test_bad_input_is_refused(self):
        self.launch(["--hosts", "a:0", "prog"], clean_env(), expect=1)
        self.launch(["--hosts", "a,a", "prog"], clean_env(), expect=1)
        self.launch(["--hosts", "a", "--hostfile", "f", "prog"], clean_env(), expect=2)
        self.launch(["--exclude-lost", "prog"], clean_env(), expect=2)
        self.launch(["--hosts", "a"], clean_env(), expect=2)
        p = self.launch(["prog"], clean_env(SLURM_JOB_NODELIST="n[1-"), expect=1)
        self.assertIn("no ']'", p.stderr)

    def fake_run(self, plan, args, expect, **env):
        log = os.path.join(self.tmp, "log.jsonl")
        if os.path.exists(log):
            os.unlink(log)
        p = self.launch(["--mpiexec", self.fake] + args, clean_env(
            FAKE_LOG=log, FAKE_PLAN=plan, **env), expect=expect)
        with open(log) as f:
            return p, [json.loads(l) for l in f]

    def test_exit_status_is_the_jobs(self):
        _, calls = self.fake_run("exit:7", ["prog"], 7)
        self.assertEqual(len(calls), 1)
        self.fake_run("signal:9", ["prog"], 128 + 9)
        # A crash without a lost host, one restart: the same hosts again, then its status.
        p, calls = self.fake_run("exit:5,exit:6", ["--hosts", "a,b", "--max-restarts", "1",
                                                   "prog"], 6)
        self.assertEqual([c["restart"] for c in calls], ["0", "1"])
        self.assertEqual(calls[0]["hostfile"], calls[1]["hostfile"])
        self.assertIn("restart 1 of 1 from the start (no --ckpt-root to resume from)", p.stderr)

    def test_restart_leaves_the_lost_host_out_and_resumes_from_the_latest_step(self):
        root = os.path.join(self.tmp, "root")
        # A manager root with committed steps 4 and 8 (one process, 4 devices).
        subprocess.run([TRAIN, "--mesh", os.path.join(MESHES, "2x2.yaml"), "--hidden", "16",
                        "--steps", "8", "--ckpt-every", "4", "--ckpt-root", root, "--quiet",
                        "--out", root + "-out"], env=clean_env(DT_CPU_DEVICES="4"),
                       check=True, capture_output=True)
        mesh = os.path.join(MESHES, "2x2.yaml")
        prog = ["prog", "--mesh", mesh, "--ckpt-root", root]
        p, calls = self.fake_run("lost:b,exit:0", ["--hosts", "a:2,b:2", "--max-restarts", "2",
                                                   "--exclude-lost", "--"] + prog, 0)
        self.assertEqual(len(calls), 2)
        self.assertIn("lost host(s): b\n", p.stderr)
        step8 = os.path.join(root, "step-%010d" % 8)
        self.assertIn(f"restart 1 of 2 from step 8 ({step8}) on 2 processes: a\n", p.stderr)
        sep = ":" if MPI == "mpich" else " slots="
        self.assertEqual(calls[0]["hostfile"], f"a{sep}2\nb{sep}2\n")
        self.assertEqual(calls[1]["hostfile"], f"a{sep}2\n")
        self.assertEqual(calls[1]["argv"][-7:], prog + ["--resume", step8])
        self.assertEqual(calls[1]["restart"], "1")
        # Without --exclude-lost: the same hosts again.
        _, calls = self.fake_run("lost:b,exit:0", ["--hosts", "a:2,b:2", "--max-restarts", "1",
                                                   "--"] + prog, 0)
        self.assertEqual(calls[1]["hostfile"], calls[0]["hostfile"])
        # 3 processes left cannot hold the 4 devices of the mesh: no restart, the job's status.
        p, calls = self.fake_run("lost:b,exit:0", ["--hosts", "a:3,b:3", "--max-restarts", "1",
                                                   "--exclude-lost", "--"] + prog, 1)
        self.assertEqual(len(calls), 1)
        self.assertIn("not restarting on fewer hosts: the mesh of", p.stderr)
        self.assertIn("(4 devices) does not fit 3 processes", p.stderr)

    def test_root_needs_no_open_mpi_variables_and_is_told_what_was_set(self):
        # Containers run as root, where Open MPI's launcher refuses to start unless both
        # variables are 1: the tool sets them for the job and says so once (Open MPI only).
        root = os.geteuid() == 0 and MPI == "openmpi"
        line = ("dtensor launch: running as root: set OMPI_ALLOW_RUN_AS_ROOT=1 "
                "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (Open MPI refuses root without them)")
        bare = {k: v for k, v in clean_env().items() if not k.startswith("OMPI_ALLOW_RUN_AS")}
        p = self.launch(["--nproc-per-node", "2", "--", "/bin/echo", "started"], bare)
        self.assertEqual(p.stdout.splitlines(), ["started", "started"], p.stderr)
        self.assertEqual(p.stderr.splitlines().count(line), 1 if root else 0, p.stderr)
        # --dry-run prints them before the command, so that the line runs as it is.
        p = self.launch(["--dry-run", "--", "prog"], bare)
        self.assertEqual(p.stdout.startswith("OMPI_ALLOW_RUN_AS_ROOT=1 "
                                             "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + MPIEXEC + " "),
                         root, p.stdout)
        # Already set (scripts/env.sh, the test harness): nothing to say.
        p = self.launch(["--nproc-per-node", "2", "--", "/bin/echo", "started"], clean_env(
            OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1"))
        self.assertEqual(p.stdout.splitlines(), ["started", "started"])
        self.assertNotIn("running as root", p.stderr)

    def test_build_tree_mpiexec_runs_as_root_without_open_mpi_variables(self):
        # BUILD/mpiexec, which the README's commands use, does the same as the tool.
        bare = {k: v for k, v in clean_env().items() if not k.startswith("OMPI_ALLOW_RUN_AS")}
        p = subprocess.run([WRAPPER, "-n", "2", "/bin/echo", "started"], env=bare,
                           capture_output=True, text=True, timeout=120)
        self.assertEqual((p.returncode, p.stdout.splitlines()), (0, ["started", "started"]),
                         p.stderr)
        root = os.geteuid() == 0 and MPI == "openmpi"
        self.assertEqual("mpiexec: running as root: set OMPI_ALLOW_RUN_AS_ROOT=1 "
                         "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in p.stderr, root, p.stderr)

    def test_train_mlp_through_launch_equals_mpiexec(self):
        if SANITIZED:
            self.skipTest("the plain build runs it")
        try:  # (only this case compares checkpoints: numpy)
            from test_multihost import same_state
        except ImportError as e:
            self.skipTest(f"{e}")
        args = ["--mesh", os.path.join(MESHES, "2x2.yaml"), "--hidden", "16", "--steps", "12",
                "--eval-every", "6", "--quiet"]
        a, b = os.path.join(self.tmp, "mpiexec"), os.path.join(self.tmp, "launch")
        env = clean_env()
        subprocess.run([MPIEXEC, "-n", "2", TRAIN] + args + ["--out", a], env=env, check=True,
                       capture_output=True)
        p = self.launch(["--nproc-per-node", "2", "--", TRAIN] + args + ["--out", b], env)
        self.assertRegex(p.stdout.splitlines()[-1], r"^result accuracy=")
        same_state(self, os.path.join(a, "checkpoint"), os.path.join(b, "checkpoint"), 12)


def main():
    global MPI, DTENSOR, TRAIN, MPIEXEC, MESHES, WRAPPER, SANITIZED
    SANITIZED = sys.argv[1:2] == ["--sanitized"]
    if SANITIZED:
        del sys.argv[1]
    MPI, DTENSOR, TRAIN, MPIEXEC, MESHES, WRAPPER = sys.argv[1:7]
    tests = unittest.TestLoader().loadTestsFromTestCase(Launch)
    ok = unittest.TextTestRunner(verbosity=2).run(tests).wasSuccessful()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
