"""PyTorch cross-entropy with the logits materialized, in the cases shared/bench/baselines.py
(bf16 only, no softcap) does not measure: fp32 with TF32 off (issue 12's exact-float32 target,
N=4096 D=2048 V=65536), fp16, and Gemma 2's logit softcap (logits s tanh(x / s), in float32 as
Gemma computes them). Same inputs as baselines.py's ce() (e ~ N(0,1), c ~ N(0,1) * 4/sqrt(D),
uniform targets, generator seed 0, drawn in float32 and then cast), timed and measured with its
own helpers: copy it next to this file first (perf_tests/baselines.py, gitignored). With bf16 and
no softcap this is baselines.py's ce() itself (same loss, same timing).

    python3 perf_tests/torch_cross_entropy.py [N D V] [--dtype fp32|bf16|fp16] [--softcap S]

Defaults: 4096 2048 65536, fp32, no softcap. Prints one JSON line, like baselines.py.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from baselines import dev, peak_mib, timeit  # noqa: E402
from ce_inputs import ce_inputs  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def cross_entropy(N, D, V, dtype="fp32", softcap=0.0, s=4.0):
    torch.backends.cuda.matmul.allow_tf32 = False
    e, c, t = ce_inputs(N, D, V, DTYPES[dtype], dev, torch.Generator(device=dev).manual_seed(0), scale=s)
    e.requires_grad_(True)
    c.requires_grad_(True)

    def loss_fn():
        logits = (e @ c.T).float()
        if softcap > 0:
            logits = softcap * torch.tanh(logits / softcap)
        return F.cross_entropy(logits, t)

    def fw():
        with torch.no_grad():
            loss_fn()

    def fwbw():
        e.grad = None
        c.grad = None
        loss_fn().backward()

    print(json.dumps(dict(kind="ce", method="torch_materialized", N=N, D=D, V=V, dtype=dtype, tf32=False,
                          softcap=softcap, loss=loss_fn().item(), fw_ms=timeit(fw), fwbw_ms=timeit(fwbw),
                          fw_MiB=peak_mib(fw), fwbw_MiB=peak_mib(fwbw))), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", nargs="*", type=int, default=[4096, 2048, 65536], metavar="N D V")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--softcap", type=float, default=0.0, metavar="S", help="logits S tanh(x / S); 0: off")
    args = parser.parse_args()
    if len(args.shape) != 3 or min(args.shape) <= 0:
        parser.error(f"shape: expected three positive sizes N D V, got {args.shape}")
    if args.softcap < 0 or not math.isfinite(args.softcap):
        parser.error(f"--softcap: expected a finite value >= 0, got {args.softcap}")
    cross_entropy(*args.shape, dtype=args.dtype, softcap=args.softcap)
