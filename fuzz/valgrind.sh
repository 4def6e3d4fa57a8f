#!/usr/bin/env bash
# Runs every Rust test binary of the loaderx engine crate (unit tests, the
# store integration tests, the fuzz corpus replay) under valgrind memcheck.
# Any invalid read/write, use of uninitialised memory, or definite/possible
# leak not covered by fuzz/valgrind.supp fails the run.
#
# Usage: bash fuzz/valgrind.sh [extra test-binary args]   (takes a few minutes)
set -euo pipefail
cd "$(dirname "$0")/.."

bins=$(cargo test -p loaderx --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["profile"]["test"]:
        print(msg["executable"])
')
status=0
for bin in $bins; do
    echo "== valgrind $bin"
    if ! valgrind --error-exitcode=1 --leak-check=full \
        --show-leak-kinds=definite,possible --errors-for-leak-kinds=definite,possible \
        --suppressions=fuzz/valgrind.supp --num-callers=40 \
        "$bin" --test-threads=2 "$@"; then
        status=1
    fi
done
exit $status
