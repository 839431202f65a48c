#!/usr/bin/env bash
# verifier/tests/python_gate_test.sh CKVERIFY TMPDIR: Python checkpoint functions through the bridge
# (primary build only; exits 77, which ctest reports as skipped, on a build without it).
#   torch.utils.checkpoint, use_reentrant=False: the default gate finds BatchNorm's running statistics
#     updated again in the recompute (side-effect-once); everything else holds (--only fx=none).
#   torch.utils.checkpoint, use_reentrant=True: holds within its documented limits (no torch.autograd.grad,
#     an input that requires grad, no hooks on shared parameters, fp32); outside them ckverify finds each.
#   both modes on parameters edited in place between micro-batches (inplace_on=param): they hold.
#   preserve_rng_state=False must be killed by rng-replay.
#   bad specs: one line, exit 2.
#   the bridge: the recompute flag from Python (fx Cases), copy-based designs on inplace Cases, the
#     Segment module's parameters and indices, the wrapper and @args conventions, JSON option values.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ck="$1"; tmp="$2"
rm -rf "$tmp"; mkdir -p "$tmp"; cd "$tmp"
if "$ck" check --impl py:torch.utils.checkpoint:checkpoint --cases 1 2>&1 | grep -q "no Python bridge"; then
  echo "SKIP: this build has no Python bridge (the floor build on Debian's LibTorch)"; exit 77
fi
source "$here/lib.sh"
tuc=py:torch.utils.checkpoint:checkpoint

expect 1 "use_reentrant=false: the default gate" -- "$ck" check --impl $tuc:use_reentrant=false --cases 300 --time-budget 120
grep -q "^FAILED side-effect-once" out.txt || { bad "use_reentrant=false headline"; cat out.txt; }
grep -q "bn.running_mean" out.txt || bad "the BatchNorm statistics are not named"
grep -q "context_fn=ckverify.recompute_aware_context" out.txt && ! grep -q "SegmentScope" out.txt ||
  { bad "side-effect-once: not told how Python marks a recompute"; cat out.txt; }
# Without tensor parallelism (tp=1): called plainly, torch.utils.checkpoint replays the default generators
# only, not the model-parallel stream of a tp Case (below).
expect 0 "use_reentrant=false without side-effecting modules" -- "$ck" check --impl $tuc:use_reentrant=false --only fx=none \
  --only tp=1 --cases 300 --time-budget 150 --json nonreentrant.json
# use_reentrant=true's nested backward runs a shared parameter's accumulator, and so a DDP reducer's hook,
# once per nested backward (torch documents reentrant checkpointing under DDP as unsupported unless
# static_graph=True): its documented limits include dp=1 (below: the finding at dp=2).
expect 0 "use_reentrant=true within its documented limits" -- "$ck" check --impl $tuc:use_reentrant=true --only fx=none \
  --only gp=0 --only input=trainable --only hook=none --only prec=fp32 --only tp=1 --only dp=1 --cases 300 --time-budget 150
# Parameters edited in place between micro-batches: both modes recompute from the values their forward read.
for mode in false true; do
  limits=(); [ $mode = true ] && limits=(--only gp=0 --only input=trainable --only hook=none --only prec=fp32)
  expect 0 "use_reentrant=$mode, parameters edited between micro-batches" -- "$ck" check --impl $tuc:use_reentrant=$mode \
    --only fx=none "${limits[@]}" --only inplace=true --only inplace_on=param --only micro=3 --only inplace_micro=1 \
    --cases 40
  grep -q "^held  refuses-inplace on" out.txt || { bad "use_reentrant=$mode param edits: refuses-inplace not judged"; cat out.txt; }
done
expect 1 "use_reentrant=true loses a tied weight's gradient under bf16 autocast" -- "$ck" repro \
  "$here/../../fixtures/python/torch-reentrant-tied-head-autocast-cache__grad-baseline.json"
grep -q "head.weight.grad" out.txt || { bad "tied head finding"; cat out.txt; }
expect 1 "use_reentrant=true with a gradient penalty" -- "$ck" check --impl $tuc:use_reentrant=true --only fx=none --only gp=0.1 --plan block --cases 20
grep -q "incompatible with .grad()" out.txt || { bad "reentrant gp"; cat out.txt; }
expect 1 "preserve_rng_state=false is killed by rng-replay" -- "$ck" check --impl $tuc:use_reentrant=false,preserve_rng_state=false \
  --only fx=none --cases 300
