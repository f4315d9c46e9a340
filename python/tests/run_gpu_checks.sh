#!/usr/bin/env bash
# On the GPU machine, from the checkout, after scripts/build_cuda.sh on the CPU machine: the
# Python checks that need a GPU, torch >= 2.4 and transformers, with nothing but what
# build-cuda/carry/ holds and the machine's own Python packages (no network, no pip index).
#
#   python/tests/run_gpu_checks.sh [pytest arguments]
#
# 1. Lays out the installed package as the CUDA wheel has it (scripts/wheel.sh --cuda): the
#    carried tiledlse/ with libtiledlse_c.so and libcudart.so.11.0 inside (and
#    libtiledlse_hopper.so when carried), in a fresh folder that is the only thing added to the
#    Python path (no TILEDLSE_LIBRARY).
# 2. Runs every Python test against it, CPU and CUDA tensors: test_tiledlse, test_c_api (the
#    no-GPU case in a child with CUDA_VISIBLE_DEVICES=), test_compile (torch.library.opcheck,
#    a model compiled with fullgraph=True), test_transformers (Llama, Gemma 2 and Qwen 2 against
#    the model's loss; the peak memory of a step at V = 128256, printed),
#    test_transformers_trainer (tiledlse.transformers.apply: Trainer for 20 steps, patched against
#    unpatched, bf16 on CUDA at V = 128256; the peak memory of both runs, printed; needs
#    accelerate), test_distributed (gloo; NCCL with 2 GPUs or more).
# 3. The tool where no GPU is usable (CUDA_VISIBLE_DEVICES=): one line, exit status 1.
# Exit status: 0 when all passed. Environment: TLSE_CARRY (default build-cuda/carry), PYTHON
# (default python3).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
. "$root/scripts/carry_dir.sh"
python=${PYTHON:-python3}
unset TILEDLSE_LIBRARY PYTHONPATH
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
"$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
"$python" -c "import transformers; print('transformers', transformers.__version__)" || echo "no transformers"

site=$(mktemp -d)
cp -r "$carry/python/tiledlse" "$site/"
# libtiledlse_c.so, and the libraries it loads from beside itself (RUNPATH $ORIGIN): the CUDA
# runtime, and libtiledlse_hopper.so where the build has the Hopper kernels.
cp "$carry"/libtiledlse_*.so "$carry/libcudart.so.11.0" "$site/tiledlse/"
status=0
(cd "$site" && PYTHONPATH=$site "$python" -c "
import os, tiledlse
assert tiledlse.library_path == os.path.join(os.path.dirname(tiledlse.__file__), 'libtiledlse_c.so'), tiledlse.library_path
print('installed layout:', tiledlse.library_path, 'custom ops:', tiledlse._functions.CUSTOM_OPS)") || status=1

echo "== python tests"
(cd "$site" && PYTHONPATH=$site OMP_PROC_BIND=false "$python" "$root/python/tests/run_tests.py" -rs -s "$@") || status=1

echo "== tlse without a usable GPU"
out=$(CUDA_VISIBLE_DEVICES= LD_LIBRARY_PATH=$carry "$carry/tlse" contrastive --batch 64 --dim 8 2>&1)
code=$?
echo "$out (exit status $code)"
if [ $code -ne 1 ] || [ "$(echo "$out" | wc -l)" -ne 1 ] || ! echo "$out" | grep -q 'finds no usable GPU'; then
  echo "FAILED: expected one line and exit status 1"
  status=1
fi
rm -rf "$site"
echo "== run_gpu_checks: $([ $status = 0 ] && echo ALL PASSED || echo FAILED)"
exit $status
