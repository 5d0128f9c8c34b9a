#!/usr/bin/env python3
"""Crash safety of dt_save and dt_save_async, black box: SIGKILL a 2-process save of version k+1
over version k at random moments (all processes at once, one after the other, or one rank and
let mpiexec end the other; half the saves asynchronous); after every kill `dtensor ckpt verify`
passes and a restore onto 3 devices holds exactly version k or k+1, every element and value of
it, never a mix and never an error. A full disk (a small tmpfs when this process may mount one;
always also ENOSPC injected by an LD_PRELOAD shim at several points of the save, on one client
only, and in an asynchronous save) fails the save on every client with DT_ERR_IO and keeps the
previous checkpoint. A client killed mid-save, mid-commit of an asynchronous save or
mid-restore (the job kept running) gives the other DT_ERR_TIMEOUT naming it within
DT_COMM_TIMEOUT, not a hang. Standard library only.
Usage: test_ckpt_crash.py DTENSOR MAKE_CKPT MPIEXEC SHIM"""
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

TOOL = HELPER = MPIEXEC = SHIM = None
TRIALS = int(os.environ.get("DT_CRASH_TRIALS", "20"))
BIG_MIB = 4  # a save of ~4 MiB, ~0.1-0.2 s with fsync: kills land at every stage


def run(args, env=None, timeout=60):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run(args, capture_output=True, text=True, env=e, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def save_cmd(d, version, big_mib, announce=False, asynchronous=False):
    cmd = [MPIEXEC, "-n", "2", HELPER, "save", d, str(version), "--big-mib", str(big_mib)]
    return cmd + (["--announce"] if announce else []) + (["--async"] if asynchronous else [])


def save(d, version, big_mib, env=None, asynchronous=False):
    e = {"DT_CPU_DEVICES": "2"}
    e.update(env or {})
    return run(save_cmd(d, version, big_mib, asynchronous=asynchronous), env=e, timeout=120)


def check(dirs, big_mib):
    """{dir: version} from one restore of each dir onto 3 devices: the version when every
    element and value is exactly that version's, else the text of the failure."""
    rc, out, err = run([HELPER, "check", "--big-mib", str(big_mib), *dirs],
                       env={"DT_CPU_DEVICES": "3"}, timeout=120)
    got = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) == 3 and f[0] == "result" and f[2].startswith("version="):
            got[f[1]] = int(f[2].split("=")[1])
        elif f[:1] == ["result"]:
            got[f[1]] = " ".join(f[2:]) + "\n" + out + err
    return got


def index_step(d):
    """The "step" value of the checkpoint readers resolve at d (d, else d.dtensor-old), read
    from the index JSON alone; None when neither holds an index."""
    for cand in (d, d + ".dtensor-old"):
        try:
            with open(os.path.join(cand, "dtensor-index.json")) as f:
                ix = json.load(f)
        except FileNotFoundError:
            continue
        return next(v["value"] for v in ix["values"] if v["name"] == "step")
    return None


