#!/usr/bin/env bash
# Builds the CUDA variant on the CPU machine (CUDA 11.8 from Debian non-free, Kokkos 3.4.01 for
# CUDA with sm_90 code; the Hopper kernels, libtiledlse_hopper, with the CUDA 13.0 compiler and
# CUTLASS from PyPI, scripts/hopper_toolchain.sh) and lays the binaries out in build-cuda/carry/,
# with libcudart.so.11.0,
# ready to copy to a GPU machine and run there with scripts/run_gpu.sh; the C library
# libtiledlse_c.so and the Python package (with its tests) go there too (docs/python.md).
#   scripts/build_cuda.sh                  build and lay out
#   scripts/build_cuda.sh --compile-only   compile and link only, in build-cuda-check/ (what CI
#                                          does: no GPU there), quicker than the build it checks:
#                                          the Kokkos targets' device code to PTX only (no ptxas,
#                                          cicc -O0) and their host code at -O0, which leaves every
#                                          error of the compilers' front ends and of the link; the
#                                          Hopper library as always (its wgmma guard reads ptxas)
#   Kokkos_ROOT=<prefix> scripts/build_cuda.sh   against another Kokkos for CUDA (4.x, built for
#                                          Hopper90 with CUDA 11.8 and its nvcc_wrapper installed;
#                                          docs/gpu.md, "Compatibility"), in build-cuda-kokkos<version>/
#                                          (build-cuda-check-kokkos<version>/ with --compile-only)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
compile_only=false
[ "${1:-}" = --compile-only ] && compile_only=true
kokkos=$(TLSE_BACKEND=cuda "$root/scripts/bootstrap.sh" | tail -n 1)
mapfile -t hopper < <("$root/scripts/hopper_toolchain.sh" --cmake)  # cached: the bootstrap installed it
# CUDA 11.8 first: the image's CUDA 13 (PATH, LIBRARY_PATH) must not leak into this build.
export PATH=/usr/lib/nvidia-cuda-toolkit/bin:/usr/sbin:/usr/bin:/sbin:/bin
export NVCC_WRAPPER_DEFAULT_COMPILER=g++-11
unset LIBRARY_PATH CUDA_HOME
build=$root/build-cuda
$compile_only && build=$root/build-cuda-check
bootstrap_kokkos=false
[ -x "$kokkos/bin/nvcc_sm90" ] && bootstrap_kokkos=true
if ! $bootstrap_kokkos; then
  # Another Kokkos gets its own build folder, so the bootstrap's build stays as it is.
  version=$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")$/\1/p' "$kokkos"/lib*/cmake/Kokkos/KokkosConfigVersion.cmake | head -n 1)
  [ -n "$version" ] && [ -x "$kokkos/bin/nvcc_wrapper" ] || {
    echo "[build_cuda] Kokkos_ROOT=$kokkos: not a Kokkos for CUDA (no lib*/cmake/Kokkos/KokkosConfigVersion.cmake or bin/nvcc_wrapper)" >&2
    exit 2
  }
  build=$build-kokkos$version
fi
# A build configured against another Kokkos (an older cached recipe) cannot be reconfigured.
[ "$(cat "$build/.kokkos-prefix" 2>/dev/null || echo "$kokkos")" = "$kokkos" ] || rm -rf "$build"
mkdir -p "$build" && echo "$kokkos" >"$build/.kokkos-prefix"
compiler=$kokkos/bin/nvcc_sm90
if ! $bootstrap_kokkos; then
  # That Kokkos names sm_90 itself; its nvcc_wrapper with 11.8's headers first
  # (cuda_header_links.sh says why).
  "$root/scripts/cuda_header_links.sh" "$build/cuda-11.8-include"
  compiler=$build/nvcc_kokkos
  printf '#!/usr/bin/env bash\nexec "%s" -I"%s" "$@"\n' "$kokkos/bin/nvcc_wrapper" "$build/cuda-11.8-include" >"$compiler"
  chmod +x "$compiler"
