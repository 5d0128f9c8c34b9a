"""trace_tool: `dtensor trace DIR` on hand-made records (the format runtime/trace.c writes,
docs/trace.md): a client that never entered an operation, two different calls at one
sequence number, a client without a record, records that agree, and bad input.
Usage: test_trace_tool.py DTENSOR"""
import json
import os
import subprocess
import sys
import tempfile

TOOL = sys.argv[1]
failures = []


def op(seq, call, detail, group="0-1", leave=True, status="DT_OK", error="", enter=None):
    t = 1000.0 + seq if enter is None else enter
    return {"seq": seq, "group": group, "call": call, "path": "mpi", "detail": detail,
            "enter": t, "leave": t + 0.5 if leave else None,
            "status": status if leave else None, "error": error}


def write(d, rank, ops, clients=2, reason="on request"):
    nexts = {}
    for o in ops:
        nexts[o["group"]] = max(nexts.get(o["group"], 0), o["seq"])
    rec = {"format": "dtensor-trace 1", "rank": rank, "clients": clients, "pid": 1,
           "host": "h", "time": 2000.0, "reason": reason, "ops_total": len(ops),
           "ops_kept": len(ops), "groups": [{"group": g, "next_seq": n} for g, n in nexts.items()],
           "ops": ops}
    with open(os.path.join(d, "rank-%d.json" % rank), "w") as f:
        json.dump(rec, f)


def trace(d):
    p = subprocess.run([TOOL, "trace", d], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def check(name, cond, text):
    if not cond:
        failures.append("%s: %s" % (name, text))


R1 = "f32[8] sharding_specs:x -> sharding_specs:unsharded"
R2 = "f32[8] sharding_specs:x -> sharding_specs:x"

with tempfile.TemporaryDirectory() as d:
    # Client 1 stopped after seq 1; client 0 waits in seq 2.
    write(d, 0, [op(1, "relayout", R1), op(2, "barrier", "'b' on mesh 'm' (2 devices)",
                                           leave=False)])
    write(d, 1, [op(1, "relayout", R1)])
    rc, out, err = trace(d)
    first = out.splitlines()[0] if out else ""
    check("never entered", rc == 0 and first == "group 0-1 seq 2: rank(s) 1 never entered it "
          "(rank(s) 0 entered barrier 'b' on mesh 'm' (2 devices))", first + err)
    check("side by side", "rank 0" in out and "rank 1" in out and "[inside] barrier" in out,
          out)

with tempfile.TemporaryDirectory() as d:
    # Different layouts at seq 2 on one group, client 1 entering first; another group fine.
    write(d, 0, [op(1, "relayout", R1), op(2, "relayout", R1, enter=1005.0),
                 op(1, "ckpt save", "3 tensors", group="0")])
    write(d, 1, [op(1, "relayout", R1), op(2, "relayout", R2, enter=1004.0)])
    rc, out, err = trace(d)
    first = out.splitlines()[0] if out else ""
    check("different calls", first == "group 0-1 seq 2: two different calls: rank 0 relayout "
          + R1 + "; rank 1 relayout " + R2, first + err)

with tempfile.TemporaryDirectory() as d:
    # Three clients, client 2 left no record; the others agree and failed.
    bad = "barrier 'b' on mesh 'm': lost client(s) 2 (host h)"
    for r in (0, 1):
        write(d, r, [op(1, "barrier", "'b'", group="0-2", status="DT_ERR_TIMEOUT", error=bad)],
              clients=3)
    rc, out, err = trace(d)
    first = out.splitlines()[0] if out else ""
    check("no record", first.startswith("rank 2 left no record") and
          "rank 0 at group 0-2 seq 1 barrier 'b': DT_ERR_TIMEOUT: " + bad in first, first + err)

with tempfile.TemporaryDirectory() as d:
    for r in (0, 1):
        write(d, r, [op(1, "relayout", R1), op(2, "barrier", "'e'")])
    rc, out, err = trace(d)
    check("agree", rc == 0 and out.startswith("no mismatch: the 2 record(s) agree"), out + err)

with tempfile.TemporaryDirectory() as d:
    rc, out, err = trace(d)
    check("empty dir", rc == 1 and "no rank-R.json record" in err, err)
    with open(os.path.join(d, "rank-0.json"), "w") as f:
        f.write("{not json")
    rc, out, err = trace(d)
    check("bad json", rc == 1 and "rank-0.json:1:" in err, err)

rc, out, err = trace("/nonexistent/trace/dir")
check("missing dir", rc == 1 and "cannot open directory" in err, err)

for f in failures:
    print("FAIL", f)
print("%d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
