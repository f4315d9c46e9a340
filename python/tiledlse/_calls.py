"""The C API's forward and backward calls on tensors, shared by every front end (the
torch.library custom ops, the torch.autograd.Function path of older torch, tiledlse.distributed).

Tensors are passed by data_ptr (no copies), on CPU or on the context's CUDA device, on torch's
current CUDA stream. The options travel as plain Python numbers (CrossEntropyConfig), which
torch.compile can trace; the ctypes structures are built here, at call time.
"""
import ctypes
import math
from typing import NamedTuple

import torch

from . import _library as L

DTYPES = {torch.float32: L.F32, torch.float64: L.F64, torch.bfloat16: L.BF16, torch.float16: L.F16}


class CrossEntropyConfig(NamedTuple):
    """linear_cross_entropy's options, checked (tlse_cross_entropy_options' fields)."""
    ignore_index: int
    reduction: int  # L.REDUCTIONS value
    shift: int
    softcap: float  # 0: off
    z_loss: float
    filter_eps: float  # L.FILTER_EPS_AUTO, 0 (exact) or a value
    memory_budget: int = 0  # bytes of workspace a call may use; 0: the library's default
    precision: int = 0  # L.PRECISIONS value
    label_smoothing: float = 0.0


class DistillationConfig(NamedTuple):
    """distillation_loss's options, checked (tlse_distillation_options' fields)."""
    divergence: int  # L.DIVERGENCES value
    beta: float
    temperature: float
    alpha: float
    ignore_index: int
    shift: int
    reduction: int  # L.REDUCTIONS value
    memory_budget: int = 0  # bytes of workspace a call may use; 0: the library's default


def acc_dtype(dtype):
    """Losses and LSEs are computed and returned in the accumulator type."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _ptr(t):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


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


def launch(name, t):
    """(context, device, stream) for a call on tensor `t`."""
    if t.device.type == "cpu":
        return L.context(_cuda_device_for_context()), L.DEVICE_HOST, None
    if t.device.type != "cuda":
        raise ValueError("argument '%s' is on %s; tiledlse runs on cpu and cuda tensors" % (name, t.device))
    if not L.device_available(L.DEVICE_CUDA):
        raise ValueError(
            "argument '%s' is on %s but %s was built without CUDA; the CUDA build: scripts/wheel.sh --cuda, "
            "then pip install build-cuda/wheel/tiledlse-*.whl (docs/python.md)" % (name, t.device, L.library_path)
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


def _cross_entropy_options(config):
    options = L.CrossEntropyOptions()
    options.ignore_index, options.reduction, options.shift = config.ignore_index, config.reduction, config.shift
    options.softcap, options.z_loss, options.filter_eps = config.softcap, config.z_loss, config.filter_eps
    options.memory_budget, options.precision = config.memory_budget, config.precision
    options.label_smoothing = config.label_smoothing
    return options


def _extras(weight=None, dlse=None, predicted=None, accuracy=None):
    """tlse_cross_entropy_extras for the given tensors, or None (NULL) when none is given."""
    if weight is None and dlse is None and predicted is None and accuracy is None:
        return None
    return ctypes.byref(L.CrossEntropyExtras(*(None if t is None else t.data_ptr()
                                               for t in (weight, dlse, predicted, accuracy))))


def check_weight_values(weight):
    """linear_cross_entropy's class weights are finite and >= 0 (read on the host: one sync)."""
    bad = ~(torch.isfinite(weight) & (weight >= 0))
    if bool(bad.any()):
        j = int(bad.nonzero()[0, 0])
        raise ValueError("argument 'weight' has weight[%d] = %r; class weights must be finite and >= 0"
                         % (j, float(weight[j])))


def _loss_tensor(e, config):
    """The loss to be written: one per row of e with reduction "none", else 0-d."""
    shape = (e.shape[0],) if config.reduction == L.REDUCTIONS["none"] else ()
    return torch.empty(shape, dtype=acc_dtype(e.dtype), device=e.device)


def _gradient_tensors(e, c, bias, needs):
    """(dE, dC, dbias) to be written; None where `needs` (or a missing bias) says not computed."""
    return (torch.empty_like(e) if needs[0] else None, torch.empty_like(c) if needs[1] else None,
            torch.empty_like(bias) if bias is not None and needs[2] else None)


