#!/usr/bin/env bash
# On the GPU machine, in one call: the cases of the Hopper issue (docs/gpu.md) timed with the
# Hopper kernels (and with the mma.sync kernels: --with-mma, about 3 minutes more), PyTorch's
# materialized baselines (shared/bench/baselines.py, copied into the tree as
# perf_tests/baselines.py; it is git-ignored, so the device call must carry it) and cuBLAS's GEMM
# rate on the same device. Writes one log line per run to $OUT/gpu_hopper.log (or
# ./gpu_hopper.log) and prints a short table last. About 5 minutes on an H100.
#   perf_tests/run_gpu_hopper.sh [--quick] [--with-mma]   --quick: one case per loss, 3 iterations
#   perf_tests/run_gpu_hopper.sh --budgets   only time against the memory budget (cross-entropy,
#                                            contrastive): about 4 minutes
#   perf_tests/run_gpu_hopper.sh --step   only the training step in one call (cross_entropy_with_gradients,
#                                         tlse --training-step) at budgets that hold the logits,
#                                         PyTorch's cross-entropy baselines and cuBLAS's time for the
#                                         step's three products (gemm_rate.py --step): about 5 minutes
#   perf_tests/run_gpu_hopper.sh --tf32   only float with TF32 products: the contrastive case against
#                                         the memory budget on the Hopper kernels and on mma.sync, and
#                                         PyTorch's contrastive baselines: about 4 minutes
# (A device call runs at most 10 minutes: one mode per call.)
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/scripts/carry_dir.sh"
export LD_LIBRARY_PATH=$carry${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
log=${OUT:-.}/gpu_hopper.log
iterations=10 quick=0 paths=hopper step=0 budgets=0 tf32=0
for a in "$@"; do
  case $a in
    --quick) iterations=3 quick=1 ;;
    --with-mma) paths="hopper mma" ;;
    --step) step=1 paths= ;;
    --budgets) budgets=1 paths= ;;
    --tf32) tf32=1 paths= ;;
    *) echo "usage: $0 [--quick] [--with-mma] | --budgets | --step | --tf32" >&2 && exit 2 ;;
  esac
done
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$log"

run() {  # run <path> <tlse arguments...>
  local path=$1
  shift
  echo "== TLSE_CUDA_KERNELS=$path tlse $*" | tee -a "$log"
  TLSE_CUDA_KERNELS=$path timeout 120 "$carry/tlse" "$@" --no-baseline --iterations "$iterations" 2>&1 |
    grep -v '^\[tlse\]' | tee -a "$log"
}

for path in $paths; do
  run $path cross-entropy --tokens 8192 --dim 4096 --vocab 128256 --dtype bf16
  [ $quick = 1 ] && { run $path contrastive --batch 65536 --dim 512 --dtype bf16; continue; }
  run $path cross-entropy --tokens 4096 --dim 4096 --vocab 128256 --dtype bf16
  run $path cross-entropy --tokens 8192 --dim 2304 --vocab 256000 --dtype bf16
  run $path contrastive --batch 65536 --dim 512 --dtype bf16
  run $path contrastive --batch 65536 --dim 512 --dtype f32 --precision tf32
done
baselines() {  # baselines [ce|cl]
  [ -f "$root/perf_tests/baselines.py" ] || return 0
  echo "== PyTorch baselines (materialized logits)" | tee -a "$log"
  timeout 300 python3 "$root/perf_tests/baselines.py" "$@" 2>&1 | tee -a "$log"
}

if [ $step = 1 ]; then
  # The step in one call keeps the forward's exponentials (bf16) of a chunk of rows: every row
  # from about 2 GiB (8192 x 128256); the 16384-row case takes chunks through the fp32 dC
  # accumulator (2 GiB) at 3.5 GiB.
  run hopper cross-entropy --tokens 8192 --dim 4096 --vocab 128256 --dtype bf16 --training-step --memory-budget 4096
  run hopper cross-entropy --tokens 16384 --dim 4096 --vocab 128256 --dtype bf16 --training-step --memory-budget 3584
  run hopper cross-entropy --tokens 4096 --dim 4096 --vocab 128256 --dtype bf16 --training-step --memory-budget 2560
  run hopper cross-entropy --tokens 8192 --dim 2304 --vocab 256000 --dtype bf16 --training-step --memory-budget 9216
  baselines ce
  # The step's arithmetic alone at cuBLAS's rate: its three products back to back (gemm_rate.py).
  echo "== cuBLAS: the step's three products (torch.matmul)" | tee -a "$log"
  timeout 180 python3 "$root/perf_tests/gemm_rate.py" --step 2>&1 | tee -a "$log"
  echo "== summary (ms)"
  grep -E "^== |TiledLSE|torch_materialized|each_ms" "$log" | cut -c1-250
  exit 0
fi
if [ $tf32 = 1 ]; then
  # The backward's K-major copies (A^T, B^T, G^T) take memory: under the default 256 MiB its two
  # passes, from about 400 MiB the one pass with the fp32 accumulator. The mma.sync path for
  # comparison, and cross-entropy in float where a budget holds B^T.
  for mib in 256 384 512 1024 2048; do
    run hopper contrastive --batch 65536 --dim 512 --dtype f32 --precision tf32 --memory-budget $mib
  done
  run mma contrastive --batch 65536 --dim 512 --dtype f32 --precision tf32
  run hopper cross-entropy --tokens 8192 --dim 4096 --vocab 128256 --dtype f32 --precision tf32 --memory-budget 2048
  baselines cl
  echo "== summary (ms)"
  grep -E "^== |TiledLSE|torch_materialized" "$log" | cut -c1-200
  exit 0
fi
if [ $budgets = 1 ]; then
  # Time against the memory budget (the fused backward's panel width; at 64 and 128 MiB its two
  # passes, without the 128 MiB accumulator), cross-entropy bf16.
  for mib in 64 128 192 256 512 1024 2048; do
    run hopper cross-entropy --tokens 8192 --dim 4096 --vocab 128256 --dtype bf16 --memory-budget $mib
  done
  # The contrastive case under the issue's 128 MiB (the fused backward's fp32 accumulator alone
  # takes B x c x 4 bytes = 128 MiB, so its two passes run) and with room for a wider panel.
  for mib in 128 384; do
    run hopper contrastive --batch 65536 --dim 512 --dtype bf16 --memory-budget $mib
  done
  echo "== summary (ms)"
  grep -E "^== |TiledLSE" "$log" | cut -c1-200
  exit 0
fi
baselines
echo "== cuBLAS bf16 GEMM rate (torch.matmul) at the forward shapes" | tee -a "$log"
timeout 120 python3 "$root/perf_tests/gemm_rate.py" 2>&1 | tee -a "$log"
echo "== summary (ms)"
grep -E "^== |TiledLSE|torch_materialized|tflops" "$log" | cut -c1-200
