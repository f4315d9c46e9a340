"""The losses as torch.library custom ops (torch >= 2.4), so that torch.compile traces them into
its graph (fullgraph=True works) instead of breaking the graph at a ctypes call.

Ten ops, each an opaque call into the C library: tiledlse::cross_entropy_forward and
tiledlse::cross_entropy_backward, tiledlse::cross_entropy_with_gradients (the training step in
one call), tiledlse::contrastive_forward and tiledlse::contrastive_backward,
tiledlse::self_contrastive_forward and tiledlse::self_contrastive_backward,
tiledlse::distillation_forward and tiledlse::distillation_backward,
tiledlse::distillation_with_gradients (the distillation's step in one call). Each has a fake
implementation (output shapes and dtypes only, for FakeTensor tracing and dynamic shapes), and
each forward op has its autograd formula, which calls the backward op (the steps' scale the
gradients they kept): the backward is traced too. The backward ops have no formula of their own,
and the steps' are once differentiable: double backward is not supported (as with the
autograd.Function path of older torch). Options are plain numbers.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import _calls
from . import _library as L

_NONE = L.REDUCTIONS["none"]


def _config(ignore_index, reduction, shift, softcap, z_loss, filter_eps, memory_budget, precision, label_smoothing):
    return _calls.CrossEntropyConfig(ignore_index, reduction, shift, softcap, z_loss, filter_eps, memory_budget,
                                     precision, label_smoothing)


@torch.library.custom_op("tiledlse::cross_entropy_forward", mutates_args=())
def cross_entropy_forward(e: Tensor, c: Tensor, bias: Optional[Tensor], targets: Tensor, weight: Optional[Tensor],
                          ignore_index: int, reduction: int, shift: int, softcap: float, z_loss: float,
                          filter_eps: float, memory_budget: int, precision: int, label_smoothing: float,
                          want_order: bool, want_argmax: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(loss, lse, vocabulary order, predicted, accuracy) of e (N, D) against c (V, D); see
    _calls.cross_entropy_forward."""
    config = _config(ignore_index, reduction, shift, softcap, z_loss, filter_eps, memory_budget, precision,
                     label_smoothing)
    return _calls.cross_entropy_forward(e, c, bias, targets, weight, config, want_order, want_argmax)


@cross_entropy_forward.register_fake
def _(e, c, bias, targets, weight, ignore_index, reduction, shift, softcap, z_loss, filter_eps, memory_budget,
      precision, label_smoothing, want_order, want_argmax):
    acc = _calls.acc_dtype(e.dtype)
    n, v = e.shape[0], c.shape[0]
    loss = e.new_empty((n,) if reduction == _NONE else (), dtype=acc)
    return (loss, e.new_empty((n,), dtype=acc), e.new_empty((v if want_order else 0,), dtype=torch.int32),
            e.new_empty((n if want_argmax else 0,), dtype=torch.int64),
            e.new_empty(() if want_argmax else (0,), dtype=acc))


