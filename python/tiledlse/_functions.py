"""The public losses and their argument checks. With torch >= 2.4 they run as torch.library
custom ops (_ops.py: torch.compile traces them); with older torch (Debian's 1.13) through the
torch.autograd.Function classes below, which tiledlse.distributed also uses (its communicator
is a Python object, which a custom op cannot take)."""
from typing import NamedTuple, Optional

import torch
from torch.autograd.function import once_differentiable

from . import _calls
from . import _library as L
from ._calls import DTYPES, CrossEntropyConfig, DistillationConfig

# torch.library.custom_op and register_autograd arrived in torch 2.4.
CUSTOM_OPS = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_autograd")
if CUSTOM_OPS:
    from . import _ops  # noqa: F401  (registers torch.ops.tiledlse.*)


def _check_tensor(name, t, like=None, like_name=None, dtype=None, ndim=None):
    """Type, dtype, device, rank and contiguity of argument `name`; `like` gives the dtype and
    device it must share."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("argument '%s' must be a torch.Tensor, got %s" % (name, type(t).__name__))
    if dtype is not None and t.dtype != dtype:
        raise TypeError("argument '%s' must have dtype %s, got %s" % (name, dtype, t.dtype))
    if like is not None and dtype is None and t.dtype != like.dtype:
        raise TypeError("argument '%s' has dtype %s but '%s' has %s" % (name, t.dtype, like_name, like.dtype))
    if dtype is None and like is None and t.dtype not in DTYPES:
        raise TypeError(
            "argument '%s' has dtype %s; supported: float32, float64, bfloat16, float16" % (name, t.dtype)
        )
    if like is not None and t.device != like.device:
        raise ValueError("argument '%s' is on %s but '%s' is on %s" % (name, t.device, like_name, like.device))
    if ndim is not None and t.dim() != ndim:
        raise ValueError("argument '%s' must have %d dimensions, got shape %s" % (name, ndim, tuple(t.shape)))
    if not t.is_contiguous():
        raise ValueError(
            "argument '%s' must be contiguous (tiledlse uses tensors in place and does not copy them); "
            "its shape is %s and strides %s: call .contiguous() first" % (name, tuple(t.shape), t.stride())
        )


def _number(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("argument '%s' must be a number, got %r" % (name, value))
    return float(value)


def _memory_budget(memory_budget):
    """None -> 0, the library's default (256 MiB); otherwise a positive int of bytes."""
    if memory_budget is None:
        return 0
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, int) or memory_budget < 1:
        raise ValueError("argument 'memory_budget' must be None or a positive int (bytes), got %r" % (memory_budget,))
    return memory_budget


def _precision(precision):
    """'exact' or 'tf32' -> the tlse_precision code."""
    if not isinstance(precision, str) or precision not in L.PRECISIONS:
        raise ValueError("argument 'precision' must be 'exact' or 'tf32', got %r" % (precision,))
    return L.PRECISIONS[precision]


def _filter_eps(filter_eps):
    if filter_eps == "auto":
        return L.FILTER_EPS_AUTO
    if filter_eps is None:
        return 0.0
    if isinstance(filter_eps, str):
        raise TypeError("argument 'filter_eps' must be 'auto', None or a float, got %r" % (filter_eps,))
    return _number("filter_eps", filter_eps)


class CrossEntropyOutput(NamedTuple):
    """linear_cross_entropy's results when the token accuracy or the predicted tokens are asked
    for (Liger-Kernel's CrossEntropyOutput fields); each is None when not asked for."""
    loss: torch.Tensor
    lse: Optional[torch.Tensor] = None
    token_accuracy: Optional[torch.Tensor] = None
    predicted_tokens: Optional[torch.Tensor] = None


