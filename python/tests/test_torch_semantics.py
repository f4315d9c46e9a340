"""tiledlse.linear_cross_entropy against PyTorch's own F.cross_entropy on the materialized logits,
for every combination of the options a port from PyTorch, CCE or Liger-Kernel passes: class
weights x label smoothing x reduction x shift x softcap x bias x a z-loss built from the returned
LSE (CCE's recipe) x dtype, with ignored rows, at shapes that are no multiple of any tile.

Tolerance, per output: TiledLSE's error against the float64 reference is at most PyTorch's own
error in that dtype (the same computation materialized: logits rounded to the dtype, softmax in
float32, gradients rounded to the dtype) plus SLACK[dtype] times the reference's magnitude. The
slack is a few units of the dtype's rounding: TiledLSE accumulates in float32 (float64 for float64)
but rounds its gradients to the dtype once, where PyTorch's error on one element may be smaller
by chance. It also checks the LSE, the predicted tokens (but where a row's two largest logits
tie within the dtype's rounding) and the token accuracy.
"""
import itertools
import os
import random
import zlib

import pytest
import torch
import torch.nn.functional as F

import tiledlse
from tiledlse import _library

DEVICES = ["cpu"]
if _library.device_available(_library.DEVICE_CUDA) and torch.cuda.is_available():
    DEVICES.append("cuda")
DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
# Units of the dtype's rounding (float64: TiledLSE's sums and the reference's differ in order).
SLACK = {torch.float64: 1e-12, torch.float32: 16 * 2.0**-24, torch.bfloat16: 4 * 2.0**-9,
         torch.float16: 4 * 2.0**-12}
IGNORE = -100
# Fresh inputs each run (TLSE_TEST_SEED replays one; failures print it).
RUN_SEED = int(os.environ.get("TLSE_TEST_SEED", random.randrange(1 << 30)))
# (batch, length, D, V): no multiple of 8, 16, 64, 128 or 256.
SHAPE = (3, 13, 24, 97)

OPTIONS = list(itertools.product(
    [False, True],           # class weights
    [0.0, 0.1],              # label_smoothing
    ["mean", "sum", "none"],  # reduction
    [0, 1],                  # shift
    [None, 20.0],            # softcap
    [False, True],           # bias
    [False, True],           # z-loss from the returned LSE
))


def _ids(o):
    weight, smoothing, reduction, shift, softcap, bias, z_from_lse = o
    return "-".join([("w" if weight else "nw"), "ls%g" % smoothing, reduction, "s%d" % shift,
                     ("cap" if softcap else "nocap"), ("b" if bias else "nb"), ("zlse" if z_from_lse else "nz")])


def _inputs(dtype, device, seed, bias_wanted, weight_wanted):
    batch, length, d, v = SHAPE
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(batch, length, d, generator=g, dtype=torch.float64)
    c = torch.randn(v, d, generator=g, dtype=torch.float64) * (3.0 / d**0.5)
    bias = torch.randn(v, generator=g, dtype=torch.float64) if bias_wanted else None
    targets = torch.randint(0, v, (batch, length), generator=g)
    targets[torch.rand(batch, length, generator=g) < 0.2] = IGNORE
    weight = torch.rand(v, generator=g, dtype=torch.float64) * 1.5 + 0.5 if weight_wanted else None
    upstream = torch.rand(batch, length, generator=g, dtype=torch.float64) + 0.5
    # The values every path reads: rounded to the dtype once.
    e, c = e.to(dtype), c.to(dtype)
    bias = None if bias is None else bias.to(dtype)
    return [t if t is None else t.to(device) for t in (e, c, bias, targets, weight, upstream)]


def _reference(e, c, bias, targets, weight, options, compute):
    """The loss (times the upstream gradients, summed) and the LSE as a user writes them in
    PyTorch, from the materialized logits; `compute(e, c)` gives the logits in the precision
    studied."""
    _w, smoothing, reduction, shift, softcap, _b, z_from_lse = options
    logits = compute(e, c)
    if bias is not None:
        logits = logits + bias.to(logits.dtype)
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    shifted = torch.full_like(targets, IGNORE)
    shifted[..., : targets.shape[-1] - shift] = targets[..., shift:]
    valid = shifted != IGNORE
    v = logits.shape[-1]
    loss = F.cross_entropy(logits.reshape(-1, v), shifted.reshape(-1), ignore_index=IGNORE, reduction=reduction,
                           weight=None if weight is None else weight.to(logits.dtype), label_smoothing=smoothing)
    lse = torch.logsumexp(logits, dim=-1) * valid
    if reduction == "none":
        loss = loss.view(shifted.shape)
    return loss, lse, logits, shifted, valid