grep -q "^FAILED rng-replay" out.txt || { bad "preserve_rng_state=false headline"; cat out.txt; }
expect 1 "and it replays" -- "$ck" repro ckverify-repro.json
grep -q "^FAILED rng-replay" out.txt || bad "repro of preserve_rng_state=false"

expect 2 "a module that does not exist" -- "$ck" check --impl py:no_such_module:fn --cases 1
grep -q "cannot import Python module no_such_module" err.txt || { bad "import message"; cat err.txt; }
one_line_error "missing module"
[ ! -s out.txt ] || { bad "a module that does not exist: output before the error"; cat out.txt; }
expect 2 "a callable that does not exist" -- "$ck" check --impl py:torch.utils.checkpoint:nothing_here --cases 1
one_line_error "missing callable"
expect 2 "a spec without a callable" -- "$ck" check --impl py:torch --cases 1
one_line_error "no callable"
expect 1 "an option the function does not take is the implementation's error" -- "$ck" check --impl $tuc:use_reentrant=false,colour=1 --only fx=none --plan block --cases 3
grep -q "keyword argument(s) colour" out.txt || { bad "unexpected kwarg"; cat out.txt; }

# The recompute flag from Python: torch's non-reentrant checkpoint with ckverify's recompute-aware
# context_fn passes the default gate, side-effecting modules included; the same without marking the
# recompute fails side-effect-once.
export PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}"
# SIGINT to train (Ctrl-C): Python turns it into a KeyboardInterrupt inside the implementation, which is
# nobody's finding: the command ends with 130, as without Python.
"$ck" case layers=2 d=8 heads=2 steps=300 plan=block impl=py:ckverify_test_impls:slow_plain > slow.json
"$ck" train slow.json >out.txt 2>err.txt &
pid=$!; sleep 5; kill -INT $pid; wait $pid; rc=$?
[ $rc = 130 ] || { bad "train interrupted with a Python implementation: exit $rc, not 130"; cat out.txt err.txt; }
grep -q "^FAIL" out.txt && { bad "train interrupted with a Python implementation: a FAIL verdict"; cat out.txt; }
# So does bench, at once: no round after the signal, no file written.
"$ck" bench slow.json --impl py:ckverify_test_impls:slow_plain --plans block --repeats 200 --max-repeats 200 \
  --verify-cases 0 --json int.json >out.txt 2>err.txt &
pid=$!; sleep 5; kill -INT $pid; t0=$SECONDS; wait $pid; rc=$?
[ $rc = 130 ] || { bad "bench interrupted with a Python implementation: exit $rc, not 130"; cat out.txt err.txt; }
[ $((SECONDS - t0)) -le 3 ] || bad "bench with a Python implementation went on $((SECONDS - t0)) s after SIGINT"
[ -e int.json ] && bad "an interrupted bench wrote its --json"
# What the processes that run an implementation leave in TMPDIR (torch's import leaves a directory per
# process; this module leaves one per call) goes with the run, for every command that runs one.
mkdir -p tmpd
expect 0 "check: TMPDIR left clean" -- env TMPDIR="$PWD/tmpd" "$ck" check --impl py:ckverify_test_impls:leaves_tempdir \
  --only fx=none --cases 3 -j 2
[ -z "$(ls -A tmpd)" ] || bad "check left in TMPDIR: $(ls tmpd)"
"$ck" case layers=2 d=8 heads=2 steps=1 plan=block impl=py:ckverify_test_impls:leaves_tempdir > tmpd-case.json
expect 0 "train: TMPDIR left clean" -- env TMPDIR="$PWD/tmpd" "$ck" train tmpd-case.json
[ -z "$(ls -A tmpd)" ] || bad "train left in TMPDIR: $(ls tmpd)"

expect 0 "torch's checkpoint marking its recomputes passes fx Cases" -- "$ck" check --impl py:ckverify.adapters:torch_checkpoint \
  --only fx=counter,log,bn,cache,noise --only batch=2 --only seq=4 --cases 60 --time-budget 100
# Tensor-parallel Cases: the adapter hands torch's checkpoint the model-parallel stream the segment shows
# (context_fn); torch.utils.checkpoint called plainly replays the default generators only, and draws new
# masks inside the tensor-parallel regions (why Megatron checkpoints with its own function).
expect 0 "torch's checkpoint through the adapter on tp=2 Cases" -- "$ck" check --impl py:ckverify.adapters:torch_checkpoint \
  --only tp=2 --only fx=none --cases 6 --time-budget 150
