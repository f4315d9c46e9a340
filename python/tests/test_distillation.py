"""tiledlse.distillation_loss against a float64 reference in pure PyTorch that materializes both
logit matrices (F.log_softmax, F.kl_div, F.cross_entropy): each divergence (forward KL, reverse
KL, JSD at several beta, beta 0 and 1 as the two KLs), temperatures 0.5 to 4, the alpha mix with
the hard-label cross-entropy, ignored rows and the shift, every reduction, batch shapes (..., D),
the teacher frozen or trained, extreme and masked teacher logits; the gradients by
torch.autograd.gradcheck in float64; the bad input messages; the training step in one call
(fused_step) against the forward and backward pair, which library calls each choice makes and its
bad input; and the example of examples/python/distill.py, run as a user runs it.
"""
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import tiledlse
from tiledlse import _calls, _functions, _library
from test_tiledlse import calls_made as shared_calls_made

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "python", "distill.py")


def shifted_targets(targets, shift, ignore_index):
    """Each position's target: targets[..., t + shift] along the last dimension, ignore_index past the end."""
    if targets is None or shift == 0:
        return targets
    out = torch.full_like(targets, ignore_index)
    out[..., : max(targets.shape[-1] - shift, 0)] = targets[..., shift:]
    return out


def reference(hs, ws, ht, wt, targets=None, divergence="forward_kl", beta=0.5, temperature=1.0, ignore_index=-100,
              shift=0, alpha=0.0, reduction="mean"):
    """The loss with every logit formed, in the inputs' dtype (pass float64); differentiable."""
    batch_shape = hs.shape[:-1]
    x = hs.reshape(-1, hs.shape[-1]) @ ws.T  # the student's logits at temperature 1
    ls = F.log_softmax(x / temperature, dim=-1)
    lt = F.log_softmax((ht.reshape(-1, ht.shape[-1]) @ wt.T) / temperature, dim=-1)
    if divergence == "jsd" and beta == 0.0:
        divergence = "forward_kl"
    if divergence == "jsd" and beta == 1.0:
        divergence = "reverse_kl"
    if divergence == "forward_kl":  # sum_j p_t (log p_t - log p_s)
        div = F.kl_div(ls, lt, reduction="none", log_target=True).sum(-1)
    elif divergence == "reverse_kl":
        div = F.kl_div(lt, ls, reduction="none", log_target=True).sum(-1)
    else:  # Liger-Kernel's form: log m by logsumexp
        lm = torch.logsumexp(torch.stack([lt + math.log(beta), ls + math.log(1 - beta)]), dim=0)
        div = beta * F.kl_div(lm, lt, reduction="none", log_target=True).sum(-1) + \
            (1 - beta) * F.kl_div(lm, ls, reduction="none", log_target=True).sum(-1)
    if targets is None:
        scored = torch.ones(x.shape[0], dtype=torch.bool)
        row = div
    else:
        rows = shifted_targets(targets, shift, ignore_index).reshape(-1)
        scored = rows != ignore_index
        ce = F.cross_entropy(x, rows, ignore_index=ignore_index, reduction="none")
        row = torch.where(scored, alpha * ce + (1 - alpha) * div, torch.zeros_like(div))
    if reduction == "none":
        return row.view(batch_shape)
    if reduction == "sum":
        return row.sum()
    return row.sum() / scored.sum().clamp(min=1)


def operands(n=37, v=53, ds=19, dt=23, batch=None, dtype=torch.float64, seed=0, scale=1.0, teacher_grad=False):
    """Student (hs, ws) and teacher (ht, wt) of sizes that are no multiples of a tile, in dtype,
    leaves that require grad (the teacher's only with teacher_grad); batch: a leading shape instead of (n,)."""
    g = torch.Generator().manual_seed(seed)
    lead = (n,) if batch is None else tuple(batch)

    def draw(*shape, grad):
        t = (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)
        return t.requires_grad_(grad)
    return (draw(*lead, ds, grad=True), draw(v, ds, grad=True), draw(*lead, dt, grad=teacher_grad),
            draw(v, dt, grad=teacher_grad))


