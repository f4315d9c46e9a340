#!/usr/bin/env bash
# Runs the libFuzzer target of the C API (c_api/fuzz/fuzz_c_api.cpp, built under ASan + UBSan by
# scripts/sanitize.sh into build-sanitize/) for SECONDS, starting from the committed seed corpus
# c_api/fuzz/seeds.b64 (one input per line, base64); the inputs it finds go to $work/corpus
# (kept between runs), a failing input and the log to $work/artifacts/.
# Prints the number of executions; fails on any finding (a crash, a sanitizer report, a violated
# check of the target, a timeout, a leak).
#
#   scripts/fuzz.sh [SECONDS] [libFuzzer options...]    default 60 s
#   OMP_NUM_THREADS=1 TLSE_FUZZ_WORK=build-sanitize/fuzz-long scripts/fuzz.sh 86400 -runs=10000000
#                                                        the long run of docs/errors.md
#   scripts/fuzz.sh --update-seeds                       rewrites seeds.b64: the smallest set of the
#                                                        seeds and the corpus with the same coverage
#   build-sanitize/c_api/fuzz/fuzz_c_api FILE           replays one input (prints the call on failure)
#
# Environment: OMP_NUM_THREADS (default 2: the kernels' threads run as in production),
# TLSE_FUZZ_WORK (default build-sanitize/fuzz: corpus, artifacts, log).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build-sanitize
fuzzer=$build/c_api/fuzz/fuzz_c_api
seeds=$root/c_api/fuzz/seeds.b64
[ -x "$fuzzer" ] || { echo "[fuzz] no $fuzzer: run scripts/sanitize.sh first" >&2; exit 1; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_PROC_BIND=false
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1
export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-/usr/lib/llvm-14/bin/llvm-symbolizer}
work=$(realpath -m "${TLSE_FUZZ_WORK:-$build/fuzz}")
mkdir -p "$work/corpus" "$work/artifacts"

# The seeds as files, as libFuzzer reads them.
rm -rf "$work/seeds" && mkdir -p "$work/seeds"
n=0
while read -r line; do
  [ -z "$line" ] && continue
  echo "$line" | base64 -d >"$work/seeds/$n"
  n=$((n + 1))
done < <(grep -v '^#' "$seeds" 2>/dev/null || true)

if [ "${1:-}" = --update-seeds ]; then
  rm -rf "$work/merged" && mkdir -p "$work/merged"
  "$fuzzer" -merge=1 -use_counters=0 -use_value_profile=0 "$work/merged" "$work/seeds" "$work/corpus" \
    >"$work/artifacts/merge.log" 2>&1
  { echo "# Seed corpus of c_api/fuzz/fuzz_c_api.cpp, one input per line (base64): scripts/fuzz.sh --update-seeds"
    for f in "$work/merged"/*; do base64 -w0 "$f"; echo; done | sort; } >"$seeds"
  echo "[fuzz] $(grep -vc '^#' "$seeds") seeds in $seeds" >&2
  exit 0
fi

seconds=${1:-60}
shift || true
log=$work/artifacts/last-run.log
status=0
start=$SECONDS
# -entropic=0: libFuzzer's default (entropic) input scheduling spent most of this target's time in
# its own bookkeeping (its tens of thousands of features); without it, more executions per second
# and as much coverage (docs/notes/2026-11-23.md, "The C API's fuzz target without entropic
# scheduling").
"$fuzzer" -max_total_time="$seconds" -timeout=30 -print_final_stats=1 -entropic=0 -artifact_prefix="$work/artifacts/" \
  "$@" "$work/corpus" "$work/seeds" >"$log" 2>&1 || status=$?
runs=$(awk '/stat::number_of_executed_units:/ {print $2}' "$log")
echo "[fuzz] ${runs:-0} executions in $((SECONDS - start)) s from $n seeds, $(ls "$work/corpus" | wc -l) inputs in the corpus; log: $log" >&2
if [ "$status" -ne 0 ]; then
  grep -E -A30 'fuzz_c_api:|ERROR: (Address|Leak|libFuzzer)|runtime error|deadly signal' "$log" | head -60 >&2 || true
  echo "[fuzz] FAILED (exit $status); the input is in $work/artifacts/" >&2
fi
exit "$status"
