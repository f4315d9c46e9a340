"""ctypes bindings of the TiledLSE C API (c_api/include/tlse.h).

The shared library is found, in this order, at $TILEDLSE_LIBRARY (a file path), next to this
package, in the lib folders of the prefix the package is installed in, then by the system's
loader (LD_LIBRARY_PATH, ldconfig).
"""
import atexit
import ctypes
import ctypes.util
import os
import threading

LIBRARY_NAME = "libtiledlse_c.so"

# tlse_status
SUCCESS, INVALID_ARGUMENT, UNSUPPORTED, OUT_OF_MEMORY, RUNTIME = 0, 1, 2, 3, 4
# tlse_device, tlse_dtype, tlse_reduction, tlse_direction
DEVICE_HOST, DEVICE_CUDA = 0, 1
F32, F64, BF16, F16 = 0, 1, 2, 3
REDUCTIONS = {"none": 0, "sum": 1, "mean": 2}
SYMMETRIC, IMAGE_TO_TEXT = 0, 1
FILTER_EPS_AUTO = -1.0
PRECISIONS = {"exact": 0, "tf32": 1}  # tlse_precision: the products of float32 inputs
DIVERGENCES = {"forward_kl": 0, "reverse_kl": 1, "jsd": 2}  # tlse_divergence
DISTILLATION_ROW_STATS = 5  # TLSE_DISTILLATION_ROW_STATS: values per row the forward keeps for the backward


class CrossEntropyOptions(ctypes.Structure):
    _fields_ = [
        ("ignore_index", ctypes.c_int64),
        ("reduction", ctypes.c_int32),
        ("accumulate", ctypes.c_int32),
        ("shift", ctypes.c_int64),
        ("softcap", ctypes.c_double),
        ("z_loss", ctypes.c_double),
        ("filter_eps", ctypes.c_double),
        ("detect_non_finite", ctypes.c_int32),
        ("precision", ctypes.c_int32),  # PRECISIONS
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("memory_budget", ctypes.c_uint64),  # 0: the library's default (256 MiB)
        ("label_smoothing", ctypes.c_double),
    ]


class CrossEntropyExtras(ctypes.Structure):
    """tlse_cross_entropy_extras: the calls' optional arrays (device pointers or None)."""
    _fields_ = [
        ("class_weight", ctypes.c_void_p),
        ("dlse", ctypes.c_void_p),
        ("predicted", ctypes.c_void_p),
        ("accuracy", ctypes.c_void_p),
    ]


class ContrastiveOptions(ctypes.Structure):
    _fields_ = [
        ("scale", ctypes.c_double),
        ("direction", ctypes.c_int32),
        ("accumulate", ctypes.c_int32),
        ("detect_non_finite", ctypes.c_int32),
        ("precision", ctypes.c_int32),  # PRECISIONS
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("memory_budget", ctypes.c_uint64),  # 0: the library's default (256 MiB)
    ]


class DistillationOptions(ctypes.Structure):
    _fields_ = [
        ("divergence", ctypes.c_int32),  # DIVERGENCES
        ("reduction", ctypes.c_int32),  # REDUCTIONS
        ("beta", ctypes.c_double),
        ("temperature", ctypes.c_double),
        ("alpha", ctypes.c_double),
        ("ignore_index", ctypes.c_int64),
        ("shift", ctypes.c_int64),
        ("accumulate", ctypes.c_int32),
        ("detect_non_finite", ctypes.c_int32),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("memory_budget", ctypes.c_uint64),  # 0: the library's default (256 MiB)
    ]


# tlse_communicator (tlse.h): the caller's collectives as C callbacks; see distributed.py.
RING_START = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                              ctypes.POINTER(ctypes.c_void_p))
RING_WAIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
ALLREDUCE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                             ctypes.c_int)
ALLGATHER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
# tlse_comm_dtype, tlse_comm_op
COMM_F32, COMM_F64, COMM_I32, COMM_I64 = 0, 1, 2, 3
COMM_SUM, COMM_MAX = 0, 1


class Communicator(ctypes.Structure):
    _fields_ = [
        ("user", ctypes.c_void_p),
        ("rank", ctypes.c_int),
        ("size", ctypes.c_int),
        ("ring_start", RING_START),
        ("ring_wait", RING_WAIT),
        ("allreduce", ALLREDUCE),
        ("allgather", ALLGATHER),
        ("allgather_host", ALLGATHER),
    ]


