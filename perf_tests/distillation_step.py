"""The distillation loss's training step (forward + backward to the student) through the tiledlse
package against PyTorch materializing both logit matrices, on one GPU, same inputs, same call:

    python3 perf_tests/distillation_step.py [--iterations K] [--budgets MiB,...] [--divergence D]
                                            [--dtype bf16|fp16|fp32] [--fused-step MODE,...] [N D_s D_t V]

Defaults: bf16, N=8192 D_s=2048 D_t=4096 V=128256 (issue 66's case), forward KL at temperature 1,
budgets 512 and 2048 MiB, fused_step auto (the library's choice). Inputs: hidden states ~ N(0, 1), heads ~ N(0, 1) * 4 / sqrt(D) (logits of
std ~4, as baselines.py draws the cross-entropy's), the teacher frozen. PyTorch's loss is
F.kl_div(log_softmax(z_s), log_softmax(z_t), log_target=True) summed over classes and averaged
over rows, z = H W^T / T in float32 (what users write). Per method: the median of K timed steps
after one warm-up (CUDA events), the peak memory the step allocates beyond its inputs, and the
loss. One JSON line per method.
"""
import argparse
import json
import math

import torch
import torch.nn.functional as F

import tiledlse


def timed(fn, iterations):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iterations):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def peak_mib(fn):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", type=int, nargs="*", default=[8192, 2048, 4096, 128256], help="N D_s D_t V")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--budgets", default="512,2048", help="TiledLSE memory budgets in MiB")
    parser.add_argument("--divergence", default="forward_kl", choices=["forward_kl", "reverse_kl", "jsd"])
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--fused-step", default="auto",
                        help="distillation_loss's fused_step values to time per budget: auto, on, off (comma list)")
    parser.add_argument("--skip-torch", action="store_true", help="time TiledLSE only")
    parser.add_argument("--kernels", action="store_true",
                        help="also print the GPU kernels' time of one step per budget (torch.profiler)")
    args = parser.parse_args()
    n, ds, dt, v = args.shape
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    g = torch.Generator(device="cuda").manual_seed(0)
    hs = torch.randn(n, ds, device="cuda", generator=g).to(dtype).requires_grad_()
    ws = (torch.randn(v, ds, device="cuda", generator=g) * (4 / math.sqrt(ds))).to(dtype).requires_grad_()
    ht = torch.randn(n, dt, device="cuda", generator=g).to(dtype)
    wt = (torch.randn(v, dt, device="cuda", generator=g) * (4 / math.sqrt(dt))).to(dtype)
    temp = args.temperature
    case = dict(N=n, D_s=ds, D_t=dt, V=v, dtype=args.dtype, divergence=args.divergence, temperature=temp,
                device=torch.cuda.get_device_name())

    def torch_loss():
        ls = F.log_softmax((hs @ ws.T).float() / temp, dim=-1)
        with torch.no_grad():
            lt = F.log_softmax((ht @ wt.T).float() / temp, dim=-1)
        if args.divergence == "forward_kl":
            return F.kl_div(ls, lt, log_target=True, reduction="sum") / n
        if args.divergence == "reverse_kl":
            return F.kl_div(lt, ls, log_target=True, reduction="sum") / n
        beta = 0.5
        lm = torch.logsumexp(torch.stack([lt + math.log(beta), ls + math.log(1 - beta)]), dim=0)
        return (beta * F.kl_div(lm, lt, log_target=True, reduction="sum") +
                (1 - beta) * F.kl_div(lm, ls, log_target=True, reduction="sum")) / n

    def step(loss_fn):
        def run():
            hs.grad = ws.grad = None
            loss = loss_fn()
            loss.backward()
            return loss
        return run

    if not args.skip_torch:
        run = step(torch_loss)
        print(json.dumps(dict(case, method="torch_materialized", loss=run().item(),
                              fwbw_ms=timed(run, args.iterations), fwbw_MiB=peak_mib(run))), flush=True)
    modes = {"auto": None, "on": True, "off": False}
    for mib in [int(b) for b in args.budgets.split(",")]:
        for mode in args.fused_step.split(","):
            run = step(lambda: tiledlse.distillation_loss(hs, ws, ht, wt, divergence=args.divergence,
                                                          temperature=temp, memory_budget=mib << 20,
                                                          fused_step=modes[mode]))
            print(json.dumps(dict(case, method="tiledlse", budget_MiB=mib, fused_step=mode, loss=run().item(),
                                  fwbw_ms=timed(run, args.iterations), fwbw_MiB=peak_mib(run))), flush=True)
            if args.kernels:
                print_kernels(run, f"tiledlse, budget {mib} MiB, fused_step {mode}")


def print_kernels(run, label):
    """The GPU time of one step by kernel, largest first (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / 1e3, e.count) for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    print(f"# kernels of one step, {label}: {sum(r[1] for r in rows):.2f} ms in all")
    for name, ms, count in rows[:12]:
        print(f"#   {ms:9.3f} ms  x{count:<4d} {name[:110]}")


if __name__ == "__main__":
    main()
