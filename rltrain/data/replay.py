"""Preallocated ring replay buffer for the off-policy algorithms (DQN, SAC): every observation stored once.

A *row* holds one observation in its own dtype (uint8 pixels stay uint8: the model converts and scales)
with the transition that starts there: action, reward, ``terminated``. The next observation is not stored
again: ``next_gid`` names the row of the same env stream one step later. At an episode end that row would
hold the reset observation, so the true final observation gets a row of its own (``final``, never sampled
itself): truncated transitions bootstrap from it (Pardo et al. 2018), terminated ones do not bootstrap.
``algo.buffer_size`` therefore counts observations: one per transition plus one per episode end.

Rollouts arrive time-major ``[T, N]``. The last step of a rollout finds its successor in the next rollout
of the same env stream (``Rollout.env_ids``, or the column index); the link is made only when that
rollout's first observation equals the previous rollout's last ``next_obs``, so a stream whose envs were
reset in between (a restarted actor, a resume without env state) starts afresh instead of inventing a
transition. Until its successor has arrived a row is not sampled.

Rows carry global ids (``gid`` = rows written before it, slot ``gid % capacity``): a link to a row the
ring has overwritten is recognised as dead (``gid < written - capacity``) without touching the linking row.
With ``frame_stack=K`` only each stack's newest frame is stored and stacks are rebuilt on sampling
(see ``rltrain.data.frames``). ``add`` is a few slice writes, ``sample`` a few gathers.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter

import numpy as np
import torch
from torch import Tensor

from rltrain.data import frames, streams
from rltrain.data.memory import ring_fits, row_bytes
from rltrain.data.structs import (
    ObsArray,
    ObsSpace,
    Rollout,
    obs_buffer,
    obs_equal,
    obs_leaves,
    obs_map,
    obs_put,
)
from rltrain.errors import ConfigError


@dataclass
class Batch:
    """A sampled minibatch of B transitions (tensors on the learner's device).

    obs [B, *obs_shape] and next_obs [B, *obs_shape] in the stored dtype (for a Dict observation space a
    dict of such tensors, one per key, each in its own dtype), actions [B, *action_shape],
    rewards [B] float32, terminated [B] float32 (1.0 = no bootstrap); discounts [B] float32: gamma^k for
    n-step transitions of k steps (data/nstep.py; None: one step, gamma); weights [B] float32 and slots [B]:
    prioritised replay's importance weights and the rows drawn (data/prioritized.py; None: uniform)
    """

    obs: Tensor | dict
    actions: Tensor
    rewards: Tensor
    next_obs: Tensor | dict
    terminated: Tensor
    discounts: Tensor | None = None
    weights: Tensor | None = None
    slots: np.ndarray | None = None


class ReplayBuffer:
    """Uniform-sampling ring of observations and the transitions that start at them.

    ``obs_space`` of kind dict (a Dict observation space): ``obs`` is a dict of rings, one per stored key
    (``structs.obs_buffer``), each in its own dtype; frame-stack storage is for plain arrays only."""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], action_shape: tuple[int, ...],
                 action_dtype: np.dtype, *, device: torch.device, obs_dtype: np.dtype = np.dtype(np.float32),
                 frame_stack: int | None = None, obs_space: ObsSpace | None = None):
        if capacity <= 0:
            raise ConfigError(f"algo.buffer_size={capacity} must be > 0")
        self.capacity, self.device, self.frame_stack = int(capacity), device, frame_stack
        self.obs_shape, self.obs_dtype = tuple(obs_shape), np.dtype(obs_dtype or np.float32)
        self.tree = obs_space is not None and obs_space.kind == "dict"
        if self.tree and frame_stack is not None:
            raise ConfigError(f"algo.frame_stack={frame_stack}: frames are stored once only for array observations, "
                              f"not for the Dict {obs_space.name}; set algo.frame_stack=null")
        row_shape = self.obs_shape if frame_stack is None else frames.frame_shape(self.obs_shape, frame_stack)
        obs_bytes = None
        if self.tree:
            obs_bytes = sum(int(np.prod(x.shape[1:])) * x.itemsize for x in obs_leaves(obs_buffer(obs_space, (0,))))
        per_row = row_bytes(row_shape, self.obs_dtype, action_shape, np.dtype(action_dtype),
                            frame_stack=frame_stack, obs_bytes=obs_bytes)
        self.nbytes = ring_fits(self.capacity, per_row,
                                stack_hint=None if frame_stack is not None or self.tree else self.obs_shape)
        C = self.capacity
        # np.zeros maps untouched pages lazily: memory is committed as the ring fills
        self.obs: ObsArray = (obs_buffer(obs_space, (C,), np.zeros) if self.tree
                              else np.zeros((C, *row_shape), self.obs_dtype))
        self.actions = np.zeros((C, *action_shape), action_dtype)
        self.rewards = np.zeros(C, np.float32)
        self.terminated = np.zeros(C, bool)
        self.final = np.zeros(C, bool)  # the row holds an episode's final observation, not a transition
        self.next_gid = np.zeros(C, np.int64)  # successor row; -1 until it has arrived
        self.fields = ["obs", "actions", "rewards", "terminated", "final", "next_gid"]
        if frame_stack is not None:
            self.prev_gid = np.zeros(C, np.int64)  # predecessor row in the episode, or frames.START / UNKNOWN
            self.oldest = np.zeros(C, np.int64)  # gid of the oldest frame the row's stack needs
            self.fields += ["prev_gid", "oldest"]
        self.written = 0  # rows ever written; the ring holds gids [written - capacity, written)
        self.ready = 0  # transitions held whose successor has arrived (an upper bound on the sampleable)
        self.tails: dict[int, tuple[int, np.ndarray]] = {}  # stream -> (last row, its next_obs), mid-episode

    def __len__(self) -> int:
        """Transitions held (rows that are not final observations), whether or not sampleable yet."""
        rows = min(self.written, self.capacity)
        return rows - int(np.count_nonzero(self.final[:rows]))

    # -- adding ------------------------------------------------------------------------------------------
    def add_rollouts(self, rollouts: list[Rollout], *, pieces: list[int] | None = None) -> None:
        """``add_rollout`` for each of ``rollouts`` in order, with the same rows in the same slots, but a run
        of consecutive rollouts of the same streams is written in one go (an off-policy learner that gathers
        single env steps and writes them when an update is due pays the per-call cost once per run).
        ``pieces[i]``: rollout i is that many consecutive rollouts of equal length collected as one (rows laid
        out as if added one by one); not with frame stacks (split those first: ``streams.split_steps``)."""
        pieces = pieces or [1] * len(rollouts)
        done = 0
        for run in streams.runs(rollouts, frame_stack=self.frame_stack):
            counts, done = pieces[done:done + len(run)], done + len(run)
            if counts == [1]:
                self.add_rollout(run[0])
            else:
                merged, segments = streams.glue(run, counts)
                self.add_rollout(merged, segments=segments)

    def add_rollout(self, rollout: Rollout, *, segments: np.ndarray | None = None) -> None:
        """Append a time-major rollout ``[T, N]``: T*N transition rows, then one row per episode end.

        ``segments`` [T] (non-decreasing, from 0): the rollout is several consecutive ones glued together
        (``add_rollouts``); each segment's rows come first, then its episode ends' rows, exactly where
        adding the segments one by one would have put them."""
        T, N = rollout.shape
        ids = np.arange(N) if rollout.env_ids is None else np.asarray(rollout.env_ids, np.int64).reshape(N)
        if N > 1 and len(np.unique(ids)) != N:
            # a learner batch can hold consecutive rollouts of one stream side by side (an actor that delivered
            # twice): add them one after the other, in column order, which is their order of arrival
            for cols in streams.unique_id_groups(ids):
                self.add_rollout(streams.columns(rollout, cols))
            return
        obs, next_obs = self._checked(rollout.obs), self._checked(rollout.next_obs)
        done = np.asarray(rollout.terminated | rollout.truncated, bool)
        base, C = self.written, self.capacity
        gid = base + np.arange(T * N, dtype=np.int64).reshape(T, N)
        ends_t, ends_n = np.nonzero(done)  # time-major order, matching the final rows' gids
        final_gid = base + T * N + np.arange(len(ends_t), dtype=np.int64)
        order = None  # the written rows in gid order, when that is not "regular rows, then final rows"
        if segments is not None and segments[-1] > 0 and len(ends_t):
            # segment k's rows are shifted by the episode ends of the segments before it; its final rows
            # follow its own last step
            seg_end = np.searchsorted(segments, segments, side="right")  # [T] one past each step's segment
            ends_before = np.concatenate([[0], np.cumsum(np.bincount(segments[ends_t], minlength=segments[-1] + 1))])
            gid += ends_before[segments][:, None]
            final_gid = base + seg_end[ends_t] * N + np.arange(len(ends_t), dtype=np.int64)
            order = np.argsort(np.concatenate([gid.reshape(-1), final_gid]), kind="stable")
        nxt = np.full((T, N), -1, np.int64)
        nxt[:-1] = gid[1:]
        nxt[ends_t, ends_n] = final_gid
        prev0 = self._stream_heads(ids, obs_map(itemgetter(0), obs))
        top = base + T * N + len(ends_t)  # `written` after this add
        regular = {"obs": obs, "actions": rollout.actions, "rewards": rollout.rewards,
                   "terminated": rollout.terminated, "final": np.zeros((T, N), bool), "next_gid": nxt}
        # a final row holds no transition: zero action, reward and flag (never sampled)
        E = len(ends_t)
        finals = {"obs": obs_map(lambda x: x[ends_t, ends_n], next_obs), "final": np.ones(E, bool),
                  "next_gid": np.full(E, -1, np.int64), "rewards": np.zeros(E, np.float32),
                  "terminated": np.zeros(E, bool),
                  "actions": np.zeros((E, *rollout.actions.shape[2:]), rollout.actions.dtype)}
        if self.frame_stack is not None:
            self._stack_links(regular, finals, gid, final_gid, done, prev0, ids, next_obs, order)
        self._forget(base - C, top - C)
        flat = {k: obs_map(lambda x: x.reshape(T * N, *x.shape[2:]), v) for k, v in regular.items()}
        if order is None:
            self._put(base, flat, top - C)
            self._put(base + T * N, finals, top - C)
        else:
            self._put(base, {k: obs_map(lambda x, f: np.concatenate([x, f])[order], v, finals[k])
                             for k, v in flat.items()}, top - C)
        self.ready += int(np.count_nonzero((nxt >= 0) & (gid >= top - C)))
        # the previous rollout's last rows meet their successors
        for n in np.flatnonzero((prev0 >= 0) & (prev0 >= top - C)):
            self.next_gid[prev0[n] % C] = gid[0, n]
            self.ready += 1
        self.written = top
        for n, sid in enumerate(ids.tolist()):
            if done[-1, n]:
                self.tails.pop(sid, None)
            else:
                self.tails[sid] = (int(gid[-1, n]),
                                   obs_map(lambda ring, x, n=n: x[-1, n].astype(ring.dtype), self.obs, next_obs))

    def _checked(self, obs: ObsArray) -> ObsArray:
        """The rollout's observations (the stored keys of a Dict), refused when casting would lose information."""
        def check(ring: np.ndarray, x: np.ndarray) -> np.ndarray:
            if x.dtype != ring.dtype and not np.can_cast(x.dtype, ring.dtype, "safe"):
                raise ValueError(f"rollout observations are {x.dtype} but the replay buffer stores {ring.dtype}: "
                                 "casting would lose information")
            return x
        return obs_map(check, self.obs, obs)

    def _stream_heads(self, ids: np.ndarray, first_obs: np.ndarray) -> np.ndarray:
        """[N] prev of each column's first row: the stream's last row when this rollout continues it
        (its first observation is that row's next_obs), else frames.START / frames.UNKNOWN."""
        prev0 = np.full(len(ids), frames.UNKNOWN, np.int64)
        for n, sid in enumerate(ids.tolist()):
            tail = self.tails.get(sid)
            if tail is not None and obs_equal(tail[1], obs_map(itemgetter(n), first_obs)):
                prev0[n] = tail[0]
        if self.frame_stack is not None:  # a new stream starting with a reset-padded stack starts an episode
            fresh = np.flatnonzero(prev0 == frames.UNKNOWN)
            prev0[fresh[frames.padded(first_obs[fresh])]] = frames.START
        return prev0

    def _stack_links(self, regular: dict, finals: dict, gid: np.ndarray, final_gid: np.ndarray,
                     done: np.ndarray, prev0: np.ndarray, ids: np.ndarray, next_obs: np.ndarray,
                     order: np.ndarray | None) -> None:
        """Frame-stack mode: verify the rollout, keep the newest frame per row, fill prev / oldest.
        ``order``: the rows (regular, then final) in gid order, when that differs (``add_rollout``)."""
        T, N = done.shape
        prev = np.empty((T, N), np.int64)
        prev[0] = prev0
        prev[1:] = np.where(done[:-1], frames.START, gid[:-1])
        frames.verify_rollout(regular["obs"], next_obs, done, prev == frames.START, ids)
        ends_t, ends_n = np.nonzero(done)
        regular["obs"] = regular["obs"][:, :, -1]
        finals["obs"] = finals["obs"][:, -1]
        regular["prev_gid"], finals["prev_gid"] = prev, gid[ends_t, ends_n]
        rows = np.concatenate([gid.reshape(-1), final_gid])
        prev_rows = np.concatenate([prev.reshape(-1), finals["prev_gid"]])
        if order is not None:  # oldest_frames reads the new rows' links by gid
            prev_rows = prev_rows[order]
        oldest = frames.oldest_frames(rows, prev_rows, int(gid[0, 0]), self.prev_gid,
                                      self.written - self.capacity, self.frame_stack)
        regular["oldest"], finals["oldest"] = oldest[: T * N].reshape(T, N), oldest[T * N:]

    def _slices(self, g0: int, g1: int):
        """(slot slice, offset) pieces covering gids [g0, g1), at most ``capacity`` of them."""
        C, s = self.capacity, g0 % self.capacity
        first = min(g1 - g0, C - s)
        yield slice(s, s + first), 0
        if g1 - g0 > first:
            yield slice(0, g1 - g0 - first), first

    def _put(self, g0: int, values: dict[str, np.ndarray], lo: int) -> None:
        """Write rows gids g0, g0+1, ... (``values``: field -> [rows, ...]), skipping gids below ``lo``
        (rows this same add overwrites again)."""
        n = len(values["final"])
        skip = max(0, lo - g0)
        if n - skip <= 0:
            return
        for dst, off in self._slices(g0 + skip, g0 + n):
            part = slice(skip + off, skip + off + dst.stop - dst.start)
            for name, v in values.items():
                obs_put(getattr(self, name), dst, obs_map(itemgetter(part), v))

    def _forget(self, g0: int, g1: int) -> None:
        """Rows gids [g0, g1) are about to be overwritten: drop them from ``ready``."""
        g0, g1 = max(g0, 0), min(g1, self.written)
        if g1 > g0:
            for dst, _ in self._slices(g0, g1):
                self.ready -= int(np.count_nonzero(~self.final[dst] & (self.next_gid[dst] >= 0)))

    # -- sampling ----------------------------------------------------------------------------------------
    def sampleable(self, slots: np.ndarray) -> np.ndarray:
        """slots [B] -> [B] bool: a transition whose successor (and, with frame stacks, history) is alive."""
        ok = ~self.final[slots] & (self.next_gid[slots] >= 0)
        if self.frame_stack is not None:
            ok &= self.oldest[slots] >= self.written - self.capacity
        return ok

    def _draw(self, batch_size: int) -> np.ndarray:
        """Uniform over sampleable rows, with replacement, from numpy's global RNG (seeded, checkpointed):
        uniform slots, the unsampleable few redrawn; a deterministic function of the RNG state."""
        rows = min(self.written, self.capacity)
        if rows == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        slots = np.random.randint(0, rows, batch_size)
        for _ in range(16):
            bad = ~self.sampleable(slots)
            if not bad.any():
                return slots
            slots[bad] = np.random.randint(0, rows, int(bad.sum()))
        ok = np.flatnonzero(self.sampleable(np.arange(rows)))  # mostly unsampleable: draw from the list
        if ok.size == 0:
            raise ValueError("the replay buffer holds no transition whose successor has arrived yet")
        bad = ~self.sampleable(slots)
        slots[bad] = ok[np.random.randint(0, ok.size, int(bad.sum()))]
        return slots

    def _gids(self, slots: np.ndarray) -> np.ndarray:
        top = self.written - 1
        return top - (top - slots) % self.capacity

    def _rows_obs(self, gids: np.ndarray) -> np.ndarray:
        """gids [B] -> observations [B, *obs_shape] (stacks rebuilt from their frames)."""
        if self.frame_stack is None:
            return obs_map(itemgetter(gids % self.capacity), self.obs)
        return self.obs[frames.stack_slots(gids, self.prev_gid, self.frame_stack)]

    def sample(self, batch_size: int) -> Batch:
        """Uniform sample with replacement of B transitions; observations keep their stored dtype."""
        return self.batch(self._draw(batch_size))

    def batch(self, slots: np.ndarray) -> Batch:
        """The transitions at sampleable ``slots`` [B] (see ``sampleable``), observations in their dtype."""
        to = torch.from_numpy if self.device.type == "cpu" else lambda x: torch.from_numpy(x).to(self.device)
        return Batch(obs=obs_map(to, self._rows_obs(self._gids(slots))), actions=to(self.actions[slots]),
                     rewards=to(self.rewards[slots]), next_obs=obs_map(to, self._rows_obs(self.next_gid[slots])),
                     terminated=to(self.terminated[slots].astype(np.float32)))

    # -- checkpoints ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Filled slots only (in slot order), the counters and the streams' open ends; tensors and ints."""
        rows = min(self.written, self.capacity)
        sids = list(self.tails)
        if sids:
            tail_next = obs_map(lambda *xs: np.stack(xs), *[self.tails[s][1] for s in sids])
        elif self.tree:
            tail_next = obs_map(lambda x: np.zeros((0, *x.shape[1:]), x.dtype), self.obs)
        else:
            tail_next = np.zeros((0, *self.obs_shape), self.obs_dtype)
        return {"capacity": self.capacity, "written": self.written, "ready": self.ready, "size": len(self),
                "frame_stack": self.frame_stack or 0,
                **{k: obs_map(lambda x: torch.from_numpy(x[:rows].copy()), getattr(self, k)) for k in self.fields},
                "tail_ids": torch.tensor(sids, dtype=torch.int64),
                "tail_gids": torch.tensor([self.tails[s][0] for s in sids], dtype=torch.int64),
                "tail_next_obs": obs_map(torch.from_numpy, tail_next)}

    def load_state_dict(self, state: dict) -> None:
        saved_cap, written = int(state["capacity"]), int(state["written"])
        if int(state["frame_stack"]) != (self.frame_stack or 0):
            raise ConfigError(f"algo.frame_stack={self.frame_stack}: the checkpoint's replay buffer was saved with "
                              f"algo.frame_stack={int(state['frame_stack']) or None}; resume with that value or "
                              "checkpoint.replay_buffer=false")
        # gids map to the same slots when both rings have the same size or neither has wrapped yet
        if saved_cap != self.capacity and written > min(saved_cap, self.capacity):
            raise ConfigError(f"algo.buffer_size={self.capacity}: the checkpoint's replay buffer holds {written} "
                              f"rows saved with algo.buffer_size={saved_cap}; resume with that value or "
                              "checkpoint.replay_buffer=false")
        saved, here = _row_shapes(state["obs"]), _row_shapes(self.obs)
        if saved != here:
            raise ConfigError(f"the checkpoint's replay buffer stores observations of shape {saved}, this env "
                              f"gives {here}; resume with the same env or checkpoint.replay_buffer=false")
        rows = obs_leaves(state["obs"])[0].shape[0]
        for k in self.fields:
            obs_put(getattr(self, k), slice(0, rows), obs_map(Tensor.numpy, state[k]))
        self.written, self.ready = written, int(state["ready"])
        tail_next = state["tail_next_obs"]
        self.tails = {int(s): (int(g), obs_map(lambda x, i=i: x[i].numpy().copy(), tail_next))
                      for i, (s, g) in enumerate(zip(state["tail_ids"], state["tail_gids"], strict=True))}


class UnwrittenSteps:
    """Rollouts an off-policy learner has taken but not yet written into its replay ``buffer``.

    A learner acting one env step at a time calls ``add`` every step and ``write`` when it samples (or
    checkpoints): ``ReplayBuffer.add_rollouts`` then writes the steps gathered in between in one go, into the
    same slots as one ``add_rollout`` per step, so the updates see the same buffer. ``add`` writes by itself
    once ``max_rollouts`` are waiting (a long warm-up with no update would hold them all)."""

    def __init__(self, buffer: ReplayBuffer, *, max_rollouts: int = 256):
        self.buffer, self.max_rollouts = buffer, max_rollouts
        self.rollouts: list[Rollout] = []
        self.pieces: list[int] = []

    def add(self, rollout: Rollout, *, rollouts: int = 1) -> None:
        """``rollouts``: ``rollout`` is that many consecutive rollouts of equal length, collected as one."""
        if rollouts > 1 and self.buffer.frame_stack is not None:  # stacks are verified per rollout as added
            for piece in streams.split_steps(rollout, rollout.shape[0] // rollouts):
                self.add(piece)
            return
        self.rollouts.append(rollout)
        self.pieces.append(rollouts)
        if len(self.rollouts) >= self.max_rollouts:
            self.write()

    def write(self) -> None:
        if self.rollouts:
            rollouts, pieces, self.rollouts, self.pieces = self.rollouts, self.pieces, [], []
            self.buffer.add_rollouts(rollouts, pieces=pieces)

    def clear(self) -> None:
        """Forget the waiting rollouts (the learner's state was replaced, e.g. by a resume)."""
        self.rollouts, self.pieces = [], []


def _row_shapes(obs) -> tuple | dict:
    """The shape of one stored row (per key for a Dict observation): what a checkpoint must match."""
    return obs_map(lambda x: tuple(x.shape[1:]), obs)