def step_fuses(e, c, config, need_bias):
    """Whether tlse_cross_entropy_with_gradients runs the step fused (3 products instead of the
    pair's 4) for e (N, D), c (V, D) on their device under `config`; need_bias: dbias asked for."""
    ctx, device, stream = launch("e", e)
    fused = ctypes.c_int(0)
    L.call("tlse_cross_entropy_step_fused", ctx, device, stream, DTYPES[e.dtype], e.shape[0], c.shape[0], e.shape[1],
           ctypes.byref(_cross_entropy_options(config)), int(need_bias), ctypes.byref(fused))
    return bool(fused.value)


def _cross_entropy_call(e, c, config):
    """What every cross-entropy call starts from: the context, device and stream of e's device,
    the sizes N, V, D, the dtype code and the options."""
    ctx, device, stream = launch("e", e)
    return ctx, device, stream, e.shape[0], c.shape[0], e.shape[1], DTYPES[e.dtype], _cross_entropy_options(config)


def cross_entropy_forward(e, c, bias, targets, weight, config, want_order, want_argmax, comm=None):
    """(loss, lse, vocabulary order, predicted, accuracy) of e (N, D), c (V, D) with class
    weights `weight` (V, the accumulator dtype) or None: the order is (V) int32 when want_order,
    predicted (N) int64 and accuracy 0-d when want_argmax, each else empty. With `comm` (a
    distributed._Communicator), c, bias and weight are this rank's shard."""
    ctx, device, stream, n, v, d, dtype, options = _cross_entropy_call(e, c, config)
    if weight is not None:
        check_weight_values(weight)
    loss = _loss_tensor(e, config)
    lse = torch.empty((n,), dtype=loss.dtype, device=e.device)
    order = torch.empty((v if want_order else 0,), dtype=torch.int32, device=e.device)
    predicted = torch.empty((n if want_argmax else 0,), dtype=torch.int64, device=e.device)
    accuracy = torch.empty(() if want_argmax else (0,), dtype=loss.dtype, device=e.device)
    extras = _extras(weight, None, predicted if want_argmax else None, accuracy if want_argmax else None)
    if comm is None:
        workspace = _lend_workspace(options, e.device, "tlse_cross_entropy_workspace_bytes", ctx, device, stream,
                                    dtype, n, v, d)  # must live through the call below
        L.call("tlse_cross_entropy_forward", ctx, device, stream, dtype, n, v, d, _ptr(e), _ptr(c), _ptr(bias),
               _ptr(targets), _ptr(loss), _ptr(lse), _ptr(order) if want_order else None, extras,
               ctypes.byref(options))
    else:
        comm.call("tlse_cross_entropy_forward_distributed", ctx, device, stream, dtype, n, v, d, _ptr(e), _ptr(c),
                  _ptr(bias), _ptr(targets), _ptr(loss), _ptr(lse), extras, ctypes.byref(options))
    return loss, lse, order, predicted, accuracy


def cross_entropy_backward(e, c, bias, targets, weight, lse, order, dloss, dlse, config, needs, comm=None):
    """(dE, dC, dbias) for the upstream gradients dloss (of the loss) and dlse (of the forward's
    LSE output, or None); `needs` says which of the three to compute (the others are None).
    `order` is the forward's (empty: not sorted); weight as for the forward."""
    ctx, device, stream, n, v, d, dtype, options = _cross_entropy_call(e, c, config)
    dloss = dloss.to(lse.dtype).contiguous()
    dlse = None if dlse is None else dlse.to(lse.dtype).contiguous()
    de, dc, dbias = _gradient_tensors(e, c, bias, needs)
    order = order if order is not None and order.numel() else None
    extras = _extras(weight, dlse)
    if comm is None:
        workspace = _lend_workspace(options, e.device, "tlse_cross_entropy_workspace_bytes", ctx, device, stream,
                                    dtype, n, v, d)  # must live through the call below
        L.call("tlse_cross_entropy_backward", ctx, device, stream, dtype, n, v, d, _ptr(e), _ptr(c), _ptr(bias),
               _ptr(targets), _ptr(lse), _ptr(order), _ptr(dloss), _ptr(de), _ptr(dc), _ptr(dbias), extras,
               ctypes.byref(options))
    else:
        comm.call("tlse_cross_entropy_backward_distributed", ctx, device, stream, dtype, n, v, d, _ptr(e), _ptr(c),
                  _ptr(bias), _ptr(targets), _ptr(lse), _ptr(dloss), _ptr(de), _ptr(dc), _ptr(dbias), extras,
                  ctypes.byref(options))
    return de, dc, dbias


