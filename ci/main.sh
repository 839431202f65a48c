#!/usr/bin/env bash
# ci/main.sh: the README's main job. Set-up, build, then `ckverify check` on the built-in
# implementation with its defaults; extra arguments go to `ckverify check`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash ci/setup.sh
source ci/build_env.sh
cmake -S . -B build -G Ninja "${type[@]}" "${launcher[@]}" >/dev/null
cmake --build build -j "${CKVERIFY_JOBS:-$(nproc)}" --target ckverify
exec ./build/verifier/ckverify check "$@"
