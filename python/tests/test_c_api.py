"""The C API's own checks, called through ctypes: statuses, messages naming the argument, outputs
left untouched on failure, and the internally allocated workspace (the Python wrappers always
lend one)."""
import ctypes
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tiledlse import _library as L

N, V, D = 10, 7, 3


def ptr(t):
    return ctypes.c_void_p(t.data_ptr())


def forward(options=None, device=L.DEVICE_HOST, dtype=L.F64, n=N, E="default", loss=None):
    e = torch.randn(N, D, dtype=torch.float64)
    c = torch.randn(V, D, dtype=torch.float64)
    targets = torch.arange(N) % V
    loss = torch.full((), -1.0, dtype=torch.float64) if loss is None else loss
    status = L._lib.tlse_cross_entropy_forward(
        L.context(-1 if not L.device_available(L.DEVICE_CUDA) else torch.cuda.current_device()), device, None,
        dtype, n, V, D, ptr(e) if E == "default" else E, ptr(c), None, ptr(targets), ptr(loss), None, None, None,
        None if options is None else ctypes.byref(options))
    return status, loss, e, c, targets


def test_defaults_and_internal_workspace():
    status, loss, e, c, targets = forward()
    assert status == L.SUCCESS, L._last_error()
    ref = torch.nn.functional.cross_entropy(e @ c.T, targets)
    assert abs(loss.item() - ref.item()) < 1e-12


@pytest.mark.parametrize(
    "kwargs, status, pattern",
    [
        ({"E": None}, L.INVALID_ARGUMENT, "tlse_cross_entropy_forward: argument 'E' is NULL but has 30 elements"),
        ({"n": -1}, L.INVALID_ARGUMENT, "argument 'n' must be >= 0, got -1"),
        ({"dtype": 7}, L.INVALID_ARGUMENT, "argument 'dtype' is 7"),
        ({"device": 5}, L.INVALID_ARGUMENT, "argument 'device' is 5"),
    ],
)
def test_bad_arguments(kwargs, status, pattern):
    got, loss, *_ = forward(**kwargs)
    assert got == status
    assert pattern in L._last_error()
    assert loss.item() == -1.0  # untouched


def test_bad_options():
    options = L.CrossEntropyOptions()
    L._lib.tlse_cross_entropy_options_default(ctypes.byref(options))
    options.reduction = 9
    status, loss, *_ = forward(options)
    assert status == L.INVALID_ARGUMENT and "options.reduction" in L._last_error() and loss.item() == -1.0
    L._lib.tlse_cross_entropy_options_default(ctypes.byref(options))
    options.workspace, options.workspace_bytes = ctypes.c_void_p(16), 8
    status, loss, *_ = forward(options)
    assert status == L.INVALID_ARGUMENT and "argument 'workspace' holds 8 bytes" in L._last_error()
    assert loss.item() == -1.0


@pytest.mark.skipif(L.device_available(L.DEVICE_CUDA), reason="the library has CUDA")
def test_cuda_in_a_host_build():
    status, *_ = forward(device=L.DEVICE_CUDA)
    assert status == L.UNSUPPORTED and "built without CUDA" in L._last_error()


@pytest.mark.skipif(not (L.device_available(L.DEVICE_CUDA) and torch.cuda.is_available()), reason="needs CUDA")
def test_host_pointer_for_cuda():
    status, loss, *_ = forward(device=L.DEVICE_CUDA)
    assert status == L.INVALID_ARGUMENT
    assert "argument 'E' is host memory but device is TLSE_DEVICE_CUDA" in L._last_error()
    assert loss.item() == -1.0


def test_null_context():
    size = ctypes.c_size_t()
    status = L._lib.tlse_cross_entropy_workspace_bytes(None, L.DEVICE_HOST, None, L.F32, 1, 1, 1, None,
                                                        ctypes.byref(size))
    assert status == L.INVALID_ARGUMENT and "argument 'context' is NULL" in L._last_error()


NO_GPU_CHILD = textwrap.dedent("""
    import ctypes, torch, tiledlse
    from tiledlse import _library as L
    context = ctypes.c_void_p()
    status = L._lib.tlse_context_create(ctypes.byref(context), -1)
    print("C API:", status, L._last_error())
    assert status == L.UNSUPPORTED and "finds no usable GPU" in L._last_error(), status
    try:
        tiledlse.linear_cross_entropy(torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(2, dtype=torch.int64))
    except tiledlse.TiledLSEError as e:
        print("Python:", e)
    else:
        raise AssertionError("no exception")
""")


@pytest.mark.skipif(not L.device_available(L.DEVICE_CUDA), reason="needs a CUDA build of the library")
def test_cuda_build_without_gpu():
    """A CUDA build where no GPU is usable (hidden from a child process by CUDA_VISIBLE_DEVICES):
    the C API returns TLSE_ERROR_UNSUPPORTED with a one-line message and Python raises
    TiledLSEError; nothing aborts (Kokkos' own error would be std::terminate)."""
    import tiledlse
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TILEDLSE_LIBRARY=L.library_path,
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(tiledlse.__file__))))
    child = subprocess.run([sys.executable, "-c", NO_GPU_CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stdout + child.stderr
    lines = child.stdout.splitlines()
    assert len(lines) == 2, child.stdout
    assert lines[0].startswith("C API: 2 tlse_context_create: ") and lines[1].startswith("Python: "), child.stdout


def test_host_call_from_another_thread():
    """From a thread other than the one that initialized Kokkos: the same result (a Serial host
    space), or, with Kokkos' OpenMP, a TiledLSEError saying why; never a crash."""
    import threading

    status, loss, e, c, targets = forward()  # this thread creates the context, if no test did
    assert status == L.SUCCESS, L._last_error()
    outcome = {}

    def call():
        outcome["status"], outcome["loss"], *_ = forward()
        outcome["message"] = L._last_error()

    worker = threading.Thread(target=call)
    worker.start()
    worker.join()
    if outcome["status"] == L.SUCCESS:
        return
    assert outcome["status"] == L.UNSUPPORTED
    assert "the thread that initialized Kokkos" in outcome["message"]
    assert outcome["loss"].item() == -1.0
