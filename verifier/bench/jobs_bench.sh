#!/usr/bin/env bash
# verifier/bench/jobs_bench.sh [CKVERIFY] [CASES] [ROUNDS] [N] [CHECK ARGS...]: the gate's throughput with
# -j 1 and -j N (default: the machine's cores) side by side. Runs `check` on the same seed and cases (and
# any further arguments, e.g. `--only tp=1 --only dp=1` for one-process Cases alone: a Case with tp or dp
# > 1 runs as that many processes, so -j 1 already spreads it over the cores), alternating the two
# settings ROUNDS times so a drifting machine slows both alike, and prints cases/s per run, the medians
# and their ratio. Both settings must give the same verdict (the script checks the JSON reports).
set -euo pipefail
ck="${1:-build/verifier/ckverify}"; cases="${2:-600}"; rounds="${3:-3}"; n="${4:-$(nproc)}"
shift $(( $# < 4 ? $# : 4 ))
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
declare -A rates
for r in $(seq 1 "$rounds"); do
  for j in 1 "$n"; do
    start=$(date +%s.%N)
    "$ck" check --cases "$cases" -j "$j" --time-budget 3600 --json "$tmp/j$j.json" "$@" >/dev/null
    end=$(date +%s.%N)
    rate=$(python3 -c "print(f'{$cases / ($end - $start):.2f}')")
    rates[$j]="${rates[$j]:-} $rate"
    echo "round $r  -j $j  $cases cases  $(python3 -c "print(f'{$end - $start:.1f}')") s  $rate cases/s"
  done
done
python3 - "$tmp/j1.json" "$tmp/j$n.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
for r in (a, b):
    for k in ("elapsed_s", "case_outcomes"): r.pop(k, None)
sys.exit(0 if a == b else "the -j 1 and -j N reports differ")
PY
python3 - "$n" ${rates[1]} -- ${rates[$n]} <<'PY'
import statistics, sys
n = sys.argv[1]; rest = sys.argv[2:]; k = rest.index("--")
one, many = [float(x) for x in rest[:k]], [float(x) for x in rest[k + 1:]]
m1, mn = statistics.median(one), statistics.median(many)
print(f"median cases/s: -j 1 {m1:.2f}, -j {n} {mn:.2f}; ratio {mn / m1:.2f}x (same verdict and report)")
PY
