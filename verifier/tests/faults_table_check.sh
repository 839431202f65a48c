#!/usr/bin/env bash
# verifier/tests/faults_table_check.sh CKVERIFY OUT.txt FAULTS.json: the console table and the JSON of a
# `ckverify faults` run show every fault `ckverify list` names as killed (or NOT RUN where it cannot be
# observed here, as cpu-rng-only without CUDA), and no survivor.
set -u
ck="$1"; out="$2"; json="$3"; rc=0
for f in $("$ck" list | sed -n 's/^  \([a-z0-9-]*\)  \[fault.*/\1/p'); do
  grep -q "^$f  *NOT RUN .*only shows" "$out" && { echo "not observable here: $f"; continue; }
  grep -q "^$f .* [0-9][0-9]* \+[0-9.]\+  layers=" "$out" || { echo "fault $f not shown as killed"; rc=1; }
done
grep -q "^cpu-rng-only .*NOT RUN" "$out" || nvidia-smi >/dev/null 2>&1 || { echo "cpu-rng-only should be NOT RUN without CUDA"; rc=1; }
grep -q '"survivors": 0' "$json" || { echo "faults report has survivors"; rc=1; }
exit $rc
