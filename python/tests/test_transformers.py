"""tiledlse.causal_lm_loss against the model's own loss, on small randomly initialized
Transformers models (Llama; Gemma 2 for the final-logit soft cap; Qwen 2): the loss and every
parameter's gradient, in float32 and bfloat16, with padding (-100 labels and an attention mask),
and with Trainer's num_items_in_batch; tiledlse.causal_lm_distillation_loss of a Llama student
against a wider Llama teacher, against the same loss on the two models' logits. On CPU, and on
CUDA where the library and torch have it.
Skipped without transformers (CI's Debian has none; the GPU machine has it).

test_peak_memory_llama3_vocabulary (CUDA only) measures the peak memory of one training step at
Llama 3's vocabulary (V = 128256) with the model's loss and with tiledlse's, and prints both
(run with -s to see them; docs/python.md reports them).
"""
import math

import pytest
import torch

import tiledlse
from tiledlse import _library

try:
    import transformers
except ImportError:
    transformers = None

needs_transformers = pytest.mark.skipif(transformers is None, reason="needs transformers")
DEVICES = ["cpu"]
if _library.device_available(_library.DEVICE_CUDA) and torch.cuda.is_available():
    DEVICES.append("cuda")
# Relative to the largest reference magnitude. float32: the two losses only round differently
# (seen on CPU: 1e-7 on the loss, 5e-8 on gradients). bfloat16: the model rounds its logits to
# bfloat16 before upcasting them, ours stay float32, and gradients are stored in bfloat16 (seen
# on CPU: 8e-6 on the loss, 1.3e-3 on gradients).
LOSS_RTOL = {torch.float32: 1e-5, torch.bfloat16: 1e-3}
GRAD_RTOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def small_model(kind, vocab, dtype, device, hidden=64, layers=2):
    """A randomly initialized model, the same weights for the same arguments."""
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                  tie_word_embeddings=False)
    if kind == "llama":
        config = transformers.LlamaConfig(**common)
        model_class = transformers.LlamaForCausalLM
    elif kind == "gemma2":  # final_logit_softcapping (30 by default), tied embeddings
        config = transformers.Gemma2Config(**dict(common, head_dim=16, tie_word_embeddings=True))
        model_class = transformers.Gemma2ForCausalLM
    else:  # Qwen 2: biases on the attention's q, k, v projections
        config = transformers.Qwen2Config(**common)
        model_class = transformers.Qwen2ForCausalLM
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return model_class(config).to(device=device, dtype=dtype)


def batch(vocab, device, size=3, length=29):
    """Token ids, labels with -100 at the padding (right-padded rows of different lengths) and
    the attention mask."""
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, vocab, (size, length), generator=g)
    mask = torch.ones(size, length, dtype=torch.int64)
    for row, pad in enumerate((0, 5, 11)[:size]):
        if pad:
            mask[row, -pad:] = 0
    labels = input_ids.masked_fill(mask == 0, -100)
    return input_ids.to(device), labels.to(device), mask.to(device)


def loss_and_gradients(model, loss_fn):
    model.zero_grad()
    loss = loss_fn()
    loss.backward()
    return loss.detach().float(), {n: p.grad.detach().float().clone() for n, p in model.named_parameters()}


def assert_close(got, ref, rtol, what):
    err = (got - ref).abs().max().item()
    bound = rtol * (1.0 + ref.abs().max().item())
    assert err <= bound, "%s: max error %.3g > %.3g" % (what, err, bound)


@needs_transformers
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", ["llama", "gemma2", "qwen2"])
@pytest.mark.parametrize("items", [None, 50], ids=["mean", "num_items_in_batch"])
def test_matches_the_model_loss(device, dtype, kind, items):
    vocab = 503
    model = small_model(kind, vocab, dtype, device)
    input_ids, labels, mask = batch(vocab, device)
    extra = {} if items is None else {"num_items_in_batch": torch.tensor(items, device=device)}
    ref_loss, ref_grads = loss_and_gradients(
        model, lambda: model(input_ids=input_ids, attention_mask=mask, labels=labels, **extra).loss)
    loss, grads = loss_and_gradients(
        model, lambda: tiledlse.causal_lm_loss(model, input_ids, labels, attention_mask=mask, **extra))
    assert loss.dim() == 0
    assert_close(loss, ref_loss, LOSS_RTOL[dtype], "loss")
    assert ref_grads.keys() == grads.keys()
    for name in ref_grads:
        assert_close(grads[name], ref_grads[name], GRAD_RTOL[dtype], name)


@needs_transformers
def test_shift_labels_and_refusals():
    vocab = 101
    model = small_model("llama", vocab, torch.float32, "cpu")
    input_ids, labels, mask = batch(vocab, "cpu")
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:].contiguous()
    with torch.no_grad():
        expected = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        got = tiledlse.causal_lm_loss(model, input_ids, shift_labels=shifted, attention_mask=mask)
    assert_close(got, expected, LOSS_RTOL[torch.float32], "loss")
    with pytest.raises(ValueError, match="exactly one of 'labels' and 'shift_labels'"):
        tiledlse.causal_lm_loss(model, input_ids)
    model.config.logits_scaling = 8.0
    with pytest.raises(ValueError, match="scales its logits"):
        tiledlse.causal_lm_loss(model, input_ids, labels)


