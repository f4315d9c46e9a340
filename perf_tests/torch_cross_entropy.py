"""PyTorch fp32 cross-entropy with TF32 off, logits materialized: the baseline of issue 12's
exact-float32 cross-entropy target (N=4096 D=2048 V=65536), which shared/bench/baselines.py
(bf16 cross-entropy only) does not measure. Same inputs as its ce() (e ~ N(0,1), c ~ N(0,1) *
4/sqrt(D), uniform targets, generator seed 0) in float32, timed and measured with its own helpers:
copy it next to this file first (perf_tests/baselines.py, gitignored).

    python3 perf_tests/torch_fp32_cross_entropy.py [N D V]

Prints one JSON line, like baselines.py.
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from baselines import dev, peak_mib, timeit  # noqa: E402


def ce_fp32(N, D, V, s=4.0):
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device=dev).manual_seed(0)
    e = torch.randn(N, D, device=dev, generator=g)
    c = torch.randn(V, D, device=dev, generator=g) * (s / math.sqrt(D))
    t = torch.randint(0, V, (N,), device=dev, generator=g)
    e.requires_grad_(True)
    c.requires_grad_(True)
    loss_fn = lambda: F.cross_entropy(e @ c.T, t)  # noqa: E731

    def fw():
        with torch.no_grad():
            loss_fn()

    def fwbw():
        e.grad = None
        c.grad = None
        loss_fn().backward()

    print(json.dumps(dict(kind="ce", method="torch_materialized", N=N, D=D, V=V, dtype="fp32", tf32=False,
                          loss=loss_fn().item(), fw_ms=timeit(fw), fwbw_ms=timeit(fwbw),
                          fw_MiB=peak_mib(fw), fwbw_MiB=peak_mib(fwbw))), flush=True)


if __name__ == "__main__":
    sizes = [int(a) for a in sys.argv[1:4]] if len(sys.argv) >= 4 else [4096, 2048, 65536]
    ce_fp32(*sizes)
