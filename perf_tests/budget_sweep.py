"""The bf16 training step's time against its memory budget, measured so that budgets compare to
about 1%: on a card already warm, the budgets interleaved over several rounds, each round in
another order. tiledlse_step.py times one case after another, each once in its process, and there
a case's place and the card's temperature move its median by 10-20% on the same plan
(docs/notes/2026-12-06-budgets.md).

    python3 perf_tests/budget_sweep.py [--rounds R] [--warm S] SHAPE:MiB,MiB,... ...

SHAPE is N/D/V, e.g. 8192/4096/128256:256,512,1024. Per shape: inputs drawn once as
baselines.py draws them (ce_inputs, seed 0); the first budget's step run for S seconds (default
3) to bring the card to the clock it holds under load; then R rounds (default 4), round r taking
the budgets rotated by r, each budget 2 steps then the median of 8 timed with CUDA events. One
line per budget: the median over the rounds of the rounds' medians, and their range (the format
tiledlse_step.py prints, which plot_budget.py reads).
"""
import argparse
import time

import torch

from ce_inputs import ce_inputs
from ce_step import step_times, tiledlse_step


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def sweep(N, D, V, budgets, rounds, warm_seconds):
    e, c, t = ce_inputs(N, D, V, torch.bfloat16, "cuda", torch.Generator(device="cuda").manual_seed(0))
    e.requires_grad_(), c.requires_grad_()
    steps = {mib: tiledlse_step(e, c, t, mib << 20) for mib in budgets}
    until = time.monotonic() + warm_seconds
    while time.monotonic() < until:
        steps[budgets[0]]()
    torch.cuda.synchronize()
    medians = {mib: [] for mib in budgets}
    for r in range(rounds):
        for mib in budgets[r % len(budgets):] + budgets[:r % len(budgets)]:
            medians[mib].append(median(step_times(steps[mib], untimed=2, timed=8)))
            torch.cuda.empty_cache()
    for mib in budgets:
        m = medians[mib]
        print(f"interleaved bf16 N={N} D={D} V={V} budget={mib} MiB: median {median(m):.2f} ms "
              f"(min {min(m):.2f}, max {max(m):.2f}; {rounds} rounds)", flush=True)


def parse_shape(text):
    try:
        shape, budgets = text.split(":")
        N, D, V = (int(x) for x in shape.split("/"))
        return N, D, V, [int(b) for b in budgets.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N/D/V:MiB,MiB,..., got {text!r}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="+", type=parse_shape, metavar="SHAPE")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--warm", type=float, default=3.0, metavar="S")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    for N, D, V, budgets in args.shapes:
        sweep(N, D, V, budgets, args.rounds, args.warm)
