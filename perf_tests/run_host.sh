#!/usr/bin/env bash
# Builds tlse_benchmarks, runs the host sweep to JSON and turns it into the tables and plots
# that docs/performance.md shows (docs/data/host.json, docs/data/host_table.md, docs/img/host_*.png).
# About 10 minutes on 2 cores.
#
#   perf_tests/run_host.sh [extra tlse_benchmarks flags, e.g. --benchmark_filter=contrastive]
#
# Environment: Kokkos_ROOT (default: the prefix scripts/bootstrap.sh prints, built once and
# cached), BUILD_DIR (default build-perf), OMP_PROC_BIND (default false), OMP_NUM_THREADS.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$("$root/perf_tests/build_host.sh" tlse_benchmarks)

export OMP_PROC_BIND=${OMP_PROC_BIND:-false}
mkdir -p "$root/docs/data"
"$build/perf_tests/tlse_benchmarks" --benchmark_out="$root/docs/data/host.json" --benchmark_out_format=json "$@"
/usr/bin/python3 "$root/perf_tests/plot.py" "$root/docs/data/host.json" --img-dir "$root/docs/img" --prefix host \
  --table "$root/docs/data/host_table.md"
echo "[run_host] wrote docs/data/host.json, docs/data/host_table.md and docs/img/host_*.png" >&2
