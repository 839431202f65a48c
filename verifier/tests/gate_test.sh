#!/usr/bin/env bash
# verifier/tests/gate_test.sh CKVERIFY PLUGIN_DIR TMPDIR: the gate on implementations outside ckverify.
#   isolation: a plugin that segfaults, aborts, throws a non-exception, exits or hangs is a finding
#     (exit 1, a whole report, a repro line), never a crash or a hang of ckverify;
#   plugin loading: each load error is one line and exit 2;
#   workers: the verdict and the report are the same for -j 1 and -j 2;
#   shards: three shards merged equal the unsharded run (passing and failing); merge refuses bad input.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ck="$1"; plugins="$2"; tmp="$3"
rm -rf "$tmp"; mkdir -p "$tmp"; cd "$tmp"
source "$here/lib.sh"
# The report without what differs from run to run (wall time).
canon() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); [r.pop(k,None) for k in ('elapsed_s','shard','case_outcomes')]; r.get('failure',{}).pop('repro',None); print(json.dumps(r,sort_keys=True,indent=1))" "$1"; }
mis="$plugins/libckverify_misbehave.so"

# Isolation: each way of dying is a completes finding with the case and a repro line.
for mode in segv abort throw exit; do
  expect 1 "a plugin that does $mode is a finding" -- "$ck" check --impl "$mis:mode=$mode" --plan block --cases 5 -j 2 \
    --json "$mode.json" --repro-file "$mode-repro.json" --time-budget 6
  grep -q "^FAILED completes" out.txt || { bad "$mode: headline"; cat out.txt; }
  grep -q "ckverify repro $mode-repro.json" out.txt || bad "$mode: no repro line"
  python3 -c "import json; r=json.load(open('$mode.json')); assert r['failure']['property']=='completes'" || bad "$mode: report"
done
grep -q "signal 11" segv.json || bad "segv: the signal is not named"
expect 1 "repro replays the crash as a finding" -- "$ck" repro segv-repro.json
grep -q "^FAILED completes" out.txt || bad "repro of a crash"
start=$(date +%s)
expect 1 "a plugin that hangs is a finding" -- "$ck" check --impl "$mis:mode=hang" --plan block --cases 3 -j 2 --case-timeout 2 \
  --time-budget 12 --json hang.json --repro-file hang-repro.json
grep -q "per-case timeout of 2 s" hang.json || { bad "hang: timeout not named"; cat out.txt; }
# Every failing shrink candidate of a hang costs the whole timeout: within the 12 s budget the shrink
# still ends at the smallest Case (search.cpp: the jump before the greedy walk).
python3 -c "
import json, sys
c = json.load(open('hang-repro.json'))
big = {k: c[k] for k in ('layers', 'batch', 'seq', 'steps', 'micro', 'd') if c.get(k, 1) > (4 if k == 'd' else 1)}
sys.exit('not shrunk to the smallest Case: %s' % big if big else 0)" || bad "hang: shrinking"
[ $(( $(date +%s) - start )) -le 60 ] || bad "a hanging plugin held ckverify for $(( $(date +%s) - start )) s"
# A repro file that cannot be written at the end (its directory removed mid-run) is exit 2, as a report
# file is, after the verdict on the console.
mkdir -p gone
"$ck" check --impl "$mis:mode=hang" --plan block --cases 3 -j 1 --case-timeout 2 --time-budget 8 \
  --repro-file gone/r.json >out.txt 2>err.txt &
pid=$!
for k in $(seq 300); do grep -q "^ckverify check:" out.txt && break; sleep 0.1; done
rm -rf gone; wait $pid; rc=$?
[ $rc = 2 ] && grep -q "^FAILED completes" out.txt && grep -q "gone/r.json" err.txt ||
  { bad "an unwritable repro file at the end: exit $rc, not 2 after the verdict"; cat out.txt err.txt; }
one_line_error "an unwritable repro file at the end"

# train, bench and audit-amp run the implementation in a supervised child (supervise.hpp): each way of
# dying is a finding that names the plugin, a hang ends at --stall-timeout, SIGTERM leaves nothing
# behind, and what the plugin forks does not outlive the command.
sv_case() {  # sv_case FILE MODE: a small checkpointed Case whose impl is the misbehaving plugin
  "$ck" case layers=2 d=8 heads=2 steps=2 plan=block > "$1"
  python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c['impl']=sys.argv[2]; json.dump(c,open(sys.argv[1],'w'))" "$1" "$mis:mode=$2"
}
for mode in segv abort throw exit; do
  sv_case "sv-$mode.json" "$mode"
  expect 1 "train: a plugin that does $mode" -- "$ck" train "sv-$mode.json"
  grep -q "^FAIL: .*libckverify_misbehave.so:mode=$mode" out.txt || grep -q "^FAIL: the run stopped" out.txt ||
    { bad "train $mode: no FAIL line naming the plugin"; cat out.txt err.txt; }
  expect 1 "audit-amp: a plugin that does $mode" -- "$ck" audit-amp "sv-$mode.json" --plan block
  grep -q "^FAIL: " out.txt || { bad "audit-amp $mode: no FAIL line"; cat out.txt err.txt; }