def distillation_reference(student_logits, teacher_logits, labels, temperature, alpha, beta):
    """JSD(beta) at `temperature` mixed with the student's cross-entropy, from the models' logits,
    over the positions whose next label is not -100 (the mean)."""
    rows = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:].reshape(-1)
    x = student_logits.reshape(rows.shape[0], -1).double()
    ls = torch.log_softmax(x / temperature, -1)
    lt = torch.log_softmax(teacher_logits.reshape(rows.shape[0], -1).double() / temperature, -1)
    lm = torch.logsumexp(torch.stack([lt + math.log(beta), ls + math.log(1 - beta)]), 0)
    kl = torch.nn.functional.kl_div
    div = beta * kl(lm, lt, reduction="none", log_target=True).sum(-1) + \
        (1 - beta) * kl(lm, ls, reduction="none", log_target=True).sum(-1)
    ce = torch.nn.functional.cross_entropy(x, rows, ignore_index=-100, reduction="none")
    scored = rows != -100
    return torch.where(scored, alpha * ce + (1 - alpha) * div, torch.zeros_like(div)).sum() / scored.sum()


@needs_transformers
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_distillation_matches_the_logits_loss(device, dtype):
    vocab = 211
    student = small_model("llama", vocab, dtype, device, hidden=32)
    teacher = small_model("llama", vocab, dtype, device, hidden=64).requires_grad_(False)
    input_ids, labels, mask = batch(vocab, device)
    options = dict(temperature=2.0, alpha=0.3, beta=0.4)

    def reference():
        with torch.no_grad():
            teacher_logits = teacher(input_ids=input_ids, attention_mask=mask).logits
        student_logits = student(input_ids=input_ids, attention_mask=mask).logits
        return distillation_reference(student_logits, teacher_logits, labels, **options).float()
    ref_loss, ref_grads = loss_and_gradients(student, reference)
    loss, grads = loss_and_gradients(student, lambda: tiledlse.causal_lm_distillation_loss(
        student, teacher, input_ids, labels, attention_mask=mask, divergence="jsd", **options))
    assert loss.dim() == 0
    assert_close(loss, ref_loss, LOSS_RTOL[dtype], "loss")
    for name in ref_grads:
        assert_close(grads[name], ref_grads[name], GRAD_RTOL[dtype], name)
    assert all(p.grad is None for p in teacher.parameters())


@needs_transformers
def test_distillation_labels_default_teacher_grad_and_refusals():
    vocab = 101
    student = small_model("llama", vocab, torch.float32, "cpu", hidden=32)
    teacher = small_model("llama", vocab, torch.float32, "cpu", hidden=48)
    input_ids, labels, mask = batch(vocab, "cpu")
    # labels=None: the input ids, padding (attention_mask 0) not scored.
    with torch.no_grad():
        expected = tiledlse.causal_lm_distillation_loss(student, teacher, input_ids, labels, attention_mask=mask)
        got = tiledlse.causal_lm_distillation_loss(student, teacher, input_ids, attention_mask=mask)
        shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:].contiguous()
        by_shift = tiledlse.causal_lm_distillation_loss(student, teacher, input_ids, shift_labels=shifted,
                                                        attention_mask=mask)
    assert_close(got, expected, 1e-6, "loss without labels")
    assert_close(by_shift, expected, 1e-6, "loss with shift_labels")
    # fused_step reaches distillation_loss: the step in one call gives the two calls' gradients.
    grads = {}
    for fused in (False, True):
        student.zero_grad()
        tiledlse.causal_lm_distillation_loss(student, teacher, input_ids, labels, attention_mask=mask,
                                             fused_step=fused).backward()
        grads[fused] = student.lm_head.weight.grad.clone()
    assert torch.equal(grads[True], grads[False])
    student.zero_grad()
    # The teacher trains only when asked to.
    tiledlse.causal_lm_distillation_loss(student, teacher, input_ids, labels, attention_mask=mask).backward()
    assert all(p.grad is None for p in teacher.parameters())
    tiledlse.causal_lm_distillation_loss(student, teacher, input_ids, labels, attention_mask=mask,
                                         teacher_grad=True).backward()
    assert teacher.lm_head.weight.grad is not None and teacher.model.embed_tokens.weight.grad is not None
    gemma = small_model("gemma2", vocab, torch.float32, "cpu")
    with pytest.raises(ValueError, match="soft-caps its logits"):
        tiledlse.causal_lm_distillation_loss(student, gemma, input_ids, labels)
    teacher.config.logits_scaling = 8.0
    with pytest.raises(ValueError, match="scales its logits"):
        tiledlse.causal_lm_distillation_loss(student, teacher, input_ids, labels)


def peak_step_bytes(model, step):
    """Peak CUDA memory of one training step beyond what was allocated before it."""
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step().backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


@needs_transformers
@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a GPU and a CUDA build of libtiledlse_c")
def test_peak_memory_llama3_vocabulary():
    vocab, size, length = 128256, 4, 2048
    model = small_model("llama", vocab, torch.bfloat16, "cuda", hidden=512, layers=2)
    g = torch.Generator().manual_seed(2)
    input_ids = torch.randint(0, vocab, (size, length), generator=g).cuda()
    stock = lambda: model(input_ids=input_ids, labels=input_ids).loss
    ours = lambda: tiledlse.causal_lm_loss(model, input_ids, input_ids)
    peak_ours, peak_stock = peak_step_bytes(model, ours), peak_step_bytes(model, stock)
    gib = 1024.0 ** 3
    print("\npeak memory of a training step, Llama-style bf16 model (hidden 512, 2 layers), V = %d, %d x %d tokens: "
          "model's loss %.2f GiB, tiledlse.causal_lm_loss %.2f GiB (%.1fx less)"
          % (vocab, size, length, peak_stock / gib, peak_ours / gib, peak_stock / peak_ours))
    assert peak_ours < peak_stock
