#!/usr/bin/env python3
"""docs/*.md code blocks that say where they come from stay equal to that code (argv: the
source root, then the docs to check). A block preceded by the line
    <!-- snippet: tests/autograd/test_autograd_loop.c plain -->
must hold exactly the lines between `/* snippet plain */` and `/* end snippet */` of that
file, dedented. Python standard library only."""
import os
import re
import sys
import textwrap

MARK = re.compile(r"<!-- snippet: (\S+) (\S+) -->")


def source_snippet(root, path, name):
    lines = open(os.path.join(root, path)).read().splitlines()
    try:
        start = lines.index(f"/* snippet {name} */")
    except ValueError:
        return None
    end = lines.index("/* end snippet */", start)
    return textwrap.dedent("\n".join(lines[start + 1:end])).strip("\n")


def main():
    root, docs = sys.argv[1], sys.argv[2:]
    bad, seen = [], 0
    for doc in docs:
        lines = open(os.path.join(root, doc)).read().splitlines()
        for i, line in enumerate(lines):
            m = MARK.search(line)
            if not m:
                continue
            seen += 1
            if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
                bad.append(f"{doc}:{i + 1}: a snippet mark not followed by a code block")
                continue
            j = i + 2
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            block = "\n".join(lines[i + 2:j]).strip("\n")
            want = source_snippet(root, m.group(1), m.group(2))
            if want is None:
                bad.append(f"{doc}:{i + 1}: no snippet '{m.group(2)}' in {m.group(1)}")
            elif block != want:
                bad.append(f"{doc}:{i + 1}: the block differs from {m.group(1)} "
                           f"'{m.group(2)}'; it should read:\n{want}")
    if seen == 0:
        bad.append("no snippet marks found")
    for b in bad:
        print(b)
    print(f"{seen} snippets, {len(bad)} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