def targets_for(shape, v, seed=1, ignore_every=5, ignore_index=-100):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, v, shape, generator=g)
    flat = t.view(-1)
    flat[::ignore_every] = ignore_index
    return t


def assert_close(got, ref, rtol, what):
    err = (got.double() - ref.double()).abs().max().item() if got.numel() else 0.0
    bound = rtol * (1.0 + ref.double().abs().max().item() if ref.numel() else 1.0)
    assert err <= bound, "%s: max error %.3g > %.3g" % (what, err, bound)


def compare(options, dtype=torch.float64, rtol=1e-10, grad_rtol=None, teacher_grad=True, with_targets=True,
            batch=None, device="cpu", **sizes):
    """The loss and the gradients of every operand that requires grad, computed on `device`,
    against the reference on the CPU on the same (rounded) values; an upstream gradient that is not 1."""
    hs, ws, ht, wt = [t.detach().to(device).requires_grad_(t.requires_grad)
                      for t in operands(dtype=dtype, teacher_grad=teacher_grad, batch=batch, **sizes)]
    lead = hs.shape[:-1]
    targets = targets_for(lead, ws.shape[0]) if with_targets else None
    loss = tiledlse.distillation_loss(hs, ws, ht, wt, None if targets is None else targets.to(device), **options)
    doubles = [t.detach().cpu().double().requires_grad_(t.requires_grad) for t in (hs, ws, ht, wt)]
    ref = reference(*doubles, targets, **options)
    assert loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert loss.shape == ref.shape and loss.device.type == device
    assert_close(loss.cpu(), ref, rtol, "loss")
    upstream = torch.linspace(0.5, 1.5, max(ref.numel(), 1), dtype=torch.float64).view(ref.shape)
    inputs = [t for t in (hs, ws, ht, wt) if t.requires_grad]
    grads = torch.autograd.grad((loss * upstream.to(loss.device, loss.dtype)).sum(), inputs)
    ref_grads = torch.autograd.grad((ref * upstream).sum(), [t for t in doubles if t.requires_grad])
    names = [name for name, t in zip(("hs", "ws", "ht", "wt"), (hs, ws, ht, wt)) if t.requires_grad]
    for name, g, r in zip(names, grads, ref_grads):
        assert g.dtype == dtype and g.shape == r.shape and g.device.type == device
        assert_close(g.cpu(), r, grad_rtol or rtol, "d" + name)


DEVICES = ["cpu"]
if _library.device_available(_library.DEVICE_CUDA) and torch.cuda.is_available():
    DEVICES.append("cuda")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("divergence", ["forward_kl", "reverse_kl", "jsd"])
@pytest.mark.parametrize("dtype, rtol, grad_rtol", [(torch.float64, 1e-10, None), (torch.float32, 2e-5, 2e-5),
                                                    (torch.bfloat16, 2e-5, 1e-2)], ids=str)
@pytest.mark.parametrize("sizes", [{}, dict(v=301, ds=24, dt=40)], ids=["odd_depths", "depths_of_8"])
def test_each_device(device, divergence, dtype, rtol, grad_rtol, sizes):
    """The call on every device this build and machine have (CUDA tensors where a GPU is usable),
    with the alpha mix, a temperature, ignored rows and a frozen teacher, at the tolerances of
    test_low_precision_dtypes; depths that are multiples of 8 take the GPU's tile-pair kernels
    (bf16 on Hopper)."""
    options = dict(divergence=divergence, temperature=2.0, alpha=0.3, reduction="mean")
    compare(options, dtype=dtype, rtol=rtol, grad_rtol=grad_rtol, teacher_grad=False, device=device, **sizes)


@pytest.mark.parametrize("divergence, beta", [("forward_kl", 0.5), ("reverse_kl", 0.5), ("jsd", 0.5), ("jsd", 0.1),
                                              ("jsd", 0.9), ("jsd", 0.0), ("jsd", 1.0)])
@pytest.mark.parametrize("temperature", [0.5, 1.0, 4.0])
def test_divergences_and_temperatures(divergence, beta, temperature):
    compare(dict(divergence=divergence, beta=beta, temperature=temperature))


