"""Child processes that die with their parent: the one piece of process plumbing both the worker supervision
(trainers/supervise.py) and the async env workers (envs/vector.py) need. Light on purpose (no numpy, torch or
gymnasium): a spawned worker imports it before anything else.
"""

from __future__ import annotations

import ctypes
import os
import signal


def die_with_parent(parent_pid: int, *, direct: bool = True) -> None:
    """Make this (child) process get SIGKILL when its parent dies, by any death, SIGKILL included (Linux
    ``PR_SET_PDEATHSIG``). The race at start is closed afterwards: a parent that died before the call is gone
    already, and the kernel would never send the signal. ``direct=False``: a fork server stands between (it
    exits when ``parent_pid`` does, and its exit fires the signal), so only ``parent_pid``'s life is checked.
    Elsewhere than Linux it does nothing (workers still stop at their parent's pipe EOF)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if (direct and os.getppid() != parent_pid) or not _alive(parent_pid):
        os._exit(1)  # orphaned before the signal was armed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
