"""What the cross-entropy's everyday options cost, through the tiledlse package on one GPU: the
training step (linear_cross_entropy(...).backward(), fused_step left to the package) plain, with
label_smoothing=0.1, with class weights, and with both; and the forward alone (no gradient) plain
and returning the predicted tokens and the token accuracy. Inputs as ce_inputs draws them (seed
0), class weights uniform in [0.5, 2]. The variants of one measurement alternate, round after
round (10 rounds after 3 warm-ups, each call timed with CUDA events), so that the card's clock
drifts alike for all of them; the median of each is compared with the plain call's.

    python3 perf_tests/option_costs.py [--tokens N] [--dim D] [--vocab V] [--dtype bf16|fp16]
                                       [--budget MiB] [--json FILE]
"""
import argparse
import json

import torch

from ce_inputs import ce_inputs

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def median_times(calls, rounds=10, warmup=3):
    """{name: median ms} of each callable, the callables alternating round after round."""
    for _ in range(warmup):
        for call in calls.values():
            call()
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            call()
            end.record()
            end.synchronize()
            times[name].append(begin.elapsed_time(end))
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def arguments(description):
    """The shape, dtype and budget options this script and option_profile.py share."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--tokens", type=int, default=8192, metavar="N")
    parser.add_argument("--dim", type=int, default=4096, metavar="D")
    parser.add_argument("--vocab", type=int, default=128256, metavar="V")
    parser.add_argument("--dtype", choices=DTYPES, default="bf16")
    parser.add_argument("--budget", type=int, default=256, metavar="MiB", help="memory_budget of every call")
    return parser


def option_calls(args, device="cuda"):
    """(step, forward, weight): step(**options) and forward(**options) make a call of
    tiledlse.linear_cross_entropy with those options on the inputs ce_inputs draws (seed 0), the
    training step (.backward()) or the forward alone; weight: class weights uniform in [0.5, 2]."""
    import tiledlse

    g = torch.Generator(device=device).manual_seed(0)
    e, c, t = ce_inputs(args.tokens, args.dim, args.vocab, DTYPES[args.dtype], device, g)
    weight = torch.rand(args.vocab, device=device, generator=g) * 1.5 + 0.5
    e.requires_grad_(), c.requires_grad_()
    budget = args.budget << 20

    def step(**options):
        def run():
            e.grad = c.grad = None
            tiledlse.linear_cross_entropy(e, c, t, memory_budget=budget, **options).backward()
        return run

    def forward(**options):
        def run():
            with torch.no_grad():
                tiledlse.linear_cross_entropy(e, c, t, memory_budget=budget, **options)
        return run

    return step, forward, weight


def main():
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="FILE", help="also write the figures there")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    step, forward, weight = option_calls(args)

    steps = median_times({"plain": step(), "label_smoothing=0.1": step(label_smoothing=0.1),
                          "weight": step(weight=weight), "weight+label_smoothing": step(weight=weight,
                                                                                          label_smoothing=0.1)})
    forwards = median_times({"plain": forward(), "predicted+accuracy": forward(return_predicted_tokens=True,
                                                                                return_token_accuracy=True)})
    device = torch.cuda.get_device_name()
    shape = "%s N=%d D=%d V=%d, memory_budget %d MiB" % (args.dtype, args.tokens, args.dim, args.vocab, args.budget)
    print("%s on %s" % (shape, device))
    for what, figures in (("step", steps), ("forward", forwards)):
        for name, ms in figures.items():
            print("  %-8s %-24s %8.2f ms  (%.3fx the plain call's)" % (what, name, ms, ms / figures["plain"]))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"device": device, "case": shape, "step_ms": steps, "forward_ms": forwards}, out, indent=1)


if __name__ == "__main__":
    main()
