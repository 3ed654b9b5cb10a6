"""``init_process``: what every training process sets before it builds anything, in one place.

A training process is the launcher (``cli/build.prepare``), a parallel agent, a distributed rank or an actor
(subprocess or Ray). Each runs ``torch_threads`` intra-op threads (default 1: the small matmuls of RL gain
nothing from more, and on a shared machine the extra threads spin against the other processes) and keeps the
heap memory a step frees (``run.heap.keep_heap``). A new process-wide setting goes here, so that no kind of
process is left without it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from rltrain.run.heap import keep_heap


def init_process(*, torch_threads: int) -> None:
    """Set this process's torch intra-op threads and glibc's heap thresholds (``run.heap``)."""
    import torch  # here, not at the top: the launcher modules that import this stay light until they run

    torch.set_num_threads(int(torch_threads))
    keep_heap()


@contextlib.contextmanager
def callers_threads() -> Iterator[None]:
    """The Python API runs in the caller's process (a script, a notebook's kernel): a run there sets torch's
    threads (``init_process``) and numpy's OpenBLAS to one (``numpy_mlp.single_thread_blas``, also when a policy is
    loaded), so the caller's own torch / numpy work afterwards ran on one core. Put back what the caller had."""
    import torch

    from rltrain.models.numpy_mlp import blas_threads, set_blas_threads

    threads, blas, blas_env = torch.get_num_threads(), blas_threads(), os.environ.get("OPENBLAS_NUM_THREADS")
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        if blas is not None and blas != blas_threads():
            set_blas_threads(blas)
        if blas_env is None:  # set for the run's child processes only
            os.environ.pop("OPENBLAS_NUM_THREADS", None)
