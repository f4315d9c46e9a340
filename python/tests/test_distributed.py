"""tiledlse.distributed on 2 and 3 spawned ranks: gloo on CPU always; NCCL on CUDA too when the
library has CUDA and torch sees at least 2 GPUs (rank r on cuda:r). Each rank compares its share
of the loss and gradients with plain PyTorch on the gathered global batch (distributed_worker.py);
bad input must raise the same exception on every rank, within a timeout (never a hang).
"""
import functools
import os
import pickle
import shutil
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import distributed_worker
from tiledlse import _library

BACKENDS = []
if dist.is_available() and dist.is_gloo_available():
    BACKENDS.append("gloo")
if (dist.is_available() and dist.is_nccl_available() and _library.device_available(_library.DEVICE_CUDA)
        and torch.cuda.device_count() >= 2):
    BACKENDS.append("nccl")
RUNS = [(backend, size) for backend in BACKENDS for size in (2, 3) if backend != "nccl" or
        size <= torch.cuda.device_count()]
RUN_IDS = ["%s-%dranks" % run for run in RUNS]
TIMEOUT_S = 240  # the whole run of one (backend, size); a collective left waiting fails after 60 s


@functools.lru_cache(maxsize=None)
def results(backend, size):
    """Every rank's outcome of every scenario: one spawn of `size` ranks per (backend, size)."""
    work = tempfile.mkdtemp(prefix="tiledlse_dist_")
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # the ranks share the cores
    try:
        spawn = mp.get_context("spawn")
        ranks = [spawn.Process(target=distributed_worker.run,
                               args=(r, size, backend, os.path.join(work, "init"), work)) for r in range(size)]
        for p in ranks:
            p.start()
        for p in ranks:
            p.join(TIMEOUT_S)
        hung = [r for r, p in enumerate(ranks) if p.is_alive()]
        for p in ranks:
            if p.is_alive():
                p.kill()
        assert not hung, "ranks %s did not finish within %d s" % (hung, TIMEOUT_S)
        assert all(p.exitcode == 0 for p in ranks), "exit codes %s" % [p.exitcode for p in ranks]
        outcome = []
        for r in range(size):
            with open(os.path.join(work, "%d.pkl" % r), "rb") as f:
                outcome.append(pickle.load(f))
        return outcome
    finally:
        if saved is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = saved
        shutil.rmtree(work, ignore_errors=True)


def outcomes(run, scenario):
    """Each rank's return value of `scenario`; fails with a rank's traceback."""
    values = []
    for rank, per_rank in enumerate(results(*run)):
        status, value = per_rank[scenario]
        assert status == "ok", "rank %d of %s:\n%s" % (rank, run, value)
        values.append(value)
    return values


MATCHES_TORCH = [name for name in distributed_worker.SCENARIOS if name.startswith(("contrastive", "cross_entropy"))]


@pytest.mark.parametrize("run", RUNS, ids=RUN_IDS)
@pytest.mark.parametrize("scenario", MATCHES_TORCH)
def test_matches_torch(run, scenario):
    outcomes(run, scenario)


@pytest.mark.parametrize("run", RUNS, ids=RUN_IDS)
@pytest.mark.parametrize("scenario, error, pattern", [
    ("mismatched_features", "ValueError", "argument 'I' has columns \\(features\\) 5 on rank (1|2) but 4 on rank 0"),
    ("wrong_dtype_on_one_rank", "TypeError",
     "argument 'labels' must have dtype torch.int64, got torch.int32 \\(on rank 1 of the process group\\)"),
    ("wrong_device", "ValueError", "argument 'e' is on meta but the process group's backend (gloo|nccl) moves"),
    ("bad_precision_on_one_rank", "ValueError",
     "argument 'precision' must be 'exact' or 'tf32', got 'fp32' \\(on rank 1 of the process group\\)"),
    ("bad_budget_on_one_rank", "ValueError",
     "argument 'memory_budget' must be None or a positive int \\(bytes\\), got 0 \\(on rank 1 of the process group\\)"),
    ("target_out_of_range", "ValueError", "argument 'targets' has targets\\[2\\] = (4|6), outside \\[0, (4|6)\\)"),
])
def test_bad_input_raises_the_same_on_every_rank(run, scenario, error, pattern):
    import re
    errors = outcomes(run, scenario)
    assert all(e == errors[0] for e in errors), "ranks disagree: %s" % errors
    kind, message = errors[0]
    assert kind == error and re.search(pattern, message), errors[0]