def _candidates():
    env = os.environ.get("TILEDLSE_LIBRARY")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, LIBRARY_NAME)
    # <prefix>/lib/pythonX.Y/site-packages/tiledlse -> <prefix>/lib, <prefix>/lib64
    prefix = os.path.abspath(os.path.join(here, "..", "..", "..", ".."))
    for lib in ("lib", "lib64"):
        yield os.path.join(prefix, lib, LIBRARY_NAME)
    found = ctypes.util.find_library("tiledlse_c")
    yield found or LIBRARY_NAME


def _load():
    tried = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append(path + " (no such file)")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise ImportError(
        "tiledlse: cannot load %s; set TILEDLSE_LIBRARY to its path. Tried: %s" % (LIBRARY_NAME, "; ".join(tried))
    )


_lib, library_path = _load()

_c = ctypes
_p = ctypes.c_void_p
_i64 = ctypes.c_int64
_ctx = ctypes.c_void_p
_status = ctypes.c_int
_signatures = {
    "tlse_version": (ctypes.c_char_p, []),
    "tlse_device_available": (ctypes.c_int, [ctypes.c_int]),
    "tlse_last_error": (ctypes.c_char_p, []),
    "tlse_context_create": (_status, [ctypes.POINTER(_ctx), ctypes.c_int]),
    "tlse_context_destroy": (_status, [_ctx]),
    "tlse_context_cuda_device": (_status, [_ctx, ctypes.POINTER(ctypes.c_int)]),
    "tlse_cross_entropy_workspace_bytes": (
        _status,
        [_ctx, ctypes.c_int, _p, ctypes.c_int, _i64, _i64, _i64, ctypes.POINTER(CrossEntropyOptions),
         ctypes.POINTER(ctypes.c_size_t)],
    ),
    "tlse_cross_entropy_step_fused": (
        _status,
        [_ctx, ctypes.c_int, _p, ctypes.c_int, _i64, _i64, _i64, ctypes.POINTER(CrossEntropyOptions), ctypes.c_int,
         ctypes.POINTER(ctypes.c_int)],
    ),
    "tlse_cross_entropy_forward": (
        _status,
        [_ctx, ctypes.c_int, _p, ctypes.c_int, _i64, _i64, _i64, _p, _p, _p, _p, _p, _p, _p,
         ctypes.POINTER(CrossEntropyExtras), ctypes.POINTER(CrossEntropyOptions)],
    ),
    "tlse_cross_entropy_backward": (
        _status,
        [_ctx, ctypes.c_int, _p, ctypes.c_int, _i64, _i64, _i64, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p,
         ctypes.POINTER(CrossEntropyExtras), ctypes.POINTER(CrossEntropyOptions)],
    ),
    "tlse_cross_entropy_with_gradients": (
        _status,
        [_ctx, ctypes.c_int, _p, ctypes.c_int, _i64, _i64, _i64, _p, _p, _p, _p, _p, _p, _p, _p, _p,
         ctypes.POINTER(CrossEntropyExtras), ctypes.POINTER(CrossEntropyOptions)],
    ),
    "tlse_contrastive_workspace_bytes": (
        _status,
        [_ctx, ctypes.c_int, _p, ctypes.c_int, _i64, _i64, ctypes.POINTER(ContrastiveOptions),
         ctypes.POINTER(ctypes.c_size_t)],
    ),
    "tlse_contrastive_forward": (
        _status,
        [_ctx, ctypes.c_int, _p, ctypes.c_int, _i64, _i64, _p, _p, _p, _p, _p, _p,
         ctypes.POINTER(ContrastiveOptions)],
    ),
    "tlse_contrastive_backward": (
        _status,
        [_ctx, ctypes.c_int, _p, ctypes.c_int, _i64, _i64, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p,
         ctypes.POINTER(ContrastiveOptions)],
    ),
    "tlse_self_contrastive_workspace_bytes": (
        _status,
        [_ctx, ctypes.c_int, _p, ctypes.c_int, _i64, _i64, ctypes.POINTER(ContrastiveOptions),
         ctypes.POINTER(ctypes.c_size_t)],
    ),
    "tlse_self_contrastive_forward": (
        _status,
        [_ctx, ctypes.c_int, _p, ctypes.c_int, _i64, _i64, _p, _p, _p, ctypes.POINTER(ContrastiveOptions)],
    ),
    "tlse_self_contrastive_backward": (
        _status,
        [_ctx, ctypes.c_int, _p, ctypes.c_int, _i64, _i64, _p, _p, _p, _p, _p, ctypes.POINTER(ContrastiveOptions)],
    ),
    "tlse_distillation_loss_workspace_bytes": (
        _status,
        [_ctx, ctypes.c_int, _p, ctypes.c_int, _i64, _i64, _i64, _i64, ctypes.POINTER(DistillationOptions),
         ctypes.POINTER(ctypes.c_size_t)],
    ),
    "tlse_distillation_loss": (
        _status,
        [_ctx, ctypes.c_int, _p, ctypes.c_int, _i64, _i64, _i64, _i64, _p, _p, _p, _p, _p, _p, _p,
         ctypes.POINTER(DistillationOptions)],
    ),
    "tlse_distillation_loss_backward": (
        _status,
        [_ctx, ctypes.c_int, _p, ctypes.c_int, _i64, _i64, _i64, _i64, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p,
         ctypes.POINTER(DistillationOptions)],
    ),
    "tlse_distillation_step_fused": (
        _status,
        [_ctx, ctypes.c_int, _p, ctypes.c_int, _i64, _i64, _i64, _i64, ctypes.POINTER(DistillationOptions),
         ctypes.c_int, ctypes.POINTER(ctypes.c_int)],
    ),
    "tlse_distillation_loss_with_gradients": (
        _status,
        [_ctx, ctypes.c_int, _p, ctypes.c_int, _i64, _i64, _i64, _i64, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p,
         ctypes.POINTER(DistillationOptions)],
    ),
    "tlse_cross_entropy_forward_distributed": (
        _status,
        [_ctx, ctypes.POINTER(Communicator), ctypes.c_int, _p, ctypes.c_int, _i64, _i64, _i64, _p, _p, _p, _p, _p,
         _p, ctypes.POINTER(CrossEntropyExtras), ctypes.POINTER(CrossEntropyOptions)],
    ),
    "tlse_cross_entropy_backward_distributed": (
        _status,
        [_ctx, ctypes.POINTER(Communicator), ctypes.c_int, _p, ctypes.c_int, _i64, _i64, _i64, _p, _p, _p, _p, _p,
         _p, _p, _p, _p, ctypes.POINTER(CrossEntropyExtras), ctypes.POINTER(CrossEntropyOptions)],
    ),
    "tlse_contrastive_forward_distributed": (
        _status,
        [_ctx, ctypes.POINTER(Communicator), ctypes.c_int, _p, ctypes.c_int, _i64, _i64, _p, _p, _p, _p, _p, _p,
         ctypes.POINTER(ContrastiveOptions)],
    ),
    "tlse_contrastive_backward_distributed": (
        _status,
        [_ctx, ctypes.POINTER(Communicator), ctypes.c_int, _p, ctypes.c_int, _i64, _i64, _p, _p, _p, _p, _p, _p, _p,
         _p, _p, ctypes.POINTER(ContrastiveOptions)],
    ),
}
for _name, (_restype, _argtypes) in _signatures.items():
    _f = getattr(_lib, _name)
    _f.restype, _f.argtypes = _restype, _argtypes

