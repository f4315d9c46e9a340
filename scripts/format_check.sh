#!/usr/bin/env bash
# Checks that the lines a change touches in C, C++ and CUDA files follow .clang-format
# (clang-format 14, Debian's `clang-format` package): clang-format --dry-run --Werror, limited with
# --lines to the changed lines, so that editing a file never asks to reformat the rest of it.
#   scripts/format_check.sh [BASE]         check the change since BASE (a commit, branch or tag)
#   scripts/format_check.sh --fix [BASE]   format those lines in place instead (clang-format -i)
#   scripts/format_check.sh --whole-files [BASE]   check (or fix) the changed files entirely
# The change is `git diff <merge-base of BASE and HEAD>`: the commits of HEAD that BASE lacks, as
# `git diff BASE...HEAD` lists them, plus uncommitted edits of tracked files (none in CI, whose
# checkout is a clean clone of the submitted commit). BASE is the argument, else
# $TLSE_FORMAT_BASE, else origin/main, else main. When BASE resolves to nothing (a warning when it
# was given) or already contains HEAD (CI checking main itself), the change is the last commit
# (HEAD~1); a clone with no parent commit (git clone --depth 1) has nothing to compare and passes
# with a notice.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mode=check
whole=false
while [ $# -gt 0 ]; do
  case $1 in
    --fix) mode=fix ;;
    --whole-files) whole=true ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) echo "format_check: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
clang_format=${CLANG_FORMAT:-clang-format}
if ! command -v "$clang_format" >/dev/null; then
  echo "format_check: $clang_format not found (apt-get install clang-format)" >&2
  exit 2
fi
# Another major version formats some constructs differently: the check would disagree with CI's.
version=$("$clang_format" --version | sed -nE 's/.*version ([0-9]+)\..*/\1/p')
[ "$version" = 14 ] || echo "format_check: warning: clang-format $version; the style is checked with 14" >&2

resolve() { git rev-parse --verify --quiet "$1^{commit}" 2>/dev/null; }
base=${1:-${TLSE_FORMAT_BASE:-}}
if [ -n "$base" ]; then
  base_commit=$(resolve "$base") || echo "format_check: warning: base '$base' is no commit here" >&2
else
  base_commit=
  for candidate in origin/main main; do
    base_commit=$(resolve "$candidate") && base=$candidate && break
  done
fi
from=
if [ -n "$base_commit" ]; then
  from=$(git merge-base "$base_commit" HEAD || true)
  [ "$from" = "$(git rev-parse HEAD)" ] && from=
fi
if [ -z "$from" ]; then
  if ! from=$(resolve HEAD~1); then
    echo "format_check: no base and no parent commit (a shallow clone?): nothing to compare, nothing checked" >&2
    exit 0
  fi
  base="HEAD~1 (the last commit)"
fi
echo "format_check: lines changed since $base ($(git rev-parse --short "$from"))" >&2

# One diff of the change (renames followed): "+++ b/<file>", then per hunk "@@ -a,b +c,d @@", the
# new side being lines c .. c+d-1 (d = 0: a deletion only, nothing to check).
diff_args=(-U0 -M --no-color --no-ext-diff --src-prefix=a/ --dst-prefix=b/ --diff-filter=ACMR "$from" --
  '*.c' '*.h' '*.cc' '*.cpp' '*.cxx' '*.hpp' '*.cu' '*.cuh')
declare -A ranges=()
files=()
while IFS=$'\t' read -r f range; do
  [ -v "ranges[$f]" ] || files+=("$f")
  ranges[$f]+="${range:+ $range}"
done < <(git diff "${diff_args[@]}" | awk '
  /^\+\+\+ b\// { file = substr($0, 7); printf "%s\t\n", file; next }
  /^@@ / && file != "" {
    split($3, r, ","); start = substr(r[1], 2); n = (2 in r) ? r[2] : 1
    if (n > 0) printf "%s\t--lines=%d:%d\n", file, start, start + n - 1
  }')
if [ ${#files[@]} = 0 ]; then
  echo "format_check: no C/C++/CUDA file changed" >&2
  exit 0
fi
status=0 checked=0
for f in "${files[@]}"; do
  lines=()
  if ! $whole; then
    read -r -a lines <<<"${ranges[$f]}"
    [ ${#lines[@]} = 0 ] && continue
  fi
  checked=$((checked + 1))
  if [ $mode = fix ]; then
    "$clang_format" -i "${lines[@]}" "$f"
  elif ! "$clang_format" --dry-run --Werror "${lines[@]}" "$f"; then
    status=1
  fi
done
echo "format_check: $checked file(s) $([ $mode = fix ] && echo formatted || echo checked)" >&2
if [ $status != 0 ]; then
  echo "format_check: the lines above do not follow .clang-format;" \
    "scripts/format_check.sh --fix $($whole && echo '--whole-files ')${1:+$1 }formats them" >&2
fi
exit $status