done
grep -q "signal 11" <("$ck" train sv-segv.json 2>&1) || bad "train segv: the signal is not named"
grep -q "ended the process (exit status 0)" <("$ck" train sv-exit.json 2>&1) || bad "train exit: not named"
expect 1 "bench: a plugin that segfaults" -- "$ck" bench sv-segv.json --impl "$mis:mode=segv" --plans block \
  --warmup 0 --repeats 1 --max-repeats 1
grep -q "signal 11" out.txt || { bad "bench segv: the signal is not named"; cat out.txt err.txt; }
# Out of memory is the environment's in these commands too: exit 2, one line, never a FAIL.
sv_case sv-oom.json oom
expect 2 "train: out of memory" -- "$ck" train sv-oom.json
grep -q "ran out of memory" err.txt && ! grep -q "^FAIL" out.txt || { bad "train oom"; cat out.txt err.txt; }
one_line_error "train oom"
expect 2 "audit-amp: out of memory" -- "$ck" audit-amp sv-oom.json --plan block
grep -q "ran out of memory" err.txt && ! grep -q "^FAIL" out.txt || { bad "audit-amp oom"; cat out.txt err.txt; }
expect 2 "bench: out of memory" -- "$ck" bench sv-oom.json --impl "$mis:mode=oom" --plans block --warmup 0 --repeats 1 \
  --max-repeats 1
grep -q "ran out of memory" err.txt && ! grep -q "^FAIL" out.txt || { bad "bench oom"; cat out.txt err.txt; }
sv_case sv-hang.json hang
start=$(date +%s)
expect 1 "train: a plugin that hangs" -- "$ck" train sv-hang.json --stall-timeout 3
grep -q "made no progress for 3 s" out.txt || { bad "train hang: not named"; cat out.txt err.txt; }
[ $(( $(date +%s) - start )) -le 40 ] || bad "a hanging plugin held train for $(( $(date +%s) - start )) s"
expect 2 "train: --stall-timeout 0" -- "$ck" train sv-hang.json --stall-timeout 0
"$ck" train "$tmp/sv-hang.json" >/dev/null 2>&1 &
pid=$!; sleep 6; kill -TERM $pid; wait $pid; rc=$?
[ $rc = 143 ] || bad "train stopped by SIGTERM exited $rc, not 143"
sleep 1
pgrep -f "train $tmp/sv-hang.json" >/dev/null && { bad "train's child outlived SIGTERM"; pkill -9 -f "train $tmp/sv-hang.json"; }
# SIGTERM sent to the supervised child itself (not to ckverify) is a stop from outside: exit 2, named,
# blaming neither ckverify (exit 3) nor the implementation.
"$ck" train "$tmp/sv-hang.json" >out.txt 2>err.txt &
pid=$!
for k in $(seq 100); do [ -n "$(pgrep -P $pid)" ] && break; sleep 0.1; done
sleep 2; kill -TERM $(pgrep -P $pid); wait $pid; rc=$?
[ $rc = 2 ] || { bad "train's child stopped by SIGTERM from outside: exit $rc, not 2"; cat out.txt err.txt; }
grep -q "stopped by signal 15 (Terminated) from outside ckverify" err.txt || { bad "outside SIGTERM: not named"; cat err.txt; }
sv_case sv-fork.json fork
start=$(date +%s)
"$ck" train sv-fork.json 2>&1 | cat > fork.txt
[ "${PIPESTATUS[0]}" = 0 ] || { bad "train with a forking plugin"; cat fork.txt; }
grep -q "digest" fork.txt || bad "train with a forking plugin: no digest"
[ $(( $(date +%s) - start )) -le 60 ] || bad "a process forked by the plugin held train's output for $(( $(date +%s) - start )) s"

# The answer channel is the worker's own: a plugin that writes forged answers on ckverify's pipes is a
# finding of the case (not a pass, not a shifted result); one that forks a process carrying on into
# ckverify's code, or reads and closes its stdin, gets the verdict of the same plugin that does not
# (the plain run: recompute-count); one that closes every descriptor is a finding, not a hang.
expect 1 "a plugin that forges answers" -- "$ck" check --impl "$mis:mode=forge" --plan block --cases 3 -j 2 --json forge.json \
  --time-budget 6
grep -q "^FAILED completes" out.txt || { bad "forge: headline"; cat out.txt; }
grep -q "answer channel" forge.json || { bad "forge: the forged line is not named"; cat out.txt; }
sv_case sv-forge.json forge
expect 1 "train: a plugin that forges the report pipe" -- "$ck" train sv-forge.json
grep -q "^FAIL: .*mode=forge.*report pipe" out.txt || { bad "train forge: no FAIL line"; cat out.txt err.txt; }
expect 1 "the plain plugin (control)" -- "$ck" check --impl "$mis:mode=hang,at=1000000" --plan block --cases 3 -j 2
control=$(grep "^FAILED" out.txt)
[ "$control" = "FAILED recompute-count" ] || { bad "plain plugin: $control"; cat out.txt; }
for mode in forkrun stdin; do
  expect 1 "a plugin that does $mode" -- "$ck" check --impl "$mis:mode=$mode" --plan block --cases 3 -j 2
  [ "$(grep "^FAILED" out.txt)" = "$control" ] || { bad "$mode: not the plain plugin's verdict"; cat out.txt; }
