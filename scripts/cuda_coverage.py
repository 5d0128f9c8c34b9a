#!/usr/bin/env python3
"""Per-file line coverage of the CUDA code from a -Dcuda=host -Db_coverage=true build's .gcda
files (gcov --json-format): ops/cuda/*, runtime/cuda/*, runtime/device_cuda.c, runtime/cuda.c,
runtime/transport_nccl.c, runtime/transport_staged.c; and the __global__ kernels never run.
Usage: cuda_coverage.py BUILD_DIR (scripts/cuda_coverage.sh runs the suite first)."""
import glob
import json
import os
import re
import subprocess
import sys

TARGET = 0.90


def main():
    build = os.path.abspath(sys.argv[1])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    wanted = sorted(glob.glob(os.path.join(root, "ops/cuda/*.c")) +
                    glob.glob(os.path.join(root, "ops/cuda/*.cu")) +
                    glob.glob(os.path.join(root, "runtime/cuda/*.cu")) +
                    [os.path.join(root, "runtime", f) for f in
                     ("device_cuda.c", "cuda.c", "transport_nccl.c", "transport_staged.c")])
    gcdas = glob.glob(os.path.join(build, "**", "*.gcda"), recursive=True)
    lines = {}   # file -> {line: count}
    funcs = {}   # file -> {name: (line, count)}
    for gcda in gcdas:
        out = subprocess.run(["gcov", "--json-format", "--stdout", "-m", gcda],
                             cwd=build, capture_output=True, text=True)
        for doc in out.stdout.splitlines():
            doc = doc.strip()
            if not doc.startswith("{"):
                continue
            for f in json.loads(doc).get("files", []):
                path = os.path.normpath(os.path.join(build, f["file"]))
                fl = lines.setdefault(path, {})
                for ln in f["lines"]:
                    fl[ln["line_number"]] = max(fl.get(ln["line_number"], 0), ln["count"])
                ff = funcs.setdefault(path, {})
                for fn in f.get("functions", []):
                    name = fn.get("demangled_name", fn["name"])
                    old = ff.get(name, (fn["start_line"], 0))
                    ff[name] = (fn["start_line"], max(old[1], fn["execution_count"]))
    below, unlaunched = [], []
    print(f"{'file':40s} {'lines':>7s} {'run':>7s} {'cover':>7s}")
    for path in wanted:
        rel = os.path.relpath(path, root)
        fl = lines.get(path)
        if not fl:
            print(f"{rel:40s} {'-':>7s} {'-':>7s}   (not compiled or never run)")
            below.append(rel)
            continue
        n, hit = len(fl), sum(1 for c in fl.values() if c > 0)
        pct = hit / n if n else 1.0
        print(f"{rel:40s} {n:7d} {hit:7d} {100 * pct:6.1f}%{'' if pct >= TARGET else '  < 90%'}")
        if pct < TARGET:
            below.append(rel)
        if path.endswith(".cu"):
            src = open(path).read().splitlines()
            for name, (line, count) in sorted(funcs.get(path, {}).items()):
                head = " ".join(src[max(0, line - 3):line])
                if "__global__" in head and count == 0:
                    unlaunched.append(f"{rel}:{line}: {name}")
    print(f"\nfiles below {int(TARGET * 100)}%: {len(below)}" + (": " + ", ".join(below) if below else ""))
    # a kernel template's instantiations each count; one launched instance is enough
    launched_any = {}
    for path in wanted:
        for name, (line, count) in funcs.get(path, {}).items():
            launched_any[(path, line)] = launched_any.get((path, line), 0) + count
    never = [u for u in unlaunched
             if launched_any.get((os.path.join(root, u.split(":")[0]), int(u.split(":")[1])), 0) == 0]
    print(f"kernels never launched: {len(never)}")
    for u in never:
        print("  " + u)
    return 1 if never else 0


if __name__ == "__main__":
    sys.exit(main())