def linear_cross_entropy(e, c, targets, bias=None, ignore_index=-100, softcap=None, reduction="mean", shift=0,
                         return_lse=False, filter_eps="auto", z_loss=0.0, memory_budget=None, fused_step=None,
                         precision="exact", weight=None, label_smoothing=0.0, return_token_accuracy=False,
                         return_predicted_tokens=False):
    """Cross-entropy of the logits ``e @ c.T (+ bias)`` against ``targets`` without forming them.

    e: (..., D) embeddings; c: (V, D) classifier, same dtype and device (float32, float64,
    bfloat16, float16; cpu or cuda), contiguous; targets: int64 of shape e.shape[:-1], each in
    [0, V) or ignore_index; bias: (V) or None. softcap: logits become softcap*tanh(logit/softcap).
    shift: position t is scored against targets[..., t + shift] (next-token prediction without
    slicing); the last `shift` positions of each sequence are ignored. reduction: "mean" (over
    the rows not ignored, or their total weight), "sum" or "none" (shape e.shape[:-1]). weight:
    (V) class weights (floating, on e's device, finite and >= 0), and label_smoothing in [0, 1],
    both as F.cross_entropy defines them. filter_eps: gradient filter of the backward ("auto":
    eps(dtype)/32 as CCE; None or 0: exact). z_loss adds z_loss * lse^2 (under "mean" divided by
    the number of rows not ignored, as Liger-Kernel's lse_square_scale). memory_budget: bytes of
    workspace a call may use, each picking the fastest algorithm that fits (None: the library's
    default, 256 MiB; docs/options.md).

    Returns the loss (float32, float64 for float64 inputs). With return_lse, (loss, lse): the
    per-row LSE (shape e.shape[:-1], 0 for ignored rows), which carries its gradient (a loss
    built from it, e.g. CCE's z-loss recipe, trains). With return_token_accuracy or
    return_predicted_tokens, a CrossEntropyOutput (loss, lse, token_accuracy, predicted_tokens),
    the fields not asked for None: predicted_tokens (int64, e.shape[:-1]) each row's argmax
    class (ties: the lowest id), -1 for ignored rows; token_accuracy the fraction of rows not
    ignored predicted right (0-d; per row, 1.0 or 0.0, under reduction "none"), both computed by
    the forward.
    fused_step: compute the gradients in the forward, in one call with the loss, and keep them
    until the backward (the step runs fused, and faster, on Hopper GPUs with bf16 or fp16 inputs
    where memory_budget allows, docs/options.md; a fused step filters no gradient, as
    filter_eps=0). None (auto): when the step runs fused there (a Hopper GPU and a memory_budget
    that holds the logits of a chunk of rows or the backward's buffers; the library is asked),
    gradients of e or c will be needed, bias needs none, the reduction is "mean" or "sum", and
    neither the LSE nor the accuracy or predicted tokens are returned, outside torch.compile;
    True: whenever gradients
    will be needed (a bias gradient too); False: never (the forward, then the backward).
    precision: "exact" (default) or "tf32": for float32 inputs on GPUs with TF32 tensor cores,
    products of operands rounded to TF32 (11 significant bits), several times faster; no effect
    on the other dtypes or on the CPU. docs/python.md maps the arguments of F.cross_entropy,
    CCE's and Liger-Kernel's calls to these.
    """
    e2, targets, config, batch_shape, weight = _cross_entropy_arguments(
        e, c, targets, bias, ignore_index, softcap, reduction, shift, filter_eps, z_loss, memory_budget, precision,
        weight, label_smoothing)
    want_argmax = _flag("return_token_accuracy", return_token_accuracy) or _flag("return_predicted_tokens",
                                                                                return_predicted_tokens)
    grad = torch.is_grad_enabled()
    needs = (grad and e.requires_grad, grad and c.requires_grad, grad and bias is not None and bias.requires_grad)
    # The step gives a reduced loss without LSE: nothing to reshape.
    if _fused_step(fused_step, needs, reduction, return_lse or want_argmax, needs[0] or needs[1],
                   lambda: _calls.step_fuses(e2, c, config, needs[2])):
        if CUSTOM_OPS:
            return torch.ops.tiledlse.cross_entropy_with_gradients(e2, c, bias, targets, weight, *config, *needs)[0]
        return _LinearCrossEntropyStep.apply(e2, c, bias, targets, weight, config, needs)
    # Sorting the vocabulary (forward) lets the backward's filter skip whole tiles of unlikely
    # classes; it costs a sort of V entries, worth it only when filtering and training.
    want_order = config.filter_eps != 0 and (needs[0] or needs[1])
    if CUSTOM_OPS:
        loss, lse, _order, predicted, accuracy = torch.ops.tiledlse.cross_entropy_forward(
            e2, c, bias, targets, weight, *config, want_order, want_argmax)
    else:
        loss, lse, predicted, accuracy = _LinearCrossEntropy.apply(e2, c, bias, targets, weight, config, want_order,
                                                                   want_argmax)
    return _cross_entropy_results(loss, lse, predicted, accuracy, targets, config, batch_shape, return_lse,
                                  return_token_accuracy, return_predicted_tokens)


