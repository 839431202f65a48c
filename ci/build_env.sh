# ci/build_env.sh: how ci/test.sh and ci/main.sh configure their builds (sourced; sets the arrays
# `type` and `launcher` for cmake).
# Builds at RelWithDebInfo's -O2 without its -g (a third less compile time on LibTorch's headers;
# CKVERIFY_DEBUG_INFO=1 keeps it; -O3 is not used: GCC 12 raises false -Wmaybe-uninitialized there),
# with warnings as errors (CKVERIFY_WERROR; a build configured by hand only warns)
# and through ccache when set-up installed it: the cache lives outside the clone
# (CKVERIFY_CACHE_DIR), paths are hashed relative to the clone, so a fresh clone of the same commit on
# this machine compiles nothing again. A cold cache costs nothing but the first build's time.
type=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKVERIFY_WERROR=ON)
[ "${CKVERIFY_DEBUG_INFO:-0}" = 1 ] || type+=("-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG")
launcher=()
if command -v ccache >/dev/null 2>&1 && [ "${CKVERIFY_CCACHE:-1}" = 1 ]; then
  export CCACHE_DIR="${CKVERIFY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ckverify}/ccache"
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-6G}"
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache  # every configure below, the example plugin's included
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  ccache -z >/dev/null
fi

