"""``init_process``: what every training process sets before it builds anything, in one place.

A training process is the launcher (``cli/build.prepare``), a parallel agent, a distributed rank or an actor
(subprocess or Ray). Each runs ``torch_threads`` intra-op threads (default 1: the small matmuls of RL gain
nothing from more, and on a shared machine the extra threads spin against the other processes) and keeps the
heap memory a step frees (``run.heap.keep_heap``). A new process-wide setting goes here, so that no kind of
process is left without it.
"""

from __future__ import annotations

from rltrain.run.heap import keep_heap


def init_process(*, torch_threads: int) -> None:
    """Set this process's torch intra-op threads and glibc's heap thresholds (``run.heap``)."""
    import torch  # here, not at the top: the launcher modules that import this stay light until they run

    torch.set_num_threads(int(torch_threads))
    keep_heap()
