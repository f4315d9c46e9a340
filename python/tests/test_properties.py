"""Property tests (hypothesis): tiledlse.linear_cross_entropy and tiledlse.contrastive_loss on
random shapes (1 to a few tiles, batched or not), dtypes, options and data against plain PyTorch in
float64, loss and gradients, on CPU (and CUDA when the library and torch have it).

Each result must lie within the error model of the unit tests (unit_tests/test_support.hpp),
evaluated on the example itself: with u the unit roundoff of the accumulator (float32, float64 for
float64 inputs), `delta` the error of one logit (4 sqrt(D) u scale |a| |b| + 4 u (|bias| + softcap)),
  lse  : delta + 4 u (|lse| + sqrt(V)),
  grads: (4 delta + 8 u sqrt(terms) + u_out) mag + u_out |ref| (+ the filter's share, see below)
where mag sums the magnitudes of a gradient's terms and u_out is the 16-bit output rounding; every
bound is doubled. With a softcap, the derivative 1 - (x / softcap)^2 is computed from the rounded
logit: it adds an absolute error of 2 delta / softcap + 5u to each term (the gradient filter adds
eps(dtype)/32 per dropped term). TLSE_HYPOTHESIS_EXAMPLES sets the examples per property (default 60).
"""
import math
import os

import pytest
import torch
import torch.nn.functional as F

import tiledlse
from tiledlse import _library

try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # e.g. a GPU machine with PyTorch only: the properties are skipped
    given = None

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
DEVICES = ["cpu"]
if _library.device_available(_library.DEVICE_CUDA) and torch.cuda.is_available():
    DEVICES.append("cuda")
EXAMPLES = int(os.environ.get("TLSE_HYPOTHESIS_EXAMPLES", "60"))

U_ACC = {torch.float64: 2.0**-53}  # float32 otherwise
U_OUT = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
FLOOR = {torch.float16: 2.0**-24, torch.float64: 2.0**-1022}  # 2^-126 otherwise
FILTER_EPS = {torch.float32: 2.0**-28, torch.float64: 2.0**-57, torch.bfloat16: 2.0**-12, torch.float16: 2.0**-15}


def roundoff(dtype):
    return U_ACC.get(dtype, 2.0**-24), U_OUT.get(dtype, 0.0), FLOOR.get(dtype, 2.0**-126)


def within(what, got, ref, tol, example):
    got, ref, tol = got.double().cpu(), ref.double().cpu(), torch.as_tensor(tol, dtype=torch.float64).cpu()
    assert got.shape == ref.shape, "%s: shape %s, expected %s" % (what, tuple(got.shape), tuple(ref.shape))
    err = (got - ref).abs()
    bad = ~(err <= tol)
    if bad.any():
        k = int(bad.reshape(-1).nonzero()[0])
        raise AssertionError("%s[%d] = %r, reference %r +- %r (%s)" % (
            what, k, got.reshape(-1)[k].item(), ref.reshape(-1)[k].item(), tol.expand_as(ref).reshape(-1)[k].item(),
            example))


def tensor(shape, dtype, device, seed, scale):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(device)


def row_norm_max(x):
    return x.double().reshape(-1, x.shape[-1]).norm(dim=1).max().item() if x.numel() else 0.0


if given is None:

    @pytest.mark.skipif(True, reason="hypothesis is not installed")
    def test_properties_need_hypothesis():
        pass

