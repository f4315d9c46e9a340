#!/usr/bin/env bash
# Compiler launcher of the Hopper kernels (CUDA_COMPILER_LAUNCHER): runs one compile and looks at
# what ptxas said. Where ptxas serializes wgmma ("Potential Performance Loss: wgmma.mma_async
# instructions are serialized ...", infos C7510-C7520: a register of an in-flight wgmma written,
# a wgmma pipeline across a function call, too few registers), that kernel waits for each wgmma
# before issuing the next: correct, but its tensor cores run a fraction of their rate, and the
# build says so only in an info line. Seen twice (docs/notes/2026-11-26.md, "Tried and not kept:
# the products reading the exponentials as G"; docs/notes/2026-11-27.md, "A from registers (wgmma
# RS): tried, not kept").
#   wgmma_guard.sh error|warn <compile command...>
# error: the compile fails (scripts/build_cuda.sh, CI); warn: it succeeds with a warning line.
set -uo pipefail
mode=${1:-}
case "$mode" in
  error | warn) shift ;;
  *) echo "wgmma_guard: the first argument must be error or warn, got '$mode'" >&2 && exit 2 ;;
esac
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" 2>"$log"
status=$?
cat "$log" >&2
if grep -q "wgmma.mma_async instructions are serialized" "$log"; then
  kernels=$(grep -o "in the function '[^']*'" "$log" | sort -u | wc -l)
  echo "wgmma_guard: ptxas serialized the wgmma of $kernels kernel(s) (the C75xx infos above)" >&2
  [ "$mode" = error ] && [ "$status" = 0 ] && status=1
fi
exit $status