def cross_entropy_with_gradients(e, c, bias, targets, weight, config, needs):
    """(loss, dE, dC, dbias) in one call, the gradients those of the loss's sum (dloss = 1 for
    each entry), kept for the backward (times_upstream); weight and `needs` as for
    cross_entropy_backward."""
    ctx, device, stream, n, v, d, dtype, options = _cross_entropy_call(e, c, config)
    if weight is not None:
        check_weight_values(weight)
    loss = _loss_tensor(e, config)
    dloss = torch.ones_like(loss)
    de, dc, dbias = _gradient_tensors(e, c, bias, needs)
    workspace = _lend_workspace(options, e.device, "tlse_cross_entropy_workspace_bytes", ctx, device, stream, dtype,
                                n, v, d)  # must live through the call below
    L.call("tlse_cross_entropy_with_gradients", ctx, device, stream, dtype, n, v, d, _ptr(e), _ptr(c), _ptr(bias),
           _ptr(targets), _ptr(dloss), _ptr(loss), _ptr(de), _ptr(dc), _ptr(dbias), _extras(weight),
           ctypes.byref(options))
    return loss, de, dc, dbias


def times_upstream(grad_loss, gradients):
    """The gradients cross_entropy_with_gradients or distillation_with_gradients kept (None for one
    not computed) times the upstream gradient of the reduced loss, `grad_loss` (0-d). When the
    backward starts at the loss (loss.backward()) that is 1, and they are returned as they are,
    with no pass over them, as Liger-Kernel does; reading the value waits for the tensor's CUDA
    stream. A graph being traced (torch.compile) holds no values (its tensors are subclasses): it
    always multiplies."""
    if type(grad_loss) is torch.Tensor and bool(grad_loss == 1):
        return tuple(gradients)
    return tuple(None if g is None else g * grad_loss for g in gradients)


def scale_value(scale):
    """The logit scale (a one-element tensor) as a float, checked; read on the host."""
    value = float(scale.detach())
    if not math.isfinite(value) or value < 0:
        raise ValueError("argument 'scale' must be finite and >= 0, got %r" % value)
    return value


def _contrastive_options(scale, symmetric, memory_budget, precision):
    options = L.ContrastiveOptions()
    options.scale = scale_value(scale)
    options.direction = L.SYMMETRIC if symmetric else L.IMAGE_TO_TEXT
    options.memory_budget, options.precision = memory_budget, precision
    return options


def _contrastive_call(name, x, scale, symmetric, memory_budget, precision):
    """What every contrastive call starts from (as _cross_entropy_call): the context, device and
    stream of x's device (x: argument `name`, the first features), its rows and columns, the
    dtype code and the options."""
    ctx, device, stream = launch(name, x)
    b, c = x.shape
    return ctx, device, stream, b, c, DTYPES[x.dtype], _contrastive_options(scale, symmetric, memory_budget, precision)


def self_contrastive_forward(z, scale, memory_budget=0, precision=0):
    """(loss, LSE per row) of the self-similarity logits scale * z @ z.T without the diagonal;
    z holds two views of each sample, rows i and i + n/2."""
    ctx, device, stream, n, c, dtype, options = _contrastive_call("z", z, scale, True, memory_budget, precision)
    loss = torch.empty((), dtype=acc_dtype(z.dtype), device=z.device)
    lse = torch.empty((n,), dtype=loss.dtype, device=z.device)
    workspace = _lend_workspace(options, z.device, "tlse_self_contrastive_workspace_bytes", ctx, device, stream, dtype,
                                n, c)  # must live through the call below
    L.call("tlse_self_contrastive_forward", ctx, device, stream, dtype, n, c, _ptr(z), _ptr(loss), _ptr(lse),
           ctypes.byref(options))
    return loss, lse


