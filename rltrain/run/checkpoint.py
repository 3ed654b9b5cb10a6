"""Checkpoints: atomic writes, keep-last-N / best / final, full-state resume.

A checkpoint is a plain dict of tensors and Python containers (RNG states included as plain dicts), so it
loads with ``torch.load(weights_only=True)``. Environments cannot go into that format, so a sidecar
``<name>.envs.pkl`` holds the pickled envs when they pickle; with it, resume continues the very same
trajectories, without it the envs restart from fresh episodes (documented: then resume is exact only in
the learner state).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from rltrain.errors import ConfigError

_STEP_RE = re.compile(r"^step_(\d+)\.pt$")


def atomic_save(obj: dict, path: Path) -> None:
    """torch.save to a temp file in the same dir, fsync, then rename: a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_bytes(data: bytes, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class CheckpointManager:
    """Writes ``checkpoints/step_<env_steps>.pt`` (keeps the last N), ``best.pt`` and ``final.pt``."""

    def __init__(self, directory: Path, *, keep_last: int = 3):
        self.dir = Path(directory)
        self.keep_last = keep_last

    def save(self, state: dict, env_steps: int, *, envs: bytes | None = None, kind: str = "step") -> Path:
        name = f"step_{env_steps:012d}.pt" if kind == "step" else f"{kind}.pt"
        path = self.dir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        if envs is not None:
            atomic_write_bytes(envs, path.with_suffix(".envs.pkl"))
        atomic_save(state, path)
        if kind == "step":
            self._prune()
        return path

    def _prune(self) -> None:
        steps = sorted(p for p in self.dir.glob("step_*.pt") if _STEP_RE.match(p.name))
        for old in steps[: max(len(steps) - self.keep_last, 0)]:
            old.unlink(missing_ok=True)
            old.with_suffix(".envs.pkl").unlink(missing_ok=True)

    def latest(self) -> Path | None:
        """The checkpoint with the most env steps (step_*, final or best), or None."""
        best_path, best_steps = None, -1
        for p in self.dir.glob("*.pt"):
            try:
                steps = int(torch.load(p, weights_only=True, map_location="cpu", mmap=True)["counters"]["env_steps"])
            except Exception:
                continue
            # prefer step/final over best at equal steps: they are written after the best
            if steps > best_steps or (steps == best_steps and p.name != "best.pt"):
                best_path, best_steps = p, steps
        return best_path


def load_checkpoint(path: Path, *, key: str = "resume") -> tuple[dict, bytes | None]:
    """Load a checkpoint file (or the latest in a run dir / checkpoints dir) and its env sidecar."""
    path = Path(path)
    if path.is_dir():
        found = CheckpointManager(path / "checkpoints" if (path / "checkpoints").is_dir() else path).latest()
        if found is None:
            raise ConfigError(f"{key}={path}: no checkpoint found in that directory")
        path = found
    if not path.exists():
        raise ConfigError(f"{key}={path}: no such file or directory")
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:
        raise ConfigError(f"{key}={path}: not an rltrain checkpoint ({type(err).__name__})") from None
    if not isinstance(state, dict) or "algo" not in state or "counters" not in state:
        raise ConfigError(f"{key}={path}: not an rltrain checkpoint (missing 'algo'/'counters')")
    sidecar = path.with_suffix(".envs.pkl")
    return state, (sidecar.read_bytes() if sidecar.exists() else None)