"$ck" case layers=2 d=8 heads=2 drop=0.3 plan=block tp=2 > tp-plain.json
python3 -c "import json,sys; c=json.load(open('tp-plain.json')); c['impl']=sys.argv[1]; json.dump(c,open('tp-plain.json','w'))" \
  "$tuc:use_reentrant=false"
expect 1 "torch.utils.checkpoint not told of the tracker on a tp=2 Case" -- "$ck" repro tp-plain.json
grep -q "^FAILED rng-replay" out.txt || { bad "plain torch checkpoint on tp=2: not rng-replay"; cat out.txt; }
grep -q "inside a tensor-parallel region and draws from the model-parallel stream" out.txt ||
  { bad "plain torch checkpoint on tp=2: the stream not named"; cat out.txt; }
# Data-parallel Cases: the adapter (non-reentrant) passes; use_reentrant=true on blocks that share their
# weights fires the reducer's hook of each shared parameter once per nested backward.
expect 0 "torch's checkpoint through the adapter on dp=2 Cases" -- "$ck" check --impl py:ckverify.adapters:torch_checkpoint \
  --only dp=2 --only fx=none --cases 6 --time-budget 150
"$ck" case layers=2 d=8 heads=2 drop=0.3 plan=block micro=2 dp=2 tie=blocks > dp-reentrant.json
python3 -c "import json,sys; c=json.load(open('dp-reentrant.json')); c['impl']=sys.argv[1]; json.dump(c,open('dp-reentrant.json','w'))" \
  "$tuc:use_reentrant=true"
expect 1 "torch.utils.checkpoint(use_reentrant=True) under a data-parallel reducer" -- "$ck" repro dp-reentrant.json
grep -q "^FAILED collective-ledger" out.txt || { bad "use_reentrant=true on dp=2: not collective-ledger"; cat out.txt; }
grep -q "fired more often than once per backward" out.txt || { bad "use_reentrant=true on dp=2: the reducer not named"; cat out.txt; }
expect 1 "a recompute marked as a first forward fails side-effect-once" -- "$ck" check \
  --impl py:ckverify_test_impls:forgets_recompute --only fx=counter,log,bn,cache --only batch=2 --only seq=4 --cases 60
grep -q "^FAILED side-effect-once" out.txt || { bad "forgets_recompute headline"; cat out.txt; }
# State kept across calls in a long-lived worker: the failure is not shrunk into a Case that passes
# alone; it keeps the Case first found, says it needs its worker's history, writes that history
# beside the repro file, and `repro --history` (not `repro` alone) replays the failure.
rm -f hist-repro.json hist-repro.history.json
expect 1 "an implementation correct only for its first calls in a process" -- "$ck" check \
  --impl py:ckverify_test_impls:stateful:after=40 --only fx=none --only drop=0.1,0.1,0.1,0.1 --cases 40 -j 1 \
  --repro-file hist-repro.json --json hist.json
grep -q "^  history: it fails only after the [0-9]* case(s) its worker process ran before it" out.txt ||
  { bad "stateful: no history line"; cat out.txt; }
grep -q "ckverify repro hist-repro.json --history hist-repro.history.json" out.txt || { bad "stateful: repro line"; cat out.txt; }
python3 -c "import json; f=json.load(open('hist.json'))['failure']; assert f['history_file']=='hist-repro.history.json', f" ||
  bad "stateful: the JSON report does not name the history file"
expect 0 "its Case alone passes" -- "$ck" repro hist-repro.json
expect 1 "and fails after its history" -- "$ck" repro hist-repro.json --history hist-repro.history.json
grep -q "^FAILED rng-replay" out.txt || { bad "repro --history headline"; cat out.txt; }
# A cache across calls misleads the shrink (after earlier Cases, every call hits it), while the Case
# first found fails on its own (two calls share shapes): the shrink runs again with every candidate
# alone in a fresh worker, and its Case fails alone (steps=2: the second step hits the first's entry).
# The fields are pinned so that the fresh shrink (a worker start per candidate) stays short.
expect 1 "a cache keyed by shape is shrunk in fresh workers" -- "$ck" check \
  --impl py:ckverify_test_impls:caches_by_shape --only fx=none --only layers=1 --only d=4 --only heads=1 --only batch=1 \
  --only seq=2 --only ffn=1 --only vocab=2 --only drop=0,0,0,0 --only norm=layernorm --only pos=pre --only act=relu \
  --cases 40 -j 1 --repro-file cache-repro.json
