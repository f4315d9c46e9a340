#!/usr/bin/python3
"""Turns the JSON of tlse_benchmarks into markdown tables and PNG plots.

    plot.py RESULTS.json [--img-dir docs/img] [--prefix host] [--table FILE]

Writes <img-dir>/<prefix>_contrastive.png, <prefix>_cross_entropy.png (time against size) and
<prefix>_memory.png (extra memory against size), TiledLSE against the materialized baseline,
and prints the tables (or writes them to --table). Benchmark names read
<loss>/<pass>/<implementation>/<size>:<value>/... (see loss_benchmarks.cpp).
"""
import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

IMPLS = ("tiledlse", "materialized")
LABEL = {"tiledlse": "TiledLSE", "materialized": "materialized"}
PASSES = ("forward", "forward_backward")
PASS_LABEL = {"forward": "fwd", "forward_backward": "fwd+bwd"}


def load(path):
    """{(loss, pass, impl, sizes): record}; sizes is a tuple of (name, value) pairs.

    A record holds ms (median over repeated runs, if any), gflops, bytes, or skipped (the reason).
    """
    runs = defaultdict(list)
    with open(path) as f:
        data = json.load(f)
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        parts = b.get("run_name", b["name"]).split("/")
        loss, pass_, impl = parts[:3]
        sizes = tuple((k, int(v)) for k, v in (p.split(":") for p in parts[3:] if ":" in p))
        runs[(loss, pass_, impl, sizes)].append(b)
    table = {}
    for key, entries in runs.items():
        medians = [e for e in entries if e.get("run_type") == "aggregate"]
        entries = medians or entries
        if any(e.get("error_occurred") for e in entries):
            table[key] = {"skipped": entries[0].get("error_message", "not run")}
            continue
        assert all(e["time_unit"] == "ms" for e in entries), "tlse_benchmarks reports milliseconds"
        table[key] = {
            "ms": statistics.median(e["real_time"] for e in entries),
            "gflops": statistics.median(e["GFLOP/s"] for e in entries),
            "bytes": entries[0]["extra_bytes"],
        }
    return data.get("context", {}), table


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def size_text(sizes):
    return ", ".join(f"{k}={v}" for k, v in sizes)