else:
    PROPERTY = settings(max_examples=EXAMPLES, deadline=None, database=None, print_blob=True,
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

    @st.composite
    def cross_entropy_examples(draw):
        v = draw(st.integers(1, 70))
        shape = draw(st.sampled_from([(draw(st.integers(1, 40)),), (draw(st.integers(1, 3)), draw(st.integers(1, 12)))]))
        return dict(
            device=draw(st.sampled_from(DEVICES)), dtype=draw(st.sampled_from(DTYPES)), shape=shape, v=v,
            d=draw(st.integers(1, 40)), scale=draw(st.sampled_from([0.1, 1.0, 3.0])), bias=draw(st.booleans()),
            ignore_index=draw(st.sampled_from([-100, -1, v + 3])), ignore_share=draw(st.sampled_from([0.0, 0.3, 1.0])),
            softcap=draw(st.one_of(st.none(), st.floats(0.5, 50.0))), reduction=draw(st.sampled_from(["mean", "sum", "none"])),
            shift=draw(st.integers(0, 3)), z_loss=draw(st.sampled_from([0.0, 1e-4, 0.05])),
            filter_eps=draw(st.sampled_from([None, None, "auto"])), seed=draw(st.integers(0, 2**31 - 1)))

    def cross_entropy_reference(e, c, targets, bias, x):
        """Loss, LSE (float64, through autograd for the gradients) and the gradients' magnitudes."""
        length = targets.shape[-1]
        t = torch.full_like(targets, x["ignore_index"])
        if x["shift"] < length:
            t[..., : length - x["shift"]] = targets[..., x["shift"]:]
        t = t.reshape(-1)
        valid = t != x["ignore_index"]
        z = e.reshape(-1, e.shape[-1]) @ c.T + (0 if bias is None else bias)
        logits = x["softcap"] * torch.tanh(z / x["softcap"]) if x["softcap"] else z
        lse = torch.logsumexp(logits, dim=1)
        picked = logits.gather(1, t.clamp(0, c.shape[0] - 1)[:, None])[:, 0]
        rows = torch.where(valid, lse - picked + x["z_loss"] * lse**2, torch.zeros_like(lse))
        active = int(valid.sum())
        if x["reduction"] == "none":
            loss = rows.view(targets.shape)
        else:
            loss = rows.sum() / (max(active, 1) if x["reduction"] == "mean" else 1)
        lse = torch.where(valid, lse, torch.zeros_like(lse))
        return dict(loss=loss, lse=lse.view(targets.shape), rows=rows, logits=logits, t=t, valid=valid, active=active)

    def cross_entropy_tolerances(e, c, bias, x, ref, upstream):
        """The error model of the module docstring for this example."""
        loss, lse, logits, t, valid, active = (ref[k] for k in ("loss", "lse", "logits", "t", "valid", "active"))
        u, u_out, floor = roundoff(x["dtype"])
        n, v, d = logits.shape[0], logits.shape[1], e.shape[-1]
        bias_max = bias.abs().max().item() if bias is not None else 0.0
        delta = 4 * math.sqrt(d) * u * row_norm_max(e) * row_norm_max(c) + 4 * u * (bias_max + (x["softcap"] or 0))
        lse_flat = lse.detach().reshape(-1)
        lse_tol = 2 * (delta + 4 * u * (lse_flat.abs() + math.sqrt(v + 1)))
        row_tol = lse_tol * (1 + 2 * x["z_loss"] * lse_flat.abs()) + 2 * delta
        weight = 1.0 / max(active, 1) if x["reduction"] == "mean" else 1.0
        if x["reduction"] == "none":
            loss_tol = (row_tol * valid).view(loss.shape) + 8 * u * loss.detach().abs()
        else:  # and the summation's rounding, n u sum |row|
            loss_tol = weight * ((row_tol * valid).sum() + 2 * n * u * ref["rows"].detach().abs().sum())
        # |dL/dz| term by term: coef (|1 + 2 z lse| p + [j = t]) |cap'|, coef = upstream * weight.
        up = upstream.reshape(-1) if x["reduction"] == "none" else upstream.reshape(1).expand(n)
        coef = (up.abs() * weight * valid).double()[:, None]
        x_ = logits.detach()
        p = torch.softmax(x_, dim=1)
        onehot = F.one_hot(t.clamp(0, v - 1), v).double() * valid[:, None]
        cap = (1 - (x_ / x["softcap"]) ** 2).abs() if x["softcap"] else torch.ones_like(x_)
        terms_abs = coef * ((1 + 2 * x["z_loss"] * lse_flat.abs())[:, None] * p + onehot)
        gabs = terms_abs * cap
        e2, c2 = e.detach().reshape(-1, d).abs(), c.detach().abs()
        mags = {"dE": gabs @ c2, "dC": gabs.T @ e2, "dbias": gabs.sum(0)}
        # The softcap's derivative 1 - (x / softcap)^2 comes from the rounded logit x: an absolute
        # error of 2 delta / softcap + 5u, large next to the derivative where the tanh saturates.
        cap_err = terms_abs * (2 * delta / x["softcap"] + 5 * u) if x["softcap"] else torch.zeros_like(x_)
        # The default filter drops softmax entries below eps(dtype)/32: at most eps * coef * |other|.
        if x["filter_eps"] == "auto":
            drop = FILTER_EPS[x["dtype"]] * coef * (1 + 2 * x["z_loss"] * lse_flat.abs())[:, None] * torch.ones_like(p)
            filtered = {"dE": drop @ c2, "dC": drop.T @ e2, "dbias": drop.sum(0)}
        else:
            filtered = {k: 0.0 for k in mags}
        filtered = {"dE": filtered["dE"] + cap_err @ c2, "dC": filtered["dC"] + cap_err.T @ e2,
                    "dbias": filtered["dbias"] + cap_err.sum(0)}
        terms = math.sqrt(max(n, v) + 1)
        grad_tol = {k: 2 * ((4 * delta + 8 * u * terms + u_out) * m + filtered[k]) for k, m in mags.items()}
        return loss_tol, lse_tol.view(lse.shape), grad_tol, u_out, floor

    @PROPERTY
    @given(cross_entropy_examples())
    def test_cross_entropy_property(x):
        dev, dtype, seed = x["device"], x["dtype"], x["seed"]
        shape, v, d = x["shape"], x["v"], x["d"]
        e = tensor(shape + (d,), dtype, dev, seed, x["scale"]).requires_grad_()
        c = tensor((v, d), dtype, dev, seed + 1, 1.0).requires_grad_()
        bias = tensor((v,), dtype, dev, seed + 2, 1.0).requires_grad_() if x["bias"] else None
        g = torch.Generator().manual_seed(seed + 3)
        targets = torch.randint(0, v, shape, generator=g)
        targets[torch.rand(shape, generator=g) < x["ignore_share"]] = x["ignore_index"]
        targets = targets.to(dev)
        loss, lse = tiledlse.linear_cross_entropy(
            e, c, targets, bias=bias, ignore_index=x["ignore_index"], softcap=x["softcap"], reduction=x["reduction"],
            shift=x["shift"], z_loss=x["z_loss"], filter_eps=x["filter_eps"], return_lse=True)
        upstream = (torch.rand(loss.shape, generator=g, dtype=torch.float64) + 0.5).to(dev)
        leaves = [t for t in (e, c, bias) if t is not None]
        grads = torch.autograd.grad((loss * upstream.to(loss.dtype)).sum(), leaves)

        ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
        re, rc, rb = ref_leaves[0], ref_leaves[1], ref_leaves[2] if bias is not None else None
        ref = cross_entropy_reference(re, rc, targets, rb, x)
        ref_grads = torch.autograd.grad((ref["loss"] * upstream).sum(), ref_leaves)
        loss_tol, lse_tol, grad_tol, u_out, floor = cross_entropy_tolerances(re, rc, rb, x, ref, upstream)

        assert loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
        within("loss", loss, ref["loss"], loss_tol, x)
        within("lse", lse, ref["lse"], lse_tol, x)
        for name, got, want in zip(("dE", "dC", "dbias"), grads, ref_grads):
            assert got.dtype == dtype and got.shape == want.shape
            tol = grad_tol[name].view(want.shape) + 2 * u_out * want.abs() + floor
            within(name, got, want, tol, x)

    @st.composite
    def contrastive_examples(draw):
        b = draw(st.integers(1, 48))
        labels = draw(st.sampled_from(["diagonal", "permutation", "any"]))
        return dict(device=draw(st.sampled_from(DEVICES)), dtype=draw(st.sampled_from(DTYPES)), b=b,
                    c=draw(st.integers(1, 32)), scale=draw(st.one_of(st.sampled_from([0.0, 1.0, 14.3]), st.floats(0, 100))),
                    normalize=draw(st.booleans()), labels=labels, symmetric=draw(st.booleans()),
                    seed=draw(st.integers(0, 2**31 - 1)))

    @PROPERTY
    @given(contrastive_examples())
    def test_contrastive_property(x):
        dev, dtype, seed, b, c = x["device"], x["dtype"], x["seed"], x["b"], x["c"]
        image, text = tensor((b, c), torch.float64, "cpu", seed, 1.0), tensor((b, c), torch.float64, "cpu", seed + 1, 1.0)
        if x["normalize"]:
            image, text = F.normalize(image, dim=1), F.normalize(text, dim=1)
        image = image.to(dtype).to(dev).requires_grad_()
        text = text.to(dtype).to(dev).requires_grad_()
        g = torch.Generator().manual_seed(seed + 2)
        labels = {"diagonal": None, "permutation": torch.randperm(b, generator=g),
                  "any": torch.randint(0, b, (b,), generator=g)}[x["labels"]]
        labels = labels.to(dev) if labels is not None else None
        scale = torch.tensor(x["scale"], dtype=torch.float64, device=dev, requires_grad=True)
        loss = tiledlse.contrastive_loss(image, text, scale, labels=labels, symmetric=x["symmetric"])
        grads = torch.autograd.grad(loss * 1.25, (image, text, scale))

        ri, rt = image.detach().double().requires_grad_(), text.detach().double().requires_grad_()
        rs = scale.detach().double().requires_grad_()
        pos = torch.arange(b, device=dev) if labels is None else labels
        logits = rs * ri @ rt.T
        ref = F.cross_entropy(logits, pos)
        if x["symmetric"]:
            ref = (ref + F.cross_entropy(logits.T, pos)) / 2
        ref_grads = torch.autograd.grad(ref * 1.25, (ri, rt, rs))

        u, u_out, floor = roundoff(dtype)
        s = x["scale"]
        delta = 4 * math.sqrt(c) * u * s * row_norm_max(ri) * row_norm_max(rt)
        xl = logits.detach()
        row_lse, col_lse = torch.logsumexp(xl, 1), torch.logsumexp(xl, 0)
        lse_tol = 2 * (delta + 4 * u * (torch.cat([row_lse, col_lse]).abs().max().item() + math.sqrt(b + 1)))
        within("loss", loss, ref, 2 * lse_tol + 2 * delta + 8 * u * abs(ref.item()), x)
        # |dL/dx| term by term: row and column softmax and the positives, weighted as the loss.
        wr, wc = (0.5, 0.5) if x["symmetric"] else (1.0, 0.0)
        onehot = F.one_hot(pos, b).double()
        gabs = 1.25 / b * (wr * (torch.softmax(xl, 1) + onehot) + wc * (torch.softmax(xl, 0) + onehot.T))
        terms = math.sqrt(b + 1)
        for name, got, want, other in (("dI", grads[0], ref_grads[0], rt), ("dT", grads[1], ref_grads[1], ri)):
            g_ = gabs if name == "dI" else gabs.T
            mag = s * g_ @ other.detach().abs()
            within(name, got, want, 2 * ((4 * delta + 8 * u * terms + u_out) * mag + u_out * want.abs()) + floor, x)
        dscale_mag = (gabs * (ri.detach() @ rt.detach().T).abs()).sum().item()
        within("dscale", grads[2], ref_grads[2], 2 * (4 * delta + 8 * u * (b + 1)) * dscale_mag + 2.0**-126, x)
