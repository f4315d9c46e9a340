"""The two implementations of a cross-entropy training step that the benchmarks time on the same
inputs (ce_inputs): cuBLAS's three products alone, and TiledLSE's step through the package. Used by
gemm_rate.py --step, tiledlse_step.py, budget_sweep.py, step_from_idle.py and step_kernels.py;
step_times is how tiledlse_step.py and budget_sweep.py time a step.
"""
import torch

from ce_inputs import ce_inputs


def cublas_products(e, c, targets):
    """The three products of the step as torch.matmul runs them into outputs made here, a callable
    each: the logits E C^T, dE = G C and dC = G^T E, with G what PyTorch's backward multiplies
    ((softmax - one-hot) / N, in e's dtype)."""
    N = e.shape[0]
    logits = e @ c.T
    grad = torch.softmax(logits.float(), dim=-1)
    grad[torch.arange(N, device=e.device), targets] -= 1
    grad = (grad / N).to(e.dtype)
    de, dc = torch.empty_like(e), torch.empty_like(c)
    return (lambda: torch.matmul(e, c.T, out=logits), lambda: torch.matmul(grad, c, out=de),
            lambda: torch.matmul(grad.T, e, out=dc))


def tiledlse_step(e, c, targets, budget_bytes):
    """A callable: the step as a PyTorch user runs it, linear_cross_entropy(..., fused_step=True)
    and its backward, the gradients cleared first. e and c must require gradients."""
    import tiledlse  # here: gemm_rate.py runs where the package may not be installed

    def step():
        e.grad = c.grad = None
        tiledlse.linear_cross_entropy(e, c, targets, memory_budget=budget_bytes, fused_step=True).backward()
    return step


def step_against_products(N, D, V, budget_mib):
    """(cuBLAS's three products as one callable, TiledLSE's step at budget_mib) on the bf16 inputs
    of ce_inputs with seed 0 on the GPU: the pair step_from_idle.py and step_kernels.py compare."""
    e, c, t = ce_inputs(N, D, V, torch.bfloat16, "cuda", torch.Generator(device="cuda").manual_seed(0))
    products = cublas_products(e, c, t)

    def cublas():
        for product in products:
            product()
    return cublas, tiledlse_step(e.clone().requires_grad_(), c.clone().requires_grad_(), t, budget_mib << 20)


def step_times(step, untimed, timed):
    """The times of `timed` calls of step (ms, CUDA events around each, sorted) after `untimed`."""
    for _ in range(untimed):
        step()
    times = []
    for _ in range(timed):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        step()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return sorted(times)
