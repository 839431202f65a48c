#!/usr/bin/env bash
# verifier/tests/cli_test.sh CKVERIFY TMPDIR: the gate's contract: exit codes, the repro file and its
# replay, the reports, one-line errors that leave nothing half-written, outputs that are only ever
# regular files, and the time budget (`faults` killing every fault: faults_test.sh).
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ck="$1"; tmp="$2"
rm -rf "$tmp"; mkdir -p "$tmp"; cd "$tmp"
source "$here/lib.sh"

expect 0 "builtin passes" -- "$ck" check --cases 30 --json report.json --junit report.xml --markdown report.md
grep -q '"cases_run": 30' report.json || bad "report lacks cases_run 30"
grep -q '<testsuite name="ckverify check impl=builtin"' report.xml || bad "junit report"
grep -q "| grad-baseline | held |" report.md || bad "markdown report"
for p in rng-replay autocast-replay recompute-count completes refuses-inplace exception-safe side-effect-once resume memory-saved grad-baseline grad-reference; do
  grep -q "$p" out.txt || bad "console report lacks $p"
done

expect 1 "a fault is caught" -- "$ck" check --impl no-preserve-rng --plan block --cases 200 --repro-file shrunk.json --json fail.json
grep -q "^FAILED rng-replay" out.txt || { bad "wrong headline"; cat out.txt; }
grep -q "ckverify repro shrunk.json" out.txt || bad "no repro line"
grep -q '"property": "rng-replay"' fail.json || bad "report lacks the property"
expect 1 "repro replays the failure" -- "$ck" repro shrunk.json
grep -q "^FAILED rng-replay" out.txt || { bad "repro diagnosis differs"; cat out.txt; }

# --skip sets a property aside: a fault killed only by it then passes, the property reported as skipped
# (with the cases it would have failed), never held; a fault with other defects fails on the next one,
# and the printed repro command, which carries the same --skip, replays that.
expect 0 "a skipped property does not fail the run" -- "$ck" check --impl no-restore-on-throw --cases 60 \
  --skip exception-safe --reason "known bug 123" --json skip.json --junit skip.xml
grep -q "^skipped exception-safe: known bug 123 (would have failed on [1-9][0-9]* case(s))" out.txt || { bad "skip line"; cat out.txt; }
grep -q "^held  exception-safe" out.txt && bad "a skipped property counted as held"
grep -q '"skip_reason": "known bug 123"' skip.json || bad "JSON lacks the skip reason"
grep -q '<skipped message="set aside (--skip): known bug 123' skip.xml || bad "JUnit lacks the skip"
expect 1 "the next finding after a skipped one" -- "$ck" check --impl no-preserve-rng --plan block --cases 60 \
  --skip rng-replay --reason "known bug 123" --repro-file skipped.json
grep -q "^FAILED rng-replay" out.txt && bad "a skipped property was the headline"
grep -q "^  skipped: rng-replay (would have failed on [0-9]* case(s)) (set aside: known bug 123)" out.txt || { bad "skipped line of a failure"; cat out.txt; }
grep -q "^  repro:   ckverify repro skipped.json --skip rng-replay --reason 'known bug 123'" out.txt || { bad "repro line lacks the skip"; cat out.txt; }
head=$(sed -n 's/^FAILED //p' out.txt)
expect 1 "repro --skip replays the same headline" -- "$ck" repro skipped.json --skip rng-replay --reason "known bug 123"
grep -q "^FAILED $head\$" out.txt || { bad "repro --skip headline"; cat out.txt; }
grep -q "^FAILED rng-replay" out.txt && bad "repro --skip: the skipped property was the headline"
# --max-findings: a fault with several defects lists each failing property with its own shrunk Case,
# written beside --repro-file, and each replays with its property failing.
expect 1 "every finding in one run" -- "$ck" check --impl no-preserve-rng --plan block --cases 60 --max-findings 5 \
  --repro-file many.json --json many-report.json
grep -q "^FAILED rng-replay (finding 1 of [2-5])" out.txt || { bad "first of several findings"; cat out.txt; }
[ "$(grep -c '^FAILED ' out.txt)" -ge 2 ] || { bad "only one finding listed"; cat out.txt; }
cp out.txt many.txt
for f in $(sed -n 's/^FAILED \([a-z-]*\) (finding [2-5] of [2-5])$/\1/p' many.txt); do
  [ -f "many.$f.json" ] || { bad "no repro file for the $f finding"; continue; }
  # Its printed repro command (which sets the earlier findings aside) replays it as the headline.
  line=$(sed -n "/^FAILED $f (finding/,/^  repro:/p" many.txt | sed -n 's/^  repro:   ckverify //p')
  grep -q -- "--skip rng-replay" <<<"$line" || bad "the $f repro does not set the first finding aside: $line"
  eval "\"\$ck\" $line" > many-replay.txt 2>&1
  grep -q "^FAILED $f\$" many-replay.txt || { bad "the $f finding does not replay as its headline"; cat many-replay.txt; }
done
python3 -c 'import json; r=json.load(open("many-report.json")); assert r["further_failures"] and r["max_findings"] == 5' \
  || bad "JSON lacks the further findings"