@pytest.mark.parametrize("divergence", ["forward_kl", "reverse_kl", "jsd"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("alpha", [0.0, 0.4, 1.0])
def test_alpha_mix_ignored_rows_shift_and_reductions(divergence, reduction, alpha):
    compare(dict(divergence=divergence, alpha=alpha, reduction=reduction, shift=1, temperature=2.0, beta=0.3))


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_batch_shape_shifts_each_sequence(reduction):
    # (batch, length, D): the last position of each sequence is not scored with shift=1.
    compare(dict(shift=1, alpha=0.25, reduction=reduction, divergence="jsd"), batch=(3, 11))


@pytest.mark.parametrize("divergence", ["forward_kl", "reverse_kl", "jsd"])
def test_without_targets_every_row_is_scored(divergence):
    compare(dict(divergence=divergence, temperature=1.5), with_targets=False)
    compare(dict(divergence=divergence, reduction="none"), with_targets=False, batch=(2, 9))


@pytest.mark.parametrize("dtype, rtol, grad_rtol", [(torch.float32, 2e-5, 2e-5), (torch.bfloat16, 2e-5, 1e-2),
                                                    (torch.float16, 2e-5, 2e-3)], ids=str)
def test_low_precision_dtypes(dtype, rtol, grad_rtol):
    # The loss accumulates in float32 on the rounded inputs (the reference sees the same values);
    # gradients are stored in the input dtype.
    compare(dict(divergence="jsd", alpha=0.3, temperature=2.0), dtype=dtype, rtol=rtol, grad_rtol=grad_rtol)


def test_teacher_frozen_unless_it_requires_grad():
    hs, ws, ht, wt = operands(n=9, v=13, ds=5, dt=7)
    loss = tiledlse.distillation_loss(hs, ws, ht, wt)
    loss.backward()
    assert hs.grad is not None and ws.grad is not None
    assert ht.grad is None and wt.grad is None and not ht.requires_grad
    # A teacher weight that requires grad, its hidden states under no_grad: only the weight's gradient.
    wt.requires_grad_(True)
    with torch.no_grad():
        ht2 = ht * 1.0
    tiledlse.distillation_loss(hs, ws, ht2, wt, divergence="reverse_kl").backward()
    assert wt.grad is not None and wt.grad.abs().sum() > 0
    # Under no_grad nothing is kept for a backward.
    with torch.no_grad():
        assert not tiledlse.distillation_loss(hs, ws, ht, wt).requires_grad


@pytest.mark.parametrize("divergence", ["forward_kl", "reverse_kl", "jsd"])
def test_gradcheck_float64(divergence):
    hs, ws, ht, wt = operands(n=5, v=7, ds=3, dt=4, teacher_grad=True, seed=3)
    targets = torch.tensor([2, -100, 6, 0, 1])

    def f(a, b, c, d):
        return tiledlse.distillation_loss(a, b, c, d, targets, divergence=divergence, beta=0.3, temperature=1.7,
                                          alpha=0.2, reduction="none")
    assert torch.autograd.gradcheck(f, (hs, ws, ht, wt), eps=1e-6, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("divergence", ["forward_kl", "reverse_kl", "jsd"])
def test_extreme_and_masked_teacher_logits(divergence):
    # Logits of +-1e3 and a teacher row of -1e30 per class for a third of the vocabulary: those
    # classes have p_t = 0 exactly (masked), which must add 0 (0 log 0), not NaN.
    hs, ws, ht, wt = operands(n=17, v=29, ds=6, dt=6, scale=1.0)
    with torch.no_grad():
        ws.mul_(30.0)
        ht.abs_().add_(0.5)  # positive teacher features: wt row -1e30 gives logits near -1e30
        wt[::3] = -1e30
    for temperature in (0.5, 4.0):
        options = dict(divergence=divergence, temperature=temperature, beta=0.4)
        loss = tiledlse.distillation_loss(hs, ws, ht, wt, reduction="none", **options)
        assert torch.isfinite(loss).all(), loss
        ref = reference(*(t.detach() for t in (hs, ws, ht, wt)), reduction="none", **options)
        assert_close(loss, ref, 1e-9, "loss at temperature %g" % temperature)
        (grad,) = torch.autograd.grad(loss.sum(), (hs,))
        assert torch.isfinite(grad).all()


def test_bad_input_messages():
    hs, ws, ht, wt = operands(n=6, v=11, ds=4, dt=5)
    t = torch.zeros(6, dtype=torch.int64)
    call = tiledlse.distillation_loss
    with pytest.raises(ValueError, match="'teacher_weight' has V = 12 rows but 'student_weight' has V = 11"):
        call(hs, ws, ht, torch.zeros(12, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="'beta' must be in \\[0, 1\\], got 1.5"):
        call(hs, ws, ht, wt, divergence="jsd", beta=1.5)
    with pytest.raises(ValueError, match="'temperature' must be finite and > 0, got 0.0"):
        call(hs, ws, ht, wt, temperature=0)
    with pytest.raises(ValueError, match="'temperature' must be finite and > 0, got -1.0"):
        call(hs, ws, ht, wt, temperature=-1.0)
    with pytest.raises(ValueError, match="'alpha' must be in \\[0, 1\\], got 2.0"):
        call(hs, ws, ht, wt, t, alpha=2)
    with pytest.raises(ValueError, match="'alpha' is 0.5 but no targets were given"):
        call(hs, ws, ht, wt, alpha=0.5)
    with pytest.raises(ValueError, match="'divergence' must be 'forward_kl', 'reverse_kl' or 'jsd', got 'kl'"):
        call(hs, ws, ht, wt, divergence="kl")
    with pytest.raises(ValueError, match="'teacher_hidden' has shape \\(7, 5\\) but 'student_hidden' has shape"):
        call(hs, ws, torch.zeros(7, 5, dtype=torch.float64), wt)
    with pytest.raises(ValueError, match="'student_weight' has 4 columns but 'student_hidden' has D_s = 3"):
        call(hs[:, :3].contiguous(), ws, ht, wt)
    with pytest.raises(ValueError, match="'teacher_weight' has 5 columns but 'teacher_hidden' has D_t = 4"):
        call(hs, ws, ht[:, :4].contiguous(), wt)
    with pytest.raises(TypeError, match="'teacher_hidden' has dtype torch.float32 but 'student_hidden' has"):
        call(hs, ws, ht.float(), wt)
    with pytest.raises(TypeError, match="'targets' must have dtype torch.int64"):
        call(hs, ws, ht, wt, t.int())
    with pytest.raises(ValueError, match="'targets' has shape \\(5,\\)"):
        call(hs, ws, ht, wt, t[:5])
    with pytest.raises(ValueError, match="'shift' must be an int >= 0, got -1"):
        call(hs, ws, ht, wt, t, shift=-1)
    with pytest.raises(ValueError, match="'reduction' must be 'mean', 'sum' or 'none'"):
        call(hs, ws, ht, wt, reduction="batchmean")
    with pytest.raises(ValueError, match="must be contiguous"):
        call(hs, ws, ht, wt.t().contiguous().t())
    # Checked by the library: a target outside the vocabulary, naming the row and the value.
    bad = t.clone()
    bad[4] = 11
    with pytest.raises(ValueError, match="targets\\[4\\] = 11"):
        call(hs, ws, ht, wt, bad)


def test_options_layout_and_row_stats_match_tlse_h():
    # The ctypes structure against the library's defaults (a layout mismatch would scramble them),
    # and the per-row statistics' count against tlse.h where the source tree is at hand.
    import ctypes
    from tiledlse import _library as L
    options = L.DistillationOptions()
    L._lib.tlse_distillation_options_default(ctypes.byref(options))
    assert (options.divergence, options.reduction, options.beta, options.temperature, options.alpha,
            options.ignore_index, options.shift, options.memory_budget) == (0, 2, 0.5, 1.0, 0.0, -100, 0, 0)
    header = os.path.join(HERE, "..", "..", "c_api", "include", "tlse.h")
    if os.path.exists(header):
        text = open(header).read()
        assert "#define TLSE_DISTILLATION_ROW_STATS %d\n" % L.DISTILLATION_ROW_STATS in text


# ---- The training step in one call (fused_step): gradients computed in the forward, kept -------


def calls_made(run):
    """The distillation's library calls `run()` made, in order (test_tiledlse.calls_made)."""
    return shared_calls_made(run, ("distillation_forward", "distillation_backward", "distillation_with_gradients"))


STEP = ["distillation_with_gradients"]
PAIR = ["distillation_forward", "distillation_backward"]


def step_operands(dtype, device, teacher_grad=True, student_grad=True):
    """Student and teacher (37 rows, V = 53, D_s = 19, D_t = 23) on `device` and targets with ignored rows."""
    hs, ws, ht, wt = [t.detach().to(device) for t in operands(dtype=dtype, seed=5)]
    hs.requires_grad_(student_grad), ws.requires_grad_(student_grad)
    ht.requires_grad_(teacher_grad), wt.requires_grad_(teacher_grad)
    return hs, ws, ht, wt, targets_for((37,), 53, seed=6).to(device)


def loss_and_grads(hs, ws, ht, wt, targets, upstream=1.0, **kwargs):
    """(loss, its gradients for each operand that requires one, the library calls made by the
    forward and the backward). The backward runs again (retain_graph): the same gradients."""
    out = {}
    leaves = [x for x in (hs, ws, ht, wt) if x.requires_grad]

    def run():
        loss = out["loss"] = tiledlse.distillation_loss(hs, ws, ht, wt, targets, **kwargs)
        if leaves:
            out["root"] = loss if upstream == 1.0 and loss.dim() == 0 else (loss * upstream).sum()
            out["grads"] = torch.autograd.grad(out["root"], leaves, retain_graph=True)
    made = calls_made(run)
    if leaves:
        again = torch.autograd.grad(out["root"], leaves)
        assert all(torch.equal(a, b) for a, b in zip(again, out["grads"]))
    return out["loss"], out.get("grads", ()), made


STEP_GRAD_RTOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("divergence", ["forward_kl", "reverse_kl", "jsd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("upstream", [1.0, 0.37], ids=["loss.backward", "scaled"])
def test_fused_step_matches_forward_backward(device, divergence, dtype, reduction, upstream):
    """The step's loss and gradients are the pair's bitwise at an upstream gradient of 1 where the
    step runs the pair (depths 19 and 23: not the Hopper path's, whose narrower panels round
    otherwise; test_each_device covers that path against float64); scaled, the kept gradients
    are multiplied in their dtype (one rounding)."""
    hs, ws, ht, wt, targets = step_operands(dtype, device)
    kwargs = dict(divergence=divergence, beta=0.3, temperature=2.0, alpha=0.25, shift=1, reduction=reduction,
                  upstream=upstream)
    loss, grads, made = loss_and_grads(hs, ws, ht, wt, targets, fused_step=True, **kwargs)
    ref_loss, ref_grads, ref_made = loss_and_grads(hs, ws, ht, wt, targets, fused_step=False, **kwargs)
    assert made == STEP and ref_made == PAIR
    assert loss.dtype == ref_loss.dtype and loss.shape == () and torch.equal(loss, ref_loss)
    assert len(grads) == len(ref_grads) == 4
    for name, got, ref in zip(("dHs", "dWs", "dHt", "dWt"), grads, ref_grads):
        assert got.dtype == dtype and got.device == hs.device and got.shape == ref.shape
        if upstream == 1.0:
            assert torch.equal(got, ref), name
        else:
            assert_close(got.cpu(), ref.cpu(), STEP_GRAD_RTOL[dtype], name)
    unscored = torch.cat([targets[1:] == -100, torch.tensor([True], device=targets.device)])  # shift=1
    assert grads[0][unscored].abs().max().item() == 0.0  # rows not scored get no gradient


@pytest.mark.parametrize("device", DEVICES)
def test_fused_step_auto_falls_back(device):
    hs, ws, ht, wt, targets = step_operands(torch.float32, device)
    # Auto on the CPU: the library runs no step fused, so the forward and the backward.
    loss, grads, made = loss_and_grads(hs, ws, ht, wt, targets)
    assert made == (PAIR if device == "cpu" else made) and len(grads) == 4
    # Per-row losses, no gradient needed: the pair, or the forward alone.
    assert loss_and_grads(hs, ws, ht, wt, targets, reduction="none", upstream=0.5)[2] == PAIR
    with torch.no_grad():
        assert calls_made(lambda: tiledlse.distillation_loss(hs, ws, ht, wt, targets)) == ["distillation_forward"]
        assert calls_made(lambda: tiledlse.distillation_loss(hs, ws, ht, wt, targets, fused_step=True)) == [
            "distillation_forward"]
    detached = [t.detach() for t in (hs, ws, ht, wt)]
    assert loss_and_grads(*detached, targets, fused_step=True)[2] == ["distillation_forward"]
    assert loss_and_grads(hs, ws, ht, wt, targets, fused_step=False)[2] == PAIR
    # The teacher frozen: the step computes the student's gradients only; the student frozen, the teacher's.
    for student_grad, teacher_grad, shapes in ((True, False, (hs.shape, ws.shape)), (False, True,
                                                                                     (ht.shape, wt.shape))):
        operands_ = step_operands(torch.float32, device, teacher_grad=teacher_grad, student_grad=student_grad)
        loss, grads, made = loss_and_grads(*operands_, fused_step=True)
        ref_loss, ref_grads, _ = loss_and_grads(*operands_, fused_step=False)
        assert made == STEP and tuple(g.shape for g in grads) == shapes
        assert torch.equal(loss, ref_loss) and all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
    # Without targets every row is scored: the step too.
    loss, grads, made = loss_and_grads(hs, ws, ht, wt, None, fused_step=True, divergence="reverse_kl")
    ref_loss, ref_grads, _ = loss_and_grads(hs, ws, ht, wt, None, fused_step=False, divergence="reverse_kl")
    assert made == STEP and torch.equal(loss, ref_loss) and all(torch.equal(a, b) for a, b in zip(grads, ref_grads))


def library_answers(fused, run):
    """Runs `run()` with _calls.distillation_step_fuses answering `fused` (as the library on a Hopper
    GPU would); returns the (N, V, D_s, D_t, want_teacher_gradients) of each question asked."""
    original, asked = _calls.distillation_step_fuses, []

    def answer(hs, ws, ht, config, want_teacher_gradients):
        asked.append((hs.shape[0], ws.shape[0], hs.shape[1], ht.shape[1], want_teacher_gradients))
        return fused
    _calls.distillation_step_fuses = answer
    try:
        run()
    finally:
        _calls.distillation_step_fuses = original
    return asked


@pytest.mark.parametrize("device", DEVICES)
def test_fused_step_auto_asks_the_library(device):
    """Auto takes the step only where the library runs it fused: never on the CPU (the pair, with
    no gradients computed in the forward); fused_step=True still forces it."""
    hs, ws, ht, wt, targets = step_operands(torch.bfloat16, device, teacher_grad=False)
    for budget in (None, 1 << 40):  # the default, and one that holds every logit
        config = _functions._distillation_arguments(hs, ws, ht, wt, targets, "forward_kl", 0.5, 1.0, -100, 0, 0.0,
                                                    "mean", budget)[5]
        fuses = _calls.distillation_step_fuses(hs, ws, ht, config, False)
        assert not (fuses and device == "cpu")
        assert loss_and_grads(hs, ws, ht, wt, targets, memory_budget=budget)[2] == (STEP if fuses else PAIR), budget
        assert loss_and_grads(hs, ws, ht, wt, targets, memory_budget=budget, fused_step=True)[2] == STEP
    # Where the library says fused, auto takes the step, asking once with the call's shapes and
    # whether the teacher's hidden states need a gradient; where it says not, the pair.
    for fused, expected in ((True, STEP), (False, PAIR)):
        made = []
        asked = library_answers(fused, lambda: made.extend(loss_and_grads(hs, ws, ht, wt, targets)[2]))
        assert made == expected and asked == [(37, 53, 19, 23, False)], (fused, made, asked)
    trained = ht.detach().requires_grad_()
    assert library_answers(False, lambda: loss_and_grads(hs, ws, trained, wt, targets)) == [(37, 53, 19, 23, True)]
    # Only the teacher needs a gradient: auto asks too.
    student = [t.detach() for t in (hs, ws)]
    assert library_answers(True, lambda: loss_and_grads(*student, trained, wt, targets)) == [(37, 53, 19, 23, True)]
    # No question where the step cannot be taken anyway.
    assert library_answers(True, lambda: loss_and_grads(hs, ws, ht, wt, targets, reduction="none",
                                                        upstream=0.5)) == []
    assert library_answers(True, lambda: loss_and_grads(hs.detach(), ws.detach(), ht, wt, targets)) == []
    assert library_answers(True, lambda: loss_and_grads(hs, ws, ht, wt, targets, fused_step=False)) == []


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        ({"fused_step": True, "reduction": "none"}, ValueError, "'fused_step' is True, but .* per-row losses"),
        ({"fused_step": "yes"}, TypeError, "'fused_step' must be None, True or False"),
        ({"fused_step": 1}, TypeError, "'fused_step' must be None, True or False"),
    ],
)
def test_fused_step_bad_input(kwargs, error, pattern):
    hs, ws, ht, wt = operands(n=6, v=11, ds=4, dt=5)
    with pytest.raises(error, match=pattern):
        tiledlse.distillation_loss(hs, ws, ht, wt, **kwargs)


@pytest.mark.parametrize("upstream", [1.0, 0.37], ids=["loss.backward", "scaled"])
def test_fused_step_autograd_function_path(upstream):
    """Older torch's path (_DistillationStep, torch.autograd.Function) on this torch: the custom
    op's results."""
    hs, ws, ht, wt, targets = step_operands(torch.float64, "cpu")
    kwargs = dict(divergence="reverse_kl", alpha=0.5, reduction="sum", upstream=upstream, fused_step=True)
    loss, grads, made = loss_and_grads(hs, ws, ht, wt, targets, **kwargs)
    custom_ops, _functions.CUSTOM_OPS = _functions.CUSTOM_OPS, False
    try:
        function_loss, function_grads, function_made = loss_and_grads(hs, ws, ht, wt, targets, **kwargs)
    finally:
        _functions.CUSTOM_OPS = custom_ops
    assert made == function_made == STEP
    assert torch.equal(loss, function_loss) and all(torch.equal(a, b) for a, b in zip(grads, function_grads))


def test_fused_step_gradcheck_and_no_double_backward():
    hs, ws, ht, wt = operands(n=5, v=7, ds=3, dt=4, teacher_grad=True, seed=3)
    targets = torch.tensor([2, -100, 6, 0, 1])
    for kwargs in (dict(divergence="forward_kl"), dict(divergence="reverse_kl", alpha=0.2, temperature=1.7),
                   dict(divergence="jsd", beta=0.3, shift=1, reduction="sum")):
        def f(a, b, c, d):
            return tiledlse.distillation_loss(a, b, c, d, targets, fused_step=True, **kwargs)
        assert torch.autograd.gradcheck(f, (hs, ws, ht, wt), eps=1e-6, atol=1e-8, rtol=1e-6), kwargs
    dhs, = torch.autograd.grad(tiledlse.distillation_loss(hs, ws, ht, wt, targets, fused_step=True), hs,
                               create_graph=True)
    with pytest.raises(RuntimeError):  # as the forward and backward pair: the gradient has no graph
        dhs.sum().backward()


def test_example_distils_a_random_teacher():
    # examples/python/distill.py as a user runs it: 50 steps, and it asserts its divergence fell.
    env = dict(os.environ, OMP_PROC_BIND="false")
    done = subprocess.run([sys.executable, EXAMPLE, "--steps", "50"], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=600)
    assert done.returncode == 0, done.stdout
    assert "divergence fell" in done.stdout, done.stdout