@torch.library.custom_op("tiledlse::cross_entropy_backward", mutates_args=())
def cross_entropy_backward(e: Tensor, c: Tensor, bias: Optional[Tensor], targets: Tensor, weight: Optional[Tensor],
                           lse: Tensor, order: Tensor, dloss: Tensor, dlse: Optional[Tensor], ignore_index: int,
                           reduction: int, shift: int, softcap: float, z_loss: float, filter_eps: float,
                           memory_budget: int, precision: int, label_smoothing: float, need_e: bool, need_c: bool,
                           need_bias: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """(dE, dC, dbias) for the upstream gradients of the loss and (dlse, or None) of the LSE; a
    gradient not asked for (or dbias without bias) is an empty tensor."""
    config = _config(ignore_index, reduction, shift, softcap, z_loss, filter_eps, memory_budget, precision,
                     label_smoothing)
    grads = _calls.cross_entropy_backward(e, c, bias, targets, weight, lse, order, dloss, dlse, config,
                                          (need_e, need_c, need_bias))
    return _present(e, grads)


def _present(e, grads):
    """The gradients with an empty tensor for each one not computed (an op returns tensors)."""
    return tuple(g if g is not None else e.new_empty((0,)) for g in grads)


def _input_gradients(ctx, *grads):
    """One entry per input of the op, as autograd takes them: the given gradients of the leading
    inputs where autograd asked for them, None for every other input."""
    need = ctx.needs_input_grad
    return tuple(g if wanted else None for g, wanted in zip(grads, need)) + (None,) * (len(need) - len(grads))


def _fake_gradients(e, c, bias, need_e, need_c, need_bias):
    return (torch.empty_like(e) if need_e else e.new_empty((0,)),
            torch.empty_like(c) if need_c else e.new_empty((0,)),
            torch.empty_like(bias) if bias is not None and need_bias else e.new_empty((0,)))


@cross_entropy_backward.register_fake
def _(e, c, bias, targets, weight, lse, order, dloss, dlse, ignore_index, reduction, shift, softcap, z_loss,
      filter_eps, memory_budget, precision, label_smoothing, need_e, need_c, need_bias):
    return _fake_gradients(e, c, bias, need_e, need_c, need_bias)


def _cross_entropy_setup(ctx, inputs, output):
    e, c, bias, targets, weight, *options, _want_order, _want_argmax = inputs
    loss, lse, order, _predicted, _accuracy = output
    ctx.save_for_backward(e, c, bias, targets, weight, lse, order)
    ctx.options, ctx.loss_shape = options, loss.shape
    # Either output may be left out of the loss (the LSE usually is): no zeros are made for it.
    ctx.set_materialize_grads(False)


def _cross_entropy_gradient(ctx, grad_loss, grad_lse, _grad_order, _grad_predicted, _grad_accuracy):
    e, c, bias, targets, weight, lse, order = ctx.saved_tensors
    if grad_loss is None and grad_lse is None:
        return _input_gradients(ctx)
    if grad_loss is None:  # only the LSE reaches the loss
        grad_loss = lse.new_zeros(ctx.loss_shape)
    need = ctx.needs_input_grad
    de, dc, dbias = torch.ops.tiledlse.cross_entropy_backward(
        e, c, bias, targets, weight, lse, order, grad_loss, grad_lse, *ctx.options, need[0], need[1],
        bias is not None and need[2])
    return _input_gradients(ctx, de, dc, dbias)


cross_entropy_forward.register_autograd(_cross_entropy_gradient, setup_context=_cross_entropy_setup)


@torch.library.custom_op("tiledlse::cross_entropy_with_gradients", mutates_args=())
def cross_entropy_with_gradients(e: Tensor, c: Tensor, bias: Optional[Tensor], targets: Tensor,
                                 weight: Optional[Tensor], ignore_index: int, reduction: int, shift: int,
                                 softcap: float, z_loss: float, filter_eps: float, memory_budget: int, precision: int,
                                 label_smoothing: float, need_e: bool, need_c: bool,
                                 need_bias: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(loss, dE, dC, dbias), the gradients those of the loss's sum, each not asked for empty;
    see _calls.cross_entropy_with_gradients."""
    config = _config(ignore_index, reduction, shift, softcap, z_loss, filter_eps, memory_budget, precision,
                     label_smoothing)
    loss, *grads = _calls.cross_entropy_with_gradients(e, c, bias, targets, weight, config,
                                                       (need_e, need_c, need_bias))
    return (loss, *_present(e, grads))


@cross_entropy_with_gradients.register_fake
def _(e, c, bias, targets, weight, ignore_index, reduction, shift, softcap, z_loss, filter_eps, memory_budget,
      precision, label_smoothing, need_e, need_c, need_bias):
    loss = e.new_empty((e.shape[0],) if reduction == _NONE else (), dtype=_calls.acc_dtype(e.dtype))
    return (loss, *_fake_gradients(e, c, bias, need_e, need_c, need_bias))


def _keep_step_gradients(ctx, output, computed):
    """A step op's setup: keeps the gradients it returned after the loss for the backward;
    `computed` says which of them are (the others are empty)."""
    _loss, *grads = output
    ctx.save_for_backward(*grads)
    ctx.computed = computed
    # The gradients are outputs only to reach the backward; nothing flows into them. Left to
    # materialize, autograd would fill a zero tensor the size of each for the backward: a pass of
    # dC's size per step and that memory (docs/notes/2026-11-29.md).
    ctx.set_materialize_grads(False)


def _step_setup(ctx, inputs, output):
    *_, need_e, need_c, need_bias = inputs
    _keep_step_gradients(ctx, output, (need_e, need_c, inputs[2] is not None and need_bias))


@once_differentiable  # the gradients were computed in the forward: nothing to differentiate them with
def _step_gradient(ctx, grad_loss, *_grad_kept):
    """The backward of a step op (either loss's): the kept gradients of the leading inputs times the
    loss's upstream gradient."""
    if grad_loss is None:  # not materialized: no gradient reached the loss
        return _input_gradients(ctx)
    # Outputs of the op, they would lead a double backward back into it (to a silent 0): detached,
    # it fails instead, as the forward and backward pair does.
    kept = [g.detach() if computed else None for g, computed in zip(ctx.saved_tensors, ctx.computed)]
    return _input_gradients(ctx, *_calls.times_upstream(grad_loss, kept))


cross_entropy_with_gradients.register_autograd(_step_gradient, setup_context=_step_setup)


@torch.library.custom_op("tiledlse::contrastive_forward", mutates_args=())
def contrastive_forward(image: Tensor, text: Tensor, scale: Tensor, labels: Optional[Tensor], symmetric: bool,
                        memory_budget: int, precision: int) -> Tuple[Tensor, Tensor, Tensor]:
    """(loss, row LSE, column LSE; empty when not symmetric). The scale's value is read here, on
    the host, so that tracing never needs it."""
    return _calls.contrastive_forward(image, text, scale, labels, symmetric, memory_budget=memory_budget,
                                      precision=precision)


@contrastive_forward.register_fake
def _(image, text, scale, labels, symmetric, memory_budget, precision):
    acc = _calls.acc_dtype(image.dtype)
    b = image.shape[0]
    return (image.new_empty((), dtype=acc), image.new_empty((b,), dtype=acc),
            image.new_empty((b if symmetric else 0,), dtype=acc))


@torch.library.custom_op("tiledlse::contrastive_backward", mutates_args=())
def contrastive_backward(image: Tensor, text: Tensor, scale: Tensor, labels: Optional[Tensor], row_lse: Tensor,
                         col_lse: Tensor, dloss: Tensor, symmetric: bool, memory_budget: int, precision: int,
                         need_image: bool, need_text: bool, need_scale: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """(dI, dT, dscale as a 0-d tensor of the accumulator type); one not asked for is empty."""
    grads = _calls.contrastive_backward(image, text, scale, labels, row_lse, col_lse, dloss, symmetric,
                                        (need_image, need_text, need_scale), memory_budget=memory_budget,
                                        precision=precision)
    return _present(image, grads)


@contrastive_backward.register_fake
def _(image, text, scale, labels, row_lse, col_lse, dloss, symmetric, memory_budget, precision, need_image,
      need_text, need_scale):
    return (torch.empty_like(image) if need_image else image.new_empty((0,)),
            torch.empty_like(text) if need_text else image.new_empty((0,)),
            row_lse.new_empty(()) if need_scale else image.new_empty((0,)))


def _contrastive_setup(ctx, inputs, output):
    image, text, scale, labels, symmetric, memory_budget, precision = inputs
    _loss, row_lse, col_lse = output
    ctx.save_for_backward(image, text, scale, labels, row_lse, col_lse)
    ctx.symmetric, ctx.memory_budget, ctx.precision = symmetric, memory_budget, precision


def _contrastive_gradient(ctx, grad_loss, _grad_row_lse, _grad_col_lse):
    image, text, scale, labels, row_lse, col_lse = ctx.saved_tensors
    need = ctx.needs_input_grad
    di, dt, dscale = torch.ops.tiledlse.contrastive_backward(image, text, scale, labels, row_lse, col_lse, grad_loss,
                                                             ctx.symmetric, ctx.memory_budget, ctx.precision,
                                                             need[0], need[1], need[2])
    # dscale comes back in the accumulator type on image's device: give it the scale's own.
    dscale = dscale.to(device=scale.device, dtype=scale.dtype).reshape(scale.shape) if need[2] else None
    return _input_gradients(ctx, di, dt, dscale)


contrastive_forward.register_autograd(_contrastive_gradient, setup_context=_contrastive_setup)


@torch.library.custom_op("tiledlse::self_contrastive_forward", mutates_args=())
def self_contrastive_forward(z: Tensor, scale: Tensor, memory_budget: int, precision: int) -> Tuple[Tensor, Tensor]:
    """(loss, LSE per row) of the self-similarity form; the scale's value is read here."""
    return _calls.self_contrastive_forward(z, scale, memory_budget, precision)


@self_contrastive_forward.register_fake
def _(z, scale, memory_budget, precision):
    acc = _calls.acc_dtype(z.dtype)
    return z.new_empty((), dtype=acc), z.new_empty((z.shape[0],), dtype=acc)


@torch.library.custom_op("tiledlse::self_contrastive_backward", mutates_args=())
def self_contrastive_backward(z: Tensor, scale: Tensor, lse: Tensor, dloss: Tensor, memory_budget: int,
                              precision: int, need_z: bool, need_scale: bool) -> Tuple[Tensor, Tensor]:
    """(dZ, dscale as a 0-d tensor of the accumulator type); one not asked for is empty."""
    grads = _calls.self_contrastive_backward(z, scale, lse, dloss, (need_z, need_scale), memory_budget, precision)
    return _present(z, grads)


@self_contrastive_backward.register_fake
def _(z, scale, lse, dloss, memory_budget, precision, need_z, need_scale):
    return (torch.empty_like(z) if need_z else z.new_empty((0,)),
            lse.new_empty(()) if need_scale else z.new_empty((0,)))


def _self_contrastive_setup(ctx, inputs, output):
    z, scale, memory_budget, precision = inputs
    ctx.save_for_backward(z, scale, output[1])
    ctx.memory_budget, ctx.precision = memory_budget, precision


def _self_contrastive_gradient(ctx, grad_loss, _grad_lse):
    z, scale, lse = ctx.saved_tensors
    need = ctx.needs_input_grad
    dz, dscale = torch.ops.tiledlse.self_contrastive_backward(z, scale, lse, grad_loss, ctx.memory_budget,
                                                              ctx.precision, need[0], need[1])
    dscale = dscale.to(device=scale.device, dtype=scale.dtype).reshape(scale.shape) if need[1] else None
    return _input_gradients(ctx, dz, dscale)


self_contrastive_forward.register_autograd(_self_contrastive_gradient, setup_context=_self_contrastive_setup)


@torch.library.custom_op("tiledlse::distillation_forward", mutates_args=())
def distillation_forward(hs: Tensor, ws: Tensor, ht: Tensor, wt: Tensor, targets: Optional[Tensor], divergence: int,
                         beta: float, temperature: float, alpha: float, ignore_index: int, shift: int, reduction: int,
                         memory_budget: int) -> Tuple[Tensor, Tensor]:
    """(loss, row statistics for the backward) of the student hs (N, D_s), ws (V, D_s) against the
    teacher ht (N, D_t), wt (V, D_t); see _calls.distillation_forward."""
    config = _calls.DistillationConfig(divergence, beta, temperature, alpha, ignore_index, shift, reduction,
                                       memory_budget)
    return _calls.distillation_forward(hs, ws, ht, wt, targets, config)


@distillation_forward.register_fake
def _(hs, ws, ht, wt, targets, divergence, beta, temperature, alpha, ignore_index, shift, reduction, memory_budget):
    acc = _calls.acc_dtype(hs.dtype)
    n = hs.shape[0]
    return (hs.new_empty((n,) if reduction == _NONE else (), dtype=acc),
            hs.new_empty((n, L.DISTILLATION_ROW_STATS), dtype=acc))


@torch.library.custom_op("tiledlse::distillation_backward", mutates_args=())
def distillation_backward(hs: Tensor, ws: Tensor, ht: Tensor, wt: Tensor, targets: Optional[Tensor], stats: Tensor,
                          dloss: Tensor, divergence: int, beta: float, temperature: float, alpha: float,
                          ignore_index: int, shift: int, reduction: int, memory_budget: int, need_hs: bool,
                          need_ws: bool, need_ht: bool, need_wt: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dHs, dWs, dHt, dWt); a gradient not asked for is an empty tensor."""
    config = _calls.DistillationConfig(divergence, beta, temperature, alpha, ignore_index, shift, reduction,
                                       memory_budget)
    grads = _calls.distillation_backward(hs, ws, ht, wt, targets, stats, dloss, config,
                                         (need_hs, need_ws, need_ht, need_wt))
    return _present(hs, grads)


def _fake_distillation_gradients(hs, ws, ht, wt, need_hs, need_ws, need_ht, need_wt):
    return tuple(torch.empty_like(t) if need else hs.new_empty((0,))
                 for t, need in zip((hs, ws, ht, wt), (need_hs, need_ws, need_ht, need_wt)))


@distillation_backward.register_fake
def _(hs, ws, ht, wt, targets, stats, dloss, divergence, beta, temperature, alpha, ignore_index, shift, reduction,
      memory_budget, need_hs, need_ws, need_ht, need_wt):
    return _fake_distillation_gradients(hs, ws, ht, wt, need_hs, need_ws, need_ht, need_wt)


def _distillation_setup(ctx, inputs, output):
    hs, ws, ht, wt, targets, *options = inputs
    ctx.save_for_backward(hs, ws, ht, wt, targets, output[1])
    ctx.options = options
    ctx.set_materialize_grads(False)  # the row statistics get no gradient: no zeros made for them


def _distillation_gradient(ctx, grad_loss, _grad_stats):
    if grad_loss is None:  # not materialized: no gradient reached the loss
        return _input_gradients(ctx)
    hs, ws, ht, wt, targets, stats = ctx.saved_tensors
    need = ctx.needs_input_grad
    grads = torch.ops.tiledlse.distillation_backward(hs, ws, ht, wt, targets, stats, grad_loss, *ctx.options,
                                                     need[0], need[1], need[2], need[3])
    return _input_gradients(ctx, *grads)


distillation_forward.register_autograd(_distillation_gradient, setup_context=_distillation_setup)


@torch.library.custom_op("tiledlse::distillation_with_gradients", mutates_args=())
def distillation_with_gradients(hs: Tensor, ws: Tensor, ht: Tensor, wt: Tensor, targets: Optional[Tensor],
                                divergence: int, beta: float, temperature: float, alpha: float, ignore_index: int,
                                shift: int, reduction: int, memory_budget: int, need_hs: bool, need_ws: bool,
                                need_ht: bool, need_wt: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(loss, dHs, dWs, dHt, dWt), the gradients those of the loss's sum, each not asked for empty;
    see _calls.distillation_with_gradients."""
    config = _calls.DistillationConfig(divergence, beta, temperature, alpha, ignore_index, shift, reduction,
                                       memory_budget)
    loss, *grads = _calls.distillation_with_gradients(hs, ws, ht, wt, targets, config,
                                                      (need_hs, need_ws, need_ht, need_wt))
    return (loss, *_present(hs, grads))


@distillation_with_gradients.register_fake
def _(hs, ws, ht, wt, targets, divergence, beta, temperature, alpha, ignore_index, shift, reduction, memory_budget,
      need_hs, need_ws, need_ht, need_wt):
    loss = hs.new_empty((hs.shape[0],) if reduction == _NONE else (), dtype=_calls.acc_dtype(hs.dtype))
    return (loss, *_fake_distillation_gradients(hs, ws, ht, wt, need_hs, need_ws, need_ht, need_wt))


def _distillation_step_setup(ctx, inputs, output):
    _keep_step_gradients(ctx, output, tuple(inputs[-4:]))


distillation_with_gradients.register_autograd(_step_gradient, setup_context=_distillation_step_setup)
