#!/usr/bin/env bash
# On the GPU machine, in one call (issues 12 and 65; docs/gpu.md): the exact-float32 tile kernels
# (3xTF32 and FFMA products) checked and timed against PyTorch fp32, then gradient filtering
# measured on trained-LM-like inputs. Needs build-cuda/carry/ (scripts/build_cuda.sh) and, for
# PyTorch, shared/bench/baselines.py copied into the tree as perf_tests/baselines.py. Each step has
# its own time limit, so that one that hangs does not take the rest with it. Writes every line to
# $OUT/gpu_filtering.log (or ./gpu_filtering.log) and prints a summary last.
#   1. correctness of exact float32 on each of $EXACT_KERNELS (TLSE_CUDA_EXACT_F32; default
#      "tf32x3 ffma"): the f32 unit tests, and tlse --check on both losses at sizes with several
#      tiles, chunks and K splits (its lines give each path's error against float64);
#   2. the exact-float32 cases: contrastive B=65536 c=512 and cross-entropy N=4096 D=2048 V=65536,
#      on each of $EXACT_KERNELS, and PyTorch fp32 (TF32 off) on the same device;
#   3. filtering: cross-entropy bf16 N=4096 and N=8192, D=4096 V=128256, on --inputs lm: backward
#      with filtering off / default / default + sorted vocabulary, and the training step, skippable
#      tiles, and dE/dC error against float64 gradients on sampled rows and classes; the same study
#      on the random inputs (the worst case) at N=4096; then cuBLAS's three products of the step
#      (perf_tests/gemm_rate.py --step, the dense limit);
#   4. compute-sanitizer memcheck and racecheck on the exact-float32 kernels (a few small tests).
# Parts can run alone, e.g. in two calls when the device call's 10 minutes are short:
#   perf_tests/run_gpu_filtering.sh [all | any of: checks exact filtering sanitizer]
set -uo pipefail
parts=" ${*:-all} "
want() { [ "$parts" = " all " ] || [[ "$parts" == *" $1 "* ]]; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/scripts/carry_dir.sh"
export LD_LIBRARY_PATH=$carry${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
log=${OUT:-.}/gpu_filtering.log
: >"$log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$log"

run() {  # run <seconds> <command...>: logged, limited, its status logged
  local limit=$1
  shift
  echo "== $*" | tee -a "$log"
  timeout "$limit" "$@" 2>&1 | tee -a "$log"
  echo "-- status ${PIPESTATUS[0]}" | tee -a "$log"
}
kernels=${EXACT_KERNELS:-tf32x3 ffma}

# 1. Exact float32 on the tile kernels: correct first.
for k in $kernels; do
  exact=(env TLSE_CUDA_EXACT_F32=$k)
  want checks && for t in test_linear_lse test_cross_entropy test_contrastive; do
    run 300 "${exact[@]}" "$carry/$t" --gtest_filter='*f32*' --gtest_brief=1
  done
  if want checks; then
    run 300 "${exact[@]}" "$carry/tlse" cross-entropy --tokens 600 --dim 132 --vocab 70001 --dtype f32 --no-baseline --iterations 1 --check
    run 300 "${exact[@]}" "$carry/tlse" contrastive --batch 1500 --dim 132 --dtype f32 --no-baseline --iterations 1 --check
    run 300 "${exact[@]}" "$carry/tlse" contrastive --batch 4096 --dim 512 --dtype f32 --no-baseline --iterations 1 --check
  fi
done

# 2. Exact float32 times (fenced medians), each kernel then PyTorch fp32 in the same call.
if want exact; then
  f32=(--dtype f32 --no-baseline)
  for k in $kernels; do
    run 240 env TLSE_CUDA_EXACT_F32=$k "$carry/tlse" contrastive --batch 65536 --dim 512 "${f32[@]}" --iterations 5
    run 240 env TLSE_CUDA_EXACT_F32=$k "$carry/tlse" cross-entropy --tokens 4096 --dim 2048 --vocab 65536 "${f32[@]}" --iterations 5
  done
  if [ -f "$root/perf_tests/baselines.py" ]; then
    run 300 python3 "$root/perf_tests/baselines.py" cl
    run 180 python3 "$root/perf_tests/torch_cross_entropy.py" 4096 2048 65536 --dtype fp32
  else
    echo "(no perf_tests/baselines.py: copy shared/bench/baselines.py there for the PyTorch baselines)" | tee -a "$log"
  fi
fi

# 3. Gradient filtering on trained-LM-like inputs, then on the random ones.
if want filtering; then
  ce=(cross-entropy --dim 4096 --vocab 128256 --dtype bf16 --filter-study --training-step --no-baseline)
  run 300 "$carry/tlse" "${ce[@]}" --tokens 4096 --inputs lm --check-sampled --iterations 5
  run 420 "$carry/tlse" "${ce[@]}" --tokens 8192 --inputs lm --iterations 5
  run 300 "$carry/tlse" "${ce[@]}" --tokens 4096 --inputs random --iterations 3
  (cd "$root/perf_tests" && run 180 python3 gemm_rate.py --step)
fi

# 4. compute-sanitizer on the exact-float32 kernels.
if want sanitizer && command -v compute-sanitizer >/dev/null; then
  for k in $kernels; do
    for tool in memcheck racecheck; do
      run 240 env TLSE_CUDA_EXACT_F32=$k compute-sanitizer --tool $tool "$carry/test_linear_lse" \
        --gtest_filter='*f32*ExactFloat*:*f32*PrimeShapes*'
    done
    run 300 env TLSE_CUDA_EXACT_F32=$k compute-sanitizer --tool memcheck "$carry/test_cross_entropy" \
      --gtest_filter='*f32*GradientFilterSkips*'
  done
fi

echo "== summary"
grep -E "^== |^-- status|^TiledLSE|^no filter|^filter|^torch|fw_ms|check (passed|FAILED)|PASSED|FAILED|ERROR SUMMARY" \
  "$log" | cut -c1-200