done
start=$(date +%s)
expect 1 "a plugin that closes every descriptor" -- "$ck" check --impl "$mis:mode=closefds" --plan block --cases 3 -j 2 --time-budget 6
grep -q "^FAILED completes" out.txt || { bad "closefds: headline"; cat out.txt; }
[ $(( $(date +%s) - start )) -le 90 ] || bad "closefds took $(( $(date +%s) - start )) s"
pgrep -f "$mis:mode=forkrun" >/dev/null && { bad "a process forked by the plugin outlived check"; pkill -9 -f "$mis:mode=forkrun"; }

# Containment (containment.hpp). What an implementation prints is bounded: 8 MiB on each stream from each
# worker come out as at most about 1 MiB per pool plus a tail, after a note of what was left out, and the
# verdict is the plain plugin's. A process it forks out of its process group (setsid) dies with the
# command and holds none of its output.
expect 1 "a plugin that floods its output" -- "$ck" check --impl "$mis:mode=flood" --plan block --cases 3 -j 2
[ "$(grep "^FAILED" out.txt)" = "$control" ] || { bad "flood: not the plain plugin's verdict"; head -c 2000 out.txt; }
size=$(( $(wc -c < out.txt) + $(wc -c < err.txt) ))
[ $size -le $(( 8 << 20 )) ] || bad "flood: $size bytes of output reached ckverify's"
grep -q "bytes left out here" err.txt || bad "flood: no note of what was left out"
sv_case sv-flood.json flood
expect 0 "train: a plugin that floods its output" -- "$ck" train sv-flood.json
grep -q "digest" out.txt || bad "train flood: the digest was lost"
[ $(wc -c < out.txt) -le $(( 2 << 20 )) ] || bad "train flood: $(wc -c < out.txt) bytes on stdout"
grep -q "bytes left out here" out.txt || bad "train flood: no note of what was left out"
start=$(date +%s)
"$ck" check --impl "$mis:mode=setsid" --plan block --cases 3 -j 2 2>&1 | cat > setsid.txt
[ "$(grep "^FAILED" setsid.txt)" = "$control" ] || { bad "setsid: not the plain plugin's verdict"; cat setsid.txt; }
[ $(( $(date +%s) - start )) -le 60 ] || bad "a process forked out of the group held check's output for $(( $(date +%s) - start )) s"
sleep 1
pgrep -f "$mis:mode=setsid" >/dev/null && { bad "a process forked out of its group outlived check"; pkill -9 -f "$mis:mode=setsid"; }
sv_case sv-setsid.json setsid
"$ck" train sv-setsid.json 2>&1 | cat > setsid.txt
[ "${PIPESTATUS[0]}" = 0 ] || { bad "train with a plugin that forks out of its group"; cat setsid.txt; }
sleep 1
pgrep -f "train sv-setsid.json" >/dev/null && { bad "a process forked out of its group outlived train"; pkill -9 -f "train sv-setsid.json"; }
# The command's own output travels apart from the implementation's: a thread that writes to stdout
# without end crowds out neither train's losses and digest nor bench's verdict.
sv_case sv-spew.json spew
expect 0 "train: a plugin thread writing without end" -- "$ck" train sv-spew.json
grep -q "step 0 loss" out.txt && grep -q "digest" out.txt || { bad "train spew: its own output was lost"; tail -c 300 out.txt; }
expect 0 "bench: a plugin thread writing without end" -- "$ck" bench sv-spew.json --impl "$mis:mode=spew" --plans block \
  --warmup 0 --repeats 1 --max-repeats 1 --verify-cases 0
grep -q "^PASS" out.txt || { bad "bench spew: no verdict"; tail -c 300 out.txt; }
# An implementation that stops itself waits as under a debugger, but SIGTERM (a CI timeout) ends it: 143.
sv_case sv-stop.json stopself
"$ck" train sv-stop.json >/dev/null 2>&1 &
pid=$!; sleep 4; kill -TERM $pid
for k in $(seq 40); do kill -0 $pid 2>/dev/null || break; sleep 0.5; done
kill -0 $pid 2>/dev/null && { bad "train of a stopped plugin outlived SIGTERM"; kill -KILL $pid; }
wait $pid; rc=$?
[ $rc = 143 ] || bad "train of a stopped plugin after SIGTERM: exit $rc, not 143"
# SIGTERM to ckverify (a CI timeout) kills its workers and what they set free (a daemon) before it dies,
# mid-case (a Case of some seconds, the daemon started at its first segment call).
"$ck" case layers=8 d=96 heads=4 seq=96 batch=4 steps=100 plan=every2 impl="$mis:mode=daemon" > daemon.json
"$ck" repro daemon.json >/dev/null 2>&1 &
pid=$!; sleep 5; kill -TERM $pid; wait $pid; rc=$?
[ $rc = 143 ] || bad "repro after SIGTERM: exit $rc, not 143"
sleep 1
pgrep -f "$mis:mode=daemon" >/dev/null && { bad "a daemon the plugin started outlived SIGTERM of check"; pkill -9 -f "$mis:mode=daemon"; }
# A worker killed from outside while it waits between cases is the environment's too (exit 2), found
# when it is next given a case: the first worker hangs in its case (mode=hangonce) while the other one
# runs the remaining cases and waits; that one is killed; the hang's timeout fails its case, and the
# shrink's candidates go to both workers.
rm -f hangonce.pid
"$ck" check --impl "$mis:mode=hangonce,marker=$tmp/hangonce.pid" --plan block --cases 3 -j 2 --case-timeout 15 \
  >out.txt 2>err.txt &
