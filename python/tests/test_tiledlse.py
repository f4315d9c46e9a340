"""tiledlse against plain PyTorch (float64 reference on the same input values), on CPU and, when
the library and torch both have it, on CUDA; every option, every dtype, gradients included.

Tolerances (relative to the largest reference magnitude, see `close`): the kernels accumulate in
float32 (float64 for float64 inputs), so losses and LSEs carry about sqrt(D) float32 roundings;
gradients are stored in the input dtype, so they also carry its rounding (2^-8 bf16, 2^-11 fp16).
"""
import math

import pytest
import torch
import torch.nn.functional as F

import tiledlse
from tiledlse import _calls, _functions, _library

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
LOSS_RTOL = {torch.float64: 1e-12, torch.float32: 2e-5, torch.bfloat16: 2e-5, torch.float16: 2e-5}
GRAD_RTOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}

DEVICES = ["cpu"]
if _library.device_available(_library.DEVICE_CUDA) and torch.cuda.is_available():
    DEVICES.append("cuda")

# Not tile multiples (tiles are 32 x 32 on the host, larger on CUDA).
N, V, D = 37, 53, 19


def close(got, ref, rtol, what):
    got, ref = got.double().cpu(), ref.double().cpu()
    assert got.shape == ref.shape, "%s: shape %s, expected %s" % (what, tuple(got.shape), tuple(ref.shape))
    err = (got - ref).abs().max().item() if ref.numel() else 0.0
    bound = rtol * (1.0 + (ref.abs().max().item() if ref.numel() else 0.0))
    assert err <= bound, "%s: max error %.3g > %.3g" % (what, err, bound)


