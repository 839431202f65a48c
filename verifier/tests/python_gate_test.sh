#!/usr/bin/env bash
# verifier/tests/python_gate_test.sh CKVERIFY TMPDIR: Python checkpoint functions through the bridge
# (primary build only; exits 77, which ctest reports as skipped, on a build without it).
#   torch.utils.checkpoint, use_reentrant=False: the default gate finds BatchNorm's running statistics
#     updated again in the recompute (side-effect-once); everything else holds (--only fx=none).
#   torch.utils.checkpoint, use_reentrant=True: holds within its documented limits (no torch.autograd.grad,
#     an input that requires grad, no hooks on shared parameters, fp32); outside them ckverify finds each.
#   preserve_rng_state=False must be killed by rng-replay.
#   bad specs: one line, exit 2.
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
expect 0 "use_reentrant=false without side-effecting modules" -- "$ck" check --impl $tuc:use_reentrant=false --only fx=none \
  --cases 300 --time-budget 150 --json nonreentrant.json
expect 0 "use_reentrant=true within its documented limits" -- "$ck" check --impl $tuc:use_reentrant=true --only fx=none \
  --only gp=0 --only input=trainable --only hook=none --only prec=fp32 --cases 300 --time-budget 150
expect 1 "use_reentrant=true loses a tied weight's gradient under bf16 autocast" -- "$ck" repro \
  "$here/../../fixtures/python/torch-reentrant-tied-head-autocast-cache__grad-baseline.json"
grep -q "head.weight.grad" out.txt || { bad "tied head finding"; cat out.txt; }
expect 1 "use_reentrant=true with a gradient penalty" -- "$ck" check --impl $tuc:use_reentrant=true --only fx=none --only gp=0.1 --cases 20
grep -q "incompatible with .grad()" out.txt || { bad "reentrant gp"; cat out.txt; }
expect 1 "preserve_rng_state=false is killed by rng-replay" -- "$ck" check --impl $tuc:use_reentrant=false,preserve_rng_state=false \
  --only fx=none --cases 300
grep -q "^FAILED rng-replay" out.txt || { bad "preserve_rng_state=false headline"; cat out.txt; }
expect 1 "and it replays" -- "$ck" repro ckverify-repro.json
grep -q "^FAILED rng-replay" out.txt || bad "repro of preserve_rng_state=false"

expect 2 "a module that does not exist" -- "$ck" check --impl py:no_such_module:fn --cases 1
grep -q "cannot import Python module no_such_module" err.txt || { bad "import message"; cat err.txt; }
one_line_error "missing module"
expect 2 "a callable that does not exist" -- "$ck" check --impl py:torch.utils.checkpoint:nothing_here --cases 1
one_line_error "missing callable"
expect 2 "a spec without a callable" -- "$ck" check --impl py:torch --cases 1
one_line_error "no callable"
expect 1 "an option the function does not take is the implementation's error" -- "$ck" check --impl $tuc:use_reentrant=false,colour=1 --only fx=none --cases 3
grep -q "keyword argument(s) colour" out.txt || { bad "unexpected kwarg"; cat out.txt; }
echo "python_gate_test: $fails failure(s)"
exit $((fails > 0))