def self_contrastive_backward(z, scale, lse, dloss, needs, memory_budget=0, precision=0):
    """(dZ, dscale) for the upstream gradient dloss; `needs` says which to compute (the other is
    None). dscale is a 0-d tensor of the accumulator type on z's device."""
    ctx, device, stream, n, c, dtype, options = _contrastive_call("z", z, scale, True, memory_budget, precision)
    dloss = dloss.to(lse.dtype).contiguous()
    dz = torch.empty_like(z) if needs[0] else None
    dscale = torch.empty((), dtype=lse.dtype, device=z.device) if needs[1] else None
    workspace = _lend_workspace(options, z.device, "tlse_self_contrastive_workspace_bytes", ctx, device, stream, dtype,
                                n, c)  # must live through the call below
    L.call("tlse_self_contrastive_backward", ctx, device, stream, dtype, n, c, _ptr(z), _ptr(lse), _ptr(dloss),
           _ptr(dz), _ptr(dscale), ctypes.byref(options))
    return dz, dscale


def contrastive_forward(image, text, scale, labels, symmetric, comm=None, memory_budget=0, precision=0):
    """(loss, row LSE, column LSE) of the logits scale * image @ text.T; the column LSE is empty
    when not symmetric. With `comm`, image and text are this rank's rows of the global batch.
    memory_budget: bytes of workspace the call may use (0: the library's default); precision: an
    L.PRECISIONS value."""
    ctx, device, stream, b, c, dtype, options = _contrastive_call("image", image, scale, symmetric, memory_budget,
                                                                  precision)
    acc = acc_dtype(image.dtype)
    loss = torch.empty((), dtype=acc, device=image.device)
    row_lse = torch.empty((b,), dtype=acc, device=image.device)
    col_lse = torch.empty((b if symmetric else 0,), dtype=acc, device=image.device)
    col = col_lse if symmetric else None
    if comm is None:
        workspace = _lend_workspace(options, image.device, "tlse_contrastive_workspace_bytes", ctx, device, stream,
                                    dtype, b, c)  # must live through the call below
        L.call("tlse_contrastive_forward", ctx, device, stream, dtype, b, c, _ptr(image), _ptr(text), _ptr(labels),
               _ptr(loss), _ptr(row_lse), _ptr(col), ctypes.byref(options))
    else:
        comm.call("tlse_contrastive_forward_distributed", ctx, device, stream, dtype, b, c, _ptr(image), _ptr(text),
                  _ptr(labels), _ptr(loss), _ptr(row_lse), _ptr(col), ctypes.byref(options))
    return loss, row_lse, col_lse


def contrastive_backward(image, text, scale, labels, row_lse, col_lse, dloss, symmetric, needs, comm=None,
                         memory_budget=0, precision=0):
    """(dI, dT, dscale) for the upstream gradient dloss; `needs` says which to compute (the
    others are None). dscale is a 0-d tensor of the accumulator type on image's device."""
    ctx, device, stream, b, c, dtype, options = _contrastive_call("image", image, scale, symmetric, memory_budget,
                                                                  precision)
    dloss = dloss.to(row_lse.dtype).contiguous()
    di = torch.empty_like(image) if needs[0] else None
    dt = torch.empty_like(text) if needs[1] else None
    dscale = torch.empty((), dtype=row_lse.dtype, device=image.device) if needs[2] else None
    col = col_lse if symmetric else None
    if comm is None:
        workspace = _lend_workspace(options, image.device, "tlse_contrastive_workspace_bytes", ctx, device, stream,
                                    dtype, b, c)  # must live through the call below
        L.call("tlse_contrastive_backward", ctx, device, stream, dtype, b, c, _ptr(image), _ptr(text), _ptr(labels),
               _ptr(row_lse), _ptr(col), _ptr(dloss), _ptr(di), _ptr(dt), _ptr(dscale), None,
               ctypes.byref(options))
    else:
        comm.call("tlse_contrastive_backward_distributed", ctx, device, stream, dtype, b, c, _ptr(image), _ptr(text),
                  _ptr(labels), _ptr(row_lse), _ptr(col), _ptr(dloss), _ptr(di), _ptr(dt), _ptr(dscale),
                  ctypes.byref(options))
    return di, dt, dscale


def _distillation_options(config):
    options = L.DistillationOptions()
    options.divergence, options.reduction = config.divergence, config.reduction
    options.beta, options.temperature, options.alpha = config.beta, config.temperature, config.alpha
    options.ignore_index, options.shift, options.memory_budget = config.ignore_index, config.shift, config.memory_budget
    return options


def _distillation_call(hs, ws, ht, config):
    """What every distillation call starts from: the context, device and stream of hs's device,
    the sizes N, V, D_s, D_t, the dtype code and the options."""
    ctx, device, stream = launch("student_hidden", hs)
    return (ctx, device, stream, hs.shape[0], ws.shape[0], hs.shape[1], ht.shape[1], DTYPES[hs.dtype],
            _distillation_options(config))


