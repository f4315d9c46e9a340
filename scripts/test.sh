#!/usr/bin/env bash
# Runs the whole test suite: installs what is missing (scripts/bootstrap.sh, cached), builds
# everything in build/ and runs ctest. Exit status is ctest's.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/configure.sh"
cmake --build "$root/build" --parallel "$(nproc)"
cd "$root/build"
# ctest runs as many tests at once as there are cores, each OpenMP one with as many threads: idle
# OpenMP threads that spin (libgomp's default) take cores from the other tests, so they sleep
# (docs/notes/2026-11-28.md, "Test and build times on CI's two cores").
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
OMP_PROC_BIND=false ctest --output-on-failure --parallel "$(nproc)" --timeout 900
