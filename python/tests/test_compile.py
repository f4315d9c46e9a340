"""torch.library custom ops and torch.compile (torch >= 2.4; skipped on older torch, e.g. Debian's
1.13, where the losses are torch.autograd.Functions): torch.library.opcheck on the ten ops
(schema, fake implementation, autograd registration, AOT dispatch with dynamic shapes), a small
model using the three losses compiled with fullgraph=True (no graph break), whose loss and gradients
match the eager model's, the cross-entropy's and the distillation's steps in one call (fused_step)
compiled against the eager forward and backward, and a distillation step (student and teacher,
every divergence) compiled against the eager one. On CPU, and on CUDA where the library and torch
have it.
"""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

import tiledlse
from tiledlse import _functions, _library

# A decorator per test, not pytestmark: run_tests.py's stand-in for pytest knows only this form.
needs_custom_ops = pytest.mark.skipif(not _functions.CUSTOM_OPS, reason="torch.library custom ops need torch >= 2.4")

DEVICES = ["cpu"]
if _library.device_available(_library.DEVICE_CUDA) and torch.cuda.is_available():
    DEVICES.append("cuda")


def randn(*shape, device, dtype=torch.float32, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * 0.5).to(dtype).to(device).requires_grad_(grad)


def _cross_entropy_operands(device, dtype, with_bias, reduction):
    """E (11 x 8), C (37 x 8), a bias or None, targets with ignored rows, and the ops' options."""
    n, v, d = 11, 37, 8
    e, c = randn(n, d, device=device, dtype=dtype), randn(v, d, device=device, dtype=dtype, seed=1)
    bias = randn(v, device=device, dtype=dtype, seed=2) if with_bias else None
    targets = torch.randint(0, v, (n,), generator=torch.Generator().manual_seed(3)).to(device)
    targets[::4] = -100
    # ignore_index, reduction, shift, softcap, z_loss, filter_eps, memory_budget (0: default), precision,
    # label_smoothing
    options = (-100, reduction, 0, 3.0, 1e-3, 0.0, 0, 0, 0.1)
    weight = (torch.rand(v, generator=torch.Generator().manual_seed(4)) + 0.5).to(device)
    return e, c, bias, targets, weight, options


@needs_custom_ops
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reduction, want_order, with_bias", [(2, False, True), (0, True, False)],
                         ids=["mean-bias", "none-order"])
def test_opcheck_cross_entropy(device, dtype, reduction, want_order, with_bias):
    # With class weights, label smoothing and the argmax where the bias is given; a gradient of
    # the LSE too.
    e, c, bias, targets, weight, options = _cross_entropy_operands(device, dtype, with_bias, reduction)
    weight = weight if with_bias else None
    torch.library.opcheck(torch.ops.tiledlse.cross_entropy_forward.default,
                          (e, c, bias, targets, weight, *options, want_order, with_bias))
    loss, lse, order, _predicted, _accuracy = torch.ops.tiledlse.cross_entropy_forward(
        e, c, bias, targets, weight, *options, want_order, with_bias)
    bias = None if bias is None else bias.detach()
    torch.library.opcheck(torch.ops.tiledlse.cross_entropy_backward.default,
                          (e.detach(), c.detach(), bias, targets, weight, lse.detach(), order,
                           torch.ones_like(loss).detach(), torch.ones_like(lse).detach(), *options, True, False,
                           True))


@needs_custom_ops
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reduction, with_bias", [(2, True), (1, False)], ids=["mean-bias", "sum"])
def test_opcheck_cross_entropy_with_gradients(device, dtype, reduction, with_bias):
    e, c, bias, targets, weight, options = _cross_entropy_operands(device, dtype, with_bias, reduction)
    torch.library.opcheck(torch.ops.tiledlse.cross_entropy_with_gradients.default,
                          (e, c, bias, targets, weight if with_bias else None, *options, True, True, with_bias))