expect 2 "--max-findings 0" -- "$ck" check --cases 1 --max-findings 0
expect 2 "--skip without --reason" -- "$ck" check --cases 1 --skip rng-replay
one_line_error "--skip without --reason"
expect 2 "--skip of no property" -- "$ck" check --cases 1 --skip rng --reason x
grep -q "not a property" err.txt || bad "unknown --skip property not named"
expect 2 "--reason without --skip" -- "$ck" check --cases 1 --reason x

# A run cut short by its time budget says so in its headline; --min-cases makes too few cases a failure.
expect 1 "fewer cases than --min-cases" -- "$ck" check --cases 2000 --time-budget 3 --min-cases 1500 --json few.json
grep -q "^FAIL: [0-9]* of 2000 case(s) in .* (time budget reached)" out.txt || { bad "budget headline"; cat out.txt; }
grep -q "fewer than --min-cases 1500" out.txt || { bad "--min-cases line"; cat out.txt; }
grep -q '"min_cases": 1500' few.json || bad "JSON lacks min_cases"
expect 2 "--min-cases above --cases" -- "$ck" check --cases 10 --min-cases 11
one_line_error "--min-cases above --cases"

echo '{"heads": 3}' > bad.json
expect 2 "invalid case" -- "$ck" repro bad.json
grep -q "heads=3 must divide d=16" err.txt || { bad "message"; cat err.txt; }
one_line_error "invalid case"
printf '{oops' > m.json
expect 2 "malformed JSON" -- "$ck" repro m.json
one_line_error "malformed JSON"
python3 -c "print('['*100000 + ']'*100000)" > deep.json
printf '{"layers": 2}\0{"layers": 9}' > nul.json  # the parser would stop at the NUL, the rest unread
expect 2 "a Case file with a NUL byte" -- "$ck" repro nul.json
grep -q "NUL byte at offset 13" err.txt || { bad "NUL byte: not named"; cat err.txt; }
expect 2 "deeply nested JSON" -- "$ck" repro deep.json
expect 2 "a directory as the case file" -- "$ck" repro .
expect 2 "a case file that does not exist" -- "$ck" repro nowhere.json
expect 2 "unknown plan" -- "$ck" check --plan bogus
expect 2 "a plan past the layer limit" -- "$ck" check --plan seg70
expect 2 "unknown impl" -- "$ck" check --impl nope
expect 2 "a plan whose first layer is past the limit" -- "$ck" check --plan from64
expect 2 "a device with a trailing blank" -- "$ck" check --cases 1 --device "cpu "
one_line_error "device with a blank"
expect 2 "an infinite time budget" -- "$ck" check --cases 1 --time-budget inf
expect 2 "a time budget the clock cannot hold" -- "$ck" check --cases 1 --time-budget 1e10
one_line_error "huge budget"
expect 2 "faults: a time budget the clock cannot hold" -- "$ck" faults --cases 1 --time-budget 1e10
# Counts are bounded, and refused as the command line is read: before an output is checked, an
# implementation loaded or anything sized by them.
expect 2 "audit-amp: more cases than it can hold" -- "$ck" audit-amp --cases 2000000000 --json nodir/amp.json \
  --impl py:no_such_module:f
one_line_error "audit-amp huge --cases"
grep -q -- "--cases must be in \[1, 100000\]" err.txt || { bad "audit-amp --cases bound"; cat err.txt; }
for cmd in check faults; do
  expect 2 "$cmd: more cases than a run takes" -- "$ck" $cmd --cases 2000000000 --json nodir/r.json
  one_line_error "$cmd huge --cases"
  grep -q -- "--cases must be in \[1, 1000000000\]" err.txt || { bad "$cmd --cases bound"; cat err.txt; }
done
expect 2 "bench: more verification cases than it runs" -- "$ck" bench --verify-cases 2000000000 --impl py:no_such_module:f
grep -q -- "--verify-cases must be in \[0, 100000\]" err.txt || { bad "bench --verify-cases bound"; cat err.txt; }
# merge: a report whose shard is not one a check run has (more shards than --shard takes, an index past
# the count, a count past int) is refused as it is read, naming the file and the field, before merge
# sizes anything by the count.
"$ck" check --cases 4 --shard 1/2 --json shard1.json >/dev/null 2>&1
"$ck" check --cases 4 --shard 2/2 --json shard2.json >/dev/null 2>&1
expect 0 "merge of two shards" -- "$ck" merge shard1.json shard2.json
for forged in 1/2000000000 1/10001 3/2 1/99999999999 0/2; do
  sed "s#\"shard\": \"1/2\"#\"shard\": \"$forged\"#" shard1.json > forged.json
  expect 2 "merge of a report whose shard is $forged" -- "$ck" merge forged.json shard2.json
  one_line_error "merge: shard $forged"
  grep -qF "forged.json: \"shard\": \"$forged\" is not K/N with 1 <= K <= N <= 10000" err.txt ||
    { bad "merge: the shard $forged is not named with its file"; cat err.txt; }
