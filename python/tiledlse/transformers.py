"""Hugging Face Trainer without code changes: a causal LM whose forward computes its loss with
TiledLSE.

`transformers.Trainer`, and the libraries built on it, call `model(input_ids, labels=...,
num_items_in_batch=...)` and read `.loss`. `apply(model)` patches that one model instance (not its
class) so that such a call runs the decoder (`model.base_model`) as the model does, then computes
the loss from its last hidden states and `lm_head.weight` with tiledlse.linear_cross_entropy
(causal_lm.py): the same loss and gradients, and no `batch x length x vocabulary` logits. It
returns the model's usual `CausalLMOutputWithPast`, with `logits=None` unless apply was asked for
them. Without labels the model's own forward runs unchanged (generation, feature extraction).
`remove(model)` undoes it. transformers itself is imported only when a patched forward builds
its output, so `import tiledlse` works without it.
"""
import inspect
import types

from .causal_lm import check_supported, hidden_states_loss

_STATE = "_tiledlse_forward"  # attribute of a patched model: what its forward and remove() need
_LOSS_ARGUMENTS = ("num_items_in_batch", "ignore_index")  # the model's loss takes these, not its decoder
# linear_cross_entropy's options that change how, not what, it computes (besides filter_eps).
_OPTIONS = ("memory_budget", "precision", "fused_step")


def apply(model, logits=False, filter_eps=None, **options):
    """Makes `model(..., labels=...)` compute its loss with TiledLSE; returns the model.

    model: a Transformers causal LM (`LlamaForCausalLM`, `Gemma2ForCausalLM`, `Qwen2ForCausalLM`,
    ... : any with a decoder `model.base_model`, a linear `model.get_output_embeddings()` and the
    causal-LM cross-entropy), in any dtype and on any device TiledLSE runs on. Called with
    `labels` (or `shift_labels`), the patched forward returns what the model's forward returns,
    with the loss (honouring `num_items_in_batch`, `ignore_index`, `logits_to_keep` /
    `num_logits_to_keep`, `config.final_logit_softcapping`, autocast) computed without the
    logits, and `logits=None`. Decoder arguments (attention_mask, position_ids,
    past_key_values, use_cache, output_hidden_states, output_attentions, ...) reach the decoder as
    they would; `return_dict=False` gives the tuple `(loss, logits, *the decoder's other outputs)`.
    logits: True to compute the logits too (from the same hidden states, soft-capped; the loss
    still comes from TiledLSE), for callers that read them with labels (Trainer's evaluation
    with compute_metrics); they cost their usual memory.
    filter_eps: linear_cross_entropy's gradient filter, off here (None: exact gradients, as the
    model's own loss). CCE's "auto" (eps(dtype)/32) drops the gradient of classes with softmax
    probability below 2.4e-4 in bf16: every class of a model near initialization at V > 4096,
    which then learns far slower (seen: a Trainer run of 20 steps at V = 8000 ended at loss 3.40
    instead of 2.52); it suits fine-tuning a trained model, whose probabilities are peaked.
    options: memory_budget, precision, fused_step, passed to linear_cross_entropy.
    Applying again only updates these choices.
    Raises ValueError for models whose loss this would not reproduce (scaled logits, a router
    loss added, another loss function), naming the attribute.
    """
    check_supported(model, "tiledlse.transformers.apply")
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError("tiledlse.transformers.apply: unknown option(s) %s; it takes logits, filter_eps, %s"
                        % (", ".join(unknown), ", ".join(_OPTIONS)))
    state = model.__dict__.get(_STATE)
    if state is None:
        signature = inspect.signature(model.forward)
        # An instance-level forward already there (another library's wrapper) is kept and called.
        state = types.SimpleNamespace(own_forward=model.__dict__.get("forward"))
        model.forward = types.MethodType(_patched_forward(signature), model)
        setattr(model, _STATE, state)
    state.logits, state.options = bool(logits), dict(options, filter_eps=filter_eps)
    return model