@needs_custom_ops
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "image_to_text"])
@pytest.mark.parametrize("with_labels", [False, True], ids=["diagonal", "labels"])
@pytest.mark.parametrize("precision", [0, 1], ids=["exact", "tf32"])
def test_opcheck_contrastive(device, symmetric, with_labels, precision):
    b, c = 13, 6
    image, text = randn(b, c, device=device), randn(b, c, device=device, seed=1)
    scale = torch.tensor(2.5, device=device, requires_grad=True)
    labels = torch.randperm(b, generator=torch.Generator().manual_seed(2)).to(device) if with_labels else None
    budget = 0  # the library's default
    torch.library.opcheck(torch.ops.tiledlse.contrastive_forward.default,
                          (image, text, scale, labels, symmetric, budget, precision))
    loss, row_lse, col_lse = torch.ops.tiledlse.contrastive_forward(image, text, scale, labels, symmetric, budget,
                                                                    precision)
    torch.library.opcheck(torch.ops.tiledlse.contrastive_backward.default,
                          (image.detach(), text.detach(), scale.detach(), labels, row_lse.detach(), col_lse.detach(),
                           torch.ones_like(loss).detach(), symmetric, budget, precision, True, True, True))


@needs_custom_ops
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_self_contrastive(device):
    z, scale, budget = randn(14, 6, device=device), torch.tensor(2.5, device=device, requires_grad=True), 0
    torch.library.opcheck(torch.ops.tiledlse.self_contrastive_forward.default, (z, scale, budget, 0))
    loss, lse = torch.ops.tiledlse.self_contrastive_forward(z, scale, budget, 0)
    torch.library.opcheck(torch.ops.tiledlse.self_contrastive_backward.default,
                          (z.detach(), scale.detach(), lse.detach(), torch.ones_like(loss).detach(), budget, 0, True,
                           True))


class TinyModel(torch.nn.Module):
    """A language model head and a CLIP head on one trunk: the three losses in one graph."""

    def __init__(self, vocab=97, dim=24, features=10):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.mix = torch.nn.Linear(dim, dim)
        self.lm_head = torch.nn.Linear(dim, vocab, bias=False)
        self.image = torch.nn.Linear(features, dim)
        self.text = torch.nn.Linear(features, dim)
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, tokens, images, texts):
        hidden = torch.tanh(self.mix(self.embed(tokens)))
        lm = tiledlse.linear_cross_entropy(hidden, self.lm_head.weight, tokens, shift=1, softcap=20.0)
        image = F.normalize(self.image(images), dim=-1)
        text = F.normalize(self.text(texts), dim=-1)
        scale = self.logit_scale.exp()
        # The two projections as two views of each sample: the SimCLR form over their rows too.
        simclr = tiledlse.self_contrastive_loss(torch.cat([image, text]), scale)
        return lm + tiledlse.contrastive_loss(image, text, scale) + simclr


@needs_custom_ops
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_model_compiles_fullgraph(device, dynamic):
    torch.manual_seed(0)
    model = TinyModel().to(device)
    compiled_model = copy.deepcopy(model)
    compiled = torch.compile(compiled_model, fullgraph=True, dynamic=dynamic)
    g = torch.Generator().manual_seed(1)
    for batch, length in ((3, 17), (5, 9)):  # a second shape: recompiles (static) or reuses (dynamic)
        tokens = torch.randint(0, 97, (batch, length), generator=g).to(device)
        images = torch.randn(batch * 4, 10, generator=g).to(device)
        texts = torch.randn(batch * 4, 10, generator=g).to(device)
        model.zero_grad()
        compiled_model.zero_grad()
        expected = model(tokens, images, texts)
        expected.backward()
        got = compiled(tokens, images, texts)
        got.backward()
        assert abs(got.item() - expected.item()) <= 1e-5 * (1 + abs(expected.item()))
        for (name, p), q in zip(model.named_parameters(), compiled_model.parameters()):
            err = (p.grad - q.grad).abs().max().item()
            assert err <= 1e-5 * (1 + p.grad.abs().max().item()), "%s: gradient differs by %g" % (name, err)


@needs_custom_ops
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("upstream", [1.0, 2.5], ids=["loss.backward", "scaled"])
def test_fused_step_compiles_fullgraph(device, upstream):
    """The step in one call in a compiled graph (its kept gradients always multiplied there) against
    the eager forward and backward pair."""
    def loss_of(e, c, targets, fused_step):
        hidden = torch.tanh(e)
        return upstream * tiledlse.linear_cross_entropy(hidden, c, targets, softcap=20.0, shift=1, filter_eps=None,
                                                        fused_step=fused_step)
    compiled = torch.compile(loss_of, fullgraph=True)
    g = torch.Generator().manual_seed(4)
    for batch, length in ((3, 17), (5, 9)):
        e, c = randn(batch, length, 24, device=device, seed=batch), randn(97, 24, device=device, seed=7)
        targets = torch.randint(0, 97, (batch, length), generator=g).to(device)
        expected = loss_of(e, c, targets, False)
        expected_grads = torch.autograd.grad(expected, (e, c))
        got = compiled(e, c, targets, True)
        grads = torch.autograd.grad(got, (e, c))
        assert abs(got.item() - expected.item()) <= 1e-5 * (1 + abs(expected.item()))
        for name, p, q in zip(("e", "c"), expected_grads, grads):
            err = (p - q).abs().max().item()
            assert err <= 1e-5 * (1 + p.abs().max().item()), "%s: gradient differs by %g" % (name, err)


