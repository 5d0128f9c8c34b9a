#!/usr/bin/env python3
"""`dtensor launch --hang-timeout 3 --max-restarts 1` (docs/recovery.md): train_gpt on 4
processes of this host with in-memory checkpoints every 5 steps; client 1 stops making progress
inside step 12 (DT_TEST_HANG=1:12, a sleep without end, first launch only) while
DT_COMM_TIMEOUT is 120 s. The launcher names client 1 from its peers' flight records (they
wait inside a collective it never entered) within seconds, stops the job and restarts it,
which resumes from the newest in-memory step (10) and completes.
Usage: test_hang.py DTENSOR TRAIN_GPT"""
import os
import re
import subprocess
import sys
import tempfile
import time


def main():
    dtensor, train = sys.argv[1:3]
    with tempfile.TemporaryDirectory(prefix="launch_hang_") as tmp:
        env = {k: v for k, v in os.environ.items() if k not in ("DT_CPU_DEVICES", "DT_JOB_ID")}
        env.update(DT_TEST_HANG="1:12", DT_COMM_TIMEOUT="120",
                   DT_MEMCKPT_DIR=os.path.join(tmp, "mem"))
        cmd = [dtensor, "launch", "--nproc-per-node", "4", "--max-restarts", "1",
               "--hang-timeout", "3", "--", train, "--steps", "16", "--eval-every", "4",
               "--ckpt-root", os.path.join(tmp, "root"), "--ckpt-every", "100",
               "--mem-ckpt-every", "5", "--out", os.path.join(tmp, "out")]
        t0 = time.monotonic()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        took = time.monotonic() - t0
        out = p.stdout + p.stderr
        ok = True

        def check(cond, what):
            nonlocal ok
            if not cond:
                print(f"FAIL: {what}", file=sys.stderr)
                ok = False

        check(p.returncode == 0, f"exit status {p.returncode}")
        m = re.search(r"dtensor launch: hung client\(s\) 1 \(host [^)]*\): no collective of "
                      r"group \S+ since seq \d+ for ([\d.]+) s while client\(s\) ([\d,]+) wait",
                      out)
        check(m is not None, "client 1 named hung")
        if m:
            check(float(m.group(1)) < 30, f"named after {m.group(1)} s (DT_COMM_TIMEOUT 120)")
            print(f"hung client named after {m.group(1)} s of no progress", file=sys.stderr)
        check("resumed from memory at step 10" in out, "resumed from memory at step 10")
        check("Forwarding signal" not in out, "mpirun's probe messages filtered")
        check(re.search(r"^done: step 16 ", out, re.M) is not None, "the job completed")
        print(f"test_hang: {took:.1f} s", file=sys.stderr)
        if not ok:
            print(out, file=sys.stderr)
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