def remove(model):
    """Undoes apply(model): the model's forward is what it was before; returns the model. A model
    never patched is returned as it is."""
    state = model.__dict__.get(_STATE)
    if state is None:
        return model
    if not getattr(getattr(model.__dict__.get("forward"), "__func__", None), "tiledlse_patched", False):
        raise ValueError("tiledlse.transformers.remove: %s.forward was wrapped again after apply (by accelerate's "
                         "mixed precision, say); undo that first (accelerator.unwrap_model(model, "
                         "keep_fp32_wrapper=False))" % type(model).__name__)
    if state.own_forward is None:
        del model.forward  # the class's forward again
    else:
        model.forward = state.own_forward
    delattr(model, _STATE)
    return model


def _patched_forward(signature):
    """The forward to bind to one model. It holds no reference to the model (the model is `self`),
    so that copy.deepcopy(model) gives a copy whose forward is its own, and it shows the model's
    signature, which Trainer reads (dataset columns; whether the model takes num_items_in_batch)."""
    def forward(self, *args, **kwargs):
        return _forward(self, signature, args, kwargs)

    self_parameter = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    forward.__signature__ = signature.replace(parameters=[self_parameter, *signature.parameters.values()])
    forward.__doc__ = "The model's forward with its loss from TiledLSE (tiledlse.transformers.apply)."
    forward.tiledlse_patched = True
    return forward


def _forward(model, signature, args, kwargs):
    state = getattr(model, _STATE)
    arguments = _named_arguments(signature, args, kwargs)
    labels, shift_labels = arguments.pop("labels", None), arguments.pop("shift_labels", None)
    if labels is None and shift_labels is None:  # no loss asked for: the model's own forward
        if state.own_forward is not None:
            return state.own_forward(*args, **kwargs)
        return type(model).forward(model, *args, **kwargs)
    # The model slices its hidden states before the head (and so before its loss) by this.
    keep = arguments.pop("logits_to_keep", None)
    legacy_keep = arguments.pop("num_logits_to_keep", None)  # its older name (transformers 4.46)
    keep = keep if keep is not None else (legacy_keep or 0)
    return_dict = arguments.pop("return_dict", None)
    loss_arguments = {name: arguments.pop(name) for name in _LOSS_ARGUMENTS if name in arguments}
    if arguments.get("output_router_logits"):
        raise ValueError("tiledlse.transformers: %s was asked for output_router_logits=True, whose auxiliary "
                         "loss this loss does not add" % type(model).__name__)

    decoder = model.base_model
    outputs = decoder(**_accepted(decoder, dict(arguments, return_dict=True)))
    hidden = outputs.last_hidden_state
    hidden = hidden[:, slice(-keep, None) if isinstance(keep, int) else keep, :]
    # Transformers' causal-LM loss uses shift_labels as given when passed, else labels shifted by one.
    targets, shift = (labels, 1) if shift_labels is None else (shift_labels, 0)
    loss = hidden_states_loss(model, hidden, targets, shift, **loss_arguments, **state.options)
    logits = _logits(model, hidden) if state.logits else None

    config = model.config
    if return_dict is None:
        return_dict = getattr(config, "return_dict", True) and not getattr(config, "torchscript", False)
    if not return_dict:  # the tuple layout of Transformers 4.x: loss, logits, then the decoder's outputs
        return (loss, logits) + outputs.to_tuple()[1:]
    from transformers.modeling_outputs import CausalLMOutputWithPast
    return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=getattr(outputs, "past_key_values", None),
                                  hidden_states=getattr(outputs, "hidden_states", None),
                                  attentions=getattr(outputs, "attentions", None))


def _named_arguments(signature, args, kwargs):
    """The call's arguments by name, those collected by the forward's **kwargs included (loss
    arguments such as num_items_in_batch arrive there). Unknown names raise TypeError, as the
    model's forward would."""
    bound = signature.bind(*args, **kwargs)
    named = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind == inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        elif kind == inspect.Parameter.VAR_POSITIONAL:
            if value:
                raise TypeError("tiledlse.transformers: pass the model's arguments after the first by name")
        else:
            named[name] = value
    return named


def _accepted(module, arguments):
    """The arguments module's forward takes: all where it has **kwargs (recent Transformers, which
    pass every forward argument on to the decoder), else those it names (the decoders of 4.46)."""
    parameters = inspect.signature(module.forward).parameters
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return arguments
    return {name: value for name, value in arguments.items() if name in parameters}


def _logits(model, hidden):
    """The logits the model returns, for apply(model, logits=True)."""
    logits = model.get_output_embeddings()(hidden)
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = (logits / cap).tanh() * cap
    return logits