def markdown(table, loss):
    """One row per size: times of both passes, GFLOP/s and extra memory, with the ratios
    baseline/TiledLSE (above 1: TiledLSE is faster, or smaller)."""
    sizes = sorted({k[3] for k in table if k[0] == loss}, key=lambda s: [v for _, v in s][::-1])
    head = ["size"]
    for p in PASSES:
        head += [f"{PASS_LABEL[p]} ms TiledLSE", f"{PASS_LABEL[p]} ms materialized", "baseline/TiledLSE"]
    head += ["fwd+bwd GFLOP/s TiledLSE", "fwd+bwd GFLOP/s materialized",
             "extra memory TiledLSE", "extra memory materialized", "baseline/TiledLSE"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in sizes:
        row = [size_text(s)]
        for p in PASSES:
            t, m = table.get((loss, p, "tiledlse", s), {}), table.get((loss, p, "materialized", s), {})
            row += [f"{t['ms']:.1f}" if "ms" in t else "—", f"{m['ms']:.1f}" if "ms" in m else "not run"]
            row += [f"{m['ms'] / t['ms']:.2f}x" if "ms" in t and "ms" in m else "—"]
        t = table.get((loss, "forward_backward", "tiledlse", s), {})
        m = table.get((loss, "forward_backward", "materialized", s), {})
        row += [f"{t['gflops']:.1f}" if "gflops" in t else "—", f"{m['gflops']:.1f}" if "gflops" in m else "—"]
        row += [human_bytes(t["bytes"]) if "bytes" in t else "—",
                human_bytes(m["bytes"]) if "bytes" in m else "not run"]
        row += [f"{m['bytes'] / t['bytes']:.0f}x" if "bytes" in t and "bytes" in m else "—"]
        lines.append("| " + " | ".join(row) + " |")
    skipped = sorted({(LABEL[k[2]], size_text(k[3]), v["skipped"]) for k, v in table.items()
                      if k[0] == loss and "skipped" in v})
    lines += [f"\n{impl} at {s}: {why}" for impl, s, why in skipped]
    return "\n".join(lines)


def series(table, loss, pass_, impl, x_of, keep=lambda s: True, value="ms"):
    pts = sorted((x_of(dict(k[3])), v[value]) for k, v in table.items()
                 if k[:3] == (loss, pass_, impl) and keep(dict(k[3])) and value in v)
    return [p[0] for p in pts], [p[1] for p in pts]


COLOR = {"tiledlse": "tab:blue", "materialized": "tab:red"}
DASH = {"forward": "--", "forward_backward": "-"}


def finish_axes(ax, x_name, y_name, title):
    """Log-log axes with labels; an axes without data is hidden."""
    if not ax.lines:
        ax.set_visible(False)
        return
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(x_name)
    ax.set_ylabel(y_name)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()


def save(fig, title, path):
    """Saves the figure if any of its axes has data."""
    if any(ax.get_visible() for ax in fig.axes):
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    plt.close(fig)


def time_plot(table, loss, panels, x_name, x_of, title, path):
    """One panel per (label, filter); log-log time against size, both passes, both implementations."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (panel_title, keep) in zip(axes[0], panels):
        for impl in IMPLS:
            for p in PASSES:
                x, y = series(table, loss, p, impl, x_of, keep)
                if x:
                    ax.plot(x, y, label=f"{LABEL[impl]} {PASS_LABEL[p]}", color=COLOR[impl], linestyle=DASH[p],
                            marker="o")
        finish_axes(ax, x_name, "time (ms)", panel_title)
    save(fig, title, path)


def memory_plot(table, vocabularies, path, where):
    """Extra memory of a forward+backward step: contrastive against b, cross-entropy against N per V."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    mib = lambda ys: [y / 2**20 for y in ys]  # noqa: E731
    for impl in IMPLS:
        x, y = series(table, "contrastive", "forward_backward", impl, lambda s: s["b"], value="bytes")
        if x:
            left.plot(x, mib(y), color=COLOR[impl], marker="o", label=LABEL[impl])
        for v, dash in zip(vocabularies, ("--", "-", ":", "-.")):
            x, y = series(table, "cross_entropy", "forward_backward", impl, lambda s: s["N"],
                          lambda s, v=v: s["V"] == v, value="bytes")
            if x:
                right.plot(x, mib(y), color=COLOR[impl], linestyle=dash, marker="o",
                           label=f"{LABEL[impl]} V={v}")
    for ax, x_name, title in ((left, "batch b", "contrastive"), (right, "tokens N", "cross-entropy")):
        finish_axes(ax, x_name, "extra memory (MiB)", title)
    save(fig, f"Extra memory beyond inputs and gradients ({where})", path)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("--img-dir", default="docs/img")
    ap.add_argument("--prefix", default="host")
    ap.add_argument("--table", help="write the markdown tables here instead of stdout")
    args = ap.parse_args(argv)

    context, table = load(args.results)
    where = f"{context.get('kokkos_execution_space', '?')}, concurrency {context.get('kokkos_concurrency', '?')}"
    img = Path(args.img_dir)
    img.mkdir(parents=True, exist_ok=True)
    contrastive_dim = {dict(k[3]).get("c") for k in table if k[0] == "contrastive"}
    vocabularies = sorted({dict(k[3])["V"] for k in table if k[0] == "cross_entropy"})
    if contrastive_dim:
        time_plot(table, "contrastive", [("", lambda s: True)], "batch b", lambda s: s["b"],
                  f"Contrastive loss, c={min(contrastive_dim)}, f32 ({where})", img / f"{args.prefix}_contrastive.png")
    if vocabularies:
        time_plot(table, "cross_entropy", [(f"V={v}", lambda s, v=v: s["V"] == v) for v in vocabularies],
                  "tokens N", lambda s: s["N"], f"Cross-entropy, f32 ({where})", img / f"{args.prefix}_cross_entropy.png")
    memory_plot(table, vocabularies, img / f"{args.prefix}_memory.png", where)

    text = "\n\n".join(f"**{title}**\n\n{markdown(table, loss)}"
                       for loss, title in (("contrastive", "Contrastive loss (symmetric CLIP)"),
                                           ("cross_entropy", "Cross-entropy")) if any(k[0] == loss for k in table))
    if args.table:
        Path(args.table).write_text(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
