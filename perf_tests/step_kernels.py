"""Per-kernel times of the cross-entropy training step through the tiledlse package and of
cuBLAS's three products for it, at the rate the card sustains (torch.profiler; the step's kernels
are the library's, launched from the package's calls):

    python3 perf_tests/step_kernels.py [--budget MiB] [N D V]

Defaults: 2560 MiB, N=4096 D=4096 V=128256 (bf16, inputs from ce_inputs, seed 0). 30 warm-up
rounds of both, then twice in turn: 10 more, and 20 profiled. Per profiled block: the span per
iteration (first kernel's start to last kernel's end, over 20; host gaps included) and the kernels'
summed device time, then each kernel's time per iteration, count and mean. Kernels that run
back to back with dependent launches overlap, so a kernel's time can include waiting for the one
before it, and their sum can exceed the span.
"""
import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile

from ce_step import step_against_products


def kernel_table(fn, iterations=20):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iterations):
            fn()
        torch.cuda.synchronize()
    events = [ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA]
    per = collections.defaultdict(list)
    for ev in events:
        per[ev.name].append(ev.device_time)
    span = max(ev.time_range.end for ev in events) - min(ev.time_range.start for ev in events)
    return span / iterations / 1000, per


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=2560, help="the step's memory budget in MiB")
    parser.add_argument("shape", type=int, nargs="*", default=[4096, 4096, 128256], help="N D V")
    args = parser.parse_args()
    if len(args.shape) != 3:
        parser.error("give N D V (three integers)")
    N, D, V = args.shape
    cublas, step = step_against_products(N, D, V, args.budget)

    for _ in range(30):
        cublas()
        step()
    torch.cuda.synchronize()
    for name, fn in (("cublas three products", cublas), ("tiledlse step", step)) * 2:
        for _ in range(10):
            fn()
        span, per = kernel_table(fn)
        busy = sum(sum(v) for v in per.values()) / 20 / 1000
        print(f"== {name} N={N} D={D} V={V}: span {span:.3f} ms/iter, kernels {busy:.3f} ms/iter "
              f"({torch.cuda.get_device_name()})")
        for kernel, times in sorted(per.items(), key=lambda kv: -sum(kv[1])):
            print(f"  {sum(times) / 20 / 1000:8.3f} ms/iter  n={len(times):3d}  mean {sum(times) / len(times) / 1000:7.3f}"
                  f"  {kernel[:110]}")


if __name__ == "__main__":
    main()