def rand(*shape, dtype, device, scale=0.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(device)


def reference_cross_entropy(e, c, targets, bias, ignore_index, softcap, reduction, shift, z_loss):
    """Materializes the logits in float64."""
    e, c = e.double(), c.double()
    batch_shape, length = e.shape[:-1], e.shape[-2] if e.dim() > 1 else 1
    if shift:
        e, targets = e[..., : length - shift, :], targets[..., shift:]
    logits = e.reshape(-1, e.shape[-1]) @ c.T
    if bias is not None:
        logits = logits + bias.double()
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    t = targets.reshape(-1)
    valid = t != ignore_index
    lse = torch.logsumexp(logits, dim=-1)
    rows = F.cross_entropy(logits, t, ignore_index=ignore_index, reduction="none") + z_loss * lse**2 * valid
    lse = lse * valid
    if reduction == "sum":
        return rows.sum(), lse
    if reduction == "mean":
        return rows.sum() / max(int(valid.sum()), 1), lse
    full = torch.zeros(batch_shape, dtype=torch.float64, device=rows.device)
    full[..., : length - shift] = rows.view(*batch_shape[:-1], length - shift) if e.dim() > 1 else rows
    return full, lse


CE_CASES = {
    "default": {},
    "bias": {"bias": True},
    "softcap": {"softcap": 3.0},
    "sum": {"reduction": "sum"},
    "none": {"reduction": "none"},
    "ignore": {"ignore": True},
    "ignore_index=-1": {"ignore": True, "ignore_index": -1},
    "z_loss": {"z_loss": 1e-2},
    "shift_1d": {"shift": 2},
    "shift_batched": {"shift": 1, "batched": True, "reduction": "none"},
    "everything": {"bias": True, "softcap": 5.0, "ignore": True, "z_loss": 1e-3, "shift": 1, "batched": True},
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(CE_CASES))
def test_cross_entropy_matches_torch(device, dtype, case):
    o = CE_CASES[case]
    ignore_index = o.get("ignore_index", -100)
    shape = (3, 13, D) if o.get("batched") else (N, D)
    e = rand(*shape, dtype=dtype, device=device, seed=1).requires_grad_()
    c = rand(V, D, dtype=dtype, device=device, seed=2).requires_grad_()
    bias = rand(V, dtype=dtype, device=device, seed=3).requires_grad_() if o.get("bias") else None
    g = torch.Generator().manual_seed(4)
    targets = torch.randint(0, V, shape[:-1], generator=g)
    if o.get("ignore"):
        targets.view(-1)[::3] = ignore_index
    targets = targets.to(device)
    kwargs = dict(ignore_index=ignore_index, softcap=o.get("softcap"), reduction=o.get("reduction", "mean"),
                  shift=o.get("shift", 0), z_loss=o.get("z_loss", 0.0))

    loss, lse = tiledlse.linear_cross_entropy(e, c, targets, bias=bias, return_lse=True, filter_eps=None, **kwargs)
    leaves = [x for x in (e, c, bias) if x is not None]
    upstream = torch.linspace(0.5, 1.5, loss.numel(), dtype=loss.dtype, device=device).view(loss.shape)
    grads = torch.autograd.grad((loss * upstream).sum(), leaves)

    ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
    re, rc, rb = ref_leaves[0], ref_leaves[1], (ref_leaves[2] if bias is not None else None)
    ref_loss, ref_lse = reference_cross_entropy(re, rc, targets, rb, softcap=o.get("softcap"), **{
        k: kwargs[k] for k in ("ignore_index", "reduction", "shift", "z_loss")})
    ref_grads = torch.autograd.grad((ref_loss * upstream.double()).sum(), ref_leaves)

    assert loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    close(loss, ref_loss, LOSS_RTOL[dtype], "loss")
    if not kwargs["shift"]:
        close(lse, ref_lse.view(lse.shape), LOSS_RTOL[dtype], "lse")
    for name, got, ref in zip(("dE", "dC", "dbias"), grads, ref_grads):
        assert got.dtype == dtype and got.device == e.device
        close(got, ref, GRAD_RTOL[dtype], name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cross_entropy_filter_auto_is_close(device, dtype):
    """The default gradient filter skips tiles whose softmax entries are all below eps(dtype)/32."""
    e = rand(N, D, dtype=dtype, device=device, seed=5, scale=1.0).requires_grad_()
    c = rand(V, D, dtype=dtype, device=device, seed=6, scale=1.0).requires_grad_()
    targets = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(7)).to(device)
    exact = torch.autograd.grad(tiledlse.linear_cross_entropy(e, c, targets, filter_eps=None), (e, c))
    filtered = torch.autograd.grad(tiledlse.linear_cross_entropy(e, c, targets), (e, c))
    for name, got, ref in zip(("dE", "dC"), filtered, exact):
        close(got, ref, 2 * GRAD_RTOL[dtype], name)


@pytest.mark.parametrize("device", DEVICES)
def test_cross_entropy_empty_and_all_ignored(device):
    c = rand(V, D, dtype=torch.float32, device=device).requires_grad_()
    empty = torch.zeros(0, D, device=device, requires_grad=True)
    loss = tiledlse.linear_cross_entropy(empty, c, torch.zeros(0, dtype=torch.int64, device=device))
    assert loss.item() == 0.0
    e = rand(N, D, dtype=torch.float32, device=device).requires_grad_()
    loss = tiledlse.linear_cross_entropy(e, c, torch.full((N,), -100, dtype=torch.int64, device=device))
    de, dc = torch.autograd.grad(loss, (e, c))
    assert loss.item() == 0.0 and de.abs().max().item() == 0.0 and dc.abs().max().item() == 0.0


def reference_contrastive(image, text, scale, labels, symmetric):
    logits = scale * image.double() @ text.double().T
    labels = torch.arange(image.shape[0], device=image.device) if labels is None else labels
    i2t = F.cross_entropy(logits, labels)
    if not symmetric:
        return i2t
    return (i2t + F.cross_entropy(logits.T, labels)) / 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "image_to_text"])
@pytest.mark.parametrize("with_labels", [False, True], ids=["diagonal", "labels"])
def test_contrastive_matches_torch(device, dtype, symmetric, with_labels):
    b, c = 41, 23
    image = rand(b, c, dtype=dtype, device=device, seed=8).requires_grad_()
    text = rand(b, c, dtype=dtype, device=device, seed=9).requires_grad_()
    scale = torch.tensor(2.5, dtype=torch.float32, device=device, requires_grad=True)
    labels = torch.randperm(b, generator=torch.Generator().manual_seed(10)).to(device) if with_labels else None
    loss = tiledlse.contrastive_loss(image, text, scale, labels=labels, symmetric=symmetric)
    grads = torch.autograd.grad(loss * 1.3, (image, text, scale))

    ri, rt = image.detach().double().requires_grad_(), text.detach().double().requires_grad_()
    rs = scale.detach().double().requires_grad_()
    ref = reference_contrastive(ri, rt, rs, labels, symmetric)
    ref_grads = torch.autograd.grad(ref * 1.3, (ri, rt, rs))

    assert loss.dim() == 0 and loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    close(loss, ref, LOSS_RTOL[dtype], "loss")
    close(grads[0], ref_grads[0], GRAD_RTOL[dtype], "dI")
    close(grads[1], ref_grads[1], GRAD_RTOL[dtype], "dT")
    assert grads[2].dtype == scale.dtype and grads[2].shape == scale.shape
    # dscale is a sum over b rows, returned in the dtype of `scale` (float32 here).
    close(grads[2], ref_grads[2], max(10 * LOSS_RTOL[dtype], 2.0 ** -22), "dscale")


