#!/usr/bin/env bash
# ci/test.sh: the README's test command. Set-up, then
#   primary build (PyPI LibTorch): build everything, run the full ctest suite (which installs it and gates
#     the example plugin built against the installed package: example_plugin_tests, ci/example_plugin.sh);
#   floor build (Debian libtorch 1.13.1): build what the fast tests need, run them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
t0=$(date +%s)
bash ci/setup.sh
t1=$(date +%s)
# The three builds take about 4 GB (one precompiled LibTorch header is 0.6 GB); a full disk
# otherwise fails as a truncated compiler error deep inside the build.
free_kb="$(df -Pk . | awk 'NR==2 {print $4}')"
if [ "$free_kb" -lt $((5 * 1024 * 1024)) ]; then
  echo "ci/test.sh: $((free_kb / 1024 / 1024)) GB free on $(df -P . | awk 'NR==2 {print $6}'); the builds need 5 GB" >&2
  exit 1
fi
jobs="${CKVERIFY_JOBS:-$(nproc)}"
source ci/build_env.sh

cmake -S . -B build -G Ninja "${type[@]}" "${launcher[@]}" >/dev/null
cmake --build build -j "$jobs"
t2=$(date +%s)
ctest --test-dir build --output-on-failure -j "$jobs"
t3=$(date +%s)

cmake -S . -B build-floor -G Ninja "${type[@]}" "${launcher[@]}" -DCKVERIFY_FLOOR=ON >/dev/null
# Only what the fast tests need (the slow RapidCheck suite and the benchmarks run on the primary build).
cmake --build build-floor -j "$jobs" --target reference_tests case_tests checkpoint_tests model_tests compare_tests \
  resume_tests report_tests case_fuzz dist_tests dist_rank ckverify
t4=$(date +%s)
ctest --test-dir build-floor --output-on-failure -L fast -j "$jobs"
t5=$(date +%s)

# Sanitizer leg: ASan + UBSan over the LibTorch-free tests (configured against the floor LibTorch,
# which is quick to find; only torch-free targets are built).
cmake -S . -B build-asan -G Ninja "${type[@]}" "${launcher[@]}" -DCKVERIFY_FLOOR=ON -DCKVERIFY_SANITIZE=ON >/dev/null
cmake --build build-asan -j "$jobs" --target reference_tests case_tests compare_tests case_fuzz
ctest --test-dir build-asan --output-on-failure -R "^(reference_tests|case_tests|compare_tests|case_fuzz)$" -j 1
t6=$(date +%s)
[ ${#launcher[@]} -gt 0 ] && ccache -s | grep -iE "hits|misses" | tr -s ' ' | paste -sd ';' | sed 's/^/ccache: /'
echo "ci/test.sh timings: setup $((t1-t0))s, primary build $((t2-t1))s, primary tests $((t3-t2))s, floor build $((t4-t3))s, floor tests $((t5-t4))s, sanitizer leg $((t6-t5))s"
