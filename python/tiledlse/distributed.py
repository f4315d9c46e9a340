"""The losses spread over the ranks of a torch.distributed process group (docs/python.md).

The C library's distributed calls (tlse_*_distributed) move their data through callbacks; here
they are torch.distributed operations on `group` (any backend: gloo for CPU tensors, NCCL for
CUDA tensors): the ring step is a batch_isend_irecv to rank+1 and from rank-1, the reductions
all_reduce and all_gather. The callbacks see the library's buffers as tensors over the same
memory (no copies).

Every rank calls these functions in the same order. Bad arguments raise the same TypeError or
ValueError on every rank, naming the argument and the rank: the ranks agree on their local
checks (one small all_gather) before any data moves, so none is left waiting.
"""
import ctypes

import torch
import torch.distributed as dist

from . import _library as L
from ._calls import launch, scale_value
from ._functions import (_ContrastiveLoss, _LinearCrossEntropy, _contrastive_arguments, _cross_entropy_arguments,
                         _cross_entropy_results, _flag, _memory_budget, _precision)

__all__ = ["contrastive_loss", "linear_cross_entropy"]

_TORCH_DTYPES = {L.COMM_F32: torch.float32, L.COMM_F64: torch.float64, L.COMM_I32: torch.int32,
                 L.COMM_I64: torch.int64}
_TYPESTR = {torch.uint8: "|u1", torch.float32: "<f4", torch.float64: "<f8", torch.int32: "<i4", torch.int64: "<i8"}
_OPS = {L.COMM_SUM: dist.ReduceOp.SUM, L.COMM_MAX: dist.ReduceOp.MAX}
# Exceptions the ranks agree on, by code in the gathered record (0: no error).
_KINDS = [None, TypeError, ValueError, RuntimeError]
_MESSAGE_BYTES = 1000


class _CudaMemory:
    """Device memory of the library's, seen by torch.as_tensor through __cuda_array_interface__."""

    def __init__(self, address, count, dtype):
        self.__cuda_array_interface__ = {"shape": (count,), "typestr": _TYPESTR[dtype], "data": (address, False),
                                         "version": 2}