done
sed 's#"cases_requested": 4#"cases_requested": 2000000000#' shard1.json > forged.json
expect 2 "merge of a report with more cases than a run takes" -- "$ck" merge forged.json shard2.json
grep -qF 'forged.json: "cases_requested" out of [1, 1000000000]' err.txt || { bad "merge: cases_requested"; cat err.txt; }
expect 2 "TMPDIR that does not exist" -- env TMPDIR="$PWD/no-such-tmp" "$ck" check --cases 1
one_line_error "TMPDIR missing"
grep -q "TMPDIR=.*is not a directory" err.txt || bad "TMPDIR not named"
# Over a file-size limit the report is refused whole (exit 2, no temporary file), not a SIGXFSZ death.
(ulimit -f 1; "$ck" check --cases 3 --json fsize.json >/dev/null 2>err.txt); rc=$?
[ "$rc" = 2 ] || { bad "a file-size limit: exit $rc, expected 2"; cat err.txt; }
grep -q "cannot write fsize.json" err.txt || { bad "file-size limit message"; cat err.txt; }
[ -e fsize.json ] && bad "a file-size limit left a report"
ls -a | grep -q "^.ckverify-" && bad "a file-size limit left a temporary file"
expect 2 "an empty output path" -- "$ck" check --cases 1 --json ""
expect 2 "missing output directory" -- "$ck" check --cases 5 --json nodir/r.json
[ ! -e nodir ] || bad "created output"
mkdir -p adir
expect 2 "an output that is a directory" -- "$ck" check --cases 5 --json adir
expect 2 "an output that is a device" -- "$ck" check --cases 5 --json /dev/null
# A directory where no file can be made, though access() says writable (as it does to root): refused
# before the run, not after it.
expect 2 "an output in /proc" -- "$ck" check --cases 5 --json /proc/ckverify-report.json
grep -q "cannot create a file in /proc" err.txt || { bad "/proc: not named"; cat err.txt; }
"$ck" case layers=1 d=4 heads=1 steps=2 > proc-case.json
expect 2 "train --save in /proc" -- "$ck" train proc-case.json --save /proc/ckverify.state
grep -q "loss" out.txt && bad "train --save in /proc trained before refusing"
ln -sf report.json link.json
expect 2 "an output that is a symbolic link" -- "$ck" check --cases 5 --json link.json
expect 2 "the same file for two outputs" -- "$ck" check --cases 5 --json same.json --repro-file same.json
[ ! -e same.json ] || bad "wrote an output of a refused run"
# The files a finding writes beside --repro-file are outputs too: a report there would be overwritten
# (or overwrite them), and the printed repro command would replay a report.
expect 2 "a report where a further finding's repro goes" -- "$ck" check --impl no-preserve-rng --cases 5 \
  --max-findings 3 --repro-file r.json --json r.side-effect-once.json
grep -q "further side-effect-once finding" err.txt || bad "the clash with a further finding's file is not named"
expect 2 "a report where the history goes" -- "$ck" check --cases 5 --repro-file r.json --markdown r.history.json
[ ! -e r.json ] && [ ! -e r.side-effect-once.json ] && [ ! -e r.history.json ] || bad "wrote an output of a refused run"
ls .ckverify-* >/dev/null 2>&1 && bad "temporary files left"
expect 0 "--version" -- "$ck" --version
grep -Eq "^ckverify [0-9]+\.[0-9]+\.[0-9]+\+[0-9a-z-]+ \(LibTorch [0-9.]+" out.txt || { bad "--version"; cat out.txt; }
version=$(sed -E 's/^ckverify ([^ ]+) .*/\1/' out.txt)
expect 0 "a report names ckverify's version" -- "$ck" check --cases 2 --json versioned.json
python3 -c "import json,sys; assert json.load(open('versioned.json'))['version'] == sys.argv[1]" "$version" ||
  bad "the report's version is not --version's"
if ! "$ck" list | grep -q "cpu-rng-only" || ! "$ck" list | grep -q "^  inplace=true|false"; then bad "list"; fi
"$ck" list | grep -q "@convention=strategy" || bad "list does not show the spec conventions"

# A case this machine cannot run is bad input, never the implementation's fault.
if ! nvidia-smi >/dev/null 2>&1; then
  echo '{"device": "cuda"}' > cuda.json
  expect 2 "a cuda case without a GPU" -- "$ck" repro cuda.json
  grep -q "no CUDA device" err.txt || bad "cuda message"
  expect 2 "--device cuda without a GPU" -- "$ck" check --device cuda --cases 5
fi

# Resume across processes: save in one, load in another, equal to the uninterrupted run bitwise.
"$ck" case layers=2 d=8 heads=2 drop=0.2 fx=counter,log,bn,cache,noise opt=adam steps=3 micro=2 plan=block seed=4 > train.json
"$ck" case layers=2 d=8 heads=2 drop=0.2 fx=counter,log,bn,cache,noise opt=adam steps=3 micro=2 prec=bf16 plan=every2 seed=4 > train16.json
for cf in train.json train16.json; do
  expect 0 "uninterrupted run ($cf)" -- "$ck" train $cf
  full=$(sed -n 's/^position 6\/6 digest //p' out.txt)
  [ -n "$full" ] || { bad "no digest"; cat out.txt; }
  for at in 2 3; do
    expect 0 "save after $at micro-batches ($cf)" -- "$ck" train $cf --until $at --save state$at.ckv
    expect 0 "resume in a new process ($cf)" -- "$ck" train $cf --resume state$at.ckv
    grep -q "^position 6/6 digest $full\$" out.txt || { bad "resumed at $at differs from the uninterrupted run ($cf)"; cat out.txt; }
  done
