"""The cross-entropy training step and cuBLAS's three products for it, each started on a GPU that
has idled, every iteration timed on its own: how far the first iterations, before the card's power
limit lowers its clock, run ahead of the sustained rate (docs/performance.md, "From an idle card").

    python3 perf_tests/step_from_idle.py [--idle S] [--iterations K] [--rounds R] [--budget MiB] [N D V]

Defaults: idle 5 s, 40 iterations, 3 rounds, 2560 MiB, N=4096 D=4096 V=128256 (bf16). Per round,
cuBLAS then the step, each after `idle` seconds asleep: the three products as gemm_rate.py --step
times them (E C^T, G C, G^T E with G as PyTorch's backward forms it), and
tiledlse.linear_cross_entropy(..., fused_step=True).backward() as tiledlse_step.py times it.
Inputs from ce_inputs (generator seed 0). One JSON line per run: each iteration's ms, the median of
the first five and of the last ten. Sample the clock alongside with nvidia-smi --query-gpu=
timestamp,clocks.sm,power.draw,clocks_throttle_reasons.sw_power_cap --format=csv -lms 20.
"""
import argparse
import json
import time

import torch

from ce_step import step_against_products


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=float, default=5.0, help="seconds asleep before each run")
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=int, default=2560, help="the step's memory budget in MiB")
    parser.add_argument("shape", type=int, nargs="*", default=[4096, 4096, 128256], help="N D V")
    args = parser.parse_args()
    if len(args.shape) != 3 or args.iterations < 10:
        parser.error("give N D V (three integers) and at least 10 iterations")
    N, D, V = args.shape
    cublas, step = step_against_products(N, D, V, args.budget)

    for fn in (cublas, step):  # first calls: allocations, the library's plan
        fn()
    torch.cuda.synchronize()
    for r in range(args.rounds):
        for name, fn in (("cublas three products", cublas), ("tiledlse step", step)):
            time.sleep(args.idle)
            events = [torch.cuda.Event(enable_timing=True) for _ in range(args.iterations + 1)]
            start = time.time()
            events[0].record()
            for i in range(args.iterations):
                fn()
                events[i + 1].record()
            torch.cuda.synchronize()
            ms = [round(a.elapsed_time(b), 2) for a, b in zip(events, events[1:])]
            print(json.dumps({"round": r, "what": name, "N": N, "D": D, "V": V, "start_unix": round(start, 3),
                              "ms": ms, "first5_median": sorted(ms[:5])[2], "last10_median": sorted(ms[-10:])[5],
                              "device": torch.cuda.get_device_name()}), flush=True)


if __name__ == "__main__":
    main()
