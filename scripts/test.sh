#!/usr/bin/env bash
# Runs the whole test suite: installs what is missing (scripts/bootstrap.sh, cached), builds
# everything in build/ and runs ctest. Exit status is ctest's.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/configure.sh"
cmake --build "$root/build" --parallel "$(nproc)"
cd "$root/build"
OMP_PROC_BIND=false ctest --output-on-failure --parallel "$(nproc)" --timeout 900
