#!/usr/bin/env bash
# ci/gpu.sh: the GPU run, one prepared script for the device machine (an H200; see
# /work/.library/device/README.md). Prepare here with `bash ci/gpu-pack.sh`, then run it there with
# `carry: [".gpu-deps"]` and a timeout that leaves room to rerun, e.g.
#   run(command="bash ci/gpu.sh", carry=[".gpu-deps"], timeout_s=560)
# It builds ckverify against the machine's own PyTorch (CUDA), runs ctest, `check --device cuda`,
# `faults --device cuda` (the CUDA-only fault cpu-rng-only included) and `bench --preset seed-lab
# --device cuda` (the seed's D=2048, B=2, S=2048), writing every log and report under $OUT (or
# gpu-out/ when run by hand). gnuplot is not on that machine: the bench data comes back as JSON and
# text; `ckverify bench` here draws plots from a run here.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-gpu-out}"
mkdir -p "$out"
log="$out/log.txt"
: > "$log"
say() { echo "== $(date +%T) $*" | tee -a "$log"; }
deps="$PWD/.gpu-deps/usr"
[ -d "$deps" ] || { say "missing .gpu-deps: run ci/gpu-pack.sh here and carry .gpu-deps"; exit 2; }
py="$(command -v python3)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$log" 2>&1
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" >> "$log" 2>&1

say "configure + build"
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKVERIFY_PYTHON="$py" \
  -DCMAKE_PREFIX_PATH="$deps;$deps/lib/x86_64-linux-gnu/cmake;$deps/share/cmake;$deps/share/eigen3/cmake" \
  > "$out/build.txt" 2>&1 &&
  cmake --build build-gpu -j "$(nproc)" >> "$out/build.txt" 2>&1
rc=$?
say "build rc=$rc in $(( $(date +%s) - t0 )) s"
[ $rc = 0 ] || { tail -40 "$out/build.txt" | tee -a "$log"; exit 1; }
ck=build-gpu/verifier/ckverify

say "ctest (CPU and CUDA tests; GPU-only tests run here instead of skipping)"
timeout 200 ctest --test-dir build-gpu --output-on-failure -j 8 > "$out/ctest.txt" 2>&1
say "ctest rc=$?"; tail -15 "$out/ctest.txt" >> "$log"

say "check --device cuda"
timeout 120 "$ck" check --device cuda --cases 300 --time-budget 100 --json "$out/check-cuda.json" \
  --repro-file "$out/repro-cuda.json" >> "$log" 2>&1
say "check rc=$?"

say "faults --device cuda"
timeout 150 "$ck" faults --device cuda --cases 200 --time-budget 6 --json "$out/faults-cuda.json" >> "$log" 2>&1
say "faults rc=$?"

say "bench --preset seed-lab --device cuda (D=2048, B=2, S=2048)"
timeout 150 "$ck" bench --preset seed-lab --device cuda --warmup 2 --repeats 5 --growth \
  --json "$out/bench-seed-lab-cuda.json" > "$out/bench.txt" 2>&1
say "bench rc=$?"; cat "$out/bench.txt" >> "$log"
