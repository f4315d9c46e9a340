"""Per-kernel CUDA time (torch profiler, 5 calls after 3 warm-ups) of the bf16 cross-entropy
through the tiledlse package on one GPU: the training step plain and with label_smoothing=0.1,
and the forward plain and returning the predicted tokens and the token accuracy; the 14 kernels
of the most time for each. Inputs as ce_inputs draws them (seed 0). Complements
option_costs.py, which times the same calls: where an option's time goes.

    python3 perf_tests/option_profile.py [--tokens N] [--dim D] [--vocab V] [--budget MiB]
"""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from ce_inputs import ce_inputs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192, metavar="N")
    parser.add_argument("--dim", type=int, default=4096, metavar="D")
    parser.add_argument("--vocab", type=int, default=128256, metavar="V")
    parser.add_argument("--budget", type=int, default=256, metavar="MiB", help="memory_budget of every call")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    import tiledlse

    g = torch.Generator(device="cuda").manual_seed(0)
    e, c, t = ce_inputs(args.tokens, args.dim, args.vocab, torch.bfloat16, "cuda", g)
    e.requires_grad_(), c.requires_grad_()
    budget = args.budget << 20

    def step(**options):
        e.grad = c.grad = None
        tiledlse.linear_cross_entropy(e, c, t, memory_budget=budget, **options).backward()

    def forward(**options):
        with torch.no_grad():
            tiledlse.linear_cross_entropy(e, c, t, memory_budget=budget, **options)

    calls = {"step plain": step, "step label_smoothing=0.1": lambda: step(label_smoothing=0.1),
             "forward plain": forward,
             "forward predicted+accuracy": lambda: forward(return_predicted_tokens=True,
                                                           return_token_accuracy=True)}
    print("bf16 N=%d D=%d V=%d, memory_budget %d MiB on %s" % (args.tokens, args.dim, args.vocab, args.budget,
                                                               torch.cuda.get_device_name()))
    for name, call in calls.items():
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                call()
            torch.cuda.synchronize()
        rows = sorted(((ev.device_time_total / 5, ev.count / 5, ev.key) for ev in prof.key_averages()
                       if ev.device_time_total > 0), reverse=True)
        print("===== %s\ntotal kernel time per call: %.3f ms" % (name, sum(r[0] for r in rows) / 1000))
        for us, n, key in rows[:14]:
            print("%9.1f us  x%4.1f  %s" % (us, n, key[:230]))


if __name__ == "__main__":
    main()
