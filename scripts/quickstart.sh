#!/usr/bin/env bash
# The README's first command: installs everything (scripts/bootstrap.sh, cached under
# ~/.cache/tiledlse), builds the library, the tool and the tests, and runs the main job: the
# contrastive loss and the cross-entropy of TiledLSE next to the materialized baseline, checked
# against the float64 reference. Extra arguments replace the default jobs: a single `tlse` run.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/configure.sh"
cmake --build "$root/build" --parallel "$(nproc)" --target tlse
export OMP_PROC_BIND=false
tlse=$root/build/apps/tlse
if [ $# -gt 0 ]; then exec "$tlse" "$@"; fi
"$tlse" contrastive --batch 2048 --dim 256 --check
"$tlse" cross-entropy --tokens 1024 --dim 256 --vocab 8192 --dtype bf16 --check
