"""tiledlse.transformers.apply: a Transformers causal LM patched to compute its loss with
TiledLSE, against the same model unpatched, on small randomly initialized Llama, Gemma 2 and Qwen 2
models.

- One forward and backward (float32 and bfloat16, with padding, with and without
  num_items_in_batch): the loss and every parameter's gradient, on CPU and CUDA.
- The patch itself: the output type, logits None (or the model's logits with logits=True),
  shift_labels, logits_to_keep, return_dict=False, the decoder's outputs (hidden states, cache),
  the model's own forward without labels, apply twice, remove, deepcopy, and the refusals.
- transformers.Trainer for 20 steps (gradient accumulation 2, so Trainer passes
  num_items_in_batch), unpatched and patched, from the same initial weights and data order: the
  loss of every micro-batch and every logged step must agree. CPU: float32 and bf16 mixed
  precision (Trainer's bf16=True); CUDA: bf16 mixed precision at V = 128256, where the logits
  dominate memory; the peak CUDA memory of both runs is printed (run with -s to see it;
  docs/python.md reports it).

Skipped without transformers (CI's Debian has none), the Trainer cases also without accelerate.
"""
import copy
import gc
import os
import tempfile
import types

import pytest
import torch

import tiledlse
from test_transformers import (DEVICES, GRAD_RTOL, LOSS_RTOL, assert_close, batch, loss_and_gradients, small_model,
                               transformers)

try:
    import accelerate  # Trainer needs it
except ImportError:
    accelerate = None

needs_transformers = pytest.mark.skipif(transformers is None, reason="needs transformers")
needs_trainer = pytest.mark.skipif(transformers is None or accelerate is None, reason="needs transformers and accelerate")
KINDS = ["llama", "gemma2", "qwen2"]


def own_output(model, **kwargs):
    """What the unpatched model returns (the class's forward, whatever is patched)."""
    return type(model).forward(model, **kwargs)


@needs_transformers
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("items", [None, 50], ids=["mean", "num_items_in_batch"])
def test_patched_forward_matches_the_model(device, dtype, kind, items):
    vocab = 503
    model = small_model(kind, vocab, dtype, device)
    input_ids, labels, mask = batch(vocab, device)
    extra = {} if items is None else {"num_items_in_batch": torch.tensor(items, device=device)}
    call = lambda: model(input_ids=input_ids, attention_mask=mask, labels=labels, **extra)
    ref_loss, ref_grads = loss_and_gradients(model, lambda: call().loss)
    expected_type = type(call())
    tiledlse.transformers.apply(model)
    output = call()
    assert type(output) is expected_type and output.logits is None
    loss, grads = loss_and_gradients(model, lambda: call().loss)
    assert_close(loss, ref_loss, LOSS_RTOL[dtype], "loss")
    assert ref_grads.keys() == grads.keys()
    for name in ref_grads:
        assert_close(grads[name], ref_grads[name], GRAD_RTOL[dtype], name)


@needs_transformers
@pytest.mark.parametrize("kind", KINDS)
def test_the_patch(kind):
    vocab = 101
    model = small_model(kind, vocab, torch.float32, "cpu")
    input_ids, labels, mask = batch(vocab, "cpu")
    args = dict(input_ids=input_ids, attention_mask=mask)
    tol = LOSS_RTOL[torch.float32]
    with torch.no_grad():
        ref = own_output(model, labels=labels, output_hidden_states=True, use_cache=True, **args)
        assert tiledlse.transformers.apply(model) is model
        assert tiledlse.transformers.apply(model) is model  # twice: harmless
        got = model(labels=labels, output_hidden_states=True, use_cache=True, **args)
        assert got.logits is None
        assert_close(got.loss, ref.loss, tol, "loss")
        assert len(got.hidden_states) == len(ref.hidden_states)
        for mine, theirs in zip(got.hidden_states, ref.hidden_states):
            assert torch.equal(mine, theirs)
        assert (got.past_key_values is None) == (ref.past_key_values is None)  # Gemma 2 keeps none in training
        # Without labels: the model's own forward, logits and all.
        plain = model(**args)
        assert plain.loss is None and torch.equal(plain.logits, ref.logits)
        # shift_labels as Transformers' loss takes them (used instead of labels).
        shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:].contiguous()
        assert_close(model(shift_labels=shifted, **args).loss, ref.loss, tol, "shift_labels")
        # logits_to_keep slices the hidden states before the loss, as the model slices them.
        keep_name = "logits_to_keep" if "logits_to_keep" in model.forward.__signature__.parameters else "num_logits_to_keep"
        keep = {keep_name: 7}
        assert_close(model(labels=labels[:, -7:], **keep, **args).loss,
                     own_output(model, labels=labels[:, -7:], **keep, **args).loss, tol, keep_name)
        # return_dict=False: (loss, logits, *the decoder's other outputs).
        as_tuple = model(labels=labels, return_dict=False, **args)
        assert as_tuple[1] is None and torch.equal(as_tuple[0], got.loss)
        # logits=True: the model's logits as well; applying again changes only that.
        tiledlse.transformers.apply(model, logits=True)
        with_logits = model(labels=labels, **args)
        assert_close(with_logits.logits, ref.logits, tol, "logits")
        assert_close(with_logits.loss, ref.loss, tol, "loss with logits")
        tiledlse.transformers.apply(model)
        # A deep copy is patched too, and computes with its own weights.
        twin = copy.deepcopy(model)
        assert twin.forward.__self__ is twin
        assert_close(twin(labels=labels, **args).loss, ref.loss, tol, "deepcopy")
        # remove: the class's forward again (the model's loss, with logits); a second remove is harmless.
        assert tiledlse.transformers.remove(model) is model
        assert "forward" not in vars(model)
        assert model(labels=labels, **args).logits is not None
        assert tiledlse.transformers.remove(model) is model


