#!/usr/bin/env bash
# On the GPU machine, in one call: the cases of the Hopper issue (docs/gpu.md) timed with the
# Hopper kernels and with the mma.sync kernels, the cross-entropy under several memory budgets,
# and PyTorch's materialized baselines (shared/bench/baselines.py, copied into the tree as
# perf_tests/baselines.py for the call) on the same device. Writes one log line per run to
# $OUT/gpu_hopper.log (or ./gpu_hopper.log) and prints a short table last.
#   perf_tests/run_gpu_hopper.sh [--quick]   --quick: one case per loss, 3 iterations
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
carry=${TLSE_CARRY:-$root/build-cuda/carry}
export LD_LIBRARY_PATH=$carry${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
log=${OUT:-.}/gpu_hopper.log
iterations=10
[ "${1:-}" = --quick ] && iterations=3
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$log"

run() {  # run <path> <tlse arguments...>
  local path=$1
  shift
  echo "== TLSE_CUDA_KERNELS=$path tlse $*" | tee -a "$log"
  TLSE_CUDA_KERNELS=$path "$carry/tlse" "$@" --no-baseline --iterations "$iterations" 2>&1 | tee -a "$log"
}

for path in hopper mma; do
  run $path cross-entropy --tokens 8192 --dim 4096 --vocab 128256 --dtype bf16
  [ "${1:-}" = --quick ] && { run $path contrastive --batch 65536 --dim 512 --dtype bf16; continue; }
  run $path cross-entropy --tokens 4096 --dim 4096 --vocab 128256 --dtype bf16
  run $path cross-entropy --tokens 8192 --dim 2304 --vocab 256000 --dtype bf16
  run $path contrastive --batch 65536 --dim 512 --dtype bf16
  run $path contrastive --batch 65536 --dim 512 --dtype f32 --precision tf32
done
# Time against the memory budget (the fused backward's panel width), cross-entropy bf16.
for mib in 128 192 256 512 1024 4096; do
  run hopper cross-entropy --tokens 8192 --dim 4096 --vocab 128256 --dtype bf16 --memory-budget $mib
done
if [ -f "$root/perf_tests/baselines.py" ]; then
  echo "== PyTorch baselines (materialized logits)" | tee -a "$log"
  python3 "$root/perf_tests/baselines.py" 2>&1 | tee -a "$log"
fi
echo "== summary (ms)"
grep -E "^== |TiledLSE|torch_materialized" "$log" | cut -c1-160
