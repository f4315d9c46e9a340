"""PyTorch's NT-Xent (SimCLR's self-similarity contrastive loss) with the logits materialized: the
baseline of `tlse contrastive --self-similarity`, which shared/bench/baselines.py (the paired CLIP
form only) does not measure. Z: B rows of L2-normalized N(0,1) features (rows i and i + B/2 are
the two views of one sample), logits scale * Z Z^T with the diagonal set to -inf, mean
cross-entropy of each row against the other view, scale 1/0.07 (tlse's default). In fp32 with
TF32 off (as baselines.py's contrastive case), fp32 with TF32 products (`tf32`: PyTorch's
allow_tf32, tiledlse's precision="tf32"), or with bf16 features (the mixed-precision way: a bf16
product, its logits widened to fp32 for the softmax). Timed and measured with baselines.py's
helpers: copy it next to this file first (perf_tests/baselines.py, gitignored). With `tiledlse`
as the method, the same inputs, loss and timing through `tiledlse.self_contrastive_loss` (the
package importable, e.g. laid out as python/tests/run_gpu_checks.sh does): the library from
PyTorch, side by side with PyTorch's own.

    python3 perf_tests/torch_self_contrastive.py [B C fp32|tf32|bf16 [torch|tiledlse [MiB]]]
    # default 65536 512 bf16 torch; MiB: tiledlse's memory_budget (default: the library's, 256)

Prints one JSON line, like baselines.py.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from baselines import dev, peak_mib, timeit  # noqa: E402


def nt_xent(B, C, name, method, budget_mib=None, scale=1 / 0.07):
    dtype = torch.bfloat16 if name == "bf16" else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
    g = torch.Generator(device=dev).manual_seed(2)
    z = F.normalize(torch.randn(B, C, device=dev, generator=g), dim=-1).to(dtype).requires_grad_(True)
    positive = (torch.arange(B, device=dev) + B // 2) % B

    def materialized():
        logits = (scale * (z @ z.T)).float()
        logits.diagonal().fill_(float("-inf"))  # a sample is not its own negative
        return F.cross_entropy(logits, positive)

    if method == "tiledlse":
        import tiledlse
        scale_t = torch.tensor(scale, device=dev)  # read on the host once per call, as a user's would be

        def loss_fn():
            return tiledlse.self_contrastive_loss(z, scale_t, precision="tf32" if name == "tf32" else "exact",
                                                  memory_budget=budget_mib and budget_mib << 20)
    else:
        loss_fn = materialized

    def fw():
        with torch.no_grad():
            loss_fn()

    def fwbw():
        z.grad = None
        loss_fn().backward()

    print(json.dumps(dict(kind="self_contrastive", method="tiledlse" if method == "tiledlse" else "torch_materialized",
                          B=B, C=C, dtype=name, budget_MiB=budget_mib, loss=loss_fn().item(),
                          fw_ms=timeit(fw), fwbw_ms=timeit(fwbw, iters=5), fw_MiB=peak_mib(fw),
                          fwbw_MiB=peak_mib(fwbw))), flush=True)


if __name__ == "__main__":
    B, C = (int(a) for a in sys.argv[1:3]) if len(sys.argv) >= 3 else (65536, 512)
    name = sys.argv[3] if len(sys.argv) >= 4 else "bf16"
    method = sys.argv[4] if len(sys.argv) >= 5 else "torch"
    budget_mib = int(sys.argv[5]) if len(sys.argv) >= 6 else None
    if B % 2 or name not in ("fp32", "tf32", "bf16") or method not in ("torch", "tiledlse"):
        sys.exit("usage: torch_self_contrastive.py [B (even) C fp32|tf32|bf16 [torch|tiledlse [MiB]]]")
    nt_xent(B, C, name, method, budget_mib)
