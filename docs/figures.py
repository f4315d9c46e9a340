#!/usr/bin/python3
"""Draws the algorithm figures of docs/design.md (schematic, no measured data):

    docs/figures.py [--img-dir docs/img]

writes tiling.png (one device: the tile grid, the online LSE merge, the two backward passes)
and ring.png (several devices: column blocks and their gradient accumulators travelling on a ring).
"""
import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

BLOCK_COLORS = ["#cfe2f3", "#f9dcc4", "#d9ead3", "#ead1dc"]
TEAM_EDGE = "#444444"
HOT = "#e06666"


def matrix_panel(ax):
    """The implicit matrix as row tiles x column tiles, split into a grid of teams."""
    rows, cols, grid_r, grid_c = 6, 8, 2, 2  # tiles; team blocks
    ax.set_xlim(-2.2, cols + 0.3)
    ax.set_ylim(rows + 2.6, -0.6)
    ax.set_aspect("equal")
    ax.axis("off")
    for r in range(rows):
        for c in range(cols):
            team = (r * grid_r // rows) * grid_c + c * grid_c // cols
            ax.add_patch(Rectangle((c, r), 1, 1, facecolor=BLOCK_COLORS[team], edgecolor="white", lw=1.5))
    for k in range(1, grid_r):
        ax.plot([0, cols], [rows * k / grid_r] * 2, color=TEAM_EDGE, lw=2.5)
    for k in range(1, grid_c):
        ax.plot([cols * k / grid_c] * 2, [0, rows], color=TEAM_EDGE, lw=2.5)
    ax.add_patch(Rectangle((0, 0), cols, rows, fill=False, edgecolor=TEAM_EDGE, lw=2.5))
    # One tile in scratch, with the operand slices it reads.
    tr, tc = 1, 2
    ax.add_patch(Rectangle((tc, tr), 1, 1, facecolor=HOT, edgecolor="black", lw=1.5))
    ax.add_patch(Rectangle((-1.7, tr), 1.2, 1, facecolor="#fff2cc", edgecolor="black"))
    ax.text(-1.1, tr + 0.5, "A rows\n(32 x D)", ha="center", va="center", fontsize=7)
    ax.add_patch(Rectangle((tc, rows + 0.4), 1, 1.2, facecolor="#fff2cc", edgecolor="black"))
    ax.text(tc + 0.5, rows + 1.0, "B rows\n(32 x D)", ha="center", va="center", fontsize=7)
    ax.annotate("", xy=(tc, tr + 0.5), xytext=(-0.5, tr + 0.5), arrowprops=dict(arrowstyle="->", lw=1.2))
    ax.annotate("", xy=(tc + 0.5, tr + 1), xytext=(tc + 0.5, rows + 0.4), arrowprops=dict(arrowstyle="->", lw=1.2))
    ax.text(tc + 1.15, tr + 0.5, "x = logit(A_i . B_j)\n32 x 32 tile in team scratch", fontsize=7, va="center",
            bbox=dict(facecolor="white", edgecolor="none", alpha=0.85))
    ax.text(cols / 2, -0.35, "columns j (text features / vocabulary), column tiles of 32", ha="center", fontsize=8)
    ax.text(cols + 0.15, rows / 2, "rows i\n(row tiles of 32)", rotation=90, va="center", fontsize=8)
    ax.text(cols / 2, rows + 2.35, "colours: the teams of the forward grid (row blocks x column blocks);\n"
            "each team sweeps its tiles and owns their partial (max, sum) states",
            ha="center", fontsize=7)
    ax.set_title("(a) Tiles and the forward grid", fontsize=10)


def merge_panel(ax):
    """The online LSE merge along a row, then the fixed-order merge of the column-block partials."""
    ax.set_xlim(0, 10)
    ax.set_ylim(6.2, -0.3)
    ax.axis("off")
    for c in range(8):
        block = c * 2 // 8
        ax.add_patch(Rectangle((0.6 + c, 0.4), 1, 0.8, facecolor=BLOCK_COLORS[block], edgecolor="white", lw=1.5))
        ax.text(1.1 + c, 0.8, f"t{c}", ha="center", va="center", fontsize=7)
    ax.text(0.5, 0.8, "row i", ha="right", va="center", fontsize=8)
    for block, (x0, x1) in enumerate(((0.6, 4.6), (4.6, 8.6))):
        ax.add_patch(FancyArrowPatch((x0 + 0.1, 1.5), (x1 - 0.1, 1.5), arrowstyle="->", mutation_scale=10))
        ax.text((x0 + x1) / 2, 2.2, f"team of column block {block}:\n(m{block}, s{block})", ha="center", fontsize=7.5)
    ax.text(5, 3.35, "fold a tile into the running state, in registers / scratch:\n"
            "m = max(m, max_j x_ij),   s = s e^(m_old - m) + sum_j e^(x_ij - m)", ha="center", fontsize=8)
    ax.text(5, 4.75, "merge the partials in a fixed order (deterministic):\n"
            "m = max(m0, m1),   s = s0 e^(m0 - m) + s1 e^(m1 - m),   lse_i = m + log s", ha="center", fontsize=8)
    ax.text(5, 5.9, "memory: 2 numbers per row per column block, O(rows + cols)", ha="center", fontsize=8,
            color="#990000")
    ax.set_title("(b) Online LSE along a row (Inf-CL eq. 4-5)", fontsize=10)


def backward_panel(ax):
    """Pass 1 owns row tiles and writes dA; pass 2 owns column tiles and writes dB."""
    ax.set_xlim(-0.3, 13.5)
    ax.set_ylim(5.8, -0.8)
    ax.set_aspect("equal")
    ax.axis("off")
    rows, cols = 4, 5
    for x0, owner, grad in ((0, "row", "dA_i += G_ij B_j"), (7.5, "column", "dB_j += G_ij A_i")):
        for r in range(rows):
            for c in range(cols):
                hot = (owner == "row" and r == 1) or (owner == "column" and c == 3)
                ax.add_patch(Rectangle((x0 + c, r), 1, 1, facecolor=HOT if hot else "#eeeeee", edgecolor="white", lw=1.5))
        if owner == "row":
            ax.add_patch(FancyArrowPatch((x0 + 0.1, 1.5), (x0 + cols - 0.1, 1.5), arrowstyle="->", mutation_scale=10))
        else:
            ax.add_patch(FancyArrowPatch((x0 + 3.5, 0.1), (x0 + 3.5, rows - 0.1), arrowstyle="->", mutation_scale=10))
        ax.text(x0 + cols / 2, -0.35, f"pass {1 if owner == 'row' else 2}: a team owns a {owner} tile",
                ha="center", fontsize=8)
        ax.text(x0 + cols / 2, rows + 0.6, f"recompute x, G_ij = g_i p_ij - [j = t_i] w_i\n{grad}, "
                f"held in scratch,\nwritten once: no atomics", ha="center", va="top", fontsize=7.5)
    ax.set_title("(c) Backward: two passes recompute the tiles (Inf-CL Alg. 4, CCE Alg. 3)", fontsize=10)


def tiling(path):
    fig = plt.figure(figsize=(13, 9.2))
    matrix_panel(fig.add_axes([0.0, 0.39, 0.5, 0.56]))
    merge_panel(fig.add_axes([0.5, 0.43, 0.5, 0.50]))
    backward_panel(fig.add_axes([0.12, 0.0, 0.76, 0.33]))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def ring(path, P=4):
    """Rank p holds rows A_p and column block B_p; at step s it computes the tile (p, (p - s) mod P)
    while B travels to rank p + 1; in the backward the dB accumulator travels with its block."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.6), gridspec_kw={"width_ratios": [1, 1.25]})
    import math

    left.set_xlim(-2.1, 2.1)
    left.set_ylim(-2.1, 2.3)
    left.set_aspect("equal")
    left.axis("off")
    pos = [(1.35 * math.sin(2 * math.pi * p / P), 1.35 * math.cos(2 * math.pi * p / P)) for p in range(P)]
    for p, (x, y) in enumerate(pos):
        left.add_patch(Rectangle((x - 0.55, y - 0.4), 1.1, 0.8, facecolor=BLOCK_COLORS[p], edgecolor="black"))
        left.text(x, y + 0.12, f"rank {p}", ha="center", va="center", fontsize=9, weight="bold")
        left.text(x, y - 0.17, f"A_{p}, lse_{p}, dA_{p}", ha="center", va="center", fontsize=7)
    for p in range(P):
        (x0, y0), (x1, y1) = pos[p], pos[(p + 1) % P]
        left.add_patch(FancyArrowPatch((x0, y0), (x1, y1), connectionstyle="arc3,rad=-0.25", arrowstyle="-|>",
                                       mutation_scale=14, shrinkA=28, shrinkB=28, color="#555555", lw=1.5))
    left.text(0, 0.1, "each step: send the\ncolumn block (B_k, and in\nthe backward its dB_k\naccumulator) to rank p+1,"
              "\nreceive from rank p-1,\noverlapped with compute", ha="center", va="center", fontsize=8)
    left.text(0, -2.0, "stays home: A_p, its (m, s) LSE state, dA_p.  travels: B_k (+ dB_k)", ha="center",
              fontsize=8)
    left.set_title("Ring of P ranks (Inf-CL Algorithms 1 and 3)", fontsize=10)

    right.set_xlim(-1.6, P + 0.2)
    right.set_ylim(P + 1.6, -1.0)
    right.set_aspect("equal")
    right.axis("off")
    for p in range(P):
        for k in range(P):
            step = (p - k) % P
            right.add_patch(Rectangle((k, p), 1, 1, facecolor=BLOCK_COLORS[k], edgecolor="white", lw=2))
            right.text(k + 0.5, p + 0.5, f"step {step}", ha="center", va="center", fontsize=8)
        right.text(-0.15, p + 0.5, f"rank {p}: rows A_{p}", ha="right", va="center", fontsize=8)
    for k in range(P):
        right.text(k + 0.5, -0.2, f"B_{k}", ha="center", va="bottom", fontsize=8)
    right.text(P / 2, -0.75, "column blocks (each starts on its own rank)", ha="center", fontsize=8)
    right.text(P / 2, P + 0.35, "Rank p computes tile (p, k) at step (p - k) mod P, with the in-device tiling\n"
               "of the tiling figure, and folds it into its row LSE state. After P steps every rank has\n"
               "its rows' global LSE; in the backward, dB_k has visited every rank and returns home\n"
               "after one more hop. Communication hides behind compute when a block's FLOPs /\n"
               "bandwidth >= its transfer time (RingAttention).", ha="center", va="top", fontsize=7.5)
    right.set_title("Which tile each rank computes at each step", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--img-dir", default=str(Path(__file__).resolve().parent / "img"))
    args = ap.parse_args(argv)
    img = Path(args.img_dir)
    img.mkdir(parents=True, exist_ok=True)
    tiling(img / "tiling.png")
    ring(img / "ring.png")


if __name__ == "__main__":
    main(sys.argv[1:])
