#!/usr/bin/env bash
# Compiles and links the HIP (AMD GPU) variant in build-hip-check/: the generic kernels, the unit
# tests (on Kokkos' HIP space) and the C API, against Kokkos 3.4.01 built for Serial + HIP with
# Debian's ROCm 5.2 hipcc for gfx90a (MI210, MI250X; TLSE_BACKEND=hip scripts/bootstrap.sh, cached).
# A check, not a build to run: no AMD GPU is lent to the project (docs/gpu.md), and CI runs it to
# catch what breaks the HIP build. Like `scripts/build_cuda.sh --compile-only`, host and device
# code are compiled at -O0, which keeps every error of the compiler's front ends, of the AMDGPU
# back end and of the link, in a fraction of the time.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kokkos=$(TLSE_BACKEND=hip "$root/scripts/bootstrap.sh" | tail -n 1)
build=$root/build-hip-check
# A build configured against another Kokkos (an older cached recipe) cannot be reconfigured.
[ "$(cat "$build/.kokkos-prefix" 2>/dev/null || echo "$kokkos")" = "$kokkos" ] || rm -rf "$build"
mkdir -p "$build" && echo "$kokkos" >"$build/.kokkos-prefix"
# The CUDA specializations are registered only with TiledLSE_ENABLE_CUDA (backends/CMakeLists.txt):
# HIP gets the generic kernels of core/.
cmake -S "$root" -B "$build" -G Ninja -DKokkos_ROOT="$kokkos" -DCMAKE_PREFIX_PATH="$kokkos" \
  -DCMAKE_CXX_COMPILER="$kokkos/bin/hipcc_gfx90a" -DCMAKE_CXX_FLAGS_RELEASE="-O0 -DNDEBUG" \
  -DTiledLSE_ENABLE_CUDA=OFF -DTiledLSE_ENABLE_MPI=OFF -DTiledLSE_ENABLE_PYTHON=OFF >/dev/null
if grep -q '#include' "$build/generated/tlse/registered_backends.hpp"; then
  echo "[build_hip] a backend specialization reached the HIP build: $build/generated/tlse/registered_backends.hpp" >&2
  exit 1
fi
cmake --build "$build" --parallel "$(nproc)"
