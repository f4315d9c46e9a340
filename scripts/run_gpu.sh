#!/usr/bin/env bash
# On the GPU machine: runs the CUDA unit tests built by scripts/build_cuda.sh (carried in
# build-cuda/carry/), and the direct check of the Hopper kernels (test_hopper_kernels; exit 77,
# reported as skipped, on a device that is not sm_90). TLSE_CUDA_KERNELS=hopper|mma|generic in
# the environment picks the kernels of the unit tests (kernel_path.hpp). Exit status: non-zero
# if any test binary failed.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/scripts/carry_dir.sh"
export LD_LIBRARY_PATH=$carry${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "TLSE_CUDA_KERNELS=${TLSE_CUDA_KERNELS:-auto}"
status=0
for t in "$carry"/test_*; do
  echo "== ${t##*/}"
  if [ "${t##*/}" = test_hopper_kernels ]; then
    "$t"
  else
    "$t" --gtest_brief=1 "$@"
  fi
  rc=$?
  [ $rc = 77 ] && echo "(skipped)" && continue
  [ $rc = 0 ] || status=1
done
exit $status