def _cross_entropy_results(loss, lse, predicted, accuracy, targets, config, batch_shape, return_lse,
                           return_token_accuracy, return_predicted_tokens):
    """What linear_cross_entropy returns, from the flat results of its call, in the batch's shape."""
    if config.reduction == L.REDUCTIONS["none"]:
        loss = loss.view(batch_shape)
    lse = lse.view(batch_shape)
    if not (return_token_accuracy or return_predicted_tokens):
        return (loss, lse) if return_lse else loss
    predicted = predicted.view(batch_shape)
    if config.reduction == L.REDUCTIONS["none"]:  # per row, as Liger-Kernel: 1.0 where predicted right
        accuracy = ((predicted >= 0) & (predicted == _row_targets(targets, config).view(batch_shape))).to(loss.dtype)
    return CrossEntropyOutput(loss, lse if return_lse else None, accuracy if return_token_accuracy else None,
                              predicted if return_predicted_tokens else None)


def _row_targets(targets, config):
    """The target each flat row is scored against (targets shifted by config.shift; -1 past the end)."""
    if config.shift == 0:
        return targets
    rows = torch.full_like(targets, -1)
    rows[: max(targets.shape[0] - config.shift, 0)] = targets[config.shift:]
    return rows


def _flag(name, value):
    if not isinstance(value, bool):
        raise TypeError("argument '%s' must be True or False, got %r" % (name, value))
    return value


def _fused_step(fused_step, needs, reduction, per_row_outputs, auto_needs, fuses):
    """Whether linear_cross_entropy (or distillation_loss) runs the training step in one call;
    `needs`: which of its tensors need a gradient; per_row_outputs: the LSE, the accuracy or the
    predicted tokens are asked for; auto_needs: a gradient the auto choice takes the step for is
    needed (the cross-entropy: e's or c's, not bias's alone); fuses(): asks the library whether
    the step runs fused."""
    if fused_step is None:
        # Only where the library runs it fused: elsewhere it is the pair inside one call, with no
        # time saved, and gradients held from the forward (wasted if no backward runs). A graph
        # being traced takes the pair: the answer depends on the shapes, which may be symbolic
        # there, and a call into the library cannot be put in the graph.
        return auto_needs and reduction != "none" and not per_row_outputs and not _tracing() and fuses()
    if not isinstance(fused_step, bool):
        raise TypeError("argument 'fused_step' must be None, True or False, got %r" % (fused_step,))
    if fused_step and (reduction == "none" or per_row_outputs):
        raise ValueError("argument 'fused_step' is True, but the step in one call cannot give %s" % (
            "the LSE, the token accuracy or the predicted tokens (their gradient, or the argmax, is not kept)"
            if per_row_outputs else
            "per-row losses (reduction='none'): their upstream gradients are known only in the backward"))
    return fused_step and any(needs)


def _tracing():
    """Whether torch.compile is tracing this call (torch >= 2.3; torch.compile folds it to a constant)."""
    compiler = getattr(torch, "compiler", None)
    return compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling()


