#!/usr/bin/env bash
# ci/source_check.sh [SOURCE_ROOT]: the checks on the sources themselves (ctest: source_check).
#   - every C++ file is formatted as .clang-format says, by Debian 12's clang-format 14 (other major
#     versions format differently: the check is skipped, exit 77, saying so; `ci/setup.sh` installs 14);
#   - no #include reaches out of its directory with "../": the layers (cmake/CkvLayers.cmake) are
#     enforced through include paths, which a relative include would bypass.
# Fix formatting with: clang-format -i FILE...
set -u
root="$(cd "${1:-$(dirname "${BASH_SOURCE[0]}")/..}" && pwd)"
cd "$root"
mapfile -t files < <(find reference verifier properties reports plugins examples \
  \( -name '*.cpp' -o -name '*.hpp' \) -type f | sort)
[ ${#files[@]} -gt 0 ] || { echo "source_check: no C++ sources under $root"; exit 1; }
status=0
if rel=$(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"\.\./' "${files[@]}"); then
  echo "source_check: relative includes bypass the layering (include from the source root instead):"
  echo "$rel"
  status=1
fi
if ! command -v clang-format >/dev/null 2>&1; then
  echo "source_check: SKIPPED formatting: clang-format is not installed (ci/setup.sh installs it)"
  [ $status = 0 ] && exit 77 || exit $status
fi
major=$(clang-format --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p')
if [ "$major" != 14 ]; then
  echo "source_check: SKIPPED formatting: clang-format $major is not Debian 12's 14, which formats differently"
  [ $status = 0 ] && exit 77 || exit $status
fi
if ! out=$(clang-format --dry-run -Werror "${files[@]}" 2>&1); then
  echo "source_check: not formatted as .clang-format says (clang-format -i FILE... fixes them):"
  grep -E '^[^ ].*: (error|warning):' <<<"$out" | cut -d: -f1 | sort | uniq -c
  status=1
fi
[ $status = 0 ] && echo "source_check: ${#files[@]} files formatted, no relative includes"
exit $status