done
# A state file that is truncated, corrupted, of another version or another model: one line, exit 2.
head -c 100 state2.ckv > trunc.ckv
expect 2 "a truncated state file" -- "$ck" train train.json --resume trunc.ckv
grep -q "truncated" err.txt || { bad "truncation message"; cat err.txt; }
one_line_error "truncated state"
python3 -c "import sys; b=bytearray(open('state2.ckv','rb').read()); b[len(b)//2]^=1; open('flip.ckv','wb').write(b)"
expect 2 "a corrupted state file" -- "$ck" train train.json --resume flip.ckv
grep -q "checksum" err.txt || { bad "corruption message"; cat err.txt; }
sed '2s/"version":1/"version":9/' state2.ckv > v9.ckv
expect 2 "a state file of another format version" -- "$ck" train train.json --resume v9.ckv
grep -q "format version 9" err.txt || { bad "version message"; cat err.txt; }
"$ck" case layers=3 d=8 heads=2 steps=3 > other.json
expect 2 "a state file of another model" -- "$ck" train other.json --resume state2.ckv
grep -q "another model" err.txt || { bad "model message"; cat err.txt; }
one_line_error "wrong model"
expect 2 "a state file that is not one" -- "$ck" train train.json --resume train.json
expect 2 "a state file that does not exist" -- "$ck" train train.json --resume none.ckv
expect 2 "--until past the end" -- "$ck" train train.json --until 7
expect 2 "--save over the case file" -- "$ck" train train.json --save train.json
expect 2 "--save over the case file, spelled otherwise" -- "$ck" train train.json --save ./train.json
ln -sf train.json trainlink.json
expect 2 "--save over the case file through a link" -- "$ck" train trainlink.json --save train.json
expect 2 "--until negative" -- "$ck" train train.json --until -1
expect 2 "a negative seed" -- "$ck" check --cases 1 --seed -1
expect 2 "a seed past 2^64" -- "$ck" check --cases 1 --seed 18446744073709551616
"$ck" case layers=2 d=8 heads=2 drop=0.2 fx=counter,log,bn,cache,noise opt=adam steps=3 micro=2 plan=block seed=9 > otherseed.json
expect 2 "a state file of another seed" -- "$ck" train otherseed.json --resume state2.ckv
grep -q "seed=4 in the state, seed=9 here" err.txt || { bad "state key difference not named"; cat err.txt; }
# A field at its default is not in a Case line: named as such, both ways.
"$ck" case layers=2 d=8 heads=2 drop=0.2 fx=counter,log,bn,cache,noise steps=3 micro=2 plan=block seed=4 > sgd.json
expect 2 "a state file of another optimizer" -- "$ck" train sgd.json --resume state2.ckv
grep -q "opt=adam in the state, opt at its default here" err.txt || { bad "state key default not named"; cat err.txt; }

# A Case too slow for --case-timeout on this machine is not the implementation's hang: exit 2, naming the
# timeout (its run without checkpointing takes about 1 s here; a hang is told from it past 10 times that).
"$ck" case layers=2 d=128 heads=4 batch=8 seq=128 steps=16 plan=block seed=1 > slowcase.json
expect 2 "a Case too slow for its --case-timeout" -- "$ck" repro slowcase.json --case-timeout 1
grep -q "too short for this Case" err.txt || { bad "slow Case: the timeout not named"; cat out.txt err.txt; }
# (One error line of ckverify's own; the stopped worker's output, relayed, may come before it: LibTorch
# 1.13 warns about its memory profiling there.)
[ "$(grep -c "^ckverify: " err.txt)" = 1 ] || { bad "slow Case: not one error line"; cat err.txt; }
# So on ranks, where rank 0's baseline reports its progress through the ranks' directory.
"$ck" case layers=2 d=128 heads=4 batch=8 seq=128 steps=40 plan=block seed=1 tp=2 > slowrank.json
expect 2 "a rank Case too slow for its --case-timeout" -- "$ck" repro slowrank.json --case-timeout 3
grep -q "too short for this Case: its run without checkpointing takes about" err.txt ||
  { bad "slow rank Case: the timeout not named"; cat out.txt err.txt; }