def _cross_entropy_arguments(e, c, targets, bias, ignore_index, softcap, reduction, shift, filter_eps, z_loss,
                             memory_budget=None, precision="exact", weight=None, label_smoothing=0.0):
    """Checks linear_cross_entropy's arguments; returns (e as (N, D), targets as (N), the
    CrossEntropyConfig, the batch shape, the class weights in the accumulator dtype or None)."""
    _check_tensor("e", e)
    if e.dim() < 1:
        raise ValueError("argument 'e' must have shape (..., D), got a 0-d tensor")
    _check_tensor("c", c, like=e, like_name="e", ndim=2)
    if c.shape[1] != e.shape[-1]:
        raise ValueError("argument 'c' has %d columns but 'e' has D = %d" % (c.shape[1], e.shape[-1]))
    _check_tensor("targets", targets, dtype=torch.int64)
    if targets.device != e.device:
        raise ValueError("argument 'targets' is on %s but 'e' is on %s" % (targets.device, e.device))
    if tuple(targets.shape) != tuple(e.shape[:-1]):
        raise ValueError("argument 'targets' has shape %s but 'e' has shape %s; targets must have shape e.shape[:-1]"
                         % (tuple(targets.shape), tuple(e.shape)))
    if bias is not None:
        _check_tensor("bias", bias, like=e, like_name="e", ndim=1)
        if bias.shape[0] != c.shape[0]:
            raise ValueError("argument 'bias' has %d entries but 'c' has V = %d rows" % (bias.shape[0], c.shape[0]))
    if weight is not None:
        if not isinstance(weight, torch.Tensor):
            raise TypeError("argument 'weight' must be a torch.Tensor or None, got %s" % type(weight).__name__)
        if not weight.is_floating_point():
            raise TypeError("argument 'weight' must have a floating-point dtype, got %s" % weight.dtype)
        if weight.device != e.device:
            raise ValueError("argument 'weight' is on %s but 'e' is on %s" % (weight.device, e.device))
        if tuple(weight.shape) != (c.shape[0],):
            raise ValueError("argument 'weight' has shape %s but 'c' has V = %d rows; weight must have shape (V,)"
                             % (tuple(weight.shape), c.shape[0]))
        weight = weight.detach().to(_calls.acc_dtype(e.dtype)).contiguous()  # V values: a copy only if needed
    if reduction not in L.REDUCTIONS:
        raise ValueError("argument 'reduction' must be 'mean', 'sum' or 'none', got %r" % (reduction,))
    if isinstance(shift, bool) or not isinstance(shift, int) or shift < 0:
        raise ValueError("argument 'shift' must be an int >= 0, got %r" % (shift,))
    if not isinstance(ignore_index, int):
        raise TypeError("argument 'ignore_index' must be an int, got %r" % (ignore_index,))
    label_smoothing = _number("label_smoothing", label_smoothing)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError("argument 'label_smoothing' must be in [0, 1], got %r" % (label_smoothing,))

    batch_shape = e.shape[:-1]
    if shift and targets.dim() > 1:
        # The C API shifts along the flattened rows; with several sequences the last `shift`
        # positions of each one are ignored instead (a copy of the targets only).
        shifted = torch.full_like(targets, ignore_index)
        shifted[..., : max(targets.shape[-1] - shift, 0)] = targets[..., shift:]
        targets, shift = shifted, 0
    config = CrossEntropyConfig(ignore_index, L.REDUCTIONS[reduction], shift,
                                0.0 if softcap is None else _number("softcap", softcap), _number("z_loss", z_loss),
                                _filter_eps(filter_eps), _memory_budget(memory_budget), _precision(precision),
                                label_smoothing)
    return e.reshape(-1, e.shape[-1]), targets.reshape(-1), config, batch_shape, weight


class _LinearCrossEntropy(torch.autograd.Function):
    """One device, or vocabulary-parallel when `comm` (a distributed._Communicator) is given:
    then c, bias and weight are this rank's shard, and the calls are the C API's *_distributed
    ones. The LSE output carries its gradient; predicted and accuracy none."""

    @staticmethod
    def forward(ctx, e, c, bias, targets, weight, config, want_order, want_argmax, comm=None):
        loss, lse, order, predicted, accuracy = _calls.cross_entropy_forward(e, c, bias, targets, weight, config,
                                                                             want_order, want_argmax, comm)
        ctx.save_for_backward(e, c, bias, targets, weight, lse, order)
        ctx.config, ctx.comm = config, comm
        ctx.mark_non_differentiable(predicted, accuracy)
        ctx.set_materialize_grads(False)
        return loss, lse, predicted, accuracy

    @staticmethod
    @once_differentiable  # the backward is not itself differentiable: double backward raises
    def backward(ctx, grad_loss, grad_lse, _grad_predicted, _grad_accuracy):
        e, c, bias, targets, weight, lse, order = ctx.saved_tensors
        if grad_loss is None and grad_lse is None:
            return (None,) * 9
        if grad_loss is None:  # only the LSE reaches the loss
            grad_loss = lse.new_zeros((e.shape[0],) if ctx.config.reduction == L.REDUCTIONS["none"] else ())
        de, dc, dbias = _calls.cross_entropy_backward(e, c, bias, targets, weight, lse, order, grad_loss, grad_lse,
                                                      ctx.config, ctx.needs_input_grad[:3], ctx.comm)
        return de, dc, dbias, None, None, None, None, None, None


