"""What the tools (``rltrain-eval``, ``rltrain-export``, ``rltrain-report``) share about their arguments: a bad
one is one line and exit 2, never argparse's usage block or a traceback from far inside."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from rltrain.errors import ConfigError

MAX_EPISODES = 10_000_000  # rltrain-eval keeps every episode's return: 80 MB at this count
SEED_LIMIT = 2**63  # the eval generator (torch) and the envs' seeding take seeds below it


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def check_episodes_and_seed(episodes: int, seed: int | None) -> None:
    """Episode j is seeded ``seed + j``: both must fit what the envs and torch's generator take."""
    if not 0 < episodes <= MAX_EPISODES:
        raise ConfigError(f"--episodes={episodes} must be between 1 and {MAX_EPISODES:,}")
    if seed is not None and not 0 <= seed < SEED_LIMIT - episodes:
        raise ConfigError(f"--seed={seed} must be between 0 and 2**63 - episodes (episode j is seeded seed + j)")


CHECKPOINT_CHOICES = ("final", "best", "latest")


def pick_checkpoint(path: Path, which: str) -> Path:
    """The checkpoint file a run dir argument stands for: ``final`` (the end of training; the latest while the
    run has none), ``best`` (the best periodic evaluation) or ``latest`` (the most env steps); a file as it
    is."""
    from rltrain.run.checkpoint import CheckpointManager, no_checkpoint_in

    if not path.is_dir():
        return path
    ckdir = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    named = ckdir / f"{which}.pt"
    if which in ("final", "best") and named.exists():
        return named
    if which == "best" and any(ckdir.glob("*.pt")):
        raise ConfigError(f"{path}: no best.pt (no evaluation was run yet); use --checkpoint final or latest")
    # no checkpoint at all (a trainer=parallel run, a sweep dir): the line names the runs below, as every tool's
    latest = None if which == "best" else CheckpointManager(ckdir).latest()
    if latest is None:
        raise no_checkpoint_in(path)
    return latest