def _z_term(lse, valid, reduction):
    """CCE's z-loss recipe on the returned LSE: the mean of lse^2 over the rows not ignored
    (under "none", per row)."""
    if reduction == "none":
        return 1e-2 * lse**2
    return 1e-2 * (lse**2).sum() / (valid.sum() if reduction == "mean" else 1)


def _scalar(loss, lse, valid, options, upstream):
    reduction, z_from_lse = options[2], options[6]
    total = loss + (_z_term(lse, valid, reduction) if z_from_lse else 0)
    return (total * upstream).sum() if reduction == "none" else total * 2.5


def _error(got, ref):
    return (got.double() - ref.double()).abs().max().item() if ref.numel() else 0.0


def _check(name, got, ref, torch_got, dtype):
    """TiledLSE's error at most PyTorch's own in the dtype plus the slack (failures name the
    seed: TLSE_TEST_SEED replays it)."""
    scale = ref.double().abs().max().item() if ref.numel() else 0.0
    ours, theirs = _error(got, ref), _error(torch_got, ref)
    bound = theirs + SLACK[dtype] * (1.0 + scale)
    assert ours <= bound, "%s: error %.3g, PyTorch's own %.3g, bound %.3g (scale %.3g; TLSE_TEST_SEED=%d)" % (
        name, ours, theirs, bound, scale, RUN_SEED)


def _in_dtype(dtype, device):
    """The logits as PyTorch computes them in `dtype`: the product in the dtype (emulated where
    the CPU has no such matmul: float32 products rounded to it), upcast to float32 for the loss."""
    def compute(e, c):
        if dtype == torch.float64:
            return e @ c.T
        if device == "cpu" and dtype == torch.float16:
            return (e.float() @ c.float().T).to(dtype).float()
        return (e @ c.T).float()
    return compute


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("options", OPTIONS, ids=[_ids(o) for o in OPTIONS])
def test_against_pytorch(device, dtype, options):
    weight_wanted, smoothing, reduction, shift, softcap, bias_wanted, z_from_lse = options
    seed = RUN_SEED + zlib.crc32(_ids(options).encode()) + DTYPES.index(dtype)
    e, c, bias, targets, weight, upstream = _inputs(dtype, device, seed, bias_wanted, weight_wanted)
    leaves = [t.detach().clone().requires_grad_() for t in (e, c)] + (
        [bias.detach().clone().requires_grad_()] if bias is not None else [])

    out = tiledlse.linear_cross_entropy(
        leaves[0], leaves[1], targets, bias=leaves[2] if bias is not None else None, shift=shift, softcap=softcap,
        reduction=reduction, weight=weight, label_smoothing=smoothing, filter_eps=None, return_lse=True,
        return_token_accuracy=True, return_predicted_tokens=True)
    scored = torch.zeros_like(targets, dtype=torch.bool)  # the rows not ignored, after the shift
    scored[..., : targets.shape[-1] - shift] = targets[..., shift:] != IGNORE
    grads = torch.autograd.grad(_scalar(out.loss, out.lse, scored, options, upstream), leaves)

    # The float64 reference, and PyTorch's own computation in the dtype.
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    ref_loss, ref_lse, ref_logits, shifted, valid = _reference(
        ref_leaves[0], ref_leaves[1], ref_leaves[2] if bias is not None else None, targets, weight, options,
        lambda a, b: a @ b.T)
    ref_grads = torch.autograd.grad(_scalar(ref_loss, ref_lse, valid, options, upstream), ref_leaves)
    torch_leaves = [t.detach().clone().requires_grad_() for t in leaves]
    torch_loss, torch_lse, _, _, _ = _reference(torch_leaves[0], torch_leaves[1],
                                                torch_leaves[2] if bias is not None else None, targets, weight,
                                                options, _in_dtype(dtype, device))
    torch_grads = torch.autograd.grad(_scalar(torch_loss, torch_lse, valid, options, upstream), torch_leaves)

    assert out.loss.shape == ref_loss.shape and out.lse.shape == targets.shape
    _check("loss", out.loss, ref_loss, torch_loss, dtype)
    _check("lse", out.lse, ref_lse, torch_lse, dtype)
    for name, got, ref, theirs in zip(("dE", "dC", "dbias"), grads, ref_grads, torch_grads):
        _check(name, got, ref, theirs, dtype)

    # The predicted tokens: the argmax, but where the two largest logits lie within the error
    # of logits in the dtype; -1 for ignored rows. The accuracy follows from them.
    predicted = out.predicted_tokens
    top = ref_logits.detach().topk(2, dim=-1).values
    decided = (top[..., 0] - top[..., 1]) > 8 * SLACK[dtype] * (1 + ref_logits.detach().abs().max())
    expected = torch.where(valid, ref_logits.detach().argmax(dim=-1), torch.full_like(predicted, -1))
    assert torch.equal(predicted[~valid], expected[~valid])
    assert torch.equal(predicted[valid & decided], expected[valid & decided])
    right = ((predicted == shifted) & valid).double()
    if reduction == "none":
        assert torch.equal(out.token_accuracy.double(), right)
    else:
        assert abs(out.token_accuracy.item() - (right.sum() / valid.sum()).item()) <= 1e-6


