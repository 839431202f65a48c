#!/usr/bin/env bash
# verifier/tests/faults_test.sh CKVERIFY TMPDIR [PLUGIN_DIR]: `ckverify faults` kills every fault of the
# built-in table within 500 generated cases, each by the property that names it (faults_table_check.sh);
# with PLUGIN_DIR (the primary build's plugins), the faults plugin's copies are killed through the loader
# exactly as the built-in ones: the same property, after the same number of cases, shrunk alike.
# Its own ctest test (not a section of cli_tests or gate_tests) so that ctest -j runs it beside them.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ck="$1"; tmp="$2"; plugins="${3:-}"
rm -rf "$tmp"; mkdir -p "$tmp"; cd "$tmp"
source "$here/lib.sh"

expect 0 "faults through the built-in table" -- "$ck" faults --cases 500 --json builtin.json
bash "$here/faults_table_check.sh" "$ck" out.txt builtin.json || bad "the faults table"

if [ -n "$plugins" ]; then
  # One or two faults per property: the plugin compiles the same fault code; what differs is the
  # loading and the options.
  through=no-preserve-rng,replays-effects,keep-activations,no-autocast-replay,recompute-twice,single-recompute
  through+=,no-version-check,no-restore-on-throw,inputs-only-grad
  expect 0 "faults through the plugin loader" -- "$ck" faults --plugin "$plugins/libckverify_faults.so" --cases 500 \
    --fault "$through" --json via-plugin.json
  [ "$(grep -c "^[a-z-]* \+[a-z-]\+ \+[0-9]\+ " out.txt)" = 9 ] || { bad "faults --fault: not the 9 faults named"; cat out.txt; }
  python3 - <<'PY' || bad "the plugin path kills differently from the built-in path"
import json, re
a = {r["fault"]: r for r in json.load(open("builtin.json"))["faults"]}
b = {r["fault"]: r for r in json.load(open("via-plugin.json"))["faults"]}
strip = lambda s: re.sub(r" impl=\S+", "", s)
n = 0
for name, r in b.items():
    if not r["run"]:
        assert a[name]["expected"] == "resume" or not a[name]["run"], name
        continue
    x = a[name]
    assert r["killed"] and r["killed_by"] == x["killed_by"], (name, r, x)
    assert r["cases_to_kill"] == x["cases_to_kill"], (name, r["cases_to_kill"], x["cases_to_kill"])
    # A shrink the time budget cut short ends where the machine's speed left it: not comparable.
    if not r["shrink_cut_short"] and not x["shrink_cut_short"]:
        assert strip(r["shrunk_case"]) == strip(x["shrunk_case"]), (name, r["shrunk_case"], x["shrunk_case"])
    n += 1
assert n == 9, n
print(f"{n} faults killed identically through the plugin")
PY
fi
echo "faults_test: $fails failure(s)"
exit $((fails > 0))