pid=$!
for k in $(seq 120); do [ -s hangonce.pid ] && break; sleep 0.5; done
hanger=$(cat hangonce.pid)
idle=$(pgrep -P $pid | grep -vx "$hanger" | head -1)
cpu() { awk '{print $14 + $15}' /proc/$1/stat 2>/dev/null; }
last=$(cpu $idle)
for k in $(seq 60); do sleep 1; now=$(cpu $idle); [ "$now" = "$last" ] && break; last=$now; done
kill -KILL $idle; wait $pid; rc=$?
[ $rc = 2 ] || { bad "an idle worker killed from outside: exit $rc, not 2"; cat out.txt err.txt; }
grep -q "killed by SIGKILL from outside ckverify.*between cases" err.txt || { bad "idle kill: not named"; cat err.txt; }

# Blame: a worker killed by SIGKILL from outside (the OOM killer, a user) is the environment's, exit 2,
# one line, nothing shrunk; time the job spends stopped is not a case's (the whole job, ckverify and
# its worker, stopped mid-case for longer than --case-timeout, then continued, still passes).
"$ck" check --impl "$mis:mode=hang,at=2" --plan block --cases 2 -j 1 --case-timeout 300 >out.txt 2>err.txt &
pid=$!; sleep 6
kill -KILL $(pgrep -P $pid) 2>/dev/null; wait $pid; rc=$?
[ $rc = 2 ] || { bad "a worker killed from outside: exit $rc, not 2"; cat out.txt err.txt; }
grep -q "killed by SIGKILL from outside ckverify" err.txt || { bad "outside kill: not named"; cat err.txt; }
one_line_error "outside kill"
expect 2 "a run out of memory is the environment's" -- "$ck" check --impl "$mis:mode=oom" --plan block --cases 2 -j 1
grep -q "ran out of memory" err.txt || { bad "out of memory: not named"; cat err.txt; }
# The Case runs about 4 s on an idle machine; it is stopped 1 s after its worker starts, so mid-case.
"$ck" case layers=8 d=96 heads=4 seq=96 batch=4 steps=24 plan=every2 > slow.json
"$ck" repro slow.json --case-timeout 10 >out.txt 2>err.txt &
pid=$!
for k in $(seq 100); do [ -n "$(pgrep -P $pid)" ] && break; sleep 0.1; done
sleep 1
kill -STOP $pid $(pgrep -P $pid) || bad "the job to stop mid-case had ended before it was stopped"
sleep 12; kill -CONT $(pgrep -P $pid) $pid
wait $pid; rc=$?
[ $rc = 0 ] || { bad "a job stopped for 12 s mid-case: exit $rc, not 0"; cat out.txt err.txt; }

# Workers die with ckverify: a run stopped by SIGTERM (a CI timeout) leaves no worker behind, and no
# temporary directory of the implementation's.
rm -rf stoptmp; mkdir stoptmp
TMPDIR="$PWD/stoptmp" "$ck" check --impl "$mis:mode=hang,at=2" --plan block --cases 2 -j 2 --case-timeout 300 \
  >/dev/null 2>&1 &
pid=$!; sleep 8; kill -TERM $pid; wait $pid 2>/dev/null; sleep 2
[ -z "$(ls -A stoptmp)" ] || { bad "a stopped ckverify left its temporary directory"; ls -lA stoptmp; }
pgrep -f "worker --impl $mis:mode=hang,at=2" >/dev/null && { bad "workers outlived a killed ckverify"; pkill -9 -f "worker --impl $mis:mode=hang,at=2"; }
# A relative plugin path is stored absolute: the repro file replays from any directory.
cp "$mis" mb.so
expect 1 "a relative plugin path" -- "$ck" check --impl mb.so:mode=abort --plan block --cases 2 --repro-file rel.json --time-budget 6
mkdir -p elsewhere
(cd elsewhere && "$ck" repro ../rel.json >../out.txt 2>&1); [ $? = 1 ] || { bad "repro of a relative plugin from elsewhere"; cat out.txt; }
# The time budget bounds a run whose cases hang: cases in flight at the budget are stopped.
start=$(date +%s)
expect 1 "the budget cuts a hanging case" -- "$ck" check --impl "$mis:mode=hang" --plan block --cases 3 --case-timeout 300 --time-budget 5
[ $(( $(date +%s) - start )) -le 30 ] || bad "a 5 s budget with hanging cases took $(( $(date +%s) - start )) s"
expect 2 "an impl spec with a blank" -- "$ck" check --impl "dir with blank/x.so" --cases 1
one_line_error "impl with a blank"
expect 2 "--only twice for one field" -- "$ck" check --cases 4 --only fx=none --only fx=bn

