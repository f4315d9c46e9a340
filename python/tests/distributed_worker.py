"""One rank of test_distributed.py: joins the process group, runs every scenario, and writes what
each one returned (or its traceback) to <out_dir>/<rank>.pkl. Kept apart from the test module so
that a spawned rank imports neither pytest nor its stand-in.

Every rank builds the same global data from fixed seeds, computes the reference with plain
PyTorch on all of it (float64, the logits materialized), runs tiledlse.distributed on its own
share and compares its share of the results.
"""
import datetime
import os
import pickle
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F

# Tolerances relative to the largest reference magnitude (as test_tiledlse.py), with room for
# the ring's online merges in float32.
RTOL = {torch.float64: (1e-12, 1e-10), torch.float32: (5e-5, 5e-5)}


def close(got, ref, rtol, what):
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    assert got.shape == ref.shape, "%s: shape %s, expected %s" % (what, tuple(got.shape), tuple(ref.shape))
    err = (got - ref).abs().max().item() if ref.numel() else 0.0
    bound = rtol * (1.0 + (ref.abs().max().item() if ref.numel() else 0.0))
    assert err <= bound, "%s: max error %.3g > %.3g" % (what, err, bound)


def rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 0.5


def split(total, size, empty_rank):
    """Uneven shares (weights r % 3 + 1); with empty_rank the middle rank gets none."""
    w = [0 if empty_rank and r == size // 2 else r % 3 + 1 for r in range(size)]
    shares = [total * x // sum(w) for x in w]
    shares[max(range(size), key=lambda r: w[r])] += total - sum(shares)
    return shares


def contrastive(rank, size, device, dtype, with_labels, symmetric, empty_rank, memory_budget=None):
    import tiledlse.distributed as td
    shares = split(23, size, empty_rank)
    B, c, first = sum(shares), 6, sum(shares[:rank])
    rows = slice(first, first + shares[rank])
    image, text = rand(B, c, seed=1), rand(B, c, seed=2)
    labels = torch.randperm(B, generator=torch.Generator().manual_seed(3)) if with_labels else None

    mine = [x[rows].to(dtype).to(device).requires_grad_() for x in (image, text)]
    scale = torch.tensor(2.5, dtype=dtype, device=device, requires_grad=True)
    loss = td.contrastive_loss(mine[0], mine[1], scale, labels=None if labels is None else labels[rows].to(device),
                               symmetric=symmetric, memory_budget=memory_budget)
    loss.backward()

    ref_in = [x.to(dtype).double().requires_grad_() for x in (image, text)]
    ref_scale = torch.tensor(2.5, dtype=torch.float64, requires_grad=True)
    logits = ref_scale * ref_in[0] @ ref_in[1].T
    targets = torch.arange(B) if labels is None else labels
    ref = F.cross_entropy(logits, targets)
    if symmetric:
        ref = (ref + F.cross_entropy(logits.T, targets)) / 2
    ref.backward()
    loss_tol, grad_tol = RTOL[dtype]
    close(loss, ref, loss_tol, "loss")
    close(mine[0].grad, ref_in[0].grad[rows], grad_tol, "d image")
    close(mine[1].grad, ref_in[1].grad[rows], grad_tol, "d text")
    close(scale.grad, ref_scale.grad, grad_tol, "d scale")


def cross_entropy(rank, size, device, dtype, **options):
    import tiledlse.distributed as td
    shares = split(41, size, options.pop("empty_rank", False))
    V, D, first = sum(shares), 7, sum(shares[:rank])
    shard = slice(first, first + shares[rank])
    e, c, bias = rand(3, 11, D, seed=4), rand(V, D, seed=5), rand(V, seed=6)
    targets = torch.randint(0, V, (3, 11), generator=torch.Generator().manual_seed(7))
    targets.view(-1)[::4] = -1
    with_bias = options.pop("bias", False)
    # Class weights (each rank its shard), label smoothing, a z-loss built from the returned LSE
    # (its gradient reaching the LSE) and the predicted tokens.
    weighted = options.pop("weighted", False)
    weight = torch.rand(V, generator=torch.Generator().manual_seed(8), dtype=torch.float64) + 0.5
    if weighted:
        options.update(weight=weight[shard].to(device), label_smoothing=0.1, return_predicted_tokens=True)

    mine = [e.to(dtype).to(device).requires_grad_(), c[shard].to(dtype).to(device).requires_grad_()]
    mine_bias = bias[shard].to(dtype).to(device).requires_grad_() if with_bias else None
    out = td.linear_cross_entropy(mine[0], mine[1], targets.to(device), bias=mine_bias, ignore_index=-1,
                                  return_lse=True, filter_eps=None, **options)
    loss, lse = out[0], out[1]
    upstream = torch.linspace(0.5, 1.5, loss.numel(), dtype=loss.dtype, device=device).view(loss.shape)
    ((loss * upstream).sum() + (0.01 * (lse ** 2).sum() if weighted else 0)).backward()

    ref_in = [x.to(dtype).double().requires_grad_() for x in (e, c, bias)]
    logits = ref_in[0] @ ref_in[1].T + (ref_in[2] if with_bias else 0)
    softcap = options.get("softcap")
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    shift = options.get("shift", 0)
    t = torch.full_like(targets, -1)
    t[:, : 11 - shift] = targets[:, shift:]
    reduction = options.get("reduction", "mean")
    ref = F.cross_entropy(logits.view(-1, V), t.view(-1), ignore_index=-1, reduction=reduction,
                          weight=weight if weighted else None, label_smoothing=0.1 if weighted else 0.0)
    ref_lse = torch.logsumexp(logits, -1) * (t != -1)
    ((ref.view(loss.shape) * upstream.double().cpu()).sum() + (0.01 * (ref_lse ** 2).sum() if weighted else 0)).backward()
    loss_tol, grad_tol = RTOL[dtype]
    close(loss, ref.view(loss.shape), loss_tol, "loss")
    close(lse, ref_lse, loss_tol, "lse")
    if weighted:  # every rank holds the global argmax, -1 on ignored rows
        expected = torch.where(t != -1, logits.detach().argmax(-1), torch.full_like(t, -1))
        assert torch.equal(out.predicted_tokens.cpu(), expected), "predicted tokens"
    close(mine[0].grad, ref_in[0].grad, grad_tol, "d e")
    close(mine[1].grad, ref_in[1].grad[shard], grad_tol, "d c shard")
    if with_bias:
        close(mine_bias.grad, ref_in[2].grad[shard], grad_tol, "d bias shard")


def error_of(f):
    """(exception type name, message) of f(), which must raise."""
    try:
        f()
    except Exception as e:
        return type(e).__name__, str(e)
    raise AssertionError("did not raise")


def features(rows, cols, device, dtype=torch.float32):
    return torch.zeros(rows, cols, dtype=dtype, device=device)


def mismatched_features(rank, size, device):
    import tiledlse.distributed as td
    cols = 5 if rank == size - 1 else 4
    return error_of(lambda: td.contrastive_loss(features(3, cols, device), features(3, cols, device), 1.0))


def wrong_dtype_on_one_rank(rank, size, device):
    import tiledlse.distributed as td
    labels = torch.zeros(3, dtype=torch.int32 if rank == 1 else torch.int64, device=device)
    return error_of(lambda: td.contrastive_loss(features(3, 4, device), features(3, 4, device), 1.0, labels=labels))


def wrong_device(rank, size, device):
    import tiledlse.distributed as td
    e = torch.zeros(4, 3, device="meta")
    return error_of(lambda: td.linear_cross_entropy(e, torch.zeros(5, 3, device="meta"),
                                                    torch.zeros(4, dtype=torch.int64, device="meta")))


def bad_precision_on_one_rank(rank, size, device):
    import tiledlse.distributed as td
    precision = "fp32" if rank == 1 else "exact"
    return error_of(lambda: td.contrastive_loss(features(3, 4, device), features(3, 4, device), 1.0,
                                                precision=precision))


def bad_budget_on_one_rank(rank, size, device):
    import tiledlse.distributed as td
    budget = 0 if rank == 1 else None
    return error_of(lambda: td.linear_cross_entropy(features(4, 3, device), features(2, 3, device),
                                                    torch.zeros(4, dtype=torch.int64, device=device),
                                                    memory_budget=budget))


def target_out_of_range(rank, size, device):
    import tiledlse.distributed as td
    e, c = features(4, 3, device), features(2, 3, device)  # V = 2 * size
    targets = torch.tensor([0, 1, 2 * size if rank == 0 else 0, -100], device=device)
    return error_of(lambda: td.linear_cross_entropy(e, c, targets))


SCENARIOS = {
    "contrastive_f64": lambda r, s, d: contrastive(r, s, d, torch.float64, False, True, False),
    "contrastive_f64_labels_empty_rank": lambda r, s, d: contrastive(r, s, d, torch.float64, True, True, True),
    "contrastive_f64_image_to_text": lambda r, s, d: contrastive(r, s, d, torch.float64, True, False, False),
    "contrastive_f32": lambda r, s, d: contrastive(r, s, d, torch.float32, True, True, False),
    # a budget may differ by rank: each bounds its own rank's workspace
    "contrastive_f32_budgets": lambda r, s, d: contrastive(r, s, d, torch.float32, False, True, False,
                                                           memory_budget=1 if r == 0 else None),
    "cross_entropy_f64": lambda r, s, d: cross_entropy(r, s, d, torch.float64, bias=True),
    "cross_entropy_f64_options": lambda r, s, d: cross_entropy(r, s, d, torch.float64, softcap=3.0, shift=1,
                                                               reduction="none", empty_rank=True),
    "cross_entropy_f64_sum": lambda r, s, d: cross_entropy(r, s, d, torch.float64, reduction="sum"),
    "cross_entropy_f64_weights_smoothing_lse": lambda r, s, d: cross_entropy(r, s, d, torch.float64, bias=True,
                                                                             weighted=True, empty_rank=True),
    "cross_entropy_f32": lambda r, s, d: cross_entropy(r, s, d, torch.float32, bias=True),
    "cross_entropy_f32_budget": lambda r, s, d: cross_entropy(r, s, d, torch.float32, memory_budget=1 << 20),
    "mismatched_features": mismatched_features,
    "wrong_dtype_on_one_rank": wrong_dtype_on_one_rank,
    "wrong_device": wrong_device,
    "bad_precision_on_one_rank": bad_precision_on_one_rank,
    "bad_budget_on_one_rank": bad_budget_on_one_rank,
    "target_out_of_range": target_out_of_range,
}


def run(rank, size, backend, init_file, out_dir):
    """Entry point of a spawned rank."""
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method="file://" + init_file, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))  # a collective left waiting fails, not hangs
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    results = {}
    for name, scenario in SCENARIOS.items():
        try:
            results[name] = ("ok", scenario(rank, size, device))
        except Exception:
            results[name] = ("failed", traceback.format_exc())
    with open(os.path.join(out_dir, "%d.pkl" % rank), "wb") as f:
        pickle.dump(results, f)
    dist.destroy_process_group()