grep -q "^  history: .*shrunk again with every candidate alone in a fresh worker process ([1-9][0-9]* step(s))" out.txt &&
  grep -q "^  case: .* steps=2 " out.txt || { bad "cache: not shrunk in fresh workers"; cat out.txt; }
expect 1 "its Case fails alone" -- "$ck" repro cache-repro.json
echo '[{"not": "a case"}]' > bad-history.json
expect 2 "a history that is not Cases" -- "$ck" repro hist-repro.json --history bad-history.json
one_line_error "bad history"
# Loading counts against the time budget: a module whose import takes 60 s ends a 5 s run near 5 s.
mkdir -p slowmod && printf 'import time\ntime.sleep(60)\ndef ck(segment, *args):\n    return segment(*args)\n' > slowmod/slow_import.py
start=$(date +%s)
PYTHONPATH="$PWD/slowmod:$PYTHONPATH" "$ck" check --impl py:slow_import:ck --cases 5 -j 1 --time-budget 5 >out.txt 2>err.txt
[ $(( $(date +%s) - start )) -le 25 ] || bad "a 60 s import held a 5 s run for $(( $(date +%s) - start )) s"
grep -q "time budget reached" out.txt || { bad "slow import: no budget headline"; cat out.txt err.txt; }
# A Python exception is a finding with its whole traceback: on the console under `trace:`, in the JSON
# report's failure.trace, from the forward and from a recompute in backward (raised through LibTorch).
expect 1 "a Python implementation that raises in its recompute" -- "$ck" check \
  --impl py:ckverify_test_impls:raises_in_recompute --only fx=none --plan block --cases 3 --json raises.json
grep -q "^FAILED completes" out.txt || { bad "raises_in_recompute headline"; cat out.txt; }
grep -q "^  trace:   Traceback (most recent call last):" out.txt || { bad "no traceback on the console"; cat out.txt; }
python3 -c "
import json; t=json.load(open('raises.json'))['failure']['trace']
assert 'in _recompute_failure' in t and 'ValueError: raised in the recompute' in t, t" || bad "recompute traceback in the report"
expect 1 "a Python implementation that raises in its forward" -- "$ck" check \
  --impl py:ckverify_test_impls:raises_in_forward --only fx=none --plan block --cases 3 --json raises.json --junit raises.xml
python3 -c "
import json; t=json.load(open('raises.json'))['failure']['trace']
assert 'in _forward_failure' in t and 'KeyError' in t, t" || bad "forward traceback in the report"
grep -q "in _forward_failure" raises.xml || bad "forward traceback in the JUnit report"
# A correct design that recomputes from its own copies passes refuses-inplace (its gradients are those of
# the forward it ran). torch.autograd.graph.save_on_cpu on CPU tensors keeps the tensor itself (.cpu() of
# a CPU tensor is no copy) and drops autograd's version check: an in-place change reaches the recompute
# silently, which ckverify finds (docs/torch_save_on_cpu_inplace.py shows it in plain PyTorch).
expect 0 "a clone per call passes inplace Cases" -- "$ck" check --impl py:ckverify_test_impls:clone_per_call \
  --only inplace=true --cases 40 --json clone.json
python3 -c "import json,sys; r=json.load(open('clone.json')); p=[x for x in r['properties'] if x['property']=='refuses-inplace'][0]; sys.exit(0 if p['cases_held']>0 else 1)" \
  || bad "refuses-inplace was never judged on the clone-per-call implementation"
expect 1 "save_on_cpu around a reentrant checkpoint lets an in-place change through" -- "$ck" check \
  --impl py:ckverify_test_impls:offloaded --only inplace=true --only fx=none --only gp=0 --only input=trainable \
  --only hook=none --only prec=fp32 --cases 40
grep -q "^FAILED refuses-inplace" out.txt || { bad "save_on_cpu headline"; cat out.txt; }
grep -q "not those of the forward that ran" out.txt || { bad "save_on_cpu message"; cat out.txt; }
# What the bridge passes: a ckverify.Segment module with the segment's parameters, index, step, micro.
expect 0 "the segment's parameters, index, step and micro-batch" -- "$ck" check --impl py:ckverify_test_impls:introspect \
  --only fx=none --cases 40
