"""``Cadence``: when the loop logs, evaluates and checkpoints.

Each of ``log``, ``eval`` and ``checkpoint`` is due at the multiples of its ``every_env_steps`` (0: never).
A resumed run keeps the same grid: the next multiple after the checkpoint's step, so a run cut in two logs,
evaluates and checkpoints at the same steps as one that ran through.
"""

from __future__ import annotations

NEVER = 1 << 62


def next_multiple(steps: int, every: int) -> int:
    """The first multiple of ``every`` after ``steps`` (``NEVER`` when ``every`` is 0)."""
    return (steps // every + 1) * every if every > 0 else NEVER


class Cadence:
    def __init__(self, every: dict[str, int], start_steps: int):
        self.every = dict(every)
        self.next = {name: next_multiple(start_steps, e) for name, e in self.every.items()}

    def due(self, name: str, steps: int) -> bool:
        return steps >= self.next[name]

    def done(self, name: str, steps: int) -> None:
        """``name`` ran at ``steps``: the next one is at the following multiple."""
        self.next[name] = next_multiple(steps, self.every[name])