# The AMP drift audit: the builtin adds no drift; a reentrant recompute with autocast off does, more than
# the reference reentrant designs' own drift (the design floor); a recompute from detached leaves (torch's
# reentrant design) drifts exactly as much as the design floor and passes, and a recompute that throws
# is a finding.
"$ck" case layers=4 d=8 heads=2 pos=post attn=bidir act=swiglu plan=every2 seed=5 > amp.json
expect 0 "audit-amp on the builtin" -- "$ck" audit-amp amp.json --json amp_out.json --plot amp.png
grep -q "^bf16 .*every2 .*layer" out.txt || { bad "audit table lacks bf16 checkpointed rows"; cat out.txt; }
grep -q '"noise_floor"' amp_out.json || bad "audit JSON lacks the noise floor"
[ "$(head -c 4 amp.png | tail -c 3)" = "PNG" ] || bad "audit plot is not a PNG"
expect 1 "audit-amp catches drift (reentrant-no-autocast)" -- "$ck" audit-amp amp.json --impl reentrant-no-autocast
grep -q "^FAIL: checkpoint drift exceeds its allowance: bf16 layer0" out.txt || { bad "drift verdict"; cat out.txt; }
expect 0 "audit-amp passes torch's reentrant AMP summation (leaf-input-recompute)" -- \
  "$ck" audit-amp amp.json --impl leaf-input-recompute
# (its drift is its design floor: the columns "ckpt drift" and "design floor" agree)
awk '$1=="bf16" && $2=="every2" && $3=="layer0" {found=1; if ($6 != $8) bad=1} END {exit !(found && !bad)}' out.txt ||
  { bad "design floor of layer0"; cat out.txt; }
# The false positive of the zero floor: a correct reentrant design sums a tied head's gradient in bf16.
"$ck" case layers=1 d=16 heads=2 ffn=1 vocab=11 norm=rmsnorm attn=bidir act=gelu_tanh loss=mse tie=head segio=multi \
  dropimpl=native batch=2 seq=2 sched=ffbb plan=block seed=210584582849683 > amp_tied.json
expect 0 "audit-amp on a correct reentrant design with a tied head" -- "$ck" audit-amp amp_tied.json --impl reentrant-hooks
grep -q "^skipped bf16" out.txt ||  # LibTorch 1.13 cannot run a tied head in bf16 on the CPU
  awk '$1=="bf16" && $2=="block" && $3=="head" {found=1; if ($6 != $8) bad=1} END {exit !(found && !bad)}' out.txt ||
  { bad "tied head drift is not its design floor"; cat out.txt; }
expect 1 "audit-amp reports a failing recompute (no-autocast-replay)" -- "$ck" audit-amp amp.json --impl no-autocast-replay
expect 0 "audit-amp over generated cases" -- "$ck" audit-amp --cases 4 --seed 4 --json amp_gen.json
# Cases of different depths: one row per precision, plan and group, each naming the case it is worst in;
# a design floor missing in several cases is one line saying in how many.
python3 - <<'PY' || { bad "audit-amp over generated cases: rows or notes"; cat out.txt; }
import collections, json
j = json.load(open("amp_gen.json"))
keys = collections.Counter((r["precision"], r["checkpointed"], r["group"]) for r in j["rows"])
assert keys and max(keys.values()) == 1, keys
assert all(r["case"].startswith("layers=") for r in j["rows"])
assert len({r["case"].split()[0] for r in j["rows"]}) > 1  # the Cases differ in depth
notes = j["design_notes"]
assert notes and len(notes) == len(set(notes)) and all(" of 4 cases; first: layers=" in n for n in notes), notes
PY
[ "$(grep -c "no design floor" out.txt)" = "$(python3 -c 'import json; print(len(json.load(open("amp_gen.json"))["design_notes"]))')" ] ||
  { bad "audit-amp design notes on the console"; cat out.txt; }
# (LibTorch 1.13's CPU autocast covers too few ops for the drift to show: there the gate's
# autocast-replay is what catches it.)
if "$ck" check --cases 1 --only prec=fp16 >/dev/null 2>&1; then
  expect 1 "audit-amp's default Cases catch a reentrant recompute with autocast off" -- \
    "$ck" audit-amp --impl reentrant-no-autocast
  grep -Eq "^worst checkpointed row: (bf16|fp16) .* \(drift/allowed (inf|[0-9.e+]+)\), from case: layers=" out.txt ||
    { bad "audit-amp names the worst row's case"; cat out.txt; }
else
  echo "not on this LibTorch (no CPU fp16 autocast, so 1.x): audit-amp's default Cases on reentrant-no-autocast"
fi
# An image cut short (a file size limit stops gnuplot's writes; it still exits 0) is not written: exit 2.
( ulimit -f 8; exec "$ck" audit-amp amp.json --plot cut.png ) >out.txt 2>err.txt; rc=$?
[ $rc = 2 ] && [ ! -e cut.png ] && grep -q "cut short" err.txt ||
  { bad "audit-amp --plot under a file size limit: exit $rc"; ls -l cut.png; cat err.txt; }