# Plugin load errors: one line, exit 2, before any work.
rm -f ckverify-repro.json
expect 2 "a plugin file that does not exist" -- "$ck" check --impl ./nowhere.so --cases 1
one_line_error "missing plugin"
echo "not an ELF file" > fake.so
expect 2 "a file that is not a shared library" -- "$ck" check --impl ./fake.so --cases 1
grep -q "cannot load it as a shared library" err.txt || { bad "fake.so message"; cat err.txt; }
one_line_error "fake.so"
expect 2 "a shared library without the entry points" -- "$ck" check --impl "$plugins/libckverify_nostamp.so" --cases 1
grep -q "not a ckverify plugin" err.txt || { bad "no-symbol message"; cat err.txt; }
expect 2 "a plugin built for another interface version" -- "$ck" check --impl "$plugins/libckverify_stamp_interface.so" --cases 1
grep -q "interface version 999" err.txt || { bad "interface message"; cat err.txt; }
expect 2 "a plugin built against another LibTorch" -- "$ck" check --impl "$plugins/libckverify_stamp_torch.so" --cases 1
grep -q "built against LibTorch 1.0" err.txt || { bad "torch message"; cat err.txt; }
expect 2 "a plugin built with the other C++ ABI" -- "$ck" check --impl "$plugins/libckverify_stamp_abi.so" --cases 1
grep -q "_GLIBCXX_USE_CXX11_ABI" err.txt || { bad "abi message"; cat err.txt; }
expect 2 "options the plugin refuses" -- "$ck" check --impl "$mis:colour=blue" --cases 1
grep -q "refused its options" err.txt || { bad "option message"; cat err.txt; }
one_line_error "refused options"
expect 2 "a malformed option list" -- "$ck" check --impl "$mis:mode" --cases 1
expect 2 "plugin options separated by colons" -- "$ck" check --impl "$mis:mode=raise:rank=1" --cases 1
grep -q "option mode's value \"raise:rank=1\" holds another option (rank=...)" err.txt ||
  { bad "colon-separated plugin options: message"; cat err.txt; }
expect 2 "a directory as the plugin" -- "$ck" check --impl "$plugins/" --cases 1
[ ! -e ckverify-repro.json ] || bad "a refused run wrote a repro file"

# `faults --fault` names faults only (the faults table itself runs in faults_test.sh).
expect 2 "faults --fault that is not a fault" -- "$ck" faults --fault builtin
one_line_error "faults --fault builtin"
# A selection in which no fault can run here verified nothing (cpu-rng-only needs CUDA).
if ! nvidia-smi >/dev/null 2>&1; then
  expect 1 "faults: none of those named can run here" -- "$ck" faults --fault cpu-rng-only
  grep -q "^FAIL: no fault ran here" out.txt || { bad "faults with nothing run: no FAIL line"; cat out.txt; }
fi

# Workers: the same verdict and report whatever their number.
expect 0 "-j 1" -- "$ck" check --cases 40 -j 1 --json j1.json
expect 0 "-j 2" -- "$ck" check --cases 40 -j 2 --json j2.json
[ "$(canon j1.json)" = "$(canon j2.json)" ] || bad "-j 1 and -j 2 reports differ"
expect 1 "-j 1 on a fault" -- "$ck" check --impl no-preserve-rng --cases 200 -j 1 --json f1.json --repro-file r1.json
expect 1 "-j 2 on a fault" -- "$ck" check --impl no-preserve-rng --cases 200 -j 2 --json f2.json --repro-file r2.json
[ "$(canon f1.json)" = "$(canon f2.json)" ] || { bad "-j 1 and -j 2 failures differ"; diff <(canon f1.json) <(canon f2.json); }

# Shards: disjoint cases, merged into the unsharded verdict.
for k in 1 2 3; do
  expect 0 "shard $k/3" -- "$ck" check --cases 40 --shard $k/3 --json s$k.json
done
expect 0 "merge of passing shards" -- "$ck" merge s1.json s2.json s3.json --json merged.json --junit merged.xml --markdown merged.md
[ "$(canon merged.json)" = "$(canon j1.json)" ] || { bad "merged shards differ from the unsharded run"; diff <(canon merged.json) <(canon j1.json); }
grep -q "<testsuite" merged.xml || bad "merged junit"
for k in 1 2 3; do
  "$ck" check --impl no-preserve-rng --cases 200 --shard $k/3 --json fs$k.json --repro-file fr$k.json >/dev/null 2>&1
done
expect 1 "merge of shards with a failure" -- "$ck" merge fs1.json fs2.json fs3.json --json fmerged.json
python3 - <<'PY' || bad "merged failure differs from the unsharded run"
import json
m, u = json.load(open("fmerged.json")), json.load(open("f1.json"))
for k in ("property", "case_line", "case_index"):
    assert m["failure"][k] == u["failure"][k], (k, m["failure"][k], u["failure"][k])
assert m["cases_run"] == u["cases_run"], (m["cases_run"], u["cases_run"])
assert [p["cases_held"] for p in m["properties"]] == [p["cases_held"] for p in u["properties"]]
PY
# A shard whose failure was edited (its Case, its case line, its case index, its repro) is refused, naming the file.
for edit in "f['case']['layers']=0" "f['case_line']=f['case_line'].replace('seed=','seed=1')" "f['case_index']=1e20" \
  "f['repro']='rm -rf ~'"; do
  for k in 1 2 3; do
    python3 -c "import json,sys; r=json.load(open('fs$k.json')); f=r.get('failure'); exec(sys.argv[1]) if f else None; json.dump(r,open('ft$k.json','w'))" "$edit"
  done
  expect 2 "merge of a shard whose failure was edited: $edit" -- "$ck" merge ft1.json ft2.json ft3.json
  one_line_error "merge of an edited failure: $edit"
  grep -q "^ckverify: ft[123].json: .*\(case\|repro\)" err.txt || { bad "merge: the edited file not named: $edit"; cat err.txt; }
