#!/usr/bin/env bash
# verifier/tests/tp_collectives_test.sh TP_COLLECTIVES: the benchmark (verifier/bench/tp_collectives.cpp)
# runs on two ranks, one small step per plan, and its ledger columns say what each plan does: no
# checkpoint and the kept plan issue forward and backward all-reduces only, the full recompute repeats
# the forward ones (a third column with a count); a bad option is one line on stderr, exit 2.
set -euo pipefail
exe="$1"
out="$("$exe" --steps 1 --layers 1 --d 8 --heads 2 --seq 4 --batch 1)"
echo "$out"
columns() { grep -E "^$1 " <<<"$out" | grep -o ' x ' | wc -l; }
for want in "none 2" "full 3" "kept 2"; do
  set -- $want
  got="$(columns "$1")"
  [ "$got" = "$2" ] || { echo "FAIL: plan $1 has $got collective columns with a count, want $2"; exit 1; }
done
set +e
err="$("$exe" --tp 1 2>&1 >/dev/null)"
rc=$?
set -e
[ "$rc" = 2 ] || { echo "FAIL: --tp 1 exited $rc, want 2"; exit 1; }
[ "$(wc -l <<<"$err")" = 1 ] && grep -q -- "--tp must be 2..8" <<<"$err" || { echo "FAIL: --tp 1 said: $err"; exit 1; }
echo "tp_collectives_test: ok"
