#!/usr/bin/env bash
# Makes DIR (afresh) a folder of links to /usr/include's headers of every name /usr/local/include
# also has. Some images link CUDA 13's headers into /usr/local/include, which the host compiler
# searches before /usr/include; with -IDIR first on every compile line, a CUDA 11.8 build sees
# 11.8's headers again. Used by scripts/bootstrap.sh (Kokkos 3.4's nvcc_sm90) and
# scripts/build_cuda.sh (another Kokkos' nvcc_wrapper).
#   scripts/cuda_header_links.sh DIR
set -euo pipefail
dir=${1:?usage: scripts/cuda_header_links.sh DIR}
rm -rf "$dir" && mkdir -p "$dir"
for f in /usr/local/include/*; do
  if [ -e "/usr/include/${f##*/}" ]; then ln -s "/usr/include/${f##*/}" "$dir/"; fi
done
