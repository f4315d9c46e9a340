"""The training loss of a Hugging Face Transformers causal language model without its logits.

A `...ForCausalLM` model computes `logits = lm_head(hidden_states)` (batch x length x vocabulary,
upcast to float32 for the loss), optionally soft-capped, then the cross-entropy of each position
against the next token. causal_lm_loss runs the model's decoder only and gives its last hidden
states and `lm_head.weight` to tiledlse.linear_cross_entropy, with the same shift, ignore index,
soft cap and reduction: the same loss and gradients, and no logits in memory. Nothing here
imports transformers; the model is used through its public attributes (docs/python.md).
"""
from ._functions import linear_cross_entropy

# Config attributes by which some architectures scale their logits before the loss; the loss here
# does not apply them, so such a model is refused instead of trained on a different loss.
_UNSUPPORTED_LOGIT_SCALES = ("logit_scale", "logits_scaling")


def causal_lm_loss(model, input_ids=None, labels=None, attention_mask=None, num_items_in_batch=None,
                   shift_labels=None, ignore_index=-100, **model_kwargs):
    """The loss that `model(input_ids, attention_mask=..., labels=labels).loss` returns, for a
    Transformers causal LM (`LlamaForCausalLM`, `Gemma2ForCausalLM`, ...), computed from the
    decoder's last hidden states and `lm_head.weight` without the logits.

    labels: (batch, length) int64, usually the input ids with ignore_index (-100) at padding;
    position t is scored against labels[:, t + 1] (the model's shift). shift_labels: labels
    already shifted (Transformers' argument of that name), used as they are instead. The model's
    `config.final_logit_softcapping`, if set, is applied. num_items_in_batch: as Transformers'
    Trainer passes it under gradient accumulation, the loss is then the sum divided by it, else
    the mean over the positions not ignored. Other keyword arguments (position_ids,
    inputs_embeds, ...) go to the decoder. Returns a float32 0-d loss.
    """
    config = model.config
    for name in _UNSUPPORTED_LOGIT_SCALES:
        if getattr(config, name, None) not in (None, 1, 1.0):
            raise ValueError("tiledlse.causal_lm_loss: %s scales its logits (config.%s = %r), which this loss "
                             "does not do" % (type(model).__name__, name, getattr(config, name)))
    if (labels is None) == (shift_labels is None):
        raise ValueError("tiledlse.causal_lm_loss: pass exactly one of 'labels' and 'shift_labels'")
    head = model.get_output_embeddings()
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask, **model_kwargs).last_hidden_state
    targets, shift = (labels, 1) if shift_labels is None else (shift_labels, 0)
    reduction = "mean" if num_items_in_batch is None else "sum"
    loss = linear_cross_entropy(hidden.contiguous(), head.weight, targets.to(hidden.device), bias=head.bias,
                                ignore_index=ignore_index, softcap=getattr(config, "final_logit_softcapping", None),
                                reduction=reduction, shift=shift)
    if num_items_in_batch is not None:
        loss = loss / num_items_in_batch
    return loss