class _Communicator:
    """A tlse_communicator over a torch.distributed group, for calls on tensors of `device`.

    Callbacks never raise (ctypes cannot carry an exception through C): each catches everything,
    keeps the first exception and returns 1; call() then raises that exception. The CFUNCTYPE
    objects live as long as this object, which autograd keeps for the backward.
    """

    def __init__(self, group):
        if not dist.is_initialized():
            raise RuntimeError("tiledlse.distributed: torch.distributed is not initialized; call "
                               "torch.distributed.init_process_group first")
        self.group = group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        if self.rank < 0:
            raise ValueError("argument 'group': this process is not a member of it")
        self.backend = str(dist.get_backend(group))
        # Where the host-memory all-gathers run: NCCL moves device memory only.
        self.host_device = (torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl"
                            else torch.device("cpu"))
        self.next_peer = self._global((self.rank + 1) % self.size)
        self.previous_peer = self._global((self.rank - 1) % self.size)
        self.device = None  # the device of the call's tensors, set by check_device
        self.pending = {}
        self.tag = 0
        self.error = None
        callbacks = [L.RING_START(self._guard(self._ring_start)), L.RING_WAIT(self._guard(self._ring_wait)),
                     L.ALLREDUCE(self._guard(self._allreduce)), L.ALLGATHER(self._guard(self._allgather)),
                     L.ALLGATHER(self._guard(self._allgather_host))]
        self.struct = L.Communicator(None, self.rank, self.size, *callbacks)

    def _global(self, group_rank):
        """torch.distributed's point-to-point calls take global ranks."""
        if self.group is None or self.group is dist.group.WORLD:
            return group_rank
        return dist.get_global_rank(self.group, group_rank)

    def check_device(self, name, t):
        """The group's backend must move t's memory (gloo: cpu, nccl: cuda)."""
        expected = {"nccl": "cuda", "gloo": "cpu"}.get(self.backend)
        if expected is not None and t.device.type != expected:
            raise ValueError("argument '%s' is on %s but the process group's backend %s moves %s tensors"
                             % (name, t.device, self.backend, expected))
        self.device = t.device

    def agree(self, checks):
        """Runs checks() (which raises on bad input) on every rank, then all-gathers the outcome:
        if any rank failed, every rank raises the first failing rank's exception."""
        kind, message, result = 0, "", None
        try:
            result = checks()
        except Exception as e:  # every kind is agreed on: a rank raising alone would leave the others waiting
            kind = next((k for k, cls in enumerate(_KINDS) if cls and isinstance(e, cls)), 3)
            message = str(e)
        record = torch.zeros(_MESSAGE_BYTES + 1, dtype=torch.uint8)
        record[0] = kind
        encoded = message.encode(errors="replace")[:_MESSAGE_BYTES]
        record[1:1 + len(encoded)] = torch.tensor(list(encoded), dtype=torch.uint8)
        table = self._gather_host(record).view(self.size, -1)
        for r in range(self.size):
            if table[r, 0] != 0:
                text = bytes(table[r, 1:].tolist()).rstrip(b"\0").decode(errors="replace")
                raise _KINDS[int(table[r, 0])]("%s (on rank %d of the process group)" % (text, r))
        return result

    def call(self, name, context, *args):
        """Calls the C function `name` with this communicator; raises a callback's exception first."""
        self.error, self.tag = None, 0
        status = getattr(L._lib, name)(context, ctypes.byref(self.struct), *args)
        self.pending.clear()
        if self.error is not None:
            raise self.error
        L.check(status)

    def _guard(self, f):
        def callback(*args):
            try:
                f(*args)
                return 0
            except BaseException as e:  # ctypes callbacks must not raise
                if self.error is None:
                    self.error = e
                return 1
        return callback

    def _tensor(self, address, count, dtype, device):
        """`count` elements of `dtype` at `address`, as a tensor over that memory."""
        if count == 0:
            return torch.empty(0, dtype=dtype, device=device)
        if device.type == "cuda":
            return torch.as_tensor(_CudaMemory(address, count, dtype), device=device)
        size = count * torch.empty(0, dtype=dtype).element_size()
        return torch.frombuffer((ctypes.c_char * size).from_address(address), dtype=dtype, count=count)

    def _ring_start(self, _user, send, recv, nbytes, handle):
        send = self._tensor(send, nbytes, torch.uint8, self.device)
        recv = self._tensor(recv, nbytes, torch.uint8, self.device)
        # Every rank posts the same sequence of ring steps: the sequence number is the tag (gloo
        # matches on it; NCCL orders by posting), and the handle.
        self.tag += 1
        ops = [dist.P2POp(dist.isend, send, self.next_peer, self.group, self.tag),
               dist.P2POp(dist.irecv, recv, self.previous_peer, self.group, self.tag)]
        self.pending[self.tag] = dist.batch_isend_irecv(ops)
        handle[0] = self.tag

    def _ring_wait(self, _user, handle):
        # For NCCL, wait() makes torch's current stream (the library's) wait for the transfer.
        for work in self.pending.pop(handle):
            work.wait()

    def _allreduce(self, _user, data, count, dtype, op):
        dist.all_reduce(self._tensor(data, count, _TORCH_DTYPES[dtype], self.device), op=_OPS[op], group=self.group)

    def _allgather(self, _user, send, recv, nbytes):
        send = self._tensor(send, nbytes, torch.uint8, self.device)
        recv = self._tensor(recv, nbytes * self.size, torch.uint8, self.device)
        dist.all_gather(list(recv.chunk(self.size)), send, group=self.group)

    def _allgather_host(self, _user, send, recv, nbytes):
        host = torch.device("cpu")
        self._tensor(recv, nbytes * self.size, torch.uint8, host).copy_(
            self._gather_host(self._tensor(send, nbytes, torch.uint8, host)))

    def _gather_host(self, mine):
        """Every rank's cpu uint8 tensor `mine`, concatenated in rank order (on the cpu)."""
        mine = mine.to(self.host_device)
        every = torch.empty(mine.numel() * self.size, dtype=torch.uint8, device=self.host_device)
        dist.all_gather(list(every.chunk(self.size)), mine, group=self.group)
        return every.cpu()