class _LinearCrossEntropyStep(torch.autograd.Function):
    """The training step in one call: the forward computes the gradients (of the loss, for an
    upstream gradient of 1) with the loss and keeps them; the backward scales them."""

    @staticmethod
    def forward(ctx, e, c, bias, targets, weight, config, needs):
        loss, *grads = _calls.cross_entropy_with_gradients(e, c, bias, targets, weight, config, needs)
        ctx.save_for_backward(*grads)
        return loss

    @staticmethod
    @once_differentiable  # the gradients were computed in the forward: nothing to differentiate them with
    def backward(ctx, grad_loss):
        return (*_calls.times_upstream(grad_loss, ctx.saved_tensors), None, None, None, None)


class _ContrastiveLoss(torch.autograd.Function):
    """One device, or over the ranks of `comm` (a distributed._Communicator): then image and
    text are this rank's rows of the global batch, and the calls are the *_distributed ones."""

    @staticmethod
    def forward(ctx, image, text, scale, labels, symmetric, comm=None, memory_budget=0, precision=0):
        loss, row_lse, col_lse = _calls.contrastive_forward(image, text, scale, labels, symmetric, comm, memory_budget,
                                                            precision)
        ctx.save_for_backward(image, text, scale, labels, row_lse, col_lse)
        ctx.symmetric, ctx.comm, ctx.memory_budget, ctx.precision = symmetric, comm, memory_budget, precision
        return loss

    @staticmethod
    @once_differentiable  # the backward is not itself differentiable: double backward raises
    def backward(ctx, grad_loss):
        image, text, scale, labels, row_lse, col_lse = ctx.saved_tensors
        di, dt, dscale = _calls.contrastive_backward(image, text, scale, labels, row_lse, col_lse, grad_loss,
                                                     ctx.symmetric, ctx.needs_input_grad[:3], ctx.comm,
                                                     ctx.memory_budget, ctx.precision)
        if dscale is not None:
            dscale = dscale.to(device=scale.device, dtype=scale.dtype).reshape(scale.shape)
        return di, dt, dscale, None, None, None, None, None


def contrastive_loss(image, text, scale, labels=None, symmetric=True, memory_budget=None, precision="exact"):
    """CLIP contrastive (InfoNCE) loss of logits ``scale * image @ text.T`` without forming them.

    image, text: (b, c) features, same dtype and device, contiguous. scale: the logit scale
    (1 / temperature), a tensor of one element that receives its gradient (e.g.
    ``logit_scale.exp()``) or a float; its value is read on the host. labels: int64 (b) or None:
    the positive of image i is text labels[i] and of text j image labels[j] (default i <-> i).
    symmetric: average of image-to-text and text-to-image (CLIP); False: image-to-text only.
    memory_budget: bytes of workspace a call may use (None: the library's default, 256 MiB).
    precision: "exact" (default) or "tf32": for float32 features on GPUs with TF32 tensor cores,
    products of operands rounded to TF32 (11 significant bits), several times faster; no effect
    on the other dtypes or on the CPU.
    Returns a 0-d loss (float32, float64 for float64 inputs).
    """
    scale = _contrastive_arguments(image, text, scale, labels)
    budget, code = _memory_budget(memory_budget), _precision(precision)
    if CUSTOM_OPS:
        return torch.ops.tiledlse.contrastive_forward(image, text, scale, labels, symmetric, budget, code)[0]
    return _ContrastiveLoss.apply(image, text, scale, labels, symmetric, None, budget, code)


class _SelfContrastiveLoss(torch.autograd.Function):
    """The self-similarity form on one device (older torch; see CUSTOM_OPS)."""

    @staticmethod
    def forward(ctx, z, scale, memory_budget=0, precision=0):
        loss, lse = _calls.self_contrastive_forward(z, scale, memory_budget, precision)
        ctx.save_for_backward(z, scale, lse)
        ctx.memory_budget, ctx.precision = memory_budget, precision
        return loss

    @staticmethod
    @once_differentiable  # the backward is not itself differentiable: double backward raises
    def backward(ctx, grad_loss):
        z, scale, lse = ctx.saved_tensors
        dz, dscale = _calls.self_contrastive_backward(z, scale, lse, grad_loss, ctx.needs_input_grad[:2],
                                                      ctx.memory_budget, ctx.precision)
        if dscale is not None:
            dscale = dscale.to(device=scale.device, dtype=scale.dtype).reshape(scale.shape)
        return dz, dscale, None, None


