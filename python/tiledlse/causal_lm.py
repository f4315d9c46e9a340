"""The training loss of a Hugging Face Transformers causal language model without its logits.

A `...ForCausalLM` model computes `logits = lm_head(hidden_states)` (batch x length x vocabulary,
upcast to float32 for the loss), optionally soft-capped, then the cross-entropy of each position
against the next token. causal_lm_loss runs the model's decoder only and gives its last hidden
states and `lm_head.weight` to tiledlse.linear_cross_entropy, with the same shift, ignore index,
soft cap and reduction: the same loss and gradients, and no logits in memory. Nothing here
imports transformers at import time; the model is used through its public attributes
(docs/python.md). tiledlse.transformers.apply builds on the same two helpers below.
causal_lm_distillation_loss does the same for distillation: a teacher's and a student's decoders,
their heads' weights and tiledlse.distillation_loss, without either model's logits.
"""
import torch

from ._functions import distillation_loss, linear_cross_entropy

# Config attributes by which some architectures scale their logits before the loss (Cohere's
# logit_scale, Granite's and MiniCPM3's logits_scaling, Falcon-H1's lm_head_multiplier, ...); the
# loss here does not apply them, so such a model is refused instead of trained on a different loss.
_UNSUPPORTED_LOGIT_SCALES = ("logit_scale", "logits_scaling", "lm_head_multiplier", "output_multiplier",
                             "output_logit_soft_cap")


def check_supported(model, caller):
    """Raises ValueError, naming the attribute, when the loss computed here would not be the
    model's own: scaled logits, a mixture-of-experts router loss added to it, a loss other than
    Transformers' causal-LM cross-entropy, or no separate decoder and linear head."""
    name, config = type(model).__name__, model.config
    _check_logits(model, caller)
    if getattr(config, "output_router_logits", False):
        raise ValueError("%s: %s adds its router's auxiliary loss to the loss (config.output_router_logits = True), "
                         "which this loss does not do" % (caller, name))
    # Transformers >= 4.46 picks the loss by model.loss_type, or takes one set on the model.
    loss_function = getattr(model, "loss_function", None)
    if loss_function is not None:
        from transformers.loss.loss_utils import LOSS_MAPPING
        if loss_function is not LOSS_MAPPING.get("ForCausalLM"):
            raise ValueError("%s: %s computes its loss with %r (model.loss_function), not the causal-LM "
                             "cross-entropy" % (caller, name, getattr(loss_function, "__name__", loss_function)))


def _check_logits(model, caller):
    """Raises ValueError, naming the attribute, when the model's logits are not its decoder's last
    hidden states times `get_output_embeddings().weight`: scaled logits, or no separate decoder
    and linear head."""
    name, config = type(model).__name__, model.config
    for attr in _UNSUPPORTED_LOGIT_SCALES:
        if getattr(config, attr, None) not in (None, 1, 1.0):
            raise ValueError("%s: %s scales its logits (config.%s = %r), which this loss does not do"
                             % (caller, name, attr, getattr(config, attr)))
    head = model.get_output_embeddings()
    if getattr(head, "weight", None) is None or head.weight.dim() != 2:
        raise ValueError("%s: %s has no linear output layer (model.get_output_embeddings() is %r)"
                         % (caller, name, type(head).__name__))
    if model.base_model is model:
        raise ValueError("%s: %s has no decoder apart from its head (model.base_model is the model itself)"
                         % (caller, name))


def _autocast_dtype(device_type):
    """The dtype autocast gives a linear layer on this device now, or None outside autocast."""
    try:
        enabled = torch.is_autocast_enabled(device_type)
        return torch.get_autocast_dtype(device_type) if enabled else None
    except (TypeError, AttributeError):  # torch < 2.4: no device argument
        if device_type == "cuda" and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
        if device_type == "cpu" and torch.is_autocast_cpu_enabled():
            return torch.get_autocast_cpu_dtype()
        return None


def hidden_states_loss(model, hidden, targets, shift, num_items_in_batch=None, ignore_index=-100, **options):
    """The model's loss from its decoder's last hidden states (batch, length, D): position t
    scored against targets[:, t + shift], soft-capped as the model's config says, the mean over
    the targets not ignored, or their sum divided by num_items_in_batch. options: more arguments
    of linear_cross_entropy (filter_eps, memory_budget, ...)."""
    head = model.get_output_embeddings()
    weight, bias = head.weight, head.bias
    # Under autocast (Trainer's bf16=True with float32 weights) the model's lm_head runs in the
    # autocast dtype; do the same, which also gives the two operands the one dtype the loss needs.
    dtype = _autocast_dtype(hidden.device.type)
    if dtype is not None:
        hidden, weight = hidden.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    reduction = "mean" if num_items_in_batch is None else "sum"
    # The model takes any labels; the library takes contiguous ones (copying only these indices).
    targets = targets.to(hidden.device).contiguous()
    loss = linear_cross_entropy(hidden.contiguous(), weight, targets, bias=bias,
                                ignore_index=ignore_index, softcap=getattr(model.config, "final_logit_softcapping", None),
                                reduction=reduction, shift=shift, **options)
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


