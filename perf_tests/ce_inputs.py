"""The cross-entropy benchmarks' inputs, drawn as shared/bench/baselines.py's ce() draws them, so
that figures from different scripts compare: e ~ N(0, 1) (N x D), c ~ N(0, 1) * scale / sqrt(D)
(V x D: logits of standard deviation ~ scale), uniform targets, drawn in float32 from one
generator in that order and then cast. Used by torch_cross_entropy.py, gemm_rate.py --step and
tiledlse_step.py.
"""
import math

import torch


def ce_inputs(N, D, V, dtype, device, generator, scale=4.0):
    """(e, c, targets) on `device`, e and c in `dtype`, targets int64."""
    e = torch.randn(N, D, device=device, generator=generator).to(dtype)
    c = (torch.randn(V, D, device=device, generator=generator) * (scale / math.sqrt(D))).to(dtype)
    t = torch.randint(0, V, (N,), device=device, generator=generator)
    return e, c, t
