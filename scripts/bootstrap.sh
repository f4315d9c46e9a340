#!/usr/bin/env bash
# Installs what TiledLSE needs on Debian 12 (as root, Debian's archive only) and builds
# Kokkos 3.4.01 + Kokkos Kernels 3.4.01 from Debian's `trilinos` source package into a cache
# outside the clone, keyed by version and backend, reused when present.
#
#   scripts/bootstrap.sh            host backend (OpenMP + Serial); prints the Kokkos prefix last
#   Kokkos_ROOT=/opt/kokkos scripts/bootstrap.sh   use an existing Kokkos (3.4 or newer) instead
#
# Environment: TLSE_CACHE (default ~/.cache/tiledlse), TLSE_SKIP_APT=1 to skip apt-get.
set -euo pipefail
shopt -s inherit_errexit

KOKKOS_VERSION=3.4.01
TRILINOS_VERSION=13.2.0
cache=${TLSE_CACHE:-$HOME/.cache/tiledlse}
backend=${TLSE_BACKEND:-openmp}
prefix=$cache/kokkos-$KOKKOS_VERSION-$backend
log() { echo "[bootstrap] $*" >&2; }

debian_packages=(build-essential cmake ninja-build pkg-config xz-utils dpkg-dev
                 libgtest-dev libbenchmark-dev libopenmpi-dev openmpi-bin
                 python3 python3-numpy python3-matplotlib)

# Writes apt sources for deb-src (main) derived from the machine's own Debian entry,
# so no archive host is typed here.
private_apt_sources() {
  local src=/etc/apt/sources.list.d/debian.sources out=$1
  [ -r "$src" ] || { log "no $src: cannot derive a deb-src entry"; return 1; }
  local uri suites
  uri=$(awk '/^URIs:/{print $2; exit}' "$src")
  suites=$(awk '/^Suites:/{sub(/^Suites: */,""); print; exit}' "$src")
  cat >"$out" <<SRC
Types: deb deb-src
URIs: $uri
Suites: $suites
Components: main
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
    private_apt_sources "$dir/debian-src.sources"
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
    *) log "unknown TLSE_BACKEND=$backend"; exit 2 ;;
  esac
  log "building Kokkos $KOKKOS_VERSION ($backend) into $prefix"
  cmake -S "$src/packages/kokkos" -B "$build/kokkos" "${flags[@]}" >"$build.log" 2>&1
  cmake --build "$build/kokkos" --target install >>"$build.log" 2>&1
  log "building Kokkos Kernels $KOKKOS_VERSION (header use, no ETI)"
  cmake -S "$src/packages/kokkos-kernels" -B "$build/kernels" "${flags[@]}" -DKokkos_ROOT="$prefix" \
    -DKokkosKernels_ADD_DEFAULT_ETI=OFF -DKokkosKernels_ENABLE_TESTS=OFF \
    -DKokkosKernels_ENABLE_TPL_BLAS=OFF >>"$build.log" 2>&1
  cmake --build "$build/kernels" --target install >>"$build.log" 2>&1
  rm -rf "$build"
  touch "$prefix/.complete"
}

apt_install "${debian_packages[@]}"
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