# Conventions: module wrappers, extra positional arguments, selective checkpointing with an op list.
expect 0 "torch.distributed's checkpoint_wrapper (@convention=wrapper)" -- "$ck" check \
  --impl py:torch.distributed.algorithms._checkpoint.checkpoint_wrapper:checkpoint_wrapper:@convention=wrapper \
  --only fx=none --cases 40
expect 2 "a positional flag that would take the hidden state is refused" -- "$ck" check --impl py:ckverify_test_impls:megatron_like --cases 1
grep -q "distribute_saved_activations would take the segment's hidden state" err.txt || { bad "misbinding message"; cat err.txt; }
one_line_error "misbinding"
expect 0 "the flag given with @args" -- "$ck" check --impl 'py:ckverify_test_impls:megatron_like:@args=[false]' --only fx=none --cases 20
# Selective checkpointing: saving bmm and addmm outputs holds; saving mm outputs corrupts the gradients,
# because SAC's cached mm output is mutated in place through matmul's _unsafe_view alias by LibTorch's
# nn::Linear bias add, unseen by SAC's version check (docs/torch_sac_unsafe_view_mutation.py).
sac='py:ckverify.adapters:selective:ops=["aten.addmm.default","aten.bmm.default"]'
expect 0 "selective checkpointing saving bmm and addmm" -- "$ck" check --impl "$sac" --only gp=0 --cases 40
expect 1 "selective checkpointing saving mm: the cached output mutated through an alias" -- "$ck" check \
  --impl 'py:ckverify.adapters:selective:ops=["aten.mm.default"]' --only gp=0 --cases 40
grep -q "^FAILED grad-baseline" out.txt || { bad "SAC mm headline"; cat out.txt; }
expect 1 "selective checkpointing refuses a double backward (torch's documented limit)" -- "$ck" check --impl "$sac" \
  --only gp=0.1 --plan block --cases 5
grep -q "only allowed to backward once" out.txt || { bad "SAC double backward"; cat out.txt; }
expect 2 "selective with an op torch does not have" -- "$ck" check --impl 'py:ckverify.adapters:selective:ops=["aten.no_such_op"]' --cases 1
grep -q "torch has no op aten.no_such_op" err.txt || { bad "selective op message"; cat err.txt; }
expect 2 "the recompute-aware adapter on torch's reentrant mode" -- "$ck" check \
  --impl py:ckverify.adapters:torch_checkpoint:use_reentrant=true --cases 1
grep -q "use_reentrant=true needs recompute_aware=false" err.txt || { bad "reentrant adapter message"; cat err.txt; }
expect 2 "an unknown convention" -- "$ck" check --impl py:torch.utils.checkpoint:checkpoint:@convention=sideways --cases 1
one_line_error "unknown convention"
expect 2 "an unclosed JSON value" -- "$ck" check --impl 'py:ckverify.adapters:selective:ops=["aten.mm' --cases 1
one_line_error "unclosed JSON"
expect 2 "an option a callable without **kwargs does not take" -- "$ck" check --impl py:ckverify_test_impls:clone_per_call:colour=1 --cases 1
grep -q "no keyword parameter colour" err.txt || { bad "unknown keyword message"; cat err.txt; }

# Strategies: seed 001's lab strategies (examples/strategies/lab.py) pass; the floor-division segment
# split, which skips the last blocks, fails naming the first block it never ran.
export PYTHONPATH="$here/../../examples/strategies:$PYTHONPATH"
for s in run_with_checkpointing run_with_selective_checkpointing:checkpoint_every_n=2 \
         run_with_segment_checkpointing:num_segments=2 run_with_hybrid_checkpointing:checkpoint_start_layer=1 \
         run_with_checkpoint_sequential:segments=2; do
  expect 0 "strategy $s" -- "$ck" check --strategy "py:lab:$s" --only fx=none --cases 30 --json "strategy-${s%%:*}.json"
done
python3 - <<'PY' || bad "the effective plans of the lab strategies"
import json
r = json.load(open("strategy-run_with_selective_checkpointing.json"))
assert r["plan"] == "strategy", r["plan"]
p = [x for x in r["properties"] if x["property"] == "recompute-count"][0]
assert p["cases_held"] > 0, p
PY
# torch's checkpoint_sequential through the adapter that puts (blocks, x) in its parameter order; the
# adapter names its own convention, so --strategy takes it as it is.
expect 0 "checkpoint_sequential as a strategy" -- "$ck" check --strategy py:ckverify.adapters:checkpoint_sequential:segments=3 \
  --only fx=none --cases 30