def self_contrastive_loss(z, scale, memory_budget=None, precision="exact"):
    """Self-similarity contrastive loss (SimCLR's NT-Xent) of logits ``scale * z @ z.T`` without
    forming them.

    z: (n, c) features, n even: rows i and i + n/2 are two views of one sample (e.g.
    ``torch.cat([view_a, view_b])``), each the other's positive; a row's logit with itself is left
    out. The loss is the mean over the n rows of ``logsumexp_{j != i} x_ij - x_{i, (i + n/2) % n}``.
    scale: the logit scale (1 / temperature), as in contrastive_loss. memory_budget: bytes of
    workspace a call may use (None: the library's default, 256 MiB). precision: as in
    contrastive_loss. Returns a 0-d loss (float32, float64 for float64 inputs).
    """
    _check_tensor("z", z, ndim=2)
    if z.shape[0] % 2:
        raise ValueError("argument 'z' has %d rows; it holds two views of each sample (rows i and i + n/2), so the "
                         "row count must be even" % z.shape[0])
    scale = _scale_argument(scale)
    budget, code = _memory_budget(memory_budget), _precision(precision)
    if CUSTOM_OPS:
        return torch.ops.tiledlse.self_contrastive_forward(z, scale, budget, code)[0]
    return _SelfContrastiveLoss.apply(z, scale, budget, code)


def _contrastive_arguments(image, text, scale, labels):
    """Checks contrastive_loss's arguments but the scale's value (read where the call runs: see
    _calls.scale_value); returns the scale as a tensor."""
    _check_tensor("image", image, ndim=2)
    _check_tensor("text", text, like=image, like_name="image", ndim=2)
    if tuple(text.shape) != tuple(image.shape):
        raise ValueError("argument 'text' has shape %s but 'image' has shape %s; they must match"
                         % (tuple(text.shape), tuple(image.shape)))
    if labels is not None:
        _check_tensor("labels", labels, dtype=torch.int64, ndim=1)
        if labels.device != image.device:
            raise ValueError("argument 'labels' is on %s but 'image' is on %s" % (labels.device, image.device))
        if labels.shape[0] != image.shape[0]:
            raise ValueError("argument 'labels' has %d entries but the batch has %d"
                             % (labels.shape[0], image.shape[0]))
    return _scale_argument(scale)


def _scale_argument(scale):
    """The logit scale as a tensor (a float becomes a float64 one), checked but for its value."""
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1 or not scale.is_floating_point():
            raise ValueError("argument 'scale' must be a floating-point tensor of one element, got dtype %s shape %s"
                             % (scale.dtype, tuple(scale.shape)))
        return scale
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        return torch.tensor(float(scale), dtype=torch.float64)
    raise TypeError("argument 'scale' must be a tensor or a float, got %s" % type(scale).__name__)