def children(pid):
    """Every descendant of pid (from /proc), deepest last."""
    kids = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(p))
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Crash(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.work = os.path.join(self.tmp.name, "work")
        os.mkdir(self.work)
        self.dir = os.path.join(self.work, "ckpt")

    def tearDown(self):
        self.tmp.cleanup()

    def snapshot(self, k):
        """Copies what readers may look at (the checkpoint and its .dtensor-old) as it is now,
        so that all restores can run in one process at the end."""
        dst = os.path.join(self.tmp.name, f"snap{k:03d}")
        os.mkdir(dst)
        for name in os.listdir(self.work):
            if not name.endswith(".dtensor-tmp"):
                shutil.copytree(os.path.join(self.work, name), os.path.join(dst, name))
        return os.path.join(dst, "ckpt")

    def kill_during_save(self, rng, new, mode, delay, asynchronous):
        """Starts a save of version `new` (dt_save, or dt_save_async and dt_save_wait),
        SIGKILLs it `delay` s after it began; returns how long the save took if it had
        returned (printed "saved") before the kill, else None."""
        p = subprocess.Popen(save_cmd(self.dir, new, BIG_MIB, announce=True,
                                      asynchronous=asynchronous),
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             env=dict(os.environ, DT_CPU_DEVICES="2"), start_new_session=True)
        buf, deadline = b"", time.time() + 30
        while b"saving\n" not in buf and time.time() < deadline and p.poll() is None:
            r, _, _ = select.select([p.stdout], [], [], 0.5)
            if r:
                buf += os.read(p.stdout.fileno(), 4096)
        self.assertIn(b"saving\n", buf, f"version {new}: the save did not start")
        time.sleep(delay)
        tree = children(p.pid)
        ranks = [c for c in tree if "make_ckpt" in cmdline(c)]
        rng.shuffle(ranks)
        if mode == "all":  # every process at once
            for c in ranks + [p.pid] + tree:
                kill(c)
        elif mode == "ranks_in_turn":  # the ranks a few ms apart, then mpiexec cleans up
            for c in ranks:
                kill(c)
                time.sleep(rng.uniform(0, 0.005))
        elif ranks:  # one rank; mpiexec then aborts the other wherever it is
            kill(ranks[0])
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        for c in [p.pid] + children(p.pid):  # whatever is left
            kill(c)
        p.wait()
        buf += p.stdout.read()
        p.stdout.close()
        if b"saved secs=" not in buf:
            return None
        return float(buf.split(b"saved secs=")[1].split()[0])

    def test_kill_at_random_points_leaves_previous_or_new_checkpoint(self):
        durations = []
        for version in (1, 2):  # the second save replaces the first, as the trials do
            rc, out, err = save(self.dir, version, BIG_MIB)
            self.assertEqual(rc, 0, out + err)
            durations.append(float(out.split("saved secs=")[1].split()[0]))
        seed = int(os.environ.get("DT_CRASH_SEED", time.time_ns() % 100000))
        rng = random.Random(seed)
        print(f"\nseed {seed} (DT_CRASH_SEED); uninterrupted saves took "
              f"{[round(d * 1e3, 1) for d in durations]} ms", file=sys.stderr)
        current, trials, finished_count, t = 2, [], 0, 0
        # Until TRIALS kills have landed inside a save (a save that returned before its kill
        # does not count), at most 2 * TRIALS attempts. Delays are uniform over the usual
        # length of a save, re-estimated from the saves that finished.
        while len(trials) - finished_count < TRIALS and len(trials) < 2 * TRIALS:
            new = current + 1
            mode = ("all", "ranks_in_turn", "one_rank")[t % 3]
            asynchronous = t % 2 == 1  # every mode with both kinds of save
            t += 1
            delay = rng.uniform(0, 1.1 * sorted(durations)[len(durations) // 2])
            took = self.kill_during_save(rng, new, mode, delay, asynchronous)
            if took is not None:
                finished_count += 1
                durations.append(took)
            what = (f"trial {t} ({'async ' if asynchronous else ''}version {new} over "
                    f"{current}, kill {mode} at {delay * 1e3:.1f} ms)")
            rc, out, err = run([TOOL, "ckpt", "verify", self.dir])
            self.assertEqual(rc, 0, f"{what}: dtensor ckpt verify failed:\n{out}{err}")
            got = index_step(self.dir)
            allowed = [new] if took is not None else [current, new]
            self.assertIn(got, allowed, what)
            trials.append((what, self.snapshot(t), got))
            current = got
        # Every snapshot restored (one process, 3 devices, other layouts): exactly its version.
        restored = check([snap for _, snap, _ in trials], BIG_MIB)
        for what, snap, want in trials:
            self.assertEqual(restored.get(snap), want, f"{what}: restore of the state left")
        prev = [2] + [v for _, _, v in trials[:-1]]
        kept = sum(1 for (_, _, v), p in zip(trials, prev) if v == p)
        print(f"{len(trials)} kills: previous checkpoint kept {kept}, new one "
              f"{len(trials) - kept} (of which the save had returned {finished_count})",
              file=sys.stderr)
        self.assertGreaterEqual(len(trials) - finished_count, TRIALS,
                                "too few kills landed inside a save")
        self.assertGreater(kept, 0)
        # A save after all of this still works and leaves no leftovers.
        rc, out, err = save(self.dir, current + 1, BIG_MIB)
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(index_step(self.dir), current + 1)
        self.assertEqual(os.listdir(self.work), ["ckpt"])


class FullDisk(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.pending = []  # (what, snapshot, version): restored together at the end

    def tearDown(self):
        self.tmp.cleanup()

    def assert_failed_with_enospc(self, rc, out, err, what):
        self.assertNotEqual(rc, 0, f"{what}: the save succeeded:\n{out}{err}")
        self.assertIn("status=DT_ERR_IO", out, f"{what}:\n{out}{err}")
        self.assertTrue("No space left" in err or "ENOSPC" in err, f"{what}:\n{err}")

    def assert_kept(self, d, version, what):
        """d verifies, holds `version` by its index, and nothing is left beside it; a copy is
        restored later by restore_all."""
        rc, out, err = run([TOOL, "ckpt", "verify", d])
        self.assertEqual(rc, 0, f"{what}: {out}{err}")
        self.assertEqual(index_step(d), version, what)
        self.assertEqual(os.listdir(os.path.dirname(d)), [os.path.basename(d)],
                         f"{what}: leftovers beside the checkpoint")
        snap = os.path.join(self.tmp.name, f"snap{len(self.pending):02d}", "ckpt")
        shutil.copytree(d, snap)
        self.pending.append((what, snap, version))

    def restore_all(self, big_mib):
        got = check([snap for _, snap, _ in self.pending], big_mib)
        for what, snap, version in self.pending:
            self.assertEqual(got.get(snap), version, f"{what}: restore")

    def test_full_tmpfs_fails_with_io_status_and_keeps_previous(self):
        mnt = os.path.join(self.tmp.name, "mnt")
        os.mkdir(mnt)
        rc, _, err = run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", mnt])
        if rc != 0:
            self.skipTest(f"cannot mount a tmpfs here ({err.strip()}); the ENOSPC shim "
                          "test covers a full disk")
        try:
            d = os.path.join(mnt, "ckpt")
            rc, out, err = save(d, 1, 1)
            self.assertEqual(rc, 0, out + err)
            rc, out, err = save(d, 2, 4)  # 4 MiB cannot fit beside the 1 MiB checkpoint
            self.assert_failed_with_enospc(rc, out, err, "4 MiB save on a 3 MiB tmpfs")
            self.assert_kept(d, 1, "after the failed save")
            rc, out, err = save(d, 3, 1)  # the space was given back: a save that fits works
            self.assertEqual(rc, 0, out + err)
            self.assert_kept(d, 3, "after a save that fits")
        finally:
            run(["umount", mnt])
        self.restore_all(1)

    def test_injected_enospc_at_every_stage_keeps_previous(self):
        if not SHIM or not os.path.exists(SHIM):
            self.skipTest("no ENOSPC shim built")
        d = os.path.join(self.tmp.name, "work", "ckpt")
        os.mkdir(os.path.dirname(d))
        rc, out, err = save(d, 1, 1)
        self.assertEqual(rc, 0, out + err)
        with open(os.path.join(d, "dtensor-index.json")) as f:
            files = json.load(f)["files"]
        # Client 0 writes the files of its devices 0 and 1, then the index.
        rank0 = sum(f["bytes"] for f in files if f["device_id"] in (0, 1))
        env = {"LD_PRELOAD": SHIM, "DT_ENOSPC_DIR": os.path.dirname(d),
               "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0"}
        budgets = [("the first write", 0), ("a slice", files[0]["bytes"] // 2),
                   ("the last slice", rank0 - 10), ("the index", rank0 + 10)]
        for what, n in budgets:
            rc, out, err = save(d, 2, 1, env=dict(env, DT_ENOSPC_AFTER=str(n)))
            self.assert_failed_with_enospc(rc, out, err, f"ENOSPC at {what} ({n} bytes)")
            self.assert_kept(d, 1, f"after ENOSPC at {what}")
        # Only the last client's disk fills (its first slice): the other one's part succeeds,
        # yet every client returns DT_ERR_IO with the failing client's message.
        rc, out, err = save(d, 2, 1, env=dict(env, DT_ENOSPC_AFTER="40", DT_ENOSPC_RANK="1"))
        self.assert_failed_with_enospc(rc, out, err, "ENOSPC on the last client only")
        self.assertEqual(out.count("status=DT_ERR_IO"), 2, f"both clients fail alike:\n{out}")
        self.assertEqual(err.count("No space left"), 2, f"both name the cause:\n{err}")
        self.assert_kept(d, 1, "after ENOSPC on the last client")
        # An asynchronous save: the call returns, the failure comes from dt_save_wait.
        rc, out, err = save(d, 2, 1, env=dict(env, DT_ENOSPC_AFTER="40", DT_ENOSPC_RANK="1"),
                            asynchronous=True)
        self.assert_failed_with_enospc(rc, out, err, "ENOSPC in an asynchronous save")
        self.assertIn("staged secs=", out)
        self.assertEqual(out.count("status=DT_ERR_IO"), 2, f"both clients fail alike:\n{out}")
        self.assert_kept(d, 1, "after ENOSPC in an asynchronous save")
        rc, out, err = save(d, 3, 1, env=dict(env, DT_ENOSPC_AFTER=str(1 << 40)))
        self.assertEqual(rc, 0, out + err)
        self.assert_kept(d, 3, "after a save with room")
        self.restore_all(1)


class LostClient(unittest.TestCase):
    """One of 2 processes killed mid-save (sync, and in an asynchronous save's background
    commit) or mid-restore, the job kept running (Open MPI's --enable-recovery, so the
    launcher does not end the survivor for us): the survivor's call returns DT_ERR_TIMEOUT
    naming the lost client within DT_COMM_TIMEOUT (2 s here) plus the ping's half, where a
    plain MPI collective would wait forever; the previous checkpoint is untouched."""
    TIMEOUT = 2

    def setUp(self):
        if not SHIM or not os.path.exists(SHIM):
            self.skipTest("no shim built")
        rc, out, err = run([MPIEXEC, "--version"])
        if "Open MPI" not in out + err and "OpenRTE" not in out + err:
            self.skipTest("needs Open MPI's mpiexec --enable-recovery")
        self.tmp = tempfile.TemporaryDirectory()
        self.d = os.path.join(self.tmp.name, "work", "ckpt")
        os.mkdir(os.path.dirname(self.d))
        rc, out, err = save(self.d, 1, 4)
        self.assertEqual(rc, 0, out + err)

    def tearDown(self):
        self.tmp.cleanup()

    def lost_run(self, args, kill_on, after):
        """args under mpiexec -n 2 with client 1 killed once it has written (or read) `after`
        bytes under the checkpoint's parent; returns the output and the seconds it took."""
        env = {"DT_CPU_DEVICES": "2", "DT_COMM_TIMEOUT": str(self.TIMEOUT), "LD_PRELOAD": SHIM,
               "DT_ENOSPC_DIR": os.path.dirname(self.d), "DT_ENOSPC_AFTER": str(after),
               "DT_ENOSPC_RANK": "1", "DT_ENOSPC_KILL": kill_on,
               "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0"}
        t0 = time.monotonic()
        rc, out, err = run([MPIEXEC, "--enable-recovery", "-n", "2", HELPER] + args, env=env,
                           timeout=120)
        return out + err, time.monotonic() - t0

    def assert_lost_named(self, out, secs, what):
        self.assertIn("DT_ERR_TIMEOUT", out, f"{what}:\n{out}")
        self.assertRegex(out, r"make_ckpt\[0\]: .*lost client\(s\) 1 \(host ", what)
        self.assertNotIn("make_ckpt[1]", out, what)  # client 1 died without a word
        # Two watched waits at most (the failing step and the agreement after it), each
        # DT_COMM_TIMEOUT plus half of it for the ping, and the launch: well under 30 s.
        self.assertLess(secs, 30, what)

    def assert_previous_kept(self, what):
        rc, out, err = run([TOOL, "ckpt", "verify", self.d])
        self.assertEqual(rc, 0, f"{what}: {out}{err}")
        self.assertEqual(check([self.d], 4).get(self.d), 1, what)

    def test_a_client_killed_mid_save_gives_a_timeout_naming_it(self):
        # 1 MB into its ~8 MiB share of the data files: client 0 writes on, then waits.
        for asynchronous in (False, True):
            what = "asynchronous save" if asynchronous else "save"
            args = ["save", self.d, "2", "--big-mib", "4"] + (["--async"] if asynchronous else [])
            out, secs = self.lost_run(args, "write", 1 << 20)
            self.assert_lost_named(out, secs, what)
            if asynchronous:
                self.assertIn("staged secs=", out)  # the call returned; the commit failed
            self.assert_previous_kept(what)

    def test_a_client_lost_before_the_group_is_made_gives_a_timeout_naming_it(self):
        # Client 1 dies before the save's first collective, the creation of the mesh's
        # communicator (MPI_Comm_create_group, blocking): its members meet under the watchdog
        # first, so client 0 names it rather than waiting in the creation for ever.
        out, secs = self.lost_run(["save", self.d, "2", "--big-mib", "4", "--lose-first"],
                                  "none", 1 << 40)
        self.assert_lost_named(out, secs, "group creation")
        self.assertIn("creating the mesh's client group", out)
        self.assert_previous_kept("after the lost group creation")

    def test_a_client_killed_mid_restore_gives_a_timeout_naming_it(self):
        out, secs = self.lost_run(["check", "--big-mib", "4", self.d], "read", 1 << 20)
        self.assertIn(f"result {self.d} error=DT_ERR_TIMEOUT", out)
        self.assert_lost_named(out, secs, "restore")
        self.assert_previous_kept("after the restore")


if __name__ == "__main__":
    TOOL, HELPER, MPIEXEC, SHIM = sys.argv[1:5]
    del sys.argv[1:5]
    unittest.main(verbosity=2)
