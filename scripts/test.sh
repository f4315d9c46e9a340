#!/usr/bin/env bash
# Runs the whole test suite: installs what is missing (scripts/bootstrap.sh, cached), builds
# everything in build/ and runs ctest. Exit status is ctest's.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kokkos=$("$root/scripts/bootstrap.sh" | tail -n 1)
# A build configured against another Kokkos (an older cached recipe) cannot be reconfigured.
[ "$(cat "$root/build/.kokkos-prefix" 2>/dev/null || echo "$kokkos")" = "$kokkos" ] || rm -rf "$root/build"
mkdir -p "$root/build" && echo "$kokkos" >"$root/build/.kokkos-prefix"
cmake -S "$root" -B "$root/build" -G Ninja -DKokkos_ROOT="$kokkos" -DCMAKE_PREFIX_PATH="$kokkos" \
  -DTiledLSE_ENABLE_APPS=ON -DTiledLSE_ENABLE_PERF_TESTS=ON >/dev/null
cmake --build "$root/build" --parallel "$(nproc)"
cd "$root/build"
OMP_PROC_BIND=false ctest --output-on-failure --parallel "$(nproc)" --timeout 900
