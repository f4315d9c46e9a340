#!/usr/bin/env bash
# Installs what TiledLSE needs on Debian 12 (as root, Debian's archive only) and builds
# Kokkos 3.4.01 + Kokkos Kernels 3.4.01 from Debian's `trilinos` source package into a cache
# outside the clone, keyed by version and backend, reused when present.
#
#   scripts/bootstrap.sh                     host backend (OpenMP + Serial); prints the Kokkos prefix last
#   TLSE_BACKEND=cuda scripts/bootstrap.sh   CUDA 11.8 from Debian non-free + Kokkos for CUDA (sm_90 code),
#                                            and the Hopper kernels' toolchain (scripts/hopper_toolchain.sh)
#   TLSE_BACKEND=hip scripts/bootstrap.sh    ROCm 5.2 (hipcc) from Debian + Kokkos for HIP (Serial + HIP,
#                                            gfx90a code); compiled only, no AMD GPU here (docs/gpu.md)
#   Kokkos_ROOT=/opt/kokkos scripts/bootstrap.sh   use an existing Kokkos (3.4 or newer) instead
#   scripts/bootstrap.sh --prefix            only print the prefix this backend's Kokkos is (or would be)
#                                            built into; installs and builds nothing. CMakeLists.txt asks
#                                            this, so the cache's naming lives here alone.
#
# Environment: TLSE_CACHE (default ~/.cache/tiledlse), TLSE_SKIP_APT=1 to skip apt-get.
set -euo pipefail
shopt -s inherit_errexit

KOKKOS_VERSION=3.4.01
TRILINOS_VERSION=13.2.0
cache=${TLSE_CACHE:-$HOME/.cache/tiledlse}
backend=${TLSE_BACKEND:-openmp}
RECIPE=r2  # bump when the build flags below change, so cached builds are not reused
prefix=$cache/kokkos-$KOKKOS_VERSION-$backend-$RECIPE
log() { echo "[bootstrap] $*" >&2; }
if [ "${1:-}" = --prefix ]; then echo "$prefix"; exit 0; fi

debian_packages=(build-essential cmake ninja-build pkg-config xz-utils dpkg-dev
                 libgtest-dev libbenchmark-dev libopenmpi-dev openmpi-bin
                 python3 python3-numpy python3-matplotlib
                 gfortran python3-torch python3-pytest  # Fortran example; Python package tests
                 python3-pip python3-venv)  # pip wheel . (scripts/wheel.sh), venvs for the wheel and the pinned PyPI packages

# Writes apt sources derived from the machine's own Debian entry, so no archive host is typed
# here: $2 = Types (e.g. "deb-src"), $3 = Components.
private_apt_sources() {
  local src=/etc/apt/sources.list.d/debian.sources out=$1 types=$2 components=$3
  [ -r "$src" ] || { log "no $src: cannot derive a deb-src entry"; return 1; }
  local uri suites
  uri=$(awk '/^URIs:/{print $2; exit}' "$src")
  suites=$(awk '/^Suites:/{sub(/^Suites: */,""); print; exit}' "$src")
  cat >"$out" <<SRC
Types: $types
URIs: $uri
Suites: $suites
Components: $components
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
}

apt_updated=0
apt_install() {
  [ "${TLSE_SKIP_APT:-0}" = 1 ] && return 0
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]}"
  if [ $apt_updated = 0 ]; then apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

trilinos_tarball() {
  local dir=$cache/src tarball
  tarball=$dir/trilinos_$TRILINOS_VERSION.orig.tar.gz
  if [ ! -s "$tarball" ]; then
    mkdir -p "$dir/apt-lists/partial"
    private_apt_sources "$dir/debian-src.sources" "deb deb-src" main
    # apt reads deb822 files only from sourceparts: give it a folder holding just ours.
    mkdir -p "$dir/parts"; cp "$dir/debian-src.sources" "$dir/parts/"
    local opts=(-o Dir::Etc::sourcelist=/dev/null -o "Dir::Etc::sourceparts=$dir/parts"
                -o "Dir::State::Lists=$dir/apt-lists" -o APT::Sandbox::User=root)
    log "fetching trilinos $TRILINOS_VERSION source from Debian"
    apt-get "${opts[@]}" update -qq
    (cd "$dir" && apt-get "${opts[@]}" source --download-only -qq trilinos >/dev/null)
    [ -s "$tarball" ] || { log "Debian's trilinos source is not $TRILINOS_VERSION: $(ls "$dir")"; exit 1; }
  fi
  echo "$tarball"
}

