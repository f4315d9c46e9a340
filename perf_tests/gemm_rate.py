"""cuBLAS's bf16 GEMM rate (torch.matmul) at the shapes of the Hopper issue's forward cases, the
yardstick of "the forward reaches >= 75% of the same call's cuBLAS rate" (docs/performance.md).

Run on the GPU machine in the same device call as the TiledLSE timings:
    python3 perf_tests/gemm_rate.py
Prints one JSON line per shape: the logits product E C^T (M x N over K, output in bf16, as the
materialized baseline computes it), CUDA events, median of 10 after 3 warm-ups.
"""
import json

import torch

SHAPES = [  # (case, M, N, K): rows x classes over the depth
    ("cross-entropy N=8192 D=4096 V=128256", 8192, 128256, 4096),
    ("cross-entropy N=4096 D=4096 V=128256", 4096, 128256, 4096),
    ("cross-entropy N=8192 D=2304 V=256000", 8192, 256000, 2304),
    ("contrastive B=65536 c=512", 65536, 65536, 512),
]


def median_ms(fn, warmup=3, iters=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    for case, M, N, K in SHAPES:
        a = torch.randn(M, K, device="cuda", generator=g).bfloat16()
        b = torch.randn(N, K, device="cuda", generator=g).bfloat16()
        ms = median_ms(lambda: a @ b.T)
        print(json.dumps({"case": case, "gemm": f"{M}x{N}x{K} bf16", "ms": round(ms, 3),
                          "tflops": round(2 * M * N * K / ms / 1e9, 1), "device": torch.cuda.get_device_name()}))
        del a, b
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
