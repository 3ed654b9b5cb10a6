"""Proportional prioritised replay (Schaul et al. 2016, "Prioritized Experience Replay", section 3.3):
``PrioritizedReplayBuffer`` and its ``SumTree``.

Transition i is drawn with probability ``P(i) = p_i^alpha / sum_k p_k^alpha`` where ``p_i = |delta_i| + eps``
is its last TD error (a new transition gets the largest priority seen so far, so that every one is replayed at
least once), and its update is weighted by ``w_i = (N P(i))^-beta``, normalised by the batch's largest weight
(so weights only scale updates down: the paper's ``1 / max_i w_i``, taken over the batch as in Hessel et al.
2018's Rainbow). ``beta`` is annealed from ``beta0`` to 1 over the run by the learner. Draws are stratified:
the total priority is split into B equal segments and one value is drawn uniformly in each (the paper's
appendix B.2.1), from numpy's global generator (seeded and checkpointed, as uniform replay's).

Only rows that hold a transition whose successor has arrived carry priority (the buffer's ``sampleable``):
final observations and a stream's newest row have priority 0 until they do. The tree's leaves go into the
buffer's checkpoint with the largest priority, so a resumed run draws what the uninterrupted one would.
"""

from __future__ import annotations

import numpy as np
import torch

from rltrain.data.replay import ReplayBuffer
from rltrain.data.structs import Rollout


class SumTree:
    """A complete binary tree in one float64 array: leaf i (of ``capacity``) at ``size + i``, each inner node the
    sum of its two children, so the total is ``nodes[1]`` and a prefix sum finds its leaf in log2(size) steps.
    Updates recompute the touched parents from their children (no accumulated rounding drift)."""

    def __init__(self, capacity: int):
        self.size = 1 << max(int(capacity) - 1, 1).bit_length()
        self.nodes = np.zeros(2 * self.size, np.float64)

    @property
    def total(self) -> float:
        return float(self.nodes[1])

    def leaves(self, idx: np.ndarray) -> np.ndarray:
        return self.nodes[self.size + idx]

    def update(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Set leaves ``idx`` [M] to ``values`` [M] (a repeated index keeps its last value), then their ancestors."""
        if len(idx) == 0:
            return
        node = np.asarray(idx, np.int64) + self.size
        self.nodes[node] = values
        node = np.unique(node // 2)
        while True:
            self.nodes[node] = self.nodes[2 * node] + self.nodes[2 * node + 1]
            if node[0] == 1:
                return
            node = np.unique(node // 2)

    def find(self, prefix: np.ndarray) -> np.ndarray:
        """prefix [B] in [0, total) -> the leaves whose cumulative range holds each value [B]."""
        node = np.ones(len(prefix), np.int64)
        rest = np.asarray(prefix, np.float64).copy()
        while node[0] < self.size:  # every leaf is at the same depth
            left = 2 * node
            mass = self.nodes[left]
            right = rest >= mass
            rest = np.where(right, rest - mass, rest)
            node = np.where(right, left + 1, left)
        return node - self.size


class PrioritizedReplayBuffer(ReplayBuffer):
    """``ReplayBuffer`` that draws rows by priority (module docstring); ``alpha``: how much priorities count
    (0: uniform), ``eps``: added to |TD error| so that no transition is never drawn again."""

    def __init__(self, *args, alpha: float = 0.6, eps: float = 1e-6, **kwargs):
        super().__init__(*args, **kwargs)
        self.alpha, self.eps = float(alpha), float(eps)
        self.tree = SumTree(self.capacity)
        self.max_priority = 1.0  # the largest p_i seen: what a new transition gets

    def add_rollout(self, rollout: Rollout, *, segments: np.ndarray | None = None) -> None:
        """Store as the uniform buffer does, then give the new transitions (and the streams' previous newest rows,
        whose successors have now arrived) the largest priority; rows not (yet) sampleable get 0."""
        before, oldest_tails = self.written, [gid for gid, _ in self.tails.values()]
        super().add_rollout(rollout, segments=segments)
        alive = self.written - self.capacity
        gids = np.concatenate([np.asarray([g for g in oldest_tails if g >= alive], np.int64),
                               np.arange(max(before, alive), self.written, dtype=np.int64)])
        slots = gids % self.capacity
        self.tree.update(slots, np.where(self.sampleable(slots), self.max_priority ** self.alpha, 0.0))

    def draw(self, batch_size: int, *, beta: float) -> tuple[np.ndarray, np.ndarray]:
        """Stratified proportional draw -> (slots [B], importance weights [B] float32, max 1)."""
        total = self.tree.total
        if total <= 0:
            raise ValueError("the replay buffer holds no transition whose successor has arrived yet")
        top = np.nextafter(total, 0.0)
        u = (np.arange(batch_size) + np.random.random_sample(batch_size)) * (total / batch_size)
        slots = self.tree.find(np.minimum(u, top))
        # a row whose frame history the ring has overwritten since, or a zero leaf reached by rounding: redraw
        for _ in range(16):
            bad = ~self.sampleable(slots) | (self.tree.leaves(slots) <= 0)
            if not bad.any():
                break
            slots[bad] = self.tree.find(np.minimum(np.random.random_sample(int(bad.sum())) * total, top))
        else:
            raise ValueError("prioritised replay: no sampleable transition carries priority")
        # (N P(i))^-beta / max_j (N P(j))^-beta: N cancels in the normalisation
        weights = (self.tree.leaves(slots) / total) ** -beta
        return slots, (weights / weights.max()).astype(np.float32)

    def update_priorities(self, slots: np.ndarray, td_errors: np.ndarray) -> None:
        """After a gradient step: p_i = |delta_i| + eps for the drawn rows."""
        p = np.abs(np.asarray(td_errors, np.float64)) + self.eps
        self.tree.update(slots, p ** self.alpha)
        self.max_priority = max(self.max_priority, float(p.max()))

    def state_dict(self) -> dict:
        rows = min(self.written, self.capacity)
        return {**super().state_dict(), "priorities": torch.from_numpy(self.tree.leaves(np.arange(rows)).copy()),
                "max_priority": self.max_priority}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.tree = SumTree(self.capacity)
        if "priorities" in state:  # saved by a prioritised run
            leaves = state["priorities"].numpy()
            self.tree.update(np.arange(len(leaves)), leaves)
            self.max_priority = float(state["max_priority"])
        else:  # a uniform run's buffer: every sampleable row at priority 1
            rows = np.arange(min(self.written, self.capacity))
            self.tree.update(rows, self.sampleable(rows).astype(np.float64))