expect 2 "audit-amp plot that is not a .png" -- "$ck" audit-amp amp.json --plot amp.txt
expect 2 "audit-amp writing over its case file" -- "$ck" audit-amp amp.json --json ./amp.json
expect 2 "audit-amp --plan none" -- "$ck" audit-amp amp.json --plan none
expect 2 "audit-amp with a case file and --cases" -- "$ck" audit-amp amp.json --cases 3
"$ck" case layers=2 d=8 heads=2 freeze=blocks seed=3 > frozen.json
expect 0 "audit-amp with frozen parameters" -- "$ck" audit-amp frozen.json
# Weights tied across blocks are one group, "blocks", at the first position; no block reads as layer0.
"$ck" case layers=3 d=8 heads=2 tie=blocks plan=block seed=3 > amp_blocks.json
expect 0 "audit-amp with weights tied across blocks" -- "$ck" audit-amp amp_blocks.json --json amp_blocks_out.json
python3 - amp_blocks_out.json <<'PY' || { bad "tied blocks are not one group at position 0"; cat out.txt; }
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
groups = {r["group"]: r["position"] for r in rows}
assert groups.get("blocks") == 0 and not any(g.startswith("layer") for g in groups), groups
assert all(p in (1, 2) for g, p in groups.items() if g != "blocks"), groups
PY

# bench: per-plan memory and time, loss curves, the growth law, the report with its plots.
"$ck" case layers=4 d=8 heads=2 ffn=2 vocab=5 batch=2 seq=8 seed=3 > bench.json
# `train` runs the implementation in ckverify's own process: one that throws is its finding (exit 1).
"$ck" case layers=2 d=8 heads=2 ffn=2 vocab=5 batch=2 seq=4 gp=0.1 plan=block impl=single-recompute > train-throw.json
expect 1 "train with an implementation that throws" -- "$ck" train train-throw.json
grep -q "^FAIL: the run stopped at micro-batch 0 of 1: " out.txt || { bad "train: throw"; cat out.txt; }
expect 0 "bench a Case" -- "$ck" bench bench.json --plans block,sqrt --warmup 0 --repeats 2 --json bench_out.json
for p in none block sqrt; do grep -q "^$p " out.txt || bad "bench table lacks $p"; done
grep -q '"forward_kept_bytes"' bench_out.json && grep -q '"loss_divergence": 0.0' bench_out.json || { bad "bench json"; head -c 600 bench_out.json; }
expect 0 "bench: --impl before the Case file" -- "$ck" bench --impl builtin bench.json --plans block --repeats 6 --max-repeats 6
grep -q "^timed rounds: 6 " out.txt || { bad "bench --impl then the Case: rounds"; cat out.txt; }
expect 2 "bench: more rounds than a Case has steps" -- "$ck" bench bench.json --max-repeats 1000
one_line_error "bench --max-repeats"
expect 2 "bench: fewer rounds at most than at least" -- "$ck" bench bench.json --repeats 4 --max-repeats 2
one_line_error "bench --max-repeats below --repeats"
grep -q -- "--max-repeats 2 is below --repeats 4" err.txt || { bad "bench --max-repeats below --repeats: message"; cat err.txt; }
expect 0 "bench report with growth" -- "$ck" bench bench.json --plans block --warmup 0 --repeats 1 --growth --out rep
head -1 rep/plans.csv | grep -q ",save_per_overhead$" || bad "plans.csv lacks save/ovh"
for f in report.md bench.json plans.csv losses.csv growth.csv memory_time.png losses.png growth.png; do
  [ -s "rep/$f" ] || bad "bench report lacks $f"
done
grep -q "fitted peak = c + a \* L^k: none k = " out.txt || bad "bench growth fit missing"
[ "$(grep -c -e '^none,"",0,' -e '^block,"builtin",0,' rep/losses.csv)" = 2 ] || { bad "losses.csv lacks a plan's loss"; cat rep/losses.csv; }
grep -q "!\[growth\](growth.png)" rep/report.md || bad "report does not show the growth plot"
expect 0 "bench with a memory budget" -- "$ck" bench bench.json --plans block --warmup 0 --repeats 1 --memory-budget 2M
grep -q "within the budget: batch .*one measurement; bounded by " out.txt || { bad "no budget batch"; cat out.txt; }
# A budget no batch fits is said, not dropped: on the console and in the JSON.
expect 0 "bench with a budget nothing fits" -- "$ck" bench bench.json --plans block --warmup 0 --repeats 1 \
  --memory-budget 1K --json budget.json
grep -q "within the budget: no batch fits: batch 1 needs about" out.txt || { bad "no-fit budget not said"; cat out.txt; }
python3 -c "import json; assert all(p['budget']['batch'] is None for p in json.load(open('budget.json'))['plans'])" ||
  bad "no-fit budget not in the JSON"
expect 2 "bench --threads 0" -- "$ck" bench bench.json --threads 0
expect 2 "bench: unknown preset" -- "$ck" bench --preset lab
one_line_error "bench: unknown preset"
expect 2 "bench: bad budget" -- "$ck" bench bench.json --memory-budget 12parsecs
one_line_error "bench: bad budget"
expect 2 "bench: --out is a file" -- "$ck" bench bench.json --out bench.json
expect 2 "bench: a plan invalid for the Case" -- "$ck" bench bench.json --plans seg9
[ -e rep2 ] && bad "a refused bench left a directory"
expect 2 "bench: --out in a missing directory" -- "$ck" bench bench.json --out nodir/rep2
# Two implementations side by side are ranked only with a 95% interval and only where neither failed:
# against a fault whose loss curve leaves none's, and over one round, "not compared" (JSON: null).
"$ck" case layers=2 d=16 heads=2 seq=16 batch=2 steps=12 drop=0.3 plan=block > drop.json
expect 1 "bench: a comparison against a failed implementation" -- "$ck" bench drop.json --plans block --repeats 6 \
  --max-repeats 6 --verify-cases 0 --threads 1 --impl no-preserve-rng,builtin --json cmp1.json