def distillation_forward(hs, ws, ht, wt, targets, config):
    """(loss, row statistics (N, L.DISTILLATION_ROW_STATS) for the backward) of the student hs (N,
    D_s), ws (V, D_s) against the teacher ht (N, D_t), wt (V, D_t); targets (N) int64 or None."""
    ctx, device, stream, n, v, ds, dt, dtype, options = _distillation_call(hs, ws, ht, config)
    loss = _loss_tensor(hs, config)
    stats = torch.empty((n, L.DISTILLATION_ROW_STATS), dtype=loss.dtype, device=hs.device)
    workspace = _lend_workspace(options, hs.device, "tlse_distillation_loss_workspace_bytes", ctx, device, stream,
                                dtype, n, v, ds, dt)  # must live through the call below
    L.call("tlse_distillation_loss", ctx, device, stream, dtype, n, v, ds, dt, _ptr(hs), _ptr(ws), _ptr(ht), _ptr(wt),
           _ptr(targets), _ptr(loss), _ptr(stats), ctypes.byref(options))
    return loss, stats


def _distillation_gradient_tensors(hs, ws, ht, wt, needs):
    """(dHs, dWs, dHt, dWt) to be written; None where `needs` says not computed."""
    return tuple(torch.empty_like(t) if need else None for t, need in zip((hs, ws, ht, wt), needs))


def distillation_backward(hs, ws, ht, wt, targets, stats, dloss, config, needs):
    """(dHs, dWs, dHt, dWt) for the upstream gradient dloss (shaped like the forward's loss);
    `needs` says which of the four to compute (the others are None)."""
    ctx, device, stream, n, v, ds, dt, dtype, options = _distillation_call(hs, ws, ht, config)
    dloss = dloss.to(stats.dtype).contiguous()
    grads = _distillation_gradient_tensors(hs, ws, ht, wt, needs)
    workspace = _lend_workspace(options, hs.device, "tlse_distillation_loss_workspace_bytes", ctx, device, stream,
                                dtype, n, v, ds, dt)  # must live through the call below
    L.call("tlse_distillation_loss_backward", ctx, device, stream, dtype, n, v, ds, dt, _ptr(hs), _ptr(ws), _ptr(ht),
           _ptr(wt), _ptr(targets), _ptr(stats), _ptr(dloss), *(_ptr(g) for g in grads), ctypes.byref(options))
    return grads


def distillation_step_fuses(hs, ws, ht, config, want_teacher_gradients):
    """Whether tlse_distillation_loss_with_gradients runs the step fused (the teacher's logits kept
    between the forward's sweep and the backward's) for hs (N, D_s), ws (V, D_s), ht (N, D_t) on
    their device under `config`; want_teacher_gradients: dHt asked for."""
    ctx, device, stream, n, v, ds, dt, dtype, options = _distillation_call(hs, ws, ht, config)
    fused = ctypes.c_int(0)
    L.call("tlse_distillation_step_fused", ctx, device, stream, dtype, n, v, ds, dt, ctypes.byref(options),
           int(want_teacher_gradients), ctypes.byref(fused))
    return bool(fused.value)


def distillation_with_gradients(hs, ws, ht, wt, targets, config, needs):
    """(loss, dHs, dWs, dHt, dWt) in one call, the gradients those of the loss's sum (dloss = 1 for
    each entry), kept for the backward (times_upstream); `needs` as for distillation_backward."""
    ctx, device, stream, n, v, ds, dt, dtype, options = _distillation_call(hs, ws, ht, config)
    loss = _loss_tensor(hs, config)
    dloss = torch.ones_like(loss)
    grads = _distillation_gradient_tensors(hs, ws, ht, wt, needs)
    workspace = _lend_workspace(options, hs.device, "tlse_distillation_loss_workspace_bytes", ctx, device, stream,
                                dtype, n, v, ds, dt)  # must live through the call below
    L.call("tlse_distillation_loss_with_gradients", ctx, device, stream, dtype, n, v, ds, dt, _ptr(hs), _ptr(ws),
           _ptr(ht), _ptr(wt), _ptr(targets), _ptr(dloss), _ptr(loss), *(_ptr(g) for g in grads),
           ctypes.byref(options))
    return (loss, *grads)
