#!/usr/bin/env bash
# examples/quickstart (the README's first program) as a user runs it: one process of 4 CPU
# devices and 2 processes of 2 each print "0 wrong" on every client and exit 0; one process of
# 1 device (too few for its 2x2 mesh) exits 1 with the library's message, not a crash; 2
# processes of 4 devices each (the mesh on client 0 alone) exit 1 on both clients with the same
# message, neither printing success (issue 45); and the README quotes the program as it is. Usage: test_quickstart.sh QUICKSTART MPIEXEC README SOURCE
set -uo pipefail
exe=${1:?usage: test_quickstart.sh QUICKSTART MPIEXEC README SOURCE} mpiexec=${2:?}
readme=${3:?} source=${4:?}
fail() { echo "test_quickstart: $*" >&2; exit 1; }

# The README's first C block (after "## A first program") is the file, byte for byte.
quoted=$(awk '/^## A first program/ { s = 1 } s && /^```c$/ { q = 1; next } q && /^```$/ { exit }
              q { print }' "$readme")
[ "$quoted" = "$(cat "$source")" ] || fail "README.md does not quote $source as it is"

out=$(DT_CPU_DEVICES=4 "$exe" 2>&1) || fail "1 process x 4 devices: exit $?: $out"
echo "$out"
[ "$out" = "quickstart: client 0 of 1: rows gathered from 2 shards, 0 wrong" ] ||
  fail "1 process x 4 devices printed: $out"

out=$(DT_CPU_DEVICES=2 "$mpiexec" -n 2 "$exe" 2>&1) || fail "2 processes x 2 devices: exit $?: $out"
echo "$out"
for c in 0 1; do
  grep -qx "quickstart: client $c of 2: rows gathered from 2 shards, 0 wrong" <<<"$out" ||
    fail "2 processes x 2 devices: client $c did not report 0 wrong: $out"
done

DT_CPU_DEVICES=1 "$exe" >/dev/null 2>"${TMPDIR:-/tmp}/quickstart.$$.err"
rc=$?
err=$(cat "${TMPDIR:-/tmp}/quickstart.$$.err"); rm -f "${TMPDIR:-/tmp}/quickstart.$$.err"
echo "$err"
[ "$rc" -eq 1 ] || fail "1 process x 1 device: exit $rc (wanted 1): $err"
grep -q "quickstart: dt_mesh_check_clients: DT_ERR_DEVICE_MISMATCH: mesh 'train' has 4 CPU devices" \
  <<<"$err" || fail "1 process x 1 device: no clear message: $err"

# 8 devices for the 4-device mesh: every client refuses alike, none goes on alone.
out=$(DT_CPU_DEVICES=4 "$mpiexec" -n 2 "$exe" 2>&1) && fail "2 processes x 4 devices: exit 0: $out"
echo "$out"
grep -q "rows gathered" <<<"$out" && fail "2 processes x 4 devices: a client went on alone: $out"
want="quickstart: dt_mesh_check_clients: DT_ERR_DEVICE_MISMATCH: mesh 'train' has 4 CPU devices, held by 1 of the 2 clients: client 1 holds none of them (the clients hold 8 CPU devices in all; e.g. DT_CPU_DEVICES=2 with 2 processes)"
[ "$(grep -cxF "$want" <<<"$out")" -eq 2 ] ||
  fail "2 processes x 4 devices: not the same message on both clients: $out"
echo "test_quickstart: ok"
