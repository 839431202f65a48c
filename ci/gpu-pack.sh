#!/usr/bin/env bash
# ci/gpu-pack.sh: run HERE (the Debian build machine) before ci/gpu.sh. The GPU machine has PyTorch with
# CUDA, CMake and ninja, but none of our Debian build dependencies; this copies their headers, libraries
# and CMake package files, with their paths kept, into .gpu-deps/usr (ignored by git; the device tool
# carries it: `carry: [".gpu-deps"]`). Debian's CMake package files locate themselves relative to their
# own path, so CMAKE_PREFIX_PATH=.gpu-deps/usr finds them there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
grep -qx '/.gpu-deps/' .git/info/exclude 2>/dev/null || echo '/.gpu-deps/' >> .git/info/exclude
rm -rf .gpu-deps
for pkg in libeigen3-dev nlohmann-json3-dev libcli11-dev libfmt-dev libfmt9 librapidcheck-dev libgtest-dev libgmock-dev \
           libbenchmark-dev libbenchmark1debian libgloo-dev; do
  dpkg -L "$pkg" | while read -r f; do
    case "$f" in
      /usr/share/doc/*|/usr/share/pkgconfig/*|/usr/lib/x86_64-linux-gnu/pkgconfig/*) continue ;;
    esac
    if [ -f "$f" ] || [ -L "$f" ]; then
      mkdir -p ".gpu-deps$(dirname "$f")"
      cp -a "$f" ".gpu-deps$f"
    fi
  done
done
du -sh .gpu-deps