build_kokkos() {
  local tarball src build
  tarball=$(trilinos_tarball)
  src=$cache/src/trilinos-$TRILINOS_VERSION
  if [ ! -d "$src/packages/kokkos-kernels" ]; then
    log "extracting packages/kokkos and packages/kokkos-kernels"
    mkdir -p "$src"
    tar -xzf "$tarball" -C "$src" --strip-components=1 --wildcards \
      '*/packages/kokkos/*' '*/packages/kokkos-kernels/*'
  fi
  build=$cache/build-$KOKKOS_VERSION-$backend
  rm -rf "$build"
  local flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17
               -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DCMAKE_INSTALL_PREFIX="$prefix")
  case $backend in
    openmp) flags+=(-DCMAKE_CXX_COMPILER=g++ -DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_SERIAL=ON) ;;
    cuda)
      # Kokkos 3.4 knows no Hopper arch and nvcc_wrapper refuses two -arch flags: configure for
      # Ampere and let a wrapper rewrite the arch to sm_90 (TOOLCHAIN.md).
      mkdir -p "$prefix/bin"
      cp "$src/packages/kokkos/bin/nvcc_wrapper" "$prefix/bin/nvcc_wrapper"
      cat >"$prefix/bin/nvcc_sm90" <<'WRAP'
#!/usr/bin/env bash
args=()
for a in "$@"; do args+=("${a//sm_80/sm_90}"); done
exec "$(dirname "$0")/nvcc_wrapper" "${args[@]}"
WRAP
      chmod +x "$prefix/bin/nvcc_sm90"
      # CUDA 11.8's headers before any CUDA 13 headers the image has, first on every compile line.
      "$(dirname "${BASH_SOURCE[0]}")/cuda_header_links.sh" "$prefix/cuda-11.8-include"
      sed -i "s|^exec .*|exec \"\$(dirname \"\$0\")/nvcc_wrapper\" -I$prefix/cuda-11.8-include \"\${args[@]}\"|" "$prefix/bin/nvcc_sm90"
      flags+=(-DCMAKE_CXX_COMPILER="$prefix/bin/nvcc_sm90" -DKokkos_ENABLE_CUDA=ON -DKokkos_ENABLE_CUDA_LAMBDA=ON
              -DKokkos_ENABLE_SERIAL=ON -DKokkos_ARCH_AMPERE80=ON -DCUDAToolkit_ROOT=/usr
              -DCUDAToolkit_INCLUDE_DIR=/usr/include -DCUDA_ROOT=/usr) ;;
    hip)
      # Kokkos 3.4 knows AMD GPUs up to gfx908 (MI100, Kokkos_ARCH_VEGA908) and nothing in it
      # depends on which: configure for gfx908 and let a wrapper ask hipcc for gfx90a (MI210,
      # MI250X) instead, as nvcc_sm90 does for CUDA. Debian has no rocThrust, which 3.4 never uses.
      mkdir -p "$prefix/bin"
      cat >"$prefix/bin/hipcc_gfx90a" <<'WRAP'