# The framework adapters check up front that their framework is there (ci/setup.sh --frameworks installs
# them; ci/frameworks.sh gates them): without it, one line naming the module, exit 2.
for a in deepspeed transformers; do
  if "$here/../../.venv/bin/python" -c "import $a" >/dev/null 2>&1; then
    echo "SKIP: $a is installed in .venv, so its missing-framework error cannot be shown (ci/frameworks.sh gates it)"
  else
    expect 2 "the $a adapter without $a" -- "$ck" check --impl py:ckverify.adapters:$a --cases 1
    grep -q "No module named '$a'" err.txt || { bad "the $a adapter's message"; cat err.txt; }
    one_line_error "the $a adapter without $a"
  fi
done
expect 0 "a strategy whose plan changes after the first step" -- "$ck" check \
  --strategy py:ckverify_test_impls:checkpoint_after_first_step --only fx=none --cases 30
expect 1 "a strategy that draws random numbers of its own" -- "$ck" check \
  --strategy py:ckverify_test_impls:draws_its_own --only fx=none --cases 30
grep -q "^FAILED side-effect-once" out.txt && grep -q "or the strategy drawing random numbers of its own" out.txt ||
  { bad "a strategy drawing its own random numbers: finding or hint"; cat out.txt; }
expect 1 "a strategy that skips blocks" -- "$ck" check --strategy py:lab:run_with_segment_checkpointing_floor_bug:num_segments=2 \
  --only fx=none --cases 60
grep -q "^FAILED recompute-count" out.txt || { bad "floor-bug headline"; cat out.txt; }
# The module came from PYTHONPATH: the printed repro command carries it, so a fresh shell replays it.
grep -q "^  repro:   PYTHONPATH=.*examples/strategies.* ckverify repro ckverify-repro.json" out.txt \
  || { bad "the repro command lacks PYTHONPATH"; cat out.txt; }
grep -q "where: *step [0-9]* micro [0-9]* block [0-9]" out.txt && grep -q "its forward ran 0 time" out.txt || { bad "floor-bug does not name the block"; cat out.txt; }
expect 1 "and it replays" -- "$ck" repro ckverify-repro.json
grep -q "^FAILED recompute-count" out.txt || bad "repro of the floor bug"
# bench: implementations side by side in one process, in both orders. ckverify's checkpoint installs its
# saved-tensor-hooks engine over Python's; torch.utils.checkpoint must still recompute (its hooks) and a
# Python exception raised in its recompute must keep its message (exception-safe).
"$ck" case layers=3 d=8 heads=2 ffn=2 vocab=5 batch=2 seq=8 seed=3 > side.json
for order in "builtin,$tuc:use_reentrant=false" "$tuc:use_reentrant=false,builtin"; do
  expect 0 "bench --impl $order" -- "$ck" bench side.json --plans block --impl "$order" --verify-cases 20 --only fx=none \
    --repeats 6 --max-repeats 8 --json side-bench.json
  [ "$(grep -c '^block .* held (20)' out.txt)" = 2 ] || { bad "bench --impl $order: both verified"; cat out.txt; }
  grep -q "^  block .*\[2\] [0-9.]*x \[" out.txt || { bad "bench --impl $order: the comparison"; cat out.txt; }
  python3 -c "import json; r=json.load(open('side-bench.json')); c=r['comparisons'][0]; assert len(r['impls'])==2 and c['plan']=='block' and 6 <= r['rounds'] <= 8 and c['coverage'] >= 0.95 and isinstance(c['within_noise'], bool), (r['rounds'], c)" \
    || bad "bench --impl $order: json"
done

# bench: strategies beside the plans, each with the gate's verdict (the verified column).
"$ck" case layers=4 d=16 heads=2 ffn=2 vocab=7 batch=2 seq=8 steps=3 attn=off seed=3 > lab-case.json
expect 1 "bench with strategies, one of them wrong" -- "$ck" bench lab-case.json --plans every2 \
  --strategy py:lab:run_with_selective_checkpointing:checkpoint_every_n=2 \
  --strategy py:lab:run_with_segment_checkpointing_floor_bug:num_segments=3 --warmup 0 --repeats 1 --verify-cases 20 \
  --only fx=none --json lab-bench.json --out lab-report
