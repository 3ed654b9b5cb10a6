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


def check_episodes_and_seed(episodes: int, seed: int | None, *, names: tuple[str, str] = ("--episodes", "--seed")
                            ) -> None:
    """Episode j is seeded ``seed + j``: both must fit what the envs and torch's generator take. ``names``: how
    the caller spells the two (the flags; ``rltrain.evaluate``'s arguments ``episodes``, ``seed``)."""
    if not 0 < episodes <= MAX_EPISODES:
        raise ConfigError(f"{names[0]}={episodes} must be between 1 and {MAX_EPISODES:,}")
    if seed is not None and not 0 <= seed < SEED_LIMIT - episodes:
        raise ConfigError(f"{names[1]}={seed} must be between 0 and 2**63 - episodes (episode j is seeded seed + j)")


CHECKPOINT_CHOICES = ("final", "best", "latest")


def pick_checkpoint(path: Path, which: str, *, name: str = "--checkpoint", key: str | None = None) -> Path:
    """The checkpoint file a run dir argument stands for: ``final`` (the end of training; the latest while the
    run has none), ``best`` (the best periodic evaluation) or ``latest`` (the most env steps); a file as it
    is. ``name``: how the caller spells the choice (``--checkpoint``; ``rltrain.evaluate``'s ``checkpoint``),
    ``key``: the path (``rltrain.evaluate``'s ``path``; the command line's positional argument has no name)."""
    from rltrain.run.checkpoint import CheckpointManager, no_checkpoint_in

    if which not in CHECKPOINT_CHOICES:  # argparse checks the flag; a Python caller's typo must not mean final
        raise ConfigError(f"{name}={which!r} is not one of {', '.join(CHECKPOINT_CHOICES)}")
    if not path.is_dir():
        return path
    ckdir = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    named = ckdir / f"{which}.pt"
    if which in ("final", "best") and named.exists():
        return named
    if which == "best" and any(ckdir.glob("*.pt")):
        other = f"{name} final or latest" if name.startswith("--") else f'{name}="final" or "latest"'
        raise ConfigError(f"{f'{key}=' if key else ''}{path}: no best.pt (no evaluation was run yet); use {other}")
    # no checkpoint at all (a trainer=parallel run, a sweep dir): the line names the runs below, as every tool's
    latest = None if which == "best" else CheckpointManager(ckdir).latest()
    if latest is None:
        raise no_checkpoint_in(path, key=key)
    return latest
