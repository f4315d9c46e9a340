#!/usr/bin/env bash
# Measures the peak extra memory of a forward+backward step, TiledLSE against the materialized
# baseline, on this host (perf_tests/peak_memory), writes docs/data/memory_host.json and draws
# docs/img/memory.png through perf_tests/memory_plot.py. About 2 minutes on 2 cores.
#
#   perf_tests/run_memory.sh
#
# Environment: Kokkos_ROOT (default: the prefix scripts/bootstrap.sh prints), BUILD_DIR
# (default build-perf), OMP_PROC_BIND (default false), OMP_NUM_THREADS.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$("$root/perf_tests/build_host.sh" peak_memory)

export OMP_PROC_BIND=${OMP_PROC_BIND:-false}
run=$build/perf_tests/peak_memory
out=$root/docs/data/memory_host.json
{
  printf '{"context": {"date": "%s", "cpu": "%s", "cpus": %s, "os": "%s", "dtype": "f32"},\n "points": [\n' \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)" "$(nproc)" \
    "$(. /etc/os-release && echo "$PRETTY_NAME")"
  { "$run" contrastive 64 512 1024 2048 4096 8192 16384
    "$run" cross-entropy 64 32768 512 1024 2048 4096 8192
    "$run" cross-entropy-vocab 64 1024 8192 16384 32768 65536 131072; } | sed '$!s/$/,/'
  printf ' ]}\n'
} >"$out.tmp"
mv "$out.tmp" "$out"
/usr/bin/python3 "$root/perf_tests/memory_plot.py" "$out" "$root/docs/img/memory.png"
echo "[run_memory] wrote docs/data/memory_host.json and docs/img/memory.png" >&2
