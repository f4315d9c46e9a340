#!/usr/bin/env bash
# Builds the CUDA variant on the CPU machine (CUDA 11.8 from Debian non-free, Kokkos 3.4.01 for
# CUDA with sm_90 code) and lays the binaries out in build-cuda/carry/, with libcudart.so.11.0,
# ready to copy to a GPU machine and run there with scripts/run_gpu.sh; the C library
# libtiledlse_c.so and the Python package (with its tests) go there too (docs/python.md).
#   scripts/build_cuda.sh                  build and lay out
#   scripts/build_cuda.sh --compile-only   build only (what CI does: no GPU there)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kokkos=$(TLSE_BACKEND=cuda "$root/scripts/bootstrap.sh" | tail -n 1)
# CUDA 11.8 first: the image's CUDA 13 (PATH, LIBRARY_PATH) must not leak into this build.
export PATH=/usr/lib/nvidia-cuda-toolkit/bin:/usr/sbin:/usr/bin:/sbin:/bin
export NVCC_WRAPPER_DEFAULT_COMPILER=g++-11
unset LIBRARY_PATH CUDA_HOME
build=$root/build-cuda
# A build configured against another Kokkos (an older cached recipe) cannot be reconfigured.
[ "$(cat "$build/.kokkos-prefix" 2>/dev/null || echo "$kokkos")" = "$kokkos" ] || rm -rf "$build"
mkdir -p "$build" && echo "$kokkos" >"$build/.kokkos-prefix"
cmake -S "$root" -B "$build" -G Ninja -DKokkos_ROOT="$kokkos" -DCMAKE_PREFIX_PATH="$kokkos" \
  -DCMAKE_CXX_COMPILER="$kokkos/bin/nvcc_sm90" -DTiledLSE_ENABLE_CUDA=ON \
  -DTiledLSE_ENABLE_APPS=ON -DTiledLSE_ENABLE_PERF_TESTS=ON >/dev/null
cmake --build "$build" --parallel "$(nproc)"
[ "${1:-}" = --compile-only ] && exit 0

carry=$build/carry
rm -rf "$carry" && mkdir -p "$carry"
find "$build/unit_tests" -maxdepth 1 -type f -executable -name 'test_*' -exec cp {} "$carry/" \;
for exe in apps/tlse perf_tests/tlse_benchmarks perf_tests/forward_timing; do
  [ -x "$build/$exe" ] && cp "$build/$exe" "$carry/"
done
cp "$build/c_api/libtiledlse_c.so" "$carry/"
strip "$carry"/* 2>/dev/null || true
cp -L /usr/lib/x86_64-linux-gnu/libcudart.so.11.0 "$carry/"
mkdir -p "$carry/python"
cp -r "$root/python/tiledlse" "$root/python/tests" "$carry/python/"
find "$carry/python" -name __pycache__ -prune -exec rm -rf {} +
ldd "$carry"/test_* | awk '/=> \/(usr\/)?lib/ {print $3}' | sort -u | { grep -E 'libbenchmark|libgtest' || true; } | xargs -r -I{} cp -L {} "$carry/"
du -sh "$carry"