done
expect 2 "merge with a shard missing" -- "$ck" merge s1.json s2.json
grep -q "shard 3/3 is missing" err.txt || { bad "missing shard message"; cat err.txt; }
expect 2 "merge with a shard twice" -- "$ck" merge s1.json s1.json s2.json s3.json
expect 2 "merge of different runs" -- "$ck" merge s1.json s2.json fs3.json
echo '{"tool": "ckverify"' > broken.json
expect 2 "merge of a malformed report" -- "$ck" merge broken.json
one_line_error "malformed report"
python3 -c "print('['*100000 + ']'*100000)" > deep.json
expect 2 "merge of deeply nested JSON" -- "$ck" merge deep.json
expect 2 "merge of a FIFO" -- bash -c "mkfifo pipe.json; timeout 10 '$ck' merge pipe.json"
expect 2 "--shard out of range" -- "$ck" check --cases 4 --shard 4/3
expect 2 "--shard malformed" -- "$ck" check --cases 4 --shard 1/x
expect 2 "-j 0" -- "$ck" check --cases 4 -j 0
expect 2 "--case-timeout 0" -- "$ck" check --cases 4 --case-timeout 0
expect 2 "--only with an unknown field" -- "$ck" check --cases 4 --only colour=red
expect 2 "--only impl" -- "$ck" check --cases 4 --only impl=builtin
expect 0 "--only fixes a field" -- "$ck" check --cases 20 --only fx=none --only prec=fp32 --json only.json
python3 -c "import json; r=json.load(open('only.json')); assert r['only']=='fx=none prec=fp32'" || bad "--only not in the report"
# Fixed fields that contradict each other are named as such, not as a clash with one generated Case.
expect 2 "--only fields that contradict each other" -- "$ck" check --cases 4 --only seqvar=1 --only micro=1
one_line_error "--only fields that contradict each other"
grep -q "cannot apply with the other fields at their defaults: .*seqvar=1 needs micro >= 2" err.txt ||
  { bad "--only contradiction not named"; cat err.txt; }
[ -s out.txt ] && { bad "--only contradiction: a run header before the error"; cat out.txt; }
expect 0 "--only shapes that vary across micro-batches" -- "$ck" check --cases 10 --only micro=2 --only seqvar=1

# Tensor-parallel Cases (docs/parallel.md): tp=2 runs as two ranks and is judged on the gathered records;
# a rank that crashes is a completes finding naming it, and leaves no rank behind; the commands that do not
# run ranks refuse such a Case (exit 2); a fault modelled on Megatron's unreplayed tracker is caught.
expect 0 "check --only tp=2 on the builtin" -- "$ck" check --cases 6 -j 2 --only tp=2 --json tp2.json
grep -q "^held  parallel-consistency on 6/6 cases" out.txt || { bad "tp=2: parallel-consistency not judged on every case"; cat out.txt; }
grep -q "^held  collective-ledger on 6/6 cases" out.txt || { bad "tp=2: collective-ledger not judged on every case"; cat out.txt; }
# Ranks exec'd afresh instead of forked by the worker's fork server: the same report.
expect 0 "check --only tp=2, ranks exec'd" -- env CKV_RANK_FORK_SERVER=0 "$ck" check --cases 6 -j 2 --only tp=2 \
  --json tp2-exec.json
python3 - tp2.json tp2-exec.json <<'PY' || bad "tp=2: the report differs with ranks exec'd"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
for r in (a, b):
    for k in ("elapsed_s", "command"): r.pop(k, None)
sys.exit(a != b)
PY
expect 1 "a plugin that segfaults on ranks" -- env CKV_TEST_MARK=gate-tp-segv "$ck" check --impl "$mis:mode=segv" \
  --plan block --only tp=2 --cases 2 -j 2 --time-budget 20 --json tp-segv.json
grep -q "^FAILED completes" out.txt || { bad "tp segv: headline"; cat out.txt; }
grep -q "ran as 2 ranks and rank [01] crashed (signal 11" tp-segv.json || { bad "tp segv: the rank and signal not named"; cat out.txt; }
sleep 1
alive_marked gate-tp-segv && bad "tp segv: a rank outlived the run"
"$ck" case layers=2 d=8 heads=2 drop=0.3 plan=block tp=2 > tp.json
expect 1 "bench: a plugin that segfaults on ranks" -- "$ck" bench tp.json --impl "$mis:mode=segv" --plans block \
  --repeats 2 --max-repeats 2 --verify-cases 0
