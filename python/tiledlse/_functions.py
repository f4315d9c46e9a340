"""torch.autograd.Function wrappers over the C API: tensors are passed by data_ptr (no copies),
on CPU or on the context's CUDA device, on torch's current CUDA stream."""
import ctypes
import math

import torch
from torch.autograd.function import once_differentiable

from . import _library as L

_DTYPES = {torch.float32: L.F32, torch.float64: L.F64, torch.bfloat16: L.BF16, torch.float16: L.F16}


def _acc_dtype(dtype):
    """Losses and LSEs are computed and returned in the accumulator type."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _ptr(t):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def _check_tensor(name, t, like=None, like_name=None, dtype=None, ndim=None):
    """Type, dtype, device, rank and contiguity of argument `name`; `like` gives the dtype and
    device it must share."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("argument '%s' must be a torch.Tensor, got %s" % (name, type(t).__name__))
    if dtype is not None and t.dtype != dtype:
        raise TypeError("argument '%s' must have dtype %s, got %s" % (name, dtype, t.dtype))
    if like is not None and dtype is None and t.dtype != like.dtype:
        raise TypeError("argument '%s' has dtype %s but '%s' has %s" % (name, t.dtype, like_name, like.dtype))
    if dtype is None and like is None and t.dtype not in _DTYPES:
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


def _cuda_device_for_context():
    """The CUDA device Kokkos is initialized on: torch's current device when the library has CUDA."""
    if not L.device_available(L.DEVICE_CUDA):
        return -1
    if not torch.cuda.is_available():
        raise L.TiledLSEError(
            "tiledlse: %s was built for CUDA but torch sees no GPU; use a host build of the library"
            % L.library_path
        )
    return torch.cuda.current_device()


def _launch(name, t):
    """(context, device, stream) for a call on tensor `t`."""
    if t.device.type == "cpu":
        return L.context(_cuda_device_for_context()), L.DEVICE_HOST, None
    if t.device.type != "cuda":
        raise ValueError("argument '%s' is on %s; tiledlse runs on cpu and cuda tensors" % (name, t.device))
    if not L.device_available(L.DEVICE_CUDA):
        raise ValueError(
            "argument '%s' is on %s but %s was built without CUDA" % (name, t.device, L.library_path)
        )
    ctx = L.context(t.device.index)
    device = L.context_cuda_device()
    if t.device.index != device:
        raise ValueError(
            "argument '%s' is on %s but tiledlse runs on cuda:%d (Kokkos is initialized once per process, "
            "on the device current at the first call)" % (name, t.device, device)
        )
    return ctx, L.DEVICE_CUDA, ctypes.c_void_p(torch.cuda.current_stream(t.device).cuda_stream)


def _lend_workspace(options, device, query, *args):
    """Lends the call its workspace from torch's allocator, so the library allocates nothing (on
    CUDA the caching allocator orders reuse on the stream). The tensor must outlive the call."""
    size = ctypes.c_size_t(0)
    L.call(query, *args, ctypes.byref(options), ctypes.byref(size))
    workspace = torch.empty((size.value,), dtype=torch.uint8, device=device)
    options.workspace, options.workspace_bytes = workspace.data_ptr(), size.value
    return workspace