@needs_custom_ops
@pytest.mark.parametrize("device", DEVICES)
def test_options_and_lse_gradient_compile_fullgraph(device):
    """Class weights, label smoothing, the token accuracy and CCE's z-loss recipe (a loss built
    from the returned LSE) in a compiled graph, against the same eager calls."""
    def loss_of(e, c, targets, weight):
        out = tiledlse.linear_cross_entropy(torch.tanh(e), c, targets, shift=1, filter_eps=None, weight=weight,
                                            label_smoothing=0.1, return_lse=True, return_token_accuracy=True)
        return out.loss + 1e-2 * (out.lse ** 2).mean(), out.token_accuracy
    compiled = torch.compile(loss_of, fullgraph=True)
    g = torch.Generator().manual_seed(5)
    e, c = randn(3, 17, 24, device=device, seed=3), randn(97, 24, device=device, seed=8)
    targets = torch.randint(0, 97, (3, 17), generator=g).to(device)
    weight = (torch.rand(97, generator=g) + 0.5).to(device)
    expected, expected_accuracy = loss_of(e, c, targets, weight)
    expected_grads = torch.autograd.grad(expected, (e, c))
    got, accuracy = compiled(e, c, targets, weight)
    grads = torch.autograd.grad(got, (e, c))
    assert abs(got.item() - expected.item()) <= 1e-5 * (1 + abs(expected.item()))
    assert accuracy.item() == expected_accuracy.item()
    for name, p, q in zip(("e", "c"), expected_grads, grads):
        err = (p - q).abs().max().item()
        assert err <= 1e-5 * (1 + p.abs().max().item()), "%s: gradient differs by %g" % (name, err)


def _distillation_operands(device, dtype, teacher_grad=False):
    """Student hs (11 x 8), ws (37 x 8), teacher ht (11 x 5), wt (37 x 5), targets with ignored rows."""
    hs, ws = randn(11, 8, device=device, dtype=dtype), randn(37, 8, device=device, dtype=dtype, seed=1)
    ht = randn(11, 5, device=device, dtype=dtype, seed=2, grad=teacher_grad)
    wt = randn(37, 5, device=device, dtype=dtype, seed=3, grad=teacher_grad)
    targets = torch.randint(0, 37, (11,), generator=torch.Generator().manual_seed(4)).to(device)
    targets[::4] = -100
    return hs, ws, ht, wt, targets


@needs_custom_ops
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("divergence, reduction, with_targets", [(0, 2, True), (2, 0, True), (1, 1, False)],
                         ids=["forward_kl-mean", "jsd-none", "reverse_kl-sum-no-targets"])
def test_opcheck_distillation(device, dtype, divergence, reduction, with_targets):
    hs, ws, ht, wt, targets = _distillation_operands(device, dtype, teacher_grad=True)
    targets = targets if with_targets else None
    # divergence, beta, temperature, alpha, ignore_index, shift, reduction, memory_budget (0: default)
    options = (divergence, 0.3, 2.0, 0.25 if with_targets else 0.0, -100, 1 if with_targets else 0, reduction, 0)
    torch.library.opcheck(torch.ops.tiledlse.distillation_forward.default, (hs, ws, ht, wt, targets, *options))
    loss, stats = torch.ops.tiledlse.distillation_forward(hs, ws, ht, wt, targets, *options)
    torch.library.opcheck(torch.ops.tiledlse.distillation_backward.default,
                          (hs.detach(), ws.detach(), ht.detach(), wt.detach(), targets, stats.detach(),
                           torch.ones_like(loss).detach(), *options, True, True, True, False))


@needs_custom_ops
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("divergence, reduction, with_targets", [(0, 2, True), (1, 1, False), (2, 2, True)],
                         ids=["forward_kl-mean", "reverse_kl-sum-no-targets", "jsd-mean"])
