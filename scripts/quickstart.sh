#!/usr/bin/env bash
# The README's first command: installs everything (scripts/bootstrap.sh, cached under
# ~/.cache/tiledlse), builds the library, the tool and the tests, and runs the main job: the
# contrastive loss and the cross-entropy of TiledLSE next to the materialized baseline, checked
# against the float64 reference. Extra arguments replace the default jobs: a single `tlse` run.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kokkos=$("$root/scripts/bootstrap.sh" | tail -n 1)
# A build configured against another Kokkos (an older cached recipe) cannot be reconfigured.
[ "$(cat "$root/build/.kokkos-prefix" 2>/dev/null || echo "$kokkos")" = "$kokkos" ] || rm -rf "$root/build"
mkdir -p "$root/build" && echo "$kokkos" >"$root/build/.kokkos-prefix"
cmake -S "$root" -B "$root/build" -G Ninja -DKokkos_ROOT="$kokkos" -DCMAKE_PREFIX_PATH="$kokkos" \
  -DTiledLSE_ENABLE_APPS=ON -DTiledLSE_ENABLE_PERF_TESTS=ON >/dev/null
cmake --build "$root/build" --parallel "$(nproc)" --target tlse
export OMP_PROC_BIND=false
tlse=$root/build/apps/tlse
if [ $# -gt 0 ]; then exec "$tlse" "$@"; fi
"$tlse" contrastive --batch 2048 --dim 256 --check
"$tlse" cross-entropy --tokens 1024 --dim 256 --vocab 8192 --dtype bf16 --check