grep -q "^lab:run_with_selective_checkpointing:checkpoint_every_n=2 .* held (20)" out.txt || { bad "bench: the correct strategy's row"; cat out.txt; }
grep -q "^lab:run_with_segment_checkpointing_floor_bug:num_segments=3 .*FAILED recompute-count" out.txt || { bad "bench: the wrong strategy's row"; cat out.txt; }
grep -q "^every2 .* held (20)" out.txt || { bad "bench: the plan's verdict"; cat out.txt; }
grep -q "FAILED recompute-count |" lab-report/report.md || bad "bench report: the verified column"
python3 -c "import json; r=json.load(open('lab-bench.json')); v={p['plan']: p.get('verified') for p in r['plans']}; assert v['lab:run_with_selective_checkpointing:checkpoint_every_n=2'].startswith('held'), v" \
  || bad "bench json: verified"
expect 2 "--strategy with --plan" -- "$ck" check --strategy py:lab:run_with_checkpointing --plan block --cases 1
expect 2 "a strategy spec with an unclosed bracket" -- "$ck" check --strategy "py:lab:run_with_checkpointing:n=[1,2" --cases 1
grep -q "^ckverify: --strategy py:lab:run_with_checkpointing:n=\[1,2: an option value has an unclosed" err.txt ||
  { bad "a strategy spec's error names --strategy as given"; cat err.txt; }
# ckverify.checkpoint_context(*group): a strategy checkpointing groups of blocks with torch's checkpoint
# keeps both contracts with it, the recompute marked (fx=) and the tracker's streams replayed (tp=2).
expect 0 "a strategy on ckverify.checkpoint_context, fx= and tp=2" -- "$ck" check --strategy py:ckverify_test_impls:grouped \
  --only fx=counter,noise --only tp=2 --only drop=0,0,0.3,0 --cases 2 -j 1
grep -q "^held  rng-replay on 2/2 cases" out.txt && grep -q "^held  side-effect-once on 2/2 cases" out.txt ||
  { bad "checkpoint_context: rng-replay or side-effect-once not judged on both"; cat out.txt; }
# Options after the callable are separated by commas: a colon-separated second option would be read into the
# first one's value (a string), and the run would go on with neither.
expect 2 "a strategy spec with its options separated by colons" -- "$ck" check \
  --strategy "py:lab:run_with_checkpointing:n=2:m=3" --cases 1
grep -q "option n's value \"2:m=3\" holds another option (m=...): options are separated by commas" err.txt ||
  { bad "colon-separated options: message"; cat err.txt; }
expect 2 "--strategy with --impl builtin" -- "$ck" check --strategy py:lab:run_with_checkpointing --impl builtin --cases 1
grep -q "exclusive" err.txt || { bad "--strategy with --impl builtin: message"; cat err.txt; }
one_line_error "strategy with plan"
expect 2 "a strategy that cannot take (blocks, x)" -- "$ck" check --strategy py:ckverify_test_impls:one_argument --cases 1
one_line_error "strategy signature"
# bench on ranks: a row that fails on one rank only (its peers waiting in its collectives) ends the bench
# at once as a finding naming the rank and the error, or the signal; no rank is left behind.
"$ck" case layers=2 d=8 heads=2 drop=0.3 plan=block tp=2 steps=2 > pg-bench-tp.json
for how in raise abort; do
  start=$(date +%s)
  expect 1 "bench: an implementation that does $how on rank 1 only" -- timeout 120 "$ck" bench pg-bench-tp.json \
    --impl py:ckverify_test_impls:fails_on_rank:how=$how --plans block --repeats 2 --max-repeats 2 --verify-cases 0
  [ $(( $(date +%s) - start )) -le 60 ] || bad "bench $how on one rank took $(( $(date +%s) - start )) s"
  want="^FAIL: rank 1: plan block: .*raised on rank 1 only"
  [ $how = abort ] && want="^FAIL: .*fails_on_rank.*signal 6"
  grep -q "$want" out.txt || { bad "bench $how on one rank: not named"; cat out.txt err.txt; }
done
sleep 1
pgrep -f "ckverify bench pg-bench-tp.json" >/dev/null && bad "bench on ranks: a rank outlived the run"

echo "python_gate_test: $fails failure(s)"
exit $((fails > 0))
