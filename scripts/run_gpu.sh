#!/usr/bin/env bash
# On the GPU machine: runs the CUDA unit tests built by scripts/build_cuda.sh (carried in
# build-cuda/carry/). Exit status: non-zero if any test binary failed.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
carry=${TLSE_CARRY:-$root/build-cuda/carry}
export LD_LIBRARY_PATH=$carry${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
status=0
for t in "$carry"/test_*; do
  echo "== ${t##*/}"
  "$t" --gtest_brief=1 "$@" || status=1
done
exit $status