@pytest.mark.parametrize("device", DEVICES)
def test_z_loss_from_the_lse_equals_the_option(device):
    """CCE's recipe, loss + z * mean(lse^2) over the rows not ignored, equals z_loss = z in value
    and gradient, in float64."""
    e, c, _bias, targets, _weight, _upstream = _inputs(torch.float64, device, RUN_SEED + 11, False, False)
    leaves = [t.clone().requires_grad_() for t in (e, c)]
    loss, lse = tiledlse.linear_cross_entropy(*leaves, targets, shift=1, return_lse=True)
    valid = torch.zeros_like(targets, dtype=torch.bool)
    valid[..., :-1] = targets[..., 1:] != IGNORE
    recipe = loss + 1e-2 * (lse[valid] ** 2).mean()
    option = tiledlse.linear_cross_entropy(*leaves, targets, shift=1, z_loss=1e-2)
    assert abs(recipe.item() - option.item()) <= 1e-12 * (1 + abs(option.item()))
    for a, b in zip(torch.autograd.grad(recipe, leaves), torch.autograd.grad(option, leaves)):
        assert (a - b).abs().max().item() <= 1e-12 * (1 + b.abs().max().item())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kwargs, error, pattern", [
    ({"label_smoothing": 1.5}, ValueError, r"argument 'label_smoothing' must be in \[0, 1\], got 1.5"),
    ({"label_smoothing": -0.1}, ValueError, r"argument 'label_smoothing' must be in \[0, 1\]"),
    ({"weight": "w"}, TypeError, r"argument 'weight' must be a torch.Tensor or None"),
    ({"weight": torch.ones(96)}, ValueError, r"argument 'weight' has shape \(96,\) but 'c' has V = 97 rows"),
    ({"weight": torch.ones(97, dtype=torch.int64)}, TypeError, r"argument 'weight' must have a floating-point dtype"),
    ({"weight": torch.full((97,), -1.0)}, ValueError, r"argument 'weight' has weight\[0\] = -1.0; class weights must"),
    ({"weight": torch.full((97,), float("nan"))}, ValueError, r"argument 'weight' has weight\[0\] = nan"),
    ({"return_token_accuracy": 1}, TypeError, r"argument 'return_token_accuracy' must be True or False"),
    ({"fused_step": True, "return_predicted_tokens": True}, ValueError, r"cannot give the LSE, the token accuracy"),
])
def test_bad_options_fail_clearly(device, kwargs, error, pattern):
    e, c, _bias, targets, _weight, _upstream = _inputs(torch.float32, device, RUN_SEED + 12, False, False)
    if isinstance(kwargs.get("weight"), torch.Tensor):
        kwargs = dict(kwargs, weight=kwargs["weight"].to(device))
    e.requires_grad_()
    with pytest.raises(error, match=pattern):
        tiledlse.linear_cross_entropy(e, c, targets, **kwargs)
