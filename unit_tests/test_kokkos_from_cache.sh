#!/usr/bin/env bash
# CMakeLists.txt finds the Kokkos that scripts/bootstrap.sh built into its cache with no variable
# set (what `pip install .` after the bootstrap relies on), and a CUDA build against a Kokkos
# without CUDA stops with one line saying how to get the CUDA build. Configures the project
# (nothing built) against a stand-in cache whose entry, named by bootstrap.sh --prefix, links to
# the Kokkos at KOKKOS_PREFIX.
#
#   unit_tests/test_kokkos_from_cache.sh KOKKOS_PREFIX (a host Kokkos: OpenMP or Serial)
# Environment: CMAKE (default cmake).
set -uo pipefail
source=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kokkos=${1:?usage: test_kokkos_from_cache.sh KOKKOS_PREFIX}
[ -f "$kokkos/lib/cmake/Kokkos/KokkosConfig.cmake" ] || [ -f "$kokkos/lib64/cmake/Kokkos/KokkosConfig.cmake" ] ||
  { echo "test_kokkos_from_cache.sh: '$kokkos' holds no lib/cmake/Kokkos/KokkosConfig.cmake"; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset Kokkos_ROOT Kokkos_DIR
export TLSE_CACHE=$work/cache
failures=0
configure() {  # configure <build dir> <cmake arguments...>: the output
  local dir=$1; shift
  "${CMAKE:-cmake}" -S "$source" -B "$work/$dir" -DTiledLSE_ENABLE_TESTS=OFF -DTiledLSE_ENABLE_C_API=OFF "$@" 2>&1
}

# No Kokkos anywhere: the error names the ways to give one.
out=$(configure none)
grep -q "TiledLSE needs Kokkos 3.4 or newer" <<<"$out" ||
  { echo "FAILED: without a Kokkos, expected the 'needs Kokkos' error, got: $out"; failures=$((failures + 1)); }

# The bootstrap's entry (named by bootstrap.sh), complete: found with no variable. It links to
# the given Kokkos' folders and has its own .complete, as the bootstrap leaves it.
make_entry() {  # make_entry <backend>
  local entry
  entry=$(TLSE_BACKEND=$1 "$source/scripts/bootstrap.sh" --prefix)
  rm -rf "$TLSE_CACHE" && mkdir -p "$entry"
  ln -s "$kokkos"/* "$entry/" && touch "$entry/.complete"
  echo "$entry"
}
entry=$(make_entry openmp)
out=$(configure found)
found=$(grep -m1 '^Kokkos_DIR:' "$work/found/CMakeCache.txt" 2>/dev/null)
[[ $found == *"$entry"* ]] ||
  { echo "FAILED: expected Kokkos_DIR under $entry, got '$found': $out"; failures=$((failures + 1)); }

# The CUDA build asked of a Kokkos without CUDA (the host Kokkos in the bootstrap's CUDA entry):
# an error whose message is one line, with the way to the CUDA build.
make_entry cuda >/dev/null
out=$(configure cuda -DTiledLSE_ENABLE_CUDA=ON)
grep -q "needs a Kokkos built for CUDA.*scripts/wheel.sh --cuda" <<<"$(tr '\n' ' ' <<<"$out" | tr -s ' ')" ||
  { echo "FAILED: expected the CUDA build's message, got: $out"; failures=$((failures + 1)); }
[ $failures = 0 ] && echo "test_kokkos_from_cache.sh: passed"
exit $((failures > 0))
