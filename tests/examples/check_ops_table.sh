#!/bin/sh
# docs/ops.md's table of every op is what `dtensor ops --markdown` prints now.
# usage: check_ops_table.sh DTENSOR_TOOL DOCS_OPS_MD
set -eu
want=$(mktemp)
trap 'rm -f "$want"' EXIT
DT_CPU_DEVICES=1 "$1" ops --markdown > "$want"
sed -n '/<!-- ops-table begin -->/,/<!-- ops-table end -->/p' "$2" | sed '1d;$d' | diff -u "$want" - || {
    echo "docs/ops.md's op table is stale: regenerate it with dtensor ops --markdown" >&2
    exit 1
}