def causal_lm_loss(model, input_ids=None, labels=None, attention_mask=None, num_items_in_batch=None,
                   shift_labels=None, ignore_index=-100, filter_eps=None, **model_kwargs):
    """The loss that `model(input_ids, attention_mask=..., labels=labels).loss` returns, for a
    Transformers causal LM (`LlamaForCausalLM`, `Gemma2ForCausalLM`, ...), computed from the
    decoder's last hidden states and `lm_head.weight` without the logits.

    labels: (batch, length) int64, usually the input ids with ignore_index (-100) at padding;
    position t is scored against labels[:, t + 1] (the model's shift). shift_labels: labels
    already shifted (Transformers' argument of that name), used as they are instead. The model's
    `config.final_logit_softcapping`, if set, is applied. num_items_in_batch: as Transformers'
    Trainer passes it under gradient accumulation, the loss is then the sum divided by it, else
    the mean over the positions not ignored. Other keyword arguments (position_ids,
    inputs_embeds, ...) go to the decoder. filter_eps: linear_cross_entropy's gradient filter,
    off by default (exact gradients, as the model's own loss; "auto" drops whole tiles of small
    probabilities, which near initialization, a softmax spread over the vocabulary, is most of
    the gradient). Returns a float32 0-d loss. Models whose loss this is not (scaled logits, a
    router loss; see check_supported) raise ValueError.
    """
    check_supported(model, "tiledlse.causal_lm_loss")
    if (labels is None) == (shift_labels is None):
        raise ValueError("tiledlse.causal_lm_loss: pass exactly one of 'labels' and 'shift_labels'")
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask, **model_kwargs).last_hidden_state
    targets, shift = (labels, 1) if shift_labels is None else (shift_labels, 0)
    return hidden_states_loss(model, hidden, targets, shift, num_items_in_batch, ignore_index, filter_eps=filter_eps)


def _distillation_head(model, caller):
    """The weight of the model's output layer, checked to be all its logits are made of (a linear
    layer without bias or soft cap; see _check_logits)."""
    _check_logits(model, caller)
    name, config = type(model).__name__, model.config
    if getattr(config, "final_logit_softcapping", None):
        raise ValueError("%s: %s soft-caps its logits (config.final_logit_softcapping = %r), which the distillation "
                         "loss does not do" % (caller, name, config.final_logit_softcapping))
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError("%s: %s's output layer has a bias, which the distillation loss does not take"
                         % (caller, name))
    return head.weight


def causal_lm_distillation_loss(student_model, teacher_model, input_ids=None, labels=None, attention_mask=None,
                                shift_labels=None, divergence="forward_kl", beta=0.5, temperature=1.0, alpha=0.0,
                                ignore_index=-100, num_items_in_batch=None, teacher_grad=False, memory_budget=None,
                                fused_step=None, **model_kwargs):
    """Knowledge distillation of a Transformers causal LM (the student) from another (the
    teacher) over the same vocabulary: tiledlse.distillation_loss of the two models' last hidden
    states and `lm_head` weights, without either's logits.

    Both models' decoders (`model.base_model`) run on input_ids with attention_mask (and the other
    keyword arguments: position_ids, ...); the teacher's under torch.no_grad() unless
    teacher_grad=True (then its parameters get gradients too). Position t's distributions (the
    prediction of token t + 1) are compared where labels[:, t + 1] is not ignore_index, the
    model's own shift; shift_labels: labels already shifted, used as they are. labels=None (and
    no shift_labels): every position whose next token is not padding (attention_mask 0) is
    scored. divergence, beta, temperature, alpha, memory_budget, fused_step: as distillation_loss (alpha > 0
    adds the student's cross-entropy against the labels, its causal_lm_loss). num_items_in_batch:
    as Trainer passes it, the loss is the sum divided by it, else the mean over the scored
    positions. The student's dtype (or autocast's, inside autocast) is the loss's: a teacher in
    another dtype has its hidden states and head weight cast to it (a copy of the head per call).
    Returns a 0-d loss (float32, float64 for float64 models). Models whose logits are scaled or
    soft-capped, or whose head has a bias, raise ValueError.
    """
    caller = "tiledlse.causal_lm_distillation_loss"
    ws, wt = _distillation_head(student_model, caller), _distillation_head(teacher_model, caller)
    if labels is not None and shift_labels is not None:
        raise ValueError("%s: pass at most one of 'labels' and 'shift_labels'" % caller)
    if labels is None and shift_labels is None:
        if input_ids is None:
            raise ValueError("%s: without input_ids, pass 'labels' or 'shift_labels'" % caller)
        labels = input_ids if attention_mask is None else input_ids.masked_fill(attention_mask == 0, ignore_index)
    targets, shift = (labels, 1) if shift_labels is None else (shift_labels, 0)
    hs = student_model.base_model(input_ids=input_ids, attention_mask=attention_mask,
                                  **model_kwargs).last_hidden_state
    with torch.set_grad_enabled(teacher_grad and torch.is_grad_enabled()):
        ht = teacher_model.base_model(input_ids=input_ids, attention_mask=attention_mask,
                                      **model_kwargs).last_hidden_state
    if not teacher_grad:
        wt = wt.detach()
    # As hidden_states_loss: the autocast dtype where autocast runs, else the student's; the four
    # operands share one dtype.
    dtype = _autocast_dtype(hs.device.type) or hs.dtype
    hs, ws, ht, wt = (t.to(dtype) for t in (hs, ws, ht, wt))
    reduction = "mean" if num_items_in_batch is None else "sum"
    loss = distillation_loss(hs.contiguous(), ws, ht.to(hs.device).contiguous(), wt.to(hs.device),
                             targets.to(hs.device).contiguous(), divergence=divergence, beta=beta,
                             temperature=temperature, ignore_index=ignore_index, shift=shift, alpha=alpha,
                             reduction=reduction, memory_budget=memory_budget, fused_step=fused_step)
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss
