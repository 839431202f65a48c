#!/usr/bin/env bash
# verifier/tests/cli_test.sh CKVERIFY TMPDIR: the gate's contract: exit codes, the repro file and its
# replay, the reports, one-line errors that leave nothing half-written, outputs that are only ever
# regular files, the time budget, and `faults` killing every fault.
set -u
ck="$1"; tmp="$2"
rm -rf "$tmp"; mkdir -p "$tmp"; cd "$tmp"
fails=0
bad() { echo "FAIL: $*"; fails=$((fails+1)); }
expect() {  # expect CODE DESCRIPTION -- command...
  local want="$1" what="$2"; shift 3
  "$@" >out.txt 2>err.txt; local got=$?
  if [ "$got" != "$want" ]; then bad "$what: exit $got, expected $want"; cat out.txt err.txt; else echo "ok: $what"; fi
}
one_line_error() { [ "$(wc -l < err.txt)" = 1 ] || { bad "$1: error is not one line"; cat err.txt; }; }

expect 0 "builtin passes" -- "$ck" check --cases 30 --json report.json --junit report.xml --markdown report.md
grep -q '"cases_run": 30' report.json || bad "report lacks cases_run 30"
grep -q '<testsuite name="ckverify check impl=builtin"' report.xml || bad "junit report"
grep -q "| grad-baseline | held |" report.md || bad "markdown report"
for p in rng-replay autocast-replay recompute-count completes refuses-inplace exception-safe grad-baseline grad-reference; do
  grep -q "$p" out.txt || bad "console report lacks $p"
done

expect 1 "a fault is caught" -- "$ck" check --impl no-preserve-rng --plan block --cases 200 --repro-file shrunk.json --json fail.json
grep -q "^FAILED rng-replay" out.txt || { bad "wrong headline"; cat out.txt; }
grep -q "ckverify repro shrunk.json" out.txt || bad "no repro line"
grep -q '"property": "rng-replay"' fail.json || bad "report lacks the property"
expect 1 "repro replays the failure" -- "$ck" repro shrunk.json
grep -q "^FAILED rng-replay" out.txt || { bad "repro diagnosis differs"; cat out.txt; }

echo '{"heads": 3}' > bad.json
expect 2 "invalid case" -- "$ck" repro bad.json
grep -q "heads=3 must divide d=16" err.txt || { bad "message"; cat err.txt; }
one_line_error "invalid case"
printf '{oops' > m.json
expect 2 "malformed JSON" -- "$ck" repro m.json
one_line_error "malformed JSON"
python3 -c "print('['*100000 + ']'*100000)" > deep.json
expect 2 "deeply nested JSON" -- "$ck" repro deep.json
expect 2 "a directory as the case file" -- "$ck" repro .
expect 2 "a case file that does not exist" -- "$ck" repro nowhere.json
expect 2 "unknown plan" -- "$ck" check --plan bogus
expect 2 "a plan past the layer limit" -- "$ck" check --plan seg70
expect 2 "unknown impl" -- "$ck" check --impl nope
expect 2 "missing output directory" -- "$ck" check --cases 5 --json nodir/r.json
[ ! -e nodir ] || bad "created output"
mkdir -p adir
expect 2 "an output that is a directory" -- "$ck" check --cases 5 --json adir
expect 2 "an output that is a device" -- "$ck" check --cases 5 --json /dev/null
ln -sf report.json link.json
expect 2 "an output that is a symbolic link" -- "$ck" check --cases 5 --json link.json
expect 2 "the same file for two outputs" -- "$ck" check --cases 5 --json same.json --repro-file same.json
[ ! -e same.json ] || bad "wrote an output of a refused run"
ls .ckverify-* >/dev/null 2>&1 && bad "temporary files left"
if ! "$ck" list | grep -q "cpu-rng-only" || ! "$ck" list | grep -q "^  inplace=true|false"; then bad "list"; fi

# A case this machine cannot run is bad input, never the implementation's fault.
if ! nvidia-smi >/dev/null 2>&1; then
  echo '{"device": "cuda"}' > cuda.json
  expect 2 "a cuda case without a GPU" -- "$ck" repro cuda.json
  grep -q "no CUDA device" err.txt || bad "cuda message"
  expect 2 "--device cuda without a GPU" -- "$ck" check --device cuda --cases 5
fi

# The time budget bounds the whole run, however many cases are asked for.
start=$(date +%s)
expect 0 "the time budget bounds the run" -- "$ck" check --cases 20000000 --time-budget 2
[ $(( $(date +%s) - start )) -le 30 ] || bad "a 2 s budget took $(( $(date +%s) - start )) s"
grep -q "time budget of 2 s reached" out.txt || bad "budget not reported"

expect 0 "every fault is killed" -- "$ck" faults --cases 300 --json faults.json
for f in $("$ck" list | sed -n 's/^  \([a-z0-9-]*\)  \[fault.*/\1/p'); do
  grep -q "^$f  *NOT RUN .*only shows" out.txt && { echo "not observable here: $f"; continue; }
  grep -q "^$f .* [0-9][0-9]*  layers=" out.txt || bad "fault $f not shown as killed"
done
grep -q "^cpu-rng-only .*NOT RUN" out.txt || nvidia-smi >/dev/null 2>&1 || bad "cpu-rng-only should be NOT RUN without CUDA"
grep -q '"survivors": 0' faults.json || bad "faults report"
echo "cli_test: $fails failure(s)"
exit $((fails > 0))