@needs_transformers
def test_refusals():
    model = small_model("llama", 101, torch.float32, "cpu")
    tiledlse.transformers.apply(model)
    model.forward = types.MethodType(lambda self, *a, **k: None, model)  # someone wraps it after apply
    with pytest.raises(ValueError, match="wrapped again after apply"):
        tiledlse.transformers.remove(model)
    with pytest.raises(TypeError, match="unknown option\\(s\\) z_loss"):
        tiledlse.transformers.apply(small_model("llama", 101, torch.float32, "cpu"), z_loss=1e-4)
    for attribute, value in (("logits_scaling", 8.0), ("logit_scale", 0.25)):
        model = small_model("llama", 101, torch.float32, "cpu")
        setattr(model.config, attribute, value)
        with pytest.raises(ValueError, match="LlamaForCausalLM scales its logits \\(config.%s" % attribute):
            tiledlse.transformers.apply(model)
        assert "forward" not in vars(model)
    model = small_model("llama", 101, torch.float32, "cpu")
    model.config.output_router_logits = True
    with pytest.raises(ValueError, match="config.output_router_logits"):
        tiledlse.transformers.apply(model)
    if hasattr(model, "loss_function"):  # transformers >= 4.46
        model = small_model("llama", 101, torch.float32, "cpu")
        model.loss_type = model.config.loss_type = "ForTokenClassification"  # where each version looks
        with pytest.raises(ValueError, match="model.loss_function"):
            tiledlse.transformers.apply(model)


# The Trainer runs: (vocabulary, sequences per micro-batch, length) per device.
TRAINER_SHAPES = {"cpu": (8000, 2, 32), "cuda": (128256, 4, 512)}
# float32 weights in every run; "bf16" is Trainer's bf16=True (autocast, as `--bf16` fine-tuning runs).
TRAINER_CASES = [(device, precision) for device, precision in (("cpu", "float32"), ("cpu", "bf16"), ("cuda", "bf16"))
                 if device in DEVICES]
# Relative to 1 + |reference loss|. float32: the two losses differ by rounding only (seen on CPU:
# 3e-7 at worst over the 40 micro-batches). bf16: the model rounds its logits to bf16 before its
# float32 loss (ours stay float32), up to 2^-9 relative per logit, which also reaches the bf16
# gradients and through Adam the weights of later steps (seen on CPU with transformers 4.46.3,
# 4.57.6 and 5.17.0: 2.3e-3 at worst, Llama on 4.57.6); 2e-2 leaves a wide margin without hiding a wrong
# loss: a missed soft cap, shift or num_items_in_batch, or the gradient filter (apply's
# filter_eps="auto", which left the loss at 3.40 instead of 2.52 after 20 steps), moves it by more.
TRAINER_RTOL = {"float32": 1e-4, "bf16": 2e-2}
STEPS, ACCUMULATION = 20, 2


