"""cuBLAS's bf16 GEMM rate (torch.matmul) at the shapes of the Hopper issue's forward cases, the
yardstick of "the forward reaches >= 75% of the same call's cuBLAS rate" (docs/performance.md).

Run on the GPU machine in the same device call as the TiledLSE timings:
    python3 perf_tests/gemm_rate.py          the logits product alone
    python3 perf_tests/gemm_rate.py --step   the training step's three products
Prints one JSON line per shape: the logits product E C^T (M x N over K, output in bf16, as the
materialized baseline computes it), CUDA events, median of 10 after 3 warm-ups.

--step times, back to back as one unit, the three products of a cross-entropy training step
(tlse --training-step): the logits E C^T, dE = G C and dC = G^T E, with G what PyTorch's backward
multiplies ((softmax - one-hot) / N in bf16) and the operands drawn as shared/bench/baselines.py
draws them; each_ms splits the time among the three (events between them). Nothing a fused step
does can be fewer products, so this is cuBLAS's time for the step's arithmetic alone, at the clock
the card's power limit leaves while all three run. Then the same with E and C rounded to 2
significant bits: same shapes, signs and magnitudes, fewer operand bits toggling; the difference
shows how much the power limit, and so the products' rate, depends on the values multiplied (so
figures measured on other inputs do not compare).
"""
import json
import sys

import torch

from ce_inputs import ce_inputs
from ce_step import cublas_products

SHAPES = [  # (case, M, N, K): rows x classes over the depth
    ("cross-entropy N=8192 D=4096 V=128256", 8192, 128256, 4096),
    ("cross-entropy N=4096 D=4096 V=128256", 4096, 128256, 4096),
    ("cross-entropy N=8192 D=2304 V=256000", 8192, 256000, 2304),
    ("contrastive B=65536 c=512", 65536, 65536, 512),
]
STEP_SHAPES = [  # (case, N, D, V): tokens, depth, classes
    ("cross-entropy N=8192 D=4096 V=128256", 8192, 4096, 128256),
    ("cross-entropy N=4096 D=4096 V=128256", 4096, 4096, 128256),
    ("cross-entropy N=8192 D=2304 V=256000", 8192, 2304, 256000),
]


def median_split_ms(steps, warmup=3, iters=10):
    """Times `steps` run back to back as one unit: the median of the whole, and of each step
    within it (events between the steps, so the GPU never waits between them)."""
    for _ in range(warmup):
        for step in steps:
            step()
    torch.cuda.synchronize()
    totals, parts = [], []
    for _ in range(iters):
        events = [torch.cuda.Event(enable_timing=True) for _ in range(len(steps) + 1)]
        events[0].record()
        for step, event in zip(steps, events[1:]):
            step()
            event.record()
        torch.cuda.synchronize()
        totals.append(events[0].elapsed_time(events[-1]))
        parts.append([a.elapsed_time(b) for a, b in zip(events, events[1:])])
    median = lambda xs: sorted(xs)[len(xs) // 2]
    return median(totals), [median(list(p)) for p in zip(*parts)]


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    for case, M, N, K in SHAPES:
        a = torch.randn(M, K, device="cuda", generator=g).bfloat16()
        b = torch.randn(N, K, device="cuda", generator=g).bfloat16()
        ms, _ = median_split_ms([lambda: a @ b.T])
        print(json.dumps({"case": case, "gemm": f"{M}x{N}x{K} bf16", "ms": round(ms, 3),
                          "tflops": round(2 * M * N * K / ms / 1e9, 1), "device": torch.cuda.get_device_name()}))
        del a, b
        torch.cuda.empty_cache()


def round_to_bits(x, bits):
    """x rounded to `bits` significant bits, in bf16."""
    mantissa, exponent = torch.frexp(x.float())
    return torch.ldexp(torch.round(mantissa * 2**bits) / 2**bits, exponent).bfloat16()


def step_products(g):
    for case, N, D, V in STEP_SHAPES:
        for bits in (None, 2):
            e, c, targets = ce_inputs(N, D, V, torch.bfloat16, "cuda", g)
            if bits:
                e, c = round_to_bits(e, bits), round_to_bits(c, bits)
            ms, each = median_split_ms(cublas_products(e, c, targets))
            print(json.dumps({"case": case, "gemm": f"3 x {N}x{V}x{D} bf16 (E C^T, G C, G^T E)",
                              "operands": f"{bits} significant bits" if bits else "as baselines.py draws them",
                              "ms": round(ms, 3), "each_ms": [round(t, 3) for t in each],
                              "tflops": round(3 * 2 * N * V * D / ms / 1e9, 1), "device": torch.cuda.get_device_name()}))
            del e, c, targets  # the products (and their outputs) were freed after their timing
            torch.cuda.empty_cache()


if __name__ == "__main__":
    if sys.argv[1:] not in ([], ["--step"]):
        sys.exit("usage: gemm_rate.py [--step]")
    if sys.argv[1:] == ["--step"]:
        step_products(torch.Generator(device="cuda").manual_seed(0))
    else:
        main()
