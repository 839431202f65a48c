#!/usr/bin/env bash
# verifier/tests/cli_test.sh CKVERIFY TMPDIR: the gate's contract: exit codes, the repro file and the
# replay, the JSON report, and one-line errors that leave nothing half-written.
set -u
ck="$1"; tmp="$2"
rm -rf "$tmp"; mkdir -p "$tmp"; cd "$tmp"
fails=0
expect() {  # expect CODE DESCRIPTION -- command...
  local want="$1" what="$2"; shift 3
  "$@" >out.txt 2>err.txt; local got=$?
  if [ "$got" != "$want" ]; then echo "FAIL: $what: exit $got, expected $want"; cat out.txt err.txt; fails=$((fails+1)); else echo "ok: $what"; fi
}
expect 0 "builtin passes" -- "$ck" check --cases 30 --json report.json
grep -q '"cases_run": 30' report.json || { echo "FAIL: report lacks cases_run 30"; fails=$((fails+1)); }
expect 1 "fault is caught" -- "$ck" check --impl no-preserve-rng --plan block --cases 200 --repro-file shrunk.json --json fail.json
grep -q "FAILED rng-replay" out.txt || { echo "FAIL: wrong headline"; cat out.txt; fails=$((fails+1)); }
grep -q "ckverify repro shrunk.json" out.txt || { echo "FAIL: no repro line"; fails=$((fails+1)); }
grep -q '"property": "rng-replay"' fail.json || { echo "FAIL: report lacks the property"; fails=$((fails+1)); }
expect 1 "repro replays the failure" -- "$ck" repro shrunk.json
grep -q "FAILED rng-replay" out.txt || { echo "FAIL: repro diagnosis differs"; cat out.txt; fails=$((fails+1)); }
echo '{"model": {"heads": 3}}' > bad.json
expect 2 "invalid case" -- "$ck" repro bad.json
grep -q "model.heads=3 must divide model.d_model=16" err.txt || { echo "FAIL: message"; cat err.txt; fails=$((fails+1)); }
[ "$(wc -l < err.txt)" = 1 ] || { echo "FAIL: error is not one line"; fails=$((fails+1)); }
expect 2 "malformed JSON" -- bash -c "echo '{oops' > m.json && '$ck' repro m.json"
expect 2 "unknown plan" -- "$ck" check --plan bogus
expect 2 "unknown impl" -- "$ck" check --impl nope
expect 2 "missing output directory" -- "$ck" check --cases 5 --json nodir/r.json
[ ! -e nodir ] || { echo "FAIL: created output"; fails=$((fails+1)); }
ls *.tmp* >/dev/null 2>&1 && { echo "FAIL: temporary files left"; fails=$((fails+1)); }
expect 0 "every fault is killed" -- "$ck" faults --cases 300 --json faults.json
for f in no-preserve-rng no-autocast-replay leaf-input-recompute inputs-only-grad recompute-twice no-restore-on-throw; do
  grep -q "^$f .* [0-9][0-9]*  layers=" out.txt || { echo "FAIL: fault $f not shown as killed"; fails=$((fails+1)); }
done
grep -q '"survivors": 0' faults.json || { echo "FAIL: faults report"; fails=$((fails+1)); }
echo "cli_test: $fails failure(s)"
exit $((fails > 0))