grep -q "^  block .*\[2\] .*: not compared (\[1\] left none's loss curve)" out.txt || { bad "bench: ranked against a failed row"; cat out.txt; }
expect 0 "bench: a comparison over one round" -- "$ck" bench drop.json --plans block --repeats 1 --max-repeats 1 \
  --verify-cases 0 --threads 1 --impl builtin,recompute-twice --json cmp2.json
grep -q "^  block .*\[2\] [0-9.]*x: not compared (only 1 timed round(s); a 95% interval needs 6)" out.txt ||
  { bad "bench: ranked without an interval"; cat out.txt; }
grep -q "^PASS: .*(not gated: --verify-cases 0)$" out.txt || { bad "bench: an ungated PASS not said"; cat out.txt; }
python3 -c "import json,sys; sys.exit(any(c['within_noise'] is not None for f in ('cmp1.json','cmp2.json') for c in json.load(open(f))['comparisons']))" ||
  bad "bench: a comparison not made has a within_noise verdict in the JSON"
# The printed save/ovh is in the JSON too (null where the console says noise or n/a).
python3 - <<'PY' || bad "bench: save/ovh differs between the console and the JSON"
import json, re
rows = [l for l in open("out.txt") if re.match(r"^(none|block) ", l)]
for p in json.load(open("cmp2.json"))["plans"]:
    v = p["save_per_overhead"]
    impl = p.get("impl", "")
    row = [l for l in rows if l.startswith(p["plan"] + " ") and ("[1]" if impl == "builtin" else "[2]" if impl else " - ") in l]
    assert len(row) == 1, (p["plan"], impl, rows)
    cell = row[0].split()[-2]
    assert (v is None and cell in ("-", "noise", "n/a")) or cell.rstrip("*") == f"{v:.2f}", (cell, v)
PY
expect 1 "bench: two rows failing the gate" -- "$ck" bench drop.json --plans block --repeats 1 --max-repeats 1 \
  --verify-cases 3 --threads 1 --impl no-preserve-rng,recompute-twice
grep -q "^FAIL: plan block (no-preserve-rng): .*(and 1 more failed row(s), above)$" out.txt ||
  { bad "bench: the second failed row not counted"; cat out.txt; }
# A bench stopped before its report (Ctrl-C) leaves no empty --out directory behind.
"$ck" case layers=8 d=96 heads=4 seq=96 batch=4 steps=20 plan=block > slowbench.json
"$ck" bench slowbench.json --out intrep >/dev/null 2>&1 &
pid=$!; sleep 3
kill -INT $pid || bad "bench --out: ended before it could be interrupted"
wait $pid; rc=$?
[ $rc = 130 ] || bad "an interrupted bench: exit $rc, not 130"
[ -e intrep ] && { bad "an interrupted bench --out left its directory"; ls -la intrep; }
grep -q "^fp32 .* layer0 .* 1.000e+00" out.txt && bad "frozen parameters counted as errors against fp64"

# Files named relative to where ckverify was started are resolved as the command line is parsed: an
# implementation whose code changes the working directory on loading (a Python module that chdir()s on
# import, as a plugin may too) cannot move what is written or read after it loaded.
if "$ck" check --impl py:no_such_module:f --cases 1 2>&1 | grep -q "no Python bridge"; then
  echo "not on this build (no Python bridge): files named relative to the start directory, after a chdir"
else
  start="$PWD"
  mkdir -p chdir/mod chdir/away chdir/here
  cat > chdir/mod/ckv_chdir_impl.py <<'EOF'
import os
import torch.utils.checkpoint as tc

os.chdir(os.environ["CKV_CHDIR_TO"])  # on import, before ckverify writes anything


def checkpoint(segment, *args):
    return tc.checkpoint(segment, *args, use_reentrant=False)


def strategy(blocks, x):
    return tc.checkpoint_sequential(blocks, len(blocks), x, use_reentrant=False)


def forgets_rng(blocks, x):
    return tc.checkpoint_sequential(blocks, len(blocks), x, use_reentrant=False, preserve_rng_state=False)
