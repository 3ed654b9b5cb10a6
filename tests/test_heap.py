"""run/heap.py: a training process keeps the memory a step frees, so the next step does not fault it back in;
run/process.py: ``init_process``, what every training process calls first, sets it with the torch threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# what a learning step does to the heap: allocate a few MiB of tensors of a few hundred KiB, write them, free them
_STEPS = """
import ctypes, json, resource, sys, torch
from rltrain.run.heap import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, keep_heap
# glibc's starting thresholds, 128 KiB each (its adaptive rule moves them, or not, depending on what the process
# freed before): a step's tensors are mapped, or its heap top trimmed, and faulted in again at the next step
ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, 128 * 1024)
ctypes.CDLL(None).mallopt(M_TRIM_THRESHOLD, 128 * 1024)
if sys.argv[1] == "process":  # the seam every kind of training process goes through
    from rltrain.run.process import init_process
    init_process(torch_threads=2)
    kept = torch.get_num_threads() == 2
else:
    kept = keep_heap() if sys.argv[1] == "keep" else False
def step():
    xs = [torch.ones(256, 256) for _ in range(24)]  # 256 KiB each, written
    return sum(float(x[0, 0]) for x in xs)
steps = int(sys.argv[2])  # 0: only whether the thresholds were kept
for _ in range(steps // 10):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(steps):
    step()
print(json.dumps({"kept": kept, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _faults(mode: str, steps: int = 200, **env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _STEPS, mode, str(steps)], capture_output=True, text=True, check=True,
                         env={**os.environ, **env})
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux")
def test_a_kept_heap_serves_each_step_without_page_faults():
    plain, kept = _faults("plain"), _faults("keep")
    assert kept["kept"] is True
    assert plain["faults"] >= 200 * 24
    assert kept["faults"] < 200


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux")
def test_init_process_sets_the_threads_and_keeps_the_heap():
    result = _faults("process")
    assert result["kept"] is True  # torch.get_num_threads() is the number asked for
    assert result["faults"] < 200


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux")
def test_thresholds_the_user_set_are_left_alone():
    # no steps: a user's thresholds are the process's own, whatever they cost it
    assert _faults("keep", 0, MALLOC_TRIM_THRESHOLD_="131072")["kept"] is False
    assert _faults("keep", 0, GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072")["kept"] is False