def distillation_loss(student_hidden, student_weight, teacher_hidden, teacher_weight, targets=None, *,
                      divergence="forward_kl", beta=0.5, temperature=1.0, ignore_index=-100, shift=0, alpha=0.0,
                      reduction="mean", memory_budget=None, fused_step=None):
    """Distillation loss between a teacher's and a student's softmax over one vocabulary, from
    their hidden states and output layers, without forming either's logits.

    student_hidden: (..., D_s), student_weight: (V, D_s); teacher_hidden: (..., D_t) with the same
    leading shape, teacher_weight: (V, D_t) (D_t may differ from D_s, V may not). All four share
    one dtype (float32, float64, bfloat16, float16) and device (cpu or cuda), contiguous. Each
    row's logits are ``student_hidden @ student_weight.T / temperature`` and the same for the
    teacher; p_s, p_t their softmaxes. divergence: "forward_kl" KL(p_t || p_s) (the default;
    Liger-Kernel's and TRL's beta = 0), "reverse_kl" KL(p_s || p_t) (their beta = 1) or "jsd":
    beta KL(p_t || m) + (1 - beta) KL(p_s || m), m = beta p_t + (1 - beta) p_s, beta in [0, 1]
    (0 and 1 give the forward and the reverse KL, as Liger-Kernel and TRL special-case them).
    The divergence is not multiplied by temperature**2: multiply the loss for Hinton's scaling.
    alpha in [0, 1] mixes in the student's hard-label cross-entropy on its unscaled logits: each
    row's loss is ``alpha * CE + (1 - alpha) * divergence`` (Liger-Kernel's weight_hard_loss and
    weight_soft_loss). targets: int64 of shape student_hidden.shape[:-1] or None; position t is
    scored against targets[..., t + shift] (the last `shift` positions of each sequence are not
    scored), and a position whose target is ignore_index is not scored (loss 0, no gradient).
    Without targets every position is scored (then alpha must be 0 and shift 0). reduction:
    "mean" (over the scored positions; 0 when none is), "sum" or "none" (shape
    student_hidden.shape[:-1]). memory_budget: bytes of workspace a call may use (None: the
    library's default, 256 MiB).
    fused_step: compute the gradients in the forward, in one call with the loss, and keep them
    until the backward (the step runs fused, and faster, on Hopper GPUs with bfloat16 inputs and
    the forward or reverse KL where memory_budget allows: the teacher's logits of a part of the
    vocabulary are kept between the forward's sweep and the backward's). None (auto): when the step
    runs fused there (the library is asked), gradients of the student's or the teacher's tensors
    will be needed and the reduction is "mean" or "sum", outside torch.compile; True: whenever
    gradients will be needed; False: never (the forward, then the backward).

    Returns the loss (float32, float64 for float64 inputs). Gradients reach the student's two
    tensors, and the teacher's where they require grad (the teacher is frozen otherwise: call it
    under torch.no_grad(), or pass detached tensors).
    """
    hs, ws, ht, wt, targets, config, batch_shape = _distillation_arguments(
        student_hidden, student_weight, teacher_hidden, teacher_weight, targets, divergence, beta, temperature,
        ignore_index, shift, alpha, reduction, memory_budget)
    grad = torch.is_grad_enabled()
    needs = tuple(grad and t.requires_grad for t in (hs, ws, ht, wt))
    # The step gives a reduced loss: nothing to reshape.
    if _fused_step(fused_step, needs, reduction, False, any(needs),
                   lambda: _calls.distillation_step_fuses(hs, ws, ht, config, needs[2])):
        if CUSTOM_OPS:
            return torch.ops.tiledlse.distillation_with_gradients(hs, ws, ht, wt, targets, *config, *needs)[0]
        return _DistillationStep.apply(hs, ws, ht, wt, targets, config, needs)
    if CUSTOM_OPS:
        loss, _stats = torch.ops.tiledlse.distillation_forward(hs, ws, ht, wt, targets, *config)
    else:
        loss = _Distillation.apply(hs, ws, ht, wt, targets, config)
    return loss.view(batch_shape) if config.reduction == L.REDUCTIONS["none"] else loss