EOF
  export CKV_CHDIR_TO="$start/chdir/away"
  pp="$start/chdir/mod${PYTHONPATH:+:$PYTHONPATH}"
  cd chdir/here
  "$ck" case layers=2 d=8 heads=2 steps=2 plan=block impl=py:ckv_chdir_impl:checkpoint > c.json
  expect 0 "train --save, the module changing directory" -- env PYTHONPATH="$pp" "$ck" train c.json --until 1 --save s.ckv
  expect 0 "train --resume, the module changing directory" -- env PYTHONPATH="$pp" "$ck" train c.json --resume s.ckv
  grep -q "^resumed at micro-batch 1" out.txt || { bad "train --resume after a chdir"; cat out.txt err.txt; }
  expect 0 "audit-amp --json --plot, the module changing directory" -- env PYTHONPATH="$pp" "$ck" audit-amp c.json \
    --json amp.json --plot amp.png
  expect 0 "bench --json --out, the module changing directory" -- env PYTHONPATH="$pp" "$ck" bench c.json \
    --impl py:ckv_chdir_impl:checkpoint --plans block --warmup 0 --repeats 1 --max-repeats 1 --verify-cases 0 \
    --json bench.json --out rep
  expect 0 "check --strategy and its reports, the module changing directory" -- env PYTHONPATH="$pp" "$ck" check \
    --strategy py:ckv_chdir_impl:strategy --only fx=none --cases 3 --json r.json --junit r.xml --markdown r.md
  expect 1 "check --strategy's repro files, the module changing directory" -- env PYTHONPATH="$pp" "$ck" check \
    --strategy py:ckv_chdir_impl:forgets_rng --only fx=none --only drop=0.3 --cases 30 --max-findings 2 \
    --repro-file rng.json
  for f in s.ckv amp.json amp.png bench.json rep/report.md r.json r.xml r.md rng.json; do
    [ -s "$f" ] || bad "$f was not written where it was named (the start directory)"
  done
  [ -z "$(ls -A "$CKV_CHDIR_TO")" ] || { bad "written where the module changed directory to:"; ls -A "$CKV_CHDIR_TO"; }
  cd "$start"
  unset CKV_CHDIR_TO
fi

# The time budget bounds the whole run, however many cases are asked for.
start=$(date +%s)
expect 0 "the time budget bounds the run" -- "$ck" check --cases 20000000 --time-budget 2
[ $(( $(date +%s) - start )) -le 30 ] || bad "a 2 s budget took $(( $(date +%s) - start )) s"
grep -q "time budget of 2 s reached" out.txt || bad "budget not reported"

# bench on a tp=2 Case runs as its ranks (docs/parallel.md): per plan the collectives of each pass; every
# checkpointed plan also with the selective plan (tpkeep=reduced), whose recompute repeats none of the
# forward all-reduces the full recompute repeats; a fault whose recompute draws other masks in the
# tensor-parallel regions leaves none's loss curve; what is not measured on ranks is refused.
"$ck" case layers=2 d=8 heads=2 drop=0.3 plan=block tp=2 steps=2 > cli-bench-tp.json
expect 0 "bench of a tp=2 Case" -- "$ck" bench cli-bench-tp.json --plans block --repeats 2 --max-repeats 2 \
  --verify-cases 0 --json cli-bench-tp-out.json
grep -q "^collectives per step on rank 0 of 2 (tp=2 dp=1)" out.txt || { bad "bench tp=2: no collectives table"; cat out.txt; }
grep -q "^\[Gloo\]" out.txt && bad "bench tp=2: Gloo's notes in the output"
python3 - <<'PY' || bad "bench tp=2: the collectives per plan"
import json
r = json.load(open("cli-bench-tp-out.json"))
assert (r["tp"], r["dp"]) == (2, 1), (r["tp"], r["dp"])
c = {p["plan"]: p["collectives_per_step"] for p in r["plans"]}
assert set(c) == {"none", "block", "block tpkeep=reduced"}, list(c)
for plan, per in c.items():
    assert per["forward"]["count"] == 4 and per["backward"]["count"] == 4, (plan, per)
assert c["none"]["recompute"]["count"] == 0, c["none"]
assert c["block"]["recompute"]["count"] == 4 and c["block"]["recompute"]["kib_total"] > 0, c["block"]
assert c["block tpkeep=reduced"]["recompute"]["count"] == 0, c["block tpkeep=reduced"]
PY
expect 1 "bench of a tp=2 Case under tracker-not-replayed" -- "$ck" bench cli-bench-tp.json --impl tracker-not-replayed \
  --plans block --repeats 2 --max-repeats 2 --verify-cases 0
grep -q "^FAIL: the loss curve of plan block (tracker-not-replayed) left none's" out.txt ||
  { bad "bench tp=2 tracker-not-replayed: not the loss curve"; cat out.txt; }
"$ck" case layers=2 d=8 heads=2 drop=0.3 plan=block micro=2 dp=2 steps=2 > cli-bench-dp.json
expect 0 "bench of a dp=2 Case" -- "$ck" bench cli-bench-dp.json --plans block --repeats 2 --max-repeats 2 --verify-cases 0
grep -q "^collectives per step on rank 0 of 2 (tp=1 dp=2)" out.txt || { bad "bench dp=2: no collectives table"; cat out.txt; }
expect 2 "bench --growth of a dp=2 Case" -- "$ck" bench cli-bench-dp.json --growth
one_line_error "bench --growth on ranks"
sleep 1
pgrep -f "ckverify bench cli-bench-" >/dev/null && bad "bench on ranks: a rank outlived the run"

echo "cli_test: $fails failure(s)"
exit $((fails > 0))
