#!/usr/bin/python3
"""Draws docs/img/ring_scaling.png from docs/data/ring_scaling.json: the distributed contrastive
loss's weak scaling (fixed rows per GPU: ideal time grows linearly with the GPU count, since each
GPU meets every row of the global batch) and strong scaling (fixed global batch: ideal time
falls as 1 / GPUs), measured with perf_tests/distributed_benchmark over NCCL.

    plot_scaling.py [docs/data/ring_scaling.json] [docs/img/ring_scaling.png]
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "docs/data/ring_scaling.json"
    dst = sys.argv[2] if len(sys.argv) > 2 else "docs/img/ring_scaling.png"
    with open(src) as f:
        d = json.load(f)
    fig, (weak, strong) = plt.subplots(1, 2, figsize=(11, 4))
    w = d["weak"]
    for dt, color in (("bf16", "tab:blue"), ("tf32", "tab:orange")):
        ms = w[f"{dt}_ms"]
        weak.plot(w["gpus"], ms, "o-", color=color, label=f"{dt} measured")
        weak.plot(w["gpus"], [ms[0] * g for g in w["gpus"]], ":", color=color, label=f"{dt} ideal")
        s = d["strong"]
        strong.plot(s["gpus"], s[f"{dt}_ms"], "o-", color=color, label=f"{dt} measured")
        strong.plot(s["gpus"], [s[f"{dt}_ms"][0] * s["gpus"][0] / g for g in s["gpus"]], ":", color=color,
                    label=f"{dt} ideal")
    weak.set_title(f"weak scaling, {w['rows_per_gpu']} rows per GPU, c = 512")
    strong.set_title(f"strong scaling, global batch {d['strong']['global_batch']}, c = 512")
    for ax in (weak, strong):
        ax.set_xlabel("GPUs")
        ax.set_ylabel("ms per forward + backward step")
        ax.set_xticks([1, 2, 4])
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{d['device']}, {d['date']}")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main()
