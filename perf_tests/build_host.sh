#!/usr/bin/env bash
# Shared by run_host.sh and run_memory.sh: configures a host build of the benchmarks (no tests,
# no tool) and builds the given targets; prints the build directory.
#
#   perf_tests/build_host.sh TARGET...
#
# Environment: Kokkos_ROOT (default: the prefix scripts/bootstrap.sh prints, built once and
# cached), BUILD_DIR (default build-perf).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-perf}
kokkos=${Kokkos_ROOT:-$(TLSE_SKIP_APT=1 "$root/scripts/bootstrap.sh" | tail -n 1)}
cmake -S "$root" -B "$build" -G Ninja -DKokkos_ROOT="$kokkos" -DKokkosKernels_ROOT="$kokkos" \
  -DTiledLSE_ENABLE_TESTS=OFF -DTiledLSE_ENABLE_APPS=OFF -DTiledLSE_ENABLE_PERF_TESTS=ON >/dev/null
cmake --build "$build" --target "$@" >&2
echo "$build"