def _distillation_arguments(hs, ws, ht, wt, targets, divergence, beta, temperature, ignore_index, shift, alpha,
                            reduction, memory_budget):
    """Checks distillation_loss's arguments; returns (hs as (N, D_s), ws, ht as (N, D_t), wt,
    targets as (N) or None, the DistillationConfig, the batch shape)."""
    _check_tensor("student_hidden", hs)
    if hs.dim() < 1:
        raise ValueError("argument 'student_hidden' must have shape (..., D_s), got a 0-d tensor")
    _check_tensor("student_weight", ws, like=hs, like_name="student_hidden", ndim=2)
    if ws.shape[1] != hs.shape[-1]:
        raise ValueError("argument 'student_weight' has %d columns but 'student_hidden' has D_s = %d"
                         % (ws.shape[1], hs.shape[-1]))
    _check_tensor("teacher_hidden", ht, like=hs, like_name="student_hidden")
    if ht.dim() < 1 or tuple(ht.shape[:-1]) != tuple(hs.shape[:-1]):
        raise ValueError("argument 'teacher_hidden' has shape %s but 'student_hidden' has shape %s; they must agree "
                         "in all but the last dimension" % (tuple(ht.shape), tuple(hs.shape)))
    _check_tensor("teacher_weight", wt, like=hs, like_name="student_hidden", ndim=2)
    if wt.shape[1] != ht.shape[-1]:
        raise ValueError("argument 'teacher_weight' has %d columns but 'teacher_hidden' has D_t = %d"
                         % (wt.shape[1], ht.shape[-1]))
    if wt.shape[0] != ws.shape[0]:
        raise ValueError("argument 'teacher_weight' has V = %d rows but 'student_weight' has V = %d; the teacher and "
                         "the student must share one vocabulary" % (wt.shape[0], ws.shape[0]))
    if divergence not in L.DIVERGENCES:
        raise ValueError("argument 'divergence' must be 'forward_kl', 'reverse_kl' or 'jsd', got %r" % (divergence,))
    beta, temperature, alpha = _number("beta", beta), _number("temperature", temperature), _number("alpha", alpha)
    if not 0.0 <= beta <= 1.0:
        raise ValueError("argument 'beta' must be in [0, 1], got %r" % (beta,))
    if not (0.0 < temperature < float("inf")):
        raise ValueError("argument 'temperature' must be finite and > 0, got %r" % (temperature,))
    if not 0.0 <= alpha <= 1.0:
        raise ValueError("argument 'alpha' must be in [0, 1], got %r" % (alpha,))
    if reduction not in L.REDUCTIONS:
        raise ValueError("argument 'reduction' must be 'mean', 'sum' or 'none', got %r" % (reduction,))
    if isinstance(shift, bool) or not isinstance(shift, int) or shift < 0:
        raise ValueError("argument 'shift' must be an int >= 0, got %r" % (shift,))
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError("argument 'ignore_index' must be an int, got %r" % (ignore_index,))
    if targets is None:
        if alpha > 0:
            raise ValueError("argument 'alpha' is %r but no targets were given; the hard-label cross-entropy needs "
                             "them" % (alpha,))
        if shift:
            raise ValueError("argument 'shift' is %d but no targets were given; shift says which target scores "
                             "a position" % shift)
    else:
        _check_tensor("targets", targets, dtype=torch.int64)
        if targets.device != hs.device:
            raise ValueError("argument 'targets' is on %s but 'student_hidden' is on %s" % (targets.device, hs.device))
        if tuple(targets.shape) != tuple(hs.shape[:-1]):
            raise ValueError("argument 'targets' has shape %s but 'student_hidden' has shape %s; targets must have "
                             "shape student_hidden.shape[:-1]" % (tuple(targets.shape), tuple(hs.shape)))
        if shift and targets.dim() > 1:
            # As linear_cross_entropy: the C API shifts along the flattened rows, so with several
            # sequences the last `shift` positions of each are ignored here (a copy of the targets).
            shifted = torch.full_like(targets, ignore_index)
            shifted[..., : max(targets.shape[-1] - shift, 0)] = targets[..., shift:]
            targets, shift = shifted, 0
        targets = targets.reshape(-1)
    config = DistillationConfig(L.DIVERGENCES[divergence], beta, temperature, alpha, ignore_index, shift,
                                L.REDUCTIONS[reduction], _memory_budget(memory_budget))
    batch_shape = hs.shape[:-1]
    return (hs.reshape(-1, hs.shape[-1]), ws, ht.reshape(-1, ht.shape[-1]), wt, targets, config, batch_shape)


class _Distillation(torch.autograd.Function):
    """distillation_loss on older torch (see CUSTOM_OPS)."""

    @staticmethod
    def forward(ctx, hs, ws, ht, wt, targets, config):
        loss, stats = _calls.distillation_forward(hs, ws, ht, wt, targets, config)
        ctx.save_for_backward(hs, ws, ht, wt, targets, stats)
        ctx.config = config
        return loss

    @staticmethod
    @once_differentiable  # the backward is not itself differentiable: double backward raises
    def backward(ctx, grad_loss):
        hs, ws, ht, wt, targets, stats = ctx.saved_tensors
        grads = _calls.distillation_backward(hs, ws, ht, wt, targets, stats, grad_loss, ctx.config,
                                             ctx.needs_input_grad[:4])
        return (*grads, None, None)


class _DistillationStep(torch.autograd.Function):
    """distillation_loss's training step in one call on older torch (see CUSTOM_OPS): the forward
    computes the gradients (of the loss, for an upstream gradient of 1) with the loss and keeps
    them; the backward scales them."""

    @staticmethod
    def forward(ctx, hs, ws, ht, wt, targets, config, needs):
        loss, *grads = _calls.distillation_with_gradients(hs, ws, ht, wt, targets, config, needs)
        ctx.save_for_backward(*grads)
        return loss

    @staticmethod
    @once_differentiable  # the gradients were computed in the forward: nothing to differentiate them with
    def backward(ctx, grad_loss):
        return (*_calls.times_upstream(grad_loss, ctx.saved_tensors), None, None, None)