def trainer_dataset(vocab, size, length, used=64):
    """Token rows with right padding of random lengths (-100 labels), so that the number of
    items differs between micro-batches and num_items_in_batch matters. The tokens are drawn from
    the first `used` ids of the vocabulary, which the model learns within the 20 steps: the
    losses fall (from log V towards log used), so the runs compare a real training."""
    g = torch.Generator().manual_seed(3)
    rows = []
    for _ in range(STEPS * ACCUMULATION * size):
        input_ids = torch.randint(0, used, (length,), generator=g)
        mask = torch.ones(length, dtype=torch.int64)
        mask[length - int(torch.randint(0, length // 2, (1,), generator=g)):] = 0
        rows.append({"input_ids": input_ids, "attention_mask": mask, "labels": input_ids.masked_fill(mask == 0, -100)})
    return rows


def train(kind, device, precision, patched):
    """Trains a fresh model (the same initial weights each time) for STEPS steps; returns the loss
    of every micro-batch, the logged loss of every step and the peak CUDA memory (None on CPU)."""
    vocab, size, length = TRAINER_SHAPES[device]
    if device == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    model = small_model(kind, vocab, torch.float32, device)  # float32 weights; on CUDA, bf16 autocast
    if patched:
        tiledlse.transformers.apply(model)
    # Transformers 4.x's TrainingArguments(bf16=True) sets this variable, and later ones without
    # bf16 read it as their default: set it for each run, and put it back after.
    saved = os.environ.get("ACCELERATE_MIXED_PRECISION")
    os.environ["ACCELERATE_MIXED_PRECISION"] = "bf16" if precision == "bf16" else "no"
    try:
        recorded, logged = run_trainer(model, device, precision, vocab, size, length)
    finally:
        if saved is None:
            os.environ.pop("ACCELERATE_MIXED_PRECISION", None)
        else:
            os.environ["ACCELERATE_MIXED_PRECISION"] = saved
    peak = None
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    return recorded, logged, peak


def run_trainer(model, device, precision, vocab, size, length):
    """Trainer's STEPS steps on the model; the loss of every micro-batch and every logged step."""

    class RecordingTrainer(transformers.Trainer):
        def compute_loss(self, *args, **kwargs):
            loss = super().compute_loss(*args, **kwargs)
            self.recorded.append((loss[0] if isinstance(loss, tuple) else loss).detach().float().item())
            return loss

    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out, max_steps=STEPS, per_device_train_batch_size=size,
            gradient_accumulation_steps=ACCUMULATION, learning_rate=5e-3, warmup_steps=0, logging_steps=1,
            report_to=[], save_strategy="no", seed=0, data_seed=0, bf16=precision == "bf16", use_cpu=device == "cpu",
            dataloader_num_workers=0, dataloader_pin_memory=False, disable_tqdm=True)
        trainer = RecordingTrainer(model=model, args=args, train_dataset=trainer_dataset(vocab, size, length))
        trainer.recorded = []
        trainer.train()
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert trainer.state.global_step == STEPS and len(logged) == STEPS and len(trainer.recorded) == STEPS * ACCUMULATION
    return trainer.recorded, logged


@needs_trainer
@pytest.mark.parametrize("device, precision", TRAINER_CASES)
@pytest.mark.parametrize("kind", KINDS)
def test_trainer_losses_match(device, precision, kind):
    stock, stock_logged, stock_peak = train(kind, device, precision, patched=False)
    ours, ours_logged, ours_peak = train(kind, device, precision, patched=True)
    rtol = TRAINER_RTOL[precision]
    worst = max(abs(a - b) / (1.0 + abs(b)) for a, b in zip(ours, stock))
    print("\nTrainer, %s on %s in %s, transformers %s: %d micro-batches, losses %.4f .. %.4f, largest relative "
          "difference %.2g" % (kind, device, precision, transformers.__version__, len(stock), stock[0], stock[-1],
                               worst))
    for step, (a, b) in enumerate(zip(ours, stock)):
        assert abs(a - b) <= rtol * (1.0 + abs(b)), "micro-batch %d: %.6f (patched) vs %.6f" % (step, a, b)
    for step, (a, b) in enumerate(zip(ours_logged, stock_logged)):  # Trainer logs them rounded to 4 digits
        assert abs(a - b) <= rtol * (1.0 + abs(b)) + 1e-4, "step %d: logged %.4f (patched) vs %.4f" % (step, a, b)
    if device == "cuda":
        vocab, size, length = TRAINER_SHAPES[device]
        gib = 1024.0 ** 3
        print("peak CUDA memory of Trainer's %d steps, %s (hidden 64, 2 layers, float32 weights, bf16 autocast), "
              "V = %d, %d x %d tokens per micro-batch: model's loss %.3f GiB, tiledlse.transformers.apply %.3f GiB "
              "(%.1fx less)" % (STEPS, kind, vocab, size, length, stock_peak / gib, ours_peak / gib,
                                stock_peak / ours_peak))
        assert ours_peak < stock_peak
