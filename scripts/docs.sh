#!/usr/bin/env bash
# Builds the documentation into build/docs/html (open build/docs/html/index.html): the pages of
# docs/*.md and the API reference of the public headers, with Doxygen. Installs Doxygen from
# Debian's archive when it is missing (as bootstrap.sh does, TLSE_SKIP_APT=1 to skip).
# Fails when a public header in core/tlse has an undocumented member, or when the tables of
# README.md and docs/performance.md disagree with docs/data/current.json (docs/current_table.py,
# python3 alone; `python3 docs/current_table.py --write` regenerates them after an edit of the data).
#
#   scripts/docs.sh            (or: cmake --build build --target docs, with -DTiledLSE_ENABLE_DOCS=ON)
#
# Environment: TLSE_DOCS_OUT (default build/docs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${TLSE_DOCS_OUT:-$root/build/docs}

if ! command -v doxygen >/dev/null; then
  [ "${TLSE_SKIP_APT:-0}" = 1 ] && { echo "[docs] doxygen is missing (apt-get install doxygen)" >&2; exit 1; }
  echo "[docs] apt-get install doxygen" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends doxygen >/dev/null
fi

# The current figures first: one line naming the first mismatch, and no site.
command -v python3 >/dev/null || { echo "[docs] python3 is missing: it checks docs/data/current.json" >&2; exit 1; }
python3 "$root/docs/current_table.py" || exit 1

# Only inputs that exist: the distributed layer and the C API may not be merged yet. Markdown
# pages are listed one by one so that a page added to docs/ later needs no change here; the dated
# lab notes of docs/notes/ are pages of the site too.
inputs=("$root/docs/index.md")
for page in "$root"/docs/*.md; do [ "$page" = "$root/docs/index.md" ] || inputs+=("$page"); done
for page in "$root"/docs/notes/*.md; do if [ -f "$page" ]; then inputs+=("$page"); fi; done
for dir in core/tlse backends distributed; do [ -d "$root/$dir" ] && inputs+=("$root/$dir"); done
while IFS= read -r header; do inputs+=("$(dirname "$header")"); done < \
  <(find "$root" \( -name '.*' -o -name 'build*' -o -path "$root/core" \) -prune -o -name tlse.h -print | sort)

rm -rf "$out/html" && mkdir -p "$out"  # no page left over from a renamed source
export TLSE_DOCS_OUT=$out TLSE_DOCS_ROOT=$root TLSE_DOCS_MAINPAGE=$root/docs/index.md \
  TLSE_DOCS_IMAGES=$root/docs/img TLSE_DOCS_INPUT="${inputs[*]}"
(cd "$root" && doxygen docs/Doxyfile)

# Undocumented public API in core/tlse fails the build; other warnings are reported.
undocumented=$(grep -E "^$root/core/tlse/[^/]+(/[^/]+)?:[0-9]+: warning: .* is not documented" "$out/warnings.log" \
  | grep -v '/impl/' || true)
others=$(grep -c 'warning' "$out/warnings.log" || true)
echo "[docs] wrote $out/html/index.html ($others warnings in $out/warnings.log)" >&2
if [ -n "$undocumented" ]; then
  echo "$undocumented" | sed "s|$root/||" | sort -u >&2
  echo "[docs] undocumented public API in core/tlse" >&2
  exit 1
fi
