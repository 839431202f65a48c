#!/usr/bin/env bash
# verifier/bench/gate_instructions.sh [BENCH_GATE]: the verified case against a plain training step of it
# (bench_gate's BM_VerifiedCase and BM_PlainStep) counted in instructions under callgrind, not timed: the
# ratio is the same on a loaded machine, so it shows what a change did where wall-clock medians on a
# shared 2-core machine move by +-5%. Needs valgrind (apt-get install valgrind); takes about a minute.
set -euo pipefail
bench="${1:-build/verifier/bench_gate}"
command -v valgrind >/dev/null || { echo "gate_instructions: valgrind is not installed" >&2; exit 2; }
[ -x "$bench" ] || { echo "gate_instructions: no executable $bench" >&2; exit 2; }
out="$(mktemp)"; trap 'rm -f "$out"' EXIT
valgrind --tool=callgrind --callgrind-out-file="$out" --toggle-collect='*BM_VerifiedCase*' \
  --toggle-collect='*BM_PlainStep*' "$bench" --benchmark_filter='BM_VerifiedCase|BM_PlainStep' \
  --benchmark_min_time=6 >/dev/null 2>&1
# Inclusive instructions of each benchmark function and how often it was called: per call.
callgrind_annotate --inclusive=yes --tree=caller "$out" 2>/dev/null | python3 -c '
import re, sys
per = {}
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+) .*< .*(BM_VerifiedCase|BM_PlainStep)\(benchmark::State&\) \((\d+)x\)", line)
    if m and m.group(2) not in per:
        per[m.group(2)] = int(m.group(1).replace(",", "")) / int(m.group(3))
if len(per) != 2:
    sys.exit("gate_instructions: callgrind did not report both benchmarks")
v, p = per["BM_VerifiedCase"], per["BM_PlainStep"]
print(f"verified case {v / 1e6:.2f}M instructions, plain step {p / 1e6:.2f}M: {v / p:.2f}x")'