def contrastive_loss(image, text, scale, labels=None, symmetric=True, group=None, memory_budget=None,
                     precision="exact"):
    """CLIP contrastive loss over the global batch of the ranks of `group` (default: the default
    process group), without forming any logits block larger than one rank's tiles.

    image, text: this rank's (b_r, c) features, rows [offset_r, offset_r + b_r) of the global
    batch in rank order (b_r may differ by rank, and be 0); cpu tensors with gloo, cuda tensors
    with NCCL. scale: as tiledlse.contrastive_loss, the same on every rank. labels: int64 (b_r)
    global indices into the global batch, or None on every rank (image i <-> text i).
    memory_budget: bytes of workspace each ring step's backward may use on this rank (None: the
    library's default, 256 MiB; it may differ by rank), besides the ring's buffers
    (docs/distributed.md). precision: as tiledlse.contrastive_loss, the same on every rank.
    Returns the global loss (0-d, the same on every rank). Gradients: this rank's image and text
    rows, and the scale's (the same on every rank), all of the global loss.
    """
    comm = _Communicator(group)

    def checks():
        scale_tensor = _contrastive_arguments(image, text, scale, labels)
        scale_value(scale_tensor)  # checked here too, so that a bad value fails on every rank
        comm.check_device("image", image)
        launch("image", image)
        return scale_tensor, _memory_budget(memory_budget), _precision(precision)
    scale_tensor, budget, code = comm.agree(checks)
    return _ContrastiveLoss.apply(image, text, scale_tensor, labels, symmetric, comm, budget, code)


def linear_cross_entropy(e, c, targets, bias=None, ignore_index=-100, softcap=None, reduction="mean", shift=0,
                         return_lse=False, filter_eps="auto", z_loss=0.0, group=None, memory_budget=None,
                         precision="exact", weight=None, label_smoothing=0.0, return_token_accuracy=False,
                         return_predicted_tokens=False):
    """Vocabulary-parallel tiledlse.linear_cross_entropy over the ranks of `group` (default: the
    default process group).

    e (..., D) and targets (global class ids or ignore_index) are the same on every rank; c
    (V_r, D), bias (V_r) and weight (V_r) are this rank's shard of the classifier and of the class
    weights: classes [sum of the previous ranks' V_q, + V_r) in rank order (V_r may differ by
    rank). Options as the single-device call; filter_eps applies per shard; memory_budget bounds
    the workspace of this rank's backward over its shard (it may differ by rank). The loss, LSE,
    token accuracy and predicted tokens (global class ids) are the global ones, the same on
    every rank; e's gradient is the full one (the same on every rank), c's and bias' this rank's
    shard. The LSE carries its gradient, which every rank must pass the same.
    """
    comm = _Communicator(group)
    want_argmax = _flag("return_token_accuracy", return_token_accuracy) or _flag("return_predicted_tokens",
                                                                                return_predicted_tokens)

    def checks():
        arguments = _cross_entropy_arguments(e, c, targets, bias, ignore_index, softcap, reduction, shift,
                                             filter_eps, z_loss, memory_budget, precision, weight, label_smoothing)
        comm.check_device("e", e)
        launch("e", e)
        return arguments
    e2, flat_targets, config, batch_shape, flat_weight = comm.agree(checks)
    loss, lse, predicted, accuracy = _LinearCrossEntropy.apply(e2, c, bias, flat_targets, flat_weight, config, False,
                                                               want_argmax, comm)
    return _cross_entropy_results(loss, lse, predicted, accuracy, flat_targets, config, batch_shape, return_lse,
                                  return_token_accuracy, return_predicted_tokens)
