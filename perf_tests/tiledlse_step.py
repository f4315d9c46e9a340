"""The training step as a PyTorch user runs it, through the tiledlse package: the time of
linear_cross_entropy(e, c, t, memory_budget=B, fused_step=True).backward() under each budget,
with inputs drawn on the GPU as baselines.py's ce() draws them (e ~ N(0,1), c ~ N(0,1) * 4/sqrt(D),
uniform targets; generator seed 0, one draw per case). Median of 10 steps after 3 warm-ups, each
timed with CUDA events around the call and its backward (the gradients' allocation included).
Quicker than `tlse --training-step`, whose inputs are made on the host (about a minute per run at
N=8192), so that builds can alternate in one device call.

    python3 perf_tests/tiledlse_step.py [--label L] [--check] [--dim D] [--vocab V] CASE...

CASE is dtype:N:MiB (dtype bf16 or fp16; MiB the memory budget), e.g. bf16:8192:1536.
--check compares dE on 64 rows and dC on the 64 sampled and 64 target classes with float64
gradients from every row's float64 LSE (N V D multiply-adds in float64 on the GPU): max |g - ref|
over max |ref| on the sample, as `tlse --check-sampled` reports it. One line per case.
"""
import argparse

import torch

from ce_inputs import ce_inputs
from ce_step import step_times, tiledlse_step

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def sampled_errors(e, c, t):
    """dE's and dC's errors on sampled rows and classes against float64, relative to max |ref|."""
    N, V = e.shape[0], c.shape[0]
    rows = torch.arange(0, N, max(1, N // 64), device=e.device)
    classes = torch.cat([torch.arange(0, V, max(1, V // 64), device=e.device), t[:64]]).unique()
    e64, c64 = e.detach().double(), c.detach().double()
    lse = torch.logsumexp(e64 @ c64.T, dim=1)
    g_rows = torch.exp(e64[rows] @ c64.T - lse[rows, None])
    g_rows[torch.arange(len(rows), device=e.device), t[rows]] -= 1
    g_classes = torch.exp(e64 @ c64[classes].T - lse[:, None]) - (t[:, None] == classes[None, :]).double()
    ref_e, ref_c = (g_rows @ c64) / N, (g_classes.T @ e64) / N

    def error(got, ref):
        return ((got.double() - ref).abs().max() / ref.abs().max()).item()

    return error(e.grad[rows], ref_e), error(c.grad[classes], ref_c)


def time_step(dtype, N, D, V, mib, check):
    e, c, t = ce_inputs(N, D, V, DTYPES[dtype], "cuda", torch.Generator(device="cuda").manual_seed(0))
    step = tiledlse_step(e.requires_grad_(), c.requires_grad_(), t, mib << 20)

    times = step_times(step, untimed=3, timed=10)
    line = (f"{dtype} N={N} D={D} V={V} budget={mib} MiB: median {times[5]:.2f} ms "
            f"(min {times[0]:.2f}, max {times[-1]:.2f})")
    if check:
        line += "; dE err %.2e, dC err %.2e of max|ref|" % sampled_errors(e, c, t)
    return line


def parse_case(text):
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in DTYPES or not parts[1].isdigit() or not parts[2].isdigit():
        raise argparse.ArgumentTypeError(f"expected dtype:N:MiB with dtype bf16 or fp16, got {text!r}")
    dtype, n, mib = parts[0], int(parts[1]), int(parts[2])
    if n < 1 or mib < 1:
        raise argparse.ArgumentTypeError(f"N and MiB must be positive, got {text!r}")
    return dtype, n, mib


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", type=parse_case, metavar="CASE")
    parser.add_argument("--label", default="tiledlse", help="printed first on every line (e.g. which build)")
    parser.add_argument("--check", action="store_true", help="also the sampled float64 check of the gradients")
    parser.add_argument("--dim", type=int, default=4096, metavar="D")
    parser.add_argument("--vocab", type=int, default=128256, metavar="V")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    for dtype, n, mib in args.cases:
        print(args.label, time_step(dtype, n, args.dim, args.vocab, mib, args.check), flush=True)
        torch.cuda.empty_cache()