def reference_self_contrastive(z, scale):
    """NT-Xent in float64 with the logits formed: row i's positive is row (i + n/2) mod n, and its
    logit with itself is left out."""
    n = z.shape[0]
    logits = scale * z.double() @ z.double().T
    logits = logits.masked_fill(torch.eye(n, dtype=torch.bool, device=z.device), float("-inf"))
    return F.cross_entropy(logits, (torch.arange(n, device=z.device) + n // 2) % n)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n, c, scale, unit", [(46, 23, 2.5, False), (2, 5, 1.0, False), (70, 19, 1.0e4, True)],
                         ids=["46x23", "one-sample", "logits-1e4"])
def test_self_contrastive_matches_torch(device, dtype, n, c, scale, unit):
    # Inputs drawn fresh per run (the seed is in the message); "logits-1e4": unit rows at scale 1e4,
    # the SimCLR form at an extreme temperature, where each row's own logit (1e4, left out) would
    # otherwise swamp the others.
    seed = torch.seed() % 2**31
    z = rand(n, c, dtype=torch.float64, device="cpu", scale=1.0, seed=seed)
    if unit:
        z = z / z.norm(dim=1, keepdim=True)
    z = z.to(dtype).to(device).requires_grad_()
    scale_t = torch.tensor(scale, dtype=torch.float32, device=device, requires_grad=True)
    loss = tiledlse.self_contrastive_loss(z, scale_t)
    grads = torch.autograd.grad(loss * 1.3, (z, scale_t))

    rz, rs = z.detach().double().requires_grad_(), scale_t.detach().double().requires_grad_()
    ref = reference_self_contrastive(rz, rs)
    ref_grads = torch.autograd.grad(ref * 1.3, (rz, rs))

    what = "seed %d: " % seed
    assert loss.dim() == 0 and loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    close(loss, ref, LOSS_RTOL[dtype], what + "loss")
    # A logit of magnitude up to `scale` (unit rows) is rounded at the accumulator's unit roundoff,
    # and the softmax moves by that much: at scale 1e4 float32 adds 1e4 * 2^-24 = 6e-4 (measured
    # up to 6.1e-5 over 20 draws; bf16 3.5e-3, fp16 4.9e-4 within their storage's bound).
    logit_rounding = abs(scale) * (2.0 ** -53 if dtype == torch.float64 else 2.0 ** -24) if unit else 0.0
    close(grads[0], ref_grads[0], GRAD_RTOL[dtype] + logit_rounding, what + "dZ")
    close(grads[1], ref_grads[1], max(10 * LOSS_RTOL[dtype], 2.0 ** -22), what + "dscale")


def test_gradcheck_self_contrastive():
    z = rand(6, 3, dtype=torch.float64, device="cpu", scale=1.0).requires_grad_()
    scale = torch.tensor(1.7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(tiledlse.self_contrastive_loss, (z, scale))


@pytest.mark.parametrize(
    "change, error, pattern",
    [
        (lambda z, s: (z[:-1], s, {}), ValueError, "'z' has 7 rows; .* the row count must be even"),
        (lambda z, s: (z.reshape(2, 4, 8), s, {}), ValueError, "'z' must have 2 dimensions"),
        (lambda z, s: (z.int(), s, {}), TypeError, "'z' has dtype torch.int32"),
        (lambda z, s: (z.t(), s, {}), ValueError, "'z' must be contiguous"),
        (lambda z, s: (z, -1.0, {}), ValueError, "'scale' must be finite and >= 0"),
        (lambda z, s: (z, torch.ones(2), {}), ValueError, "'scale' must be a floating-point tensor of one"),
        (lambda z, s: (z, "2", {}), TypeError, "'scale'"),
        (lambda z, s: (z, s, {"memory_budget": 0}), ValueError, "'memory_budget'"),
        (lambda z, s: (z, s, {"precision": "TF32"}), ValueError, "'precision' must be 'exact' or 'tf32'"),
    ],
)
def test_self_contrastive_bad_input(change, error, pattern):
    z, s, kwargs = change(rand(8, 8, dtype=torch.float32, device="cpu"), torch.tensor(2.0))
    with pytest.raises(error, match=pattern):
        tiledlse.self_contrastive_loss(z, s, **kwargs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("loss_name", ["contrastive", "self_contrastive", "cross_entropy"])
def test_tf32_precision(device, loss_name):
    """precision="tf32" reaches the library: on a GPU with TF32 tensor cores the float32 products
    round their operands to TF32 (results differ from the exact ones, by about TF32's rounding);
    on the CPU it is ignored (the exact results, bit for bit). The kernels' own TF32 error model is
    checked by the C++ suite (test_contrastive, test_cross_entropy: Tf32Precision)."""
    seed = torch.seed() % 2**31
    inputs = [rand(*shape, dtype=torch.float32, device=device, seed=seed + k)
              for k, shape in enumerate([(1024, 256), (1024, 256)] if loss_name != "cross_entropy"
                                        else [(300, 256), (1000, 256)])]
    targets = torch.randint(0, 1000, (300,), generator=torch.Generator().manual_seed(seed)).to(device)
    losses = {
        "contrastive": lambda a, b, p: tiledlse.contrastive_loss(a, b, 2.5, precision=p),
        "self_contrastive": lambda a, b, p: tiledlse.self_contrastive_loss(torch.cat([a, b]), 2.5, precision=p),
        "cross_entropy": lambda a, b, p: tiledlse.linear_cross_entropy(a, b, targets, filter_eps=None, precision=p),
    }
    results = {}
    for precision in ("exact", "tf32"):
        leaves = [x.detach().clone().requires_grad_() for x in inputs]
        loss = losses[loss_name](*leaves, precision)
        results[precision] = [loss.detach(), *torch.autograd.grad(loss, leaves)]
    exact, tf32 = results["exact"], results["tf32"]
    what = "seed %d, %s: " % (seed, loss_name)
    if device == "cpu" or torch.cuda.get_device_capability()[0] < 8:
        for got, want in zip(tf32, exact):
            assert torch.equal(got, want), what + "precision='tf32' changed a result where it has no effect"
        return
    assert any(not torch.equal(got, want) for got, want in zip(tf32, exact)), what + "'tf32' gave the exact results"
    # Operands rounded to 2^-11: each logit moves by about 2^-11 scale |a| |b| / sqrt(256) (a random
    # walk over the 256 products), up to about 5e-3 here, and the loss and the gradients at most by
    # as much relatively; their errors average out over many logits (measured on a GPU, far below
    # these bounds: docs/notes/2026-11-28.md, "TF32 products from C and Python").
    close(tf32[0], exact[0], 2.0 ** -8, what + "loss")
    for k, (got, want) in enumerate(zip(tf32[1:], exact[1:])):
        close(got, want, 2.0 ** -6, what + "gradient %d" % k)


@pytest.mark.parametrize("device", DEVICES)
def test_memory_budget_keeps_the_results(device):
    # The budget picks an algorithm (on Hopper GPUs); any budget gives the same loss and gradients.
    e, c, t = (x.to(device) for x in ce_inputs())
    image, text = rand(8, 8, dtype=torch.float32, device=device), rand(8, 8, dtype=torch.float32, device=device, seed=1)
    results = []
    for budget in (None, 1, 1 << 30):
        e1, c1, i1, t1 = (x.detach().clone().requires_grad_(True) for x in (e, c, image, text))
        loss = tiledlse.linear_cross_entropy(e1, c1, t, memory_budget=budget)
        loss = loss + tiledlse.contrastive_loss(i1, t1, 2.0, memory_budget=budget)
        loss.backward()
        results.append([loss.detach(), e1.grad, c1.grad, i1.grad, t1.grad])
    for other in results[1:]:
        for got, ref in zip(other, results[0]):
            close(got, ref, 2e-5, "memory_budget")


def test_contrastive_float_scale():
    image, text = rand(9, 4, dtype=torch.float64, device="cpu"), rand(9, 4, dtype=torch.float64, device="cpu", seed=1)
    close(tiledlse.contrastive_loss(image, text, 3.0), reference_contrastive(image, text, 3.0, None, True), 1e-12,
          "loss")


def test_gradcheck_cross_entropy():
    e = rand(2, 5, 4, dtype=torch.float64, device="cpu", scale=1.0).requires_grad_()
    c = rand(7, 4, dtype=torch.float64, device="cpu", seed=1, scale=1.0).requires_grad_()
    bias = rand(7, dtype=torch.float64, device="cpu", seed=2).requires_grad_()
    targets = torch.tensor([[1, 6, -100, 0, 3], [2, 2, 5, -100, 4]])
    for kwargs in ({}, {"softcap": 2.0, "z_loss": 0.1, "shift": 1}, {"reduction": "none"}, {"reduction": "sum"}):
        fn = lambda e, c, bias: tiledlse.linear_cross_entropy(e, c, targets, bias=bias, filter_eps=None, **kwargs)
        assert torch.autograd.gradcheck(fn, (e, c, bias)), kwargs


@pytest.mark.parametrize("symmetric", [True, False])
def test_gradcheck_contrastive(symmetric):
    image = rand(6, 3, dtype=torch.float64, device="cpu", scale=1.0).requires_grad_()
    text = rand(6, 3, dtype=torch.float64, device="cpu", seed=1, scale=1.0).requires_grad_()
    scale = torch.tensor(1.7, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([2, 0, 1, 5, 3, 4])
    fn = lambda i, t, s: tiledlse.contrastive_loss(i, t, s, labels=labels, symmetric=symmetric)
    assert torch.autograd.gradcheck(fn, (image, text, scale))


# ---- Bad input: a TypeError or ValueError naming the argument --------------------------------


def ce_inputs(device="cpu"):
    return (rand(N, D, dtype=torch.float32, device=device), rand(V, D, dtype=torch.float32, device=device),
            torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(0)).to(device))


@pytest.mark.parametrize(
    "change, error, pattern",
    [
        (lambda e, c, t: (e, c.half(), t, {}), TypeError, "'c' has dtype torch.float16 but 'e' has torch.float32"),
        (lambda e, c, t: (e.int(), c, t, {}), TypeError, "'e' has dtype torch.int32"),
        (lambda e, c, t: (e, c, t.int(), {}), TypeError, "'targets' must have dtype torch.int64"),
        (lambda e, c, t: (e, c, t.float(), {}), TypeError, "'targets'"),
        (lambda e, c, t: (e.numpy(), c, t, {}), TypeError, "'e' must be a torch.Tensor"),
        (lambda e, c, t: (e, c.t().contiguous().t(), t, {}), ValueError, "'c' must be contiguous"),
        (lambda e, c, t: (e[:, :5], c[:, :5], t, {}), ValueError, "'e' must be contiguous"),
        (lambda e, c, t: (e, c[:, :5].contiguous(), t, {}), ValueError, "'c' has 5 columns but 'e' has D = 19"),
        (lambda e, c, t: (e, c, t[:-1], {}), ValueError, "'targets' has shape"),
        (lambda e, c, t: (e, c, t, {"bias": torch.zeros(V + 1)}), ValueError, "'bias' has 54 entries"),
        (lambda e, c, t: (e, c, t, {"bias": torch.zeros(V, dtype=torch.float64)}), TypeError, "'bias' has dtype"),
        (lambda e, c, t: (e, c, t.index_fill(0, torch.tensor([7]), V), {}), ValueError,
         r"'targets' has targets\[7\] = 53, outside \[0, 53\)"),
        (lambda e, c, t: (e, c, t.index_fill(0, torch.tensor([3]), -5), {}), ValueError, "'targets'"),
        (lambda e, c, t: (e, c, t, {"reduction": "avg"}), ValueError, "'reduction'"),
        (lambda e, c, t: (e, c, t, {"shift": -1}), ValueError, "'shift'"),
        (lambda e, c, t: (e, c, t, {"softcap": -1.0}), ValueError, "'softcap'"),
        (lambda e, c, t: (e, c, t, {"z_loss": float("nan")}), ValueError, "'z_loss'"),
        (lambda e, c, t: (e, c, t, {"softcap": "30"}), TypeError, "'softcap' must be a number"),
        (lambda e, c, t: (e, c, t, {"filter_eps": 2.0}), ValueError, "'filter_eps'"),
        (lambda e, c, t: (e, c, t, {"filter_eps": "exact"}), TypeError, "'filter_eps'"),
        (lambda e, c, t: (e, c, t, {"ignore_index": 3}), ValueError, "'ignore_index'"),
        (lambda e, c, t: (e, c, t, {"memory_budget": 0}), ValueError, "'memory_budget' must be None or a positive"),
        (lambda e, c, t: (e, c, t, {"memory_budget": 1.5e9}), ValueError, "'memory_budget'"),
        (lambda e, c, t: (e, c, t, {"precision": "fp32"}), ValueError, "'precision' must be 'exact' or 'tf32'"),
    ],
)
def test_cross_entropy_bad_input(change, error, pattern):
    e, c, t, kwargs = change(*ce_inputs())
    with pytest.raises(error, match=pattern):
        tiledlse.linear_cross_entropy(e, c, t, **kwargs)


@pytest.mark.parametrize(
    "change, error, pattern",
    [
        (lambda i, t, s: (i, t.double(), s, {}), TypeError, "'text' has dtype torch.float64 but 'image'"),
        (lambda i, t, s: (i, t[:-1], s, {}), ValueError, "'text' has shape"),
        (lambda i, t, s: (i.t(), t.t(), s, {}), ValueError, "'image' must be contiguous"),
        (lambda i, t, s: (i, t, -1.0, {}), ValueError, "'scale' must be finite and >= 0"),
        (lambda i, t, s: (i, t, torch.ones(2), {}), ValueError, "'scale' must be a floating-point tensor of one"),
        (lambda i, t, s: (i, t, "2", {}), TypeError, "'scale'"),
        (lambda i, t, s: (i, t, s, {"labels": torch.arange(8, dtype=torch.int32)}), TypeError, "'labels'"),
        (lambda i, t, s: (i, t, s, {"labels": torch.arange(7)}), ValueError, "'labels' has 7 entries"),
        (lambda i, t, s: (i, t, s, {"labels": torch.arange(8) + 1}), ValueError,
         r"'labels' has labels\[7\] = 8, outside \[0, 8\)"),
        (lambda i, t, s: (i, t, s, {"memory_budget": -1}), ValueError, "'memory_budget'"),
        (lambda i, t, s: (i, t, s, {"precision": None}), ValueError, "'precision' must be 'exact' or 'tf32'"),
    ],
)
def test_contrastive_bad_input(change, error, pattern):
    image, text = rand(8, 8, dtype=torch.float32, device="cpu"), rand(8, 8, dtype=torch.float32, device="cpu", seed=1)
    i, t, s, kwargs = change(image, text, torch.tensor(2.0))
    with pytest.raises(error, match=pattern):
        tiledlse.contrastive_loss(i, t, s, **kwargs)


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a GPU and a CUDA build of libtiledlse_c")
def test_device_mismatch():
    e, c, t = ce_inputs("cuda")
    with pytest.raises(ValueError, match="'c' is on cpu but 'e' is on cuda"):
        tiledlse.linear_cross_entropy(e, c.cpu(), t)
    with pytest.raises(ValueError, match="'targets' is on cpu but 'e' is on cuda"):
        tiledlse.linear_cross_entropy(e, c, t.cpu())
    with pytest.raises(ValueError, match="'text' is on cpu but 'image' is on cuda"):
        tiledlse.contrastive_loss(e, e.cpu(), 1.0)


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a GPU and a CUDA build of libtiledlse_c")
def test_cuda_runs_on_the_current_stream():
    """Work is ordered on torch's current stream: a side stream's result is ready after its sync."""
    e, c, t = ce_inputs("cuda")
    expected = tiledlse.linear_cross_entropy(e, c, t).item()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        loss = tiledlse.linear_cross_entropy(e, c, t)
    stream.synchronize()
    assert math.isclose(loss.item(), expected, rel_tol=1e-6)


def test_inputs_used_in_place():
    """No copies: the library reads the caller's memory (a change shows in the next result)."""
    e, c, t = ce_inputs()
    first = tiledlse.linear_cross_entropy(e, c, t).item()
    c.mul_(2)
    assert tiledlse.linear_cross_entropy(e, c, t).item() != first


# ---- The training step in one call (fused_step): gradients computed in the forward, kept -------


def calls_made(run, names=("cross_entropy_forward", "cross_entropy_backward", "cross_entropy_with_gradients")):
    """Runs `run()` and returns the names of the _calls functions among `names` it called, in
    order: which path ran."""
    originals = {name: getattr(_calls, name) for name in names}

    def spy(name):
        def call(*args, **kwargs):
            made.append(name)
            return originals[name](*args, **kwargs)
        return call

    made = []
    for name in names:
        setattr(_calls, name, spy(name))
    try:
        run()
    finally:
        for name in names:
            setattr(_calls, name, originals[name])
    return made


STEP = ["cross_entropy_with_gradients"]
PAIR = ["cross_entropy_forward", "cross_entropy_backward"]


def step_inputs(dtype, device, bias_grad=False):
    e = rand(N, D, dtype=dtype, device=device, seed=11, scale=1.0).requires_grad_()
    c = rand(V, D, dtype=dtype, device=device, seed=12, scale=1.0).requires_grad_()
    bias = rand(V, dtype=dtype, device=device, seed=13).requires_grad_(bias_grad)
    targets = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(14))
    targets[::4] = -100
    return e, c, bias, targets.to(device)


def loss_and_grads(e, c, bias, targets, upstream=1.0, **kwargs):
    """(loss, its gradients for each of e, c, bias that requires one, the library calls made by
    the forward and the backward). The backward runs again (retain_graph): the same gradients."""
    out = {}
    leaves = [x for x in (e, c, bias) if x is not None and x.requires_grad]

    def run():
        loss = out["loss"] = tiledlse.linear_cross_entropy(e, c, targets, bias=bias, **kwargs)
        if leaves:
            out["root"] = loss if upstream == 1.0 and loss.dim() == 0 else (loss * upstream).sum()
            out["grads"] = torch.autograd.grad(out["root"], leaves, retain_graph=True)
    made = calls_made(run)
    if leaves:
        again = torch.autograd.grad(out["root"], leaves)
        assert all(torch.equal(a, b) for a, b in zip(again, out["grads"]))
    return out["loss"], out.get("grads", ()), made


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("upstream", [1.0, 0.37], ids=["loss.backward", "scaled"])
def test_fused_step_matches_forward_backward(device, dtype, reduction, upstream):
    e, c, bias, targets = step_inputs(dtype, device)
    kwargs = dict(softcap=5.0, z_loss=1e-3, reduction=reduction, filter_eps=None, upstream=upstream)
    loss, grads, made = loss_and_grads(e, c, bias, targets, fused_step=True, **kwargs)
    ref_loss, ref_grads, ref_made = loss_and_grads(e, c, bias, targets, fused_step=False, **kwargs)
    assert made == STEP and ref_made == PAIR
    assert loss.dtype == ref_loss.dtype and loss.shape == ()
    close(loss, ref_loss, LOSS_RTOL[dtype], "loss")
    for name, got, ref in zip(("dE", "dC"), grads, ref_grads):
        assert got.dtype == dtype and got.device == e.device
        close(got, ref, GRAD_RTOL[dtype], name)
    assert grads[0][targets == -100].abs().max().item() == 0.0  # ignored rows get no gradient


@pytest.mark.parametrize("device", DEVICES)
def test_fused_step_with_the_gradient_filter(device):
    """Filtered gradients: the step's backward half sorts no vocabulary; within the filter's bound."""
    e, c, _, targets = step_inputs(torch.float32, device)
    _, grads, made = loss_and_grads(e, c, None, targets, fused_step=True)
    _, exact, _ = loss_and_grads(e, c, None, targets, fused_step=False, filter_eps=None)
    assert made == STEP
    for name, got, ref in zip(("dE", "dC"), grads, exact):
        close(got, ref, 2 * GRAD_RTOL[torch.float32], name)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_step_auto_falls_back(device):
    e, c, bias, targets = step_inputs(torch.float32, device, bias_grad=True)
    # A bias gradient: the forward and the backward (auto); True makes the step compute it too.
    loss, grads, made = loss_and_grads(e, c, bias, targets, filter_eps=None)
    step_loss, step_grads, step_made = loss_and_grads(e, c, bias, targets, filter_eps=None, fused_step=True)
    assert made == PAIR and step_made == STEP and len(grads) == len(step_grads) == 3
    close(step_loss, loss, LOSS_RTOL[torch.float32], "loss")
    for name, got, ref in zip(("dE", "dC", "dbias"), step_grads, grads):
        close(got, ref, GRAD_RTOL[torch.float32], name)
    # Per-row losses, the LSE, no gradient needed: the pair, or the forward alone.
    assert loss_and_grads(e, c, None, targets, reduction="none", upstream=0.5)[2] == PAIR
    assert calls_made(lambda: tiledlse.linear_cross_entropy(e, c, targets, return_lse=True)[0].backward()) == PAIR
    with torch.no_grad():
        assert calls_made(lambda: tiledlse.linear_cross_entropy(e, c, targets)) == ["cross_entropy_forward"]
    assert loss_and_grads(e.detach(), c.detach(), None, targets)[2] == ["cross_entropy_forward"]
    assert loss_and_grads(e, c, None, targets, fused_step=False)[2] == PAIR
    # One of e and c: the step computes only its gradient.
    loss, grads, made = loss_and_grads(e.detach(), c, bias.detach(), targets, fused_step=True)
    assert made == STEP and len(grads) == 1 and grads[0].shape == c.shape


@pytest.mark.skipif("cuda" not in DEVICES or not _functions.CUSTOM_OPS,
                    reason="needs a GPU, a CUDA build of libtiledlse_c and torch.library.custom_op")
def test_fused_step_backward_allocates_nothing():
    """loss.backward() of the step (the custom op) hands over the gradients the forward computed:
    no pass over them and no memory, not even zeros for the op's gradient outputs, which no
    gradient flows into (autograd materializes such zeros unless told not to: dC's size per step)."""
    e = rand(64, 64, dtype=torch.bfloat16, device="cuda", seed=1, scale=1.0).requires_grad_()
    c = rand(4096, 64, dtype=torch.bfloat16, device="cuda", seed=2, scale=1.0).requires_grad_()
    targets = torch.randint(0, 4096, (64,), generator=torch.Generator().manual_seed(3)).cuda()
    loss = tiledlse.linear_cross_entropy(e, c, targets, fused_step=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    loss.backward()
    torch.cuda.synchronize()
    grown = torch.cuda.max_memory_allocated() - before
    assert grown < c.numel() * c.element_size() // 8, grown  # dC is 512 KiB
    assert e.grad is not None and c.grad is not None and e.grad.abs().sum().item() > 0


def library_answers(fused, run):
    """Runs `run()` with _calls.step_fuses answering `fused` (as the library on a Hopper GPU with a
    large memory_budget would); returns the (N, V, D, need_bias) of each question asked."""
    original, asked = _calls.step_fuses, []

    def answer(e, c, config, need_bias):
        asked.append((e.shape[0], c.shape[0], e.shape[1], need_bias))
        return fused
    _calls.step_fuses = answer
    try:
        run()
    finally:
        _calls.step_fuses = original
    return asked


@pytest.mark.parametrize("device", DEVICES)
def test_fused_step_auto_asks_the_library(device):
    """Auto takes the step only where the library runs it fused: never on CPU (the pair, with no
    gradients computed in the forward); fused_step=True still forces it."""
    e, c, bias, targets = step_inputs(torch.bfloat16, device)
    for budget in (None, 1 << 40):  # the default, and one that holds every row's logits
        config = _functions._cross_entropy_arguments(e, c, targets, bias, -100, None, "mean", 0, "auto", 0.0,
                                                     budget)[2]
        fuses = _calls.step_fuses(e, c, config, False)
        assert not (fuses and device == "cpu")
        assert loss_and_grads(e, c, bias, targets, memory_budget=budget)[2] == (STEP if fuses else PAIR), budget
        assert loss_and_grads(e, c, bias, targets, memory_budget=budget, fused_step=True)[2] == STEP
    # Where the library says fused, auto takes the step, asking once with the call's shapes and
    # whether bias needs a gradient; where it says not, the pair.
    for fused, expected in ((True, STEP), (False, PAIR)):
        made = []
        asked = library_answers(fused, lambda: made.extend(loss_and_grads(e, c, bias, targets)[2]))
        assert made == expected and asked == [(N, V, D, False)], (fused, made, asked)
    asked = library_answers(False, lambda: loss_and_grads(e, c, bias.detach().requires_grad_(), targets))
    assert asked == [(N, V, D, True)]
    # No question where the step cannot be taken anyway.
    assert library_answers(True, lambda: loss_and_grads(e, c, bias, targets, reduction="none", upstream=0.5)) == []
    assert library_answers(True, lambda: loss_and_grads(e.detach(), c.detach(), bias, targets)) == []


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        ({"fused_step": True, "reduction": "none"}, ValueError, "'fused_step' is True, but .* per-row losses"),
        ({"fused_step": True, "return_lse": True}, ValueError, r"'fused_step' is True, but .* the LSE"),
        ({"fused_step": "yes"}, TypeError, "'fused_step' must be None, True or False"),
    ],
)
def test_fused_step_bad_input(kwargs, error, pattern):
    e, c, targets = ce_inputs()
    with pytest.raises(error, match=pattern):
        tiledlse.linear_cross_entropy(e.requires_grad_(), c, targets, **kwargs)


def test_fused_step_gradcheck_and_no_double_backward():
    e = rand(2, 5, 4, dtype=torch.float64, device="cpu", scale=1.0).requires_grad_()
    c = rand(7, 4, dtype=torch.float64, device="cpu", seed=1, scale=1.0).requires_grad_()
    targets = torch.tensor([[1, 6, -100, 0, 3], [2, 2, 5, -100, 4]])
    for kwargs in ({}, {"softcap": 2.0, "z_loss": 0.1, "shift": 1}, {"reduction": "sum"}):
        fn = lambda e, c: tiledlse.linear_cross_entropy(e, c, targets, filter_eps=None, fused_step=True, **kwargs)
        assert torch.autograd.gradcheck(fn, (e, c)), kwargs
    de, = torch.autograd.grad(tiledlse.linear_cross_entropy(e, c, targets), e, create_graph=True)
    with pytest.raises(RuntimeError):  # as the forward and backward pair: the gradient has no graph
        de.sum().backward()