def test_opcheck_distillation_with_gradients(device, dtype, divergence, reduction, with_targets):
    hs, ws, ht, wt, targets = _distillation_operands(device, dtype, teacher_grad=True)
    targets = targets if with_targets else None
    options = (divergence, 0.3, 2.0, 0.25 if with_targets else 0.0, -100, 1 if with_targets else 0, reduction, 0)
    torch.library.opcheck(torch.ops.tiledlse.distillation_with_gradients.default,
                          (hs, ws, ht, wt, targets, *options, True, True, with_targets, with_targets))


@needs_custom_ops
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("upstream", [1.0, 2.5], ids=["loss.backward", "scaled"])
def test_distillation_fused_step_compiles_fullgraph(device, upstream):
    """The distillation's step in one call in a compiled graph (its kept gradients always
    multiplied there), the teacher trained too, against the eager forward and backward pair."""
    def loss_of(hs, ws, ht, wt, targets, fused_step):
        return upstream * tiledlse.distillation_loss(torch.tanh(hs), ws, ht, wt, targets, divergence="reverse_kl",
                                                     temperature=2.0, shift=1, alpha=0.2, fused_step=fused_step)
    compiled = torch.compile(loss_of, fullgraph=True)
    g = torch.Generator().manual_seed(6)
    for batch, length in ((3, 17), (5, 9)):
        hs, ht = randn(batch, length, 24, device=device, seed=batch), randn(batch, length, 40, device=device, seed=9)
        ws, wt = randn(97, 24, device=device, seed=7), randn(97, 40, device=device, seed=8)
        targets = torch.randint(0, 97, (batch, length), generator=g).to(device)
        expected = loss_of(hs, ws, ht, wt, targets, False)
        expected_grads = torch.autograd.grad(expected, (hs, ws, ht, wt))
        got = compiled(hs, ws, ht, wt, targets, True)
        grads = torch.autograd.grad(got, (hs, ws, ht, wt))
        assert abs(got.item() - expected.item()) <= 1e-5 * (1 + abs(expected.item()))
        for name, p, q in zip(("hs", "ws", "ht", "wt"), expected_grads, grads):
            err = (p - q).abs().max().item()
            assert err <= 1e-5 * (1 + p.abs().max().item()), "%s: gradient differs by %g" % (name, err)


@needs_custom_ops
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_distillation_compiles_fullgraph(device, dynamic):
    """A student and a frozen teacher (embeddings, a tanh layer, heads of different widths)
    distilled in one compiled graph with no break, every divergence; loss and student gradients
    against the eager run."""
    torch.manual_seed(0)
    student = torch.nn.ModuleDict(dict(embed=torch.nn.Embedding(97, 24), head=torch.nn.Linear(24, 97, bias=False)))
    teacher = torch.nn.ModuleDict(dict(embed=torch.nn.Embedding(97, 40), head=torch.nn.Linear(40, 97, bias=False)))
    student, teacher = student.to(device), teacher.to(device).requires_grad_(False)
    compiled_student = copy.deepcopy(student)

    def loss_of(model, tokens):
        with torch.no_grad():
            ht = torch.tanh(teacher["embed"](tokens))
        hs = torch.tanh(model["embed"](tokens))
        return sum(tiledlse.distillation_loss(hs, model["head"].weight, ht, teacher["head"].weight, tokens,
                                              divergence=divergence, temperature=2.0, shift=1, alpha=0.2, beta=0.4)
                   for divergence in ("forward_kl", "reverse_kl", "jsd"))
    compiled = torch.compile(loss_of, fullgraph=True, dynamic=dynamic)
    g = torch.Generator().manual_seed(1)
    for batch, length in ((3, 17), (5, 9)):
        tokens = torch.randint(0, 97, (batch, length), generator=g).to(device)
        student.zero_grad()
        compiled_student.zero_grad()
        expected = loss_of(student, tokens)
        expected.backward()
        got = compiled(compiled_student, tokens)
        got.backward()
        assert abs(got.item() - expected.item()) <= 1e-5 * (1 + abs(expected.item()))
        for (name, p), q in zip(student.named_parameters(), compiled_student.parameters()):
            err = (p.grad - q.grad).abs().max().item()
            assert err <= 1e-5 * (1 + p.grad.abs().max().item()), "%s: gradient differs by %g" % (name, err)
