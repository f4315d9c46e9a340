#!/usr/bin/python3
"""Draws docs/img/gpu_times.png from docs/data/gpu.json (the GPU table of docs/performance.md).

    plot_gpu.py [docs/data/gpu.json] [docs/img/gpu_times.png]

For each case: forward and forward+backward time of TiledLSE and of the materialized PyTorch
baseline measured in the same device session, and the issue's target where there is one.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "docs/data/gpu.json"
    dst = sys.argv[2] if len(sys.argv) > 2 else "docs/img/gpu_times.png"
    with open(src) as f:
        data = json.load(f)
    cases = data["cases"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.6 * len(cases) + 2), sharey=True)
    for ax, (key, title) in zip(axes, [("fw_ms", "forward"), ("fwbw_ms", "forward + backward")]):
        series = [("tiledlse_", "TiledLSE", "tab:blue"), ("torch_", "PyTorch (materialized)", "tab:gray")]
        h = 0.38
        for k, (prefix, label, color) in enumerate(series):
            ys = [i + (k - 0.5) * h for i in range(len(cases))]
            xs = [c.get(prefix + key) or 0 for c in cases]
            ax.barh(ys, xs, height=h, label=label, color=color)
            for y, x in zip(ys, xs):
                if x:
                    ax.text(x, y, f" {x:.0f}", va="center", fontsize=7)
        targets = [(i, c.get("target_" + key)) for i, c in enumerate(cases) if c.get("target_" + key)]
        for i, t in targets:
            ax.plot([t, t], [i - 0.45, i + 0.45], color="tab:red", lw=2, label="target (H200)" if i == targets[0][0] else None)
        ax.set_xscale("log")
        ax.set_xlabel("ms (log scale)")
        ax.set_title(title)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
    axes[0].set_yticks(range(len(cases)))
    axes[0].set_yticklabels([c["name"] for c in cases], fontsize=8)
    axes[0].invert_yaxis()
    fig.suptitle(f"{data['device']}, {data['date']}: TiledLSE vs PyTorch materializing the logits")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main()
