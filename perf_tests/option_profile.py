"""Per-kernel CUDA time (torch profiler, 5 calls after 3 warm-ups) of the cross-entropy
through the tiledlse package on one GPU: the training step plain and with label_smoothing=0.1,
and the forward plain and returning the predicted tokens and the token accuracy; the 14 kernels
of the most time for each. Inputs as ce_inputs draws them (seed 0). Complements
option_costs.py, which times the same calls: where an option's time goes.

    python3 perf_tests/option_profile.py [--tokens N] [--dim D] [--vocab V] [--dtype bf16|fp16]
                                         [--budget MiB]
"""
import torch
from torch.profiler import ProfilerActivity, profile

from option_costs import arguments, option_calls


def main():
    args = arguments(__doc__.splitlines()[0]).parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("option_profile.py needs a CUDA GPU")
    step, forward, _ = option_calls(args)
    calls = {"step plain": step(), "step label_smoothing=0.1": step(label_smoothing=0.1),
             "forward plain": forward(),
             "forward predicted+accuracy": forward(return_predicted_tokens=True, return_token_accuracy=True)}
    print("%s N=%d D=%d V=%d, memory_budget %d MiB on %s" % (args.dtype, args.tokens, args.dim, args.vocab,
                                                             args.budget, torch.cuda.get_device_name()))
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