grep -q "^FAIL: .*mode=segv.*signal 11" out.txt || { bad "bench tp segv: the plugin and signal not named"; cat out.txt err.txt; }
sleep 1
pgrep -f "ckverify bench tp.json" >/dev/null && bad "bench tp segv: a rank outlived the run"
# A rank killed from outside (a user, a service manager, the out-of-memory killer) is the environment's:
# exit 2, one line, never the implementation's crash. outer_rank MARK WORD: the pid of a rank process (its
# command line has WORD, its parent's has not; or its name, /proc/PID/comm, is WORD: check's ranks are
# forked from the worker's rank fork server, with the worker's command line) of the command run with
# CKV_TEST_MARK=MARK.
outer_rank() {
  local p
  for p in $(grep -lsaF "CKV_TEST_MARK=$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3); do
    [ "$(cat /proc/$p/comm 2>/dev/null)" = "$2" ] && { echo $p; return; }
    tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null | grep -q -- "$2" || continue
    tr '\0' ' ' < /proc/$(awk '{print $4}' /proc/$p/stat 2>/dev/null)/cmdline 2>/dev/null | grep -q -- "$2" && continue
    echo $p; return
  done
}
kill_rank_test() {  # kill_rank_test MARK WORD SIGNAL WHAT -- command...
  local mark="$1" word="$2" sig="$3" what="$4" r="" k pid rc; shift 5
  env CKV_TEST_MARK=$mark "$@" >out.txt 2>err.txt &
  pid=$!
  for k in $(seq 300); do r=$(outer_rank $mark "$word"); [ -n "$r" ] && break; sleep 0.1; done
  [ -n "$r" ] || bad "$what: no rank process found to kill"
  if [ "$word" = ckverify-rank ] && [ -n "$r" ]; then  # check's ranks come from the worker's fork server
    [ "$(cat /proc/$(awk '{print $4}' /proc/$r/stat)/comm)" = ckv-rank-server ] || bad "$what: not forked by the server"
  fi
  sleep 2; [ -n "$r" ] && kill -$sig $r; wait $pid; rc=$?
  [ $rc = 2 ] || { bad "$what: exit $rc, not 2"; cat out.txt err.txt; }
  grep -Eq "(rank [01]|rank fork server \(pid [0-9]+\), which ran the 2 ranks,) was stopped by signal .* from outside ckverify" \
    err.txt || { bad "$what: not named"; cat err.txt; }
  grep -q "^FAIL" out.txt && { bad "$what: blamed on the implementation"; cat out.txt; }
  [ "$(grep -c '^ckverify' err.txt)" = 1 ] || { bad "$what: not one error line"; cat err.txt; }
  sleep 1; alive_marked $mark && bad "$what: a rank outlived the run"
}
kill_rank_test gate-bench-rank-kill "--as-rank" KILL "bench: a rank killed by SIGKILL from outside" -- \
  "$ck" bench tp.json --impl "$mis:mode=hang" --plans block --repeats 2 --max-repeats 2 --verify-cases 0
kill_rank_test gate-bench-rank-term "--as-rank" TERM "bench: a rank stopped by SIGTERM from outside" -- \
  "$ck" bench tp.json --impl "$mis:mode=hang" --plans block --repeats 2 --max-repeats 2 --verify-cases 0
kill_rank_test gate-check-rank-term "ckverify-rank" TERM "check: a rank stopped by SIGTERM from outside" -- \
  "$ck" check --impl "$mis:mode=hang" --plan block --only tp=2 --cases 1 -j 1 --case-timeout 300
kill_rank_test gate-check-server-kill "ckv-rank-server" KILL "check: the rank fork server killed from outside" -- \
  "$ck" check --impl "$mis:mode=hang" --plan block --only tp=2 --cases 1 -j 1 --case-timeout 300
grep -q "rank fork server" err.txt || { bad "the killed fork server: not named"; cat err.txt; }
# A rank fork server stopped from outside (SIGSTOP) holds up its worker's Case without spending the
# Case's time, as a stopped worker does: continued after twice the per-case timeout, the run passes.
env CKV_TEST_MARK=gate-server-stop "$ck" check --only tp=2 --cases 20 -j 1 --case-timeout 4 >out.txt 2>err.txt &
pid=$!
server=""
for k in $(seq 300); do server=$(outer_rank gate-server-stop ckv-rank-server); [ -n "$server" ] && break; sleep 0.1; done
if [ -z "$server" ]; then bad "stopped server: no server found"; else
  kill -STOP "$server"; sleep 8; kill -CONT "$server"
fi
wait $pid; rc=$?
[ $rc = 0 ] || { bad "stopped server: exit $rc, not 0"; cat out.txt err.txt; }
# A rank stopped from outside (SIGSTOP, a debugger) does not spend its Case's time either: continued
# after twice the per-case timeout, the run passes. Left stopped, its peers' collectives time out (30 s)
# and the run is the environment's: exit 2, naming the stop, nothing judged (it was a finding against the
# implementation). stop_a_rank stops a running rank of the marked run (one that is still there).
stop_a_rank() {
  local r k
  for k in $(seq 300); do
    r=$(outer_rank "$1" ckverify-rank)
    if [ -n "$r" ] && kill -STOP "$r" 2>/dev/null; then
      sleep 0.1
      [ "$(awk '{print $3}' /proc/$r/stat 2>/dev/null)" = T ] && { echo "$r"; return; }
    fi
    sleep 0.05
  done
}
env CKV_TEST_MARK=gate-rank-stop "$ck" check --only tp=2 --cases 20 -j 1 --case-timeout 4 >out.txt 2>err.txt &
pid=$!
stopped=$(stop_a_rank gate-rank-stop)
if [ -z "$stopped" ]; then bad "stopped rank: no rank found"; else sleep 8; kill -CONT "$stopped"; fi
wait $pid; rc=$?
[ $rc = 0 ] || { bad "stopped rank: exit $rc, not 0"; cat out.txt err.txt; }
env CKV_TEST_MARK=gate-rank-stop-long "$ck" check --only tp=2 --cases 20 -j 1 >out.txt 2>err.txt &
pid=$!
stopped=$(stop_a_rank gate-rank-stop-long)
[ -n "$stopped" ] || bad "rank stopped for good: no rank found"
wait $pid; rc=$?
[ $rc = 2 ] || { bad "rank stopped for good: exit $rc, not 2"; cat out.txt err.txt; }
grep -q "was stopped from outside ckverify" err.txt || { bad "rank stopped for good: the stop not named"; cat err.txt; }
expect 2 "train refuses a tp=2 Case" -- "$ck" train tp.json
one_line_error "train of a tp=2 Case"
grep -q "runs as ranks" err.txt || { bad "train tp=2: the reason"; cat err.txt; }
python3 -c "import json; c=json.load(open('tp.json')); c['impl']='tracker-not-replayed'; json.dump(c,open('tp-fault.json','w'))"
expect 1 "repro of a tp=2 Case under tracker-not-replayed" -- "$ck" repro tp-fault.json
grep -q "^FAILED rng-replay" out.txt || { bad "tracker-not-replayed: not rng-replay"; cat out.txt; }
# The selective plan (tpkeep=reduced): the builtin's recompute issues no collective; without it, it
# repeats the forward all-reduces.
"$ck" case layers=2 d=8 heads=2 drop=0.3 plan=block tp=2 tpkeep=reduced > tp-keep.json
expect 0 "repro of a tp=2 tpkeep=reduced Case" -- "$ck" repro tp-keep.json
grep -q "^held  collective-ledger: rank 0 issued 4 forward, 0 recompute and 4 backward" out.txt ||
  { bad "tpkeep=reduced: the recompute communicated"; cat out.txt; }
expect 0 "repro of a tp=2 Case" -- "$ck" repro tp.json
grep -q "^held  collective-ledger: rank 0 issued 4 forward, 4 recompute and 4 backward" out.txt ||
  { bad "tp=2: the recompute's collectives not counted"; cat out.txt; }
# A rank that hangs: the per-case timeout ends the Case as a finding (rank 0's baseline passed its first step,
# and its progress reached the worker), and takes every rank with it.
expect 1 "a plugin that hangs on ranks" -- env CKV_TEST_MARK=gate-tp-hang "$ck" check --impl "$mis:mode=hang" \
  --plan block --only tp=2 --cases 1 -j 2 --case-timeout 5 --time-budget 15 --json tp-hang.json
grep -q "per-case timeout of 5 s (--case-timeout), over 10 times what its run without checkpointing takes" \
  tp-hang.json || { bad "tp hang: timeout or rank 0's baseline not named"; cat out.txt; }
sleep 1
alive_marked gate-tp-hang && bad "tp hang: a rank outlived the run"
# A run under test that fails on one rank only: that rank is named, never ckverify (exit 3) or the rank
# that lost its peer. A crash is the rank's exit; an exception leaves the others waiting in a collective,
# and the first rank to fail is the cause.
expect 1 "a plugin that segfaults on rank 1 only" -- "$ck" check --impl "$mis:mode=segv,rank=1" --plan block \
  --only tp=2 --cases 1 -j 1
grep -q "^  detail:  the run under test ran as 2 ranks and rank 1 crashed (signal 11" out.txt ||
  { bad "tp segv on rank 1: not named"; cat out.txt err.txt; }
for r in 0 1; do
  "$ck" case layers=2 d=8 heads=2 plan=block tp=2 "impl=$mis:mode=raise,rank=$r" > tp-raise.json
  expect 1 "a plugin that raises on rank $r only" -- "$ck" repro tp-raise.json
  grep -q "^  detail:  the run under test ran as 2 ranks and its run failed on rank $r first: misbehave: raised" \
    out.txt || { bad "tp raise on rank $r: not named"; cat out.txt err.txt; }
done

# Data-parallel Cases: dp=2 splits each step's micro-batches between two replicas whose reducer averages
# the gradients; the gathered records of the run under test equal the baseline's gathered the same way
# bit for bit, so the fp64 reference is not evaluated (dist_tests compares the replicas with it);
# torch's reentrant design fires a shared parameter's reducer hook twice.
expect 0 "check --only dp=2 on the builtin" -- "$ck" check --cases 4 -j 2 --only dp=2
grep -q "^held  parallel-consistency on 4/4 cases" out.txt || { bad "dp=2: parallel-consistency not judged on every case"; cat out.txt; }
"$ck" case layers=2 d=8 heads=2 drop=0.3 plan=block micro=2 dp=2 tie=blocks > dp.json
expect 0 "repro of a dp=2 Case" -- "$ck" repro dp.json
grep -q "^n/a   grad-reference: the run under test reproduced plain autograd bit for bit" out.txt ||
  { bad "dp=2: the gathered records not those of the baseline"; cat out.txt; }
grep -q "^held  collective-ledger: rank 0 issued 0 forward, 0 recompute and [1-9][0-9]* backward" out.txt ||
  { bad "dp=2: the reducer's collectives not counted"; cat out.txt; }
expect 2 "train refuses a dp=2 Case" -- "$ck" train dp.json
one_line_error "train of a dp=2 Case"
python3 -c "import json; c=json.load(open('dp.json')); c['impl']='reentrant-nested-backward'; json.dump(c,open('dp-fault.json','w'))"
expect 1 "repro of a dp=2 Case under reentrant-nested-backward" -- "$ck" repro dp-fault.json
grep -q "^FAILED collective-ledger" out.txt || { bad "reentrant-nested-backward: not collective-ledger"; cat out.txt; }
grep -q "fired more often than once per backward" out.txt || { bad "reentrant-nested-backward: the reducer not named"; cat out.txt; }

echo "gate_test: $fails failure(s)"
exit $((fails > 0))
