"""What a replay ring or a rollout costs in memory, against what this machine has: refused in one line
before anything is allocated (``np.zeros`` maps pages lazily, so an oversized ring would otherwise fail
hours later, in the OOM killer)."""

from __future__ import annotations

import os

import numpy as np

from rltrain.errors import ConfigError

_GIB = 2**30


def available_memory() -> int:
    """Bytes the kernel can hand out without swapping (MemAvailable), or free physical pages elsewhere."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def row_bytes(row_shape: tuple[int, ...], obs_dtype: np.dtype, action_shape: tuple[int, ...],
              action_dtype: np.dtype, *, frame_stack: int | None,
              obs_bytes: int | None = None) -> dict[str, int]:
    """Bytes one ring row takes, per field: the stored observation (one frame with ``frame_stack``; a Dict
    observation passes its ``obs_bytes``, all keys together), the action, the reward, two bool flags
    (terminated, final) and the int64 links (next; + prev, oldest)."""
    if obs_bytes is None:
        obs_bytes = int(np.prod(row_shape)) * np.dtype(obs_dtype).itemsize
    return {"obs": obs_bytes,
            "action": int(np.prod(action_shape)) * np.dtype(action_dtype).itemsize, "reward": 4, "flags": 2,
            "links": 8 * (1 if frame_stack is None else 3)}


def ring_fits(capacity: int, per_row: dict[str, int], *, stack_hint: tuple[int, ...] | None) -> int:
    """Bytes a ring of ``capacity`` rows of ``per_row`` needs; refuses (one line) when that exceeds the
    machine's available memory. ``stack_hint``: the shape of unstacked-storage observations, to suggest
    ``algo.frame_stack`` when they look like a frame stack (channels first, 2 to 16 of them)."""
    per_total = sum(per_row.values())
    need, avail = capacity * per_total, available_memory()
    if need > avail:
        parts = " + ".join(f"{b} B {name}" for name, b in per_row.items())
        stacked = stack_hint is not None and len(stack_hint) >= 3 and 2 <= stack_hint[0] <= 16
        hint = ""
        if stacked:  # each frame stored once: 1/K of the observation bytes, two more int64 links per row
            k = stack_hint[0]
            once = capacity * (per_total - per_row["obs"] + per_row["obs"] // k + (16 if per_row["links"] == 8 else 0))
            hint = f" or store each frame once with algo.frame_stack={k} ({once / _GIB:.1f} GiB)"
        raise ConfigError(f"algo.buffer_size={capacity} needs {need / _GIB:.1f} GiB ({capacity} x "
                          f"({parts}) = {capacity} x {per_total} B) but {avail / _GIB:.1f} GiB are "
                          f"available; lower algo.buffer_size{hint}")
    return need