def _number(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("argument '%s' must be a number, got %r" % (name, value))
    return float(value)


def _filter_eps(filter_eps):
    if filter_eps == "auto":
        return L.FILTER_EPS_AUTO
    if filter_eps is None:
        return 0.0
    if isinstance(filter_eps, str):
        raise TypeError("argument 'filter_eps' must be 'auto', None or a float, got %r" % (filter_eps,))
    return _number("filter_eps", filter_eps)


class _LinearCrossEntropy(torch.autograd.Function):
    """One device, or vocabulary-parallel when `comm` (a distributed._Communicator) is given:
    then c and bias are this rank's shard, and the calls are the C API's *_distributed ones."""

    @staticmethod
    def forward(ctx, e, c, bias, targets, options, want_order, comm=None):
        ctx_, device, stream = _launch("e", e)
        n, d = e.shape
        v = c.shape[0]
        acc = _acc_dtype(e.dtype)
        dtype = _DTYPES[e.dtype]
        loss = torch.empty((n,) if options.reduction == L.REDUCTIONS["none"] else (), dtype=acc, device=e.device)
        lse = torch.empty((n,), dtype=acc, device=e.device)
        order = torch.empty((v,), dtype=torch.int32, device=e.device) if want_order else None
        if comm is None:
            workspace = _lend_workspace(options, e.device, "tlse_cross_entropy_workspace_bytes", ctx_, device,
                                        stream, dtype, n, v, d)
            L.call("tlse_cross_entropy_forward", ctx_, device, stream, dtype, n, v, d, _ptr(e), _ptr(c),
                   _ptr(bias), _ptr(targets), _ptr(loss), _ptr(lse), _ptr(order), ctypes.byref(options))
        else:
            comm.call("tlse_cross_entropy_forward_distributed", ctx_, device, stream, dtype, n, v, d, _ptr(e),
                      _ptr(c), _ptr(bias), _ptr(targets), _ptr(loss), _ptr(lse), ctypes.byref(options))
        ctx.save_for_backward(e, c, bias, targets, lse, order)
        ctx.options, ctx.comm = options, comm
        ctx.mark_non_differentiable(lse)
        return loss, lse

    @staticmethod
    @once_differentiable  # the backward is not itself differentiable: double backward raises
    def backward(ctx, grad_loss, _grad_lse):
        e, c, bias, targets, lse, order = ctx.saved_tensors
        ctx_, device, stream = _launch("e", e)
        n, d = e.shape
        v = c.shape[0]
        options = ctx.options
        dloss = grad_loss.to(lse.dtype).contiguous()
        de = torch.empty_like(e) if ctx.needs_input_grad[0] else None
        dc = torch.empty_like(c) if ctx.needs_input_grad[1] else None
        dbias = torch.empty_like(bias) if bias is not None and ctx.needs_input_grad[2] else None
        if ctx.comm is None:
            workspace = _lend_workspace(options, e.device, "tlse_cross_entropy_workspace_bytes", ctx_, device,
                                        stream, _DTYPES[e.dtype], n, v, d)
            L.call("tlse_cross_entropy_backward", ctx_, device, stream, _DTYPES[e.dtype], n, v, d, _ptr(e), _ptr(c),
                   _ptr(bias), _ptr(targets), _ptr(lse), _ptr(order), _ptr(dloss), _ptr(de), _ptr(dc),
                   _ptr(dbias), ctypes.byref(options))
        else:
            ctx.comm.call("tlse_cross_entropy_backward_distributed", ctx_, device, stream, _DTYPES[e.dtype], n, v, d,
                          _ptr(e), _ptr(c), _ptr(bias), _ptr(targets), _ptr(lse), _ptr(dloss), _ptr(de), _ptr(dc),
                          _ptr(dbias), ctypes.byref(options))
        return de, dc, dbias, None, None, None, None


def linear_cross_entropy(e, c, targets, bias=None, ignore_index=-100, softcap=None, reduction="mean", shift=0,
                         return_lse=False, filter_eps="auto", z_loss=0.0):
    """Cross-entropy of the logits ``e @ c.T (+ bias)`` against ``targets`` without forming them.

    e: (..., D) embeddings; c: (V, D) classifier, same dtype and device (float32, float64,
    bfloat16, float16; cpu or cuda), contiguous; targets: int64 of shape e.shape[:-1], each in
    [0, V) or ignore_index; bias: (V) or None. softcap: logits become softcap*tanh(logit/softcap).
    shift: position t is scored against targets[..., t + shift] (next-token prediction without
    slicing); the last `shift` positions of each sequence are ignored. reduction: "mean" (over
    the rows not ignored), "sum" or "none" (shape e.shape[:-1]). filter_eps: gradient filter of
    the backward ("auto": eps(dtype)/32 as CCE; None or 0: exact). z_loss adds z_loss * lse^2.
    Returns the loss (float32, float64 for float64 inputs), and the per-row LSE (shape
    e.shape[:-1], no gradient, 0 for ignored rows) when return_lse.
    """
    e2, targets, options, batch_shape = _cross_entropy_arguments(e, c, targets, bias, ignore_index, softcap,
                                                                  reduction, shift, filter_eps, z_loss)
    # Sorting the vocabulary (forward) lets the backward's filter skip whole tiles of unlikely
    # classes; it costs a host sort of V entries, worth it only when filtering and training.
    want_order = options.filter_eps != 0 and torch.is_grad_enabled() and (e.requires_grad or c.requires_grad)
    loss, lse = _LinearCrossEntropy.apply(e2, c, bias, targets, options, want_order)
    return _cross_entropy_outputs(loss, lse, reduction, batch_shape, return_lse)


def _cross_entropy_arguments(e, c, targets, bias, ignore_index, softcap, reduction, shift, filter_eps, z_loss):
    """Checks linear_cross_entropy's arguments; returns (e as (N, D), targets as (N), options,
    the batch shape)."""
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
    if reduction not in L.REDUCTIONS:
        raise ValueError("argument 'reduction' must be 'mean', 'sum' or 'none', got %r" % (reduction,))
    if isinstance(shift, bool) or not isinstance(shift, int) or shift < 0:
        raise ValueError("argument 'shift' must be an int >= 0, got %r" % (shift,))
    if not isinstance(ignore_index, int):
        raise TypeError("argument 'ignore_index' must be an int, got %r" % (ignore_index,))

    batch_shape = e.shape[:-1]
    if shift and targets.dim() > 1:
        # The C API shifts along the flattened rows; with several sequences the last `shift`
        # positions of each one are ignored instead (a copy of the targets only).
        shifted = torch.full_like(targets, ignore_index)
        shifted[..., : max(targets.shape[-1] - shift, 0)] = targets[..., shift:]
        targets, shift = shifted, 0
    options = L.CrossEntropyOptions()
    options.ignore_index = ignore_index
    options.reduction = L.REDUCTIONS[reduction]
    options.shift = shift
    options.softcap = 0.0 if softcap is None else _number("softcap", softcap)
    options.z_loss = _number("z_loss", z_loss)
    options.filter_eps = _filter_eps(filter_eps)
    return e.reshape(-1, e.shape[-1]), targets.reshape(-1), options, batch_shape


def _cross_entropy_outputs(loss, lse, reduction, batch_shape, return_lse):
    """The flat results in the batch's shape."""
    if reduction == "none":
        loss = loss.view(batch_shape)
    lse = lse.view(batch_shape)
    return (loss, lse) if return_lse else loss


class _ContrastiveLoss(torch.autograd.Function):
    """One device, or over the ranks of `comm` (a distributed._Communicator): then image and
    text are this rank's rows of the global batch, and the calls are the *_distributed ones."""

    @staticmethod
    def forward(ctx, image, text, scale, labels, options, comm=None):
        ctx_, device, stream = _launch("image", image)
        b, c = image.shape
        acc = _acc_dtype(image.dtype)
        dtype = _DTYPES[image.dtype]
        loss = torch.empty((), dtype=acc, device=image.device)
        row_lse = torch.empty((b,), dtype=acc, device=image.device)
        col_lse = torch.empty((b,), dtype=acc, device=image.device) if options.direction == L.SYMMETRIC else None
        if comm is None:
            workspace = _lend_workspace(options, image.device, "tlse_contrastive_workspace_bytes", ctx_, device,
                                        stream, dtype, b, c)
            L.call("tlse_contrastive_forward", ctx_, device, stream, dtype, b, c, _ptr(image), _ptr(text),
                   _ptr(labels), _ptr(loss), _ptr(row_lse), _ptr(col_lse), ctypes.byref(options))
        else:
            comm.call("tlse_contrastive_forward_distributed", ctx_, device, stream, dtype, b, c, _ptr(image),
                      _ptr(text), _ptr(labels), _ptr(loss), _ptr(row_lse), _ptr(col_lse), ctypes.byref(options))
        ctx.save_for_backward(image, text, scale, labels, row_lse, col_lse)
        ctx.options, ctx.comm = options, comm
        return loss

    @staticmethod
    @once_differentiable  # the backward is not itself differentiable: double backward raises
    def backward(ctx, grad_loss):
        image, text, scale, labels, row_lse, col_lse = ctx.saved_tensors
        ctx_, device, stream = _launch("image", image)
        b, c = image.shape
        options = ctx.options
        dtype = _DTYPES[image.dtype]
        dloss = grad_loss.to(row_lse.dtype).contiguous()
        di = torch.empty_like(image) if ctx.needs_input_grad[0] else None
        dt = torch.empty_like(text) if ctx.needs_input_grad[1] else None
        dscale = torch.empty((), dtype=row_lse.dtype, device=image.device) if ctx.needs_input_grad[2] else None
        if ctx.comm is None:
            workspace = _lend_workspace(options, image.device, "tlse_contrastive_workspace_bytes", ctx_, device,
                                        stream, dtype, b, c)
            L.call("tlse_contrastive_backward", ctx_, device, stream, dtype, b, c, _ptr(image), _ptr(text),
                   _ptr(labels), _ptr(row_lse), _ptr(col_lse), _ptr(dloss), _ptr(di), _ptr(dt), _ptr(dscale),
                   ctypes.byref(options))
        else:
            ctx.comm.call("tlse_contrastive_backward_distributed", ctx_, device, stream, dtype, b, c, _ptr(image),
                          _ptr(text), _ptr(labels), _ptr(row_lse), _ptr(col_lse), _ptr(dloss), _ptr(di), _ptr(dt),
                          _ptr(dscale), ctypes.byref(options))
        if dscale is not None:
            dscale = dscale.to(device=scale.device, dtype=scale.dtype).reshape(scale.shape)
        return di, dt, dscale, None, None, None


def contrastive_loss(image, text, scale, labels=None, symmetric=True):
    """CLIP contrastive (InfoNCE) loss of logits ``scale * image @ text.T`` without forming them.

    image, text: (b, c) features, same dtype and device, contiguous. scale: the logit scale
    (1 / temperature), a tensor of one element that receives its gradient (e.g.
    ``logit_scale.exp()``) or a float; its value is read on the host. labels: int64 (b) or None:
    the positive of image i is text labels[i] and of text j image labels[j] (default i <-> i).
    symmetric: average of image-to-text and text-to-image (CLIP); False: image-to-text only.
    Returns a 0-d loss (float32, float64 for float64 inputs).
    """
    scale, options = _contrastive_arguments(image, text, scale, labels, symmetric)
    return _ContrastiveLoss.apply(image, text, scale, labels, options)


def _contrastive_arguments(image, text, scale, labels, symmetric):
    """Checks contrastive_loss's arguments; returns (scale as a tensor, options)."""
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
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1 or not scale.is_floating_point():
            raise ValueError("argument 'scale' must be a floating-point tensor of one element, got dtype %s shape %s"
                             % (scale.dtype, tuple(scale.shape)))
        value = float(scale.detach())
    elif isinstance(scale, (int, float)) and not isinstance(scale, bool):
        value = float(scale)
        scale = torch.tensor(value, dtype=torch.float64)
    else:
        raise TypeError("argument 'scale' must be a tensor or a float, got %s" % type(scale).__name__)
    if not math.isfinite(value) or value < 0:
        raise ValueError("argument 'scale' must be finite and >= 0, got %r" % value)
    options = L.ContrastiveOptions()
    options.scale = value
    options.direction = L.SYMMETRIC if symmetric else L.IMAGE_TO_TEXT
    return scale, options
