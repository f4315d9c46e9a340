#!/usr/bin/env bash
# Installs the toolchain of the Hopper kernels (backends/cuda/hopper) into a cache outside the
# clone, keyed by version, and prints its folder: the CUDA 13.0 compiler, runtime and CCCL, the
# CUTLASS/CuTe headers and cuobjdump/nvdisasm, all pinned wheels from PyPI (pip's --target, from
# a virtual environment in the cache: nothing goes into the system Python). Reused when present.
#   scripts/hopper_toolchain.sh             -> e.g. ~/.cache/tiledlse/hopper-cuda13.0.88-cutlass4.2.0.0-r1
#   scripts/hopper_toolchain.sh --cmake     -> the CMake cache entries that build the Hopper kernels
#                                              with it (NAME=VALUE lines: scripts/build_cuda.sh, scripts/wheel.sh)
# In that folder: nvidia/cu13/bin/nvcc (PATH is all it needs), cutlass_library/source/include.
set -euo pipefail
cache=${TLSE_CACHE:-$HOME/.cache/tiledlse}
CUDA=13.0.88 CUTLASS=4.2.0.0 RECIPE=r1
packages=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-runtime==13.0.96
          nvidia-cuda-cccl==13.0.85 nvidia-cutlass==$CUTLASS
          nvidia-cuda-cuobjdump==13.2.51 nvidia-cuda-nvdisasm==13.2.51)  # SASS; no 13.0 builds of these exist
dir=$cache/hopper-cuda$CUDA-cutlass$CUTLASS-$RECIPE
log() { echo "[hopper_toolchain] $*" >&2; }
if [ ! -f "$dir/.complete" ]; then
  venv=$cache/pip-venv
  [ -x "$venv/bin/pip" ] || /usr/bin/python3 -m venv "$venv"
  log "installing ${packages[*]} into $dir (about 300 MB)"
  rm -rf "$dir"
  # One command: a second `pip install --target` of the same folder would replace its nvidia/.
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --target "$dir" "${packages[@]}" >&2
  # nvcc.profile links from lib64 but the wheel ships lib/: without this -lcudart_static finds
  # another CUDA's copy (undefined __cudaLaunchKernel).
  ln -sfn lib "$dir/nvidia/cu13/lib64"
  touch "$dir/.complete"
fi
if [ "${1:-}" = --cmake ]; then
  echo "TiledLSE_ENABLE_HOPPER=ON"
  echo "TiledLSE_HOPPER_CUDA_COMPILER=$dir/nvidia/cu13/bin/nvcc"
  echo "TiledLSE_HOPPER_HOST_COMPILER=g++-12"  # CUDA 13 takes g++ <= 15; Debian 12's default
  echo "CUTLASS_INCLUDE_DIR=$dir/cutlass_library/source/include"
else
  echo "$dir"
fi
