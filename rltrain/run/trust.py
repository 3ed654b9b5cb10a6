"""What a reader may trust of a file before it reads it: that it is a regular file, and (a checkpoint) that its
weights are numbers.

A FIFO named like a checkpoint would block ``torch.load`` forever (a stop request included), a device would
read without end: ``not_regular`` names what a path is instead. A checkpoint whose weights hold a NaN or an
infinity was not written by rltrain (the non-finite guard checks every save): ``first_non_finite`` names the
first such tensor, so evaluation, export and resume refuse it in one line instead of acting on garbage.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

# a checkpoint's replay buffer holds data, not weights (the guard checked it on the way in)
_DATA_KEYS = ("buffer", "replay")


def kind_of(mode: int) -> str:
    """``a FIFO``, ``a directory``, ... for an ``st_mode`` that is not a regular file's."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def not_regular(path: Path) -> str | None:
    """What ``path`` (links followed) is when it is not a regular file, else None (also when it is missing:
    the read reports that)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else kind_of(mode)


def first_non_finite(tree: object, name: str) -> str | None:
    """``<name.path> holds nan (k of n values)`` for the first floating tensor in ``tree`` (nested dicts and
    lists, a replay buffer's data left out) holding a NaN or an infinity, else None."""
    import torch  # here: the run-dir lock imports this module, and must not pay for torch

    if isinstance(tree, torch.Tensor):
        if not tree.is_floating_point() or tree.numel() == 0:
            return None
        finite = torch.isfinite(tree)
        if bool(finite.all()):
            return None
        bad = tree[~finite]
        return f"{name} holds {bad[0].item()} ({int(bad.numel())} of {tree.numel()} values)"
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, (list, tuple)) else ()
    for key, value in items:
        if any(part in str(key).lower() for part in _DATA_KEYS):
            continue
        found = first_non_finite(value, f"{name}.{key}")
        if found:
            return found
    return None
