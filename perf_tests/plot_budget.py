#!/usr/bin/python3
"""Draws docs/img/step_budget.png: the bf16 training step's time against its memory budget at the
three cross-entropy shapes of docs/performance.md, over the limit (cuBLAS's three products of the
step, gemm_rate.py --step, in the same device call).

    plot_budget.py [--out docs/img/step_budget.png] SWEEP...

Each SWEEP is the output of a device call with one build: gemm_rate.py --step (JSON lines; the
limit is the last one read) and lines "LABEL bf16 N=.. D=.. V=.. budget=.. MiB: median .. ms .."
from budget_sweep.py (one per budget: the median over interleaved rounds on a warm card, what
docs/img/step_budget.png shows) or tiledlse_step.py. Where a budget has several lines the least
is drawn.
"""
import argparse
import json
import re
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

STEP = re.compile(r"bf16 N=(\d+) D=(\d+) V=(\d+) budget=(\d+) MiB: median ([\d.]+) ms")
LIMIT = re.compile(r"cross-entropy N=(\d+) D=(\d+) V=(\d+)")


def read(path, times, limits):
    """Adds a sweep's output to times {(N, D, V): {budget MiB: least median ms}} and limits
    {(N, D, V): ms}."""
    for line in open(path):
        if line.startswith("{"):
            record = json.loads(line)
            shape = LIMIT.match(record.get("case", ""))
            if shape and record.get("operands") == "as baselines.py draws them":
                limits[tuple(map(int, shape.groups()))] = record["ms"]
            continue
        step = STEP.search(line)
        if step:
            n, d, v, mib = map(int, step.groups()[:4])
            ms = float(step.group(5))
            times[(n, d, v)][mib] = min(ms, times[(n, d, v)].get(mib, ms))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweeps", nargs="+", metavar="SWEEP")
    parser.add_argument("--out", default="docs/img/step_budget.png")
    args = parser.parse_args()
    times, limits = defaultdict(dict), {}
    for path in args.sweeps:
        read(path, times, limits)
    dst = args.out
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (n, d, v), points in sorted(times.items()):
        budgets = sorted(points)
        limit = limits.get((n, d, v))
        ys = [points[b] / limit if limit else points[b] for b in budgets]
        ax.plot(budgets, ys, marker="o", label=f"N={n} D={d} V={v}" + (f" (limit {limit:.1f} ms)" if limit else ""))
    ax.set_xscale("log", base=2)
    ax.set_xticks([128, 256, 512, 1024, 2048, 4096])
    ax.set_xticklabels(["128M", "256M", "512M", "1G", "2G", "4G"])
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_xlabel("memory_budget")
    ax.set_ylabel("step time / cuBLAS's three products")
    ax.set_title("bf16 training step against its memory budget (H100)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print(dst)


if __name__ == "__main__":
    main()
