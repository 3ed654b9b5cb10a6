"""Frame stacks stored once per frame: the checks and index walks behind ``ReplayBuffer(frame_stack=K)``.

An observation that is a stack of the last K frames along its first axis (Gymnasium's
``FrameStackObservation``; the DQN Atari setting, Mnih et al. 2015) repeats K-1 frames of the previous
observation. The buffer keeps only the newest frame of each row plus ``prev``, the row of the same env
stream one step earlier, and rebuilds a stack by walking ``prev`` K-1 times. At an episode start
``prev = START`` and the walk stays put, which repeats the first frame: exactly what
``FrameStackObservation`` does with its default ``padding_type="reset"`` (checked against gymnasium 1.4).
A row whose older frames never reached the buffer (a stream first seen mid-episode) has
``prev = UNKNOWN`` and, with the rows that would need its history, is never sampled.

Row ids are *global* ids (``gid``): the number of rows written before it. Row ``g`` lives in slot
``g % capacity`` and is alive while ``g >= written - capacity``, so a dead link is recognised without
clearing anything when the ring overwrites a slot.
"""

from __future__ import annotations

import numpy as np

from rltrain.errors import ConfigError

START = -1  # prev of an episode's first row: the stack is padded by repeating its frame
UNKNOWN = -2  # prev of a row whose history is not in the buffer
DEAD = np.iinfo(np.int64).min // 4  # "oldest frame" of a stack that can never be rebuilt


def frame_shape(obs_shape: tuple[int, ...], k: int) -> tuple[int, ...]:
    """The stored shape of one frame; refuses observations that are not [k, ...] stacks."""
    if k < 2 or len(obs_shape) < 2 or obs_shape[0] != k:
        raise ConfigError(f"algo.frame_stack={k}: observations of shape {tuple(obs_shape)} are not stacks of "
                          f"{k} frames along the first axis (k >= 2); set algo.frame_stack=null")
    return tuple(obs_shape[1:])


def padded(stacks: np.ndarray) -> np.ndarray:
    """stacks [B, K, *frame] -> [B] True where every frame repeats the newest (a reset-padded stack)."""
    eq = stacks[:, :-1] == stacks[:, -1:]
    return eq.all(axis=tuple(range(1, eq.ndim)))


def shifted(older: np.ndarray, newer: np.ndarray) -> np.ndarray:
    """older, newer [B, K, *frame] -> [B] True where ``newer`` is ``older`` moved on by one frame."""
    eq = newer[:, :-1] == older[:, 1:]
    return eq.all(axis=tuple(range(1, eq.ndim)))


def verify_rollout(obs: np.ndarray, next_obs: np.ndarray, done: np.ndarray, starts: np.ndarray,
                   ids: np.ndarray) -> None:
    """Raise one ConfigError line unless the rollout's stacks can be rebuilt from one frame per step.

    obs, next_obs [T, N, K, *frame]; done [T, N] bool (terminated | truncated); starts [T, N] bool: rows
    the buffer treats as episode starts (their stack must be reset-padded). Checked: each non-final step's
    successor stack is its stack shifted by one frame, every true next observation (final ones included)
    shifts its row's stack, and every start is padded.
    """
    T, N, k = obs.shape[:3]
    flat = lambda x: x.reshape(-1, *x.shape[2:])  # noqa: E731
    bad = ~shifted(flat(obs), flat(next_obs)).reshape(T, N)
    if T > 1:
        bad[:-1] |= ~done[:-1] & ~shifted(flat(obs[:-1]), flat(obs[1:])).reshape(T - 1, N)
    st, sn = np.nonzero(starts)
    bad[st, sn] |= ~padded(obs[st, sn])
    if bad.any():
        t, n = (int(i[0]) for i in np.nonzero(bad))
        raise ConfigError(f"algo.frame_stack={k}: the observation of env stream {int(ids[n])} at rollout step {t} "
                          f"is not a {k}-frame stack that moves on by one frame per step (gymnasium "
                          f"FrameStackObservation with padding_type='reset'); set algo.frame_stack=null")


def oldest_frames(gids: np.ndarray, prev_new: np.ndarray, base: int, prev_stored: np.ndarray, alive_from: int,
                  k: int) -> np.ndarray:
    """The gid of the oldest frame each row's stack needs (DEAD if its history is gone or unknown).

    gids [R] rows written in this add (gids ``base ...``) with their prev ``prev_new`` [R]; older rows'
    prev is read from ``prev_stored`` (slot-indexed), valid for gids ``>= alive_from``. Walks K-1 links;
    gids only decrease along a walk, so the row is sampleable while this oldest gid is alive.
    """
    cap = len(prev_stored)
    cur = gids.copy()
    for _ in range(k - 1):
        p = np.full_like(cur, DEAD)
        new = cur >= base
        p[new] = prev_new[cur[new] - base]
        old = ~new & (cur >= alive_from)
        p[old] = prev_stored[cur[old] % cap]
        cur = np.where(p == START, cur, np.where(p == UNKNOWN, DEAD, p))
    return cur


def stack_slots(gids: np.ndarray, prev_stored: np.ndarray, k: int) -> np.ndarray:
    """gids [B] of live rows with live histories -> slots [B, K] of their frames, oldest first."""
    cap = len(prev_stored)
    slots = np.empty((len(gids), k), np.int64)
    cur = gids
    slots[:, -1] = cur % cap
    for j in range(k - 2, -1, -1):
        p = prev_stored[cur % cap]
        cur = np.where(p >= 0, p, cur)  # START: repeat the episode's first frame (reset padding)
        slots[:, j] = cur % cap
    return slots
