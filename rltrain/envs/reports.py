"""``EpisodeReports``: what the vector envs (envs/vector.py) hand the collector about the episodes that ended,
beside their rewards: real game scores (``env.wrappers``, envs/wrappers.py) and goal tasks' ``info["is_success"]``."""

from __future__ import annotations


class EpisodeReports:
    """What both vector envs hand the collector about the episodes that ended, beside their rewards."""

    _real: list[tuple[int, float, int]] | None
    _successes: list[bool]

    def pop_real_episodes(self) -> list[tuple[int, float, int]] | None:
        """(env index, real game score, length in steps) of the games that ended since the last call, or
        None when the envs do not report real scores (no ``env.wrappers``: the rewards are the score)."""
        if self._real is None:
            return None
        done, self._real = self._real, []
        return done

    def pop_successes(self) -> list[bool]:
        """``info["is_success"]`` of the episodes that ended since the last call, in (step, env) order (goal tasks,
        Gymnasium-Robotics' convention); episodes whose last info has no such key are left out."""
        done, self._successes = self._successes, []
        return done
