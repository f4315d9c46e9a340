#!/usr/bin/env bash
# backends/cuda/hopper/wgmma_guard.sh on stand-in compiles: a clean compile passes, one whose
# ptxas reports serialized wgmma fails in error mode and passes with a warning in warn mode, and
# a failing compile keeps its status, and a mode other than error or warn is refused before any
# compile runs.
set -uo pipefail
guard=$(dirname "${BASH_SOURCE[0]}")/../backends/cuda/hopper/wgmma_guard.sh
serialized="ptxas info    : (C7513) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non wgmma instructions defining input registers of a wgmma between start and end of the pipeline stage in the function 'kernel'"
failures=0
expect() {  # expect <status> <stderr pattern or -> <guard arguments...>
  local want=$1 pattern=$2 got err
  shift 2
  err=$("$guard" "$@" 2>&1 >/dev/null)
  got=$?
  if [ "$got" != "$want" ] || { [ "$pattern" != - ] && ! grep -q "$pattern" <<<"$err"; }; then
    echo "FAILED: wgmma_guard.sh $1 ...: status $got (expected $want), stderr: $err"
    failures=$((failures + 1))
  fi
}
expect 0 - error bash -c 'echo "ptxas info : Used 168 registers" >&2'
expect 1 "serialized the wgmma of 1 kernel" error bash -c "echo \"$serialized\" >&2"
expect 0 "serialized the wgmma of 1 kernel" warn bash -c "echo \"$serialized\" >&2"
expect 3 - error bash -c 'echo "error: no such file" >&2; exit 3'
expect 3 "serialized" error bash -c "echo \"$serialized\" >&2; exit 3"
expect 2 "must be error or warn, got 'eror'" eror bash -c 'touch /dev/null'
expect 2 "must be error or warn, got ''" ""
[ $failures = 0 ] && echo "wgmma_guard: 7 cases passed"
exit $((failures > 0))
