#!/usr/bin/env bash
# ci/example_plugin.sh [BUILD_DIR]: what a plugin author does. Installs ckverify (cmake --install), builds
# examples/plugin against the *installed* package (find_package(ckverify)), and gates both plugins:
# the correct one must pass, the buggy one (pytorch issue 71124) must fail autocast-replay; and the
# strategy plugins: the correct grouping passes, the off-by-one one fails recompute-count.
# It is the ctest test example_plugin_tests of the primary build (BUILD_DIR: that build; default ./build),
# where the install and the example's build go.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build="$(realpath "${1:-build}")"
prefix="$build/install"; out="$build/example-plugin"
rm -rf "$prefix" "$out"
cmake --install "$build" --prefix "$prefix" >/dev/null
cmake -S examples/plugin -B "$out" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$out" -j "${CKVERIFY_JOBS:-$(nproc)}"
ck="$prefix/bin/ckverify"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
# Two runs: the design runs a hook once per nested backward, so hooks (a data-parallel reducer's among
# them) go with neither shared parameters nor a gradient penalty (examples/plugin/README.md).
"$ck" check --impl "$out/libexample_checkpoint.so" --only hook=none --only dp=1 --cases 300 --time-budget 300
"$ck" check --impl "$out/libexample_checkpoint.so" --only tie=none --only gp=0 --cases 300 --time-budget 300
# Tensor- and data-parallel Cases (docs/parallel.md): the plugin replays the model-parallel stream it is
# shown; under dp=2 on unshared weights each parameter's accumulator, and reducer hook, runs once.
"$ck" check --impl "$out/libexample_checkpoint.so" --only tp=2 --only hook=none --only dp=1 --cases 10 --time-budget 300
"$ck" check --impl "$out/libexample_checkpoint.so" --only dp=2 --only tie=none --cases 8 --time-budget 300
set +e
"$ck" check --impl "$out/libexample_buggy.so" --cases 300 --time-budget 300 > buggy.txt 2>&1
code=$?
set -e
if [ "$code" != 1 ] || ! grep -q "^FAILED autocast-replay" buggy.txt; then
  echo "example_plugin: the buggy example was not caught (exit $code)"; cat buggy.txt; exit 1
fi
# The strategy plugin: the correct grouping passes every property (fx Cases included: ckv::checkpoint
# marks its recomputes); the off-by-one grouping fails recompute-count, naming the block run twice.
"$ck" check --strategy "$out/libexample_strategy.so:segments=2" --cases 100 --time-budget 300
"$ck" check --strategy "$out/libexample_strategy.so:segments=2" --only tp=2 --cases 6 --time-budget 300
"$ck" check --strategy "$out/libexample_strategy.so:segments=2" --only dp=2 --cases 4 --time-budget 300
"$ck" check --strategy "$out/libexample_strategy.so:segments=3" --only layers=7 --cases 30 --time-budget 300
set +e
# A block run twice also redraws its dropout masks (rng-replay fails first, in report order):
# --max-findings lists recompute-count's own finding, shrunk for it.
"$ck" check --strategy "$out/libexample_strategy_buggy.so:segments=2" --cases 100 --time-budget 300 --max-findings 5 \
  > strategy.txt 2>&1
code=$?
set -e
if [ "$code" != 1 ] || ! grep -A2 "^FAILED recompute-count" strategy.txt | grep -q "where: .*block [0-9]"; then
  echo "example_plugin: the buggy strategy was not caught naming its block (exit $code)"; cat strategy.txt; exit 1
fi
echo "example_plugin: the correct examples pass; the buggy checkpoint fails autocast-replay, the buggy strategy recompute-count"