fi
check=()
if $compile_only; then
  # Kokkos' flags ask for sm_80 (Kokkos 3.4 knows no Hopper), which nvcc_sm90 turns into sm_90,
  # or sm_90 (Kokkos 4); compute_90 instead embeds PTX and skips ptxas, and cicc -O0 skips NVVM's
  # optimizer: with the host code at -O0, a test's compile takes a fraction of the time
  # (docs/notes/2026-11-28.md, "Test and build times on CI's two cores").
  nvcc=$compiler
  compiler=$build/nvcc_ptx
  cat >"$compiler" <<EOF
#!/usr/bin/env bash
# scripts/build_cuda.sh --compile-only: ${nvcc##*/} with device code to PTX only, unoptimized.
args=()
for a in "\$@"; do a=\${a//sm_80/compute_90}; args+=("\${a//sm_90/compute_90}"); done
NVCC_APPEND_FLAGS="\${NVCC_APPEND_FLAGS:+\$NVCC_APPEND_FLAGS }-Xcicc -O0" exec "$nvcc" "\${args[@]}"
EOF
  chmod +x "$compiler"
  check=(-DCMAKE_CXX_FLAGS_RELEASE="-O0 -DNDEBUG")
fi
# The distributed layer with MPI (Debian's OpenMPI) and NCCL (the image's, NCCL_HOME): nccl.h
# alone in a private folder, since CUDA 13's other headers must not shadow 11.8's, and the
# library linked by full path; it is not carried (the GPU machine has its own libnccl.so.2).
nccl_home=${NCCL_HOME:-/usr/local/cuda-13.0}
nccl=()
if [ -r "$nccl_home/include/nccl.h" ] && [ -e "$nccl_home/lib/libnccl.so.2" ]; then
  mkdir -p "$build/nccl-include" && cp "$nccl_home/include/nccl.h" "$build/nccl-include/"
  nccl=(-DTiledLSE_ENABLE_NCCL=ON -DNCCL_INCLUDE_DIR="$build/nccl-include" -DNCCL_LIBRARY="$nccl_home/lib/libnccl.so.2")
else
  echo "[build_cuda] no NCCL under $nccl_home: the distributed layer is built with MPI only" >&2
fi
cmake -S "$root" -B "$build" -G Ninja -DKokkos_ROOT="$kokkos" -DCMAKE_PREFIX_PATH="$kokkos" \
  -DCMAKE_CXX_COMPILER="$compiler" "${check[@]}" -DTiledLSE_ENABLE_CUDA=ON \
  -DTiledLSE_ENABLE_APPS=ON -DTiledLSE_ENABLE_PERF_TESTS=ON -DTiledLSE_ENABLE_MPI=ON "${nccl[@]}" \
  -DTiledLSE_HOPPER_STRICT=ON "${hopper[@]/#/-D}" >/dev/null
cmake --build "$build" --parallel "$(nproc)"
$compile_only && exit 0

carry=$build/carry
rm -rf "$carry" && mkdir -p "$carry"
# The GPU tests (test_hopper_plan and test_mma_backward_plan check host arithmetic: the host suite
# runs them) and the tools the GPU runs use. A device call carries at most 64 MiB:
# build-cuda/carry.tar.gz holds the same (scripts/carry_dir.sh unpacks it on the GPU machine).
find "$build/unit_tests" -maxdepth 1 -type f -executable -name 'test_*' ! -name test_hopper_plan ! -name test_mma_backward_plan -exec cp {} "$carry/" \;
for exe in apps/tlse perf_tests/distributed_benchmark; do
  [ -x "$build/$exe" ] && cp "$build/$exe" "$carry/"
done
cp "$build/c_api/libtiledlse_c.so" "$build/hopper/libtiledlse_hopper.so" "$build/hopper/test_hopper_kernels" "$carry/"
strip "$carry"/* 2>/dev/null || true
cp -L /usr/lib/x86_64-linux-gnu/libcudart.so.11.0 "$carry/"
mkdir -p "$carry/python"
cp -r "$root/python/tiledlse" "$root/python/tests" "$carry/python/"
find "$carry/python" -name __pycache__ -prune -exec rm -rf {} +
ldd "$carry"/test_* | awk '/=> \/(usr\/)?lib/ {print $3}' | sort -u | { grep -E 'libbenchmark|libgtest' || true; } | xargs -r -I{} cp -L {} "$carry/"
tar -czf "$build/carry.tar.gz" -C "$build" carry
du -sh "$carry" "$build/carry.tar.gz"