version = _lib.tlse_version().decode()


def device_available(device):
    return bool(_lib.tlse_device_available(device))


class TiledLSEError(RuntimeError):
    """A failure of the library that is not the caller's input (Kokkos, CUDA, memory)."""


def _last_error():
    return _lib.tlse_last_error().decode(errors="replace")


def check(status):
    """Raises for a non-zero tlse_status: ValueError for bad input, else TiledLSEError."""
    if status == SUCCESS:
        return
    message = _last_error()
    if status == INVALID_ARGUMENT:
        raise ValueError(message)
    if status == OUT_OF_MEMORY:
        raise MemoryError(message)
    raise TiledLSEError(message)


def call(name, *args):
    check(getattr(_lib, name)(*args))


_context = None
_context_lock = threading.Lock()


def context(cuda_device=-1):
    """The process' one context (Kokkos is initialized once per process and cannot be
    re-initialized after it is finalized), created on first use and destroyed at exit."""
    global _context
    with _context_lock:
        if _context is None:
            handle = _ctx()
            check(_lib.tlse_context_create(ctypes.byref(handle), cuda_device))
            _context = handle
            atexit.register(_destroy)
        return _context


def _destroy():
    global _context
    with _context_lock:
        if _context is not None:
            _lib.tlse_context_destroy(_context)
            _context = None


def context_cuda_device():
    device = ctypes.c_int(-1)
    call("tlse_context_cuda_device", context(), ctypes.byref(device))
    return device.value
