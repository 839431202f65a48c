#!/usr/bin/env bash
# ci/frameworks.sh [--no-setup]: gates the checkpointing of the frameworks in ci/frameworks.txt (fairscale,
# DeepSpeed, transformers) and torch's own wrappers, each with one --impl/--strategy flag, and checks
# that every verdict is still the one the framework table in docs/findings.md records: "pass", or the property
# whose failure the table describes. Then replays fixtures/frameworks/NAME__PROPERTY.json: PROPERTY
# must fail on each. Exit 0 when every verdict is as recorded, 1 when one changed (a framework fixed a
# bug, or ckverify's verdict moved: either way the table needs a look), 2 when it cannot run.
#
# Runs after ci/setup.sh --frameworks (done here unless --no-setup) and a primary build
# (build/verifier/ckverify, or $CKVERIFY). Logs, reports and the shrunk Cases go to
# ${CKVERIFY_FRAMEWORKS_OUT:-out/frameworks}. About 7 minutes on 2 cores. megatron-core needs CUDA:
# ci/gpu.sh is where it would run (not yet packed for the offline device machine).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"
[ "${1:-}" = "--no-setup" ] || bash ci/setup.sh --frameworks || exit 2
ck="${CKVERIFY:-$root/build/verifier/ckverify}"
[ -x "$ck" ] || { echo "frameworks: no ckverify at $ck (build it first: see the README)" >&2; exit 2; }
out="${CKVERIFY_FRAMEWORKS_OUT:-$root/out/frameworks}"
mkdir -p "$out" || exit 2
# DeepSpeed: pick the CPU accelerator without probing for others.
export DS_ACCELERATOR=cpu
cd "$out" || exit 2

changed=0
# gate NAME EXPECTED ARGS...: EXPECTED is "pass" or the property the run must fail with (its headline).
# The table records each framework in one process: tp=1 dp=1 (their tensor- and data-parallel Cases
# are not gated here yet: docs/parallel.md).
gate() {
  local name="$1" expected="$2"; shift 2
  "$ck" check --cases "${CASES:-300}" --time-budget 300 --json "$name.json" --repro-file "$name.repro.json" \
    --only tp=1 --only dp=1 "$@" > "$name.log" 2>&1
  local rc=$? got
  got=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); f=r.get("failure"); print(f["property"] if f else ("pass" if r["exit_code"]==0 else "exit %d" % r["exit_code"]))' "$name.json" 2>/dev/null || echo "exit $rc")
  if [ "$got" = "$expected" ]; then
    printf 'ok       %-22s %s\n' "$name" "$got"
  else
    printf 'CHANGED  %-22s expected %s, got %s (see %s/%s.log)\n' "$name" "$expected" "$got" "$out" "$name"
    changed=$((changed + 1))
  fi
}

fs="py:fairscale.nn.checkpoint:checkpoint_wrapper:@convention=wrapper"
fs_rng="fairscale restores the RNG state without try/finally"
gate fairscale-default         completes        --impl "$fs" --only fx=none
gate fairscale-no-gp           exception-safe   --impl "$fs" --only fx=none --only gp=0
gate fairscale-rng-skipped     autocast-replay  --impl "$fs" --only fx=none --only gp=0 --skip exception-safe --reason "$fs_rng"
gate fairscale-fp32            grad-baseline    --impl "$fs" --only fx=none --only gp=0 --only prec=fp32 --skip exception-safe --reason "$fs_rng"
gate fairscale-fp32-no-hooks   pass             --impl "$fs" --only fx=none --only gp=0 --only prec=fp32 --only hook=none --skip exception-safe --reason "$fs_rng"

ds="py:ckverify.adapters:deepspeed"
ds_known="inputs kept outside save_for_backward; RNG not restored after a throwing recompute"
gate deepspeed-cpu             completes        --impl "$ds" --only fx=none
gate deepspeed                 refuses-inplace  --impl "$ds:cpu_streams=true" --only fx=none --only gp=0
gate deepspeed-known-skipped   autocast-replay  --impl "$ds:cpu_streams=true" --only fx=none --only gp=0 --skip refuses-inplace,exception-safe --reason "$ds_known"
gate deepspeed-fp32            grad-baseline    --impl "$ds:cpu_streams=true" --only fx=none --only gp=0 --only prec=fp32 --skip refuses-inplace,exception-safe --reason "$ds_known"
gate deepspeed-fp32-no-hooks   pass             --impl "$ds:cpu_streams=true" --only fx=none --only gp=0 --only prec=fp32 --only hook=none --only input=trainable --skip refuses-inplace,exception-safe --reason "$ds_known"
gate deepspeed-nr-gp           completes        --impl "$ds:cpu_streams=true,reentrant=false" --only fx=none
gate deepspeed-nr              refuses-inplace  --impl "$ds:cpu_streams=true,reentrant=false" --only fx=none --only gp=0
gate deepspeed-nr-fp32         pass             --impl "$ds:cpu_streams=true,reentrant=false" --only fx=none --only gp=0 --only prec=fp32 --skip refuses-inplace,exception-safe --reason "$ds_known"
CASES=100 gate deepspeed-partition completes    --impl "$ds:cpu_streams=true,partition_activations=true" --only fx=none --only gp=0 --only prec=fp32 --skip refuses-inplace,exception-safe --reason "$ds_known"

hf="py:ckverify.adapters:transformers"
gate transformers-default      completes        --impl "$hf" --only fx=none
gate transformers-no-gp        grad-baseline    --impl "$hf" --only fx=none --only gp=0
gate transformers-no-hooks     recompute-count  --impl "$hf" --only fx=none --only gp=0 --only hook=none
gate transformers-trainable    grad-baseline    --impl "$hf" --only fx=none --only gp=0 --only hook=none --only input=trainable
gate transformers-nonreentrant pass             --impl "$hf:gradient_checkpointing_kwargs={\"use_reentrant\":false}" --only fx=none
gate transformers-offload      refuses-inplace  --impl "$hf:gradient_checkpointing_kwargs={\"use_reentrant\":false},offload=true" --only fx=none
gate transformers-offload-skip pass             --impl "$hf:gradient_checkpointing_kwargs={\"use_reentrant\":false},offload=true" --only fx=none --skip refuses-inplace --reason "save_on_cpu keeps CPU tensors uncopied and unchecked"

gate torch-checkpoint-wrapper  pass             --impl "py:torch.distributed.algorithms._checkpoint.checkpoint_wrapper:checkpoint_wrapper:@convention=wrapper" --only fx=none
gate torch-checkpoint-seq      pass             --strategy "py:ckverify.adapters:checkpoint_sequential:segments=2" --only fx=none

# The fixtures: each shrunk finding replays, and the property in its name fails.
for f in "$root"/fixtures/frameworks/*.json; do
  [ -e "$f" ] || continue
  name=$(basename "$f" .json); prop=${name#*__}
  "$ck" repro "$f" --json "fixture-$name.json" > "fixture-$name.log" 2>&1
  if python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if any(p["property"]==sys.argv[2] and p["failed"] for p in r["properties"]) else 1)' \
       "fixture-$name.json" "$prop" 2>/dev/null; then
    printf 'ok       fixture %s\n' "$name"
  else
    printf 'CHANGED  fixture %s: %s no longer fails (see %s/fixture-%s.log)\n' "$name" "$prop" "$out" "$name"
    changed=$((changed + 1))
  fi
done

if [ "$changed" = 0 ]; then echo "frameworks: every verdict as recorded"; exit 0; fi
echo "frameworks: $changed verdict(s) changed"; exit 1
