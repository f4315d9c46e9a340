#!/usr/bin/python3
"""Draws docs/img/memory.png: extra memory of one forward+backward step, TiledLSE against the
materialized baseline.

    memory_plot.py HOST.json OUT.png [--gpu docs/data/memory_gpu_h100.json]

Three panels are measured on the host (HOST.json from perf_tests/run_memory.sh: peak of live
Kokkos allocations during the step); the fourth is computed for GPU-sized problems (logit matrix
bytes against the workspace bound of docs/api.md), with the H100 figures measured by the `tlse`
tool (docs/performance.md) as points.
"""
import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.ticker import FuncFormatter  # noqa: E402

COLOR = {"tiledlse": "tab:blue", "materialized": "tab:red"}
MIB = 2.0**20


def bytes_label(v, _pos=None):
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if v >= size:
            return f"{v / size:g} {unit}"
    return f"{v:g} B"


def axes_style(ax, x_name, title):
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(FuncFormatter(bytes_label))
    ax.set_xlabel(x_name)
    ax.set_ylabel("extra memory")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)


def measured_panel(ax, points, x_key, title, x_name):
    points = sorted(points, key=lambda p: p[x_key])
    x = [p[x_key] for p in points]
    for impl, label in (("materialized", "materialized (measured)"), ("tiledlse", "TiledLSE (measured)")):
        ax.plot(x, [p[f"{impl}_bytes"] for p in points], "o-", color=COLOR[impl], label=label)
    last = points[-1]
    ax.annotate(f"{last['materialized_bytes'] / last['tiledlse_bytes']:.0f}x less",
                (x[-1], last["tiledlse_bytes"]), textcoords="offset points", xytext=(-60, 12), fontsize=8)
    axes_style(ax, x_name, title)


def gpu_panel(ax, gpu):
    """Computed: float32 logits of a materializing implementation (rows x cols x 4 bytes) against
    TiledLSE's bound from docs/api.md: forward partials <= 64 (rows + cols) accumulators, plus
    the per-row arrays (contrastive b ints + 8b, cross-entropy 2N ints + 3N + V) and the saved
    LSEs (2b, N); accumulators are float32 for bf16/fp16/f32 inputs."""
    b = [2**k for k in range(12, 21)]
    ax.plot(b, [4.0 * x * x for x in b], "-", color=COLOR["materialized"], label="contrastive b x b logits (computed)")
    ax.plot(b, [4.0 * (x + 8 * x + 64 * 2 * x + 2 * x) for x in b], "-", color=COLOR["tiledlse"],
            label="contrastive TiledLSE, generic kernels (computed bound)")
    V = 128256
    n = [2**k for k in range(10, 18)]
    ax.plot(n, [4.0 * x * V for x in n], "--", color=COLOR["materialized"], label=f"CE N x {V} logits (computed)")
    ax.plot(n, [4.0 * (2 * x + 3 * x + V + 64 * (x + V) + x) for x in n], "--", color=COLOR["tiledlse"],
            label=f"CE V={V} TiledLSE, generic kernels (computed bound)")
    for p in gpu["points"]:
        if p["loss"] == "cross_entropy" and p["V"] != V:
            continue  # no line to compare it with
        x = p["b"] if p["loss"] == "contrastive" else p["N"]
        marker = "s" if p["loss"] == "contrastive" else "^"
        what = f"b={p['b']}" if p["loss"] == "contrastive" else f"N={p['N']}, V={p['V']}"
        ax.plot([x], [p["tiledlse_mib"] * MIB], marker, color="black", markersize=6,
                label=f"TiledLSE measured, H100 ({what}), generic backward")
    axes_style(ax, "batch b (contrastive) or tokens N (cross-entropy)", "GPU-sized problems (computed; points measured)")
    ax.text(0.98, 0.03, "not shown: the CUDA tensor-core backward's chunk of G\n"
            "(at most 64 MiB, plus split partials), not yet measured", transform=ax.transAxes,
            ha="right", va="bottom", fontsize=6.5)
    ax.legend(fontsize=6.5, loc="upper left")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("host")
    ap.add_argument("out")
    ap.add_argument("--gpu", default=str(Path(__file__).resolve().parent.parent / "docs/data/memory_gpu_h100.json"))
    args = ap.parse_args(argv)
    host = json.loads(Path(args.host).read_text())
    gpu = json.loads(Path(args.gpu).read_text())
    pts = host["points"]
    contrastive = [p for p in pts if p["loss"] == "contrastive"]
    ce = [p for p in pts if p["loss"] == "cross_entropy"]
    v_fixed = max({p["V"] for p in ce}, key=lambda v: sum(q["V"] == v for q in ce))
    n_fixed = max({p["N"] for p in ce}, key=lambda n: sum(q["N"] == n for q in ce))
    ctx = host["context"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    measured_panel(axes[0][0], contrastive, "b", f"Contrastive (symmetric CLIP), c={contrastive[0]['c']}, host",
                   "batch b")
    measured_panel(axes[0][1], [p for p in ce if p["V"] == v_fixed], "N",
                   f"Cross-entropy, V={v_fixed}, D={ce[0]['D']}, host", "tokens N")
    measured_panel(axes[1][0], [p for p in ce if p["N"] == n_fixed], "V",
                   f"Cross-entropy, N={n_fixed}, D={ce[0]['D']}, host", "vocabulary V")
    gpu_panel(axes[1][1], gpu)
    fig.suptitle(f"Extra memory of a forward+backward step beyond inputs and gradients, f32\n"
                 f"host panels measured {ctx['date'][:10]} on {ctx['cpu']} ({ctx['cpus']} vCPUs, {ctx['os']}), "
                 f"peak of live Kokkos allocations", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main(sys.argv[1:])