#!/usr/bin/env bash
args=()
for a in "$@"; do args+=("${a//gfx908/gfx90a}"); done
# hipcc asks rocm_agent_enumerator for the GPU of this machine when a command names no target
# (a link): name it instead.
HCC_AMDGPU_TARGET=gfx90a exec hipcc "${args[@]}"
WRAP
      chmod +x "$prefix/bin/hipcc_gfx90a"
      flags+=(-DCMAKE_CXX_COMPILER="$prefix/bin/hipcc_gfx90a" -DKokkos_ENABLE_HIP=ON -DKokkos_ENABLE_SERIAL=ON
              -DKokkos_ARCH_VEGA908=ON) ;;
    *) log "unknown TLSE_BACKEND=$backend (openmp, cuda or hip)"; exit 2 ;;
  esac
  log "building Kokkos $KOKKOS_VERSION ($backend) into $prefix"
  cmake -S "$src/packages/kokkos" -B "$build/kokkos" "${flags[@]}" >"$build.log" 2>&1
  cmake --build "$build/kokkos" --target install >>"$build.log" 2>&1
  log "building Kokkos Kernels $KOKKOS_VERSION (header use, no ETI)"
  cmake -S "$src/packages/kokkos-kernels" -B "$build/kernels" "${flags[@]}" -DKokkos_ROOT="$prefix" \
    -DKokkosKernels_ADD_DEFAULT_ETI=OFF -DKokkosKernels_ENABLE_TESTS=OFF \
    -DKokkosKernels_ENABLE_TPL_BLAS=OFF -DKokkosKernels_ENABLE_TPL_CUBLAS=OFF \
    -DKokkosKernels_ENABLE_TPL_CUSPARSE=OFF >>"$build.log" 2>&1
  cmake --build "$build/kernels" --target install >>"$build.log" 2>&1
  rm -rf "$build"
  touch "$prefix/.complete"
}

# CUDA 11.8 and its host compiler come from Debian's non-free component.
install_cuda() {
  command -v /usr/lib/nvidia-cuda-toolkit/bin/nvcc >/dev/null && dpkg -s g++-11 >/dev/null 2>&1 && return 0
  [ "${TLSE_SKIP_APT:-0}" = 1 ] && { log "CUDA 11.8 is missing and TLSE_SKIP_APT=1"; exit 1; }
  local dir=$cache/apt-nonfree
  mkdir -p "$dir/parts" "$dir/lists/partial"
  private_apt_sources "$dir/parts/debian-nonfree.sources" deb "main contrib non-free"
  local opts=(-o Dir::Etc::sourcelist=/dev/null -o "Dir::Etc::sourceparts=$dir/parts"
              -o "Dir::State::Lists=$dir/lists" -o APT::Sandbox::User=root)
  log "installing CUDA 11.8 (nvidia-cuda-toolkit) and g++-11 from Debian non-free (a few minutes)"
  apt-get "${opts[@]}" update -qq
  DEBIAN_FRONTEND=noninteractive apt-get "${opts[@]}" install -y -qq --no-install-recommends \
    nvidia-cuda-toolkit g++-11 >/dev/null
}

debian_packages+=(doxygen)  # scripts/docs.sh; CI builds the documentation
# scripts/sanitize.sh: clang with its ASan/UBSan/libFuzzer runtimes, OpenMP and symbolizer;
# hypothesis for the Python property tests.
debian_packages+=(clang-14 libclang-rt-14-dev libomp-14-dev llvm-14 python3-hypothesis)
apt_install "${debian_packages[@]}"
if [ "$backend" = cuda ]; then
  install_cuda
  "$(dirname "${BASH_SOURCE[0]}")/hopper_toolchain.sh" >/dev/null
  # The image's CUDA 13 must not shadow 11.8's tools (its ptxas would be picked up).
  export PATH=/usr/lib/nvidia-cuda-toolkit/bin:/usr/sbin:/usr/bin:/sbin:/bin
  export NVCC_WRAPPER_DEFAULT_COMPILER=g++-11
fi
if [ "$backend" = hip ]; then
  # ROCm 5.2.3 in Debian 12 (main); hipcc is its clang 15 driver. Without an AMD GPU, hipcc
  # --version prints a traceback from rocm_agent_enumerator (no /sys/class/kfd): harmless.
  apt_install hipcc libamdhip64-dev rocm-device-libs
  rocm=$(dpkg-query -W -f='${Version}' hipcc 2>/dev/null || echo none)
  case $rocm in
    5.2.*) ;;
    *) log "hipcc is $rocm; the HIP build was checked with Debian 12's 5.2.3 (docs/gpu.md)" ;;
  esac
fi
if [ -n "${Kokkos_ROOT:-}" ]; then
  log "using the given Kokkos_ROOT=$Kokkos_ROOT"
  echo "$Kokkos_ROOT"
  exit 0
fi
if [ -f "$prefix/.complete" ]; then
  log "reusing $prefix"
else
  build_kokkos
fi
echo "$prefix"
