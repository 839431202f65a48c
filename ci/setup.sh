#!/usr/bin/env bash
# ci/setup.sh: installs everything ckverify needs on a fresh Debian 12 machine, idempotently.
#   - Debian packages: toolchain (with ccache, which ci/test.sh compiles through; clang-format, which
#     the source check runs), test/bench libraries, Eigen, RapidCheck, JSON, CLI11, fmt, gnuplot,
#     and Debian's libtorch-dev (the floor build, LibTorch 1.13.1).
#   - The primary LibTorch: PyPI's torch wheel at a pinned version, in the project-local virtual
#     environment .venv/. The multi-GB wheels are kept in a wheelhouse outside the clone
#     (~/.cache/ckverify/wheels; CKVERIFY_CACHE_DIR overrides), so a second set-up on the same machine
#     fetches nothing.
#   - With --frameworks (optional, never in the default path): the frameworks gated by ci/frameworks.sh
#     (DeepSpeed without compiled ops, fairscale, transformers), pinned with every dependency in
#     ci/frameworks.txt, into the same .venv; torch is left as it is (checked after).
# A second run with everything present takes a few seconds (dpkg and pip checks only).
set -euo pipefail
frameworks=0
for a in "$@"; do
  case "$a" in
    --frameworks) frameworks=1 ;;
    -h|--help) echo "usage: ci/setup.sh [--frameworks]"; exit 0 ;;
    *) echo "setup: unknown argument $a (usage: ci/setup.sh [--frameworks])" >&2; exit 2 ;;
  esac
done
TORCH_VERSION="${CKVERIFY_TORCH_VERSION:-2.8.0}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

debs=(build-essential cmake ninja-build pkg-config ccache python3-venv python3-dev
      librapidcheck-dev libeigen3-dev googletest libgtest-dev libgmock-dev libbenchmark-dev
      nlohmann-json3-dev libcli11-dev libfmt-dev gnuplot-nox libtorch-dev libgloo-dev clang-format)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

py="${CKVERIFY_PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$py" -m venv .venv
fi
# The wheelhouse lives outside the clone; once complete, (re)installing needs no network at all.
cache="${CKVERIFY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ckverify}"
wheels="$cache/wheels/torch-$TORCH_VERSION"
have="$(.venv/bin/python -W ignore -c 'import torch,sys; sys.stdout.write(torch.__version__)' 2>/dev/null || true)"
if [ "${have%%+*}" != "$TORCH_VERSION" ]; then
  if [ ! -f "$wheels/.complete" ]; then
    echo "setup: downloading torch==$TORCH_VERSION and its dependencies into $wheels (about 3 GB, once)"
    mkdir -p "$wheels"
    .venv/bin/python -m pip download -q --disable-pip-version-check -d "$wheels" "torch==$TORCH_VERSION"
    touch "$wheels/.complete"
  fi
  # The CUDA wheel's dependencies unpack to about 6.5 GB; a full disk would fail deep inside pip.
  free_kb="$(df -Pk . | awk 'NR==2 {print $4}')"
  if [ "$free_kb" -lt $((7 * 1024 * 1024)) ]; then
    echo "setup: $((free_kb / 1024 / 1024)) GB free on $(df -P . | awk 'NR==2 {print $6}'); installing torch into .venv needs 7 GB" >&2
    exit 1
  fi
  echo "setup: installing torch==$TORCH_VERSION into .venv from $wheels"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-index --find-links "$wheels" "torch==$TORCH_VERSION"
fi
if [ "$frameworks" = 1 ]; then
  # The wheelhouse is keyed by the pin list, so changing a pin fetches the new set once.
  fw_key="$(sha256sum ci/frameworks.txt | cut -c1-12)"
  fw_wheels="$cache/wheels/frameworks-$fw_key"
  pip=(.venv/bin/python -m pip -q --disable-pip-version-check)
  if [ ! -f "$fw_wheels/.complete" ]; then
    echo "setup: fetching the pinned frameworks into $fw_wheels (about 100 MB, once)"
    mkdir -p "$fw_wheels"
    reqs="$(grep -vE '^\s*(#|$)' ci/frameworks.txt)"
    sdists="$(printf '%s\n' "$reqs" | grep -E '^(deepspeed|fairscale)==')"
    "${pip[@]}" download --no-deps --only-binary :all: -d "$fw_wheels" wheel==0.45.1 \
      $(printf '%s\n' "$reqs" | grep -vE '^(deepspeed|fairscale)==')
    # Built against this torch (no build isolation: their set-up imports torch), pure Python wheels.
    "${pip[@]}" install --no-index --find-links "$fw_wheels" wheel==0.45.1
    DS_BUILD_OPS=0 "${pip[@]}" wheel --no-deps --no-build-isolation -w "$fw_wheels" $sdists
    touch "$fw_wheels/.complete"
  fi
  before="$(.venv/bin/python -W ignore -c 'import torch,sys; sys.stdout.write(torch.__version__)')"
  echo "setup: installing the frameworks of ci/frameworks.txt into .venv from $fw_wheels"
  "${pip[@]}" install --no-index --no-deps --find-links "$fw_wheels" -r ci/frameworks.txt
  after="$(.venv/bin/python -W ignore -c 'import torch,sys; sys.stdout.write(torch.__version__)')"
  if [ "$before" != "$after" ]; then
    echo "setup: installing the frameworks changed torch from $before to $after" >&2
    exit 1
  fi
  DS_ACCELERATOR=cpu .venv/bin/python -W ignore -c 'import deepspeed, fairscale.nn.checkpoint, transformers.modeling_layers; deepspeed.checkpointing.checkpoint' \
    || { echo "setup: the frameworks were installed but do not import (see above)" >&2; exit 1; }
fi
echo "setup: ok (torch $(.venv/bin/python -W ignore -c 'import torch,sys; sys.stdout.write(torch.__version__)' 2>/dev/null))"
