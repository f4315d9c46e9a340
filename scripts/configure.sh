#!/usr/bin/env bash
# Shared by quickstart.sh and test.sh: installs what is missing (bootstrap.sh, cached) and
# configures build/ with the tool, the benchmarks, the tests and the distributed layer (MPI).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kokkos=$("$root/scripts/bootstrap.sh" | tail -n 1)
# A build configured against another Kokkos (an older cached recipe) cannot be reconfigured.
[ "$(cat "$root/build/.kokkos-prefix" 2>/dev/null || echo "$kokkos")" = "$kokkos" ] || rm -rf "$root/build"
mkdir -p "$root/build" && echo "$kokkos" >"$root/build/.kokkos-prefix"
# The tool and the benchmarks need Kokkos Kernels; a Kokkos given through Kokkos_ROOT may have none.
extras=ON
if ! compgen -G "$kokkos/lib*/cmake/KokkosKernels" >/dev/null; then
  extras=OFF
  echo "[configure] no Kokkos Kernels under $kokkos: building the library and its tests only" >&2
fi
# Debian's interpreter: bootstrap installed python3-torch for it (a python3 earlier on PATH, e.g.
# pyenv's, would not see it).
cmake -S "$root" -B "$root/build" -G Ninja -DKokkos_ROOT="$kokkos" -DCMAKE_PREFIX_PATH="$kokkos" \
  -DTiledLSE_ENABLE_APPS=$extras -DTiledLSE_ENABLE_PERF_TESTS=$extras -DTiledLSE_ENABLE_MPI=ON \
  -DTiledLSE_ENABLE_PYTHON=ON -DPython3_EXECUTABLE=/usr/bin/python3 >/dev/null
