"""How rollouts are grouped before a replay buffer writes them (``data/replay.py``).

Consecutive rollouts of the same env streams are glued into one write (``runs``, ``glue``): an off-policy
learner that gathers single env steps pays the per-call cost once per run, and the rows land in the same
slots as one write per rollout. A learner batch that holds one stream twice side by side (an actor that
delivered twice) is split into column groups of distinct streams (``unique_id_groups``, ``columns``). A rollout
collected in one go for several learner calls is cut back into its rollouts along time (``split_steps``).
"""

from __future__ import annotations

import numpy as np

from rltrain.data.structs import Rollout, obs_equal, obs_map


def runs(rollouts: list[Rollout], *, frame_stack: int | None) -> list[list[Rollout]]:
    """``rollouts`` in order, cut into runs that can be written glued together (see ``continues``)."""
    out: list[list[Rollout]] = []
    run: list[Rollout] = []
    for r in rollouts:
        # with frame stacks a stream that starts an episode at the seam is left to add_rollout's own checks
        ended = frame_stack is not None and bool(run) and _ends_an_episode(run[-1])
        if run and (ended or not continues(run[-1], r)):
            out.append(run)
            run = []
        run.append(r)
    if run:
        out.append(run)
    return out


def glue(run: list[Rollout], pieces: list[int] | None = None) -> tuple[Rollout, np.ndarray]:
    """One rollout of the run's steps in order, and ``segments`` [T]: step t belongs to the k-th rollout
    (the buffer lays its rows out per segment). ``pieces[i]``: run[i] is that many consecutive rollouts of
    equal length collected as one, each its own segment. A run of one rollout is not copied."""
    pieces = pieces or [1] * len(run)
    segments = np.concatenate([np.repeat(np.arange(p), r.shape[0] // p) for r, p in zip(run, pieces, strict=True)])
    segments += np.repeat(np.cumsum([0, *pieces[:-1]]), [r.shape[0] for r in run])
    if len(run) == 1:
        return run[0], segments
    cat = lambda *xs: np.concatenate(xs)  # noqa: E731
    merged = Rollout(obs=obs_map(cat, *[r.obs for r in run]), actions=cat(*[r.actions for r in run]),
                     log_probs=cat(*[r.log_probs for r in run]), rewards=cat(*[r.rewards for r in run]),
                     terminated=cat(*[r.terminated for r in run]), truncated=cat(*[r.truncated for r in run]),
                     next_obs=obs_map(cat, *[r.next_obs for r in run]), policy_version=np.zeros(0, np.int64),
                     env_ids=run[0].env_ids)
    return merged, segments


def continues(a: Rollout, b: Rollout) -> bool:
    """Whether ``b`` picks up every stream of ``a`` where it stopped (same streams, distinct ids, each column
    not at an episode end starting from ``a``'s last next observation): then writing them glued together
    makes the same links as writing them one after the other."""
    if a.shape[1] != b.shape[1] or (a.env_ids is None) != (b.env_ids is None):
        return False
    if a.env_ids is not None and (not np.array_equal(a.env_ids, b.env_ids)
                                  or len(np.unique(a.env_ids)) != len(a.env_ids)):
        return False
    live = ~(a.terminated[-1] | a.truncated[-1])
    if isinstance(a.next_obs, np.ndarray):  # the common case, without obs_map's and array_equal's overhead
        last, first = a.next_obs[-1], b.obs[0]
        if last.shape != first.shape:
            return False
        return bool((last == first).all() if live.all() else (last[live] == first[live]).all())
    return obs_equal(obs_map(lambda x: x[-1][live], a.next_obs), obs_map(lambda x: x[0][live], b.obs))


def unique_id_groups(ids: np.ndarray) -> list[np.ndarray]:
    """Column indices split into groups with distinct stream ids: the k-th occurrence of each id in group
    k."""
    seen: dict[int, int] = {}
    rank = np.empty(len(ids), np.int64)
    for n, i in enumerate(ids.tolist()):
        rank[n] = seen[i] = seen.get(i, -1) + 1
    return [np.flatnonzero(rank == k) for k in range(int(rank.max()) + 1)]


def columns(rollout: Rollout, cols: np.ndarray) -> Rollout:
    """The env columns ``cols`` of a time-major rollout (episode statistics are not carried)."""
    pick = lambda x: x[:, cols]  # noqa: E731
    return Rollout(obs=obs_map(pick, rollout.obs), actions=pick(rollout.actions),
                   log_probs=pick(rollout.log_probs), rewards=pick(rollout.rewards),
                   terminated=pick(rollout.terminated), truncated=pick(rollout.truncated),
                   next_obs=obs_map(pick, rollout.next_obs),
                   policy_version=rollout.policy_version if rollout.policy_version.ndim == 1 else
                   rollout.policy_version[:, cols], env_ids=np.asarray(rollout.env_ids)[cols])


def _ends_an_episode(rollout: Rollout) -> bool:
    """Some env of ``rollout`` ends an episode at its last step."""
    return bool((rollout.terminated[-1] | rollout.truncated[-1]).any())


def split_steps(rollout: Rollout, length: int) -> list[Rollout]:
    """A time-major rollout of k * ``length`` steps as its k consecutive rollouts of ``length`` steps (views). The
    episode statistics go with the last one (bookkeeping: no learner reads them from a rollout it learns from)."""
    T = rollout.shape[0]
    out = []
    for t0 in range(0, T, length):
        part, last = slice(t0, t0 + length), t0 + length >= T
        out.append(Rollout(obs=obs_map(lambda x, part=part: x[part], rollout.obs), actions=rollout.actions[part],
                           log_probs=rollout.log_probs[part], rewards=rollout.rewards[part],
                           terminated=rollout.terminated[part], truncated=rollout.truncated[part],
                           next_obs=obs_map(lambda x, part=part: x[part], rollout.next_obs),
                           policy_version=rollout.policy_version[part],
                           episode_returns=rollout.episode_returns if last else [],
                           episode_lengths=rollout.episode_lengths if last else [],
                           episode_successes=rollout.episode_successes if last else [], env_ids=rollout.env_ids,
                           core_state=rollout.core_state if t0 == 0 else None,
                           values=None if rollout.values is None else rollout.values[part]))
    return out
