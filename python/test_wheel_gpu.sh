#!/usr/bin/env bash
# On a GPU machine: the CUDA wheel (scripts/wheel.sh --cuda) as a user gets it. Installs it with
# pip into a fresh virtual environment that sees the machine's Python packages (its PyTorch),
# with neither PYTHONPATH nor TILEDLSE_LIBRARY, and from outside the source tree:
#   1. checks that tiledlse imports from the virtual environment, loads its own library and the
#      Hopper kernels' library beside it, and runs a CUDA call on them;
#   2. runs python/tests against it, CPU and CUDA tensors (the Hugging Face model tests
#      test_transformers.py and test_transformers_trainer.py among them; -rs -s: skip reasons and
#      the peak-memory lines are printed);
#   3. trains a small Llama-style model for 20 steps in bf16 through tiledlse, the model's own
#      loss as the reference at every step (python/tests/gpu_llama_training.py).
#
#   python/test_wheel_gpu.sh WHEEL [pytest arguments]
#
# Environment: PYTHON (default python3, the one with torch); TLSE_WHEELS, a folder of wheels
# (transformers and what it needs) installed into the environment with --no-index only where
# PYTHON lacks transformers. Exit status 0 and a last line `== test_wheel_gpu: ALL PASSED` when all passed.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}
[ $# -ge 1 ] && [ -f "$1" ] || { echo "usage: python/test_wheel_gpu.sh WHEEL [pytest arguments] (got '${1:-}')" >&2; exit 2; }
wheel=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); shift
unset PYTHONPATH TILEDLSE_LIBRARY
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
py=$work/venv/bin/python
pip=("$py" -m pip)
if ! "$python" -m venv --system-site-packages "$work/venv"; then
  # A Python without ensurepip (Debian's and Ubuntu's without python3-venv): the environment
  # without pip, filled by PYTHON's pip (pip >= 22.3: --python).
  rm -rf "$work/venv"
  "$python" -m venv --system-site-packages --without-pip "$work/venv" || exit 1
  pip=("$python" -m pip --python "$py")
fi
# Where PYTHON is itself a virtual environment (the GPU image's python3 is /opt/torch/.venv's),
# --system-site-packages shows the base interpreter's packages, not that environment's torch:
# a .pth file adds its site-packages after the new environment's own, before the base's.
if [ "$("$python" -c 'import sys; print(sys.prefix != sys.base_prefix)')" = True ]; then
  purelib=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  "$python" -c "import site; print('\n'.join(site.getsitepackages()))" >"$purelib/parent_environment.pth"
  echo "PYTHON is a virtual environment: its site-packages added through $purelib/parent_environment.pth"
fi
"${pip[@]}" install --quiet --disable-pip-version-check --no-index --no-deps "$wheel" || exit 1
if ! "$py" -c "import transformers" 2>/dev/null && [ -n "${TLSE_WHEELS:-}" ]; then
  echo "installing transformers from $TLSE_WHEELS"
  "${pip[@]}" install --quiet --disable-pip-version-check --no-index --find-links "$TLSE_WHEELS" \
    "$TLSE_WHEELS"/*.whl || exit 1
fi
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
"$py" -c "import transformers; print('transformers', transformers.__version__)" || echo "no transformers"

cd "$work"  # not the source tree: `import tiledlse` must find the installed copy
status=0
echo "== the installed package"
"$py" - <<'CHECK' || status=1
import os, sys
import torch
import tiledlse
from tiledlse import _calls, _functions
package = os.path.dirname(tiledlse.__file__)
assert package.startswith(sys.prefix), "tiledlse imported from %s, not from the virtual environment" % package
assert tiledlse.library_path == os.path.join(package, "libtiledlse_c.so"), tiledlse.library_path
# A bf16 cross-entropy on the GPU, against PyTorch's on the logits.
torch.manual_seed(0)
e = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
c = torch.randn(1000, 256, device="cuda", dtype=torch.bfloat16) / 16
targets = torch.randint(0, 1000, (512,), device="cuda")
loss = tiledlse.linear_cross_entropy(e, c, targets)
expected = torch.nn.functional.cross_entropy(e.float() @ c.float().T, targets)
assert abs(loss.item() - expected.item()) <= 1e-4 * abs(expected.item()), (loss.item(), expected.item())
# The libraries the process mapped: the package's own, the CUDA runtime and the Hopper kernels beside it.
maps = open("/proc/self/maps").read()
for name in ("libtiledlse_c.so", "libtiledlse_hopper.so", "libcudart.so.11.0"):  # maps has real paths
    assert os.path.join(os.path.realpath(package), name) in maps, "%s is not loaded from %s" % (name, package)
# Only the Hopper kernels run the training step fused; the library says whether it does here.
config = _functions._cross_entropy_arguments(e, c, targets, None, -100, None, "mean", 0, "auto", 0.0, 1 << 40)[2]
assert _calls.step_fuses(e, c, config, False), "the library does not take the Hopper path on %s" % torch.cuda.get_device_name()
print("installed tiledlse %s at %s on %s: loss %.6f (PyTorch %.6f), Hopper kernels loaded and used"
      % (tiledlse.__version__, package, torch.cuda.get_device_name(), loss.item(), expected.item()))
CHECK

echo "== python tests"
OMP_PROC_BIND=false "$py" "$root/python/tests/run_tests.py" -rs -s "$@" || status=1

echo "== 20 training steps of a Llama-style model"
"$py" "$root/python/tests/gpu_llama_training.py" --steps 20 || status=1

echo "== test_wheel_gpu: $([ $status = 0 ] && echo ALL PASSED || echo FAILED)"
exit $status
